/*
 * text_tok.c - Kimi K3 tokenizer (see text_tok.h and docs/text-and-draft.md
 * §1; text_tok_internal.h says which tokenizer file does what): loading
 * the rank file (bounded, checked, the release's by SHA-256) and the
 * special names, id arrays, encoding a string (chunks, same-class runs,
 * special tokens; the pieces and their merges are text_pretok.c's and
 * text_bpe.c's) and decoding ids back to bytes.
 */
#include "text/text_tok_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/evp.h>

#include "base/array.h"
#include "base/carve.h"
#include "base/file.h"
#include "base/parse.h"
#include "k3_limits.h"

/* ---- id arrays ---------------------------------------------------------- */

void k3_tok_ids_init(struct k3_tok_ids *ids)
{
	ids->v = NULL;
	ids->n = ids->cap = 0;
}

void k3_tok_ids_release(struct k3_tok_ids *ids)
{
	if (!ids)
		return;
	free(ids->v);
	k3_tok_ids_init(ids);
}

int tok_ids_reserve(struct k3_tok_ids *ids, size_t extra)
{
	if (extra > SIZE_MAX / 4 - ids->n)
		return -ENOMEM;
	return k3_array_reserve(&ids->v, &ids->cap, ids->n + extra, sizeof(*ids->v), 64);
}

int k3_tok_ids_push(struct k3_tok_ids *ids, uint32_t id)
{
	if (ids->n == ids->cap && tok_ids_reserve(ids, 1))
		return -ENOMEM;
	ids->v[ids->n++] = id;
	return 0;
}

/* ---- encoding ------------------------------------------------------------ */

static int encode_ordinary(const struct k3_tok *tok, struct tok_matcher *m, const char *s, size_t len,
			   struct k3_tok_ids *out)
{
	size_t off = 0, na = SIZE_MAX;

	tok_matcher_pick(m, tok, s, len);
	while (off < len) {
		size_t a, b;
		int rc = tok_find_piece(m, s, len, off, &na, &a, &b);
		if (rc < 0)
			return rc;
		if (rc == 0)
			break;
		if ((rc = k3_tok_bpe(tok, (const uint8_t *)s + a, b - a, out)))
			return rc;
		off = b;
	}
	return 0;
}

/* Longest special name starting at p; returns its byte length or 0. */
static size_t special_at(const struct k3_tok *tok, const uint8_t *p, size_t n, uint32_t *id)
{
	uint32_t node = 0;
	size_t best = 0;

	*id = NO_RANK;   /* written on every path: callers read it only when best > 0 */
	for (size_t i = 0; i < n; i++) {
		uint32_t c = tok->trie[node].child;
		while (c && tok->trie[c].byte != p[i])
			c = tok->trie[c].next;
		if (!c)
			break;
		node = c;
		if (tok->trie[node].id != NO_RANK) {
			best = i + 1;
			*id = tok->trie[node].id;
		}
	}
	return best;
}

static int encode_slice(const struct k3_tok *tok, struct tok_matcher *m, const char *s, size_t len,
			bool allow_special, struct k3_tok_ids *out)
{
	const uint8_t *u = (const uint8_t *)s;
	size_t start = 0;
	int rc;

	if (allow_special) {
		for (size_t i = 0; i < len; i++) {
			uint32_t id;
			size_t k;
			if (!tok->special_first[u[i]])
				continue;
			k = special_at(tok, u + i, len - i, &id);
			if (!k)
				continue;
			if ((rc = encode_ordinary(tok, m, s + start, i - start, out)))
				return rc;
			if ((rc = k3_tok_ids_push(out, id)))
				return rc;
			start = i + k;
			i = start - 1;
		}
	}
	return encode_ordinary(tok, m, s + start, len - start, out);
}

int k3_tok_encode(const struct k3_tok *tok, const char *text, size_t len, bool allow_special,
		  struct k3_tok_ids *out, struct k3_err *err)
{
	const uint8_t *u = (const uint8_t *)text;
	struct tok_matcher m = { 0 };
	size_t n0 = out->n, bad, i = 0;
	int rc = 0;

	if (len > K3_LIM_TEXT_MAX)
		return k3_err_set(err, -E2BIG, "text of %zu bytes exceeds the %u-byte limit", len, K3_LIM_TEXT_MAX);
	bad = tok_utf8_valid_prefix_blocks(text, len, tok->re_new.code ? tok->new_block : NULL,
				       &m.maybe_new);
	if (bad != len)
		return k3_err_set(err, -EILSEQ, "invalid UTF-8 at byte %zu", bad);

	/* §1.5: 400,000-code-point chunks, then same-class runs of more than
	 * 25,000 characters are cut; slices are encoded independently. The
	 * chunk boundary resets the run state, as in the Python generator.
	 * Text of at most 25,000 bytes has at most 25,000 characters: no cut. */
	if (len <= K3_TOK_RUN_CHARS) {
		rc = encode_slice(tok, &m, text, len, allow_special, out);
		i = len;
	}
	while (i < len && rc == 0) {
		size_t chunk_chars = 0, slice_start = i, run = 0;
		bool run_space = false;

		while (i < len && chunk_chars < K3_TOK_CHUNK_CHARS) {
			uint32_t cp;
			size_t k = tok_utf8_next(u + i, &cp);
			bool sp = tok_py_isspace(cp);

			if (chunk_chars == 0)
				run_space = sp;
			if (sp != run_space) {
				run = 1;
				run_space = sp;
			} else if (++run > K3_TOK_RUN_CHARS) {
				rc = encode_slice(tok, &m, text + slice_start, i - slice_start, allow_special, out);
				if (rc)
					break;
				slice_start = i;
				run = 1;
			}
			i += k;
			chunk_chars++;
		}
		if (rc == 0)
			rc = encode_slice(tok, &m, text + slice_start, i - slice_start, allow_special, out);
	}
	tok_matcher_release(&m);
	if (rc) {
		out->n = n0;
		if (rc == -ENOMEM)
			return k3_err_set(err, rc, "out of memory while encoding %zu bytes", len);
		return k3_err_set(err, rc, "pre-tokenizer failed on %zu bytes (%d)", len, rc);
	}
	return 0;
}

/* ---- decoding ------------------------------------------------------------ */

uint32_t k3_tok_n_ranks(const struct k3_tok *tok) { return tok->n_ranks; }
uint32_t k3_tok_n_vocab(const struct k3_tok *tok) { return tok->n_vocab; }

uint32_t k3_tok_special(const struct k3_tok *tok, unsigned which)
{
	return tok->n_ranks + (which & 0xff);
}

bool k3_tok_is_special(const struct k3_tok *tok, uint32_t id)
{
	return id >= tok->n_ranks && id < tok->n_vocab;
}

bool k3_tok_special_prefix(const struct k3_tok *tok, const char *s, size_t n)
{
	uint32_t node = 0;

	for (size_t i = 0; i < n; i++) {
		uint32_t c = tok->trie[node].child;
		while (c && tok->trie[c].byte != (uint8_t)s[i])
			c = tok->trie[c].next;
		if (!c)
			return false;
		node = c;
	}
	return n > 0 && tok->trie[node].child != 0;
}

int64_t k3_tok_special_by_name(const struct k3_tok *tok, const char *name)
{
	uint32_t id;
	size_t n = strlen(name);

	if (n && special_at(tok, (const uint8_t *)name, n, &id) == n)
		return id;
	return -ENOENT;
}

int k3_tok_id_bytes(const struct k3_tok *tok, uint32_t id, const uint8_t **bytes, size_t *len)
{
	if (id >= tok->n_vocab)
		return -ERANGE;
	*bytes = tok->arena + tok->off[id];
	*len = tok->off[id + 1] - tok->off[id];
	return 0;
}

int k3_tok_decode(const struct k3_tok *tok, const uint32_t *ids, size_t n,
		  char **out, size_t *out_len, struct k3_err *err)
{
	size_t total = 0, w = 0;
	char *buf;

	if (n > SIZE_MAX / K3_TOK_TOKEN_BYTES_MAX - 1)
		return k3_err_set(err, -E2BIG, "%zu ids are too many to decode at once", n);
	for (size_t i = 0; i < n; i++) {
		if (ids[i] >= tok->n_vocab)
			return k3_err_set(err, -ERANGE, "id %u at position %zu is outside the vocabulary (%u ids)",
					  ids[i], i, tok->n_vocab);
		total += tok->off[ids[i] + 1] - tok->off[ids[i]];
	}
	buf = malloc(total + 1);
	if (!buf)
		return k3_err_set(err, -ENOMEM, "out of memory decoding %zu ids", n);
	for (size_t i = 0; i < n; i++) {
		uint32_t k = tok->off[ids[i] + 1] - tok->off[ids[i]];
		memcpy(buf + w, tok->arena + tok->off[ids[i]], k);
		w += k;
	}
	buf[w] = 0;
	*out = buf;
	*out_len = w;
	return 0;
}

/* ---- loading --------------------------------------------------------------- */

void k3_tok_free(struct k3_tok *tok)
{
	if (!tok)
		return;
	free(tok->block);
	pcre2_code_free(tok->re.code);
	pcre2_code_free(tok->re_new.code);
	free(tok);
}

static int b64_val(uint8_t c)
{
	if (c >= 'A' && c <= 'Z') return c - 'A';
	if (c >= 'a' && c <= 'z') return c - 'a' + 26;
	if (c >= '0' && c <= '9') return c - '0' + 52;
	if (c == '+') return 62;
	if (c == '/') return 63;
	return -1;
}

/* Standard base64 with padding; returns decoded length or -1. */
static long b64_decode(const uint8_t *s, size_t n, uint8_t *out, size_t cap)
{
	size_t w = 0;

	if (n == 0 || n % 4)
		return -1;
	for (size_t i = 0; i < n; i += 4) {
		int v[4], pad = 0;
		for (int k = 0; k < 4; k++) {
			if (s[i + k] == '=' && i + 4 == n && k >= 2) {
				v[k] = 0;
				pad++;
			} else if (pad || (v[k] = b64_val(s[i + k])) < 0) {
				return -1;
			}
		}
		uint32_t x = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
		if (w + 3 - (size_t)pad > cap)
			return -1;
		out[w++] = (uint8_t)(x >> 16);
		if (pad < 2) out[w++] = (uint8_t)(x >> 8);
		if (pad < 1) out[w++] = (uint8_t)x;
	}
	return (long)w;
}

static int trie_add(struct k3_tok *tok, const uint8_t *name, size_t n, uint32_t id)
{
	uint32_t node = 0;

	for (size_t i = 0; i < n; i++) {
		uint32_t c = tok->trie[node].child, last = 0;
		while (c && tok->trie[c].byte != name[i]) {
			last = c;
			c = tok->trie[c].next;
		}
		if (!c) {
			c = tok->n_trie++;
			tok->trie[c] = (struct trie_node){ 0, 0, NO_RANK, name[i] };
			if (last)
				tok->trie[last].next = c;
			else
				tok->trie[node].child = c;
		}
		node = c;
	}
	if (tok->trie[node].id != NO_RANK)
		return -EEXIST;
	tok->trie[node].id = id;
	return 0;
}

/* Reads added_tokens_decoder into names[0..255] (NULL = reserved). The
 * strings stay owned by root. */
static int load_config(json_t *root, uint32_t n_ranks, const char *names[K3_TOK_N_SPECIAL],
		       struct k3_err *err)
{
	json_t *dec = json_object_get(root, "added_tokens_decoder"), *v;
	const char *key;

	if (!json_is_object(root))
		return k3_err_set(err, -EINVAL, "tokenizer config: top level is not a JSON object");
	if (!dec)
		return 0;
	if (!json_is_object(dec))
		return k3_err_set(err, -EINVAL, "tokenizer config: 'added_tokens_decoder' is not an object");
	json_object_foreach(dec, key, v) {
		uint64_t id;
		json_t *c = json_object_get(v, "content");
		if (k3_parse_u64(key, 0, UINT32_MAX, &id, NULL))
			return k3_err_set(err, -EINVAL, "tokenizer config: added token key '%.40s' is not an id", key);
		if (!json_is_string(c) || json_string_length(c) == 0 ||
		    json_string_length(c) > K3_TOK_SPECIAL_NAME_MAX ||
		    strlen(json_string_value(c)) != json_string_length(c))
			return k3_err_set(err, -EINVAL, "tokenizer config: added token %s has no usable 'content'", key);
		/* Entries outside the special block are ignored, as in
		 * tokenization_kimi.py, which only reads the 256 slots. */
		if (id >= n_ranks && id < (uint64_t)n_ranks + K3_TOK_N_SPECIAL)
			names[id - n_ranks] = json_string_value(c);
	}
	return 0;
}

int k3_tok_load_buffers(const char *ranks, size_t ranks_len, const char *config, size_t config_len,
			struct k3_tok **out, struct k3_err *err)
{
	const uint8_t *p = (const uint8_t *)ranks, *end = p + ranks_len;
	struct k3_tok *tok = NULL;
	uint32_t n = 0, *line_rank = NULL;
	uint8_t *seen = NULL;
	size_t arena_len = 0, line_no = 0;
	const char *names[K3_TOK_N_SPECIAL] = { 0 };
	char reserved[K3_TOK_N_SPECIAL][32];
	json_t *cfg = NULL;
	int rc;

	if (ranks_len > K3_TOK_FILE_MAX)
		return k3_err_set(err, -E2BIG, "rank file of %zu bytes exceeds the %u-byte limit", ranks_len, K3_TOK_FILE_MAX);
	tok = calloc(1, sizeof(*tok));
	if (!tok)
		return k3_err_set(err, -ENOMEM, "out of memory");

	/* Pass 1: count entries, bound sizes. */
	for (const uint8_t *q = p; q < end;) {
		const uint8_t *nl = memchr(q, '\n', (size_t)(end - q));
		const uint8_t *le = nl ? nl : end;
		if (le > q && !(le - q == 1 && *q == '\r')) {
			if (++n > K3_TOK_RANKS_MAX) {
				rc = k3_err_set(err, -E2BIG, "rank file has more than %u entries", K3_TOK_RANKS_MAX);
				goto fail;
			}
			arena_len += (size_t)(le - q);
		}
		q = nl ? nl + 1 : end;
	}
	if (n < 256) {
		rc = k3_err_set(err, -EINVAL, "rank file has %u entries; at least the 256 single bytes are needed", n);
		goto fail;
	}
	tok->n_ranks = n;
	tok->n_vocab = n + K3_TOK_N_SPECIAL;
	arena_len += (size_t)K3_TOK_N_SPECIAL * (K3_TOK_SPECIAL_NAME_MAX + 1);
	tok->ht_mask = 1;
	while (tok->ht_mask < 2 * n)
		tok->ht_mask <<= 1;
	/* The tables live as long as tok and are sized now: one carved block
	 * holds the specials' trie, off, ht, pair and the arena. */
	struct k3_carve tables = { 0 };
	while (k3_carve_next(&tables)) {
		K3_CARVE(&tables, tok->trie, (size_t)K3_TOK_N_SPECIAL * K3_TOK_SPECIAL_NAME_MAX + 1);
		K3_CARVE(&tables, tok->off, (size_t)tok->n_vocab + 1);
		K3_CARVE(&tables, tok->ht, tok->ht_mask);
		K3_CARVE(&tables, tok->pair, 65536);
		K3_CARVE(&tables, tok->arena, arena_len);
	}
	tok->block = tables.block;
	tok->ht_mask--;
	line_rank = malloc((size_t)n * sizeof(uint32_t));
	seen = calloc(n, 1);
	if (!tok->block || !line_rank || !seen) {
		rc = k3_err_set(err, -ENOMEM, "out of memory loading %u ranks", n);
		goto fail;
	}

	/* Pass 2: decode every line into a temporary slot; the arena is laid
	 * out by rank afterwards (rank = id). Temporary layout: line order. */
	{
		uint8_t *tmp = malloc(arena_len);
		uint32_t *toff = malloc(((size_t)n + 1) * sizeof(uint32_t));
		size_t w = 0;
		uint32_t li = 0;

		if (!tmp || !toff) {
			free(tmp);
			free(toff);
			rc = k3_err_set(err, -ENOMEM, "out of memory loading %u ranks", n);
			goto fail;
		}
		for (const uint8_t *q = p; q < end;) {
			const uint8_t *nl = memchr(q, '\n', (size_t)(end - q));
			const uint8_t *le = nl ? nl : end, *sp;
			char num[16];
			uint64_t r;
			long k;

			line_no++;
			if (le > q && le[-1] == '\r')
				le--;
			if (le == q) {
				q = nl ? nl + 1 : end;
				continue;
			}
			sp = memchr(q, ' ', (size_t)(le - q));
			if (!sp || (size_t)(le - sp - 1) >= sizeof(num) || le - sp - 1 == 0) {
				rc = k3_err_set(err, -EINVAL, "rank file line %zu: want '<base64> <rank>'", line_no);
				goto fail2;
			}
			memcpy(num, sp + 1, (size_t)(le - sp - 1));
			num[le - sp - 1] = 0;
			if (k3_parse_u64(num, 0, n - 1, &r, NULL)) {
				rc = k3_err_set(err, -EINVAL, "rank file line %zu: rank '%s' is not in 0..%u (ranks must be contiguous)",
						line_no, num, n - 1);
				goto fail2;
			}
			if (seen[r]) {
				rc = k3_err_set(err, -EINVAL, "rank file line %zu: rank %llu appears twice", line_no,
						(unsigned long long)r);
				goto fail2;
			}
			seen[r] = 1;
			k = b64_decode(q, (size_t)(sp - q), tmp + w, K3_TOK_TOKEN_BYTES_MAX);
			if (k <= 0) {
				rc = k3_err_set(err, -EINVAL, "rank file line %zu: bad base64 token (or longer than %u bytes)",
						line_no, K3_TOK_TOKEN_BYTES_MAX);
				goto fail2;
			}
			toff[li] = (uint32_t)w;
			line_rank[li] = (uint32_t)r;
			w += (size_t)k;
			li++;
			toff[li] = (uint32_t)w;
			q = nl ? nl + 1 : end;
		}
		/* every rank 0..n-1 was seen exactly once (n lines, no
		 * duplicates, all < n), so the ranks are contiguous */
		{
			uint32_t *len_by_rank = calloc(n, sizeof(uint32_t)), *src = malloc((size_t)n * sizeof(uint32_t));
			if (!len_by_rank || !src) {
				free(len_by_rank);
				free(src);
				rc = k3_err_set(err, -ENOMEM, "out of memory loading %u ranks", n);
				goto fail2;
			}
			for (uint32_t i = 0; i < n; i++) {
				len_by_rank[line_rank[i]] = toff[i + 1] - toff[i];
				src[line_rank[i]] = toff[i];
			}
			w = 0;
			for (uint32_t r = 0; r < n; r++) {
				tok->off[r] = (uint32_t)w;
				memcpy(tok->arena + w, tmp + src[r], len_by_rank[r]);
				w += len_by_rank[r];
			}
			tok->off[n] = (uint32_t)w;
			free(len_by_rank);
			free(src);
		}
		free(tmp);
		free(toff);
		goto pass2_done;
fail2:
		free(tmp);
		free(toff);
		goto fail;
	}
pass2_done:
	/* Hash every rank; a duplicate byte string is an error (ranks must be
	 * a bijection for BPE to be well defined). */
	for (uint32_t r = 0; r < n; r++) {
		const uint8_t *b = tok->arena + tok->off[r];
		uint32_t len = tok->off[r + 1] - tok->off[r];
		uint32_t i = (uint32_t)tok_hash_bytes(b, len) & tok->ht_mask;
		while (tok->ht[i]) {
			uint32_t e = tok->ht[i] - 1;
			if (tok->off[e + 1] - tok->off[e] == len && memcmp(tok->arena + tok->off[e], b, len) == 0) {
				rc = k3_err_set(err, -EINVAL, "rank file: ranks %u and %u have the same bytes", e, r);
				goto fail;
			}
			i = (i + 1) & tok->ht_mask;
		}
		tok->ht[i] = r + 1;
	}
	for (int b = 0; b < 256; b++) {
		uint8_t c = (uint8_t)b;
		tok->byte_rank[b] = NO_RANK;
		uint32_t i = (uint32_t)tok_hash_bytes(&c, 1) & tok->ht_mask;
		while (tok->ht[i]) {
			uint32_t e = tok->ht[i] - 1;
			if (tok->off[e + 1] - tok->off[e] == 1 && tok->arena[tok->off[e]] == c) {
				tok->byte_rank[b] = e;
				break;
			}
			i = (i + 1) & tok->ht_mask;
		}
		if (tok->byte_rank[b] == NO_RANK) {
			rc = k3_err_set(err, -EINVAL, "rank file: byte 0x%02x has no rank (all 256 bytes are required)", b);
			goto fail;
		}
	}
	for (uint32_t i = 0; i < 65536; i++)
		tok->pair[i] = NO_RANK;
	for (uint32_t r = 0; r < n; r++)
		if (tok->off[r + 1] - tok->off[r] == 2)
			tok->pair[(uint32_t)tok->arena[tok->off[r]] << 8 | tok->arena[tok->off[r] + 1]] = r;

	/* The release file is identified by its size in ranks; then its bytes
	 * must be the published ones (§1.1). */
	if (n == K3_TOK_REAL_RANKS) {
		unsigned char md[32];
		unsigned int mdlen = 0;
		char hex[65];
		if (!EVP_Digest(ranks, ranks_len, md, &mdlen, EVP_sha256(), NULL) || mdlen != 32) {
			rc = k3_err_set(err, -EIO, "SHA-256 of the rank file failed");
			goto fail;
		}
		for (int i = 0; i < 32; i++)
			snprintf(hex + 2 * i, 3, "%02x", md[i]);
		if (strcmp(hex, K3_TOK_REAL_SHA256) != 0) {
			rc = k3_err_set(err, -EBADMSG, "rank file has the release's %u ranks but SHA-256 %s, not %s",
					n, hex, K3_TOK_REAL_SHA256);
			goto fail;
		}
	}

	/* Special names (§1.6). */
	if (config) {
		json_error_t je;
		if (config_len > K3_TOK_FILE_MAX) {
			rc = k3_err_set(err, -E2BIG, "tokenizer config is too large");
			goto fail;
		}
		cfg = json_loadb(config, config_len, JSON_REJECT_DUPLICATES, &je);
		if (!cfg) {
			rc = k3_err_set(err, -EINVAL, "tokenizer config: %s at line %d", je.text, je.line);
			goto fail;
		}
		if ((rc = load_config(cfg, n, names, err)))
			goto fail;
	}
	tok->trie[0] = (struct trie_node){ 0, 0, NO_RANK, 0 };
	tok->n_trie = 1;
	{
		size_t w = tok->off[n];
		for (uint32_t i = 0; i < K3_TOK_N_SPECIAL; i++) {
			const char *nm = names[i];
			size_t k;
			if (!nm) {
				snprintf(reserved[i], sizeof(reserved[i]), "<|reserved_token_%u|>", n + i);
				nm = reserved[i];
			}
			k = strlen(nm);
			memcpy(tok->arena + w, nm, k);
			tok->off[n + i] = (uint32_t)w;
			w += k;
			tok->off[n + i + 1] = (uint32_t)w;
			if (trie_add(tok, (const uint8_t *)nm, k, n + i)) {
				rc = k3_err_set(err, -EINVAL, "tokenizer config: special name '%s' is used twice", nm);
				goto fail;
			}
			tok->special_first[(uint8_t)nm[0]] = 1;
		}
	}
	if ((rc = tok_compile_regex(tok, err)))
		goto fail;
	json_decref(cfg);
	free(line_rank);
	free(seen);
	*out = tok;
	return 0;
fail:
	json_decref(cfg);
	free(line_rank);
	free(seen);
	k3_tok_free(tok);
	return rc;
}

int k3_tok_load_files(const char *rank_path, const char *config_path, struct k3_tok **out,
		      struct k3_err *err)
{
	char *r = NULL, *c = NULL;
	size_t rn = 0, cn = 0;
	int rc;

	if ((rc = k3_file_read(rank_path, K3_TOK_FILE_MAX, 0, &r, &rn, err)))
		return rc;
	if (config_path && (rc = k3_file_read(config_path, K3_TOK_FILE_MAX, 0, &c, &cn, err))) {
		free(r);
		return rc;
	}
	rc = k3_tok_load_buffers(r, rn, c, cn, out, err);
	if (rc)
		k3_err_prefix(err, "%s", rank_path);
	free(r);
	free(c);
	return rc;
}

int k3_tok_load_dir(const char *dir, struct k3_tok **out, struct k3_err *err)
{
	char rp[4096], cp[4096];

	if ((size_t)snprintf(rp, sizeof(rp), "%s/tiktoken.model", dir) >= sizeof(rp) ||
	    (size_t)snprintf(cp, sizeof(cp), "%s/tokenizer_config.json", dir) >= sizeof(cp))
		return k3_err_set(err, -ENAMETOOLONG, "model directory path is too long");
	if (access(cp, F_OK) != 0)
		return k3_tok_load_files(rp, NULL, out, err);
	return k3_tok_load_files(rp, cp, out, err);
}
