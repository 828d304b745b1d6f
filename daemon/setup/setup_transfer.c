/* setup_transfer.c - the libcurl multi engine (see setup_transfer.h). */
#include "setup/setup_transfer.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "k3_build_config.h"

enum {
	TICK_MS = 200,
	BACKOFF_CAP_MS = 30000,
	RETRY_AFTER_CAP_S = 60,
	RECV_BUFFER = 512 << 10,
};

struct xfer {
	CURL *easy;
	struct curl_slist *headers;
	struct k3_setup_job *job;     /* NULL: idle */
	struct k3_setup_net *net;
	long status;
	bool hdr_done, redirect, fatal, retry_later, have_range;
	int rc;
	unsigned retry_after_s;
	uint64_t req_start, req_end;  /* bytes asked, inclusive end */
	uint64_t cr_start, cr_end, cr_total;
	char range[64];
	struct k3_err err;
};

struct k3_setup_net {
	struct k3_setup_net_opts o;
	char *cacert, *token, *token_host, *user_agent;
	char **allow;
	size_t n_allow;
	CURLM *multi;
	struct xfer x[K3_SETUP_MAX_WORKERS];
	pthread_mutex_t lock;
	struct k3_setup_job *in_head, *in_tail;   /* submitted, under lock */
	struct k3_setup_job *q_head, *q_tail;     /* the engine's queue */
	bool stop;
	struct k3_setup_net_stats st;             /* under lock */
	uint64_t rng;
};

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc;

static void global_init(void)
{
	global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static double mono(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint64_t k3_setup_job_got(const struct k3_setup_job *job)
{
	return __atomic_load_n(&job->got, __ATOMIC_RELAXED);
}

void k3_setup_url_display(const char *url, char *buf, size_t size)
{
	size_t n = strcspn(url, "?#");

	snprintf(buf, size, "%.*s", (int)n, url);
}

/* ---- responses ---- */

static bool header_is(const char *line, size_t n, const char *name, const char **value)
{
	size_t k = strlen(name);

	if (n <= k || strncasecmp(line, name, k) != 0 || line[k] != ':')
		return false;
	*value = line + k + 1;
	while (**value == ' ' || **value == '\t')
		(*value)++;
	return true;
}

static int fail(struct xfer *x, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct xfer *x, int code, const char *fmt, ...)
{
	va_list ap;

	x->fatal = true;
	x->rc = code;
	x->err.code = code;
	va_start(ap, fmt);
	vsnprintf(x->err.msg, sizeof(x->err.msg), fmt, ap);
	va_end(ap);
	return code;
}

static void parse_link(struct xfer *x, const char *v, size_t n)
{
	/* <url>; rel="next" (one of possibly several, comma separated) */
	const char *end = v + n;

	while (v < end) {
		const char *lt = memchr(v, '<', (size_t)(end - v)), *gt, *comma;
		if (!lt || !(gt = memchr(lt, '>', (size_t)(end - lt))))
			return;
		comma = memchr(gt, ',', (size_t)(end - gt));
		if (!comma)
			comma = end;
		for (const char *p = gt; p + 10 <= comma; p++)
			if (strncmp(p, "rel=\"next\"", 10) == 0 && (size_t)(gt - lt - 1) <= K3_SETUP_URL_MAX) {
				snprintf(x->job->next_link, sizeof(x->job->next_link), "%.*s",
					 (int)(gt - lt - 1), lt + 1);
				return;
			}
		v = comma + 1;
	}
}

/* End of a response's headers: decide whether its body is ours. Returns
 * 0 or a negative errno (the transfer is then aborted). */
static int headers_done(struct xfer *x)
{
	struct k3_setup_job *job = x->job;
	bool doc = job->total == 0 && job->length == 0;
	curl_off_t clen = -1;
	char shown[K3_SETUP_URL_MAX + 1];
	long code = 0;

	curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &code);
	curl_easy_getinfo(x->easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &clen);
	x->status = code;
	k3_setup_url_display(job->cur_url, shown, sizeof(shown));
	if (code >= 300 && code < 400) {
		x->redirect = true;
		return 0;
	}
	if (code == 200) {
		if (doc) {
			if (clen > 0 && (uint64_t)clen > job->max_bytes)
				return fail(x, -EFBIG, "%s: %" PRIu64 " bytes is over the %" PRIu64
					    "-byte limit", shown, (uint64_t)clen, job->max_bytes);
			return 0;
		}
		if (clen >= 0 && (uint64_t)clen != job->total)
			return fail(x, -EBADMSG, "manifest mismatch: %s is %" PRIu64 " bytes on the"
				    " server, the inventory pins %" PRIu64, shown, (uint64_t)clen, job->total);
		if (x->req_start != 0 || x->req_end + 1 != job->total) {
			/* the server ignored Range: usable only as a whole-file restart */
			if (!job->ops->restart || job->offset != 0 || job->length != job->total)
				return fail(x, -EPROTO, "%s: the server ignores range requests", shown);
			if (job->ops->restart(job, &x->err) != 0)
				return fail(x, x->err.code ? x->err.code : -EIO, "%s", x->err.msg);
			__atomic_store_n(&job->got, 0, __ATOMIC_RELAXED);
			x->req_start = 0;
		}
		return 0;
	}
	if (code == 206 && !doc) {
		if (!x->have_range || x->cr_start != x->req_start || x->cr_end != x->req_end ||
		    x->cr_total != job->total)
			return fail(x, -EBADMSG, "manifest mismatch: %s answered bytes %" PRIu64 "-%"
				    PRIu64 "/%" PRIu64 " to a request for %" PRIu64 "-%" PRIu64 "/%" PRIu64,
				    shown, x->cr_start, x->cr_end, x->cr_total, x->req_start, x->req_end,
				    job->total);
		if (clen >= 0 && (uint64_t)clen != x->req_end - x->req_start + 1)
			return fail(x, -EBADMSG, "%s: Content-Length %" PRIu64 " does not match its"
				    " Content-Range", shown, (uint64_t)clen);
		return 0;
	}
	if (code == 401 || code == 403)
		return fail(x, -EACCES, "%s: HTTP %ld: the server wants a token with access to this"
			    " repository (set HF_TOKEN or pass --token-file FILE)", shown, code);
	if (code == 404)
		return fail(x, -ENOENT, "%s: HTTP 404: not found (a wrong revision, or a mirror"
			    " without this file)", shown);
	if (code == 416)
		return fail(x, -EBADMSG, "manifest mismatch: %s: HTTP 416: the file on the server is"
			    " shorter than the inventory's %" PRIu64 " bytes", shown, job->total);
	if (code == 429 || code >= 500) {
		x->retry_later = true;
		return -EAGAIN;
	}
	return fail(x, -EPROTO, "%s: unexpected HTTP %ld", shown, code);
}

static size_t on_header(char *line, size_t size, size_t nitems, void *ctx)
{
	struct xfer *x = ctx;
	size_t n = size * nitems;
	const char *v;

	if (n >= 5 && strncmp(line, "HTTP/", 5) == 0) {
		/* a new response (after 1xx): forget the previous one's fields */
		x->hdr_done = x->redirect = x->have_range = false;
		x->retry_after_s = 0;
		return n;
	}
	if (n <= 2 && (line[0] == '\r' || line[0] == '\n')) {
		long code = 0;
		curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &code);
		if (code >= 100 && code < 200)
			return n;
		x->hdr_done = true;
		return headers_done(x) == 0 ? n : 0;
	}
	if (header_is(line, n, "content-range", &v)) {
		unsigned long long a, b, t;
		x->have_range = sscanf(v, "bytes %llu-%llu/%llu", &a, &b, &t) == 3;
		x->cr_start = a, x->cr_end = b, x->cr_total = t;
		if (!x->have_range)
			x->cr_start = x->cr_end = x->cr_total = 0;
	} else if (header_is(line, n, "retry-after", &v)) {
		unsigned s = 0;
		if (sscanf(v, "%u", &s) == 1)
			x->retry_after_s = s > RETRY_AFTER_CAP_S ? RETRY_AFTER_CAP_S : s;
	} else if (header_is(line, n, "link", &v)) {
		parse_link(x, v, n - (size_t)(v - line));
	}
	return n;
}

static size_t on_body(char *buf, size_t size, size_t nitems, void *ctx)
{
	struct xfer *x = ctx;
	struct k3_setup_job *job = x->job;
	size_t n = size * nitems;
	uint64_t room;
	char shown[K3_SETUP_URL_MAX + 1];

	if (!x->hdr_done || (x->status != 200 && x->status != 206))
		return n;   /* a redirect's or an error's body */
	room = job->total == 0 && job->length == 0 ? job->max_bytes - job->got : job->length - job->got;
	if (n > room) {
		k3_setup_url_display(job->cur_url, shown, sizeof(shown));
		fail(x, -EBADMSG, "manifest mismatch: %s sent more bytes than the %" PRIu64 " asked for",
		     shown, job->total == 0 ? job->max_bytes : job->length);
		return 0;
	}
	x->err.code = 0;
	if (job->ops->write(job, job->offset + job->got, buf, n, &x->err) != 0) {
		fail(x, x->err.code ? x->err.code : -EIO, "%s", x->err.msg);
		return 0;
	}
	__atomic_store_n(&job->got, job->got + n, __ATOMIC_RELAXED);
	pthread_mutex_lock(&x->net->lock);
	x->net->st.bytes += n;
	pthread_mutex_unlock(&x->net->lock);
	return n;
}

/* ---- the queue ---- */

static void enqueue(struct k3_setup_net *net, struct k3_setup_job *job)
{
	job->next_queued = NULL;
	if (net->q_tail)
		net->q_tail->next_queued = job;
	else
		net->q_head = job;
	net->q_tail = job;
}

void k3_setup_net_submit(struct k3_setup_net *net, struct k3_setup_job *job)
{
	job->attempt = 1;
	job->redirects = 0;
	job->next_link[0] = '\0';
	job->not_before = 0;
	snprintf(job->cur_url, sizeof(job->cur_url), "%s", job->url);
	job->next_queued = NULL;
	pthread_mutex_lock(&net->lock);
	if (net->in_tail)
		net->in_tail->next_queued = job;
	else
		net->in_head = job;
	net->in_tail = job;
	net->st.queued++;
	pthread_mutex_unlock(&net->lock);
	curl_multi_wakeup(net->multi);
}

static void finish(struct k3_setup_net *net, struct k3_setup_job *job, int rc,
		   const struct k3_err *err)
{
	struct k3_err none = { 0, "" };

	pthread_mutex_lock(&net->lock);
	if (rc)
		net->st.jobs_failed++;
	else
		net->st.jobs_ok++;
	pthread_mutex_unlock(&net->lock);
	job->ops->done(job, rc, rc ? err : &none);
}

static void schedule_retry(struct k3_setup_net *net, struct k3_setup_job *job, int final_rc,
			   unsigned retry_after_s, const char *why)
{
	unsigned delay;
	struct k3_err err;
	char shown[K3_SETUP_URL_MAX + 1];

	if (job->attempt >= net->o.attempts) {
		k3_setup_url_display(job->url, shown, sizeof(shown));
		k3_err_set(&err, final_rc, "%s: gave up after %u attempt%s: %s", shown, job->attempt,
			   job->attempt == 1 ? "" : "s", why);
		finish(net, job, final_rc, &err);
		return;
	}
	delay = net->o.retry_delay_ms;
	for (unsigned i = 1; i < job->attempt && delay < BACKOFF_CAP_MS; i++)
		delay *= 2;
	if (delay > BACKOFF_CAP_MS)
		delay = BACKOFF_CAP_MS;
	/* a little jitter so parallel retries do not arrive in step */
	net->rng ^= net->rng << 13, net->rng ^= net->rng >> 7, net->rng ^= net->rng << 17;
	delay += delay ? (unsigned)(net->rng % (delay / 4 + 1)) : 0;
	if (retry_after_s * 1000u > delay)
		delay = retry_after_s * 1000u;
	job->attempt++;
	job->redirects = 0;
	snprintf(job->cur_url, sizeof(job->cur_url), "%s", job->url);   /* signed URLs expire */
	if (job->total == 0 && job->length == 0) {
		/* a document starts over */
		__atomic_store_n(&job->got, 0, __ATOMIC_RELAXED);
		if (job->ops->restart)
			job->ops->restart(job, NULL);
	}
	job->not_before = mono() + delay / 1000.0;
	pthread_mutex_lock(&net->lock);
	net->st.retries++;
	pthread_mutex_unlock(&net->lock);
	if (job->ops->retry)
		job->ops->retry(job, job->attempt, delay, why);
	enqueue(net, job);
}

static bool start(struct k3_setup_net *net, struct xfer *x, struct k3_setup_job *job)
{
	char host[K3_SETUP_HOST_MAX + 1];
	uint64_t a = job->offset + job->got, b = job->offset + job->length - 1;
	bool doc = job->total == 0 && job->length == 0;

	memset(&x->err, 0, sizeof(x->err));
	x->job = job;
	x->status = 0;
	x->hdr_done = x->redirect = x->fatal = x->retry_later = x->have_range = false;
	x->rc = 0;
	x->retry_after_s = 0;
	job->next_link[0] = '\0';
	if (strncmp(job->cur_url, "https://", 8) != 0 ||
	    k3_setup_url_host(job->cur_url, host, sizeof(host)) != 0) {
		fail(x, -EPERM, "refusing a URL that is not https://");
		return false;
	}
	curl_slist_free_all(x->headers);
	x->headers = NULL;
	if (net->token && strcmp(host, net->token_host) == 0) {
		size_t len = strlen(net->token) + 32;
		char *h = malloc(len);
		if (h) {
			snprintf(h, len, "Authorization: Bearer %s", net->token);
			x->headers = curl_slist_append(NULL, h);
			/* the header is copied by curl; wipe ours */
			memset(h, 0, len);
			free(h);
		}
	}
	curl_easy_setopt(x->easy, CURLOPT_HTTPHEADER, x->headers);
	curl_easy_setopt(x->easy, CURLOPT_URL, job->cur_url);
	if (!doc && (a != 0 || job->length != job->total)) {
		snprintf(x->range, sizeof(x->range), "%" PRIu64 "-%" PRIu64, a, b);
		curl_easy_setopt(x->easy, CURLOPT_RANGE, x->range);
	} else {
		curl_easy_setopt(x->easy, CURLOPT_RANGE, NULL);
	}
	x->req_start = doc ? 0 : a;
	x->req_end = doc ? 0 : b;
	if (curl_multi_add_handle(net->multi, x->easy) != CURLM_OK) {
		fail(x, -EIO, "libcurl refused a transfer");
		return false;
	}
	pthread_mutex_lock(&net->lock);
	net->st.requests++;
	net->st.running++;
	pthread_mutex_unlock(&net->lock);
	return true;
}

static void redirect(struct k3_setup_net *net, struct xfer *x, struct k3_setup_job *job)
{
	char *loc = NULL, host[K3_SETUP_HOST_MAX + 1], shown[K3_SETUP_URL_MAX + 1];
	struct k3_err err;

	curl_easy_getinfo(x->easy, CURLINFO_REDIRECT_URL, &loc);
	k3_setup_url_display(job->cur_url, shown, sizeof(shown));
	if (!loc || strlen(loc) > K3_SETUP_URL_MAX) {
		k3_err_set(&err, -EPROTO, "%s: HTTP %ld without a usable Location", shown, x->status);
		finish(net, job, -EPROTO, &err);
		return;
	}
	if (strncmp(loc, "https://", 8) != 0 || k3_setup_url_host(loc, host, sizeof(host)) != 0) {
		k3_err_set(&err, -EPERM, "%s: redirect to a URL that is not https:// refused", shown);
		finish(net, job, -EPERM, &err);
		return;
	}
	if (!k3_setup_host_allowed(host, net->allow, net->n_allow)) {
		k3_err_set(&err, -EPERM, "%s: redirect to host '%s' refused: not on the allow list"
			   " (the inventory's allow_hosts and the download's own host)", shown, host);
		finish(net, job, -EPERM, &err);
		return;
	}
	if (++job->redirects > net->o.max_redirects) {
		k3_err_set(&err, -EPERM, "%s: more than %u redirects", shown, net->o.max_redirects);
		finish(net, job, -EPERM, &err);
		return;
	}
	snprintf(job->cur_url, sizeof(job->cur_url), "%s", loc);
	job->not_before = 0;
	/* straight back to the front: a redirect is part of the same request */
	job->next_queued = net->q_head;
	net->q_head = job;
	if (!net->q_tail)
		net->q_tail = job;
}

static bool retryable(CURLcode c)
{
	switch (c) {
	case CURLE_PARTIAL_FILE: case CURLE_RECV_ERROR: case CURLE_SEND_ERROR:
	case CURLE_GOT_NOTHING: case CURLE_OPERATION_TIMEDOUT: case CURLE_COULDNT_CONNECT:
	case CURLE_COULDNT_RESOLVE_HOST: case CURLE_HTTP2: case CURLE_HTTP2_STREAM:
	case CURLE_SSL_CONNECT_ERROR:
		return true;
	default:
		return false;
	}
}

static void completed(struct k3_setup_net *net, struct xfer *x, CURLcode res)
{
	struct k3_setup_job *job = x->job;
	char why[256], shown[K3_SETUP_URL_MAX + 1];
	struct k3_err err;

	curl_multi_remove_handle(net->multi, x->easy);
	x->job = NULL;
	pthread_mutex_lock(&net->lock);
	net->st.running--;
	pthread_mutex_unlock(&net->lock);
	if (x->fatal) {
		finish(net, job, x->rc, &x->err);
		return;
	}
	if (res == CURLE_OK && x->redirect) {
		redirect(net, x, job);
		return;
	}
	if (res == CURLE_OK && !x->retry_later) {
		if (!(job->total == 0 && job->length == 0) && job->got < job->length) {
			snprintf(why, sizeof(why), "the body ended after %" PRIu64 " of %" PRIu64 " bytes",
				 job->got, job->length);
			schedule_retry(net, job, -EIO, 0, why);
			return;
		}
		finish(net, job, 0, NULL);
		return;
	}
	if (x->retry_later) {
		snprintf(why, sizeof(why), "HTTP %ld", x->status);
		schedule_retry(net, job, -EIO, x->retry_after_s, why);
		return;
	}
	if (res == CURLE_OPERATION_TIMEDOUT) {
		snprintf(why, sizeof(why), "no byte for %u s (stalled)", net->o.idle_timeout_s);
		schedule_retry(net, job, -ETIMEDOUT, 0, why);
		return;
	}
	if (retryable(res)) {
		snprintf(why, sizeof(why), "%s", curl_easy_strerror(res));
		schedule_retry(net, job, -EIO, 0, why);
		return;
	}
	k3_setup_url_display(job->cur_url, shown, sizeof(shown));
	k3_err_set(&err, res == CURLE_PEER_FAILED_VERIFICATION ? -EPERM : -EIO, "%s: %s%s", shown,
		   curl_easy_strerror(res), res == CURLE_PEER_FAILED_VERIFICATION ?
		   " (the server's certificate is not trusted: see --cacert)" : "");
	finish(net, job, err.code, &err);
}

/* ---- the engine ---- */

static char *dup_or_null(const char *s, bool *oom)
{
	char *c = s ? strdup(s) : NULL;

	if (s && !c)
		*oom = true;
	return c;
}

int k3_setup_net_new(const struct k3_setup_net_opts *o, struct k3_setup_net **out,
		     struct k3_err *err)
{
	struct k3_setup_net *net;
	bool oom = false;

	*out = NULL;
	if (o->workers < 1 || o->workers > K3_SETUP_MAX_WORKERS)
		return k3_err_set(err, -EINVAL, "--workers must be 1..%d", K3_SETUP_MAX_WORKERS);
	if (o->idle_timeout_s < 1 || o->idle_timeout_s > 3600 || o->connect_timeout_s < 1 ||
	    o->connect_timeout_s > 600)
		return k3_err_set(err, -EINVAL, "--idle-timeout must be 1..3600 seconds");
	if (o->attempts < 1 || o->attempts > 100 || o->retry_delay_ms > 60000 || o->max_redirects > 20)
		return k3_err_set(err, -EINVAL, "--retries must be 0..99 and --retry-delay 0..60000 ms");
	if (o->token && (!o->token_host || strpbrk(o->token, "\r\n")))
		return k3_err_set(err, -EINVAL, "a token needs a host and must be one line");
	pthread_once(&global_once, global_init);
	if (global_rc != CURLE_OK)
		return k3_err_set(err, -EIO, "libcurl would not initialize: %s", curl_easy_strerror(global_rc));
	net = calloc(1, sizeof(*net));
	if (!net)
		return k3_err_set(err, -ENOMEM, "out of memory");
	net->o = *o;
	net->cacert = dup_or_null(o->cacert, &oom);
	net->token = dup_or_null(o->token, &oom);
	net->token_host = dup_or_null(o->token_host, &oom);
	net->user_agent = dup_or_null(o->user_agent ? o->user_agent : "k3ctl/" K3_VERSION, &oom);
	net->allow = calloc(o->n_allow_hosts + 1, sizeof(char *));
	oom = oom || !net->allow;
	for (size_t i = 0; !oom && i < o->n_allow_hosts; i++)
		if ((net->allow[i] = dup_or_null(o->allow_hosts[i], &oom)))
			net->n_allow++;
	pthread_mutex_init(&net->lock, NULL);
	net->rng = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)getpid() ^ 0x9e3779b97f4a7c15ull;
	net->multi = oom ? NULL : curl_multi_init();
	if (!net->multi) {
		k3_setup_net_free(net);
		return k3_err_set(err, -ENOMEM, "out of memory");
	}
	curl_multi_setopt(net->multi, CURLMOPT_PIPELINING, CURLPIPE_NOTHING);
	curl_multi_setopt(net->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)o->workers);
	for (unsigned i = 0; i < o->workers; i++) {
		struct xfer *x = &net->x[i];
		CURL *e = curl_easy_init();
		if (!e) {
			k3_setup_net_free(net);
			return k3_err_set(err, -ENOMEM, "out of memory");
		}
		x->easy = e;
		x->net = net;
		curl_easy_setopt(e, CURLOPT_PRIVATE, x);
		curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
		curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "https");
		curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "https");
		curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
		curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
		curl_easy_setopt(e, CURLOPT_SSLVERSION, (long)CURL_SSLVERSION_TLSv1_2);
		curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 1L);
		curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 2L);
		if (net->cacert) {
			curl_easy_setopt(e, CURLOPT_CAINFO, net->cacert);
			curl_easy_setopt(e, CURLOPT_CAPATH, NULL);
		}
		curl_easy_setopt(e, CURLOPT_USERAGENT, net->user_agent);
		curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, (long)o->connect_timeout_s);
		curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
		curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, (long)o->idle_timeout_s);
		curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
		curl_easy_setopt(e, CURLOPT_BUFFERSIZE, (long)RECV_BUFFER);
		curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
		curl_easy_setopt(e, CURLOPT_HEADERDATA, x);
		curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
		curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
	}
	*out = net;
	return 0;
}

void k3_setup_net_free(struct k3_setup_net *net)
{
	if (!net)
		return;
	for (unsigned i = 0; i < K3_SETUP_MAX_WORKERS; i++) {
		if (!net->x[i].easy)
			continue;
		if (net->x[i].job)
			curl_multi_remove_handle(net->multi, net->x[i].easy);
		curl_easy_cleanup(net->x[i].easy);
		curl_slist_free_all(net->x[i].headers);
	}
	if (net->multi)
		curl_multi_cleanup(net->multi);
	if (net->token) {
		memset(net->token, 0, strlen(net->token));
		free(net->token);
	}
	free(net->cacert);
	free(net->token_host);
	free(net->user_agent);
	for (size_t i = 0; i < net->n_allow; i++)
		free(net->allow[i]);
	free(net->allow);
	pthread_mutex_destroy(&net->lock);
	free(net);
}

void k3_setup_net_stop(struct k3_setup_net *net)
{
	pthread_mutex_lock(&net->lock);
	net->stop = true;
	pthread_mutex_unlock(&net->lock);
	curl_multi_wakeup(net->multi);
}

void k3_setup_net_stats_get(struct k3_setup_net *net, struct k3_setup_net_stats *st)
{
	pthread_mutex_lock(&net->lock);
	*st = net->st;
	pthread_mutex_unlock(&net->lock);
}

/* Starts queued jobs that are due on idle transfers; returns seconds until
 * the next delayed one (or a large number). */
static double start_due(struct k3_setup_net *net)
{
	double now = mono(), wait = 1e9;
	struct k3_setup_job **pp = &net->q_head, *prev = NULL;

	while (*pp) {
		struct k3_setup_job *job = *pp;
		struct xfer *idle = NULL;
		if (job->not_before > now) {
			if (job->not_before - now < wait)
				wait = job->not_before - now;
			prev = job;
			pp = &job->next_queued;
			continue;
		}
		for (unsigned i = 0; i < net->o.workers && !idle; i++)
			if (!net->x[i].job)
				idle = &net->x[i];
		if (!idle)
			break;
		*pp = job->next_queued;
		if (net->q_tail == job)
			net->q_tail = prev;
		job->next_queued = NULL;
		if (job->length == 0 && job->total != 0) {
			finish(net, job, 0, NULL);   /* nothing to fetch */
			continue;
		}
		if (!start(net, idle, job)) {
			idle->job = NULL;
			finish(net, job, idle->rc, &idle->err);
		}
	}
	return wait;
}

int k3_setup_net_run(struct k3_setup_net *net, bool persistent, void (*tick)(void *ctx),
		     void *ctx)
{
	double last_tick = mono();
	int running = 0;

	for (;;) {
		struct k3_setup_job *in;
		CURLMsg *msg;
		int left;
		double wait;
		bool stop;

		pthread_mutex_lock(&net->lock);
		in = net->in_head;
		net->in_head = net->in_tail = NULL;
		stop = net->stop;
		net->stop = false;
		pthread_mutex_unlock(&net->lock);
		while (in) {
			struct k3_setup_job *next = in->next_queued;
			pthread_mutex_lock(&net->lock);
			net->st.queued--;
			pthread_mutex_unlock(&net->lock);
			enqueue(net, in);
			in = next;
		}
		if (persistent && stop)
			return 0;
		wait = start_due(net);
		if (curl_multi_perform(net->multi, &running) != CURLM_OK)
			return -EIO;
		while ((msg = curl_multi_info_read(net->multi, &left)) != NULL) {
			struct xfer *x = NULL;
			if (msg->msg != CURLMSG_DONE)
				continue;
			curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&x);
			completed(net, x, msg->data.result);
		}
		if (tick && mono() - last_tick >= TICK_MS / 1000.0) {
			last_tick = mono();
			tick(ctx);
		}
		pthread_mutex_lock(&net->lock);
		bool idle = !net->in_head && net->st.running == 0;
		pthread_mutex_unlock(&net->lock);
		if (!persistent && idle && !net->q_head)
			return 0;
		if (net->q_head && wait <= 0)
			continue;
		{
			int ms = TICK_MS;
			if (wait * 1000 < ms)
				ms = wait <= 0 ? 0 : (int)(wait * 1000) + 1;
			if (curl_multi_poll(net->multi, NULL, 0, ms, NULL) != CURLM_OK)
				return -EIO;
		}
	}
}

/* ---- small documents ---- */

struct doc {
	struct k3_setup_job job;
	char *buf;
	size_t len, cap, max;
	int rc;
	struct k3_err err;
	bool done;
};

static int doc_write(struct k3_setup_job *job, uint64_t off, const void *p, size_t n,
		     struct k3_err *err)
{
	struct doc *d = (struct doc *)job;

	(void)off;
	if (d->len + n > d->max)
		return k3_err_set(err, -EFBIG, "the document is over %zu bytes", d->max);
	if (d->len + n + 1 > d->cap) {
		size_t cap = d->cap ? d->cap * 2 : 65536;
		char *b;
		while (cap < d->len + n + 1)
			cap *= 2;
		b = realloc(d->buf, cap);
		if (!b)
			return k3_err_set(err, -ENOMEM, "out of memory");
		d->buf = b;
		d->cap = cap;
	}
	memcpy(d->buf + d->len, p, n);
	d->len += n;
	d->buf[d->len] = '\0';
	return 0;
}

static int doc_restart(struct k3_setup_job *job, struct k3_err *err)
{
	(void)err;
	((struct doc *)job)->len = 0;
	return 0;
}

static void doc_done(struct k3_setup_job *job, int rc, const struct k3_err *err)
{
	struct doc *d = (struct doc *)job;

	d->rc = rc;
	if (rc)
		d->err = *err;
	d->done = true;
}

int k3_setup_net_fetch(struct k3_setup_net *net, const char *url, uint64_t offset,
		       uint64_t length, uint64_t total, size_t max, char **body, size_t *len,
		       char *next_link, struct k3_err *err)
{
	static const struct k3_setup_job_ops ops = { doc_write, doc_restart, NULL, doc_done };
	struct doc *d = calloc(1, sizeof(*d));
	int rc;

	*body = NULL;
	*len = 0;
	if (next_link)
		next_link[0] = '\0';
	if (!d)
		return k3_err_set(err, -ENOMEM, "out of memory");
	if (strlen(url) > K3_SETUP_URL_MAX) {
		free(d);
		return k3_err_set(err, -EINVAL, "URL too long");
	}
	snprintf(d->job.url, sizeof(d->job.url), "%s", url);
	d->job.offset = length ? offset : 0;
	d->job.length = length;
	d->job.total = length ? total : 0;
	d->job.max_bytes = length ? length : max;
	d->job.ops = &ops;
	d->max = length ? (size_t)length : max;
	k3_setup_net_submit(net, &d->job);
	rc = k3_setup_net_run(net, false, NULL, NULL);
	if (rc == 0 && !d->done)
		rc = k3_err_set(err, -EIO, "the transfer did not finish");
	else if (rc == 0 && d->rc) {
		rc = d->rc;
		if (err)
			*err = d->err;
	}
	if (rc == 0) {
		if (!d->buf && !(d->buf = calloc(1, 1)))
			rc = k3_err_set(err, -ENOMEM, "out of memory");
		*body = d->buf;
		*len = d->len;
		if (next_link)
			snprintf(next_link, K3_SETUP_URL_MAX + 1, "%s", d->job.next_link);
		d->buf = NULL;
	}
	free(d->buf);
	free(d);
	return rc;
}
