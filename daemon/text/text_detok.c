/* text_detok.c - streaming detokenizer (see text_detok.h). */
#include "text/text_detok.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "k3_limits.h"

struct k3_detok {
	const struct k3_tok *tok;
	unsigned flags;
	char *stops[K3_LIM_STOP_COUNT];
	size_t stop_len[K3_LIM_STOP_COUNT];
	size_t n_stops;
	struct k3_sbuf raw;     /* bytes not yet valid UTF-8 (<= 3 + one token) */
	struct k3_sbuf held;    /* valid UTF-8 held back for stop matching */
	struct k3_sbuf out;     /* what the last call emitted */
	bool stopped;
};

static const char fffd[] = "\xef\xbf\xbd";

size_t k3_utf8_take(const uint8_t *in, size_t n, bool final, struct k3_sbuf *out)
{
	size_t i = 0, run = 0;

	while (i < n) {
		uint8_t c = in[i];
		size_t need, k;
		uint8_t lo = 0x80, hi = 0xbf;

		if (c < 0x80) {
			i++;
			run++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf)
			need = 2;
		else if (c >= 0xe0 && c <= 0xef) {
			need = 3;
			if (c == 0xe0) lo = 0xa0;
			if (c == 0xed) hi = 0x9f;
		} else if (c >= 0xf0 && c <= 0xf4) {
			need = 4;
			if (c == 0xf0) lo = 0x90;
			if (c == 0xf4) hi = 0x8f;
		} else {
			k3_sbuf_add(out, in + i - run, run);
			run = 0;
			k3_sbuf_add(out, fffd, 3);
			i++;
			continue;
		}
		for (k = 1; k < need && i + k < n; k++) {
			uint8_t b = in[i + k];
			if (k == 1 ? (b < lo || b > hi) : (b & 0xc0) != 0x80)
				break;
		}
		if (k == need) {
			i += need;
			run += need;
			continue;
		}
		if (i + k == n && !final) {
			/* a valid prefix cut by the end: keep it for later */
			break;
		}
		/* maximal invalid subpart: the valid prefix i..i+k */
		k3_sbuf_add(out, in + i - run, run);
		run = 0;
		k3_sbuf_add(out, fffd, 3);
		i += k;
	}
	k3_sbuf_add(out, in + i - run, run);
	return i;
}

int k3_detok_new(const struct k3_tok *tok, const char *const *stops, const size_t *stop_lens,
		 size_t n_stops, unsigned flags, struct k3_detok **out, struct k3_err *err)
{
	struct k3_detok *d;

	if (n_stops > K3_LIM_STOP_COUNT)
		return k3_err_set(err, -EINVAL, "%zu stop strings; at most %u are allowed", n_stops, K3_LIM_STOP_COUNT);
	for (size_t i = 0; i < n_stops; i++)
		if (stop_lens[i] == 0 || stop_lens[i] > K3_LIM_STOP_BYTES)
			return k3_err_set(err, -EINVAL, "stop string %zu must be 1..%u bytes", i, K3_LIM_STOP_BYTES);
	d = calloc(1, sizeof(*d));
	if (!d)
		return k3_err_set(err, -ENOMEM, "out of memory");
	d->tok = tok;
	d->flags = flags;
	for (size_t i = 0; i < n_stops; i++) {
		d->stops[i] = malloc(stop_lens[i]);
		if (!d->stops[i]) {
			k3_detok_free(d);
			return k3_err_set(err, -ENOMEM, "out of memory");
		}
		memcpy(d->stops[i], stops[i], stop_lens[i]);
		d->stop_len[i] = stop_lens[i];
		d->n_stops++;
	}
	*out = d;
	return 0;
}

void k3_detok_free(struct k3_detok *d)
{
	if (!d)
		return;
	for (size_t i = 0; i < d->n_stops; i++)
		free(d->stops[i]);
	k3_sbuf_release(&d->raw);
	k3_sbuf_release(&d->held);
	k3_sbuf_release(&d->out);
	free(d);
}

/* Moves held text to out, except a tail that may start a stop string;
 * detects a completed stop string. */
static void settle(struct k3_detok *d, bool final)
{
	const char *h = d->held.p;
	size_t n = d->held.n, cut = n, keep;

	if (!n)
		return;
	/* earliest completed stop string */
	for (size_t s = 0; s < d->n_stops; s++) {
		const char *m = memmem(h, n, d->stops[s], d->stop_len[s]);
		if (m && (size_t)(m - h) < cut) {
			cut = (size_t)(m - h);
			d->stopped = true;
		}
	}
	if (d->stopped) {
		k3_sbuf_add(&d->out, h, cut);
		d->held.n = 0;
		return;
	}
	keep = 0;
	if (!final) {
		/* longest suffix that is a proper prefix of some stop string */
		for (size_t s = 0; s < d->n_stops; s++) {
			size_t max = d->stop_len[s] - 1 < n ? d->stop_len[s] - 1 : n;
			for (size_t k = max; k > keep; k--) {
				if (memcmp(h + n - k, d->stops[s], k) == 0) {
					keep = k;
					break;
				}
			}
		}
	}
	k3_sbuf_add(&d->out, h, n - keep);
	memmove(d->held.p, h + n - keep, keep);
	d->held.n = keep;
}

int k3_detok_feed(struct k3_detok *d, uint32_t id, const char **text, size_t *len)
{
	const uint8_t *b;
	size_t n, used;

	d->out.n = 0;
	k3_sbuf_add(&d->out, "", 0);
	*text = d->out.p ? d->out.p : "";
	*len = 0;
	if (k3_tok_id_bytes(d->tok, id, &b, &n))
		return -ERANGE;
	if (d->stopped)
		return 1;
	if ((d->flags & K3_DETOK_SKIP_SPECIAL) && k3_tok_is_special(d->tok, id))
		n = 0;
	k3_sbuf_add(&d->raw, b, n);
	used = k3_utf8_take((const uint8_t *)d->raw.p, d->raw.n, false, &d->held);
	memmove(d->raw.p, d->raw.p + used, d->raw.n - used);
	d->raw.n -= used;
	settle(d, false);
	if (d->out.oom || d->held.oom || d->raw.oom)
		return -ENOMEM;
	*text = d->out.p ? d->out.p : "";
	*len = d->out.n;
	return d->stopped ? 1 : 0;
}

int k3_detok_feed_text(struct k3_detok *d, const char *in, size_t in_len, const char **text,
		       size_t *len)
{
	d->out.n = 0;
	k3_sbuf_add(&d->out, "", 0);
	*text = d->out.p ? d->out.p : "";
	*len = 0;
	if (d->stopped)
		return 1;
	k3_sbuf_add(&d->held, in, in_len);
	settle(d, false);
	if (d->out.oom || d->held.oom)
		return -ENOMEM;
	*text = d->out.p ? d->out.p : "";
	*len = d->out.n;
	return d->stopped ? 1 : 0;
}

int k3_detok_flush(struct k3_detok *d, const char **text, size_t *len)
{
	d->out.n = 0;
	k3_sbuf_add(&d->out, "", 0);
	if (!d->stopped) {
		k3_utf8_take((const uint8_t *)d->raw.p, d->raw.n, true, &d->held);
		d->raw.n = 0;
		settle(d, true);
	}
	if (d->out.oom || d->held.oom)
		return -ENOMEM;
	*text = d->out.p ? d->out.p : "";
	*len = d->out.n;
	return d->stopped ? 1 : 0;
}
