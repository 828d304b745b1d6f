/*
 * store_int8.h - the int8 spine overlay's files: writing one (`k3ctl
 * convert-spine-int8`) and deciding whether one may be used (`k3d --spine
 * int8`, `k3ctl bench --compare-spine`). docs/formats.md ("int8 spine
 * overlay") describes the bytes; model.h ("the int8 spine overlay") how a
 * model runs from it. In short, a directory (default DIR/spine-int8/):
 *
 *   spine-int8-NNNNN-of-MMMMM.safetensors  one per source shard holding
 *        spine matrices: per matrix `<name>.weight_i8` (I8 [rows, cols])
 *        and at the next 64-byte boundary `<name>.weight_row_scale` (F32
 *        [rows]), zero pads between as U8 tensors, so each file is a
 *        valid safetensors file with contiguous payloads
 *   model.safetensors.index.json           the usual index of those shards
 *   manifest.json                          format, version, the scheme, and
 *        the identity of every model shard it was made from and of every
 *        file it wrote (name, size, SHA-256 of the safetensors header,
 *        device, inode, mtime, ctime), as packs record theirs
 *
 * An overlay must never outlive the bytes it was made from: a use checks
 * every recorded identity against the files now (a stat and a header hash
 * per file, no weight byte read) and refuses a stale or missing overlay
 * with the command that rewrites it. The overlay is NOT the checkpoint's
 * weights (row-wise int8 with a per-row scale, max|w| / 127, round half to
 * even): whoever runs it says so (docs/engine.md, "int8 spine").
 */
#ifndef K3_STORE_INT8_H
#define K3_STORE_INT8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

struct k3_model;

#define K3_STORE_INT8_MANIFEST "manifest.json"
#define K3_STORE_INT8_FORMAT "k3-spine-int8"
enum {
	K3_STORE_INT8_VERSION = 1,
	/* manifest.json bytes (a K3 overlay's is tens of KB) */
	K3_STORE_INT8_MANIFEST_MAX = 16 << 20,
};
/* What the manifest says the overlay holds, for people. */
#define K3_STORE_INT8_SCHEME \
	"row-wise int8: scale[r] = max|w[r][:]| / 127 (fp32), q = clamp(round_half_even(w / scale)," \
	" -127, 127), value = q * scale; activations stay fp32; not the checkpoint's weights"

struct k3_store_int8_report {
	bool written;            /* false: an up-to-date overlay was kept */
	bool replaced;           /* an existing overlay was replaced (why says why) */
	char why[K3_ERR_MSG_MAX];
	size_t matrices;         /* matrices converted */
	uint32_t shards;         /* overlay shards */
	uint64_t bf16_bytes;     /* their BF16 bytes read */
	uint64_t int8_bytes;     /* I8 bytes written (q, scales, pads) */
	uint64_t file_bytes;     /* every overlay file */
	/* max over all rows of max|w - q * scale| / scale: at most 0.5 when
	 * the rounding is right (a self-check, printed by k3ctl) */
	double max_step_error;
	double seconds;
};

/*
 * Writes the overlay of every convertible matrix of m (opened without an
 * overlay; model.h k3_model_int8_matrices) into dir (NULL: the model
 * directory's spine-int8/). An existing overlay that k3_store_int8_check
 * accepts is kept unless force. Otherwise everything is written into a
 * temporary directory beside dir, fsynced, checked by opening the model
 * with it, and then swapped in (rename, the old one removed) and the
 * parent fsynced: a reader sees the old overlay or the new one, never a
 * mix. Reads the BF16 matrices in bounded chunks (pages released as it
 * goes: bounded memory for a 113 GB spine). The model's shards must stay
 * the same files meanwhile (identities before and after): otherwise
 * -EAGAIN and nothing is published. Returns 0; -EINVAL (a NaN or infinite
 * weight: names the tensor and row; or dir is not a directory of overlay
 * files); -EAGAIN; other negative errno for I/O failures (message names
 * the file).
 */
int k3_store_int8_write(const struct k3_model *m, const char *dir, bool force,
			struct k3_store_int8_report *rep, struct k3_err *err);

/*
 * Checks that the overlay in dir (NULL: the model directory's
 * spine-int8/) was made from m's shards as they are now, and that its own
 * files are the ones it wrote. Reads the manifest, stats and hashes the
 * header of every recorded file; no weight byte. Returns 0; -ENOENT (no
 * overlay / manifest); -ESTALE (a file was written, replaced or removed
 * since, or the model lists other shards: the message names the file and
 * what differs); -EBADMSG (a malformed manifest or another format
 * version). Every message ends with what to run: `k3ctl
 * convert-spine-int8 --model DIR`.
 */
int k3_store_int8_check(const struct k3_model *m, const char *dir, struct k3_err *err);

/* The overlay directory for model_dir: dir when set, else
 * model_dir/spine-int8. Returns 0 or -ENAMETOOLONG. */
int k3_store_int8_dir(char *buf, size_t size, const char *model_dir, const char *dir);

/*
 * Opens the model in model_dir with its int8 overlay (dir, NULL = the
 * default) for the matrix classes roles (0 = K3_MODEL_INT8_DEFAULT) and
 * checks the overlay (k3_store_int8_check): what `k3d --spine int8` and
 * `k3ctl bench --compare-spine` run. Errors as k3_model_open_with and
 * k3_store_int8_check; *out is NULL then.
 */
int k3_store_int8_open_model(const char *model_dir, const char *dir, unsigned roles,
			     struct k3_model **out, struct k3_err *err);

#endif
