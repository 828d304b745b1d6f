/*
 * text_bpe.c - byte-pair merging of one pre-tokenizer piece into rank ids
 * (docs/text-and-draft.md §1.4; text_tok_internal.h says which tokenizer
 * file does what): tiktoken's merge loop, always the lowest rank and the
 * leftmost on ties, in O(n^2) for the usual short pieces and with a heap
 * in O(n log n) for long ones; both give the same ids.
 */
#include "text/text_tok_internal.h"

#include <errno.h>
#include <stdlib.h>

/* ---- BPE (§1.4) ---------------------------------------------------------- */

/* tiktoken's merge loop for short pieces: parts[i] is a boundary; rk[i] the
 * rank of the string from parts[i] to parts[i+2]. Always merges the lowest
 * rank, leftmost on ties. O(n^2), fastest for the usual short pieces. */
static int bpe_small(const struct k3_tok *tok, const uint8_t *s, size_t n, struct k3_tok_ids *out)
{
	uint32_t parts[130], rk[130];
	size_t np = n + 1;

	for (size_t i = 0; i < np; i++) {
		parts[i] = (uint32_t)i;
		rk[i] = i + 2 < np ? tok_rank_of(tok, s + i, 2) : NO_RANK;
	}
	for (;;) {
		uint32_t best = NO_RANK;
		size_t bi = 0;

		for (size_t i = 0; i + 1 < np; i++) {
			if (rk[i] < best) {
				best = rk[i];
				bi = i;
			}
		}
		if (best == NO_RANK)
			break;
		/* remove boundary bi+1 */
		memmove(parts + bi + 1, parts + bi + 2, (np - bi - 2) * sizeof(parts[0]));
		memmove(rk + bi + 1, rk + bi + 2, (np - bi - 2) * sizeof(rk[0]));
		np--;
		rk[bi] = bi + 2 < np ? tok_rank_of(tok, s + parts[bi], parts[bi + 2] - parts[bi]) : NO_RANK;
		if (bi > 0)
			rk[bi - 1] = tok_rank_of(tok, s + parts[bi - 1], parts[bi + 1] - parts[bi - 1]);
	}
	if (tok_ids_reserve(out, np - 1))
		return -ENOMEM;
	for (size_t i = 0; i + 1 < np; i++)
		out->v[out->n++] = tok_rank_of(tok, s + parts[i], parts[i + 1] - parts[i]);
	return 0;
}

/* Same result for long pieces in O(n log n): a min-heap of (rank, left
 * start) over a linked list of parts. An entry is stale when its left part
 * is gone or its pair rank changed; pair strings only grow, so a rank value
 * never returns to a position. */
struct heap_ent { uint32_t rank, pos; };

static bool heap_less(struct heap_ent a, struct heap_ent b)
{
	return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(struct heap_ent *h, size_t *n, struct heap_ent e)
{
	size_t i = (*n)++;

	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!heap_less(e, h[p]))
			break;
		h[i] = h[p];
		i = p;
	}
	h[i] = e;
}

static struct heap_ent heap_pop(struct heap_ent *h, size_t *n)
{
	struct heap_ent top = h[0], last = h[--(*n)];
	size_t i = 0;

	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= *n)
			break;
		if (c + 1 < *n && heap_less(h[c + 1], h[c]))
			c++;
		if (!heap_less(h[c], last))
			break;
		h[i] = h[c];
		i = c;
	}
	if (*n)
		h[i] = last;
	return top;
}

static int bpe_large(const struct k3_tok *tok, const uint8_t *s, size_t n, struct k3_tok_ids *out)
{
	/* per byte position: end of the part starting here (0 = not a part
	 * start), previous part start, current pair rank */
	uint32_t *end = malloc(n * sizeof(uint32_t));
	uint32_t *prev = malloc(n * sizeof(uint32_t));
	uint32_t *prk = malloc(n * sizeof(uint32_t));
	struct heap_ent *h = malloc(2 * n * sizeof(*h));
	size_t hn = 0;
	int rc = -ENOMEM;

	if (!end || !prev || !prk || !h)
		goto out;
	for (size_t i = 0; i < n; i++) {
		end[i] = (uint32_t)i + 1;
		prev[i] = i ? (uint32_t)i - 1 : NO_RANK;
		prk[i] = i + 1 < n ? tok_rank_of(tok, s + i, 2) : NO_RANK;
		if (prk[i] != NO_RANK)
			heap_push(h, &hn, (struct heap_ent){ prk[i], (uint32_t)i });
	}
	while (hn) {
		struct heap_ent e = heap_pop(h, &hn);
		uint32_t a = e.pos, b, c;

		if (!end[a] || prk[a] != e.rank)
			continue;
		b = end[a];            /* right part start */
		c = end[b];            /* right part end */
		end[a] = c;
		end[b] = 0;
		if (c < n)
			prev[c] = a;
		/* new pair with the right neighbour */
		prk[a] = c < n ? tok_rank_of(tok, s + a, end[c] - a) : NO_RANK;
		if (prk[a] != NO_RANK)
			heap_push(h, &hn, (struct heap_ent){ prk[a], a });
		if (prev[a] != NO_RANK) {
			uint32_t p = prev[a];
			prk[p] = tok_rank_of(tok, s + p, c - p);
			if (prk[p] != NO_RANK)
				heap_push(h, &hn, (struct heap_ent){ prk[p], p });
		}
		if (hn + 2 > 2 * n) {
			/* compact: drop stale entries (cannot grow unbounded) */
			size_t k = 0;
			for (size_t i = 0; i < hn; i++)
				if (end[h[i].pos] && prk[h[i].pos] == h[i].rank)
					h[k++] = h[i];
			hn = 0;
			for (size_t i = 0; i < k; i++)
				heap_push(h, &hn, h[i]);
		}
	}
	rc = 0;
	for (size_t i = 0; i < n; i = end[i]) {
		if ((rc = k3_tok_ids_push(out, tok_rank_of(tok, s + i, end[i] - i))))
			break;
	}
out:
	free(end);
	free(prev);
	free(prk);
	free(h);
	return rc;
}

int k3_tok_bpe(const struct k3_tok *tok, const uint8_t *piece, size_t len, struct k3_tok_ids *out)
{
	uint32_t r;

	if (len == 0)
		return 0;
	r = tok_rank_of(tok, piece, len);
	if (r != NO_RANK)
		return k3_tok_ids_push(out, r);
	if (len <= 128)
		return bpe_small(tok, piece, len, out);
	return bpe_large(tok, piece, len, out);
}
