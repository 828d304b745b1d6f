/* setup_remote.c - routed experts fetched by range into sparse shards (see setup_remote.h). */
#include "setup/setup_remote.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/carve.h"
#include "base/file.h"
#include "base/log.h"
#include "setup/setup_experts.h"
#include "setup/setup_publish.h"
#include "setup/setup_session.h"
#include "setup/setup_state.h"
#include "setup/setup_transfer.h"
#include "setup/setup_verify.h"

enum { EXPERT_TRIES = 2 };                 /* downloads of one expert before a mismatch is final */
enum { X_IDLE = 0, X_FLIGHT = 1, X_FAILED = 2 };

struct span {
	uint32_t shard;
	uint64_t start, end;
	uint32_t idx;                          /* layer * experts + expert */
};

struct xjob {
	struct k3_setup_job job;
	struct k3_setup_remote *r;
	struct xbatch *batch;
};

/* The jobs of one expert's fetch (one per run of adjacent arrays). */
struct xbatch {
	uint32_t idx;
	unsigned n, pending;
	int rc;
	struct k3_err err;
	struct xjob j[6];
};

struct k3_setup_remote {
	const struct k3_model *m;
	struct k3_setup_opts o;
	struct k3_setup_session s;
	struct k3_setup_expert_map *map;
	struct k3_setup_expert_table *table;
	uint32_t layers, experts, n_shards;
	void *arrays;                          /* one block (base/carve.h): fds to tries */
	int *fds;                              /* per shard; -1 when not streamed */
	uint32_t *shard_total, *shard_present;
	struct span *spans;
	size_t n_spans;
	uint8_t *xs;                           /* X_* per expert */
	uint8_t *tries;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	pthread_t thread;
	bool threaded, thread_started;
	struct k3_setup_remote_stats st;
	int first_rc;
	struct k3_err first_err, last_err;
};

static uint32_t idx_layer(const struct k3_setup_remote *r, uint32_t idx)
{
	return idx / r->experts;
}

static uint32_t idx_expert(const struct k3_setup_remote *r, uint32_t idx)
{
	return idx % r->experts;
}

static int cmp_span(const void *a, const void *b)
{
	const struct span *x = a, *y = b;

	if (x->shard != y->shard)
		return x->shard < y->shard ? -1 : 1;
	return x->start < y->start ? -1 : x->start > y->start;
}

static const char *shard_name(const struct k3_setup_remote *r, uint32_t shard)
{
	const char *p = k3_model_shard_path(r->m, shard), *slash = p ? strrchr(p, '/') : NULL;

	return slash ? slash + 1 : p;
}

/* Records shard `shard` in the install's state (another process may have
 * written it since: reload under the lock). */
static void record_shard(struct k3_setup_remote *r, uint32_t shard, enum k3_setup_have have)
{
	const struct k3_setup_file *f = k3_setup_inventory_find(r->s.inv, shard_name(r, shard));
	struct k3_setup_state *st = NULL;
	struct k3_err err = { 0, "" };
	struct stat sb;
	int lfd;

	if (!f)
		return;
	/* never wait: a k3ctl setup may hold the lock for hours, and this runs
	 * on the thread the expert reads wait for. The map already says what
	 * arrived; a later check or completion records the shard. */
	if (k3_setup_lock(r->s.dirfd, false, &lfd, &err) != 0) {
		k3_log_warning("'%s' not recorded as %s in the install's state: %s", f->path,
			       have == K3_SETUP_HAVE_VERIFIED ? "verified" : "to fetch again", err.msg);
		return;
	}
	if (k3_setup_state_load(r->s.dirfd, &st, &err) == 0 && fstat(r->fds[shard], &sb) == 0 &&
	    k3_setup_state_set(st, f->path, f->size, f->sha256, have, &sb))
		(void)k3_setup_state_save(r->s.dirfd, st, &err);
	k3_setup_state_free(st);
	close(lfd);
}

/* Every expert of the shard is on disk: hash the whole file. Called on the
 * engine thread without the lock. */
static void verify_shard(struct k3_setup_remote *r, uint32_t shard)
{
	const struct k3_setup_file *f = k3_setup_inventory_find(r->s.inv, shard_name(r, shard));
	struct k3_err err = { 0, "" };
	uint8_t d[32];
	bool ok;

	if (!f || fdatasync(r->fds[shard]) != 0 ||
	    k3_setup_sha256_fd(r->fds[shard], 0, f->size, d, shard_name(r, shard), &err) != 0)
		return;
	ok = memcmp(d, f->sha256, 32) == 0;
	pthread_mutex_lock(&r->lock);
	for (size_t i = 0; i < r->n_spans; i++)
		if (r->spans[i].shard == shard)
			k3_setup_expert_map_set(r->map, idx_layer(r, r->spans[i].idx),
						idx_expert(r, r->spans[i].idx),
						ok ? K3_SETUP_EXPERT_SHARD : K3_SETUP_EXPERT_ABSENT);
	if (ok) {
		r->st.shards_verified++;
	} else {
		r->st.shards_failed++;
		r->shard_present[shard] = 0;
		k3_err_set(&r->last_err, -EBADMSG, "'%s': the whole shard's SHA-256 differs from the"
			   " inventory after its last expert arrived: its experts were used on TLS's word;"
			   " every one is marked absent and the shard for a fresh download", f->path);
	}
	pthread_mutex_unlock(&r->lock);
	(void)k3_setup_expert_map_sync(r->map);
	if (!ok)
		k3_log_err("%s", r->last_err.msg);
	record_shard(r, shard, ok ? K3_SETUP_HAVE_VERIFIED : K3_SETUP_HAVE_NONE);
}

static int xj_write(struct k3_setup_job *job, uint64_t off, const void *buf, size_t n,
		    struct k3_err *err)
{
	struct xjob *j = (struct xjob *)job;
	struct k3_setup_remote *r = j->r;
	uint32_t shard = 0;
	struct k3_setup_extent ext[6];
	unsigned ne;
	int rc;

	k3_setup_expert_extents(r->m, idx_layer(r, j->batch->idx), idx_expert(r, j->batch->idx), ext, &ne);
	shard = ext[0].shard;
	for (unsigned i = 0; i < ne; i++)
		if (off >= ext[i].offset && off < ext[i].offset + ext[i].length)
			shard = ext[i].shard;
	rc = k3_file_pwrite_all(r->fds[shard], buf, n, off);
	if (rc)
		return k3_err_set(err, rc, "cannot write '%s': %s", shard_name(r, shard), strerror(-rc));
	return 0;
}

static int submit_expert(struct k3_setup_remote *r, uint32_t idx, struct k3_err *err);

/* One expert's last job ended (engine thread). */
static void batch_done(struct k3_setup_remote *r, struct xbatch *b)
{
	uint32_t layer = idx_layer(r, b->idx), expert = idx_expert(r, b->idx);
	struct k3_setup_extent ext[6];
	enum k3_setup_expert_have have = K3_SETUP_EXPERT_TLS;
	struct k3_err err = b->err;
	uint8_t want[32], got[32];
	bool retry = false, shard_full = false;
	unsigned ne;
	int rc = b->rc;

	k3_setup_expert_extents(r->m, layer, expert, ext, &ne);
	/* durable before the map may say so */
	if (rc == 0 && fdatasync(r->fds[ext[0].shard]) != 0)
		rc = k3_err_set(&err, -errno, "cannot sync '%s': %s", shard_name(r, ext[0].shard),
				strerror(errno));
	if (rc == 0 && r->table) {
		if (k3_setup_expert_table_find(r->table, layer, expert, want) != 0)
			rc = k3_err_set(&err, -EBADMSG, "expert (%" PRIu32 ", %" PRIu32 ") is not in the"
					" per-expert table", layer, expert);
		else if ((rc = k3_setup_expert_sha256(r->m, layer, expert, r->fds, got, &err)) == 0 &&
			 memcmp(want, got, 32) != 0) {
			rc = k3_err_set(&err, -EBADMSG, "expert (%" PRIu32 ", %" PRIu32 ") from '%s' fails"
					" its SHA-256 check against the per-expert table: not used",
					layer, expert, shard_name(r, ext[0].shard));
			pthread_mutex_lock(&r->lock);
			r->st.expert_mismatches++;
			retry = ++r->tries[b->idx] < EXPERT_TRIES;
			pthread_mutex_unlock(&r->lock);
		}
		have = K3_SETUP_EXPERT_VERIFIED;
	}
	free(b);
	if (retry && submit_expert(r, (uint32_t)(layer * r->experts + expert), &err) == 0)
		return;
	pthread_mutex_lock(&r->lock);
	if (rc == 0) {
		k3_setup_expert_map_set(r->map, layer, expert, have);
		r->xs[layer * r->experts + expert] = X_IDLE;
		r->st.experts_fetched++;
		if (have == K3_SETUP_EXPERT_VERIFIED)
			r->st.verified_expert++;
		shard_full = ++r->shard_present[ext[0].shard] == r->shard_total[ext[0].shard];
	} else {
		r->xs[layer * r->experts + expert] = X_FAILED;
		r->st.failed++;
		r->last_err = err;
		if (!r->first_rc) {
			r->first_rc = rc;
			r->first_err = err;
		}
	}
	r->st.in_flight--;
	pthread_cond_broadcast(&r->cond);
	pthread_mutex_unlock(&r->lock);
	if (rc == 0 && shard_full)
		verify_shard(r, ext[0].shard);
}

static void xj_done(struct k3_setup_job *job, int rc, const struct k3_err *err)
{
	struct xjob *j = (struct xjob *)job;
	struct xbatch *b = j->batch;

	if (rc && !b->rc) {
		b->rc = rc;
		b->err = *err;
	}
	pthread_mutex_lock(&j->r->lock);
	j->r->st.bytes += k3_setup_job_got(job);
	pthread_mutex_unlock(&j->r->lock);
	if (--b->pending == 0)
		batch_done(j->r, b);
}

static const struct k3_setup_job_ops xj_ops = { xj_write, NULL, NULL, xj_done };

/* Builds and submits the jobs of expert idx (its arrays merged into runs
 * of adjacent bytes). The caller marked it in flight. */
static int submit_expert(struct k3_setup_remote *r, uint32_t idx, struct k3_err *err)
{
	struct k3_setup_extent ext[6];
	struct xbatch *b;
	unsigned ne;

	if (k3_setup_expert_extents(r->m, idx_layer(r, idx), idx_expert(r, idx), ext, &ne) != 0)
		return k3_err_set(err, -ENOENT, "not a routed expert");
	b = calloc(1, sizeof(*b));
	if (!b)
		return k3_err_set(err, -ENOMEM, "out of memory");
	b->idx = idx;
	for (unsigned i = 0; i < ne; i++) {
		struct xjob *last = b->n ? &b->j[b->n - 1] : NULL;
		const struct k3_setup_file *f = k3_setup_inventory_find(r->s.inv, shard_name(r, ext[i].shard));
		if (!f || r->fds[ext[i].shard] < 0) {
			free(b);
			return k3_err_set(err, -ENOENT, "the shard of expert (%" PRIu32 ", %" PRIu32 ") is"
					  " not a streamed shard of this install", idx_layer(r, idx),
					  idx_expert(r, idx));
		}
		if (last && ext[i].shard == ext[i - 1].shard &&
		    last->job.offset + last->job.length == ext[i].offset) {
			last->job.length += ext[i].length;
			continue;
		}
		struct xjob *j = &b->j[b->n++];
		j->r = r;
		j->batch = b;
		if (k3_setup_session_url(&r->s, f->path, j->job.url, sizeof(j->job.url), err) != 0) {
			free(b);
			return err->code;
		}
		j->job.offset = ext[i].offset;
		j->job.length = ext[i].length;
		j->job.total = f->size;
		j->job.ops = &xj_ops;
	}
	b->pending = b->n;
	for (unsigned i = 0; i < b->n; i++)
		k3_setup_net_submit(r->s.net, &b->j[i].job);
	return 0;
}

static void *thread_main(void *arg)
{
	struct k3_setup_remote *r = arg;

	(void)k3_setup_net_run(r->s.net, true, NULL, NULL);
	return NULL;
}

int k3_setup_remote_open(const struct k3_setup_opts *o, const struct k3_model *m, bool threaded,
			 struct k3_setup_remote **out, struct k3_err *err)
{
	struct k3_setup_remote *r = calloc(1, sizeof(*r));
	const struct k3_model_config *c = k3_model_config(m);
	int rc;

	*out = NULL;
	if (!r)
		return k3_err_set(err, -ENOMEM, "out of memory");
	r->m = m;
	r->o = *o;
	r->threaded = threaded;
	pthread_mutex_init(&r->lock, NULL);
	pthread_cond_init(&r->cond, NULL);
	rc = k3_setup_session_open(&r->s, &r->o, NULL, false, false, err);
	if (rc) {
		pthread_mutex_destroy(&r->lock);
		pthread_cond_destroy(&r->cond);
		free(r);
		return rc;
	}
	if (!r->o.cacert && r->s.state->cacert)
		r->o.cacert = r->s.state->cacert;
	if (!o->from && r->s.state->base_url)
		snprintf(r->s.base_url, sizeof(r->s.base_url), "%s", r->s.state->base_url);
	rc = k3_setup_expert_map_open(r->s.dirfd, true, &r->map, err);
	if (rc == -ENOENT)
		rc = k3_err_set(err, -ENOENT, "'%s' is not a streaming install (no expert map)", o->dir);
	if (rc)
		goto fail;
	r->layers = k3_setup_expert_map_layers(r->map);
	r->experts = k3_setup_expert_map_experts(r->map);
	if (r->layers != c->num_hidden_layers || r->experts != c->num_experts) {
		rc = k3_err_set(err, -EINVAL, "the expert map of '%s' is for another model", o->dir);
		goto fail;
	}
	if (r->s.inv->expert_table) {
		const struct k3_setup_record *rec = k3_setup_state_find(r->s.state, r->s.inv->expert_table);
		char *text = NULL;
		size_t len;
		if (!rec || rec->have != K3_SETUP_HAVE_VERIFIED) {
			rc = k3_err_set(err, -ENOENT, "the per-expert table '%s' is not installed (run k3ctl"
					" setup --stream)", r->s.inv->expert_table);
			goto fail;
		}
		rc = k3_setup_read_file(r->s.dirfd, r->s.inv->expert_table, (size_t)64 << 20, &text, &len,
					r->s.inv->expert_table, err);
		if (rc == 0)
			rc = k3_setup_expert_table_parse(text, len, &r->table, err);
		free(text);
		if (rc)
			goto fail;
	}
	r->n_shards = k3_model_shard_count(m);
	size_t n_ex = (size_t)r->layers * r->experts;
	struct k3_carve k = { 0 };
	while (k3_carve_next(&k)) {
		K3_CARVE(&k, r->fds, r->n_shards);
		K3_CARVE(&k, r->shard_total, r->n_shards);
		K3_CARVE(&k, r->shard_present, r->n_shards);
		K3_CARVE(&k, r->xs, n_ex);
		K3_CARVE(&k, r->tries, n_ex);
		K3_CARVE(&k, r->spans, n_ex * 6 + 1);
	}
	r->arrays = k.block;
	if (!r->arrays) {
		rc = k3_err_set(err, -ENOMEM, "out of memory");
		goto fail;
	}
	for (uint32_t i = 0; i < r->n_shards; i++)
		r->fds[i] = -1;   /* before any open: close skips what was never opened */
	for (uint32_t i = 0; i < r->n_shards; i++) {
		const struct k3_setup_record *rec = k3_setup_state_find(r->s.state, shard_name(r, i));
		if (rec && rec->have == K3_SETUP_HAVE_SPARSE) {
			r->fds[i] = k3_setup_open_file(r->s.dirfd, shard_name(r, i), O_RDWR, 0,
						       shard_name(r, i), err);
			if (r->fds[i] < 0) {
				rc = r->fds[i];
				goto fail;
			}
		}
	}
	for (uint32_t l = 0; l < r->layers; l++)
		for (uint32_t e = 0; e < r->experts; e++) {
			struct k3_setup_extent ext[6];
			unsigned ne;
			enum k3_setup_expert_have h = k3_setup_expert_map_get(r->map, l, e);
			if (h == K3_SETUP_EXPERT_NONE || k3_setup_expert_extents(m, l, e, ext, &ne) != 0)
				continue;
			r->shard_total[ext[0].shard]++;
			if (h != K3_SETUP_EXPERT_ABSENT)
				r->shard_present[ext[0].shard]++;
			for (unsigned i = 0; i < ne; i++)
				r->spans[r->n_spans++] = (struct span){ ext[i].shard, ext[i].offset,
									ext[i].offset + ext[i].length, l * r->experts + e };
		}
	qsort(r->spans, r->n_spans, sizeof(*r->spans), cmp_span);
	rc = k3_setup_session_net(&r->s, err);
	if (rc)
		goto fail;
	if (threaded) {
		if (pthread_create(&r->thread, NULL, thread_main, r) != 0) {
			rc = k3_err_set(err, -EAGAIN, "cannot start the expert fetcher thread");
			goto fail;
		}
		r->thread_started = true;
	}
	*out = r;
	return 0;
fail:
	k3_setup_remote_close(r);
	return rc;
}

void k3_setup_remote_close(struct k3_setup_remote *r)
{
	if (!r)
		return;
	if (r->thread_started) {
		k3_setup_net_stop(r->s.net);
		pthread_join(r->thread, NULL);
	}
	if (r->map)
		(void)k3_setup_expert_map_sync(r->map);
	k3_setup_expert_map_close(r->map);
	k3_setup_expert_table_free(r->table);
	for (uint32_t i = 0; r->arrays && i < r->n_shards; i++)
		if (r->fds[i] >= 0)
			close(r->fds[i]);
	free(r->arrays);
	k3_setup_session_close(&r->s);
	pthread_mutex_destroy(&r->lock);
	pthread_cond_destroy(&r->cond);
	free(r);
}

bool k3_setup_remote_present(struct k3_setup_remote *r, uint32_t layer, uint32_t expert)
{
	enum k3_setup_expert_have h = k3_setup_expert_map_get(r->map, layer, expert);

	return h == K3_SETUP_EXPERT_TLS || h == K3_SETUP_EXPERT_VERIFIED || h == K3_SETUP_EXPERT_SHARD;
}

/* Under the lock: starts (layer, expert) unless present, in flight or failed. */
static int want_locked(struct k3_setup_remote *r, uint32_t layer, uint32_t expert, struct k3_err *err)
{
	uint32_t idx = layer * r->experts + expert;
	int rc;

	if (r->xs[idx] == X_FAILED)
		return k3_err_set(err, -EIO, "%s", r->last_err.msg);
	if (r->xs[idx] == X_FLIGHT || k3_setup_remote_present(r, layer, expert))
		return 0;
	r->xs[idx] = X_FLIGHT;
	r->st.in_flight++;
	rc = submit_expert(r, idx, err);
	if (rc) {
		r->xs[idx] = X_FAILED;
		r->st.in_flight--;
	}
	return rc;
}

int k3_setup_remote_want(struct k3_setup_remote *r, uint32_t layer, uint32_t expert,
			 struct k3_err *err)
{
	int rc;

	if (layer >= r->layers || expert >= r->experts ||
	    k3_setup_expert_map_get(r->map, layer, expert) == K3_SETUP_EXPERT_NONE)
		return k3_err_set(err, -ENOENT, "(%" PRIu32 ", %" PRIu32 ") is not a routed expert",
				  layer, expert);
	pthread_mutex_lock(&r->lock);
	rc = want_locked(r, layer, expert, err);
	pthread_mutex_unlock(&r->lock);
	return rc;
}

int k3_setup_remote_ensure_range(struct k3_setup_remote *r, uint32_t shard, uint64_t off,
				 uint64_t len, struct k3_err *err)
{
	size_t lo = 0, hi = r->n_spans;
	int rc = 0;

	/* first span of this shard that may overlap: spans are sorted and
	 * never overlap each other */
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (r->spans[mid].shard < shard || (r->spans[mid].shard == shard && r->spans[mid].end <= off))
			lo = mid + 1;
		else
			hi = mid;
	}
	pthread_mutex_lock(&r->lock);
	for (size_t i = lo; rc == 0 && i < r->n_spans && r->spans[i].shard == shard &&
			    r->spans[i].start < off + len; i++) {
		uint32_t idx = r->spans[i].idx, l = idx_layer(r, idx), e = idx_expert(r, idx);
		rc = want_locked(r, l, e, err);
		while (rc == 0 && !k3_setup_remote_present(r, l, e)) {
			if (r->xs[idx] == X_FAILED) {
				rc = k3_err_set(err, -EIO, "%s", r->last_err.msg);
				break;
			}
			if (r->xs[idx] == X_IDLE)   /* marked absent again (a failed shard check) */
				rc = want_locked(r, l, e, err);
			else
				pthread_cond_wait(&r->cond, &r->lock);
		}
	}
	pthread_mutex_unlock(&r->lock);
	return rc;
}

int k3_setup_remote_run(struct k3_setup_remote *r, struct k3_err *err)
{
	int rc = k3_setup_net_run(r->s.net, false, NULL, NULL);

	if (rc)
		return k3_err_set(err, rc, "the transfer engine failed");
	(void)k3_setup_expert_map_sync(r->map);
	pthread_mutex_lock(&r->lock);
	rc = r->first_rc;
	if (rc && err)
		*err = r->first_err;
	if (rc == 0 && r->st.shards_failed) {
		rc = -EBADMSG;
		if (err)
			*err = r->last_err;
	}
	pthread_mutex_unlock(&r->lock);
	return rc;
}

void k3_setup_remote_stats_get(struct k3_setup_remote *r, struct k3_setup_remote_stats *st)
{
	pthread_mutex_lock(&r->lock);
	*st = r->st;
	pthread_mutex_unlock(&r->lock);
}

/* ---- k3ctl fetch-weights ---- */

int k3_setup_fetch(const struct k3_setup_opts *o, const struct k3_setup_fetch_sel *sel,
		   size_t *fetched, struct k3_err *err)
{
	struct k3_setup_opts so = *o;
	struct k3_setup_remote *r = NULL;
	struct k3_setup_remote_stats st;
	struct k3_model *m = NULL;
	struct k3_err me = { 0, "" };
	int rc;

	if (fetched)
		*fetched = 0;
	{
		/* an install must exist: fetch-weights never makes one */
		struct k3_setup_session s;
		rc = k3_setup_session_open(&s, o, NULL, false, false, err);
		if (rc)
			return rc;
		k3_setup_session_close(&s);
	}
	if (sel->spine) {
		/* what setup --stream does for files not yet present */
		so.stream = true;
		rc = k3_setup_install(NULL, &so, err);
		if (rc || !sel->experts)
			return rc;
	}
	rc = k3_model_open(o->dir, &m, &me);
	if (rc)
		return k3_err_set(err, rc, "'%s' does not open as a checkpoint: %s", o->dir, me.msg);
	rc = k3_setup_remote_open(o, m, false, &r, err);
	if (rc == -ENOENT) {
		k3_model_free(m);
		fprintf(o->out, "%s is a full install: every routed expert is on disk\n", o->dir);
		return 0;
	}
	for (uint32_t l = 0; rc == 0 && l < r->layers; l++) {
		if (sel->layers && !sel->layers[l])
			continue;
		for (uint32_t e = 0; rc == 0 && e < r->experts && !sel->n_pairs; e++)
			if (k3_setup_expert_map_get(r->map, l, e) == K3_SETUP_EXPERT_ABSENT)
				rc = k3_setup_remote_want(r, l, e, err);
	}
	for (size_t i = 0, taken = 0; rc == 0 && i < sel->n_pairs && (!sel->limit || taken < sel->limit); i++) {
		if (k3_setup_expert_map_get(r->map, sel->pairs[2 * i], sel->pairs[2 * i + 1]) !=
		    K3_SETUP_EXPERT_ABSENT)
			continue;
		rc = k3_setup_remote_want(r, sel->pairs[2 * i], sel->pairs[2 * i + 1], err);
		taken++;
	}
	if (rc == 0)
		rc = k3_setup_remote_run(r, err);
	k3_setup_remote_stats_get(r, &st);
	if (fetched)
		*fetched = (size_t)st.experts_fetched;
	{
		char b[32];
		k3_setup_bytes_str(st.bytes, b, sizeof(b));
		fprintf(o->out, "fetched %" PRIu64 " routed experts (%s), %" PRIu64 " verified against the"
			" per-expert table; %" PRIu64 " shards verified whole, %" PRIu64 " failed\n",
			st.experts_fetched, b, st.verified_expert, st.shards_verified, st.shards_failed);
	}
	k3_setup_remote_close(r);
	k3_model_free(m);
	return rc;
}

/* ---- k3d ---- */

int k3_setup_stream_status(const char *dir, bool *stream, uint64_t *absent, struct k3_err *err)
{
	struct k3_setup_state *st = NULL;
	struct k3_setup_expert_map *map = NULL;
	int dfd, rc;

	*stream = false;
	*absent = 0;
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return k3_err_set(err, -errno, "cannot open '%s': %s", dir, strerror(errno));
	rc = k3_setup_state_load(dfd, &st, err);
	for (size_t i = 0; rc == 0 && i < st->n; i++)
		if (st->rec[i].have == K3_SETUP_HAVE_SPARSE)
			*stream = true;
	if (rc == 0 && *stream && k3_setup_expert_map_open(dfd, false, &map, NULL) == 0) {
		uint64_t counts[4];
		k3_setup_expert_map_counts(map, counts);
		*absent = counts[K3_SETUP_EXPERT_ABSENT];
		k3_setup_expert_map_close(map);
	}
	k3_setup_state_free(st);
	close(dfd);
	return rc;
}

int64_t k3_setup_remote_read(void *ctx, const struct k3_store_read *rd, uint8_t *dst)
{
	struct k3_setup_remote_reader *rr = ctx;
	struct k3_err err = { 0, "" };
	int rc = k3_setup_remote_ensure_range(rr->remote, rd->file, rd->offset, rd->length, &err);

	if (rc) {
		k3_log_err("expert fetch: %s", err.msg);
		return rc;
	}
	return k3_store_source_pread(rr->src, rd, dst);
}

void k3_setup_remote_describe(struct k3_setup_remote *r, char *buf, size_t size)
{
	struct k3_setup_remote_stats st;

	k3_setup_remote_stats_get(r, &st);
	snprintf(buf, size, "streaming experts: %" PRIu64 " fetched (%.2f GB), %u in flight, %"
		 PRIu64 " shards verified, %" PRIu64 " failed", st.experts_fetched, (double)st.bytes / 1e9,
		 st.in_flight, st.shards_verified, st.failed + st.shards_failed);
}
