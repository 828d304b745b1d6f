/*
 * test_corrupt.c - the malformed-checkpoint catalogue. Each case copies the
 * golden k3tiny_a checkpoint into a temporary directory, breaks one thing
 * and checks that k3_model_open fails with that thing's own error code and
 * message (and that the pristine copy still opens).
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "t.h"
#include "model/model.h"

static const char *SH1 = "model-00001-of-00002.safetensors";
static const char *SH2 = "model-00002-of-00002.safetensors";
static const char *PFX = "language_model.model.layers.";

static char root[256];

static void spit(const char *path, const void *p, size_t n)
{
	FILE *f = fopen(path, "wb");
	if (!f)
		return;
	fwrite(p, 1, n, f);
	fclose(f);
}

static const char *at(const char *dir, const char *file)
{
	static char buf[4][1024];
	static int k;
	char *o = buf[k++ & 3];

	snprintf(o, sizeof(buf[0]), "%s/%s", dir, file);
	return o;
}

/* A fresh copy of k3tiny_a in root/<name>; returns its path. */
static const char *fresh(const char *name)
{
	static const char *files[] = { "config.json", "model.safetensors.index.json",
				       "model-00001-of-00002.safetensors",
				       "model-00002-of-00002.safetensors" };
	static char dir[400];
	const char *src = t_shared_path("golden/forward/k3tiny_a/model");

	snprintf(dir, sizeof(dir), "%s/%s", root, name);
	mkdir(dir, 0755);
	for (size_t i = 0; i < 4; i++) {
		size_t n;
		unsigned char *b = t_read_file(at(src, files[i]), &n);
		if (b)
			spit(at(dir, files[i]), b, n);
		free(b);
	}
	return dir;
}

/* A shard's bytes (*b, malloc'ed; *n of them) and its parsed JSON
 * header, *hl bytes after the 8-byte length. */
static json_t *read_header(const char *path, unsigned char **b, size_t *n, uint64_t *hl)
{
	*b = t_read_file(path, n);
	*hl = 0;
	for (int i = 7; i >= 0; i--)
		*hl = (*hl << 8) | (*b)[i];
	return json_loadb((const char *)*b + 8, (size_t)*hl, 0, NULL);
}

/* Rewrites a shard's JSON header through edit(), keeping the data section. */
static void edit_header(const char *path, void (*edit)(json_t *h))
{
	unsigned char *b;
	size_t n;
	uint64_t hl;
	json_t *h = read_header(path, &b, &n, &hl);

	edit(h);
	char *s = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
	size_t sl = strlen(s), pad = (8 - sl % 8) % 8;
	FILE *f = fopen(path, "wb");
	uint64_t nl = sl + pad;
	for (int i = 0; i < 8; i++)
		fputc((int)((nl >> (8 * i)) & 0xff), f);
	fwrite(s, 1, sl, f);
	for (size_t i = 0; i < pad; i++)
		fputc(' ', f);
	fwrite(b + 8 + hl, 1, n - 8 - hl, f);
	fclose(f);
	free(s);
	json_decref(h);
	free(b);
}

/* Opens dir and checks the failure: code and every needle in the message. */
static void expect_fail(const char *dir, int code, const char *n1, const char *n2)
{
	struct k3_model *m = NULL;
	struct k3_err err = { 0 };
	int r = k3_model_open(dir, &m, &err);

	T_EQ_INT(r, code);
	T_OK(m == NULL);
	if (!T_OK(strstr(err.msg, n1) != NULL) || (n2 && !T_OK(strstr(err.msg, n2) != NULL)))
		printf("     message: %s\n", err.msg);
	else if (getenv("K3_TEST_VERBOSE"))
		printf("ok: %s\n", err.msg);
	k3_model_free(m);
}

static char key_buf[256];
static const char *key(const char *rest)
{
	snprintf(key_buf, sizeof(key_buf), "%s%s", PFX, rest);
	return key_buf;
}

static void ed_overlap(json_t *h)
{
	json_t *q = json_object_get(h, key("0.self_attn.q_conv1d.weight"));
	json_t *k = json_object_get(h, key("0.self_attn.k_conv1d.weight"));
	json_object_set(k, "data_offsets", json_object_get(q, "data_offsets"));
}

static void ed_dtype_size(json_t *h)
{
	/* BF16 [96, 160] relabelled F32: 61440 bytes claimed, 30720 stored */
	json_object_set_new(json_object_get(h, key("0.mlp.down_proj.weight")), "dtype", json_string("F32"));
}

static void ed_dtype_plan(json_t *h)
{
	/* BF16 -> F16 keeps the byte length: only the plan can object */
	json_object_set_new(json_object_get(h, key("0.mlp.down_proj.weight")), "dtype", json_string("F16"));
}

static void ed_shape_plan(json_t *h)
{
	/* [160, 96] -> [96, 160]: same bytes, transposed shape */
	json_t *t = json_object_get(h, key("0.mlp.gate_proj.weight"));
	json_object_set_new(t, "shape", json_pack("[ii]", 96, 160));
}

static void ed_unknown_dtype(json_t *h)
{
	json_object_set_new(json_object_get(h, key("0.mlp.down_proj.weight")), "dtype", json_string("Q4_K"));
}

static void ed_remove(json_t *h)
{
	json_object_del(h, key("2.self_attn.dt_bias"));
	json_object_del(h, key("3.self_attn.kv_b_proj.weight"));
	json_object_del(h, key("1.block_sparse_moe.experts.5.w2.weight_scale"));
}

static void ix_remove(const char *dir)
{
	json_t *ix = json_load_file(at(dir, "model.safetensors.index.json"), 0, NULL);
	json_t *wm = json_object_get(ix, "weight_map");
	json_object_del(wm, key("2.self_attn.dt_bias"));
	json_object_del(wm, key("3.self_attn.kv_b_proj.weight"));
	json_object_del(wm, key("1.block_sparse_moe.experts.5.w2.weight_scale"));
	json_dump_file(ix, at(dir, "model.safetensors.index.json"), JSON_INDENT(2));
	json_decref(ix);
}

static void set_config(const char *dir, const char *field, json_t *value, bool text)
{
	json_t *c = json_load_file(at(dir, "config.json"), 0, NULL);
	json_object_set_new(text ? json_object_get(c, "text_config") : c, field, value);
	json_dump_file(c, at(dir, "config.json"), JSON_INDENT(2));
	json_decref(c);
}

/* Byte offset of a tensor's payload in a shard file. */
static long payload_off(const char *path, const char *name)
{
	unsigned char *b;
	size_t n;
	uint64_t hl;
	json_t *h = read_header(path, &b, &n, &hl);
	json_t *t = json_object_get(h, name);
	long off = t ? (long)(8 + hl + json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 0))) : -1;
	json_decref(h);
	free(b);
	return off;
}

/* Writes n bytes over path at off. */
static void overwrite(const char *path, long off, const unsigned char *bytes, size_t n)
{
	int fd = open(path, O_WRONLY);

	T_EQ_INT(pwrite(fd, bytes, n, off), (long)n);
	close(fd);
}

/* Cases that are one edit of the first shard's header: the numbers are
 * those of the catalogue in main. */
static const struct {
	const char *name;
	void (*edit)(json_t *h);
	const char *n1, *n2;          /* what the error must say */
} header_cases[] = {
	{ "overlap", ed_overlap, "overlapping data_offsets", "k_conv1d" },                 /* 3 */
	{ "dtype-size", ed_dtype_size, "dtype/shape mismatch", "mlp.down_proj" },          /* 4: byte length */
	{ "dtype-unknown", ed_unknown_dtype, "unknown dtype 'Q4_K'", NULL },               /* 4b */
	{ "index-only", ed_remove, "missing tensor", "listed in the index" },              /* 6b: not in its shard */
	{ "plan-dtype", ed_dtype_plan, "has dtype F16, expected BF16", "mlp.down_proj" },  /* 6c: plan errors */
	{ "plan-shape", ed_shape_plan, "has shape [96, 160], expected [160, 96]", "gate_proj" },
};

int main(void)
{
	const char *d;
	struct k3_model *m = NULL;
	struct k3_err err = { 0 };

	/* The catalogue edits copies of a golden checkpoint: without it every
	 * case would test nothing, so its absence is a failure, not a crash. */
	if (access(t_shared_path("golden/forward/k3tiny_a/model/config.json"), R_OK) != 0) {
		printf("FAIL: golden checkpoint missing at %s\n",
		       t_shared_path("golden/forward/k3tiny_a/model"));
		return 1;
	}
	snprintf(root, sizeof(root), "/tmp/k3-model-corrupt-XXXXXX");
	if (!mkdtemp(root))
		return t_skip("mkdtemp failed");

	/* control: an untouched copy opens */
	d = fresh("ok");
	T_EQ_INT(k3_model_open(d, &m, &err), 0);
	k3_model_free(m);

	/* 1. truncated shard */
	d = fresh("truncated");
	T_EQ_INT(truncate(at(d, SH2), 846496 - 100), 0);
	expect_fail(d, -EINVAL, "truncated", SH2);

	/* 2. header length past EOF */
	d = fresh("hdrlen");
	overwrite(at(d, SH1), 0, (const unsigned char[8]){ 0x00, 0x00, 0x10, 0x00 }, 8);   /* 1 MiB > file */
	expect_fail(d, -EINVAL, "header length 1048576 runs past the end", SH1);
	d = fresh("hdrhuge");
	overwrite(at(d, SH1), 0, (const unsigned char[8]){ 0, 0, 0, 0, 0, 0, 0, 0x7f }, 8);
	expect_fail(d, -EINVAL, "exceeds the", "byte limit");

	/* 3, 4, 4b, 6b, 6c: one edit of the first shard's header each */
	for (size_t i = 0; i < sizeof(header_cases) / sizeof(header_cases[0]); i++) {
		d = fresh(header_cases[i].name);
		edit_header(at(d, SH1), header_cases[i].edit);
		expect_fail(d, -EINVAL, header_cases[i].n1, header_cases[i].n2);
	}

	/* 5. MXFP4 scale byte 255 */
	d = fresh("scale255");
	{
		long off = payload_off(at(d, SH2), "language_model.model.layers.5.block_sparse_moe.experts.3.w3.weight_scale");
		T_OK(off > 0);
		overwrite(at(d, SH2), off + 7, (const unsigned char[1]){ 0xff }, 1);
	}
	expect_fail(d, -EINVAL, "scale byte 255", "experts.3.w3.weight_scale");

	/* 6. missing tensors: all three listed in one message */
	d = fresh("missing");
	edit_header(at(d, SH1), ed_remove);
	ix_remove(d);
	expect_fail(d, -EINVAL, "3 problems", "missing tensor 'language_model.model.layers.2.self_attn.dt_bias'");
	expect_fail(d, -EINVAL, "layers.3.self_attn.kv_b_proj.weight", "experts.5.w2.weight_scale");

	/* 7. wrong config type */
	d = fresh("config-type");
	set_config(d, "model_type", json_string("llama"), false);
	expect_fail(d, -EINVAL, "model_type", "'llama'");
	d = fresh("config-bool");
	set_config(d, "mla_use_output_gate", json_string("true"), true);
	expect_fail(d, -EINVAL, "text_config.mla_use_output_gate: expected true or false", NULL);
	d = fresh("config-missing");
	set_config(d, "hidden_size", json_null(), true);
	expect_fail(d, -EINVAL, "text_config.hidden_size: required", NULL);
	d = fresh("config-dims");
	/* config says 5 KDA heads: the projections are 64 = 4 x 16 wide */
	{
		json_t *c = json_load_file(at(d, "config.json"), 0, NULL);
		json_object_set_new(json_object_get(json_object_get(c, "text_config"), "linear_attn_config"),
				    "num_heads", json_integer(5));
		json_dump_file(c, at(d, "config.json"), JSON_INDENT(2));
		json_decref(c);
	}
	expect_fail(d, -EINVAL, "self_attn.q_proj.weight' has shape [64, 96], expected [80, 96]", NULL);

	/* 8. symlinked shard pointing outside the model directory */
	d = fresh("symlink");
	{
		char outside[512];
		snprintf(outside, sizeof(outside), "%s/outside.safetensors", root);
		T_EQ_INT(rename(at(d, SH2), outside), 0);
		T_EQ_INT(symlink(outside, at(d, SH2)), 0);
	}
	expect_fail(d, -EXDEV, "outside the model directory", SH2);
	/* a symlink that stays inside is fine */
	d = fresh("symlink-inside");
	T_EQ_INT(rename(at(d, SH2), at(d, "real.bin")), 0);
	T_EQ_INT(symlink("real.bin", at(d, SH2)), 0);
	T_EQ_INT(k3_model_open(d, &m, &err), 0);
	k3_model_free(m);

	/* 9. a missing shard and a missing config */
	d = fresh("noshard");
	unlink(at(d, SH2));
	expect_fail(d, -ENOENT, SH2, NULL);
	d = fresh("noconfig");
	unlink(at(d, "config.json"));
	expect_fail(d, -ENOENT, "config.json", NULL);

	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	T_EQ_INT(system(cmd), 0);
	return t_done();
}
