/* setup_state.c - the install's state file and lock (see setup_state.h). */
#include "setup/setup_state.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include <jansson.h>

#include "setup/setup_publish.h"
#include "setup/setup_verify.h"

#define STATE_FORMAT "k3-setup-state"
#define STATE_NAME "state.json"
#define STATE_MAX ((size_t)8 << 20)

static const char *const have_names[] = { "none", "sparse", "verified" };

void k3_setup_state_free(struct k3_setup_state *st)
{
	if (!st)
		return;
	free(st->base_url);
	free(st->cacert);
	free(st->rec);
	free(st);
}

int k3_setup_state_set_str(char **field, const char *s)
{
	char *c = s ? strdup(s) : NULL;

	if (s && !c)
		return -ENOMEM;
	free(*field);
	*field = c;
	return 0;
}

static int cmp_rec(const void *a, const void *b)
{
	return strcmp(((const struct k3_setup_record *)a)->path,
		      ((const struct k3_setup_record *)b)->path);
}

struct k3_setup_record *k3_setup_state_find(const struct k3_setup_state *st, const char *path)
{
	struct k3_setup_record key;

	snprintf(key.path, sizeof(key.path), "%s", path);
	return st->n ? bsearch(&key, st->rec, st->n, sizeof(key), cmp_rec) : NULL;
}

struct k3_setup_record *k3_setup_state_set(struct k3_setup_state *st, const char *path,
					   uint64_t size, const uint8_t sha[32],
					   enum k3_setup_have have, const struct stat *sb)
{
	struct k3_setup_record *r = k3_setup_state_find(st, path);

	if (!r) {
		struct k3_setup_record *v;
		if (strlen(path) > K3_SETUP_NAME_MAX || st->n >= K3_SETUP_MAX_FILES)
			return NULL;
		v = realloc(st->rec, (st->n + 1) * sizeof(*v));
		if (!v)
			return NULL;
		st->rec = v;
		r = &st->rec[st->n++];
		memset(r, 0, sizeof(*r));
		snprintf(r->path, sizeof(r->path), "%s", path);
		qsort(st->rec, st->n, sizeof(*r), cmp_rec);
		r = k3_setup_state_find(st, path);
	}
	r->size = size;
	memcpy(r->sha256, sha, 32);
	r->have = have;
	r->dev = sb ? (uint64_t)sb->st_dev : 0;
	r->ino = sb ? (uint64_t)sb->st_ino : 0;
	r->mtime_ns = sb ? (int64_t)sb->st_mtim.tv_sec * 1000000000 + sb->st_mtim.tv_nsec : 0;
	return r;
}

bool k3_setup_record_same_file(const struct k3_setup_record *r, const struct stat *sb)
{
	/* a sparse shard changes as its experts arrive: its mtime moves */
	return r->ino != 0 && r->dev == (uint64_t)sb->st_dev && r->ino == (uint64_t)sb->st_ino &&
	       r->size == (uint64_t)sb->st_size &&
	       (r->have == K3_SETUP_HAVE_SPARSE ||
		r->mtime_ns == (int64_t)sb->st_mtim.tv_sec * 1000000000 + sb->st_mtim.tv_nsec);
}

static int parse_state(const char *text, size_t len, struct k3_setup_state *st, struct k3_err *err)
{
	json_error_t je;
	json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je), *files, *v;
	int rc = 0;

#define BADST(...) do { rc = k3_err_set(err, -EINVAL, __VA_ARGS__); goto out; } while (0)
	if (!root)
		return k3_err_set(err, -EINVAL, "line %d: %s", je.line, je.text);
	v = json_object_get(root, "format");
	if (!json_is_string(v) || strcmp(json_string_value(v), STATE_FORMAT) != 0 ||
	    !json_is_integer(json_object_get(root, "version")) ||
	    json_integer_value(json_object_get(root, "version")) != 1)
		BADST("not a version 1 " STATE_FORMAT " file");
	v = json_object_get(root, "repository");
	if (json_is_string(v))
		snprintf(st->repository, sizeof(st->repository), "%s", json_string_value(v));
	v = json_object_get(root, "revision");
	if (json_is_string(v))
		snprintf(st->revision, sizeof(st->revision), "%s", json_string_value(v));
	st->stream = json_is_true(json_object_get(root, "stream"));
	v = json_object_get(root, "base_url");
	if (json_is_string(v) && k3_setup_state_set_str(&st->base_url, json_string_value(v)))
		BADST("out of memory");
	v = json_object_get(root, "cacert");
	if (json_is_string(v) && k3_setup_state_set_str(&st->cacert, json_string_value(v)))
		BADST("out of memory");
	files = json_object_get(root, "files");
	if (!json_is_array(files) || json_array_size(files) > K3_SETUP_MAX_FILES)
		BADST("'files' must be a list of at most %d records", K3_SETUP_MAX_FILES);
	for (size_t i = 0; i < json_array_size(files); i++) {
		json_t *f = json_array_get(files, i), *path = json_object_get(f, "path");
		json_t *have = json_object_get(f, "have"), *sha = json_object_get(f, "sha256");
		uint8_t d[32];
		struct stat sb;
		int h = -1;
		if (!json_is_string(path) || !k3_setup_name_ok(json_string_value(path)) ||
		    !json_is_string(sha) || k3_setup_sha256_parse(json_string_value(sha), d) ||
		    !json_is_string(have) || !json_is_integer(json_object_get(f, "size")))
			BADST("files[%zu] is malformed", i);
		for (int k = 0; k < 3; k++)
			if (strcmp(json_string_value(have), have_names[k]) == 0)
				h = k;
		if (h < 0)
			BADST("files[%zu].have is not none, sparse or verified", i);
		memset(&sb, 0, sizeof(sb));
		sb.st_dev = (dev_t)json_integer_value(json_object_get(f, "dev"));
		sb.st_ino = (ino_t)json_integer_value(json_object_get(f, "ino"));
		sb.st_size = (off_t)json_integer_value(json_object_get(f, "size"));
		if (!k3_setup_state_set(st, json_string_value(path), (uint64_t)sb.st_size, d,
					(enum k3_setup_have)h, &sb))
			BADST("out of memory");
		k3_setup_state_find(st, json_string_value(path))->mtime_ns =
			(int64_t)json_integer_value(json_object_get(f, "mtime_ns"));
	}
out:
	json_decref(root);
	return rc;
#undef BADST
}

int k3_setup_state_load(int dirfd, struct k3_setup_state **out, struct k3_err *err)
{
	struct k3_setup_state *st = calloc(1, sizeof(*st));
	char *text = NULL;
	size_t len;
	int sd, rc;

	*out = NULL;
	if (!st)
		return k3_err_set(err, -ENOMEM, "out of memory");
	sd = openat(dirfd, K3_SETUP_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (sd < 0) {
		if (errno == ENOENT) {
			*out = st;
			return 0;
		}
		rc = k3_err_set(err, -errno, "cannot open '" K3_SETUP_DIR "': %s", strerror(errno));
		k3_setup_state_free(st);
		return rc;
	}
	rc = k3_setup_read_file(sd, STATE_NAME, STATE_MAX, &text, &len, K3_SETUP_DIR "/" STATE_NAME, err);
	close(sd);
	if (rc == -ENOENT) {
		*out = st;
		return 0;
	}
	if (rc == 0 && (rc = parse_state(text, len, st, err)) != 0)
		k3_err_prefix(err, K3_SETUP_DIR "/" STATE_NAME);
	free(text);
	if (rc) {
		k3_setup_state_free(st);
		return rc;
	}
	*out = st;
	return 0;
}

int k3_setup_state_save(int dirfd, const struct k3_setup_state *st, struct k3_err *err)
{
	json_t *root = json_object(), *files = json_array();
	char *text = NULL;
	int sd = -1, rc;

	if (!root || !files) {
		json_decref(root);
		json_decref(files);
		return k3_err_set(err, -ENOMEM, "out of memory");
	}
	json_object_set_new(root, "format", json_string(STATE_FORMAT));
	json_object_set_new(root, "version", json_integer(1));
	json_object_set_new(root, "repository", json_string(st->repository));
	json_object_set_new(root, "revision", json_string(st->revision));
	json_object_set_new(root, "stream", json_boolean(st->stream));
	json_object_set_new(root, "base_url", st->base_url ? json_string(st->base_url) : json_null());
	json_object_set_new(root, "cacert", st->cacert ? json_string(st->cacert) : json_null());
	for (size_t i = 0; i < st->n; i++) {
		const struct k3_setup_record *r = &st->rec[i];
		char hex[K3_SETUP_SHA256_HEX];
		json_t *o = json_object();
		k3_setup_sha256_hex(r->sha256, hex);
		json_object_set_new(o, "path", json_string(r->path));
		json_object_set_new(o, "size", json_integer((json_int_t)r->size));
		json_object_set_new(o, "sha256", json_string(hex));
		json_object_set_new(o, "have", json_string(have_names[r->have]));
		json_object_set_new(o, "dev", json_integer((json_int_t)r->dev));
		json_object_set_new(o, "ino", json_integer((json_int_t)r->ino));
		json_object_set_new(o, "mtime_ns", json_integer((json_int_t)r->mtime_ns));
		json_array_append_new(files, o);
	}
	json_object_set_new(root, "files", files);
	text = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
	json_decref(root);
	if (!text)
		return k3_err_set(err, -ENOMEM, "out of memory");
	rc = k3_setup_subdir_open(dirfd, K3_SETUP_DIR, true, 0755, &sd, err);
	if (rc == 0)
		rc = k3_setup_write_atomic(sd, STATE_NAME, text, strlen(text),
					   K3_SETUP_DIR "/" STATE_NAME, err);
	if (sd >= 0)
		close(sd);
	free(text);
	return rc;
}

int k3_setup_lock(int dirfd, bool wait, int *fd, struct k3_err *err)
{
	int sd, lfd, rc;

	*fd = -1;
	rc = k3_setup_subdir_open(dirfd, K3_SETUP_DIR, true, 0755, &sd, err);
	if (rc)
		return rc;
	lfd = k3_setup_open_file(sd, "lock", O_RDWR | O_CREAT, 0644, K3_SETUP_DIR "/lock", err);
	close(sd);
	if (lfd < 0)
		return lfd;
	while (flock(lfd, LOCK_EX | (wait ? 0 : LOCK_NB)) != 0) {
		if (errno == EINTR)
			continue;
		rc = errno == EWOULDBLOCK ? k3_err_set(err, -EBUSY, "another k3ctl setup (or k3d's"
						       " expert fetcher) holds this install's lock")
					  : k3_err_set(err, -errno, "cannot lock: %s", strerror(errno));
		close(lfd);
		return rc;
	}
	*fd = lfd;
	return 0;
}

int k3_setup_verified_sha256(const char *model_dir, const char *name, uint8_t out[32])
{
	struct k3_setup_state *st = NULL;
	struct k3_setup_record *r;
	struct stat sb;
	int dfd = open(model_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc = -ENOENT;

	if (dfd < 0)
		return -errno;
	if (k3_setup_state_load(dfd, &st, NULL) == 0 && (r = k3_setup_state_find(st, name)) &&
	    r->have == K3_SETUP_HAVE_VERIFIED &&
	    fstatat(dfd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && k3_setup_record_same_file(r, &sb)) {
		memcpy(out, r->sha256, 32);
		rc = 0;
	}
	k3_setup_state_free(st);
	close(dfd);
	return rc;
}
