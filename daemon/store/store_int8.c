/*
 * store_int8.c - the int8 spine overlay's manifest and the check that an
 * overlay may be used (see store_int8.h). The writer is store_int8_write.c.
 *
 * The manifest binds the overlay to the model's shards the way packs bind
 * to theirs (store_pack.h identities: name, size, header SHA-256, device,
 * inode, mtime, ctime) and records the identity of every file the
 * overlay itself consists of, so a replaced or rewritten overlay shard is
 * caught as well. 64-bit fields are JSON integers (two's complement for
 * values above 2^63), hashes lower-case hex.
 */
#include "store/store_int8.h"
#include "store/store_int8_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "store/store_model.h"
#include "store/store_pack.h"

int k3_store_int8_dir(char *buf, size_t size, const char *model_dir, const char *dir)
{
	int n = dir ? snprintf(buf, size, "%s", dir)
		    : snprintf(buf, size, "%s/%s", model_dir, K3_MODEL_INT8_SUBDIR);
	return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

/* ---- identities as JSON ---- */

static void hex32(const uint8_t d[32], char out[65])
{
	for (int i = 0; i < 32; i++)
		snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static int unhex32(const char *s, uint8_t d[32])
{
	if (!s || strlen(s) != 64)
		return -1;
	for (int i = 0; i < 32; i++) {
		unsigned v;
		if (sscanf(s + 2 * i, "%2x", &v) != 1)
			return -1;
		d[i] = (uint8_t)v;
	}
	return 0;
}

json_t *k3_store_int8_ident_json(const struct k3_store_pack_ident *id)
{
	char h[65];

	hex32(id->header_sha256, h);
	return json_pack("{s:s, s:I, s:I, s:s, s:I, s:I, s:I, s:I}", "name", id->name,
			 "size", (json_int_t)id->size, "header_bytes", (json_int_t)id->header_bytes,
			 "header_sha256", h, "device", (json_int_t)id->dev,
			 "inode", (json_int_t)id->ino, "mtime_ns", (json_int_t)id->mtime_ns,
			 "ctime_ns", (json_int_t)id->ctime_ns);
}

static int ident_from_json(const json_t *j, struct k3_store_pack_ident *id)
{
	const char *name = NULL, *h = NULL;
	json_int_t size, hb, dev, ino, mt, ct;

	memset(id, 0, sizeof(*id));
	if (json_unpack((json_t *)j, "{s:s, s:I, s:I, s:s, s:I, s:I, s:I, s:I}", "name", &name,
			"size", &size, "header_bytes", &hb, "header_sha256", &h, "device", &dev,
			"inode", &ino, "mtime_ns", &mt, "ctime_ns", &ct) != 0 ||
	    strlen(name) > K3_STORE_PACK_NAME_MAX || strchr(name, '/') || !name[0] ||
	    unhex32(h, id->header_sha256) != 0)
		return -1;
	strcpy(id->name, name);
	id->size = (uint64_t)size;
	id->header_bytes = (uint64_t)hb;
	id->dev = (uint64_t)dev;
	id->ino = (uint64_t)ino;
	id->mtime_ns = (int64_t)mt;
	id->ctime_ns = (int64_t)ct;
	return 0;
}

/* ---- the check ---- */

#define RERUN "rerun `k3ctl convert-spine-int8 --model %s`"

static int read_manifest(const char *dir, const char *model_dir, json_t **out, struct k3_err *err)
{
	char p[PATH_MAX];
	json_error_t je;

	*out = NULL;
	if (snprintf(p, sizeof(p), "%s/%s", dir, K3_STORE_INT8_MANIFEST) >= (int)sizeof(p))
		return k3_err_set(err, -ENAMETOOLONG, "overlay path too long");
	FILE *f = fopen(p, "r");
	if (!f) {
		if (errno == ENOENT)
			return k3_err_set(err, -ENOENT, "no int8 spine overlay at '%s' (no %s): run"
					  " `k3ctl convert-spine-int8 --model %s` first", dir,
					  K3_STORE_INT8_MANIFEST, model_dir);
		return k3_err_set(err, -errno, "cannot open '%s': %s", p, strerror(errno));
	}
	/* bounded before parsing: fstat size */
	if (fseek(f, 0, SEEK_END) != 0 || ftell(f) > K3_STORE_INT8_MANIFEST_MAX) {
		fclose(f);
		return k3_err_set(err, -EBADMSG, "'%s' is larger than %d bytes: not an overlay"
				  " manifest; " RERUN, p, K3_STORE_INT8_MANIFEST_MAX, model_dir);
	}
	rewind(f);
	json_t *j = json_loadf(f, JSON_REJECT_DUPLICATES, &je);
	fclose(f);
	if (!j)
		return k3_err_set(err, -EBADMSG, "'%s' line %d: %s; " RERUN, p, je.line, je.text,
				  model_dir);
	const char *fmt = NULL;
	json_int_t ver = 0;
	if (json_unpack(j, "{s:s, s:I}", "format", &fmt, "version", &ver) != 0 ||
	    strcmp(fmt, K3_STORE_INT8_FORMAT) != 0 || ver != K3_STORE_INT8_VERSION) {
		json_decref(j);
		return k3_err_set(err, -EBADMSG, "'%s' is not a version %d %s manifest; " RERUN, p,
				  K3_STORE_INT8_VERSION, K3_STORE_INT8_FORMAT, model_dir);
	}
	*out = j;
	return 0;
}

/* Every entry of the array `key` of the manifest against its file now:
 * model shards (against now[0..n_now)) or the overlay's own files (in
 * dir). */
static int check_idents(const json_t *man, const char *key, const char *dir,
			const struct k3_store_pack_ident *now, size_t n_now,
			const char *model_dir, struct k3_err *err)
{
	const json_t *arr = json_object_get(man, key);
	size_t i;
	const json_t *v;

	if (!json_is_array(arr) || (now && json_array_size(arr) != n_now))
		return k3_err_set(err, now ? -ESTALE : -EBADMSG, "the int8 spine overlay in '%s' was"
				  " made from %zu model shards, the model has %zu now; " RERUN, dir,
				  json_is_array(arr) ? json_array_size(arr) : 0, n_now, model_dir);
	json_array_foreach(arr, i, v) {
		struct k3_store_pack_ident was, here;
		char what[128], path[PATH_MAX];
		int rc;

		if (ident_from_json(v, &was) != 0)
			return k3_err_set(err, -EBADMSG, "the manifest in '%s': entry %zu of '%s' is"
					  " malformed; " RERUN, dir, i, key, model_dir);
		if (!now) {
			if (snprintf(path, sizeof(path), "%s/%s", dir, was.name) >= (int)sizeof(path))
				return k3_err_set(err, -ENAMETOOLONG, "overlay path too long");
			rc = k3_store_pack_ident(path, was.name, was.header_bytes, &here, err);
			if (rc == -ENOENT)
				return k3_err_set(err, -ESTALE, "the int8 spine overlay file '%s' is"
						  " missing; " RERUN, path, model_dir);
			if (rc)
				return rc;
		} else {
			here = now[i];
		}
		if (k3_store_pack_ident_match(&was, &here, what, sizeof(what)) != K3_STORE_PACK_SAME)
			return k3_err_set(err, -ESTALE, "the int8 spine overlay in '%s' is stale: %s"
					  " '%s' differs from when it was converted (%s); " RERUN,
					  dir, now ? "model shard" : "its file", was.name, what,
					  model_dir);
	}
	return 0;
}

int k3_store_int8_check(const struct k3_model *m, const char *dir, struct k3_err *err)
{
	char d[PATH_MAX];
	const char *model_dir = k3_model_dir(m);
	struct k3_store_pack_ident *now = NULL;
	size_t n_now = 0;
	json_t *man = NULL;
	int rc = k3_store_int8_dir(d, sizeof(d), model_dir, dir);

	if (rc)
		return k3_err_set(err, rc, "overlay path too long");
	rc = read_manifest(d, model_dir, &man, err);
	if (!rc)
		rc = k3_store_model_idents(m, &now, &n_now, err);
	if (!rc)
		rc = check_idents(man, "model_shards", d, now, n_now, model_dir, err);
	if (!rc)
		rc = check_idents(man, "files", d, NULL, 0, model_dir, err);
	free(now);
	json_decref(man);
	return rc;
}

int k3_store_int8_open_model(const char *model_dir, const char *dir, unsigned roles,
			     struct k3_model **out, struct k3_err *err)
{
	char d[PATH_MAX];
	struct k3_model_open_opts o = { .int8_dir = d, .int8_roles = roles };
	struct k3_model *m = NULL;
	int rc = k3_store_int8_dir(d, sizeof(d), model_dir, dir);

	*out = NULL;
	if (rc)
		return k3_err_set(err, rc, "overlay path too long");
	rc = k3_model_open_with(model_dir, &o, &m, err);
	if (rc == 0) {
		rc = k3_store_int8_check(m, dir, err);
		if (rc) {
			k3_model_free(m);
			return rc;
		}
		*out = m;
		return 0;
	}
	/* The overlay did not fit: if it is stale, say that (and what to run)
	 * rather than which tensor of it mismatched. */
	struct k3_err e2 = { 0 };
	if (k3_model_open(model_dir, &m, &e2) == 0 &&
	    k3_store_int8_check(m, dir, &e2) == -ESTALE)
		rc = k3_err_set(err, -ESTALE, "%s", e2.msg);
	k3_model_free(m);
	return rc;
}
