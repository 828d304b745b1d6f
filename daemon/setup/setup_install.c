/* setup_install.c - full and streaming installs (see setup_install.h). */
#include "setup/setup_install.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"

#include "model/model.h"
#include "model/safetensors.h"
#include "setup/setup_experts.h"
#include "setup/setup_partial.h"
#include "setup/setup_publish.h"
#include "setup/setup_session.h"
#include "setup/setup_transfer.h"
#include "setup/setup_verify.h"

enum { HASH_TRIES = 2 };   /* downloads of one file before a SHA-256 mismatch is final */

struct install {
	struct k3_setup_session *s;
	int rc;                    /* first failure */
	struct k3_err err;
	size_t failed;
};

static void install_fail(struct install *in, int rc, const struct k3_err *err)
{
	in->failed++;
	if (!in->rc) {
		in->rc = rc;
		in->err = *err;
	}
}

static bool is_shard(const char *path)
{
	size_t n = strlen(path);

	return n > 12 && strcmp(path + n - 12, ".safetensors") == 0;
}

/* Records path as held (verified or sparse) with the identity it has now. */
static int record(struct install *in, const struct k3_setup_file *f, enum k3_setup_have have,
		  struct k3_err *err)
{
	struct k3_setup_session *s = in->s;
	struct stat st;

	if (fstatat(s->dirfd, f->path, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
		return k3_err_set(err, -EIO, "'%s' vanished after it was published", f->path);
	if (!k3_setup_state_set(s->state, f->path, f->size, f->sha256, have, &st))
		return k3_err_set(err, -ENOMEM, "out of memory");
	return k3_setup_session_save(s, err);
}

/* Our own file at the name that is known not to be verified (a shard whose
 * SHA-256 failed, an interrupted streaming shard): it may be replaced. */
static bool ours_unverified(const struct k3_setup_session *s, const struct k3_setup_file *f)
{
	const struct k3_setup_record *r = k3_setup_state_find(s->state, f->path);
	struct stat st;

	return r && r->have == K3_SETUP_HAVE_NONE &&
	       fstatat(s->dirfd, f->path, &st, AT_SYMLINK_NOFOLLOW) == 0 && k3_setup_record_same_file(r, &st);
}

/* ---- whole files ---- */

struct ftask {
	struct k3_setup_job job;       /* first: callbacks get the job */
	struct install *in;
	const struct k3_setup_file *f;
	struct k3_setup_partial *part;
	size_t pid;
	unsigned downloads;
	bool replace_ours;
};

static int ft_write(struct k3_setup_job *job, uint64_t off, const void *buf, size_t n,
		    struct k3_err *err)
{
	struct ftask *t = (struct ftask *)job;
	int rc = k3_setup_partial_write(t->part, off, buf, n, err);

	if (rc == 0)
		k3_setup_progress_update(t->in->s->pr, t->pid, off + n);
	return rc;
}

static int ft_restart(struct k3_setup_job *job, struct k3_err *err)
{
	struct ftask *t = (struct ftask *)job;

	k3_setup_progress_update(t->in->s->pr, t->pid, 0);
	return k3_setup_partial_restart(t->part, err);
}

static void ft_retry(struct k3_setup_job *job, unsigned attempt, unsigned delay_ms, const char *why)
{
	struct ftask *t = (struct ftask *)job;

	k3_setup_progress_retry(t->in->s->pr, t->pid, attempt, delay_ms, why);
}

static int ft_open(struct ftask *t, struct k3_err *err);

/* All bytes are in the partial: verify, publish, record. */
static void ft_finish(struct ftask *t)
{
	struct install *in = t->in;
	struct k3_setup_session *s = in->s;
	struct k3_err err = { 0, "" };
	char hex[K3_SETUP_SHA256_HEX];
	int rc;

	if (t->replace_ours)
		(void)unlinkat(s->dirfd, t->f->path, 0);
	rc = k3_setup_partial_finish(t->part, &err);
	t->part = NULL;
	if (rc == -EBADMSG && t->downloads < HASH_TRIES) {
		/* the bytes that arrived are not the pinned ones: never published,
		 * fetched once more from the start */
		k3_setup_progress_retry(s->pr, t->pid, t->downloads + 1, 0, err.msg);
		if (ft_open(t, &err) == 0) {
			t->downloads++;
			k3_setup_net_submit(s->net, &t->job);
			return;
		}
		rc = err.code ? err.code : -EIO;
	}
	if (rc == 0)
		rc = record(in, t->f, K3_SETUP_HAVE_VERIFIED, &err);
	if (rc) {
		k3_setup_progress_fail(s->pr, t->pid, err.msg);
		install_fail(in, rc, &err);
		return;
	}
	k3_setup_sha256_hex(t->f->sha256, hex);
	k3_setup_progress_done(s->pr, t->pid, hex);
}

static void ft_done(struct k3_setup_job *job, int rc, const struct k3_err *err)
{
	struct ftask *t = (struct ftask *)job;

	if (rc) {
		/* keep the partial: the next run resumes it */
		k3_setup_partial_close(t->part);
		t->part = NULL;
		k3_setup_progress_fail(t->in->s->pr, t->pid, err->msg);
		install_fail(t->in, rc, err);
		return;
	}
	ft_finish(t);
}

static const struct k3_setup_job_ops ft_ops = { ft_write, ft_restart, ft_retry, ft_done };

/* (Re)opens the partial and fills the job from its resume point. */
static int ft_open(struct ftask *t, struct k3_err *err)
{
	struct k3_setup_session *s = t->in->s;
	char what[4096];
	uint64_t resume;
	int rc;

	k3_setup_session_path(s, t->f->path, what, sizeof(what));
	rc = k3_setup_partial_open(s->dirfd, t->f->path, t->f->size, t->f->sha256, s->o->chunk, what,
				   &t->part, &resume, err);
	if (rc)
		return rc;
	rc = k3_setup_session_url(s, t->f->path, t->job.url, sizeof(t->job.url), err);
	if (rc)
		return rc;
	t->job.offset = 0;
	t->job.length = t->job.total = t->f->size;
	t->job.got = resume;
	t->job.ops = &ft_ops;
	k3_setup_progress_update(s->pr, t->pid, resume);
	return 0;
}

/* Fetches f whole unless it is there already. Returns 0 when the file is
 * queued, skipped or verified in place; a negative errno when it is
 * refused (recorded as a failure). */
static int queue_file(struct install *in, const struct k3_setup_file *f, struct ftask *t)
{
	struct k3_setup_session *s = in->s;
	struct k3_setup_record *r = k3_setup_state_find(s->state, f->path);
	struct k3_err err = { 0, "" };
	char what[4096];
	struct stat st;
	int rc;

	k3_setup_session_path(s, f->path, what, sizeof(what));
	memset(t, 0, sizeof(*t));
	t->in = in;
	t->f = f;
	t->downloads = 1;
	rc = k3_setup_probe(s->dirfd, f->path, what, &st, &err);
	if (rc == 0 && r && k3_setup_record_same_file(r, &st) && r->have == K3_SETUP_HAVE_VERIFIED &&
	    memcmp(r->sha256, f->sha256, 32) == 0)
		return 0;   /* verified before */
	if (rc == 0 && ours_unverified(s, f)) {
		t->replace_ours = true;
	} else if (rc == 0) {
		/* a file we did not write, or did not record: keep it only if
		 * it is exactly the pinned file */
		uint8_t d[32];
		int fd = k3_setup_open_file(s->dirfd, f->path, O_RDONLY, 0, what, &err);
		if (fd < 0)
			goto refuse;
		rc = (uint64_t)st.st_size == f->size ? k3_setup_sha256_fd(fd, 0, f->size, d, what, &err) : 1;
		close(fd);
		if (rc == 0 && memcmp(d, f->sha256, 32) == 0)
			return record(in, f, K3_SETUP_HAVE_VERIFIED, &err) ? (install_fail(in, err.code, &err),
									       err.code) : 0;
		if (rc >= 0)
			rc = k3_err_set(&err, -EEXIST, "'%s' exists and is not the file the inventory pins:"
					" k3ctl never replaces a file it did not verify (move it away and"
					" run again)", what);
		goto refuse;
	} else if (rc != -ENOENT) {
		goto refuse;
	}
	t->pid = k3_setup_progress_add(s->pr, f->path, f->size, 0);
	if (t->pid == (size_t)-1) {
		rc = k3_err_set(&err, -ENOMEM, "out of memory");
		goto refuse;
	}
	rc = ft_open(t, &err);
	if (rc)
		goto refuse;
	k3_setup_progress_start(s->pr, t->pid);
	if (t->job.got == f->size) {
		ft_finish(t);   /* a complete partial from an earlier run */
		return 0;
	}
	k3_setup_net_submit(s->net, &t->job);
	return 0;
refuse:
	install_fail(in, err.code ? err.code : rc, &err);
	return err.code ? err.code : rc;
}

/* ---- streaming shards: header and spine into a sparse file ---- */

struct stask;

struct rjob {
	struct k3_setup_job job;
	struct stask *st;
};

struct stask {
	struct install *in;
	const struct k3_setup_file *f;
	struct k3_setup_shard_layout layout;
	struct rjob *jobs;
	size_t pending;
	int fd;
	size_t pid;
	uint64_t have;
	int rc;
	struct k3_err err;
	char part[K3_SETUP_NAME_MAX + 16];
	bool replace_ours;
};

static int rj_write(struct k3_setup_job *job, uint64_t off, const void *buf, size_t n,
		    struct k3_err *err)
{
	struct stask *st = ((struct rjob *)job)->st;
	int rc = k3_file_pwrite_all(st->fd, buf, n, off);

	if (rc)
		return k3_err_set(err, rc, "cannot write '%s': %s", st->part, strerror(-rc));
	st->have += n;
	k3_setup_progress_update(st->in->s->pr, st->pid, st->have);
	return 0;
}

static void rj_retry(struct k3_setup_job *job, unsigned attempt, unsigned delay_ms, const char *why)
{
	struct stask *st = ((struct rjob *)job)->st;

	k3_setup_progress_retry(st->in->s->pr, st->pid, attempt, delay_ms, why);
}

static void st_release(struct stask *st)
{
	if (st->fd >= 0)
		close(st->fd);
	st->fd = -1;
	k3_setup_shard_layout_release(&st->layout);
	free(st->jobs);
	st->jobs = NULL;
}

static void rj_done(struct k3_setup_job *job, int rc, const struct k3_err *err)
{
	struct stask *st = ((struct rjob *)job)->st;
	struct k3_setup_session *s = st->in->s;
	struct k3_err e = { 0, "" };
	char what[4096];

	if (rc && !st->rc) {
		st->rc = rc;
		st->err = *err;
	}
	if (--st->pending)
		return;
	if (!st->rc) {
		/* every spine byte is in: publish the sparse shard under its name */
		k3_setup_session_path(s, st->f->path, what, sizeof(what));
		if (st->replace_ours)
			(void)unlinkat(s->dirfd, st->f->path, 0);
		st->rc = k3_setup_publish(s->dirfd, st->fd, st->part, st->f->path, what, &e);
		if (st->rc == 0)
			st->rc = record(st->in, st->f, K3_SETUP_HAVE_SPARSE, &e);
		if (st->rc)
			st->err = e;
	}
	if (st->rc) {
		k3_setup_progress_fail(s->pr, st->pid, st->err.msg);
		install_fail(st->in, st->rc, &st->err);
	} else {
		k3_setup_progress_done(s->pr, st->pid, NULL);
	}
	st_release(st);
}

static const struct k3_setup_job_ops rj_ops = { rj_write, NULL, rj_retry, rj_done };

/* Queues the spine of shard f; a shard without experts is fetched whole
 * (into *whole). */
static int queue_stream_shard(struct install *in, const struct k3_setup_file *f, struct stask *st,
			      struct ftask *whole)
{
	struct k3_setup_session *s = in->s;
	struct k3_setup_record *r = k3_setup_state_find(s->state, f->path);
	struct k3_err err = { 0, "" };
	char url[K3_SETUP_URL_MAX + 1], what[4096], *prefix = NULL, *header = NULL;
	size_t len;
	uint64_t hlen;
	struct stat sb;
	int rc;

	memset(st, 0, sizeof(*st));
	st->fd = -1;
	st->in = in;
	st->f = f;
	k3_setup_session_path(s, f->path, what, sizeof(what));
	rc = k3_setup_probe(s->dirfd, f->path, what, &sb, &err);
	if (rc == 0 && r && k3_setup_record_same_file(r, &sb) &&
	    (r->have == K3_SETUP_HAVE_SPARSE || r->have == K3_SETUP_HAVE_VERIFIED))
		return 0;
	if (rc == 0 && ours_unverified(s, f))
		st->replace_ours = true;
	else if (rc == 0)
		return queue_file(in, f, whole);   /* a foreign file: verified or refused there */
	else if (rc != -ENOENT)
		goto refuse;
	if ((rc = k3_setup_session_url(s, f->path, url, sizeof(url), &err)) != 0 ||
	    (rc = k3_setup_net_fetch(s->net, url, 0, 8, f->size, 8, &prefix, &len, NULL, &err)) != 0)
		goto refuse;
	rc = k3_st_parse_prefix((const uint8_t *)prefix, len, f->size, what, &hlen, &err);
	if (rc == 0)
		rc = k3_setup_net_fetch(s->net, url, 8, hlen, f->size, (size_t)hlen, &header, &len, NULL,
					&err);
	if (rc == 0)
		rc = k3_setup_shard_layout((const uint8_t *)prefix, header, len, f->size, what,
					   &st->layout, &err);
	if (rc)
		goto refuse;
	if (f->spine_known && f->spine_bytes != st->layout.spine_bytes) {
		rc = k3_err_set(&err, -EBADMSG, "manifest mismatch: '%s' has %" PRIu64 " bytes of header"
				" and spine on the server, the inventory pins %" PRIu64, f->path,
				st->layout.spine_bytes, f->spine_bytes);
		goto refuse;
	}
	if (st->layout.n_expert_tensors == 0) {
		/* nothing to stream: the whole file, verified */
		k3_setup_shard_layout_release(&st->layout);
		free(prefix);
		free(header);
		return queue_file(in, f, whole);
	}
	snprintf(st->part, sizeof(st->part), "%s.partial", f->path);
	st->fd = k3_setup_open_file(s->dirfd, st->part, O_RDWR | O_CREAT | O_TRUNC, 0644, st->part, &err);
	if (st->fd < 0) {
		rc = st->fd;
		goto refuse;
	}
	/* a sparse file of the release's size: experts stay holes until fetched */
	if (ftruncate(st->fd, (off_t)f->size) != 0 ||
	    k3_file_pwrite_all(st->fd, prefix, 8, 0) != 0 ||
	    k3_file_pwrite_all(st->fd, header, (size_t)hlen, 8) != 0) {
		rc = k3_err_set(&err, -errno, "cannot write '%s': %s", st->part, strerror(errno));
		goto refuse;
	}
	st->jobs = calloc(st->layout.n_spine ? st->layout.n_spine : 1, sizeof(*st->jobs));
	st->pid = k3_setup_progress_add(s->pr, f->path, st->layout.spine_bytes, st->layout.header_end);
	if (!st->jobs || st->pid == (size_t)-1) {
		rc = k3_err_set(&err, -ENOMEM, "out of memory");
		goto refuse;
	}
	st->have = st->layout.header_end;
	k3_setup_progress_start(s->pr, st->pid);
	st->pending = st->layout.n_spine + 1;   /* + 1 until every job is queued */
	for (size_t i = 0; i < st->layout.n_spine; i++) {
		struct rjob *j = &st->jobs[i];
		j->st = st;
		snprintf(j->job.url, sizeof(j->job.url), "%s", url);
		j->job.offset = st->layout.spine[i].off;
		j->job.length = st->layout.spine[i].len;
		j->job.total = f->size;
		j->job.ops = &rj_ops;
		k3_setup_net_submit(s->net, &j->job);
	}
	free(prefix);
	free(header);
	rj_done(&(struct rjob){ .st = st }.job, 0, NULL);   /* drop the + 1 */
	return 0;
refuse:
	free(prefix);
	free(header);
	if (st->fd >= 0)
		(void)unlinkat(s->dirfd, st->part, 0);
	st_release(st);
	install_fail(in, err.code ? err.code : rc, &err);
	return err.code ? err.code : rc;
}

/* ---- the run ---- */

static void tick(void *ctx)
{
	k3_setup_progress_tick(((struct install *)ctx)->s->pr);
}

static int refuse_plan(const struct k3_setup_plan *p, const struct k3_setup_opts *o,
		       struct k3_err *err)
{
	char need[32], have[32];

	if (p->problem[0])
		return k3_err_set(err, strstr(p->problem, "symbolic link") ? -ELOOP : -EEXIST, "%s",
				  p->problem);
	if (!p->fits) {
		k3_setup_bytes_str(p->peak_bytes + p->reserve_bytes, need, sizeof(need));
		k3_setup_bytes_str(p->free_bytes, have, sizeof(have));
		return k3_err_set(err, -ENOSPC, "not enough space for the install at '%s': it needs %s"
				  " free (its peak plus what is kept free), %s is free; nothing was"
				  " fetched (free space or pass a smaller --reserve%s)",
				  o->dir, need, have, o->stream ? "" : ", or use --stream");
	}
	return 0;
}

int k3_setup_install(const struct k3_setup_inventory *inv, const struct k3_setup_opts *o,
		     struct k3_err *err)
{
	struct k3_setup_session s;
	struct k3_setup_plan plan;
	struct install in = { 0 };
	struct ftask *ft = NULL;
	struct stask *st = NULL;
	bool sparse_left = false;
	int rc;

	/* everything that can refuse without the network or a write, first */
	if (inv && ((rc = k3_setup_plan_compute(inv, o, &plan, err)) != 0 ||
		    (rc = refuse_plan(&plan, o, err)) != 0))
		return rc;
	rc = k3_setup_session_open(&s, o, inv, true, true, err);
	if (rc)
		return rc;
	in.s = &s;
	rc = k3_setup_plan_compute(s.inv, o, &plan, err);
	if (rc == 0)
		rc = refuse_plan(&plan, o, err);
	if (rc == 0)
		rc = k3_setup_session_net(&s, err);
	if (rc == 0)
		rc = k3_setup_session_complete(&s, err);
	if (rc == 0 && (rc = k3_setup_plan_compute(s.inv, o, &plan, err)) == 0)
		rc = refuse_plan(&plan, o, err);
	if (rc)
		goto out;
	s.state->stream = o->stream;
	{
		char abs[PATH_MAX];
		if (k3_setup_state_set_str(&s.state->base_url, s.base_url) ||
		    k3_setup_state_set_str(&s.state->cacert, o->cacert ? (realpath(o->cacert, abs) ?
									  abs : o->cacert) : NULL)) {
			rc = k3_err_set(err, -ENOMEM, "out of memory");
			goto out;
		}
	}
	if ((rc = k3_setup_session_save(&s, err)) != 0)
		goto out;
	k3_setup_progress_plan(s.pr, s.inv->n_files, plan.bytes_total, plan.bytes_to_fetch,
			       plan.free_bytes, plan.peak_bytes);
	ft = calloc(s.inv->n_files, sizeof(*ft));
	st = calloc(s.inv->n_files, sizeof(*st));
	if (!ft || !st) {
		rc = k3_err_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < s.inv->n_files; i++)
		st[i].fd = -1;
	/* metadata first: small, and the index is what the shards are checked against */
	for (int pass = 0; pass < 2; pass++)
		for (size_t i = 0; i < s.inv->n_files; i++) {
			const struct k3_setup_file *f = &s.inv->files[i];
			const struct k3_setup_record *r = k3_setup_state_find(s.state, f->path);
			struct stat sb;
			if (is_shard(f->path) != (pass == 1))
				continue;
			if (pass == 1 && o->stream)
				queue_stream_shard(&in, f, &st[i], &ft[i]);
			else if (pass == 1 && r && r->have == K3_SETUP_HAVE_SPARSE &&
				 fstatat(s.dirfd, f->path, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
				 k3_setup_record_same_file(r, &sb))
				sparse_left = true;   /* filled in place below */
			else
				queue_file(&in, f, &ft[i]);
		}
	rc = k3_setup_net_run(s.net, false, tick, &in);
	if (rc) {
		rc = k3_err_set(err, rc, "the transfer engine failed");
		goto out;
	}
	if (in.rc == 0 && sparse_left && !o->stream) {
		/* a streaming install made full: fetch every expert it lacks */
		struct k3_setup_fetch_sel sel = { .spine = false, .experts = true };
		k3_setup_progress_end(s.pr, true, "the streaming install's experts come next");
		free(ft);
		free(st);
		k3_setup_session_close(&s);
		return k3_setup_fetch(o, &sel, NULL, err);
	}
	if (in.rc == 0 && o->stream) {
		struct k3_model *m = NULL;
		struct k3_err me = { 0, "" };
		rc = k3_model_open(o->dir, &m, &me);
		if (rc == 0)
			rc = k3_setup_expert_map_create(s.dirfd, m, &me);
		k3_model_free(m);
		if (rc) {
			k3_err_set(&in.err, rc, "the streaming install at '%s' does not open: %s", o->dir, me.msg);
			in.rc = rc;
		}
	}
	rc = in.rc;
	if (rc && err)
		*err = in.err;
	if (rc && in.failed > 1)
		k3_err_prefix(err, "%zu files failed; the first", in.failed);
out:
	if (s.pr)
		k3_setup_progress_end(s.pr, rc == 0, rc ? (err ? err->msg : "") : NULL);
	free(ft);
	if (st)
		for (size_t i = 0; i < s.inv->n_files; i++)
			st_release(&st[i]);
	free(st);
	k3_setup_session_close(&s);
	return rc;
}
