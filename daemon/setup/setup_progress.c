/* setup_progress.c - bars, lines and JSON events of a download (see setup_progress.h). */
#include "setup/setup_progress.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

enum { BAR = 28, MAX_BARS = 8 };
#define TTY_PERIOD 0.2
#define PLAIN_PERIOD 10.0
#define JSON_PERIOD 1.0

enum file_state { F_PENDING, F_RUNNING, F_DONE, F_FAILED };

struct pfile {
	char *name;
	uint64_t size, have, have_at_start;
	enum file_state state;
	uint64_t last_have;
	double rate;        /* bytes/s, smoothed */
};

struct k3_setup_progress {
	enum k3_setup_progress_mode mode;
	FILE *out, *json;
	struct pfile *f;
	size_t n, cap;
	uint64_t total, to_fetch;
	double t0, last_draw, last_rate;
	uint64_t fetched_at_last_rate;
	double rate;
	int drawn_lines;
	size_t done, failed;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void k3_setup_bytes_str(uint64_t n, char *buf, size_t size)
{
	if (n >= 1000000000000ull)
		snprintf(buf, size, "%.2f TB", (double)n / 1e12);
	else if (n >= 1000000000ull)
		snprintf(buf, size, "%.2f GB", (double)n / 1e9);
	else if (n >= 1000000ull)
		snprintf(buf, size, "%.1f MB", (double)n / 1e6);
	else if (n >= 1000ull)
		snprintf(buf, size, "%.1f kB", (double)n / 1e3);
	else
		snprintf(buf, size, "%" PRIu64 " B", n);
}

static void eta_str(double seconds, char *buf, size_t size)
{
	if (seconds < 0 || seconds > 360000 || seconds != seconds)
		snprintf(buf, size, "--");
	else if (seconds >= 3600)
		snprintf(buf, size, "%dh%02dm", (int)seconds / 3600, (int)seconds % 3600 / 60);
	else if (seconds >= 60)
		snprintf(buf, size, "%dm%02ds", (int)seconds / 60, (int)seconds % 60);
	else
		snprintf(buf, size, "%ds", (int)seconds);
}

struct k3_setup_progress *k3_setup_progress_new(enum k3_setup_progress_mode mode, FILE *text_out,
						FILE *json_out)
{
	struct k3_setup_progress *pr = calloc(1, sizeof(*pr));

	if (!pr)
		return NULL;
	if (mode == K3_SETUP_PROGRESS_AUTO)
		mode = isatty(fileno(text_out)) ? K3_SETUP_PROGRESS_TTY : K3_SETUP_PROGRESS_PLAIN;
	pr->mode = mode;
	pr->out = text_out;
	pr->json = json_out;
	pr->t0 = pr->last_draw = pr->last_rate = now_s();
	return pr;
}

void k3_setup_progress_free(struct k3_setup_progress *pr)
{
	if (!pr)
		return;
	for (size_t i = 0; i < pr->n; i++)
		free(pr->f[i].name);
	free(pr->f);
	free(pr);
}

/* One JSON event: {"event": name, ...fields}; steals fields. */
static void emit(struct k3_setup_progress *pr, const char *event, json_t *fields)
{
	json_t *o = json_object();
	char *s;

	if (!o || pr->mode != K3_SETUP_PROGRESS_JSON) {
		json_decref(o);
		json_decref(fields);
		return;
	}
	json_object_set_new(o, "event", json_string(event));
	json_object_set_new(o, "t", json_real(now_s() - pr->t0));
	if (fields)
		json_object_update(o, fields);
	json_decref(fields);
	s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
	if (s) {
		fprintf(pr->json, "%s\n", s);
		fflush(pr->json);
		free(s);
	}
	json_decref(o);
}

static uint64_t fetched(const struct k3_setup_progress *pr)
{
	uint64_t n = 0;

	for (size_t i = 0; i < pr->n; i++)
		n += pr->f[i].have - pr->f[i].have_at_start;
	return n;
}

static uint64_t present(const struct k3_setup_progress *pr)
{
	uint64_t n = 0;

	for (size_t i = 0; i < pr->n; i++)
		n += pr->f[i].have;
	return n;
}

void k3_setup_progress_plan(struct k3_setup_progress *pr, size_t files, uint64_t bytes_total,
			    uint64_t bytes_to_fetch, uint64_t free_bytes, uint64_t peak_bytes)
{
	pr->total = bytes_total;
	pr->to_fetch = bytes_to_fetch;
	emit(pr, "plan", json_pack("{sI sI sI sI sI}", "files", (json_int_t)files,
				   "bytes_total", (json_int_t)bytes_total,
				   "bytes_to_fetch", (json_int_t)bytes_to_fetch,
				   "free_bytes", (json_int_t)free_bytes,
				   "peak_bytes", (json_int_t)peak_bytes));
}

size_t k3_setup_progress_add(struct k3_setup_progress *pr, const char *name, uint64_t size,
			     uint64_t have)
{
	struct pfile *f;

	if (pr->n == pr->cap) {
		size_t cap = pr->cap ? pr->cap * 2 : 64;
		struct pfile *v = realloc(pr->f, cap * sizeof(*v));
		if (!v)
			return (size_t)-1;
		pr->f = v;
		pr->cap = cap;
	}
	f = &pr->f[pr->n];
	memset(f, 0, sizeof(*f));
	f->name = strdup(name);
	if (!f->name)
		return (size_t)-1;
	f->size = size;
	f->have = f->have_at_start = f->last_have = have;
	return pr->n++;
}

void k3_setup_progress_start(struct k3_setup_progress *pr, size_t id)
{
	struct pfile *f = &pr->f[id];

	f->state = F_RUNNING;
	emit(pr, "start", json_pack("{ss sI sI}", "file", f->name, "bytes", (json_int_t)f->size,
				    "resume_from", (json_int_t)f->have));
}

void k3_setup_progress_update(struct k3_setup_progress *pr, size_t id, uint64_t have)
{
	struct pfile *f = &pr->f[id];

	if (have < f->have_at_start)
		f->have_at_start = have;   /* a restart from byte 0 */
	f->have = have > f->size ? f->size : have;
}

void k3_setup_progress_retry(struct k3_setup_progress *pr, size_t id, unsigned attempt,
			     unsigned delay_ms, const char *why)
{
	struct pfile *f = &pr->f[id];

	emit(pr, "retry", json_pack("{ss si si ss}", "file", f->name, "attempt", (int)attempt,
				    "delay_ms", (int)delay_ms, "reason", why));
	if (pr->mode == K3_SETUP_PROGRESS_PLAIN || pr->mode == K3_SETUP_PROGRESS_TTY) {
		if (pr->mode == K3_SETUP_PROGRESS_TTY && pr->drawn_lines) {
			fprintf(pr->out, "\033[%dA\033[J", pr->drawn_lines);
			pr->drawn_lines = 0;
		}
		fprintf(pr->out, "%s: %s; retry %u in %.1f s\n", f->name, why, attempt - 1,
			delay_ms / 1000.0);
	}
}

static void clear_bars(struct k3_setup_progress *pr)
{
	if (pr->mode == K3_SETUP_PROGRESS_TTY && pr->drawn_lines) {
		fprintf(pr->out, "\033[%dA\033[J", pr->drawn_lines);
		pr->drawn_lines = 0;
	}
}

void k3_setup_progress_done(struct k3_setup_progress *pr, size_t id, const char *sha_hex)
{
	struct pfile *f = &pr->f[id];
	char b[32];

	f->state = F_DONE;
	f->have = f->size;
	pr->done++;
	emit(pr, "verified", sha_hex ? json_pack("{ss sI ss}", "file", f->name, "bytes",
						 (json_int_t)f->size, "sha256", sha_hex)
				     : json_pack("{ss sI}", "file", f->name, "bytes", (json_int_t)f->size));
	if (pr->mode == K3_SETUP_PROGRESS_PLAIN || pr->mode == K3_SETUP_PROGRESS_TTY) {
		clear_bars(pr);
		k3_setup_bytes_str(f->size, b, sizeof(b));
		fprintf(pr->out, "%s %s (%s)\n", sha_hex ? "verified" : "fetched", f->name, b);
	}
}

void k3_setup_progress_fail(struct k3_setup_progress *pr, size_t id, const char *msg)
{
	struct pfile *f = &pr->f[id];

	f->state = F_FAILED;
	pr->failed++;
	emit(pr, "failed", json_pack("{ss ss}", "file", f->name, "message", msg));
	if (pr->mode == K3_SETUP_PROGRESS_PLAIN || pr->mode == K3_SETUP_PROGRESS_TTY) {
		clear_bars(pr);
		fprintf(pr->out, "failed %s: %s\n", f->name, msg);
	}
}

static void bar(FILE *out, const char *label, uint64_t have, uint64_t size, double rate)
{
	char hb[32], sb[32], rb[32], eb[32], line[BAR + 1];
	double frac = size ? (double)have / (double)size : 1.0;
	int fill = (int)(frac * BAR);

	for (int i = 0; i < BAR; i++)
		line[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
	line[BAR] = '\0';
	k3_setup_bytes_str(have, hb, sizeof(hb));
	k3_setup_bytes_str(size, sb, sizeof(sb));
	k3_setup_bytes_str((uint64_t)rate, rb, sizeof(rb));
	eta_str(rate > 0 ? (double)(size - have) / rate : -1, eb, sizeof(eb));
	fprintf(out, "\033[K%-34.34s [%s] %5.1f%% %s/%s %s/s ETA %s\n", label, line, 100 * frac, hb,
		sb, rb, eb);
}

static void update_rates(struct k3_setup_progress *pr, double t)
{
	double dt = t - pr->last_rate;
	uint64_t now = fetched(pr);

	if (dt < 0.5)
		return;
	pr->rate = 0.6 * pr->rate + 0.4 * (double)(now - pr->fetched_at_last_rate) / dt;
	pr->fetched_at_last_rate = now;
	for (size_t i = 0; i < pr->n; i++) {
		struct pfile *f = &pr->f[i];
		f->rate = 0.6 * f->rate + 0.4 * (double)(f->have - f->last_have) / dt;
		f->last_have = f->have;
	}
	pr->last_rate = t;
}

void k3_setup_progress_tick(struct k3_setup_progress *pr)
{
	double t = now_s(), period = pr->mode == K3_SETUP_PROGRESS_TTY ? TTY_PERIOD :
				     pr->mode == K3_SETUP_PROGRESS_JSON ? JSON_PERIOD : PLAIN_PERIOD;
	uint64_t have = present(pr);
	size_t running = 0;

	update_rates(pr, t);
	if (pr->mode == K3_SETUP_PROGRESS_QUIET || t - pr->last_draw < period)
		return;
	pr->last_draw = t;
	for (size_t i = 0; i < pr->n; i++)
		running += pr->f[i].state == F_RUNNING;
	if (pr->mode == K3_SETUP_PROGRESS_JSON) {
		for (size_t i = 0; i < pr->n; i++)
			if (pr->f[i].state == F_RUNNING)
				emit(pr, "progress", json_pack("{ss sI sI sf}", "file", pr->f[i].name,
							       "have", (json_int_t)pr->f[i].have,
							       "bytes", (json_int_t)pr->f[i].size,
							       "rate", pr->f[i].rate));
		emit(pr, "total", json_pack("{sI sI sI sf si}", "have", (json_int_t)have, "bytes",
					    (json_int_t)pr->total, "fetched", (json_int_t)fetched(pr),
					    "rate", pr->rate, "running", (int)running));
		return;
	}
	if (pr->mode == K3_SETUP_PROGRESS_PLAIN) {
		char hb[32], tb[32], rb[32], eb[32];
		k3_setup_bytes_str(have, hb, sizeof(hb));
		k3_setup_bytes_str(pr->total, tb, sizeof(tb));
		k3_setup_bytes_str((uint64_t)pr->rate, rb, sizeof(rb));
		eta_str(pr->rate > 0 ? (double)(pr->total - have) / pr->rate : -1, eb, sizeof(eb));
		fprintf(pr->out, "%.1f%% (%s of %s), %s/s, ETA %s; %zu file%s in flight\n",
			pr->total ? 100.0 * (double)have / (double)pr->total : 100.0, hb, tb, rb, eb,
			running, running == 1 ? "" : "s");
		fflush(pr->out);
		return;
	}
	clear_bars(pr);
	for (size_t i = 0, shown = 0; i < pr->n && shown < MAX_BARS; i++)
		if (pr->f[i].state == F_RUNNING) {
			bar(pr->out, pr->f[i].name, pr->f[i].have, pr->f[i].size, pr->f[i].rate);
			shown++;
			pr->drawn_lines++;
		}
	bar(pr->out, "total", have, pr->total, pr->rate);
	pr->drawn_lines++;
	fflush(pr->out);
}

void k3_setup_progress_end(struct k3_setup_progress *pr, bool ok, const char *msg)
{
	char fb[32];
	double secs = now_s() - pr->t0;
	uint64_t got = fetched(pr);

	clear_bars(pr);
	emit(pr, "done", json_pack("{sb si si sI sf ss}", "ok", ok, "files_verified", (int)pr->done,
				   "files_failed", (int)pr->failed, "bytes_fetched", (json_int_t)got,
				   "seconds", secs, "message", msg ? msg : ""));
	if (pr->mode == K3_SETUP_PROGRESS_PLAIN || pr->mode == K3_SETUP_PROGRESS_TTY) {
		k3_setup_bytes_str(got, fb, sizeof(fb));
		if (pr->n)
			fprintf(pr->out, "%s: %zu file%s verified, %s fetched in %.1f s%s%s\n",
				ok ? "done" : "stopped", pr->done, pr->done == 1 ? "" : "s", fb, secs,
				msg && *msg ? "; " : "", msg ? msg : "");
		fflush(pr->out);
	}
}
