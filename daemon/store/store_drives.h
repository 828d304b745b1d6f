/*
 * store_drives.h - the options that describe several drives
 * (docs/drives.md), parsed once for k3d and k3ctl bench: the emulated
 * drive per drive (--io-rate, --io-latency, --io-stall: one value for
 * every drive or one per drive, drive 0 being the model directory's and
 * drive d the d-th --expert-dir), hedging (--hedge), and how they fill a
 * store's configuration. Pure parsing; no I/O.
 */
#ifndef K3_STORE_DRIVES_H
#define K3_STORE_DRIVES_H

#include <stdint.h>

#include "base/err.h"
#include "store/store.h"

/* The emulation and hedging options as given. A list of one value applies
 * to every drive. */
struct k3_store_drive_opts {
	uint64_t rate[K3_STORE_MAX_DRIVES];        /* bytes/s; 0 = unlimited */
	unsigned n_rate;
	uint64_t latency_ns[K3_STORE_MAX_DRIVES];
	unsigned n_latency;
	uint64_t stall_ns[K3_STORE_MAX_DRIVES];    /* extra latency of a stalled request */
	double stall_fraction[K3_STORE_MAX_DRIVES];
	unsigned n_stall;
	double hedge_factor;                       /* < 0: auto (K3_STORE_HEDGE_FACTOR); 0 = off */
};

/* Defaults: no emulation, hedging auto. */
void k3_store_drive_opts_init(struct k3_store_drive_opts *o);

/* --io-rate GBPS[,GBPS...]: GB/s (10^9 bytes), > 0 and at most 1000 each,
 * at most K3_STORE_MAX_DRIVES values. Returns 0 or -EINVAL with the reason. */
int k3_store_drive_parse_rate(const char *s, struct k3_store_drive_opts *o, struct k3_err *err);
/* --io-latency MS[,MS...]: milliseconds, 0 .. 10000 each. */
int k3_store_drive_parse_latency(const char *s, struct k3_store_drive_opts *o, struct k3_err *err);
/* --io-stall MS:FRACTION[,...] (or "0" for a drive without stalls): that
 * fraction (0..1) of the drive's requests ends MS (0 .. 10000) later. */
int k3_store_drive_parse_stall(const char *s, struct k3_store_drive_opts *o, struct k3_err *err);
/* --hedge auto|off|FACTOR: FACTOR x the drive's p95, in [1, 100]. */
int k3_store_drive_parse_hedge(const char *s, struct k3_store_drive_opts *o, struct k3_err *err);

/* Fills cfg's per-drive emulation and its hedge factor for n_drives
 * drives. Returns 0, or -EINVAL when a list has more values than there
 * are drives (and more than one), naming the option. */
int k3_store_drive_opts_apply(const struct k3_store_drive_opts *o, unsigned n_drives,
			      struct k3_store_config *cfg, struct k3_err *err);

/* "auto", "off" or the factor, into buf (>= 16 bytes). */
const char *k3_store_drive_hedge_name(const struct k3_store_drive_opts *o, char *buf, unsigned n);

#endif
