/*
 * cmd_convert_spine_int8.c - `k3ctl convert-spine-int8 --model DIR
 * [--out DIR] [--force]`: writes the int8 spine overlay (store_int8.h,
 * docs/formats.md "int8 spine overlay") that `k3d --spine int8` runs:
 * every linear-op matrix of the spine quantized row-wise to int8 with one
 * fp32 scale per row. NOT weight-exact; the command says so. An overlay
 * that is up to date (made from the shards as they are) is kept unless
 * --force.
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "json_fields.h"
#include "k3ctl.h"
#include "model/model.h"
#include "store/store_int8.h"

#define CONVERT_USAGE "usage: k3ctl convert-spine-int8 --model DIR [--out DIR] [--force]"

static void usage(void)
{
	printf(CONVERT_USAGE "\n");
}

/* A value missing is an argument out of place, as any other. */
static const char *const convert_flags[] = { "--force", NULL };
static const struct k3ctl_args_spec convert_args = {
	.cmd = "convert-spine-int8", .flags = convert_flags, .help = usage,
	.need = CONVERT_USAGE " (unexpected '%s')",
};

int k3ctl_cmd_convert_spine_int8(int argc, char **argv)
{
	const char *model_dir = NULL, *out_dir = NULL;
	bool force = false;
	struct k3_model *m = NULL;
	struct k3_store_int8_report rep;
	struct k3_err err = { 0, "" };
	char dir[4096];
	int code = K3CTL_EXIT_ERROR;

	const struct k3ctl_arg_str strs[] = { { "--model", &model_dir }, { "--out", &out_dir } };
	struct k3ctl_args args = { .spec = &convert_args, .argc = argc, .argv = argv, .strs = strs,
				   .n_strs = 2 };
	while (k3ctl_args_next(&args)) {
		if (strcmp(args.opt, "--force") == 0)
			force = true;
		else
			return k3ctl_usage("convert-spine-int8", CONVERT_USAGE " (unexpected '%s')",
					   args.opt);
	}
	if (args.stop)
		return args.code;
	if (!model_dir)
		return k3ctl_usage("convert-spine-int8", "--model DIR is required");
	if (k3_model_open(model_dir, &m, &err))
		return k3ctl_fail(K3CTL_EXIT_ERROR, "%s", err.msg);
	if (!out_dir) {
		struct stat st;
		/* as k3ctl pack: a directory with no write bit is left alone */
		if (stat(k3_model_dir(m), &st) == 0 && (st.st_mode & 0222) == 0) {
			k3ctl_fail(K3CTL_EXIT_ERROR, "'%s' is read-only (mode %04o); choose where the"
				   " overlay goes with --out DIR (and run it with k3d --spine-int8-dir"
				   " DIR)", k3_model_dir(m), (unsigned)(st.st_mode & 07777));
			goto out;
		}
	}
	k3_store_int8_dir(dir, sizeof(dir), k3_model_dir(m), out_dir);
	if (k3_store_int8_write(m, out_dir, force, &rep, &err)) {
		k3ctl_fail(K3CTL_EXIT_ERROR, "%s", err.msg);
		goto out;
	}
	if (k3ctl_g.json) {
		json_t *o = json_pack("{s:b, s:s, s:b, s:b, s:s, s:I, s:i, s:I, s:I, s:I, s:f, s:f,"
				      " s:b}", "ok", 1, "dir", dir, "written", rep.written,
				      "replaced", rep.replaced, "why", rep.why,
				      "matrices", (json_int_t)rep.matrices, "shards", (int)rep.shards,
				      "bf16_bytes", (json_int_t)rep.bf16_bytes,
				      "int8_bytes", (json_int_t)rep.int8_bytes,
				      "file_bytes", (json_int_t)rep.file_bytes,
				      "max_step_error", rep.max_step_error, "seconds", rep.seconds,
				      "weight_exact", 0);
		k3ctl_json_puts(o, JSON_COMPACT, NULL);
	} else if (!rep.written) {
		printf("%s: up to date (made from the shards as they are now); kept (--force"
		       " rewrites it)\n", dir);
	} else {
		printf("%s: %s %zu matrices in %" PRIu32 " shards: %.3f GB of BF16 -> %.3f GB of"
		       " int8 + row scales, %.1f s; largest rounding step %.3f (of at most 0.5)%s%s%s\n",
		       dir, rep.replaced ? "rewrote" : "wrote", rep.matrices, rep.shards,
		       (double)rep.bf16_bytes / 1e9, (double)rep.int8_bytes / 1e9, rep.seconds,
		       rep.max_step_error, rep.why[0] ? " (replaced: " : "", rep.why,
		       rep.why[0] ? ")" : "");
		printf("this is an int8 spine (not weight-exact): run it with `k3d --model %s"
		       " --spine int8%s%s`; compare it with `k3ctl bench --compare-spine --model %s"
		       "%s%s --prompt TEXT`\n", model_dir, out_dir ? " --spine-int8-dir " : "",
		       out_dir ? out_dir : "", model_dir, out_dir ? " --spine-int8-dir " : "",
		       out_dir ? out_dir : "");
	}
	code = K3CTL_EXIT_OK;
out:
	k3_model_free(m);
	return code;
}
