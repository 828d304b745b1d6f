/*
 * test_demo.c - demo-model checkpoints: every preset loads through the same
 * loader as the real release (bench with tiny flags); the same seed gives
 * the same bytes; the layout follows the golden checkpoints (same tensor
 * roles, dtypes, shard order); nano exercises every path; the tokenizer has
 * the real byte order and special names; bench has the real per-expert span.
 */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <sys/stat.h>

#include "t.h"
#include "demo/demo.h"
#include "model/inspect.h"
#include "model/model.h"

static char root[64];

static const char *sub(const char *name)
{
	return t_join(root, name);
}

/* The demo checkpoint under sub(name), opened; NULL (and a failure with
 * the reason) when it does not open. */
static struct k3_model *open_demo(const char *name)
{
	struct k3_model *m = NULL;
	struct k3_err err = { 0, "" };
	int r = k3_model_open(sub(name), &m, &err);

	T_EQ_INT(r, 0);
	if (r)
		printf("     %s\n", err.msg);
	return r ? NULL : m;
}

static bool same_file(const char *a, const char *b)
{
	size_t na, nb;
	unsigned char *x = t_read_file(a, &na), *y = t_read_file(b, &nb);
	bool same = x && y && na == nb && memcmp(x, y, na) == 0;

	free(x);
	free(y);
	return same;
}

/* "language_model.model.layers.12.block_sparse_moe.experts.3.w1.weight_packed"
 * -> "model.layers.N.block_sparse_moe.experts.E.w1.weight_packed" */
static void role_of(const char *name, char *out, size_t n)
{
	const char *p = strncmp(name, "language_model.", 15) == 0 ? name + 15 : name;
	size_t o = 0;

	while (*p && o + 2 < n) {
		if (*p >= '0' && *p <= '9' && o > 0 && out[o - 1] == '.') {
			bool expert = o >= 8 && strncmp(out + o - 8, "experts.", 8) == 0;
			out[o++] = expert ? 'E' : 'N';
			while (*p >= '0' && *p <= '9')
				p++;
		} else {
			out[o++] = *p++;
		}
	}
	out[o] = 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* sorted distinct role patterns with their dtype */
static size_t roles(const struct k3_model *m, char ***out)
{
	size_t n, k = 0;
	const struct k3_tensor *t = k3_model_tensors(m, &n);
	char **v = calloc(n, sizeof(*v));

	for (size_t i = 0; i < n; i++) {
		char r[256], line[300];
		role_of(t[i].name, r, sizeof(r));
		snprintf(line, sizeof(line), "%s %s/%u", r, k3_dtype_name(t[i].dtype), t[i].ndim);
		v[k++] = strdup(line);
	}
	qsort(v, k, sizeof(*v), cmp_str);
	size_t u = 0;
	for (size_t i = 0; i < k; i++) {
		if (u && strcmp(v[u - 1], v[i]) == 0) {
			free(v[i]);
			continue;
		}
		v[u++] = v[i];
	}
	*out = v;
	return u;
}

/* Standard base64 with padding, decoded by OpenSSL (not by the
 * tokenizer under test) into out (3 bytes per 4 characters); the decoded
 * length, or 0 for malformed input. */
static size_t b64dec(const char *s, size_t n, unsigned char *out)
{
	int k = n % 4 == 0 && n <= 2048 ? EVP_DecodeBlock(out, (const unsigned char *)s, (int)n) : -1;
	size_t pad = n && s[n - 1] == '=' ? (n > 1 && s[n - 2] == '=' ? 2 : 1) : 0;

	return k > 0 ? (size_t)k - pad : 0;
}

static void check_tokenizer(const char *dir, uint32_t vocab)
{
	char path[300];
	size_t n;

	snprintf(path, sizeof(path), "%s/tiktoken.model", dir);
	unsigned char *b = t_read_file(path, &n);
	if (!T_OK(b != NULL))
		return;
	uint32_t ranks = vocab - 256, lines = 0;
	unsigned char byte_of[256];
	bool ok_ranks = true;
	char *save = NULL;
	for (char *line = strtok_r((char *)b, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *sp = strchr(line, ' ');
		unsigned char tok[1536];
		if (!sp) {
			ok_ranks = false;
			break;
		}
		size_t tl = b64dec(line, (size_t)(sp - line), tok);
		if ((uint32_t)atoi(sp + 1) != lines)
			ok_ranks = false;
		if (lines < 256) {
			if (tl != 1)
				ok_ranks = false;
			byte_of[lines] = tok[0];
		}
		lines++;
	}
	T_OK(ok_ranks);
	T_EQ_INT(lines, ranks);
	/* the real file's single-byte positions (docs/text-and-draft.md §1.2) */
	T_EQ_INT(byte_of[220], ' ');
	T_EQ_INT(byte_of[198], '\n');
	T_EQ_INT(byte_of[197], '\t');
	T_EQ_INT(byte_of[188], 0x00);
	T_EQ_INT(byte_of[189], 0x01);
	T_EQ_INT(byte_of[221], 0x7f);
	T_EQ_INT(byte_of[0], '!');
	T_EQ_INT(byte_of[1], '"');
	T_EQ_INT(byte_of[2], '#');
	bool seen[256] = { false };
	for (int i = 0; i < 256; i++)
		seen[byte_of[i]] = true;
	bool all = true;
	for (int i = 0; i < 256; i++)
		all = all && seen[i];
	T_OK(all);
	free(b);

	snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
	json_t *c = json_load_file(path, 0, NULL);
	json_t *d = json_object_get(c, "added_tokens_decoder");
	T_EQ_INT(json_object_size(d), 256);
	static const struct { uint32_t k; const char *name; } want[] = {
		{ 0, "[BOS]" }, { 1, "[EOS]" }, { 2, "<|end_of_msg|>" }, { 3, "<|open|>" },
		{ 4, "<|close|>" }, { 5, "<|sep|>" }, { 21, "<|media_pad|>" }, { 65, "<osagent_mode>" },
		{ 254, "[UNK]" }, { 255, "[PAD]" },
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		char key[16];
		snprintf(key, sizeof(key), "%u", ranks + want[i].k);
		T_EQ_STR(json_string_value(json_object_get(json_object_get(d, key), "content")), want[i].name);
	}
	char key[16], res[64];
	snprintf(key, sizeof(key), "%u", ranks + 8);
	snprintf(res, sizeof(res), "<|reserved_token_%u|>", ranks + 8);
	T_EQ_STR(json_string_value(json_object_get(json_object_get(d, key), "content")), res);
	snprintf(key, sizeof(key), "%u", ranks + 3);
	T_OK(json_is_false(json_object_get(json_object_get(d, key), "special")));   /* <|open|> */
	T_EQ_STR(json_string_value(json_object_get(c, "eos_token")), "[EOS]");
	json_decref(c);
}

static void test_nano(void)
{
	struct k3_demo_opts o = { .preset = K3_DEMO_NANO, .seed = 1 };
	struct k3_err err = { 0 };
	static const char *files[] = { "config.json", "model.safetensors.index.json",
				       "model-00001-of-00002.safetensors",
				       "model-00002-of-00002.safetensors", "tiktoken.model",
				       "tokenizer_config.json" };

	T_EQ_INT(k3_demo_write(sub("nano1"), &o, &err), 0);
	T_EQ_INT(k3_demo_write(sub("nano1b"), &o, &err), 0);
	o.seed = 2;
	T_EQ_INT(k3_demo_write(sub("nano2"), &o, &err), 0);
	for (size_t i = 0; i < 6; i++) {
		char a[300], b[300], c[300];
		snprintf(a, sizeof(a), "%s/%s", sub("nano1"), files[i]);
		snprintf(b, sizeof(b), "%s/%s", sub("nano1b"), files[i]);
		snprintf(c, sizeof(c), "%s/%s", sub("nano2"), files[i]);
		T_OK(same_file(a, b));                     /* same seed, same bytes */
		if (strstr(files[i], "-of-"))
			T_OK(!same_file(a, c));            /* another seed, other weights */
		if (strstr(files[i], "tok"))
			T_OK(same_file(a, c));             /* the tokenizer ignores the seed */
	}

	struct k3_model *m = open_demo("nano1");
	if (!m)
		return;
	const struct k3_model_config *c = k3_model_config(m);
	T_EQ_INT(c->num_hidden_layers, 9);
	/* MLA at 1-based 4, 8, 9: two consecutive MLA layers at the end */
	for (uint32_t l = 0; l < 9; l++)
		T_EQ_INT(c->is_kda[l], !(l == 3 || l == 7 || l == 8));
	T_EQ_INT(c->n_attn_res_blocks, 3);
	T_OK(c->is_block_start[0] && c->is_block_start[3] && c->is_block_start[6]);
	T_OK(!c->is_moe[0]);
	T_EQ_INT(c->n_moe, 8);
	T_EQ_INT(c->num_shared_experts, 2);
	T_EQ_INT(c->routed_expert_hidden_size, 64);
	T_OK(c->latent_moe_use_norm && c->use_full_rank_gate && c->mla_use_output_gate);
	T_EQ_INT(c->vocab_size, 2304);
	T_EQ_INT(c->bos_token_id, 2048);
	T_EQ_INT(c->eos_token_id, 2050);
	T_EQ_INT(c->pad_token_id, 2303);
	T_EQ_INT(c->media_placeholder_token_id, 2048 + 21);
	T_OK(c->quant_mxfp4);

	/* a few MB */
	size_t n;
	const struct k3_tensor *t = k3_model_tensors(m, &n);
	uint64_t total = 0;
	for (size_t i = 0; i < n; i++)
		total += t[i].nbytes;
	T_OK(total > (1u << 20) && total < (8u << 20));

	/* the safetensors serializer's order: F32, then BF16, then U8; the
	 * header padded so the data section starts 8-aligned */
	for (uint32_t s = 0; s < k3_model_shard_count(m); s++) {
		uint64_t last_f32 = 0, first_bf16 = UINT64_MAX, last_bf16 = 0, first_u8 = UINT64_MAX, min_off = UINT64_MAX;
		for (size_t i = 0; i < n; i++) {
			if (t[i].shard != s)
				continue;
			if (t[i].file_offset < min_off)
				min_off = t[i].file_offset;
			if (t[i].dtype == K3_DTYPE_F32 && t[i].file_offset > last_f32)
				last_f32 = t[i].file_offset;
			if (t[i].dtype == K3_DTYPE_BF16) {
				if (t[i].file_offset < first_bf16)
					first_bf16 = t[i].file_offset;
				if (t[i].file_offset > last_bf16)
					last_bf16 = t[i].file_offset;
			}
			if (t[i].dtype == K3_DTYPE_U8 && t[i].file_offset < first_u8)
				first_u8 = t[i].file_offset;
		}
		T_OK(last_f32 < first_bf16);
		T_OK(last_bf16 < first_u8);
		T_EQ_INT(min_off % 8, 0);
	}
	const struct k3_model_plan *p = k3_model_plan(m);
	T_EQ_INT(p->embed_tokens->shard, 0);
	T_EQ_INT(p->lm_head->shard, k3_model_shard_count(m) - 1);

	/* same roles and dtypes as the independent golden checkpoint */
	struct k3_model *g = NULL;
	T_EQ_INT(k3_model_open(t_shared_path("golden/forward/k3tiny_a/model"), &g, &err), 0);
	if (g) {
		char **ra, **rb;
		size_t na = roles(m, &ra), nb = roles(g, &rb);
		T_EQ_U64(na, nb);
		for (size_t i = 0; i < na && i < nb; i++)
			if (strcmp(ra[i], rb[i]) != 0) {
				T_EQ_STR(ra[i], rb[i]);
				break;
			}
		for (size_t i = 0; i < na; i++)
			free(ra[i]);
		for (size_t i = 0; i < nb; i++)
			free(rb[i]);
		free(ra);
		free(rb);
		k3_model_free(g);
	}

	/* A_log stored like the release: [head_dim], live heads then zeros */
	const struct k3_tensor *al = p->layers[0].kda.a_log;
	T_EQ_INT(al->nelem, 32);
	float a[32];
	T_EQ_INT(k3_tensor_read_f32(al, 0, 32, a), 0);
	bool pad0 = true, live = false;
	for (int i = 0; i < 32; i++) {
		if (i >= 4)
			pad0 = pad0 && a[i] == 0.0f;
		else
			live = live || a[i] != 0.0f;
	}
	T_OK(pad0 && live);

	/* initialization scales: embedding rows ~ unit RMS; input projections
	 * rows ~ 1/sqrt(in) so a unit-RMS input maps to O(1) outputs; expert
	 * weights decode to the same scale */
	float row[128];
	double ss = 0;
	for (uint32_t v = 0; v < 64; v++) {
		k3_tensor_read_f32(p->embed_tokens, (uint64_t)v * 128, 128, row);
		for (int i = 0; i < 128; i++)
			ss += (double)row[i] * row[i];
	}
	T_NEAR(sqrt(ss / (64.0 * 128)), 1.0, 0.1);
	ss = 0;
	for (uint32_t v = 0; v < 64; v++) {
		k3_tensor_read_f32(p->layers[1].kda.q_proj, (uint64_t)v * 128, 128, row);
		for (int i = 0; i < 128; i++)
			ss += (double)row[i] * row[i];
	}
	T_NEAR(sqrt(ss / 64.0), 1.0, 0.1);   /* row norm ~ 1 */
	const struct k3_expert *x = &p->layers[1].moe.experts[0];
	T_OK(x->w1.mxfp4 && x->span_contiguous);
	float dec[64];
	ss = 0;
	for (uint32_t r2 = 0; r2 < 64; r2++) {
		T_EQ_INT(k3_mxfp4_decode_row((const uint8_t *)x->w1.packed->data + r2 * 32,
					     (const uint8_t *)x->w1.scale->data + r2 * 2, 64, dec), 0);
		for (int i = 0; i < 64; i++)
			ss += (double)dec[i] * dec[i];
	}
	T_NEAR(sqrt(ss / 64.0), 1.0, 0.25);
	k3_model_free(m);

	check_tokenizer(sub("nano1"), 2304);
}

static void test_small_and_bench(void)
{
	struct k3_err err = { 0 };
	struct k3_model *m = NULL;

	/* small: the preset's widths, fewer layers to keep the suite fast */
	struct k3_demo_opts o = { .preset = K3_DEMO_SMALL, .seed = 3, .layers = 2, .vocab = 2304 };
	T_EQ_INT(k3_demo_write(sub("small"), &o, &err), 0);
	T_EQ_INT(k3_model_open(sub("small"), &m, &err), 0);
	if (m) {
		T_EQ_INT(k3_model_config(m)->hidden_size, 512);
		T_EQ_INT(k3_model_config(m)->num_experts, 32);
		k3_model_free(m);
	}
	check_tokenizer(sub("small"), 2304);
	/* the small preset's own vocabulary: 4096 learned ranks, then fillers */
	mkdir(sub("tok8448"), 0755);
	T_EQ_INT(k3_demo_write_tokenizer(sub("tok8448"), 8448, &err), 0);
	check_tokenizer(sub("tok8448"), 8448);

	/* bench: real K3 expert shapes with tiny everything else */
	struct k3_demo_opts b = { .preset = K3_DEMO_BENCH, .seed = 4, .layers = 2, .experts = 2,
				  .hidden = 64, .vocab = 512, .intermediate = 64, .kda_heads = 2,
				  .kda_head_dim = 32, .mla_heads = 2, .q_lora = 32, .kv_lora = 32,
				  .nope = 32, .rope = 16, .v_head = 32 };
	T_EQ_INT(k3_demo_write(sub("bench"), &b, &err), 0);
	if (!(m = open_demo("bench")))
		return;
	const struct k3_model_config *c = k3_model_config(m);
	T_EQ_INT(c->routed_expert_hidden_size, 3584);
	T_EQ_INT(c->moe_intermediate_size, 3072);
	T_EQ_INT(c->num_experts_per_token, 2);   /* clamped to --experts */
	static struct k3_model_bytes by;
	k3_model_bytes(m, &by);
	T_EQ_U64(by.expert_span, 17547264);      /* docs/model.md §2.6 */
	T_EQ_U64(by.experts, 2ull * 17547264);
	const struct k3_expert *x = &k3_model_plan(m)->layers[1].moe.experts[1];
	T_OK(x->span_contiguous);
	T_EQ_U64(x->span_bytes, 17547264);
	T_EQ_U64(x->w2.scale->shape[1], 96);
	struct k3_model_fit fit;
	k3_model_fit(&by, by.spine + 17547264 + 100, &fit);
	T_OK(fit.spine_fits);
	T_EQ_U64(fit.expert_slots, 1);
	k3_model_free(m);
	check_tokenizer(sub("bench"), 512);
}

static void test_options(void)
{
	struct k3_demo_dims d;
	struct k3_err err = { 0 };
	struct k3_demo_opts o = { .preset = K3_DEMO_NANO, .vocab = 300 };

	T_EQ_INT(k3_demo_resolve(&o, &d, &err), -EINVAL);
	T_OK(strstr(err.msg, "--vocab 300") != NULL);
	o = (struct k3_demo_opts){ .preset = K3_DEMO_NANO, .latent = 48 };
	T_EQ_INT(k3_demo_resolve(&o, &d, &err), -EINVAL);
	T_OK(strstr(err.msg, "multiples of 32") != NULL);
	o = (struct k3_demo_opts){ .preset = K3_DEMO_NANO, .top_k = 17 };
	T_EQ_INT(k3_demo_resolve(&o, &d, &err), -EINVAL);
	enum k3_demo_preset p;
	T_EQ_INT(k3_demo_preset_parse("bench", &p), 0);
	T_EQ_INT(p, K3_DEMO_BENCH);
	T_EQ_INT(k3_demo_preset_parse("huge", &p), -EINVAL);
	T_EQ_STR(k3_demo_special_name(2), "<|end_of_msg|>");
	T_OK(k3_demo_special_name(8) == NULL);
}

int main(void)
{
	snprintf(root, sizeof(root), "/tmp/k3-demo-test-XXXXXX");
	if (!mkdtemp(root))
		return t_skip("mkdtemp failed");
	test_options();
	test_nano();
	test_small_and_bench();
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	T_EQ_INT(system(cmd), 0);
	return t_done();
}
