/*
 * bench_tokenizer.c - K3 encode throughput, single thread, on a mixed
 * English / C code / CJK text, and the crossover of parallel segment
 * encoding for long chat histories. Not a test: timings never decide
 * anything; run it by hand:
 *
 *   build/plain/tests/bench/bench_tokenizer [MODEL_DIR]
 *
 * With MODEL_DIR (or ../shared/models/kimi-k3-tokenizer present) it uses
 * the real vocabulary; otherwise a stand-in built from the text itself
 * (every byte, then the 2..8-byte substrings of its regex pieces by
 * frequency, ~100k ranks) so BPE does a realistic number of merges.
 * Prints medians of 7 runs and the ratio of encode speed to this
 * machine's streaming memory read bandwidth measured in the same run.
 */
#include <jansson.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "text/text_chat.h"
#include "text/text_tok.h"

/* Single-thread figures use this thread's CPU time: the build machine is
 * shared and wall time there mostly measures the run queue. */
static const char *const english[] = {
	"The quick brown fox jumps over the lazy dog. ",
	"In 2024, researchers measured a 37% improvement in throughput across 12 benchmarks. ",
	"She didn't think it'd work, but they've shipped it anyway! ",
	"Tokenization splits text into pieces; each piece is merged by rank.\n",
	"HTTPRequestHandler and XMLHttpRequest are CamelCase identifiers. ",
};
static const char *const code[] = {
	"static int add(int a, int b)\n{\n\treturn a + b;\n}\n",
	"for (size_t i = 0; i < n; i++) {\n        sum += v[i] * w[i];\n    }\n",
	"def encode(self, text: str) -> list[int]:\n    return [self.ranks[p] for p in pieces]\n",
	"    if (rc < 0 && errno == EINTR) continue; // retry\n",
	"{\"name\": \"bash\", \"arguments\": {\"command\": \"ls -la /tmp\"}}\n",
};
static const char *const cjk[] = {
	"\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c\xe3\x80\x82\xe4\xbb\x8a\xe5\xa4\xa9\xe5\xa4\xa9\xe6\xb0\x94\xe5\xbe\x88\xe5\xa5\xbd\xe3\x80\x82",
	"\xe6\x9d\xb1\xe4\xba\xac\xe3\x82\xbf\xe3\x83\xaf\xe3\x83\xbc\xe3\x81\xaf\xe9\xab\x98\xe3\x81\x84\xe3\x81\xa7\xe3\x81\x99\xe3\x80\x82",
	("\xe4\xb8\xad\xe6\x96\x87" "English\xe6\xb7\xb7\xe5\x90\x88\xe5\x86\x85\xe5\xae\xb9\xef\xbc\x8c\xe5\x8c\x85\xe6\x8b\xac\xe6\x95\xb0\xe5\xad\x97 12345\xe3\x80\x82\n"),
	"\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 \xed\x85\x8d\xec\x8a\xa4\xed\x8a\xb8\xeb\x8f\x84 \xec\x9e\x88\xec\x8a\xb5\xeb\x8b\x88\xeb\x8b\xa4. ",
};

static char *make_text(size_t target, size_t *len)
{
	char *t = malloc(target + 512);
	size_t n = 0;

	while (n < target) {
		const char *s;
		switch (k3_bench_rand() % 3) {
		case 0: s = english[k3_bench_rand() % 5]; break;
		case 1: s = code[k3_bench_rand() % 5]; break;
		default: s = cjk[k3_bench_rand() % 4]; break;
		}
		size_t k = strlen(s);
		memcpy(t + n, s, k);
		n += k;
	}
	*len = n;
	return t;
}

/* stand-in vocabulary from the text's own pieces */
struct piece_ctx { const char *text; json_t *counts; };

static int count_piece(void *ud, size_t off, size_t len)
{
	struct piece_ctx *c = ud;
	char key[9];
	for (size_t a = 0; a < len; a++) {
		for (size_t l = 2; l <= 8 && a + l <= len; l++) {
			memcpy(key, c->text + off + a, l);
			key[l] = 0;
			if (strlen(key) != l)
				continue;
			json_t *v = json_object_get(c->counts, key);
			json_object_set_new(c->counts, key, json_integer(v ? json_integer_value(v) + 1 : 1));
		}
	}
	return 0;
}

struct kv { const char *k; long long n; };
static int cmp_kv(const void *a, const void *b)
{
	const struct kv *x = a, *y = b;
	if (x->n != y->n)
		return x->n > y->n ? -1 : 1;
	return strcmp(x->k, y->k);
}

static struct k3_tok *standin(const char *text, size_t len)
{
	struct k3_tok *bytes = NULL, *tok = NULL;
	char *ranks = malloc(64u << 20);
	unsigned char b64[64];
	size_t n = 0, r = 0;
	struct piece_ctx c = { text, json_object() };
	const char *k;
	json_t *v;

	for (int b = 0; b < 256; b++) {
		unsigned char ch = (unsigned char)b;
		EVP_EncodeBlock(b64, &ch, 1);
		n += (size_t)sprintf(ranks + n, "%s %zu\n", b64, r++);
	}
	k3_tok_load_buffers(ranks, n, NULL, 0, &bytes, NULL);
	k3_tok_split_pieces(bytes, text, len < (4u << 20) ? len : (4u << 20), count_piece, &c, NULL);
	size_t nk = json_object_size(c.counts), i = 0;
	struct kv *kvs = malloc(nk * sizeof(*kvs));
	json_object_foreach(c.counts, k, v)
		kvs[i++] = (struct kv){ k, json_integer_value(v) };
	qsort(kvs, nk, sizeof(*kvs), cmp_kv);
	for (i = 0; i < nk && r < 100000; i++) {
		EVP_EncodeBlock(b64, (const unsigned char *)kvs[i].k, (int)strlen(kvs[i].k));
		n += (size_t)sprintf(ranks + n, "%s %zu\n", b64, r++);
	}
	if (k3_tok_load_buffers(ranks, n, NULL, 0, &tok, NULL))
		fprintf(stderr, "stand-in vocabulary failed\n");
	free(kvs);
	json_decref(c.counts);
	free(ranks);
	k3_tok_free(bytes);
	return tok;
}

int main(int argc, char **argv)
{
	const char *dir = argc > 1 ? argv[1] : "../shared/models/kimi-k3-tokenizer";
	struct k3_err err = { 0, "" };
	struct k3_tok *tok = NULL;
	size_t len, nids = 0;
	char *text = make_text(4u << 20, &len);
	double t[7], bw, mbs;
	char path[4200];

	snprintf(path, sizeof(path), "%s/tiktoken.model", dir);
	if (access(path, R_OK) == 0 && k3_tok_load_dir(dir, &tok, &err) == 0) {
		printf("vocabulary: real (%s), %u ids\n", dir, k3_tok_n_vocab(tok));
	} else {
		tok = standin(text, len);
		printf("vocabulary: stand-in built from the text, %u ranks (real file absent)\n", k3_tok_n_ranks(tok));
	}
	bw = k3_bench_mem_bw((size_t)256 << 20, 1, 5) * 1e3;   /* MB/s */
	double tw[7];
	for (int r = 0; r < 7; r++) {
		struct k3_tok_ids ids = { 0 };
		double t0 = k3_bench_now(), c0 = k3_bench_cpu_now();
		k3_tok_encode(tok, text, len, false, &ids, NULL);
		t[r] = k3_bench_cpu_now() - c0;
		tw[r] = k3_bench_now() - t0;
		nids = ids.n;
		k3_tok_ids_release(&ids);
	}
	mbs = (double)len / k3_bench_median(t, 7) / 1e6;
	printf("encode: %.2f MB of mixed English/code/CJK -> %zu ids (%.2f bytes/id)\n", (double)len / 1e6, nids,
	       (double)len / (double)nids);
	printf("encode median: %.1f MB/s single thread (thread CPU time; wall %.1f MB/s); memory read %.0f MB/s; ratio %.4f\n",
	       mbs, (double)len / k3_bench_median(tw, 7) / 1e6, bw, mbs / bw);

	/* parallel segment encoding of chat histories of growing size */
	printf("chat encode (serial vs %d threads), medians of 5:\n", 4);
	for (size_t kb = 16; kb <= 4096; kb *= 4) {
		json_t *msgs = json_array();
		struct k3_chat_opts o;
		struct k3_chat c = { 0 };
		size_t at = 0, total = 0;
		double ts[5], tp[5];
		while (total < kb * 1024) {
			size_t k = 200 + k3_bench_rand() % 2000;
			if (at + k > len)
				at = 0;
			while (((unsigned char)text[at + k] & 0xc0) == 0x80)
				k--;   /* whole characters only */
			json_array_append_new(msgs, json_pack("{s:s,s:s%}", "role", k3_bench_rand() % 2 ? "user" : "assistant",
							      "content", text + at, k));
			at += k;
			total += k;
		}
		k3_chat_opts_init(&o);
		if (k3_chat_render(msgs, &o, &c, NULL)) {
			/* a slice may cut a character: skip that size */
			json_decref(msgs);
			continue;
		}
		for (int r = 0; r < 5; r++) {
			struct k3_tok_ids a = { 0 }, b = { 0 };
			double t0 = k3_bench_now();
			k3_chat_encode(tok, &c, &a, NULL);
			ts[r] = k3_bench_now() - t0;
			t0 = k3_bench_now();
			/* force threads to measure the crossover itself */
			struct k3_chat big = c;
			big.text_len = c.text_len < K3_CHAT_PAR_MIN_BYTES ? K3_CHAT_PAR_MIN_BYTES : c.text_len;
			k3_chat_encode_parallel(tok, &big, 4, &b, NULL);
			tp[r] = k3_bench_now() - t0;
			if (a.n != b.n || memcmp(a.v, b.v, a.n * 4))
				printf("  MISMATCH at %zu KiB\n", kb);
			k3_tok_ids_release(&a);
			k3_tok_ids_release(&b);
		}
		printf("  %6zu KiB, %5zu segments: serial %8.3f ms, parallel %8.3f ms, speedup %.2f\n", c.text_len / 1024,
		       c.n_segs, k3_bench_median(ts, 5) * 1e3, k3_bench_median(tp, 5) * 1e3, k3_bench_median(ts, 5) / k3_bench_median(tp, 5));
		k3_chat_release(&c);
		json_decref(msgs);
	}
	k3_tok_free(tok);
	free(text);
	return 0;
}
