/*
 * test_store_int8.c - the int8 spine overlay's files (store_int8.h) and the
 * model's view of them (model.h, "the int8 spine overlay"), on a nano demo
 * model written into a temp dir:
 *
 *  - the writer converts every convertible matrix; each I8 view's bytes are
 *    exactly k3_kern_quantize_i8_bf16 of the BF16 tensor (q and scales, at
 *    K3_PROV_I8_SCALE_OFFSET), the overlay shards are valid safetensors
 *    (contiguous payloads, 64-byte aligned data, every q 64-byte aligned);
 *  - classes: default (all but the router), all, one class; vectors, the
 *    embedding and MLA kv_b_proj never replaced;
 *  - an up-to-date overlay is kept, --force rewrites it;
 *  - refusals, each naming what to run: no overlay, no manifest, a model
 *    shard written since (mtime/ctime), an overlay shard rewritten, an
 *    overlay made for another model, a foreign file in the output
 *    directory (nothing removed), a NaN weight (nothing published);
 *  - the class list parser.
 */
#include "t.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "k3_kernels.h"
#include "k3_provider.h"
#include "demo/demo.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "store/store_int8.h"

static char root[256], model_a[300], model_b[300];

static int rm_rf(const char *path)
{
	char cmd[700];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
	return system(cmd);
}

static int write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	if (!f)
		return -1;
	fputs(text, f);
	return fclose(f);
}

static bool exists(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0;
}

static void bf16_row_check(const struct k3_tensor *src, const struct k3_tensor *v, int *bad)
{
	size_t rows = (size_t)src->shape[0], cols = (size_t)src->shape[1];
	uint16_t *w = malloc(rows * cols * 2);
	int8_t *q = malloc(rows * cols);
	float *s = malloc(rows * sizeof(float));

	memcpy(w, src->data, rows * cols * 2);
	T_EQ_INT(k3_kern_quantize_i8_bf16(rows, cols, cols, w, q, s, NULL), 0);
	if (memcmp(v->data, q, rows * cols) != 0 ||
	    memcmp((const char *)v->data + K3_PROV_I8_SCALE_OFFSET(rows, cols), s, rows * 4) != 0) {
		if ((*bad)++ < 3)
			printf("  %s: overlay bytes differ from the quantizer's\n", src->name);
	}
	free(w);
	free(q);
	free(s);
}

/* Every matrix of classes `roles` is an I8 view holding the quantizer's
 * bytes, every other one the BF16 tensor of the plain model. */
static void check_views(const char *dir, unsigned roles)
{
	struct k3_model *plain = NULL, *m = NULL;
	struct k3_err err = { 0 };

	T_EQ_INT(k3_model_open(dir, &plain, &err), 0);
	T_EQ_INT(k3_store_int8_open_model(dir, NULL, roles, &m, &err), 0);
	if (!m || !plain) {
		printf("  %s\n", err.msg);
		k3_model_free(plain);
		return;
	}
	size_t n = k3_model_int8_matrices(plain, NULL, 0), n8 = 0;
	struct k3_model_int8_matrix *a = calloc(n, sizeof(*a)), *b = calloc(n, sizeof(*b));
	T_EQ_U64(k3_model_int8_matrices(plain, a, n), n);
	T_EQ_U64(k3_model_int8_matrices(m, b, n), n);
	int bad = 0;
	for (size_t i = 0; i < n; i++) {
		T_EQ_INT(a[i].role, b[i].role);
		if (roles & a[i].role) {
			n8++;
			T_EQ_INT(b[i].tensor->dtype, K3_DTYPE_I8);
			T_EQ_U64(b[i].tensor->shape[0], a[i].tensor->shape[0]);
			T_EQ_U64(b[i].tensor->shape[1], a[i].tensor->shape[1]);
			T_EQ_U64(b[i].tensor->nbytes, K3_PROV_I8_BYTES(a[i].tensor->shape[0],
								      a[i].tensor->shape[1]));
			T_OK(b[i].tensor->shard >= k3_model_shard_count(m));
			T_OK(k3_model_shard_path(m, b[i].tensor->shard) != NULL);
			T_EQ_U64((uintptr_t)b[i].tensor->data % 64, 0);
			bf16_row_check(a[i].tensor, b[i].tensor, &bad);
		} else {
			T_OK(b[i].tensor == k3_model_tensor(m, a[i].tensor->name));
			T_EQ_INT(b[i].tensor->dtype, K3_DTYPE_BF16);
		}
	}
	T_EQ_INT(bad, 0);
	struct k3_model_int8_info in;
	k3_model_int8_info_get(m, &in);
	T_OK(in.on == (n8 > 0));
	T_EQ_U64(in.matrices, n8);
	T_EQ_INT(in.roles, roles);
	/* never converted: the embedding, kv_b_proj, every vector */
	const struct k3_model_plan *p = k3_model_plan(m);
	T_EQ_INT(p->embed_tokens->dtype, K3_DTYPE_BF16);
	for (uint32_t l = 0; l < p->n_layers; l++) {
		T_OK(p->layers[l].input_layernorm->dtype != K3_DTYPE_I8);
		if (!p->layers[l].is_kda)
			T_EQ_INT(p->layers[l].mla.kv_b_proj->dtype, K3_DTYPE_BF16);
		if (p->layers[l].is_moe) {
			T_OK(p->layers[l].moe.e_score_correction_bias->dtype != K3_DTYPE_I8);
			T_EQ_INT(p->layers[l].moe.gate->dtype,
				 roles & K3_MODEL_INT8_ROUTER ? K3_DTYPE_I8 : K3_DTYPE_BF16);
		}
	}
	free(a);
	free(b);
	k3_model_free(m);
	k3_model_free(plain);
}

/* Every overlay shard: payloads contiguous from 0 (valid safetensors), the
 * data 64-byte aligned, every .weight_i8 64-byte aligned. */
static void check_files(const char *ov)
{
	DIR *d = opendir(ov);
	struct dirent *e;
	int shards = 0;

	T_OK(d != NULL);
	while (d && (e = readdir(d))) {
		if (strncmp(e->d_name, "spine-int8-", 11) != 0)
			continue;
		char path[700];
		snprintf(path, sizeof(path), "%s/%s", ov, e->d_name);
		size_t len = 0;
		char *bytes = (char *)t_read_file(path, &len);
		uint64_t hl = 0;
		struct k3_st_header h = { 0 };
		struct k3_err err = { 0 };
		T_OK(bytes != NULL);
		if (!bytes)
			continue;
		T_EQ_INT(k3_st_parse_prefix((const uint8_t *)bytes, len, len, path, &hl, &err), 0);
		T_EQ_U64((8 + hl) % 64, 0);
		T_EQ_INT(k3_st_parse_header(bytes + 8, (size_t)hl, len - 8 - hl, path, &h, &err), 0);
		/* sorted by offset, each payload starts where the previous ended */
		uint64_t end = 0, covered = 0;
		for (size_t pass = 0; pass < h.n; pass++)
			for (size_t i = 0; i < h.n; i++)
				if (h.v[i].begin == end && h.v[i].end > end) {
					covered += h.v[i].end - h.v[i].begin;
					end = h.v[i].end;
				}
		T_EQ_U64(end, len - 8 - hl);
		T_EQ_U64(covered, len - 8 - hl);
		for (size_t i = 0; i < h.n; i++) {
			size_t l = strlen(h.v[i].name);
			if (l > 10 && strcmp(h.v[i].name + l - 10, ".weight_i8") == 0)
				T_EQ_U64(h.v[i].begin % 64, 0);
		}
		k3_st_header_release(&h);
		free(bytes);
		shards++;
	}
	if (d)
		closedir(d);
	T_OK(shards >= 2);   /* the demo writes >= 2 shards, both hold matrices */
}

static void expect_err(int rc, int want, const struct k3_err *err, const char *needle)
{
	T_EQ_INT(rc, want);
	if (!T_OK(strstr(err->msg, needle) != NULL) || !T_OK(strstr(err->msg, "convert-spine-int8")))
		printf("     message: %s\n", err->msg);
}

static int write_overlay(const char *dir, const char *out, bool force,
			 struct k3_store_int8_report *rep, struct k3_err *err)
{
	struct k3_model *m = NULL;
	int rc = k3_model_open(dir, &m, err);
	if (!rc)
		rc = k3_store_int8_write(m, out, force, rep, err);
	k3_model_free(m);
	return rc;
}

/* Sets the file's mtime one second back: a write, as far as identities go. */
static void touch_back(const char *path)
{
	struct timespec ts[2];
	clock_gettime(CLOCK_REALTIME, &ts[0]);
	ts[0].tv_sec -= 1;
	ts[1] = ts[0];
	T_EQ_INT(utimensat(AT_FDCWD, path, ts, 0), 0);
}

static void roles_parse(void)
{
	struct k3_err err = { 0 };
	unsigned r = 0;
	T_EQ_INT(k3_model_int8_roles_parse("kda,mla", &r, &err), 0);
	T_EQ_INT(r, K3_MODEL_INT8_KDA | K3_MODEL_INT8_MLA);
	T_EQ_INT(k3_model_int8_roles_parse("default", &r, &err), 0);
	T_EQ_INT(r, K3_MODEL_INT8_DEFAULT);
	T_OK(!(K3_MODEL_INT8_DEFAULT & K3_MODEL_INT8_ROUTER));
	T_EQ_INT(k3_model_int8_roles_parse("all", &r, &err), 0);
	T_EQ_INT(r, K3_MODEL_INT8_ALL);
	T_EQ_INT(k3_model_int8_roles_parse("lm_head", &r, &err), 0);
	T_EQ_INT(r, K3_MODEL_INT8_LM_HEAD);
	T_EQ_INT(k3_model_int8_roles_parse("kda,bogus", &r, &err), -EINVAL);
	T_OK(strstr(err.msg, "bogus") != NULL);
	T_EQ_INT(k3_model_int8_roles_parse("kda,", &r, &err), -EINVAL);
	T_EQ_INT(k3_model_int8_roles_parse("", &r, &err), -EINVAL);
}

int main(void)
{
	const char *tmp = getenv("TMPDIR");
	struct k3_demo_opts o = { .preset = K3_DEMO_NANO, .seed = 7 };
	struct k3_store_int8_report rep;
	struct k3_err err = { 0 };
	char ov[400], path[700];
	int rc;

	roles_parse();
	snprintf(root, sizeof(root), "%s/k3int8.XXXXXX", tmp ? tmp : "/tmp");
	if (!T_OK(mkdtemp(root) != NULL))
		return t_done();
	snprintf(model_a, sizeof(model_a), "%s/a", root);
	snprintf(model_b, sizeof(model_b), "%s/b", root);
	T_EQ_INT(k3_demo_write(model_a, &o, &err), 0);
	o.seed = 8;
	T_EQ_INT(k3_demo_write(model_b, &o, &err), 0);
	snprintf(ov, sizeof(ov), "%s/%s", model_a, K3_MODEL_INT8_SUBDIR);

	/* no overlay yet */
	struct k3_model *m = NULL;
	rc = k3_store_int8_open_model(model_a, NULL, 0, &m, &err);
	expect_err(rc, -ENOENT, &err, "no int8 spine overlay");
	T_OK(m == NULL);

	/* write, and what it wrote */
	T_EQ_INT(write_overlay(model_a, NULL, false, &rep, &err), 0);
	T_OK(rep.written);
	T_OK(!rep.replaced);
	T_OK(rep.matrices > 0);
	/* half a step, plus the fp32 rounding of w / scale (127 * 2^-24) */
	if (!T_OK(rep.max_step_error <= 0.5 + 8e-6))
		printf("     max step error %.9g\n", rep.max_step_error);
	T_OK(rep.int8_bytes < rep.bf16_bytes);
	T_OK(exists(ov));
	check_files(ov);
	check_views(model_a, K3_MODEL_INT8_DEFAULT);
	check_views(model_a, K3_MODEL_INT8_ALL);
	check_views(model_a, K3_MODEL_INT8_LM_HEAD);
	check_views(model_a, K3_MODEL_INT8_KDA | K3_MODEL_INT8_MLA);

	/* up to date: kept; --force: rewritten */
	T_EQ_INT(write_overlay(model_a, NULL, false, &rep, &err), 0);
	T_OK(!rep.written);
	T_EQ_INT(write_overlay(model_a, NULL, true, &rep, &err), 0);
	T_OK(rep.written && rep.replaced);
	check_views(model_a, K3_MODEL_INT8_DEFAULT);

	/* a model shard written since: stale (the check and the open) */
	snprintf(path, sizeof(path), "%s/model-00001-of-00002.safetensors", model_a);
	touch_back(path);
	T_OK(k3_model_open(model_a, &m, &err) == 0);
	rc = k3_store_int8_check(m, NULL, &err);
	k3_model_free(m);
	m = NULL;
	expect_err(rc, -ESTALE, &err, "model-00001-of-00002.safetensors");
	T_OK(strstr(err.msg, "mtime") != NULL);
	rc = k3_store_int8_open_model(model_a, NULL, 0, &m, &err);
	expect_err(rc, -ESTALE, &err, "stale");
	T_OK(m == NULL);
	/* the writer replaces a stale overlay and says why */
	T_EQ_INT(write_overlay(model_a, NULL, false, &rep, &err), 0);
	T_OK(rep.written && rep.replaced);
	T_OK(strstr(rep.why, "stale") != NULL);
	T_EQ_INT(k3_store_int8_open_model(model_a, NULL, 0, &m, &err), 0);
	k3_model_free(m);
	m = NULL;

	/* an overlay shard rewritten: stale, naming it */
	snprintf(path, sizeof(path), "%s/spine-int8-00001-of-00002.safetensors", ov);
	touch_back(path);
	rc = k3_store_int8_open_model(model_a, NULL, 0, &m, &err);
	expect_err(rc, -ESTALE, &err, "spine-int8-00001-of-00002.safetensors");
	T_EQ_INT(write_overlay(model_a, NULL, false, &rep, &err), 0);
	T_OK(rep.written);

	/* the manifest gone: refused as no overlay */
	snprintf(path, sizeof(path), "%s/%s", ov, K3_STORE_INT8_MANIFEST);
	T_EQ_INT(unlink(path), 0);
	rc = k3_store_int8_open_model(model_a, NULL, 0, &m, &err);
	expect_err(rc, -ENOENT, &err, K3_STORE_INT8_MANIFEST);
	T_EQ_INT(write_overlay(model_a, NULL, false, &rep, &err), 0);
	T_OK(rep.written);

	/* an overlay of model a used for model b: same names, shapes and
	 * headers, other files (and bytes) */
	rc = k3_store_int8_open_model(model_b, ov, 0, &m, &err);
	expect_err(rc, -ESTALE, &err, "model-0000");
	if (!T_OK(strstr(err.msg, "inode") != NULL))
		printf("     message: %s\n", err.msg);
	T_OK(m == NULL);

	/* attached without the manifest check to a model of another shape:
	 * every mismatch is found by the model itself */
	{
		char model_c[400];
		struct k3_demo_opts oc = { .preset = K3_DEMO_NANO, .seed = 7, .layers = 6 };
		struct k3_model_open_opts mo = { .int8_dir = ov };
		snprintf(model_c, sizeof(model_c), "%s/c", root);
		T_EQ_INT(k3_demo_write(model_c, &oc, &err), 0);
		rc = k3_model_open_with(model_c, &mo, &m, &err);
		expect_err(rc, -EINVAL, &err, "does not fit this model");
		T_OK(m == NULL);
	}

	/* a foreign file in the output directory: refused, nothing removed */
	snprintf(path, sizeof(path), "%s/notes.txt", ov);
	T_EQ_INT(write_text(path, "mine"), 0);
	rc = write_overlay(model_a, NULL, true, &rep, &err);
	T_EQ_INT(rc, -ENOTEMPTY);
	T_OK(strstr(err.msg, "notes.txt") != NULL);
	T_OK(exists(path));
	snprintf(path, sizeof(path), "%s/%s", ov, K3_STORE_INT8_MANIFEST);
	T_OK(exists(path));
	snprintf(path, sizeof(path), "%s/notes.txt", ov);
	unlink(path);

	/* a NaN weight: refused naming the tensor and row, nothing published */
	{
		struct k3_model *mb = NULL;
		char out[400];
		T_EQ_INT(k3_model_open(model_b, &mb, &err), 0);
		const struct k3_tensor *t = k3_model_plan(mb)->layers[1].kda.q_proj;
		uint64_t off = t->file_offset + 2 * (3 * t->shape[1] + 5);
		const char *shard = k3_model_shard_path(mb, t->shard);
		char tname[300];
		snprintf(tname, sizeof(tname), "%s", t->name);
		snprintf(path, sizeof(path), "%s", shard);
		k3_model_free(mb);
		int fd = open(path, O_WRONLY);
		uint8_t nan[2] = { 0xC0, 0x7F };   /* bf16 0x7FC0, little endian */
		T_OK(fd >= 0 && pwrite(fd, nan, 2, (off_t)off) == 2);
		close(fd);
		snprintf(out, sizeof(out), "%s/b-int8", root);
		T_EQ_INT(write_overlay(model_b, out, false, &rep, &err), -EINVAL);
		T_OK(strstr(err.msg, tname) != NULL);
		T_OK(strstr(err.msg, "row 3") != NULL);
		T_OK(!exists(out));
		/* and no temporary directory left behind */
		DIR *d = opendir(root);
		struct dirent *e;
		int left = 0;
		while (d && (e = readdir(d)))
			left += strstr(e->d_name, ".tmp.") != NULL;
		if (d)
			closedir(d);
		T_EQ_INT(left, 0);
	}
	rm_rf(root);
	return t_done();
}
