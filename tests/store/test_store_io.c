/* The reader pool on its own (store_io.h), with a client that is not the
 * cache: demand jobs start before queued spine jobs and those before
 * prefetch jobs, prefetch never takes the last reader (nor one a running
 * spine job leaves free), a queued job can be taken back (no callback), a
 * running job with pieces stops at the next piece, the check callback's
 * error completes the job, per-class counters add up, and the usual
 * source read lands the file's bytes. Drives: each drive's readers take
 * only its jobs; a guess starts only in idle capacity and pauses between
 * pieces while demand uses its drive (not once promoted); the emulated
 * drive keeps each drive to its own rate and stalls the fraction of
 * requests its seed draws; the measured rate, the prediction and the
 * hedge deadline follow what was read. */
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
	char order[256];      /* job names in start order (the first 255) */
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
	if (t->c->n_started < (int)sizeof(t->c->order) - 1)
		t->c->order[t->c->n_started] = t->name;
	t->c->n_started++;
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

/* A pool of threads readers over drives drives (0: the one default
 * drive), prefetch_cap readers at most for guesses (0: no cap). */
static struct k3_store_io *pool_drives(unsigned drives, unsigned threads, unsigned prefetch_cap)
{
	struct k3_store_io_config cfg = { .threads = threads, .n_drives = drives };
	struct k3_store_io *io = NULL;
	struct k3_err err = { 0 };

	cfg.class_readers[K3_STORE_IO_PREFETCH] = prefetch_cap;
	T_EQ_INT(k3_store_io_new(&cfg, &io, &err), 0);
	return io;
}

static struct k3_store_io *pool(unsigned threads, unsigned prefetch_cap)
{
	return pool_drives(0, threads, prefetch_cap);
}

/* Submits a job from outside the pool lock and waits until n reads sit at
 * the closed gate (the job's among them). */
static void submit_to_gate(struct k3_store_io *io, struct tjob *t, enum k3_store_io_class cls,
			   int n)
{
	k3_store_io_lock(io);
	k3_store_io_submit(io, &t->job, cls);
	k3_store_io_unlock(io);
	wait_blocked(n);
}

/* With the pool lock held: opens the gate and drains the pool; returns
 * with the lock held again, for the checks of what ran. */
static void open_gate_and_drain(struct k3_store_io *io)
{
	k3_store_io_unlock(io);
	gate(false);
	k3_store_io_lock(io);
	k3_store_io_drain(io);
}

/* With the pool lock held: frees the pool and the n jobs' buffers. */
static void pool_end(struct k3_store_io *io, struct tjob *j, int n)
{
	k3_store_io_unlock(io);
	k3_store_io_free(io);
	for (int i = 0; i < n; i++)
		free(j[i].buf);
}

/* With the pool lock held: lets go of it until n reads sit at the gate. */
static void wait_blocked_unlocked(struct k3_store_io *io, int n)
{
	k3_store_io_unlock(io);
	wait_blocked(n);
	k3_store_io_lock(io);
}

/* Locks the pool, holds every class and queues j[i] in the class that
 * the letter classes[i] names (d demand, s spine, p prefetch). Returns
 * with the lock held. */
static void submit_held(struct k3_store_io *io, struct tjob *j, const char *classes)
{
	k3_store_io_lock(io);
	k3_store_io_hold_all(io, true);
	for (int i = 0; classes[i]; i++)
		k3_store_io_submit(io, &j[i].job, classes[i] == 'd'   ? K3_STORE_IO_DEMAND
						  : classes[i] == 's' ? K3_STORE_IO_SPINE
								      : K3_STORE_IO_PREFETCH);
}

/* The body of a test on one pool: called with the pool lock not held,
 * returns with it held (pool_end's contract). */
typedef void pool_test(struct k3_store_io *io, struct client *c, struct tjob *j);

/* Demand first, then prefetch in queue order; a queued job taken back
 * never runs; counters per class. */
static void test_order_and_cancel(struct k3_store_io *io, struct client *c, struct tjob *j)
{
	struct k3_store_io_stats st;

	submit_held(io, j, "pppdd");
	T_EQ_INT(k3_store_io_queued(&j[1].job), K3_STORE_IO_PREFETCH);
	T_EQ_INT(k3_store_io_queued(&j[3].job), K3_STORE_IO_DEMAND);
	T_OK(k3_store_io_first(io, K3_STORE_IO_PREFETCH) == &j[0].job);
	T_OK(k3_store_io_next(io, &j[0].job) == &j[1].job);
	/* b taken back: never started, never called back */
	T_OK(k3_store_io_cancel(io, &j[1].job));
	T_EQ_INT(k3_store_io_queued(&j[1].job), -1);
	T_OK(!k3_store_io_cancel(io, &j[1].job));
	T_OK(k3_store_io_next(io, &j[0].job) == &j[2].job);
	/* held: a drain does not wait for held jobs */
	k3_store_io_drain(io);
	T_EQ_INT(c->n_started, 0);
	k3_store_io_hold_all(io, false);
	k3_store_io_drain(io);
	T_EQ_STR(c->order, "deac");
	T_EQ_INT(c->n_done, 4);
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
}

/* Two readers, prefetch capped at one: with guesses queued, one reader
 * stays free, and a demand job submitted while a guess is being read
 * starts at once instead of behind the other guesses. */
static void test_cap(struct k3_store_io *io, struct client *c, struct tjob *j)
{
	gate(true);
	k3_store_io_lock(io);
	for (int i = 0; i < 3; i++)
		k3_store_io_submit(io, &j[i].job, K3_STORE_IO_PREFETCH);
	wait_blocked_unlocked(io, 1);
	T_EQ_INT(c->n_started, 1);                /* only one guess runs */
	k3_store_io_submit(io, &j[3].job, K3_STORE_IO_DEMAND);
	wait_blocked_unlocked(io, 2);   /* the free reader took the demand job */
	T_EQ_STR(c->order, "pD");
	open_gate_and_drain(io);
	T_EQ_INT(c->n_done, 4);
	T_EQ_INT(c->max_running_prefetch, 1);
}

/* The spine class between demand and prefetch: queued together, demand
 * runs first, then spine, then guesses; and with two readers and the
 * prefetch cap at one, a guess does not start while a spine job holds the
 * other reader (the cap counts both classes), so a demand job arriving
 * then starts at once. */
static void test_spine_class(struct k3_store_io *io, struct client *c, struct tjob *j)
{
	submit_held(io, j, "psdsdp");
	k3_store_io_hold_all(io, false);
	k3_store_io_drain(io);
	T_EQ_STR(c->order, "DdsSpP");
	struct k3_store_io_stats st;
	k3_store_io_stats_get(io, &st);
	T_EQ_U64(st.jobs[K3_STORE_IO_SPINE], 2);
	T_EQ_U64(st.bytes[K3_STORE_IO_SPINE], 2 * 5 * 4096);
}

/* The second half of the spine class check (two readers, the prefetch
 * cap at one). */
static void test_spine_class_cap(struct k3_store_io *io, struct client *c, struct tjob *j)
{
	gate(true);
	k3_store_io_lock(io);
	k3_store_io_submit(io, &j[0].job, K3_STORE_IO_SPINE);
	k3_store_io_submit(io, &j[1].job, K3_STORE_IO_PREFETCH);
	k3_store_io_unlock(io);
	wait_blocked(1);
	nanosleep(&(struct timespec){ 0, 20000000 }, NULL);   /* time for a wrong start */
	k3_store_io_lock(io);
	T_EQ_INT(c->n_started, 1);                /* the guess waits: one reader stays free */
	k3_store_io_submit(io, &j[2].job, K3_STORE_IO_DEMAND);
	wait_blocked_unlocked(io, 2);
	T_EQ_STR(c->order, "SD");
	open_gate_and_drain(io);
	T_EQ_STR(c->order, "SDp");
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
static void test_stop_and_check(struct k3_store_io *io, struct client *c, struct tjob *j)
{
	struct k3_store_io_stats st;

	k3_store_io_lock(io);
	k3_store_io_hold_pieces(io, true);
	k3_store_io_submit(io, &j[0].job, K3_STORE_IO_PREFETCH);
	wait_started(io, c, 1);
	k3_store_io_set_stop(io, &j[0].job, true);
	k3_store_io_hold_pieces(io, false);
	while (!j[0].done)
		k3_store_io_wait(io);
	T_OK(c->stopped[0]);
	T_EQ_INT(c->rc[0], 0);
	T_EQ_U64(c->bytes[0], 4096);

	k3_store_io_hold_pieces(io, true);
	k3_store_io_submit(io, &j[1].job, K3_STORE_IO_PREFETCH);
	wait_started(io, c, 2);
	k3_store_io_set_stop(io, &j[1].job, true);
	k3_store_io_set_stop(io, &j[1].job, false);   /* wanted after all */
	k3_store_io_hold_pieces(io, false);
	while (!j[1].done)
		k3_store_io_wait(io);
	T_OK(!c->stopped[1]);
	T_EQ_U64(c->bytes[1], 5 * 4096);

	c->fail_check = true;
	k3_store_io_submit(io, &j[2].job, K3_STORE_IO_DEMAND);
	k3_store_io_drain(io);
	T_EQ_INT(c->rc[2], -EBADMSG);
	k3_store_io_stats_get(io, &st);
	T_EQ_U64(st.stopped[K3_STORE_IO_PREFETCH], 1);
	T_EQ_U64(st.failed[K3_STORE_IO_DEMAND], 1);
	T_EQ_U64(st.bytes[K3_STORE_IO_PREFETCH], 6 * 4096);
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

static void sleep_ms(int ms)
{
	nanosleep(&(struct timespec){ ms / 1000, (long)(ms % 1000) * 1000000 }, NULL);
}

/* Two drives of one reader each: a job of drive 1 waits for drive 1's
 * reader even while drive 0's is idle, and the queues are walked drive
 * after drive. */
static void test_drives(struct k3_store_io *io, struct client *c, struct tjob *j)
{
	j[0].job.drive = j[1].job.drive = 1;
	T_EQ_INT(k3_store_io_threads(io), 2);
	T_EQ_INT(k3_store_io_drives(io), 2);
	gate(true);
	submit_to_gate(io, &j[0], K3_STORE_IO_DEMAND, 1);
	k3_store_io_lock(io);
	k3_store_io_hold_class(io, K3_STORE_IO_PREFETCH, true);
	k3_store_io_submit(io, &j[1].job, K3_STORE_IO_DEMAND);
	k3_store_io_submit(io, &j[2].job, K3_STORE_IO_PREFETCH);
	T_OK(k3_store_io_first(io, K3_STORE_IO_PREFETCH) == &j[2].job);
	T_OK(k3_store_io_next(io, &j[2].job) == NULL);
	k3_store_io_unlock(io);
	sleep_ms(20);   /* time for a wrong start */
	k3_store_io_lock(io);
	T_EQ_INT(c->n_started, 1);   /* b waits for drive 1; drive 0 has only a held guess */
	struct k3_store_io_drive_info di;
	k3_store_io_drive_info_get(io, 1, &di);
	T_EQ_INT(di.running, 1);
	T_EQ_INT(di.queued, 1);
	T_EQ_U64(di.queued_bytes, 5 * 4096);
	k3_store_io_hold_class(io, K3_STORE_IO_PREFETCH, false);
	open_gate_and_drain(io);
	T_EQ_INT(c->n_done, 3);
	struct k3_store_io_stats st;
	k3_store_io_stats_get(io, &st);
	T_EQ_U64(st.drive[1].jobs[K3_STORE_IO_DEMAND], 2);
	T_EQ_U64(st.drive[0].jobs[K3_STORE_IO_PREFETCH], 1);
	T_EQ_U64(st.drive[0].jobs[K3_STORE_IO_DEMAND], 0);
	T_EQ_U64(st.jobs[K3_STORE_IO_DEMAND], 2);
	T_EQ_U64(st.bytes[K3_STORE_IO_PREFETCH], 5 * 4096);
}

/* A guess only in idle capacity: not while demand runs on its drive, not
 * while demand is queued on any drive; on a drive free of demand when no
 * demand waits anywhere, it starts. */
static void test_idle_capacity(struct k3_store_io *io, struct client *c, struct tjob *j)
{
	j[2].job.drive = 1;
	j[5].job.drive = 1;
	gate(true);
	k3_store_io_lock(io);
	k3_store_io_submit(io, &j[0].job, K3_STORE_IO_DEMAND);    /* D on drive 0 */
	wait_blocked_unlocked(io, 1);
	k3_store_io_submit(io, &j[1].job, K3_STORE_IO_PREFETCH);  /* p on drive 0: D runs there */
	k3_store_io_submit(io, &j[2].job, K3_STORE_IO_PREFETCH);  /* q on drive 1: idle */
	k3_store_io_unlock(io);
	wait_blocked(2);
	sleep_ms(20);
	k3_store_io_lock(io);
	T_EQ_STR(c->order, "Dq");
	/* E takes drive 0's second reader, F waits for one: demand queued,
	 * so r (drive 1, one reader free there) does not start */
	k3_store_io_submit(io, &j[3].job, K3_STORE_IO_DEMAND);
	k3_store_io_submit(io, &j[4].job, K3_STORE_IO_DEMAND);
	wait_blocked_unlocked(io, 3);
	k3_store_io_submit(io, &j[5].job, K3_STORE_IO_PREFETCH);
	k3_store_io_unlock(io);
	sleep_ms(20);
	k3_store_io_lock(io);
	T_EQ_STR(c->order, "DqE");
	open_gate_and_drain(io);
	T_EQ_INT(c->n_done, 6);
	/* F before the guesses waiting behind demand: p and r last */
	T_OK(strchr(c->order, 'F') < strchr(c->order, 'p'));
	T_OK(strchr(c->order, 'F') < strchr(c->order, 'r'));
}

/* Of the jobs "pD": makes j[0] = p a guess read in 4 KiB pieces, held
 * after its first piece, and j[1] = D a demand job at the closed gate;
 * then lifts the hold. Returns with the pool lock held. */
static void guess_held_demand_at_gate(struct k3_store_io *io, struct client *c, struct tjob *j)
{
	j[0].job.piece_bytes = 4096;
	k3_store_io_lock(io);
	k3_store_io_hold_pieces(io, true);
	k3_store_io_submit(io, &j[0].job, K3_STORE_IO_PREFETCH);
	wait_started(io, c, 1);   /* p read its first piece, held before the next */
	k3_store_io_unlock(io);
	gate(true);
	submit_to_gate(io, &j[1], K3_STORE_IO_DEMAND, 1);   /* D runs */
	k3_store_io_lock(io);
	k3_store_io_hold_pieces(io, false);
}

/* A guess read in pieces pauses before its next piece while a demand job
 * runs on its drive and resumes after it; one promoted while paused reads
 * on at once. Its bytes are exactly the whole read's. */
static void pause_case(struct k3_store_io *io, struct client *c, struct tjob *j, bool promote)
{
	struct k3_store_io_stats st;

	guess_held_demand_at_gate(io, c, j);
	if (promote)
		k3_store_io_promote(io, &j[0].job);
	k3_store_io_unlock(io);
	if (promote) {
		wait_blocked(2);   /* p reads on beside D */
		k3_store_io_lock(io);
	} else {
		sleep_ms(30);
		k3_store_io_lock(io);
		T_OK(!j[0].done);  /* paused while D runs */
		k3_store_io_stats_get(io, &st);
		T_EQ_U64(st.drive[0].pauses, 1);
	}
	open_gate_and_drain(io);
	T_EQ_INT(c->n_done, 2);
	T_OK(!c->stopped[0]);
	T_EQ_U64(c->bytes[0], 5 * 4096);
	k3_store_io_stats_get(io, &st);
	T_EQ_U64(st.drive[0].pauses, promote ? 0 : 1);
}

static void test_pause(struct k3_store_io *io, struct client *c, struct tjob *j)
{
	pause_case(io, c, j, false);
}

static void test_pause_promoted(struct k3_store_io *io, struct client *c, struct tjob *j)
{
	pause_case(io, c, j, true);
}

/* A paused guess whose stop flag is set ends at once (not after demand). */
static void test_pause_stop(struct k3_store_io *io, struct client *c, struct tjob *j)
{
	guess_held_demand_at_gate(io, c, j);
	k3_store_io_unlock(io);
	sleep_ms(10);
	k3_store_io_lock(io);
	k3_store_io_set_stop(io, &j[0].job, true);
	while (!j[0].done)
		k3_store_io_wait(io);
	T_OK(c->stopped[0]);
	T_EQ_U64(c->bytes[0], 4096);
	T_OK(!j[1].done);            /* D still at the gate */
	open_gate_and_drain(io);
}

static struct k3_store_read big_rd = { .file = 0, .offset = 0, .length = 1 << 20, .slot_offset = 0 };

/* A read that costs nothing itself: the emulation alone sets its time. */
static int64_t instant_read(void *ctx, const struct k3_store_read *rd, uint8_t *dst)
{
	(void)ctx;
	(void)dst;
	return (int64_t)rd->length;
}

/* The emulated drives: each keeps its own rate (N bytes never before
 * N / rate), the measured rate follows it, the prediction of a read there
 * grows with what is queued; the stalls hit the fraction of requests the
 * seed draws, the same for the same seed. */
static void test_emulated(void)
{
	struct k3_store_io_config cfg = { .threads = 2, .n_drives = 2 };
	struct k3_store_io *io = NULL;
	struct k3_err err = { 0 };
	struct client c = { 0 };
	struct tjob j[8];

	cfg.drive[0].rate_bytes_per_s = 50000000;     /* 50 MB/s: 1 MiB in 21 ms */
	cfg.drive[1].rate_bytes_per_s = 200000000;    /* 200 MB/s: 5.2 ms */
	T_EQ_INT(k3_store_io_new(&cfg, &io, &err), 0);
	if (!io)
		return;
	for (int i = 0; i < 8; i++) {
		tjob_init(&j[i], &c, 'x', i, 0);
		free(j[i].buf);
		T_OK(posix_memalign((void **)&j[i].buf, K3_STORE_ALIGN, 1 << 20) == 0);
		j[i].job.dst = j[i].buf;
		j[i].job.rd = &big_rd;
		j[i].job.read = instant_read;
		j[i].job.drive = i % 2;
	}
	uint64_t t0 = k3_store_io_now_ns();
	k3_store_io_lock(io);
	for (int i = 0; i < 8; i++)
		k3_store_io_submit(io, &j[i].job, K3_STORE_IO_DEMAND);
	/* 4 MiB queued on the slow drive against 4 MiB on the fast one */
	uint64_t p0 = k3_store_io_predict(io, 0, 1 << 20), p1 = k3_store_io_predict(io, 1, 1 << 20);
	T_OK(p0 > p1);
	k3_store_io_drain(io);
	uint64_t dt = k3_store_io_now_ns() - t0;
	/* 4 MiB at 50 MB/s */
	T_OK(dt >= (uint64_t)(4.0 * 1048576 / 50e6 * 1e9));
	struct k3_store_io_stats st;
	k3_store_io_stats_get(io, &st);
	T_OK(st.drive[0].emulated_wait_ns > 0 && st.drive[1].emulated_wait_ns > 0);
	T_EQ_U64(st.drive[0].bytes[K3_STORE_IO_DEMAND], 4 << 20);
	struct k3_store_io_drive_info d0, d1;
	k3_store_io_drive_info_get(io, 0, &d0);
	k3_store_io_drive_info_get(io, 1, &d1);
	printf("measured: drive 0 %.1f MB/s, drive 1 %.1f MB/s\n", d0.rate_bytes_per_s / 1e6,
	       d1.rate_bytes_per_s / 1e6);
	/* never faster than the emulation (how much slower is the machine's load) */
	T_OK(d0.rate_bytes_per_s > 0 && d0.rate_bytes_per_s <= 51000000);
	T_OK(d1.rate_bytes_per_s > 0 && d1.rate_bytes_per_s <= 204000000);
	/* idle now: a read on the fast drive is predicted sooner */
	T_OK(k3_store_io_predict(io, 1, 1 << 20) < k3_store_io_predict(io, 0, 1 << 20));
	k3_store_io_unlock(io);
	k3_store_io_free(io);

	/* stalls: half the requests of drive 0, 5 ms each, the same draw twice */
	uint64_t stalls[2];
	for (int run = 0; run < 2; run++) {
		struct k3_store_io_config sc = { .threads = 1 };
		sc.drive[0].stall_fraction = 0.5;
		sc.drive[0].stall_ns = 5000000;
		sc.drive[0].stall_seed = 7;
		T_EQ_INT(k3_store_io_new(&sc, &io, &err), 0);
		if (!io)
			break;
		t0 = k3_store_io_now_ns();
		k3_store_io_lock(io);
		for (int r = 0; r < 3; r++) {
			for (int i = 0; i < 8; i++) {
				j[i].job.drive = 0;
				j[i].job.rd = &t_rd;
				k3_store_io_submit(io, &j[i].job, K3_STORE_IO_DEMAND);
			}
			k3_store_io_drain(io);
		}
		k3_store_io_stats_get(io, &st);
		stalls[run] = st.drive[0].stalls;
		/* one reader: the stalls add up in time */
		T_OK(k3_store_io_now_ns() - t0 >= stalls[run] * 5000000);
		k3_store_io_unlock(io);
		k3_store_io_free(io);
	}
	printf("stalls: %llu of 24 requests\n", (unsigned long long)stalls[0]);
	T_OK(stalls[0] >= 4 && stalls[0] <= 20);
	T_EQ_U64(stalls[0], stalls[1]);
	for (int i = 0; i < 8; i++)
		free(j[i].buf);
	struct k3_store_io_config bad = { .threads = 1 };
	bad.drive[0].stall_fraction = 1.5;
	T_EQ_INT(k3_store_io_new(&bad, &io, &err), -EINVAL);
	bad.drive[0].stall_fraction = 0;
	bad.n_drives = K3_STORE_IO_MAX_DRIVES + 1;
	T_EQ_INT(k3_store_io_new(&bad, &io, &err), -EINVAL);
}

/* The hedge deadline: none before the drive has its minimum of timed
 * samples, none for an untimed job or a job not running; then start +
 * factor x p95 for the job's size. An untimed job's time is not sampled. */
static void test_hedge_after(void)
{
	struct k3_store_io *io = pool(1, 0);
	struct client c = { 0 };
	struct tjob j[K3_STORE_IO_TIME_MIN_SAMPLES + 1];
	const int n = K3_STORE_IO_TIME_MIN_SAMPLES;

	if (!io)
		return;
	for (int i = 0; i <= n; i++) {
		tjob_init(&j[i], &c, 'h', i % 8, 0);
		j[i].job.timed = true;
	}
	gate(true);
	k3_store_io_lock(io);
	k3_store_io_submit(io, &j[0].job, K3_STORE_IO_DEMAND);
	wait_started(io, &c, 1);
	T_EQ_U64(k3_store_io_hedge_after(io, &j[0].job, 1.5), 0);   /* no samples yet */
	k3_store_io_untime(io, &j[0].job);
	open_gate_and_drain(io);
	for (int i = 1; i < n; i++)
		k3_store_io_submit(io, &j[i].job, K3_STORE_IO_DEMAND);
	k3_store_io_drain(io);
	struct k3_store_io_drive_info di;
	k3_store_io_drive_info_get(io, 0, &di);
	T_EQ_U64(di.p95_ns, 0);          /* n - 1 timed samples: the untimed one left out */
	k3_store_io_submit(io, &j[n - 1].job, K3_STORE_IO_DEMAND);
	k3_store_io_drain(io);
	k3_store_io_drive_info_get(io, 0, &di);
	T_OK(di.p95_ns > 0);
	T_EQ_U64(di.p95_bytes, 5 * 4096);
	k3_store_io_unlock(io);
	gate(true);
	k3_store_io_lock(io);
	k3_store_io_submit(io, &j[n].job, K3_STORE_IO_DEMAND);
	T_EQ_U64(k3_store_io_hedge_after(io, &j[n].job, 1.5), 0);   /* queued, not running */
	wait_started(io, &c, n + 2);   /* j[n - 1] ran twice */
	uint64_t t = k3_store_io_hedge_after(io, &j[n].job, 2.0);
	T_OK(t > j[n].job.t_start_ns);
	T_OK(t - j[n].job.t_start_ns <= 2 * di.p95_ns + 2);
	T_EQ_U64(k3_store_io_hedge_after(io, &j[n].job, 0), 0);     /* hedging off */
	open_gate_and_drain(io);
	pool_end(io, j, n + 1);
}

/* The tests on one pool, each with its pool and jobs (run). */
static const struct pool_case {
	pool_test *test;
	unsigned drives, threads, prefetch_cap;   /* pool_drives' */
	const char *jobs;                         /* one job per letter, its name */
	uint64_t piece;                           /* every job's piece bytes (0: whole) */
} pool_tests[] = {
	{ test_order_and_cancel, 0, 1, 0, "abcde", 0 },
	{ test_cap, 0, 2, 1, "pqrD", 0 },
	{ test_spine_class, 0, 1, 0, "psDSdP", 0 },
	{ test_spine_class_cap, 0, 2, 1, "SpDqrs", 0 },
	{ test_stop_and_check, 0, 1, 0, "xyz", 4096 },
	{ test_drives, 2, 1, 0, "abc", 0 },
	{ test_idle_capacity, 2, 2, 0, "DpqEFr", 0 },
	{ test_pause, 0, 2, 0, "pD", 0 },
	{ test_pause_promoted, 0, 2, 0, "pD", 0 },
	{ test_pause_stop, 0, 2, 0, "pD", 0 },
};

/* Runs one test on a fresh pool with one job per letter of its jobs (at
 * most 8), seen by one client; then ends the pool. */
static void run(const struct pool_case *t)
{
	struct k3_store_io *io = pool_drives(t->drives, t->threads, t->prefetch_cap);
	struct client c = { 0 };
	struct tjob j[8];
	int n = (int)strlen(t->jobs);

	if (!io || n > 8)
		return;
	for (int i = 0; i < n; i++)
		tjob_init(&j[i], &c, t->jobs[i], i, t->piece);
	t->test(io, &c, j);
	pool_end(io, j, n);
}

int main(void)
{
	struct k3_store_io_config bad = { .threads = K3_STORE_IO_MAX_THREADS + 1 };
	struct k3_store_io *io = NULL;
	struct k3_err err = { 0 };

	T_EQ_INT(k3_store_io_new(&bad, &io, &err), -EINVAL);
	T_OK(io == NULL && strstr(err.msg, "at most 16") != NULL);
	for (size_t i = 0; i < sizeof(pool_tests) / sizeof(pool_tests[0]); i++)
		run(&pool_tests[i]);
	test_source_read();
	test_emulated();
	test_hedge_after();
	return t_done();
}
