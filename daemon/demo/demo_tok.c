/*
 * demo_tok.c - the synthetic tokenizer of demo checkpoints: tiktoken.model
 * (base64 token, space, rank per line; docs/text-and-draft.md §1.2) and
 * tokenizer_config.json with the 256 special ids after the ranks (§1.6).
 *
 * Ranks 0..255 are the single bytes in the order the real file uses (the
 * GPT-2 byte order: '!'..'~', 0xA1..0xAC, 0xAE..0xFF, then the remaining
 * bytes ascending, so space = 220, LF = 198, 0x00 = 188). The other ranks are
 * byte-pair merges learned from a built-in English sample: first inside
 * pre-tokenized pieces (words with their leading space, numbers of up to
 * three digits, punctuation runs, whitespace), as tiktoken's BPE applies
 * them; when those run out, across pieces; when the sample is exhausted,
 * filler tokens. Ties go to the lowest pair of ids, so the file depends on
 * the vocabulary size only.
 */
#include "demo/demo.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/array.h"

/* Ranks learned from the sample at most; the rest are filler tokens. */
#define LEARN_MAX 4096u

/* ---- the built-in sample ---- */

static const char prose[] =
	"The quick brown fox jumps over the lazy dog. A small model can still teach us a great deal "
	"about how large ones work, because the shapes of the computation are the same.\n"
	"When the river rose in the spring, the people of the valley moved their animals to the high "
	"fields and waited. Nobody knew how long the water would stay, but everyone agreed that it "
	"was better to be patient than to be sorry.\n"
	"Hello, world! This is a test of the tokenizer. It should handle numbers like 1234567890, "
	"dates such as 2024-05-17, and prices of $19.99 without trouble.\n"
	"In the beginning there was only the idea, and the idea was simple: read every weight from "
	"disk exactly once, keep the hot experts in memory, and never change the answer.\n"
	"She said, \"I don't think we're ready yet.\" He replied that they'd been ready for weeks, "
	"and that it's always like this before a launch.\n"
	"    def add(a, b):\n        return a + b\n\n"
	"Mixture-of-experts models route every token to a few experts out of many. The router "
	"scores each expert, picks the best ones, and mixes their outputs with learned weights.\n"
	"Linear attention keeps a fixed-size state per head, so the cost of each new token does not "
	"grow with the length of the context. Full attention layers remember everything.\n";

static const char *const words[] = {
	"the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
	"on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
	"had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
	"been", "if", "more", "when", "will", "would", "who", "so", "no", "time", "people", "year",
	"way", "day", "man", "thing", "woman", "life", "child", "world", "school", "state", "family",
	"student", "group", "country", "problem", "hand", "part", "place", "case", "week", "company",
	"system", "program", "question", "work", "government", "number", "night", "point", "home",
	"water", "room", "mother", "area", "money", "story", "fact", "month", "lot", "right",
	"study", "book", "eye", "job", "word", "business", "issue", "side", "kind", "head", "house",
	"service", "friend", "father", "power", "hour", "game", "line", "end", "member", "law",
	"car", "city", "community", "name", "president", "team", "minute", "idea", "kid", "body",
	"information", "back", "parent", "face", "others", "level", "office", "door", "health",
	"person", "art", "war", "history", "party", "result", "change", "morning", "reason",
	"research", "girl", "guy", "moment", "air", "teacher", "force", "education", "model",
	"token", "expert", "memory", "layer", "weight", "state", "answer", "machine", "language",
	"good", "new", "first", "last", "long", "great", "little", "own", "other", "old", "right",
	"big", "high", "different", "small", "large", "next", "early", "young", "important", "few",
	"public", "bad", "same", "able", "quick", "quiet", "bright", "simple", "careful", "exact",
	"make", "know", "take", "see", "come", "think", "look", "want", "give", "use", "find",
	"tell", "ask", "seem", "feel", "try", "leave", "call", "keep", "begin", "help", "show",
	"hear", "play", "run", "move", "live", "believe", "bring", "happen", "write", "provide",
	"sit", "stand", "lose", "pay", "meet", "include", "continue", "learn", "lead",
	"understand", "watch", "follow", "stop", "create", "speak", "read", "allow", "spend",
	"grow", "open", "walk", "win", "offer", "remember", "consider", "appear", "buy", "wait",
	"serve", "die", "send", "expect", "build", "stay", "fall", "cut", "reach", "remain",
	"compute", "route", "decode", "stream", "cache", "verify", "measure", "explain",
	"always", "never", "often", "really", "almost", "together", "already", "quickly", "slowly",
	"about", "after", "before", "between", "through", "during", "without", "under", "around",
	"because", "while", "where", "although", "however", "therefore", "perhaps", "also",
};
#define N_WORDS (sizeof(words) / sizeof(words[0]))

struct sbuf { char *p; size_t n, cap; };

static int sb_put(struct sbuf *b, const char *s, size_t n)
{
	if (k3_array_reserve(&b->p, &b->cap, b->n + n + 1, 1, 4096))
		return -ENOMEM;
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = '\0';
	return 0;
}

static uint64_t tok_rng(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* The prose, then sentences drawn from the word list (fixed seed). */
static int make_sample(struct sbuf *b, size_t target)
{
	static const char *const ends[] = { ".", ".", ".", "?", "!", ";", ":" };
	uint64_t s = 0x6b33646d6f64656cull;   /* fixed: the sample is part of the format */
	char num[32];

	if (sb_put(b, prose, sizeof(prose) - 1))
		return -ENOMEM;
	while (b->n < target) {
		unsigned len = 4 + (unsigned)(tok_rng(&s) % 12);
		for (unsigned i = 0; i < len; i++) {
			const char *w = words[tok_rng(&s) % N_WORDS];
			char tmp[64];
			uint64_t x = tok_rng(&s);
			if (i == 0)
				snprintf(tmp, sizeof(tmp), "%c%s", w[0] - 'a' + 'A', w + 1);
			else if (x % 29 == 0)
				snprintf(tmp, sizeof(tmp), " %u", (unsigned)(x % 100000));
			else if (x % 23 == 0)
				snprintf(tmp, sizeof(tmp), ", %s", w);
			else if (x % 31 == 0)
				snprintf(tmp, sizeof(tmp), " %c%s", w[0] - 'a' + 'A', w + 1);
			else if (x % 37 == 0)
				snprintf(tmp, sizeof(tmp), " \"%s\"", w);
			else if (x % 41 == 0)
				snprintf(tmp, sizeof(tmp), " %s's", w);
			else
				snprintf(tmp, sizeof(tmp), " %s", w);
			if (sb_put(b, tmp, strlen(tmp)))
				return -ENOMEM;
		}
		const char *e = ends[tok_rng(&s) % 7];
		snprintf(num, sizeof(num), "%s%s", e, tok_rng(&s) % 6 == 0 ? "\n" : " ");
		if (sb_put(b, num, strlen(num)))
			return -ENOMEM;
	}
	return 0;
}

/* ---- token table ---- */

struct toks {
	uint8_t *arena;            /* concatenated token bytes */
	size_t arena_n, arena_cap;
	size_t *off;               /* [n] start in arena */
	uint32_t *len;             /* [n] */
	uint32_t n, cap;
	uint32_t *ht;              /* open addressing over token bytes: id + 1, 0 empty */
	uint32_t ht_cap;           /* power of two, > 2 * cap */
};

static uint64_t hash_bytes(const uint8_t *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	return h;
}

/* id of the byte string, or UINT32_MAX */
static uint32_t toks_find(const struct toks *t, const uint8_t *p, size_t n)
{
	uint32_t mask = t->ht_cap - 1;

	for (uint32_t i = (uint32_t)hash_bytes(p, n) & mask;; i = (i + 1) & mask) {
		uint32_t v = t->ht[i];
		if (!v)
			return UINT32_MAX;
		v--;
		if (t->len[v] == n && memcmp(t->arena + t->off[v], p, n) == 0)
			return v;
	}
}

static int toks_add(struct toks *t, const uint8_t *p, size_t n)
{
	if (t->n >= t->cap)
		return -ENOSPC;
	if (k3_array_reserve(&t->arena, &t->arena_cap, t->arena_n + n, 1, 4096))
		return -ENOMEM;
	memcpy(t->arena + t->arena_n, p, n);
	t->off[t->n] = t->arena_n;
	t->len[t->n] = (uint32_t)n;
	t->arena_n += n;
	uint32_t mask = t->ht_cap - 1, i = (uint32_t)hash_bytes(p, n) & mask;
	while (t->ht[i])
		i = (i + 1) & mask;
	t->ht[i] = ++t->n;
	return 0;
}

/* ---- pair counting with a stamped hash (no clearing per round) ---- */

struct pairs {
	uint64_t *key;
	uint64_t *cnt;
	uint32_t *stamp;
	uint32_t *touched;         /* slots used this round, for the argmax scan */
	uint32_t cap, round, nt;
};

static void pairs_add(struct pairs *h, uint32_t a, uint32_t b, uint64_t w)
{
	uint64_t k = ((uint64_t)a << 32) | b;
	uint32_t mask = h->cap - 1;

	for (uint32_t i = (uint32_t)((k * 0x9e3779b97f4a7c15ull) >> 40) & mask;; i = (i + 1) & mask) {
		if (h->stamp[i] != h->round) {
			h->stamp[i] = h->round;
			h->touched[h->nt++] = i;
			h->key[i] = k;
			h->cnt[i] = w;
			return;
		}
		if (h->key[i] == k) {
			h->cnt[i] += w;
			return;
		}
	}
}

/* A sequence of token ids with a weight (a distinct piece and its count,
 * or the whole sample with weight 1). */
struct seq { uint32_t *ids; uint32_t n; uint64_t w; };

/* Finds the best pair over all sequences; false when none is left. */
static bool best_pair(struct pairs *h, struct seq *s, size_t ns, uint32_t *a, uint32_t *b)
{
	uint64_t best = 0, bk = UINT64_MAX;

	h->round++;
	h->nt = 0;
	for (size_t i = 0; i < ns; i++)
		for (uint32_t j = 0; j + 1 < s[i].n; j++)
			pairs_add(h, s[i].ids[j], s[i].ids[j + 1], s[i].w);
	for (uint32_t t = 0; t < h->nt; t++) {
		uint32_t i = h->touched[t];
		if (h->cnt[i] > best || (h->cnt[i] == best && h->key[i] < bk)) {
			best = h->cnt[i];
			bk = h->key[i];
		}
	}
	if (!best)
		return false;
	*a = (uint32_t)(bk >> 32);
	*b = (uint32_t)bk;
	return true;
}

static void replace_pair(struct seq *s, size_t ns, uint32_t a, uint32_t b, uint32_t id)
{
	for (size_t i = 0; i < ns; i++) {
		uint32_t o = 0;
		for (uint32_t j = 0; j < s[i].n; j++) {
			if (j + 1 < s[i].n && s[i].ids[j] == a && s[i].ids[j + 1] == b) {
				s[i].ids[o++] = id;
				j++;
			} else {
				s[i].ids[o++] = s[i].ids[j];
			}
		}
		s[i].n = o;
	}
}

/* Runs merges until the table is full or no pair is left. */
static int merge_all(struct toks *t, struct pairs *h, struct seq *s, size_t ns)
{
	uint32_t a, b;
	uint8_t buf[4096];

	while (t->n < t->cap && best_pair(h, s, ns, &a, &b)) {
		size_t la = t->len[a], lb = t->len[b];
		uint32_t id;
		if (la + lb > sizeof(buf)) {
			/* long concatenations carry no value here: stop this stage */
			return 0;
		}
		memcpy(buf, t->arena + t->off[a], la);
		memcpy(buf + la, t->arena + t->off[b], lb);
		id = toks_find(t, buf, la + lb);
		if (id == UINT32_MAX) {
			int r = toks_add(t, buf, la + lb);
			if (r)
				return r;
			id = t->n - 1;
		}
		replace_pair(s, ns, a, b, id);
	}
	return 0;
}

static bool is_alpha(uint8_t c) { return (c | 32) >= 'a' && (c | 32) <= 'z'; }
static bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
static bool is_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Length of the pre-tokenizer piece at p (a simplified K3 regex, ASCII). */
static size_t piece_len(const uint8_t *p, size_t n)
{
	size_t i = 0;

	if (is_alpha(p[0]) || (n > 1 && !is_digit(p[0]) && p[0] != '\n' && !is_alpha(p[0]) && is_alpha(p[1]))) {
		i = is_alpha(p[0]) ? 0 : 1;
		while (i < n && is_alpha(p[i]))
			i++;
		if (i + 1 < n && p[i] == '\'' && (p[i + 1] == 's' || p[i + 1] == 't' || p[i + 1] == 'd' ||
						  p[i + 1] == 'm'))
			i += 2;
		return i;
	}
	if (is_digit(p[0])) {
		while (i < n && i < 3 && is_digit(p[i]))
			i++;
		return i;
	}
	if (!is_space(p[0]) || (p[0] == ' ' && n > 1 && !is_space(p[1]) && !is_alpha(p[1]) && !is_digit(p[1]))) {
		i = p[0] == ' ' ? 1 : 0;
		while (i < n && !is_space(p[i]) && !is_alpha(p[i]) && !is_digit(p[i]))
			i++;
		while (i < n && (p[i] == '\n' || p[i] == '\r'))
			i++;
		return i ? i : 1;
	}
	while (i < n && is_space(p[i]))
		i++;
	/* leave one space to lead the next word */
	if (i > 1 && i < n && p[i - 1] == ' ')
		i--;
	return i;
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static void put_b64(FILE *f, const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i += 3) {
		uint32_t v = (uint32_t)p[i] << 16;
		if (i + 1 < n)
			v |= (uint32_t)p[i + 1] << 8;
		if (i + 2 < n)
			v |= p[i + 2];
		fputc(b64[(v >> 18) & 63], f);
		fputc(b64[(v >> 12) & 63], f);
		fputc(i + 1 < n ? b64[(v >> 6) & 63] : '=', f);
		fputc(i + 2 < n ? b64[v & 63] : '=', f);
	}
}

/* The 16 named K3 specials, by offset after the ranks (§1.6). */
static const struct { uint32_t k; const char *name; bool special; } named[] = {
	{ 0, "[BOS]", true }, { 1, "[EOS]", true }, { 2, "<|end_of_msg|>", true },
	{ 3, "<|open|>", false }, { 4, "<|close|>", false }, { 5, "<|sep|>", false },
	{ 6, "[start_header_id]", true }, { 7, "[end_header_id]", true }, { 9, "[EOT]", true },
	{ 18, "<|media_begin|>", true }, { 19, "<|media_content|>", true },
	{ 20, "<|media_end|>", true }, { 21, "<|media_pad|>", true }, { 65, "<osagent_mode>", true },
	{ 254, "[UNK]", true }, { 255, "[PAD]", true },
};

const char *k3_demo_special_name(uint32_t k)
{
	for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++)
		if (named[i].k == k)
			return named[i].name;
	return NULL;
}

static int write_tok_config(const char *dir, uint32_t ranks, struct k3_err *err)
{
	json_t *dec = json_object();
	char path[4096], key[16], reserved[48];

	for (uint32_t k = 0; k < 256; k++) {
		const char *n = k3_demo_special_name(k);
		bool special = true;
		for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++)
			if (named[i].k == k)
				special = named[i].special;
		if (!n) {
			snprintf(reserved, sizeof(reserved), "<|reserved_token_%u|>", ranks + k);
			n = reserved;
		}
		snprintf(key, sizeof(key), "%u", ranks + k);
		json_object_set_new(dec, key, json_pack("{s:s,s:b,s:b,s:b,s:b,s:b}", "content", n, "lstrip", 0,
							"normalized", 0, "rstrip", 0, "single_word", 0,
							"special", special));
	}
	json_t *c = json_pack("{s:o,s:{s:[s,n]},s:s,s:b,s:s,s:s,s:I,s:s,s:s,s:s}",
			      "added_tokens_decoder", dec, "auto_map", "AutoTokenizer",
			      "tokenization_kimi.TikTokenTokenizer", "bos_token", "[BOS]",
			      "clean_up_tokenization_spaces", 0, "eos_token", "[EOS]",
			      "extra_special_tokens", "", "model_max_length", (json_int_t)1048576,
			      "pad_token", "[PAD]", "tokenizer_class", "TikTokenTokenizer",
			      "unk_token", "[UNK]");
	/* extra_special_tokens is an object in the release; keep the shape */
	json_object_set_new(c, "extra_special_tokens", json_object());
	snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
	int r = json_dump_file(c, path, JSON_INDENT(2) | JSON_SORT_KEYS) == 0 ? 0 :
		k3_err_set(err, -EIO, "%s: write failed", path);
	json_decref(c);
	return r;
}

int k3_demo_write_tokenizer(const char *dir, uint32_t vocab_size, struct k3_err *err)
{
	struct toks t = { 0 };
	struct pairs h = { 0 };
	struct sbuf sample = { 0 };
	struct seq *pieces = NULL, whole = { 0 };
	size_t np = 0;
	uint32_t *ids = NULL;
	char path[4096];
	FILE *f = NULL;
	int r = -ENOMEM;

	if (vocab_size < 512 || vocab_size > (1u << 20))
		return k3_err_set(err, -EINVAL, "vocab size %u: expected 512..%u", vocab_size, 1u << 20);
	uint32_t ranks = vocab_size - 256;
	t.cap = ranks;
	t.ht_cap = 1;
	while (t.ht_cap < 2 * ranks + 2)
		t.ht_cap <<= 1;
	t.off = calloc(ranks, sizeof(*t.off));
	t.len = calloc(ranks, sizeof(*t.len));
	t.ht = calloc(t.ht_cap, sizeof(*t.ht));
	t.arena_cap = 1 << 16;
	t.arena = malloc(t.arena_cap);
	if (!t.off || !t.len || !t.ht || !t.arena)
		goto out;

	/* ranks 0..255: the bytes in the real file's order */
	for (int pass = 0; pass < 2; pass++)
		for (int c = 0; c < 256; c++) {
			bool printable = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174);
			if (printable == (pass == 0)) {
				uint8_t byte = (uint8_t)c;
				if (toks_add(&t, &byte, 1))
					goto out;
			}
		}

	/* A sample big enough to fill the table: ~10 bytes per learned rank.
	 * At most LEARN_MAX ranks are learned (each round recounts every pair);
	 * bigger vocabularies are completed with filler tokens. */
	uint32_t learn = ranks < LEARN_MAX ? ranks : LEARN_MAX;
	size_t target = (size_t)learn * 10;
	if (target < 32768)
		target = 32768;
	if (make_sample(&sample, target))
		goto out;
	/* every pair is distinct at worst: one slot per sample byte, doubled */
	h.cap = 1;
	while (h.cap < 2 * sample.n + 2)
		h.cap <<= 1;
	h.key = malloc(h.cap * sizeof(*h.key));
	h.cnt = malloc(h.cap * sizeof(*h.cnt));
	h.stamp = calloc(h.cap, sizeof(*h.stamp));
	h.touched = malloc(h.cap * sizeof(*h.touched));
	if (!h.key || !h.cnt || !h.stamp || !h.touched)
		goto out;
	const uint8_t *s = (const uint8_t *)sample.p;
	ids = malloc(sample.n * sizeof(*ids));
	pieces = calloc(sample.n, sizeof(*pieces));
	if (!ids || !pieces)
		goto out;
	/* stage 1: distinct pieces with counts (pieces point into ids[]) */
	uint32_t *first = malloc(sample.n * sizeof(*first));
	if (!first)
		goto out;
	for (size_t i = 0; i < sample.n;) {
		size_t n = piece_len(s + i, sample.n - i);
		for (size_t k = 0; k < n; k++)
			ids[i + k] = toks_find(&t, s + i + k, 1);
		first[np] = (uint32_t)i;
		pieces[np].ids = ids + i;
		pieces[np].n = (uint32_t)n;
		pieces[np].w = 1;
		np++;
		i += n;
	}
	/* fold duplicates: sort piece indices by bytes, merge equal ones */
	{
		size_t u = 0;
		/* simple hash table from piece bytes to its first index */
		uint32_t cap = 1;
		while (cap < 2 * np + 2)
			cap <<= 1;
		uint32_t *ph = calloc(cap, sizeof(*ph));
		if (!ph) {
			free(first);
			goto out;
		}
		for (size_t i = 0; i < np; i++) {
			const uint8_t *p = s + first[i];
			uint32_t n = pieces[i].n;
			uint32_t j = (uint32_t)hash_bytes(p, n) & (cap - 1);
			for (;; j = (j + 1) & (cap - 1)) {
				if (!ph[j]) {
					pieces[u] = pieces[i];
					first[u] = first[i];
					ph[j] = (uint32_t)++u;
					break;
				}
				size_t q = ph[j] - 1;
				if (pieces[q].n == n && memcmp(s + first[q], p, n) == 0) {
					pieces[q].w++;
					break;
				}
			}
		}
		free(ph);
		np = u;
	}
	free(first);
	uint32_t full_cap = t.cap;
	t.cap = learn;
	r = merge_all(&t, &h, pieces, np);
	if (r)
		goto out;
	/* stage 2: across pieces, over the whole sample with stage-1 tokens */
	if (t.n < t.cap) {
		struct seq one = { ids, 0, 1 };
		for (size_t i = 0; i < sample.n;) {
			size_t n = piece_len(s + i, sample.n - i);
			/* re-encode the piece greedily with the longest known prefix
			 * (stage-1 merges made every piece one token) */
			size_t k = 0;
			while (k < n) {
				size_t best = 1;
				uint32_t bid = toks_find(&t, s + i + k, 1);
				for (size_t m = n - k; m > 1; m--) {
					uint32_t id = toks_find(&t, s + i + k, m);
					if (id != UINT32_MAX) {
						best = m;
						bid = id;
						break;
					}
				}
				ids[one.n++] = bid;
				k += best;
			}
			i += n;
		}
		whole = one;
		r = merge_all(&t, &h, &whole, 1);
		if (r)
			goto out;
	}
	t.cap = full_cap;
	/* stage 3: filler tokens, unique and deterministic */
	for (uint32_t i = 0; t.n < t.cap; i++) {
		char fill[32];
		int n = snprintf(fill, sizeof(fill), "<fill_%u>", i);
		if (toks_find(&t, (const uint8_t *)fill, (size_t)n) == UINT32_MAX &&
		    toks_add(&t, (const uint8_t *)fill, (size_t)n)) {
			r = -ENOMEM;
			goto out;
		}
	}

	snprintf(path, sizeof(path), "%s/tiktoken.model", dir);
	f = fopen(path, "w");
	if (!f) {
		r = k3_err_set(err, -errno, "%s: %s", path, strerror(errno));
		goto out_noerr;
	}
	for (uint32_t i = 0; i < t.n; i++) {
		put_b64(f, t.arena + t.off[i], t.len[i]);
		fprintf(f, " %u\n", i);
	}
	if (fclose(f) != 0) {
		f = NULL;
		r = k3_err_set(err, -EIO, "%s: write failed", path);
		goto out_noerr;
	}
	f = NULL;
	r = write_tok_config(dir, ranks, err);
	goto out_noerr;
out:
	if (r)
		r = k3_err_set(err, r, "building the demo tokenizer failed (%s)", r == -ENOMEM ? "out of memory" : "internal");
out_noerr:
	if (f)
		fclose(f);
	free(sample.p);
	free(ids);
	free(pieces);
	free(t.arena);
	free(t.off);
	free(t.len);
	free(t.ht);
	free(h.key);
	free(h.cnt);
	free(h.stamp);
	free(h.touched);
	return r;
}
