/* store_drives.c - the several-drives options (see store_drives.h): comma
 * lists of per-drive values, one value meaning every drive. */
#include "store/store_drives.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/parse.h"

void k3_store_drive_opts_init(struct k3_store_drive_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->hedge_factor = -1;
}

/* Calls item(text, i) for each comma-separated item of s (at most
 * K3_STORE_MAX_DRIVES, none empty); *n := how many. */
static int each_item(const char *opt, const char *s, unsigned *n,
		     int (*item)(const char *text, unsigned i, struct k3_store_drive_opts *o,
				 struct k3_err *err),
		     struct k3_store_drive_opts *o, struct k3_err *err)
{
	char buf[256];
	unsigned i = 0;

	if (strlen(s) >= sizeof(buf))
		return k3_err_set(err, -EINVAL, "%s: too long", opt);
	snprintf(buf, sizeof(buf), "%s", s);
	for (char *p = buf, *next; p; p = next, i++) {
		next = strchr(p, ',');
		if (next)
			*next++ = '\0';
		if (i == K3_STORE_MAX_DRIVES)
			return k3_err_set(err, -EINVAL, "%s '%s': at most %d values (one per drive)",
					  opt, s, K3_STORE_MAX_DRIVES);
		if (!*p)
			return k3_err_set(err, -EINVAL, "%s '%s': an empty value", opt, s);
		int rc = item(p, i, o, err);
		if (rc)
			return k3_err_prefix(err, "%s '%s'", opt, s);
	}
	*n = i;
	return 0;
}

static int rate_item(const char *t, unsigned i, struct k3_store_drive_opts *o, struct k3_err *err)
{
	double g;
	int rc = k3_parse_double(t, 1e-6, 1000, &g, err);
	if (rc == 0)
		o->rate[i] = (uint64_t)(g * 1e9);
	return rc;
}

static int latency_item(const char *t, unsigned i, struct k3_store_drive_opts *o,
			struct k3_err *err)
{
	double ms;
	int rc = k3_parse_double(t, 0, 10000, &ms, err);
	if (rc == 0)
		o->latency_ns[i] = (uint64_t)(ms * 1e6);
	return rc;
}

static int stall_item(const char *t, unsigned i, struct k3_store_drive_opts *o, struct k3_err *err)
{
	char ms[64];
	const char *colon = strchr(t, ':');
	double v, f = 0;

	if (!colon) {
		if (strcmp(t, "0") != 0)
			return k3_err_set(err, -EINVAL, "'%s' is not MS:FRACTION or 0", t);
		o->stall_ns[i] = 0;
		o->stall_fraction[i] = 0;
		return 0;
	}
	if ((size_t)(colon - t) >= sizeof(ms))
		return k3_err_set(err, -EINVAL, "'%s' is not MS:FRACTION", t);
	memcpy(ms, t, (size_t)(colon - t));
	ms[colon - t] = '\0';
	int rc = k3_parse_double(ms, 0, 10000, &v, err);
	if (rc == 0)
		rc = k3_parse_double(colon + 1, 0, 1, &f, err);
	if (rc == 0) {
		o->stall_ns[i] = (uint64_t)(v * 1e6);
		o->stall_fraction[i] = f;
	}
	return rc;
}

int k3_store_drive_parse_rate(const char *s, struct k3_store_drive_opts *o, struct k3_err *err)
{
	return each_item("--io-rate", s, &o->n_rate, rate_item, o, err);
}

int k3_store_drive_parse_latency(const char *s, struct k3_store_drive_opts *o, struct k3_err *err)
{
	return each_item("--io-latency", s, &o->n_latency, latency_item, o, err);
}

int k3_store_drive_parse_stall(const char *s, struct k3_store_drive_opts *o, struct k3_err *err)
{
	return each_item("--io-stall", s, &o->n_stall, stall_item, o, err);
}

int k3_store_drive_parse_hedge(const char *s, struct k3_store_drive_opts *o, struct k3_err *err)
{
	if (strcmp(s, "auto") == 0) {
		o->hedge_factor = -1;
		return 0;
	}
	if (strcmp(s, "off") == 0) {
		o->hedge_factor = 0;
		return 0;
	}
	if (k3_parse_double(s, 1, 100, &o->hedge_factor, err) < 0)
		return k3_err_prefix(err, "--hedge ('auto', 'off' or a factor of the p95)");
	return 0;
}

/* Value i of a list of n (one value: every drive). */
static unsigned pick(unsigned n, unsigned d)
{
	return n == 1 ? 0 : d;
}

int k3_store_drive_opts_apply(const struct k3_store_drive_opts *o, unsigned n_drives,
			      struct k3_store_config *cfg, struct k3_err *err)
{
	static const char *names[3] = { "--io-rate", "--io-latency", "--io-stall" };
	unsigned counts[3] = { o->n_rate, o->n_latency, o->n_stall };

	for (int k = 0; k < 3; k++)
		if (counts[k] > 1 && counts[k] > n_drives)
			return k3_err_set(err, -EINVAL, "%s has %u values and there are %u drives (the"
					  " model directory and each --expert-dir)", names[k],
					  counts[k], n_drives);
	for (unsigned d = 0; d < n_drives && d < K3_STORE_MAX_DRIVES; d++) {
		struct k3_store_io_drive_config *dc = &cfg->drive[d];
		if (o->n_rate && d < (o->n_rate == 1 ? n_drives : o->n_rate))
			dc->rate_bytes_per_s = o->rate[pick(o->n_rate, d)];
		if (o->n_latency && d < (o->n_latency == 1 ? n_drives : o->n_latency))
			dc->latency_ns = o->latency_ns[pick(o->n_latency, d)];
		if (o->n_stall && d < (o->n_stall == 1 ? n_drives : o->n_stall)) {
			dc->stall_ns = o->stall_ns[pick(o->n_stall, d)];
			dc->stall_fraction = o->stall_fraction[pick(o->n_stall, d)];
			dc->stall_seed = 1;
		}
	}
	cfg->hedge_factor = o->hedge_factor < 0 ? K3_STORE_HEDGE_FACTOR : o->hedge_factor;
	return 0;
}

const char *k3_store_drive_hedge_name(const struct k3_store_drive_opts *o, char *buf, unsigned n)
{
	if (o->hedge_factor < 0)
		snprintf(buf, n, "auto");
	else if (o->hedge_factor == 0)
		snprintf(buf, n, "off");
	else
		snprintf(buf, n, "%g", o->hedge_factor);
	return buf;
}
