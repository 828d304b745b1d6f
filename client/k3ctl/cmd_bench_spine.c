/*
 * cmd_bench_spine.c - `k3ctl bench --compare-spine --model DIR (--text
 * FILE | --prompt S | --ids LIST) [--positions N] [--spine-int8-dir DIR]
 * [--int8 CLASSES] [--per-class] [--threads N]`: how far the int8 spine
 * (store_int8.h; NOT weight-exact) is from the checkpoint's BF16 spine,
 * teacher-forced over the first N positions of a given text.
 *
 * Both spines run in this process, each on its own engine and sequence,
 * over the same tokens in chunks of CHUNK positions; at every position t
 * the two next-token distributions p (BF16) and q (int8) are compared:
 *
 *   top-1 agreement  fraction of positions where argmax p == argmax q
 *                    (lowest id on ties, as greedy decoding picks)
 *   mean KL          mean over positions of KL(p || q) = sum_v p_v (log p_v
 *                    - log q_v), nats, softmax and sums in double
 *   max |dlogit|     max over positions and vocabulary of |l_bf16 - l_int8|
 *   rel-L2           mean over positions of ||l_int8 - l_bf16|| / ||l_bf16||
 *
 * and, for each spine, how often its top-1 is the text's actual next token
 * (meaningful on trained weights only). With --per-class the same figures
 * for an int8 spine in which only one class of matrices (model.h enum
 * k3_model_int8_role: KDA attention, MLA attention, dense/shared MLP, the
 * latent projections, the router, lm_head) is int8, so the error can be
 * told apart by layer type; every such spine is another engine over the
 * same overlay (its I8 tensors are the same mapped bytes).
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/parse.h"
#include "engine/engine.h"
#include "json_fields.h"
#include "k3ctl.h"
#include "model/model.h"
#include "store/store_int8.h"
#include "text/text_tok.h"
#include "text_cli.h"

enum { CMP_MAX_POSITIONS = 65536, CHUNK = 32, MAX_SPINES = 8 };

static void usage(void)
{
	fprintf(stderr,
		"usage: k3ctl bench --compare-spine --model DIR (--text FILE | --prompt S | --ids LIST)\n"
		"       [--positions N] [--spine-int8-dir DIR] [--int8 CLASSES] [--per-class]\n"
		"       [--threads N]\n"
		"CLASSES: default (all but router), all, or a comma list of kda, mla, mlp, latent,\n"
		"router, lm_head\n");
}

struct figures {
	uint64_t n, agree, next_ref, next_cmp;
	double kl_sum, kl_max, dlogit_max, rel_sum;
};

struct spine {
	unsigned roles;              /* 0: the BF16 reference */
	struct k3_model *model;
	struct k3_engine *e;
	struct k3_engine_seq *seq;
	float *logits;               /* [CHUNK][V] */
	struct figures f;
	struct k3_model_int8_info info;
};

static int parse_ids(const char *s, uint32_t **out, size_t *n, struct k3_err *err)
{
	size_t cap = 1;
	for (const char *p = s; *p; p++)
		cap += *p == ',';
	if (cap > CMP_MAX_POSITIONS + 1)
		return k3_err_set(err, -E2BIG, "more than %d ids", CMP_MAX_POSITIONS + 1);
	uint32_t *v = calloc(cap, sizeof(*v));
	char *copy = strdup(s), *save = NULL;
	size_t k = 0;
	int rc = v && copy ? 0 : k3_err_set(err, -ENOMEM, "out of memory");
	for (char *t = rc ? NULL : strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		uint64_t x;
		if ((rc = k3_parse_u64(t, 0, INT32_MAX, &x, err)))
			break;
		v[k++] = (uint32_t)x;
	}
	free(copy);
	if (!rc && !k)
		rc = k3_err_set(err, -EINVAL, "no ids in '%s'", s);
	if (rc) {
		free(v);
		return rc;
	}
	*out = v;
	*n = k;
	return 0;
}

static uint32_t argmax(const float *l, uint32_t V)
{
	return k3_engine_argmax(l, V);
}

/* log sum_v exp(l_v), in double */
static double lse(const float *l, uint32_t V)
{
	double mx = -INFINITY, s = 0;
	for (uint32_t v = 0; v < V; v++)
		if (l[v] > mx)
			mx = l[v];
	for (uint32_t v = 0; v < V; v++)
		s += exp((double)l[v] - mx);
	return mx + log(s);
}

/* Adds position (a = reference logits, b = compared) to f; next is the
 * text's next token or UINT32_MAX. */
static void compare(const float *a, const float *b, uint32_t V, uint32_t next, struct figures *f)
{
	double la = lse(a, V), lb = lse(b, V), kl = 0, d2 = 0, a2 = 0;
	uint32_t ta = argmax(a, V), tb = argmax(b, V);

	for (uint32_t v = 0; v < V; v++) {
		double pa = (double)a[v] - la, pb = (double)b[v] - lb, d = (double)b[v] - a[v];
		kl += exp(pa) * (pa - pb);
		d2 += d * d;
		a2 += (double)a[v] * a[v];
		if (fabs(d) > f->dlogit_max)
			f->dlogit_max = fabs(d);
	}
	if (kl < 0)
		kl = 0;   /* rounding of two equal distributions */
	f->n++;
	f->agree += ta == tb;
	f->next_ref += ta == next;
	f->next_cmp += tb == next;
	f->kl_sum += kl;
	if (kl > f->kl_max)
		f->kl_max = kl;
	f->rel_sum += a2 > 0 ? sqrt(d2 / a2) : 0;
}

static void roles_str(unsigned roles, char *buf, size_t n)
{
	size_t o = 0;
	buf[0] = '\0';
	if (roles == K3_MODEL_INT8_DEFAULT) {
		snprintf(buf, n, "default");
		return;
	}
	if (roles == K3_MODEL_INT8_ALL) {
		snprintf(buf, n, "all");
		return;
	}
	for (unsigned b = 1; b <= K3_MODEL_INT8_ALL; b <<= 1)
		if (roles & b)
			o += (size_t)snprintf(buf + o, o < n ? n - o : 0, "%s%s", o ? "," : "",
					      k3_model_int8_role_name(b));
}

static int open_spine(struct spine *sp, const char *model_dir, const char *int8_dir,
		      uint32_t threads, uint32_t n_tok, struct k3_err *err)
{
	struct k3_engine_opts eo = { .threads = threads, .max_chunk = CHUNK };
	int rc = sp->roles ? k3_store_int8_open_model(model_dir, int8_dir, sp->roles, &sp->model, err)
			   : k3_model_open(model_dir, &sp->model, err);
	if (!rc)
		rc = k3_engine_open(sp->model, &eo, &sp->e, err);
	if (!rc)
		rc = k3_engine_seq_new(sp->e, n_tok, &sp->seq, err);
	if (!rc) {
		sp->logits = calloc((size_t)CHUNK * k3_engine_vocab(sp->e), sizeof(float));
		if (!sp->logits)
			rc = k3_err_set(err, -ENOMEM, "out of memory for logits");
	}
	if (!rc)
		k3_model_int8_info_get(sp->model, &sp->info);
	return rc;
}

static void close_spine(struct spine *sp)
{
	free(sp->logits);
	k3_engine_seq_free(sp->seq);
	k3_engine_free(sp->e);
	k3_model_free(sp->model);
}

static json_t *figures_json(const struct spine *sp)
{
	const struct figures *f = &sp->f;
	char r[96];
	double n = f->n ? (double)f->n : 1;
	roles_str(sp->roles, r, sizeof(r));
	return json_pack("{s:s, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:I, s:I}", "int8", r,
			 "matrices", (json_int_t)sp->info.matrices,
			 "int8_bytes", (json_int_t)sp->info.int8_bytes,
			 "top1_agreement", (double)f->agree / n, "mean_kl", f->kl_sum / n,
			 "max_kl", f->kl_max, "max_abs_dlogit", f->dlogit_max,
			 "mean_rel_l2", f->rel_sum / n, "next_token_top1", (double)f->next_cmp / n,
			 "positions", (json_int_t)f->n, "bf16_bytes", (json_int_t)sp->info.bf16_bytes);
}

static const char *const compare_flags[] = { "--compare-spine", "--per-class", NULL };
static const struct k3ctl_args_spec compare_args = {
	.cmd = "bench", .flags = compare_flags, .help = usage,
	.need = "%s needs a value (see --compare-spine --help)",
};

int k3ctl_bench_compare_spine(int argc, char **argv)
{
	const char *model_dir = NULL, *text_file = NULL, *prompt = NULL, *ids_s = NULL;
	const char *int8_dir = NULL;
	uint64_t positions = 128, threads = 0;
	unsigned roles = K3_MODEL_INT8_DEFAULT;
	bool per_class = false;
	struct k3_err err = { 0 };
	int rc = 0;

	const struct k3ctl_arg_str strs[] = {
		{ "--model", &model_dir }, { "--text", &text_file }, { "--prompt", &prompt },
		{ "--ids", &ids_s }, { "--spine-int8-dir", &int8_dir },
	};
	struct k3ctl_args args = { .spec = &compare_args, .argc = argc, .argv = argv,
				   .strs = strs, .n_strs = sizeof(strs) / sizeof(strs[0]),
				   .rc = &rc, .err = &err };
	while (k3ctl_args_next(&args)) {
		const char *a = args.opt, *val = args.val;
		if (!strcmp(a, "--compare-spine"))
			continue;   /* what brought the walk here */
		if (!strcmp(a, "--per-class"))
			per_class = true;
		else if (!strcmp(a, "--positions"))
			rc = k3_parse_u64(val, 1, CMP_MAX_POSITIONS, &positions, &err);
		else if (!strcmp(a, "--threads"))
			rc = k3_parse_u64(val, 1, 256, &threads, &err);
		else if (!strcmp(a, "--int8")) {
			rc = k3_model_int8_roles_parse(val, &roles, &err);
			if (!rc && !roles)
				rc = k3_err_set(&err, -EINVAL, "'none' leaves nothing to compare");
		} else
			return k3ctl_usage("bench", "unknown option '%s' for --compare-spine", a);
	}
	if (args.stop)
		return args.code;
	if (!model_dir)
		return k3ctl_usage("bench", "--compare-spine needs --model DIR");
	if (!!text_file + !!prompt + !!ids_s != 1)
		return k3ctl_usage("bench", "--compare-spine needs one of --text FILE, --prompt S,"
				   " --ids LIST");

	uint32_t *toks = NULL;
	size_t n_tok = 0;
	char *text = NULL;
	size_t text_len = 0;
	int code = K3CTL_EXIT_ERROR;
	struct spine sp[MAX_SPINES];
	size_t n_sp = 0;
	memset(sp, 0, sizeof(sp));

	if (ids_s) {
		if ((rc = parse_ids(ids_s, &toks, &n_tok, &err)))
			return k3ctl_usage("bench", "--ids: %s", err.msg);
	} else {
		struct k3_tok *tok = NULL;
		struct k3_tok_ids ids = { 0 };
		if (text_file) {
			if (text_cli_read(text_file, &text, &text_len))
				return K3CTL_EXIT_ERROR;
		} else {
			text = strdup(prompt);
			text_len = text ? strlen(prompt) : 0;
		}
		rc = text ? k3_tok_load_dir(model_dir, &tok, &err)
			  : k3_err_set(&err, -ENOMEM, "out of memory");
		if (!rc)
			rc = k3_tok_encode(tok, text, text_len, false, &ids, &err);
		k3_tok_free(tok);
		if (!rc) {
			n_tok = ids.n;
			toks = malloc((n_tok ? n_tok : 1) * sizeof(*toks));
			if (toks)
				memcpy(toks, ids.v, n_tok * sizeof(*toks));
			else
				rc = k3_err_set(&err, -ENOMEM, "out of memory");
		}
		k3_tok_ids_release(&ids);
		if (rc) {
			free(text);
			return k3ctl_fail(K3CTL_EXIT_ERROR, "compare-spine: %s (a model without a"
					  " tokenizer takes --ids)", err.msg);
		}
	}
	if (n_tok < 2) {
		code = k3ctl_usage("bench", "the text gives %zu tokens: at least 2 are needed", n_tok);
		goto out;
	}
	/* position t is scored against token t + 1 where the text has one */
	uint32_t N = (uint32_t)(positions < n_tok ? positions : n_tok);

	sp[n_sp++].roles = 0;
	sp[n_sp++].roles = roles;
	if (per_class)
		for (unsigned b = 1; b <= K3_MODEL_INT8_ALL; b <<= 1)
			sp[n_sp++].roles = b;
	for (size_t i = 0; i < n_sp; i++)
		if ((rc = open_spine(&sp[i], model_dir, int8_dir, (uint32_t)threads, N, &err)))
			goto fail;
	uint32_t V = k3_engine_vocab(sp[0].e);
	for (uint32_t t = 0; t < N; t++)
		if (toks[t] >= V) {
			rc = k3_err_set(&err, -EINVAL, "token %u at position %u is not below the"
					" vocabulary size %u", toks[t], t, V);
			goto fail;
		}
	for (uint32_t p0 = 0; p0 < N; p0 += CHUNK) {
		uint32_t T = N - p0 < CHUNK ? N - p0 : CHUNK;
		for (size_t i = 0; i < n_sp; i++) {
			struct k3_engine_out out = { K3_ENGINE_LOGITS_ALL, sp[i].logits, NULL, NULL };
			if ((rc = k3_engine_forward(sp[i].e, sp[i].seq, (const int32_t *)toks + p0, T,
						    &out, &err)))
				goto fail;
		}
		for (uint32_t t = 0; t < T; t++) {
			uint32_t next = p0 + t + 1 < n_tok ? toks[p0 + t + 1] : UINT32_MAX;
			const float *ref = sp[0].logits + (size_t)t * V;
			sp[0].f.next_cmp += argmax(ref, V) == next;
			sp[0].f.n++;
			for (size_t i = 1; i < n_sp; i++)
				compare(ref, sp[i].logits + (size_t)t * V, V, next, &sp[i].f);
		}
	}
	if (k3ctl_g.json) {
		json_t *o = json_pack("{s:s, s:I, s:b, s:f}", "model", model_dir,
				      "positions", (json_int_t)N, "weight_exact", 0,
				      "bf16_next_token_top1", (double)sp[0].f.next_cmp / N);
		json_t *arr = json_array();
		for (size_t i = 1; i < n_sp; i++)
			json_array_append_new(arr, figures_json(&sp[i]));
		json_object_set_new(o, "int8", arr);
		k3ctl_json_puts(o, JSON_COMPACT, NULL);
	} else {
		printf("compare-spine: %s, %u positions teacher-forced (%zu tokens of input), both"
		       " spines in one process\n", model_dir, N, n_tok);
		printf("reference: the checkpoint's BF16 spine (weight-exact); compared: int8 spine"
		       " (not weight-exact) from %s, %zu matrices, %.3f GB of BF16 -> %.3f GB\n",
		       sp[1].info.dir, sp[1].info.matrices, (double)sp[1].info.bf16_bytes / 1e9,
		       (double)sp[1].info.int8_bytes / 1e9);
		printf("%-34s %8s %12s %10s %12s %10s %8s\n", "int8 matrices", "top-1", "mean KL",
		       "max KL", "max|dlogit|", "rel-L2", "next-tok");
		printf("%-34s %8s %12s %10s %12s %10s %7.1f%%\n", "none (bf16 reference)", "-", "-",
		       "-", "-", "-", 100.0 * (double)sp[0].f.next_cmp / N);
		for (size_t i = 1; i < n_sp; i++) {
			const struct figures *f = &sp[i].f;
			char r[96], label[128];
			roles_str(sp[i].roles, r, sizeof(r));
			snprintf(label, sizeof(label), "%s%s (%zu)", i >= 2 ? "only " : "", r,
				 sp[i].info.matrices);
			printf("%-34s %7.2f%% %12.3e %10.3e %12.4f %10.3e %7.1f%%\n", label,
			       100.0 * (double)f->agree / (double)f->n, f->kl_sum / (double)f->n,
			       f->kl_max, f->dlogit_max, f->rel_sum / (double)f->n,
			       100.0 * (double)f->next_cmp / (double)f->n);
		}
		printf("top-1 = argmax agreement with the bf16 spine; KL(bf16 || int8) in nats; "
		       "rel-L2 = ||l_int8 - l_bf16|| / ||l_bf16|| per position, mean; next-tok = "
		       "top-1 is the text's next token\n");
	}
	code = K3CTL_EXIT_OK;
	rc = 0;
fail:
	if (rc)
		k3ctl_fail(K3CTL_EXIT_ERROR, "compare-spine: %s", err.msg);
out:
	for (size_t i = 0; i < n_sp; i++)
		close_spine(&sp[i]);
	free(toks);
	free(text);
	return code;
}
