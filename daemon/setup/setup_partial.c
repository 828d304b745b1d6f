/* setup_partial.c - resumable whole-file downloads (see setup_partial.h). */
#include "setup/setup_partial.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"

#include "setup/setup_inventory.h"
#include "setup/setup_publish.h"
#include "setup/setup_verify.h"

enum { MAX_CHECKPOINTS = 65536, LINE_MAX_BYTES = 128 };
/* Bytes between the network thread and the writer: the network thread
 * only copies into this ring; a thread per download writes, hashes and
 * journals, so the SHA-256 runs on another core than TLS (ratio against
 * curl: docs/setup.md, "Measurements"). */
#define RING_BYTES ((size_t)8 << 20)
#define WRITER_PIECE ((size_t)128 << 10)

struct k3_setup_partial {
	int dirfd;          /* borrowed */
	int fd, jfd;        /* the partial, its journal (O_APPEND) */
	char name[K3_SETUP_NAME_MAX + 1];
	char part[K3_SETUP_NAME_MAX + 16], journal[K3_SETUP_NAME_MAX + 24];
	char what[4096];
	uint64_t size, chunk;
	uint64_t written;   /* bytes written and hashed (the writer's) */
	uint8_t sha[32];
	struct k3_setup_hasher *h;
	/* the ring, under mu */
	pthread_t writer;
	bool writer_started, stop;
	pthread_mutex_t mu;
	pthread_cond_t more, less;
	uint8_t *ring;
	size_t head, used;  /* consume position, bytes queued */
	uint64_t queued;    /* offset of the next byte to queue */
	int werr;           /* the writer's first failure */
	struct k3_err werrmsg;
};

static int append_checkpoint(struct k3_setup_partial *p, struct k3_err *err);
static int consume(struct k3_setup_partial *p, const uint8_t *b, size_t n, struct k3_err *err);

static void *writer_main(void *arg)
{
	struct k3_setup_partial *p = arg;

	pthread_mutex_lock(&p->mu);
	for (;;) {
		while (!p->used && !p->stop)
			pthread_cond_wait(&p->more, &p->mu);
		if (!p->used)
			break;
		size_t n = p->used < RING_BYTES - p->head ? p->used : RING_BYTES - p->head;
		if (n > WRITER_PIECE)
			n = WRITER_PIECE;
		const uint8_t *b = p->ring + p->head;
		int rc = 0;
		pthread_mutex_unlock(&p->mu);
		if (!p->werr)
			rc = consume(p, b, n, &p->werrmsg);
		pthread_mutex_lock(&p->mu);
		if (rc && !p->werr)
			p->werr = rc;
		p->head = (p->head + n) % RING_BYTES;
		p->used -= n;
		pthread_cond_broadcast(&p->less);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

/* Waits until the writer has taken everything queued. Returns its error. */
static int drain(struct k3_setup_partial *p, struct k3_err *err)
{
	int rc;

	if (!p->writer_started)
		return 0;
	pthread_mutex_lock(&p->mu);
	while (p->used)
		pthread_cond_wait(&p->less, &p->mu);
	rc = p->werr;
	pthread_mutex_unlock(&p->mu);
	if (rc && err)
		*err = p->werrmsg;
	return rc;
}

static void writer_stop(struct k3_setup_partial *p)
{
	if (!p->writer_started)
		return;
	pthread_mutex_lock(&p->mu);
	p->stop = true;
	pthread_cond_broadcast(&p->more);
	pthread_mutex_unlock(&p->mu);
	pthread_join(p->writer, NULL);
	p->writer_started = false;
}

static void partial_free(struct k3_setup_partial *p)
{
	writer_stop(p);
	if (p->fd >= 0)
		close(p->fd);
	if (p->jfd >= 0)
		close(p->jfd);
	k3_setup_hasher_free(p->h);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->more);
	pthread_cond_destroy(&p->less);
	free(p->ring);
	free(p);
}

void k3_setup_partial_close(struct k3_setup_partial *p)
{
	if (!p)
		return;
	writer_stop(p);
	/* an orderly stop (a transfer gave up): journal where we are, so the
	 * next run resumes exactly here rather than at the last chunk */
	if (!p->werr && p->written % p->chunk != 0)
		(void)append_checkpoint(p, NULL);
	partial_free(p);
}

uint64_t k3_setup_partial_bytes(const struct k3_setup_partial *p)
{
	return p->queued;
}

static int journal_header(const struct k3_setup_partial *p, char *line, size_t size)
{
	char hex[K3_SETUP_SHA256_HEX];

	k3_setup_sha256_hex(p->sha, hex);
	return snprintf(line, size, "k3-partial 1 %" PRIu64 " %s %" PRIu64 "\n", p->size, hex, p->chunk);
}

/* Starts the journal afresh: header only, partial truncated to `keep`. */
static int journal_reset(struct k3_setup_partial *p, uint64_t keep, struct k3_err *err)
{
	char line[LINE_MAX_BYTES * 2];
	int n = journal_header(p, line, sizeof(line));

	if (ftruncate(p->fd, (off_t)keep) != 0 || ftruncate(p->jfd, 0) != 0)
		return k3_err_set(err, -errno, "cannot truncate '%s.partial': %s", p->what, strerror(errno));
	if (k3_file_pwrite_all(p->jfd, line, (size_t)n, 0) != 0)
		return k3_err_set(err, -errno, "cannot write the journal of '%s': %s", p->what,
				  strerror(errno));
	return 0;
}

static int append_checkpoint(struct k3_setup_partial *p, struct k3_err *err)
{
	uint8_t d[32];
	char hex[K3_SETUP_SHA256_HEX], line[LINE_MAX_BYTES];
	int n;

	if (k3_setup_hasher_peek(p->h, d) != 0)
		return k3_err_set(err, -EIO, "SHA-256 of '%s' failed", p->what);
	k3_setup_sha256_hex(d, hex);
	n = snprintf(line, sizeof(line), "%" PRIu64 " %s\n", p->written, hex);
	/* O_APPEND: one write per line, so a torn line can only be the last */
	if (write(p->jfd, line, (size_t)n) != n)
		return k3_err_set(err, -EIO, "cannot write the journal of '%s'", p->what);
	return 0;
}

struct checkpoint {
	uint64_t off;
	uint8_t sha[32];
};

/* Reads the journal's checkpoints if its header is ours. Returns the count
 * (0 when there is no usable journal), or a negative errno. */
static int read_journal(struct k3_setup_partial *p, struct checkpoint **out, struct k3_err *err)
{
	char *text = NULL, head[LINE_MAX_BYTES * 2];
	size_t len;
	int n = 0, hl = journal_header(p, head, sizeof(head));
	struct checkpoint *cp;
	const char *s, *end;
	int rc;

	*out = NULL;
	rc = k3_setup_read_file(p->dirfd, p->journal, (size_t)MAX_CHECKPOINTS * LINE_MAX_BYTES + 256,
				&text, &len, p->journal, err);
	if (rc == -ENOENT || rc == -EFBIG)
		return 0;
	if (rc)
		return rc;
	if (len < (size_t)hl || memcmp(text, head, (size_t)hl) != 0) {
		free(text);
		return 0;   /* another download's journal: start over */
	}
	cp = calloc(MAX_CHECKPOINTS + 1, sizeof(*cp));
	if (!cp) {
		free(text);
		return k3_err_set(err, -ENOMEM, "out of memory");
	}
	s = text + hl;
	end = text + len;
	while (s < end && n <= MAX_CHECKPOINTS) {
		const char *nl = memchr(s, '\n', (size_t)(end - s));
		char line[LINE_MAX_BYTES], hex[80];
		unsigned long long off;
		if (!nl || nl - s >= (long)sizeof(line))
			break;   /* a torn last line */
		memcpy(line, s, (size_t)(nl - s));
		line[nl - s] = '\0';
		s = nl + 1;
		if (sscanf(line, "%llu %79s", &off, hex) != 2 ||
		    k3_setup_sha256_parse(hex, cp[n].sha) != 0 || off > p->size ||
		    (n > 0 && off <= cp[n - 1].off))
			break;
		cp[n++].off = off;
	}
	free(text);
	*out = cp;
	return n;
}

/* Re-hashes the partial against the journal; leaves p positioned at the
 * last checkpoint the disk reproduces. */
static int resume_point(struct k3_setup_partial *p, struct k3_err *err)
{
	struct checkpoint *cp = NULL;
	struct k3_setup_hasher *good = NULL;
	struct stat st;
	uint64_t at = 0, keep = 0;
	int n, rc = 0;

	if (fstat(p->fd, &st) != 0)
		return k3_err_set(err, -errno, "cannot stat '%s.partial': %s", p->what, strerror(errno));
	n = read_journal(p, &cp, err);
	if (n < 0)
		return n;
	good = k3_setup_hasher_new();
	if (!good) {
		free(cp);
		return k3_err_set(err, -ENOMEM, "out of memory");
	}
	for (int i = 0; i < n && cp[i].off <= (uint64_t)st.st_size; i++) {
		uint8_t d[32];
		rc = k3_setup_hash_fd(p->h, p->fd, at, cp[i].off - at, p->what, err);
		if (rc)
			goto out;
		at = cp[i].off;
		if (k3_setup_hasher_peek(p->h, d) != 0 || memcmp(d, cp[i].sha, 32) != 0)
			break;   /* the disk no longer holds what was journalled */
		if (k3_setup_hasher_copy(good, p->h) != 0) {
			rc = k3_err_set(err, -EIO, "SHA-256 failed");
			goto out;
		}
		keep = at;
	}
	if (k3_setup_hasher_copy(p->h, good) != 0) {
		rc = k3_err_set(err, -EIO, "SHA-256 failed");
		goto out;
	}
	p->written = keep;
	/* rewrite the journal with exactly the trusted checkpoints */
	rc = journal_reset(p, keep, err);
	for (int i = 0; rc == 0 && i < n && cp[i].off <= keep; i++) {
		char hex[K3_SETUP_SHA256_HEX], line[LINE_MAX_BYTES];
		int len;
		k3_setup_sha256_hex(cp[i].sha, hex);
		len = snprintf(line, sizeof(line), "%" PRIu64 " %s\n", cp[i].off, hex);
		if (write(p->jfd, line, (size_t)len) != len)
			rc = k3_err_set(err, -EIO, "cannot write the journal of '%s'", p->what);
	}
out:
	k3_setup_hasher_free(good);
	free(cp);
	return rc;
}

int k3_setup_partial_open(int dirfd, const char *name, uint64_t size, const uint8_t sha[32],
			  uint64_t chunk, const char *what, struct k3_setup_partial **out,
			  uint64_t *resume, struct k3_err *err)
{
	struct k3_setup_partial *p = calloc(1, sizeof(*p));
	uint64_t min_chunk = (size / MAX_CHECKPOINTS + 4095) / 4096 * 4096;
	int rc;

	*out = NULL;
	*resume = 0;
	if (!p)
		return k3_err_set(err, -ENOMEM, "out of memory");
	p->fd = p->jfd = -1;
	p->dirfd = dirfd;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->more, NULL);
	pthread_cond_init(&p->less, NULL);
	p->size = size;
	p->chunk = chunk > min_chunk ? chunk : min_chunk;
	memcpy(p->sha, sha, 32);
	snprintf(p->name, sizeof(p->name), "%s", name);
	snprintf(p->part, sizeof(p->part), "%s.partial", name);
	snprintf(p->journal, sizeof(p->journal), "%s.partial.k3j", name);
	snprintf(p->what, sizeof(p->what), "%s", what);
	p->h = k3_setup_hasher_new();
	if (!p->h) {
		partial_free(p);
		return k3_err_set(err, -ENOMEM, "out of memory");
	}
	p->fd = k3_setup_open_file(dirfd, p->part, O_RDWR | O_CREAT, 0644, p->part, err);
	if (p->fd < 0) {
		rc = p->fd;
		goto fail;
	}
	p->jfd = k3_setup_open_file(dirfd, p->journal, O_RDWR | O_CREAT | O_APPEND, 0644,
				    p->journal, err);
	if (p->jfd < 0) {
		rc = p->jfd;
		goto fail;
	}
	rc = resume_point(p, err);
	if (rc)
		goto fail;
	p->queued = p->written;
	if (p->written < p->size) {
		p->ring = malloc(RING_BYTES);
		if (!p->ring || pthread_create(&p->writer, NULL, writer_main, p) != 0) {
			rc = k3_err_set(err, -ENOMEM, "cannot start the writer of '%s'", what);
			goto fail;
		}
		p->writer_started = true;
	}
	*resume = p->written;
	*out = p;
	return 0;
fail:
	partial_free(p);
	return rc;
}

/* The writer's work: n bytes at p->written into the file, the hash and
 * the journal. */
static int consume(struct k3_setup_partial *p, const uint8_t *b, size_t n, struct k3_err *err)
{
	int rc = k3_file_pwrite_all(p->fd, b, n, p->written);

	if (rc)
		return k3_err_set(err, rc, "cannot write '%s.partial': %s", p->what, strerror(-rc));
	while (n > 0) {
		/* hash up to the next checkpoint boundary, then journal it */
		uint64_t to_cp = p->chunk - p->written % p->chunk;
		size_t k = n < to_cp ? n : (size_t)to_cp;
		if (k3_setup_hasher_update(p->h, b, k) != 0)
			return k3_err_set(err, -EIO, "SHA-256 of '%s' failed", p->what);
		p->written += k;
		b += k;
		n -= k;
		if (p->written % p->chunk == 0) {
			if ((rc = append_checkpoint(p, err)) != 0)
				return rc;
			/* start writing the chunk back now (no wait), so the fsync
			 * before publishing has little left to do and dirty pages
			 * do not pile up over a 17 GB shard */
			(void)sync_file_range(p->fd, (off64_t)(p->written - p->chunk), (off64_t)p->chunk,
					      SYNC_FILE_RANGE_WRITE);
		}
	}
	return 0;
}

int k3_setup_partial_write(struct k3_setup_partial *p, uint64_t off, const void *buf, size_t n,
			   struct k3_err *err)
{
	const uint8_t *b = buf;
	int rc;

	if (off != p->queued || n > p->size - p->queued)
		return k3_err_set(err, -ERANGE, "'%s': %zu bytes at %" PRIu64 " do not fit (have %"
				  PRIu64 " of %" PRIu64 ")", p->what, n, off, p->queued, p->size);
	pthread_mutex_lock(&p->mu);
	while (n > 0 && !p->werr) {
		size_t tail = (p->head + p->used) % RING_BYTES, room;
		while (p->used == RING_BYTES && !p->werr)
			pthread_cond_wait(&p->less, &p->mu);
		if (p->werr)
			break;
		tail = (p->head + p->used) % RING_BYTES;
		room = RING_BYTES - p->used;
		if (room > RING_BYTES - tail)
			room = RING_BYTES - tail;
		if (room > n)
			room = n;
		memcpy(p->ring + tail, b, room);
		p->used += room;
		p->queued += room;
		b += room;
		n -= room;
		pthread_cond_signal(&p->more);
	}
	rc = p->werr;
	pthread_mutex_unlock(&p->mu);
	if (rc && err)
		*err = p->werrmsg;
	return rc;
}

int k3_setup_partial_flush(struct k3_setup_partial *p, struct k3_err *err)
{
	return drain(p, err);
}

int k3_setup_partial_restart(struct k3_setup_partial *p, struct k3_err *err)
{
	int rc = drain(p, err);

	if (rc)
		return rc;
	if (k3_setup_hasher_reset(p->h) != 0)
		return k3_err_set(err, -EIO, "SHA-256 failed");
	p->written = p->queued = 0;
	return journal_reset(p, 0, err);
}

int k3_setup_partial_finish(struct k3_setup_partial *p, struct k3_err *err)
{
	uint8_t d[32];
	int rc = drain(p, err);

	writer_stop(p);
	if (rc) {
		partial_free(p);
		return rc;
	}
	if (p->written != p->size) {
		rc = k3_err_set(err, -EIO, "'%s': %" PRIu64 " of %" PRIu64 " bytes arrived", p->what,
				p->written, p->size);
		partial_free(p);
		return rc;
	}
	if (k3_setup_hasher_peek(p->h, d) != 0) {
		partial_free(p);
		return k3_err_set(err, -EIO, "SHA-256 of '%s' failed", p->what);
	}
	if (memcmp(d, p->sha, 32) != 0) {
		char got[K3_SETUP_SHA256_HEX], want[K3_SETUP_SHA256_HEX];
		k3_setup_sha256_hex(d, got);
		k3_setup_sha256_hex(p->sha, want);
		rc = k3_err_set(err, -EBADMSG, "'%s': SHA-256 of the download is %s, the inventory"
				" pins %s: not published", p->what, got, want);
		(void)unlinkat(p->dirfd, p->part, 0);
		(void)unlinkat(p->dirfd, p->journal, 0);
		partial_free(p);
		return rc;
	}
	rc = k3_setup_publish(p->dirfd, p->fd, p->part, p->name, p->what, err);
	if (rc == 0)
		(void)unlinkat(p->dirfd, p->journal, 0);
	partial_free(p);
	return rc;
}

uint64_t k3_setup_partial_estimate(int dirfd, const char *name)
{
	char part[K3_SETUP_NAME_MAX + 16], journal[K3_SETUP_NAME_MAX + 24], *text = NULL;
	uint64_t best = 0;
	struct stat st;
	size_t len;

	snprintf(part, sizeof(part), "%s.partial", name);
	snprintf(journal, sizeof(journal), "%s.partial.k3j", name);
	if (fstatat(dirfd, part, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
	    k3_setup_read_file(dirfd, journal, (size_t)MAX_CHECKPOINTS * LINE_MAX_BYTES + 256, &text,
			       &len, journal, NULL) != 0)
		return 0;
	for (char *line = strchr(text, '\n'); line && line[1]; line = strchr(line + 1, '\n')) {
		unsigned long long off;
		if (sscanf(line + 1, "%llu ", &off) == 1 && off <= (uint64_t)st.st_size && off > best)
			best = off;
	}
	free(text);
	return best;
}
