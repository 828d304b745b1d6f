/*
 * text_tok.h - the exact Kimi K3 tokenizer: tiktoken ranks + the Kimi
 * pre-tokenizer regex + 256 special ids (docs/text-and-draft.md §1).
 *
 * Encoding of one string (§1.5, tokenization_kimi.py `encode`):
 *   1. cut into 400,000-code-point chunks;
 *   2. inside a chunk, cut runs of more than 25,000 characters of the same
 *      Python isspace() class (a new slice starts at the 25,001st);
 *   3. each slice: if special matching is on, split at the leftmost special
 *      name (longest match); ordinary text is cut into regex pieces (§1.3,
 *      PCRE2 with UTF+UCP+JIT) and each piece is byte-pair merged by rank
 *      (§1.4).
 *
 * A loaded tokenizer is immutable: every function taking a
 * `const struct k3_tok *` may be called from many threads at once.
 *
 * Ids are uint32_t. Ranks 0..n_ranks-1 are the BPE tokens (rank = id);
 * n_ranks..n_ranks+255 are the special ids.
 */
#ifndef K3_TEXT_TOK_H
#define K3_TEXT_TOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

/* The real release file (docs/text-and-draft.md §0, §1.1). A rank file with
 * exactly this many ranks claims to be the release and must match the
 * SHA-256 below; any other count is a synthetic vocabulary (tests, demo). */
#define K3_TOK_REAL_RANKS      163584u
#define K3_TOK_REAL_SHA256     "b6c497a7469b33ced9c38afb1ad6e47f03f5e5dc05f15930799210ec050c5103"
#define K3_TOK_N_SPECIAL       256u
/* Bounds on what a rank file may hold (checked before allocating). */
#define K3_TOK_RANKS_MAX       (1u << 20)
#define K3_TOK_TOKEN_BYTES_MAX 1024u
#define K3_TOK_FILE_MAX        (64u << 20)
#define K3_TOK_SPECIAL_NAME_MAX 128u
/* Chunking constants of tokenization_kimi.py (part of the wire format). */
#define K3_TOK_CHUNK_CHARS     400000u
#define K3_TOK_RUN_CHARS       25000u

/* Special ids the renderer and parser need, as offsets from n_ranks. With
 * the real file they are the ids of §1.6 (163584 + offset). */
enum k3_tok_special {
	K3_TOK_SP_BOS = 0,          /* [BOS] */
	K3_TOK_SP_EOS = 1,          /* [EOS] */
	K3_TOK_SP_END_OF_MSG = 2,   /* <|end_of_msg|>, the generation stop */
	K3_TOK_SP_OPEN = 3,         /* <|open|> */
	K3_TOK_SP_CLOSE = 4,        /* <|close|> */
	K3_TOK_SP_SEP = 5,          /* <|sep|> */
};

struct k3_tok;

/* A growable id array owned by the caller. Zero-initialize it (or call
 * k3_tok_ids_init), pass it to encode calls (which append), release it with
 * k3_tok_ids_release. */
struct k3_tok_ids {
	uint32_t *v;
	size_t n, cap;
};

void k3_tok_ids_init(struct k3_tok_ids *ids);
void k3_tok_ids_release(struct k3_tok_ids *ids);
/* Appends one id. Returns 0 or -ENOMEM (ids unchanged). */
int k3_tok_ids_push(struct k3_tok_ids *ids, uint32_t id);

/* Loads `DIR/tiktoken.model` and `DIR/tokenizer_config.json` (the latter may
 * be absent: then every special id is `<|reserved_token_N|>`). On success
 * *out is a new tokenizer the caller frees with k3_tok_free.
 * Errors: -ENOENT/-EACCES (file), -EINVAL (malformed line, duplicate or
 * non-contiguous rank, missing single byte, bad config), -EBADMSG (claims to
 * be the release — 163,584 ranks — but the SHA-256 differs), -E2BIG (over a
 * K3_TOK_* bound), -ENOMEM. err names the file and line. */
int k3_tok_load_dir(const char *dir, struct k3_tok **out, struct k3_err *err);

/* Same from explicit paths; config_path may be NULL. */
int k3_tok_load_files(const char *rank_path, const char *config_path,
		      struct k3_tok **out, struct k3_err *err);

/* Same from memory (tests, fuzzing): ranks[0..ranks_len) is the rank file's
 * bytes, config[0..config_len) the JSON text of tokenizer_config.json or
 * NULL. The buffers are not kept. */
int k3_tok_load_buffers(const char *ranks, size_t ranks_len,
			const char *config, size_t config_len,
			struct k3_tok **out, struct k3_err *err);

/* Frees the tokenizer; NULL is fine. */
void k3_tok_free(struct k3_tok *tok);

/* Number of BPE ranks, and ranks + 256. */
uint32_t k3_tok_n_ranks(const struct k3_tok *tok);
uint32_t k3_tok_n_vocab(const struct k3_tok *tok);

/* Id of the special token at `which` (enum k3_tok_special or any offset
 * 0..255), i.e. n_ranks + which. */
uint32_t k3_tok_special(const struct k3_tok *tok, unsigned which);

/* True when s[0..n) (n >= 1) is a proper prefix of some special name:
 * text ending so may still become a special token (stream hold-back). */
bool k3_tok_special_prefix(const struct k3_tok *tok, const char *s, size_t n);

/* Id of a special token by its exact name, or -ENOENT. */
int64_t k3_tok_special_by_name(const struct k3_tok *tok, const char *name);

/* Encodes text[0..len) and appends the ids to *out. text must be valid
 * UTF-8 (it may contain NUL). allow_special: special names in the text
 * become special ids (tiktoken allowed_special="all"); otherwise they are
 * ordinary text. Returns 0, or -EILSEQ (invalid UTF-8; err gives the byte
 * offset), -E2BIG (len > K3_LIM_TEXT_MAX), -ENOMEM. On error *out may hold
 * a partial result (its n is restored to the value on entry). */
int k3_tok_encode(const struct k3_tok *tok, const char *text, size_t len,
		  bool allow_special, struct k3_tok_ids *out, struct k3_err *err);

/* Bytes of one id: BPE bytes for a rank, the name for a special id.
 * *bytes points into the tokenizer (valid until k3_tok_free). Returns 0 or
 * -ERANGE (id >= n_vocab). */
int k3_tok_id_bytes(const struct k3_tok *tok, uint32_t id,
		    const uint8_t **bytes, size_t *len);

/* True for ids n_ranks..n_ranks+255. */
bool k3_tok_is_special(const struct k3_tok *tok, uint32_t id);

/* Decodes ids to the concatenation of their bytes (not necessarily valid
 * UTF-8). *out is malloc'ed, NUL-terminated (the NUL is not counted in
 * *out_len), owned by the caller. Returns 0, -ERANGE (an id out of range;
 * err names its position) or -ENOMEM. */
int k3_tok_decode(const struct k3_tok *tok, const uint32_t *ids, size_t n,
		  char **out, size_t *out_len, struct k3_err *err);

/* The pre-tokenizer alone (tests, diagnostics): calls fn for every regex
 * piece of text[0..len) in order, with byte offsets into text. No chunking
 * and no special matching. Returns 0, -EILSEQ, -ENOMEM, or the first
 * non-zero value fn returns. */
typedef int (*k3_tok_piece_fn)(void *ud, size_t off, size_t len);
int k3_tok_split_pieces(const struct k3_tok *tok, const char *text, size_t len,
			k3_tok_piece_fn fn, void *ud, struct k3_err *err);

/* The same pieces from PCRE2 alone, without the ASCII fast path: the
 * reference the fast path is tested against. */
int k3_tok_split_pieces_ref(const struct k3_tok *tok, const char *text, size_t len,
			    k3_tok_piece_fn fn, void *ud, struct k3_err *err);

/*
 * The pre-tokenizer pattern as PCRE2 source (UTF-8, NUL-terminated,
 * static; compile with PCRE2_UTF | PCRE2_UCP), in the three spellings of
 * text_ucd.h, all with the Unicode classes of UCD K3_UCD_VERSION (the
 * version of the release's regex engine) where they are exact:
 *   K3_TOK_REGEX_PCRE2      PCRE2's own \p{..} tables: exact over tables of
 *                           K3_UCD_VERSION, and of K3_UCD_PCRE2_BASE for
 *                           text without a code point of k3_ucd_new[];
 *   K3_TOK_REGEX_PCRE2_NEW  plus k3_ucd_new[]: exact over either for any
 *                           text, about 25% slower on non-ASCII text;
 *   K3_TOK_REGEX_EXPLICIT   explicit ranges: exact with any PCRE2, ~3x
 *                           slower.
 */
enum k3_tok_regex { K3_TOK_REGEX_PCRE2, K3_TOK_REGEX_PCRE2_NEW, K3_TOK_REGEX_EXPLICIT };
const char *k3_tok_pattern(enum k3_tok_regex which);
/* What the tokenizer compiles for the linked PCRE2 (by its Unicode
 * version): _PCRE2 with *needs_new true when text holding k3_ucd_new[]
 * code points must use _PCRE2_NEW instead (the tokenizer checks each
 * segment), or _EXPLICIT for any other Unicode version. */
enum k3_tok_regex k3_tok_regex_for_pcre2(bool *needs_new);

/* Byte-pair merges one piece (no regex): appends the ranks of
 * piece[0..len) to *out. Every byte must have a rank (guaranteed by the
 * loader). Returns 0 or -ENOMEM. */
int k3_tok_bpe(const struct k3_tok *tok, const uint8_t *piece, size_t len,
	       struct k3_tok_ids *out);

/* Checks that s[0..len) is valid UTF-8 (no overlongs, no surrogates, at
 * most U+10FFFF). Returns len when valid, else the offset of the first bad
 * byte. */
size_t k3_tok_utf8_valid_prefix(const char *s, size_t len);

/* True when valid UTF-8 s[0..len) is empty or only Python isspace()
 * characters, i.e. Python `not s.strip()`. */
bool k3_tok_py_isblank(const char *s, size_t len);

#endif
