/*
 * store_prefetch.h - prefetch inside the store (internal to daemon/store;
 * the engine uses store.h): lookahead guesses become low-priority reads of
 * the reader pool, the real routing resolves them (unchosen queued guesses
 * dropped, unchosen read ones sent to the cold end, those being read
 * stopped at their next piece), and every one-position lookahead is scored
 * per (kind, layer, rank) for the precision gate of "--prefetch auto".
 * docs/store.md "Prefetch" has the policy and its measurements. The
 * public entry points (k3_store_prefetch_ranked and friends) are declared
 * in store.h; this header is what the cache (store_cache.c) and the
 * store's lifecycle (store.c) call.
 */
#ifndef K3_STORE_PREFETCH_H
#define K3_STORE_PREFETCH_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"
#include "store/store.h"

/* A lookahead guess waiting for its layer's real routing to be scored. */
struct k3_store_pending_guess {
	int64_t ex;       /* source expert index */
	uint32_t rank;    /* in its position's router order */
};

/* One lookahead kind's guesses waiting to be scored, and the gate's record
 * of that kind: the after-layer and the partial lookahead guess with
 * different precision, and each kind's reads are gated on its own. */
struct k3_store_guess_record {
	struct k3_store_pending_guess *pend;   /* [n_layers][K3_STORE_PREFETCH_PENDING_MAX] */
	uint32_t *n_pend;                      /* [n_layers] */
	uint32_t *gate_n, *gate_hit;           /* [n_layers][K3_STORE_GUESS_RANKS], windowed */
	uint64_t rank_n[K3_STORE_GUESS_RANKS], rank_hit[K3_STORE_GUESS_RANKS];   /* their sums over layers */
	uint64_t rank_scored[K3_STORE_GUESS_RANKS], rank_right[K3_STORE_GUESS_RANKS];
};

enum {
	K3_STORE_PREFETCH_PENDING_MAX = 64,   /* guesses scored per layer and lookahead */
};

/* The prefetch state of one store, per source layer id (n_layers = the
 * largest layer id + 1, <= K3_STORE_MAX_LAYERS). */
struct k3_store_guesses {
	uint32_t n_layers;
	struct k3_store_guess_record rec[K3_STORE_GUESS_KINDS];   /* by enum k3_store_guess_kind */
	double min_precision;                 /* the gate's threshold */
};

/* Allocates the records of g for n_layers layers. Returns 0 or -ENOMEM;
 * on failure k3_store_guesses_release still must be called. */
int k3_store_guesses_init(struct k3_store_guesses *g, uint32_t n_layers, double min_precision);
/* Frees what init allocated (zeroed or failed structs too). */
void k3_store_guesses_release(struct k3_store_guesses *g);

struct k3_store;

/* Called by the request of `layer` once it pinned what was resident (lock
 * held): its real routing is the experts the request `gen` pinned. Queued
 * guesses of the layer it did not choose are dropped unread
 * (prefetch_cancelled); guesses of the layer read or being read are marked
 * missed (the cold end), and those still being read stop at their next
 * piece. */
void k3_store_prefetch_routed(struct k3_store *s, uint32_t layer, uint64_t gen);

/* Called by the request of `layer` once every expert it asked for has a
 * slot (lock held): scores the layer's pending one-position guesses of
 * every kind against the experts request `gen` pinned. */
void k3_store_prefetch_score(struct k3_store *s, uint32_t layer, uint64_t gen);

#endif
