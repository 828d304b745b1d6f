/* The reader pool on its own (store_io.h), with a client that is not the
 * cache: demand jobs start before queued spine jobs and those before
 * prefetch jobs, prefetch never takes the last reader (nor one a running
 * spine job leaves free), a queued job can be taken back (no callback), a
 * running job with pieces stops at the next piece, the check callback's
 * error completes the job, per-class counters add up, and the usual
 * source read lands the file's bytes. */
#include "t.h"

#include <errno.h>
#include <pthread.h>
#include <time.h>

#include "store/store_io.h"
#include "fixture.h"

/* A fake drive: each read fills its bytes with the file offset's low byte
 * and may be made to block until the test opens the gate. */
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static bool gate_closed;
static int blocked;            /* reads waiting at the gate */

static int64_t fake_read(void *ctx, const struct k3_store_read *rd, uint8_t *dst)
{
	(void)ctx;
	pthread_mutex_lock(&gate_mu);
	blocked++;
	pthread_cond_broadcast(&gate_cv);
	while (gate_closed)
		pthread_cond_wait(&gate_cv, &gate_mu);
	blocked--;
	pthread_mutex_unlock(&gate_mu);
	for (uint64_t b = 0; b < rd->length; b++)
		dst[rd->slot_offset + b] = (uint8_t)(rd->offset + b);
	return (int64_t)rd->length;
}

static void gate(bool closed)
{
	pthread_mutex_lock(&gate_mu);
	gate_closed = closed;
	pthread_cond_broadcast(&gate_cv);
	pthread_mutex_unlock(&gate_mu);
}

/* Waits until n reads sit at the gate. */
static void wait_blocked(int n)
{
	pthread_mutex_lock(&gate_mu);
	while (blocked < n)
		pthread_cond_wait(&gate_cv, &gate_mu);
	pthread_mutex_unlock(&gate_mu);
}

/* What the client saw, written by the callbacks (under the pool lock). */
struct client {
	char order[32];       /* job names in start order */
	int n_started, n_done, running, max_running_prefetch, running_prefetch;
	int rc[8];
	uint64_t bytes[8];
	bool stopped[8];
	bool fail_check;
};

struct tjob {
	struct k3_store_io_job job;
	struct client *c;
	char name;
	int idx;
	bool done;
	uint8_t *buf;
};

static void job_started(struct k3_store_io_job *job)
{
	struct tjob *t = job->owner;
	t->c->order[t->c->n_started++] = t->name;
	if (job->cls == K3_STORE_IO_PREFETCH &&
	    ++t->c->running_prefetch > t->c->max_running_prefetch)
		t->c->max_running_prefetch = t->c->running_prefetch;
}

static int job_checked(struct k3_store_io_job *job)
{
	struct tjob *t = job->owner;
	return t->c->fail_check ? -EBADMSG : 0;
}

static void job_finished(struct k3_store_io_job *job, int rc, uint64_t bytes, bool stopped)
{
	struct tjob *t = job->owner;
	if (job->cls == K3_STORE_IO_PREFETCH)
		t->c->running_prefetch--;
	t->c->rc[t->idx] = rc;
	t->c->bytes[t->idx] = bytes;
	t->c->stopped[t->idx] = stopped;
	t->c->n_done++;
	t->done = true;
}

static const struct k3_store_io_ops t_ops = { job_started, job_checked, job_finished };

static struct k3_store_read t_rd = { .file = 0, .offset = 8192, .length = 5 * 4096, .slot_offset = 0 };

static void tjob_init(struct tjob *t, struct client *c, char name, int idx, uint64_t piece)
{
	memset(t, 0, sizeof(*t));
	T_OK(posix_memalign((void **)&t->buf, K3_STORE_ALIGN, 6 * 4096) == 0);
	t->c = c;
	t->name = name;
	t->idx = idx;
	t->job = (struct k3_store_io_job){ .read = fake_read, .rd = &t_rd, .n_rd = 1, .dst = t->buf,
					   .piece_bytes = piece, .ops = &t_ops, .owner = t };
}

static struct k3_store_io *pool(unsigned threads, unsigned prefetch_cap)
{
	struct k3_store_io_config cfg = { .threads = threads };
	struct k3_store_io *io = NULL;
	struct k3_err err = { 0 };

	cfg.class_readers[K3_STORE_IO_PREFETCH] = prefetch_cap;
	T_EQ_INT(k3_store_io_new(&cfg, &io, &err), 0);
	return io;
}

/* Demand first, then prefetch in queue order; a queued job taken back
 * never runs; counters per class. */
static void test_order_and_cancel(void)
{
	struct k3_store_io *io = pool(1, 0);
	struct client c = { 0 };
	struct tjob j[5];
	struct k3_store_io_stats st;

	if (!io)
		return;
	for (int i = 0; i < 5; i++)
		tjob_init(&j[i], &c, "abcde"[i], i, 0);
	k3_store_io_lock(io);
	k3_store_io_hold_all(io, true);
	k3_store_io_submit(io, &j[0].job, K3_STORE_IO_PREFETCH);
	k3_store_io_submit(io, &j[1].job, K3_STORE_IO_PREFETCH);
	k3_store_io_submit(io, &j[2].job, K3_STORE_IO_PREFETCH);
	k3_store_io_submit(io, &j[3].job, K3_STORE_IO_DEMAND);
	k3_store_io_submit(io, &j[4].job, K3_STORE_IO_DEMAND);
	T_EQ_INT(k3_store_io_queued(&j[1].job), K3_STORE_IO_PREFETCH);
	T_EQ_INT(k3_store_io_queued(&j[3].job), K3_STORE_IO_DEMAND);
	T_OK(k3_store_io_first(io, K3_STORE_IO_PREFETCH) == &j[0].job);
	T_OK(k3_store_io_next(&j[0].job) == &j[1].job);
	/* b taken back: never started, never called back */
	T_OK(k3_store_io_cancel(io, &j[1].job));
	T_EQ_INT(k3_store_io_queued(&j[1].job), -1);
	T_OK(!k3_store_io_cancel(io, &j[1].job));
	T_OK(k3_store_io_next(&j[0].job) == &j[2].job);
	/* held: a drain does not wait for held jobs */
	k3_store_io_drain(io);
	T_EQ_INT(c.n_started, 0);
	k3_store_io_hold_all(io, false);
	k3_store_io_drain(io);
	T_EQ_STR(c.order, "deac");
	T_EQ_INT(c.n_done, 4);
	T_OK(!j[1].done);
	k3_store_io_stats_get(io, &st);
	T_EQ_U64(st.jobs[K3_STORE_IO_DEMAND], 2);
	T_EQ_U64(st.jobs[K3_STORE_IO_PREFETCH], 2);
	T_EQ_U64(st.bytes[K3_STORE_IO_DEMAND], 2 * 5 * 4096);
	T_EQ_U64(st.bytes[K3_STORE_IO_PREFETCH], 2 * 5 * 4096);
	T_EQ_U64(st.failed[K3_STORE_IO_DEMAND] + st.stopped[K3_STORE_IO_PREFETCH], 0);
	/* the bytes landed where the read said */
	T_EQ_INT(j[3].buf[0], (uint8_t)8192);
	T_EQ_INT(j[3].buf[4097], (uint8_t)(8192 + 4097));
	k3_store_io_unlock(io);
	k3_store_io_free(io);
	for (int i = 0; i < 5; i++)
		free(j[i].buf);
}

/* Two readers, prefetch capped at one: with guesses queued, one reader
 * stays free, and a demand job submitted while a guess is being read
 * starts at once instead of behind the other guesses. */
static void test_cap(void)
{
	struct k3_store_io *io = pool(2, 1);
	struct client c = { 0 };
	struct tjob j[4];

	if (!io)
		return;
	for (int i = 0; i < 4; i++)
		tjob_init(&j[i], &c, "pqrD"[i], i, 0);
	gate(true);
	k3_store_io_lock(io);
	for (int i = 0; i < 3; i++)
		k3_store_io_submit(io, &j[i].job, K3_STORE_IO_PREFETCH);
	k3_store_io_unlock(io);
	wait_blocked(1);
	k3_store_io_lock(io);
	T_EQ_INT(c.n_started, 1);                /* only one guess runs */
	k3_store_io_submit(io, &j[3].job, K3_STORE_IO_DEMAND);
	k3_store_io_unlock(io);
	wait_blocked(2);                         /* the free reader took the demand job */
	k3_store_io_lock(io);
	T_EQ_STR(c.order, "pD");
	k3_store_io_unlock(io);
	gate(false);
	k3_store_io_lock(io);
	k3_store_io_drain(io);
	T_EQ_INT(c.n_done, 4);
	T_EQ_INT(c.max_running_prefetch, 1);
	k3_store_io_unlock(io);
	k3_store_io_free(io);
	for (int i = 0; i < 4; i++)
		free(j[i].buf);
}

/* The spine class between demand and prefetch: queued together, demand
 * runs first, then spine, then guesses; and with two readers and the
 * prefetch cap at one, a guess does not start while a spine job holds the
 * other reader (the cap counts both classes), so a demand job arriving
 * then starts at once. */
static void test_spine_class(void)
{
	struct k3_store_io *io = pool(1, 0);
	struct client c = { 0 };
	struct tjob j[6];

	if (!io)
		return;
	for (int i = 0; i < 6; i++)
		tjob_init(&j[i], &c, "psDSdP"[i], i, 0);
	k3_store_io_lock(io);
	k3_store_io_hold_all(io, true);
	k3_store_io_submit(io, &j[0].job, K3_STORE_IO_PREFETCH);
	k3_store_io_submit(io, &j[1].job, K3_STORE_IO_SPINE);
	k3_store_io_submit(io, &j[2].job, K3_STORE_IO_DEMAND);
	k3_store_io_submit(io, &j[3].job, K3_STORE_IO_SPINE);
	k3_store_io_submit(io, &j[4].job, K3_STORE_IO_DEMAND);
	k3_store_io_submit(io, &j[5].job, K3_STORE_IO_PREFETCH);
	k3_store_io_hold_all(io, false);
	k3_store_io_drain(io);
	T_EQ_STR(c.order, "DdsSpP");
	struct k3_store_io_stats st;
	k3_store_io_stats_get(io, &st);
	T_EQ_U64(st.jobs[K3_STORE_IO_SPINE], 2);
	T_EQ_U64(st.bytes[K3_STORE_IO_SPINE], 2 * 5 * 4096);
	k3_store_io_unlock(io);
	k3_store_io_free(io);

	io = pool(2, 1);
	memset(&c, 0, sizeof(c));
	for (int i = 0; i < 6; i++) {
		free(j[i].buf);
		tjob_init(&j[i], &c, "SpDqrs"[i], i, 0);
	}
	if (!io)
		return;
	gate(true);
	k3_store_io_lock(io);
	k3_store_io_submit(io, &j[0].job, K3_STORE_IO_SPINE);
	k3_store_io_submit(io, &j[1].job, K3_STORE_IO_PREFETCH);
	k3_store_io_unlock(io);
	wait_blocked(1);
	nanosleep(&(struct timespec){ 0, 20000000 }, NULL);   /* time for a wrong start */
	k3_store_io_lock(io);
	T_EQ_INT(c.n_started, 1);                /* the guess waits: one reader stays free */
	k3_store_io_submit(io, &j[2].job, K3_STORE_IO_DEMAND);
	k3_store_io_unlock(io);
	wait_blocked(2);
	k3_store_io_lock(io);
	T_EQ_STR(c.order, "SD");
	k3_store_io_unlock(io);
	gate(false);
	k3_store_io_lock(io);
	k3_store_io_drain(io);
	T_EQ_STR(c.order, "SDp");
	k3_store_io_unlock(io);
	k3_store_io_free(io);
	for (int i = 0; i < 6; i++)
		free(j[i].buf);
}

/* Polls (lock held) until n jobs started: a start wakes no waiter. */
static void wait_started(struct k3_store_io *io, const struct client *c, int n)
{
	while (c->n_started < n) {
		k3_store_io_unlock(io);
		nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
		k3_store_io_lock(io);
	}
}

/* A job read in 4 KiB pieces, stopped while held between pieces: it ends
 * there (stopped, the bytes of one piece); cleared before the hold lifts,
 * it reads on. A failing check completes the job with its error. */
static void test_stop_and_check(void)
{
	struct k3_store_io *io = pool(1, 0);
	struct client c = { 0 };
	struct tjob j[3];
	struct k3_store_io_stats st;

	if (!io)
		return;
	for (int i = 0; i < 3; i++)
		tjob_init(&j[i], &c, "xyz"[i], i, 4096);
	k3_store_io_lock(io);
	k3_store_io_hold_pieces(io, true);
	k3_store_io_submit(io, &j[0].job, K3_STORE_IO_PREFETCH);
	wait_started(io, &c, 1);
	k3_store_io_set_stop(io, &j[0].job, true);
	k3_store_io_hold_pieces(io, false);
	while (!j[0].done)
		k3_store_io_wait(io);
	T_OK(c.stopped[0]);
	T_EQ_INT(c.rc[0], 0);
	T_EQ_U64(c.bytes[0], 4096);

	k3_store_io_hold_pieces(io, true);
	k3_store_io_submit(io, &j[1].job, K3_STORE_IO_PREFETCH);
	wait_started(io, &c, 2);
	k3_store_io_set_stop(io, &j[1].job, true);
	k3_store_io_set_stop(io, &j[1].job, false);   /* wanted after all */
	k3_store_io_hold_pieces(io, false);
	while (!j[1].done)
		k3_store_io_wait(io);
	T_OK(!c.stopped[1]);
	T_EQ_U64(c.bytes[1], 5 * 4096);

	c.fail_check = true;
	k3_store_io_submit(io, &j[2].job, K3_STORE_IO_DEMAND);
	k3_store_io_drain(io);
	T_EQ_INT(c.rc[2], -EBADMSG);
	k3_store_io_stats_get(io, &st);
	T_EQ_U64(st.stopped[K3_STORE_IO_PREFETCH], 1);
	T_EQ_U64(st.failed[K3_STORE_IO_DEMAND], 1);
	T_EQ_U64(st.bytes[K3_STORE_IO_PREFETCH], 6 * 4096);
	k3_store_io_unlock(io);
	k3_store_io_free(io);
	for (int i = 0; i < 3; i++)
		free(j[i].buf);
}

/* The usual read (k3_store_io_read_source) lands a shard's bytes, with
 * O_DIRECT and buffered, whole and in pieces. */
static void test_source_read(void)
{
	struct fixture fx;
	struct k3_err err = { 0 };

	if (fx_init(&fx) != 0) {
		printf("skip: no fixture\n");
		return;
	}
	for (int d = 0; d < 2; d++) {
		struct k3_store_source *src = fx_source(&fx, d ? K3_STORE_DIRECT_AUTO
							     : K3_STORE_DIRECT_OFF, &err);
		struct k3_store_io *io = pool(2, 0);
		struct client c = { 0 };
		struct tjob t[2];
		struct k3_store_plan plan;
		if (!src || !io)
			break;
		k3_store_source_plan(src, 5, &plan);
		for (int k = 0; k < 2; k++) {
			tjob_init(&t[k], &c, 'r', k, k ? 4096 : 0);
			free(t[k].buf);
			T_OK(posix_memalign((void **)&t[k].buf, K3_STORE_ALIGN, plan.slot_bytes) == 0);
			t[k].job.read = k3_store_io_read_source;
			t[k].job.read_ctx = src;
			t[k].job.rd = plan.read;
			t[k].job.n_rd = plan.n_reads;
			t[k].job.dst = t[k].buf;
		}
		k3_store_io_lock(io);
		k3_store_io_submit(io, &t[0].job, K3_STORE_IO_DEMAND);
		k3_store_io_submit(io, &t[1].job, K3_STORE_IO_PREFETCH);
		k3_store_io_drain(io);
		k3_store_io_unlock(io);
		for (int k = 0; k < 2; k++) {
			T_EQ_INT(c.rc[k], 0);
			T_OK(c.bytes[k] >= plan.useful_bytes);
			for (int a = 0; a < K3_STORE_ARRAYS; a++)
				T_EQ_MEM(t[k].buf + plan.array_offset[a], fx_array(&fx, 5, a), fx_len[a]);
			free(t[k].buf);
		}
		k3_store_io_free(io);
		k3_store_source_free(src);
	}
	fx_release(&fx);
}

int main(void)
{
	struct k3_store_io_config bad = { .threads = K3_STORE_IO_MAX_THREADS + 1 };
	struct k3_store_io *io = NULL;
	struct k3_err err = { 0 };

	T_EQ_INT(k3_store_io_new(&bad, &io, &err), -EINVAL);
	T_OK(io == NULL && strstr(err.msg, "at most 16") != NULL);
	test_order_and_cancel();
	test_cap();
	test_spine_class();
	test_stop_and_check();
	test_source_read();
	return t_done();
}
