/* store_trace.c - router trace writer, parser and ranking (see store_trace.h). */
#include "store/store_trace.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

enum { TRACE_BUF = 1 << 20 };

struct k3_store_trace {
	int fd;
	enum k3_store_trace_mode mode;
	uint64_t cap, size;     /* size: file bytes plus buffered bytes */
	bool capped;
	char *buf;
	size_t used;
};

/* Every record line starts with this (k3_store_trace_format). */
static const char REC_START[] = "{\"request\":";

/* True when p[0..n) (n >= 1) is REC_START, starts with it, or is a prefix
 * of it (a record torn after its first bytes). */
static bool starts_record(const char *p, size_t n)
{
	size_t k = sizeof(REC_START) - 1;

	return memcmp(p, REC_START, n < k ? n : k) == 0;
}

/* A writer stopped mid-record (full disk, crash, kill) leaves a last line
 * without its newline; appending after it would bury a malformed line in
 * the middle, and readers refuse the whole file for it. So the torn tail
 * (at most one line) is cut off before appending. Nothing is cut from, or
 * appended to, a file that is not a trace (a mistyped path must not lose
 * the last line of someone's notes): a non-empty file must start with a
 * record, its torn tail too, and have a newline in its last
 * K3_STORE_TRACE_LINE_MAX bytes; otherwise refused. Updates st->st_size. */
static int drop_torn_tail(int fd, const char *path, struct stat *st, struct k3_err *err)
{
	char buf[K3_STORE_TRACE_LINE_MAX];
	off_t size = st->st_size, from;
	ssize_t got;

	if (size == 0)
		return 0;
	got = pread(fd, buf, size < (off_t)sizeof(REC_START) ? (size_t)size :
		    sizeof(REC_START) - 1, 0);
	if (got <= 0)
		return k3_err_set(err, got < 0 ? -errno : -EIO, "cannot read the start of router"
				  " trace '%s'", path);
	if (!starts_record(buf, (size_t)got))
		return k3_err_set(err, -EINVAL, "'%s' is not a router trace (it does not start"
				  " with %s); refusing to append to it", path, REC_START);
	from = size > (off_t)sizeof(buf) ? size - (off_t)sizeof(buf) : 0;
	got = pread(fd, buf, (size_t)(size - from), from);
	if (got != size - from)
		return k3_err_set(err, got < 0 ? -errno : -EIO, "cannot read the end of router"
				  " trace '%s'", path);
	if (buf[got - 1] == '\n')
		return 0;
	for (ssize_t i = got - 1; i >= 0; i--)
		if (buf[i] == '\n') {
			if (!starts_record(buf + i + 1, (size_t)(got - i - 1)))
				return k3_err_set(err, -EINVAL, "'%s' is not a router trace (its last"
						  " line is not a record); refusing to append to it",
						  path);
			if (ftruncate(fd, from + i + 1) != 0)
				return k3_err_set(err, -errno, "cannot cut the torn last line of router"
						  " trace '%s': %s", path, strerror(errno));
			st->st_size = from + i + 1;
			return 0;
		}
	if (from > 0)
		return k3_err_set(err, -EINVAL, "'%s' is not a router trace (no newline in its"
				  " last %zu bytes); refusing to append to it", path, sizeof(buf));
	if (ftruncate(fd, 0) != 0)
		return k3_err_set(err, -errno, "cannot cut the torn last line of router trace"
				  " '%s': %s", path, strerror(errno));
	st->st_size = 0;
	return 0;
}

/* Opens the directory holding path's last component by walking every
 * directory component with O_NOFOLLOW from "/" (or the working directory
 * for a relative path): a symlink anywhere in the path is refused, so a
 * planted link in a parent directory cannot redirect the daemon's writes
 * (O_NOFOLLOW on the final open alone covers only the last component).
 * On success *dirfd is an O_PATH descriptor the caller closes and *leaf
 * points into path at the last component. */
static int open_parent_nofollow(const char *path, int *dirfd, const char **leaf,
				struct k3_err *err)
{
	const char *last = strrchr(path, '/'), *p = path;
	char comp[NAME_MAX + 1];
	int dfd, rc;

	*leaf = last ? last + 1 : path;
	if (**leaf == '\0')
		return k3_err_set(err, -EISDIR, "router trace '%s' names a directory, not a file", path);
	dfd = open(path[0] == '/' ? "/" : ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return k3_err_set(err, -errno, "router trace '%s': cannot open '%s': %s", path,
				  path[0] == '/' ? "/" : ".", strerror(errno));
	while (last && p < last) {
		const char *slash = strchr(p, '/');   /* non-NULL: p < last */
		size_t len = (size_t)(slash - p);
		struct stat st;
		int nfd, e;

		if (len == 0) {                       /* leading or doubled '/' */
			p = slash + 1;
			continue;
		}
		if (len > NAME_MAX) {
			close(dfd);
			return k3_err_set(err, -ENAMETOOLONG, "router trace '%s': a directory name is longer "
					  "than %d bytes", path, NAME_MAX);
		}
		memcpy(comp, p, len);
		comp[len] = '\0';
		nfd = openat(dfd, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (nfd < 0) {
			e = errno;
			if ((e == ELOOP || e == ENOTDIR) &&
			    fstatat(dfd, comp, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
				rc = k3_err_set(err, -ELOOP, "router trace '%s': '%.*s' is a symlink; refusing "
						"to follow it (give the path without symlinks, e.g. from "
						"realpath)", path, (int)(slash - path), path);
			else
				rc = k3_err_set(err, -e, "cannot open router trace '%s': %s", path,
						strerror(e));
			close(dfd);
			return rc;
		}
		close(dfd);
		dfd = nfd;
		p = slash + 1;
	}
	*dirfd = dfd;
	return 0;
}

int k3_store_trace_open(const char *path, uint64_t cap_bytes, enum k3_store_trace_mode mode,
			struct k3_store_trace **out, struct k3_err *err)
{
	struct k3_store_trace *t;
	struct stat st;
	const char *leaf = NULL;
	int fd, dfd = -1, rc, e;

	*out = NULL;
	if ((rc = open_parent_nofollow(path, &dfd, &leaf, err)) < 0)
		return rc;
	/* Checked before opening: opening a FIFO or device can block or have
	 * side effects. fstat below closes the race with a swap after this. */
	if (fstatat(dfd, leaf, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode)) {
		close(dfd);
		if (S_ISLNK(st.st_mode))
			return k3_err_set(err, -ELOOP, "router trace '%s' is a symlink; refusing"
					  " to follow it", path);
		return k3_err_set(err, -EINVAL, "router trace '%s' is not a regular file", path);
	}
	/* O_NOFOLLOW: a symlink planted at the path (even a dangling one)
	 * fails with ELOOP instead of redirecting the daemon's writes. */
	fd = openat(dfd, leaf, O_RDWR | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0640);
	e = fd < 0 ? errno : 0;
	close(dfd);
	if (e == ELOOP)
		return k3_err_set(err, -ELOOP, "router trace '%s' is a symlink; refusing"
				  " to follow it", path);
	if (fd < 0)
		return k3_err_set(err, -e, "cannot open router trace '%s': %s", path, strerror(e));
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return k3_err_set(err, -EINVAL, "router trace '%s' is not a regular file", path);
	}
	/* O_NONBLOCK was only for opening a FIFO safely. */
	(void)fcntl(fd, F_SETFL, O_APPEND);
	if ((rc = drop_torn_tail(fd, path, &st, err)) < 0) {
		close(fd);
		return rc;
	}
	t = calloc(1, sizeof(*t));
	if (!t || (mode == K3_STORE_TRACE_BUFFERED && !(t->buf = malloc(TRACE_BUF)))) {
		free(t);
		close(fd);
		return k3_err_set(err, -ENOMEM, "out of memory");
	}
	t->fd = fd;
	t->mode = mode;
	t->cap = cap_bytes ? cap_bytes : K3_STORE_TRACE_CAP_DEFAULT;
	t->size = (uint64_t)st.st_size;
	t->capped = t->size >= t->cap;
	*out = t;
	return 0;
}

static int write_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

static int flush(struct k3_store_trace *t)
{
	int rc = 0;

	if (t->used) {
		rc = write_all(t->fd, t->buf, t->used);
		t->used = 0;
	}
	return rc;
}

int k3_store_trace_format(const struct k3_store_trace_rec *rec, char *buf, size_t size)
{
	size_t n = 0;
	int w;

	if (rec->k == 0 || rec->k > K3_STORE_TRACE_MAX_K)
		return -EINVAL;
#define APPEND(...) do { \
		w = snprintf(buf + n, size - n, __VA_ARGS__); \
		if (w < 0 || (size_t)w >= size - n) \
			return -ENOSPC; \
		n += (size_t)w; \
	} while (0)
	APPEND("{\"request\":%" PRIu64 ",\"position\":%" PRIu64 ",\"layer\":%" PRIu32 ",\"ids\":[",
	       rec->request, rec->position, rec->layer);
	for (uint32_t i = 0; i < rec->k; i++)
		APPEND("%s%" PRIu32, i ? "," : "", rec->ids[i]);
	APPEND("],\"weights\":[");
	for (uint32_t i = 0; i < rec->k; i++) {
		uint32_t bits;
		memcpy(&bits, &rec->weights[i], 4);
		APPEND("%s\"%08" PRIx32 "\"", i ? "," : "", bits);
	}
	APPEND("]}\n");
#undef APPEND
	return (int)n;
}

int k3_store_trace_write(struct k3_store_trace *t, const struct k3_store_trace_rec *rec,
			 struct k3_err *err)
{
	char line[K3_STORE_TRACE_LINE_MAX];
	int n = k3_store_trace_format(rec, line, sizeof(line));
	int rc;

	if (n < 0)
		return k3_err_set(err, -EINVAL, "router trace record with %" PRIu32 " ids", rec->k);
	if (t->capped || t->size + (uint64_t)n > t->cap) {
		t->capped = true;
		return k3_err_set(err, -EFBIG, "router trace reached its cap of %" PRIu64 " bytes;"
				  " later records are dropped", t->cap);
	}
	if (t->mode == K3_STORE_TRACE_SYNC) {
		rc = write_all(t->fd, line, (size_t)n);
	} else {
		rc = 0;
		if (t->used + (size_t)n > TRACE_BUF)
			rc = flush(t);
		if (rc == 0) {
			memcpy(t->buf + t->used, line, (size_t)n);
			t->used += (size_t)n;
		}
	}
	if (rc)
		return k3_err_set(err, rc, "cannot write the router trace: %s", strerror(-rc));
	t->size += (uint64_t)n;
	return 0;
}

int k3_store_trace_write_routes(struct k3_store_trace *t, uint64_t request, uint64_t pos0,
				uint32_t T, const uint32_t *moe_layers, uint32_t n_moe,
				uint32_t k, const uint32_t *ids, const float *weights,
				struct k3_err *err)
{
	struct k3_store_trace_rec rec = { .request = request, .k = k };

	if (k == 0 || k > K3_STORE_TRACE_MAX_K)
		return k3_err_set(err, -EINVAL, "router trace record with %" PRIu32 " ids", k);
	for (uint32_t p = 0; p < T; p++)
		for (uint32_t m = 0; m < n_moe; m++) {
			size_t at = ((size_t)p * n_moe + m) * k;
			int rc;
			rec.position = pos0 + p;
			rec.layer = moe_layers[m];
			memcpy(rec.ids, ids + at, k * sizeof(*ids));
			memcpy(rec.weights, weights + at, k * sizeof(*weights));
			rc = k3_store_trace_write(t, &rec, err);
			if (rc)
				return rc;
		}
	return 0;
}

bool k3_store_trace_capped(const struct k3_store_trace *t)
{
	return t->capped;
}

uint64_t k3_store_trace_bytes(const struct k3_store_trace *t)
{
	return t->size;
}

int k3_store_trace_flush(struct k3_store_trace *t, struct k3_err *err)
{
	int rc = flush(t);

	if (rc)
		return k3_err_set(err, rc, "cannot write the router trace: %s", strerror(-rc));
	return 0;
}

int k3_store_trace_close(struct k3_store_trace *t, struct k3_err *err)
{
	int rc;

	if (!t)
		return 0;
	rc = flush(t);
	if (close(t->fd) != 0 && rc == 0)
		rc = -errno;
	free(t->buf);
	free(t);
	if (rc)
		return k3_err_set(err, rc, "cannot write the router trace: %s", strerror(-rc));
	return 0;
}

/* ---- reading ---- */

static int get_uint(json_t *o, const char *key, uint64_t max, uint64_t *out, struct k3_err *err)
{
	json_t *v = json_object_get(o, key);

	*out = 0;   /* written on every path, so no caller reads an unset value */
	if (!json_is_integer(v) || json_integer_value(v) < 0 ||
	    (uint64_t)json_integer_value(v) > max)
		return k3_err_set(err, -EINVAL, "'%s' must be an integer in 0..%" PRIu64, key, max);
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

static int hexbits(const char *s, uint32_t *out)
{
	uint32_t v = 0;

	if (strlen(s) != 8)
		return -EINVAL;
	for (int i = 0; i < 8; i++) {
		char c = s[i];
		int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
		if (d < 0)
			return -EINVAL;
		v = v << 4 | (uint32_t)d;
	}
	*out = v;
	return 0;
}

int k3_store_trace_parse(const char *line, size_t len, struct k3_store_trace_rec *rec,
			 struct k3_err *err)
{
	json_error_t jerr;
	json_t *o, *ids, *w;
	uint64_t v;
	int rc = -EINVAL;

	memset(rec, 0, sizeof(*rec));
	if (len > K3_STORE_TRACE_LINE_MAX)
		return k3_err_set(err, -EINVAL, "line of %zu bytes is longer than %d", len,
				  K3_STORE_TRACE_LINE_MAX);
	o = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!o)
		return k3_err_set(err, -EINVAL, "not JSON: %s", jerr.text);
	if (!json_is_object(o) || json_object_size(o) != 5) {
		k3_err_set(err, -EINVAL, "a record is an object of exactly request, position,"
			   " layer, ids, weights");
		goto out;
	}
	if (get_uint(o, "request", UINT64_MAX >> 1, &rec->request, err) ||
	    get_uint(o, "position", UINT64_MAX >> 1, &rec->position, err) ||
	    get_uint(o, "layer", 1023, &v, err))
		goto out;
	rec->layer = (uint32_t)v;
	ids = json_object_get(o, "ids");
	w = json_object_get(o, "weights");
	if (!json_is_array(ids) || !json_is_array(w) || json_array_size(ids) == 0 ||
	    json_array_size(ids) > K3_STORE_TRACE_MAX_K || json_array_size(ids) != json_array_size(w)) {
		k3_err_set(err, -EINVAL, "'ids' and 'weights' must be arrays of the same length,"
			   " 1..%d", K3_STORE_TRACE_MAX_K);
		goto out;
	}
	rec->k = (uint32_t)json_array_size(ids);
	for (uint32_t i = 0; i < rec->k; i++) {
		json_t *id = json_array_get(ids, i), *wi = json_array_get(w, i);
		uint32_t bits;
		if (!json_is_integer(id) || json_integer_value(id) < 0 ||
		    json_integer_value(id) > 65535) {
			k3_err_set(err, -EINVAL, "ids[%" PRIu32 "] must be an integer in 0..65535", i);
			goto out;
		}
		rec->ids[i] = (uint32_t)json_integer_value(id);
		if (!json_is_string(wi) || hexbits(json_string_value(wi), &bits)) {
			k3_err_set(err, -EINVAL, "weights[%" PRIu32 "] must be 8 lower-case hex digits", i);
			goto out;
		}
		memcpy(&rec->weights[i], &bits, 4);
	}
	rc = 0;
out:
	json_decref(o);
	return rc;
}

static int cmp_rank(const void *a, const void *b)
{
	const struct k3_store_trace_rank *x = a, *y = b;

	if (x->uses != y->uses)
		return x->uses > y->uses ? -1 : 1;
	if (x->layer != y->layer)
		return x->layer < y->layer ? -1 : 1;
	return x->expert < y->expert ? -1 : x->expert > y->expert;
}

struct rank_layer {
	uint64_t *uses;
	double *wsum;
	uint32_t cap;
};

int k3_store_trace_rank(const char *path, struct k3_store_trace_rank **out, size_t *n,
			uint64_t *records, struct k3_err *err)
{
	enum { LAYERS = 1024 };
	struct rank_layer *ly = calloc(LAYERS, sizeof(*ly));
	struct k3_store_trace_rec rec;
	struct k3_store_trace_rank *r = NULL;
	char *line = NULL;
	size_t count = 0;
	uint64_t lineno = 0;
	struct stat st;
	FILE *f = NULL;
	int rc = 0, fd;

	*out = NULL;
	*n = 0;
	*records = 0;
	if (!ly)
		return k3_err_set(err, -ENOMEM, "out of memory");
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0) {
		rc = k3_err_set(err, -errno, "cannot open trace '%s': %s", path, strerror(errno));
		goto out;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		rc = k3_err_set(err, -EINVAL, "trace '%s' is not a regular file", path);
		goto out;
	}
	f = fdopen(fd, "r");
	if (!f) {
		close(fd);
		rc = k3_err_set(err, -errno, "cannot read trace '%s'", path);
		goto out;
	}
	line = malloc(K3_STORE_TRACE_LINE_MAX + 1);
	if (!line) {
		rc = k3_err_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	/* Fixed buffer: a line longer than the limit is an error, never a
	 * reason to allocate more. */
	while (fgets(line, K3_STORE_TRACE_LINE_MAX + 1, f)) {
		size_t len = strlen(line);
		lineno++;
		if (len == K3_STORE_TRACE_LINE_MAX && line[len - 1] != '\n') {
			rc = k3_err_set(err, -EINVAL, "'%s' line %" PRIu64 " is longer than %d bytes",
					path, lineno, K3_STORE_TRACE_LINE_MAX);
			goto out;
		}
		if (len == 1 && line[0] == '\n')
			continue;
		rc = k3_store_trace_parse(line, len, &rec, err);
		if (rc && line[len - 1] != '\n' && feof(f)) {
			/* A torn last line: the writer is mid-record or was
			 * stopped in one (full disk, crash). Not an error. */
			rc = 0;
			break;
		}
		if (rc) {
			k3_err_prefix(err, "'%s' line %" PRIu64, path, lineno);
			goto out;
		}
		struct rank_layer *L = &ly[rec.layer];
		for (uint32_t i = 0; i < rec.k; i++) {
			uint32_t e = rec.ids[i];
			if (e >= L->cap) {
				uint32_t nc = e + 1 > 2 * L->cap ? e + 1 : 2 * L->cap;
				uint64_t *nu = realloc(L->uses, nc * sizeof(*nu));
				double *nw = nu ? realloc(L->wsum, nc * sizeof(*nw)) : NULL;
				if (nu)
					L->uses = nu;
				if (!nw) {
					rc = k3_err_set(err, -ENOMEM, "out of memory");
					goto out;
				}
				L->wsum = nw;
				memset(L->uses + L->cap, 0, (nc - L->cap) * sizeof(*nu));
				memset(L->wsum + L->cap, 0, (nc - L->cap) * sizeof(*nw));
				L->cap = nc;
			}
			if (L->uses[e]++ == 0)
				count++;
			L->wsum[e] += rec.weights[i];
		}
		(*records)++;
	}
	if (ferror(f)) {
		rc = k3_err_set(err, -EIO, "cannot read trace '%s'", path);
		goto out;
	}
	r = malloc((count ? count : 1) * sizeof(*r));
	if (!r) {
		rc = k3_err_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	count = 0;
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t e = 0; e < ly[l].cap; e++)
			if (ly[l].uses[e])
				r[count++] = (struct k3_store_trace_rank){
					.layer = l, .expert = e,
					.uses = ly[l].uses[e], .weight_sum = ly[l].wsum[e] };
	qsort(r, count, sizeof(*r), cmp_rank);
	*out = r;
	*n = count;
out:
	if (f)
		fclose(f);
	free(line);
	for (uint32_t l = 0; l < LAYERS; l++) {
		free(ly[l].uses);
		free(ly[l].wsum);
	}
	free(ly);
	return rc;
}
