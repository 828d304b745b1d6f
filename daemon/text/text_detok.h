/*
 * text_detok.h - streaming detokenizer: ids in, UTF-8 text out
 * (docs/text-and-draft.md §1.8).
 *
 *   - Never emits part of a UTF-8 sequence: bytes of a character split
 *     across tokens (emoji, CJK) are held until the character is complete.
 *     Bytes that can never become valid UTF-8 are replaced by U+FFFD the way
 *     Python's bytes.decode(errors="replace") does (one per maximal invalid
 *     subpart), so a stream decodes to the same text as a whole decode.
 *   - Holds back a tail that could be the start of a stop string; when a
 *     stop string completes, the text before it is emitted and the stream
 *     reports the stop (the stop string itself is not emitted).
 *   - flush emits whatever is held (an incomplete UTF-8 tail as U+FFFD).
 *
 * Special ids decode to their names (e.g. "<|end_of_msg|>") unless
 * K3_DETOK_SKIP_SPECIAL is set, in which case they produce no text.
 *
 * Not thread-safe; one object per stream. The tokenizer must outlive it.
 */
#ifndef K3_TEXT_DETOK_H
#define K3_TEXT_DETOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "text/text_sbuf.h"
#include "text/text_tok.h"

enum k3_detok_flags {
	K3_DETOK_SKIP_SPECIAL = 1 << 0,
};

struct k3_detok;

/* Creates a detokenizer. stops[i] (stop_lens[i] bytes, 1..K3_LIM_STOP_BYTES)
 * are stop strings, n_stops <= K3_LIM_STOP_COUNT; they are copied. Returns
 * 0, -EINVAL (bad stop string) or -ENOMEM. */
int k3_detok_new(const struct k3_tok *tok, const char *const *stops, const size_t *stop_lens,
		 size_t n_stops, unsigned flags, struct k3_detok **out, struct k3_err *err);

void k3_detok_free(struct k3_detok *d);

/* Feeds one id. On return *text and *len are the newly emitted UTF-8 text
 * (possibly empty), owned by d and valid until the next call on d.
 * Returns 0, 1 when a stop string completed (later feeds emit nothing and
 * return 1), or -ERANGE (id outside the vocabulary; nothing changes). */
int k3_detok_feed(struct k3_detok *d, uint32_t id, const char **text, size_t *len);

/* Feeds already-decoded UTF-8 text (e.g. the content deltas of the
 * output parser) through the same stop-string matching. Same returns as
 * k3_detok_feed; text must be valid UTF-8 (it is not re-validated). */
int k3_detok_feed_text(struct k3_detok *d, const char *in, size_t in_len, const char **text,
		       size_t *len);

/* Emits everything held back. Returns 0 (or 1 if the stream had stopped). */
int k3_detok_flush(struct k3_detok *d, const char **text, size_t *len);

/* Moves the longest decodable prefix of in[0..n) to out as valid UTF-8
 * (invalid subparts → U+FFFD). Returns the number of bytes consumed; the
 * rest is an incomplete sequence (at most 3 bytes) to keep for later. With
 * final set, an incomplete tail also becomes U+FFFD and all is consumed. */
size_t k3_utf8_take(const uint8_t *in, size_t n, bool final, struct k3_sbuf *out);

#endif
