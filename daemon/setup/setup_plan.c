/* setup_plan.c - the offline plan and the offline audit of an install (see setup_install.h). */
#include "setup/setup_install.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <jansson.h>

#include "model/model.h"
#include "setup/setup_experts.h"
#include "setup/setup_partial.h"
#include "setup/setup_publish.h"
#include "setup/setup_session.h"
#include "setup/setup_state.h"
#include "setup/setup_verify.h"

#define GB 1000000000ull

void k3_setup_opts_default(struct k3_setup_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->workers = 4;
	o->idle_timeout_s = 60;
	o->retries = 8;
	o->retry_delay_ms = 1000;
	o->chunk = K3_SETUP_CHUNK_DEFAULT;
	o->reserve = -1;
	o->progress = K3_SETUP_PROGRESS_AUTO;
	o->out = stdout;
}

static bool is_shard(const char *path)
{
	size_t n = strlen(path);

	return n > 12 && strcmp(path + n - 12, ".safetensors") == 0;
}

/* Free space where dir is or would be created: statvfs of dir or of its
 * nearest existing ancestor. */
static int free_space(const char *dir, uint64_t *avail, uint64_t *total)
{
	char buf[4096];
	struct statvfs sv;

	snprintf(buf, sizeof(buf), "%s", dir);
	for (;;) {
		if (statvfs(buf, &sv) == 0) {
			*avail = (uint64_t)sv.f_bavail * sv.f_frsize;
			*total = (uint64_t)sv.f_blocks * sv.f_frsize;
			return 0;
		}
		if (errno != ENOENT)
			return -errno;
		char *slash = strrchr(buf, '/');
		if (!slash)
			snprintf(buf, sizeof(buf), ".");
		else if (slash == buf)
			buf[1] = '\0';
		else
			*slash = '\0';
	}
}

int k3_setup_plan_compute(const struct k3_setup_inventory *inv, const struct k3_setup_opts *o,
			  struct k3_setup_plan *plan, struct k3_err *err)
{
	struct k3_setup_state *state = NULL;
	int dfd, rc;

	memset(plan, 0, sizeof(*plan));
	rc = free_space(o->dir, &plan->free_bytes, &plan->fs_bytes);
	if (rc)
		return k3_err_set(err, rc, "cannot measure the free space for '%s': %s", o->dir,
				  strerror(-rc));
	if (o->reserve >= 0) {
		plan->reserve_bytes = (uint64_t)o->reserve;
	} else {
		/* 2% of the file system, at least 1 GB, at most 50 GB */
		plan->reserve_bytes = plan->fs_bytes / 50;
		if (plan->reserve_bytes < GB)
			plan->reserve_bytes = GB;
		if (plan->reserve_bytes > 50 * GB)
			plan->reserve_bytes = 50 * GB;
	}
	dfd = open(o->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0 && k3_setup_state_load(dfd, &state, err) != 0) {
		close(dfd);
		return err ? err->code : -EINVAL;
	}
	plan->files = inv->n_files;
	for (size_t i = 0; i < inv->n_files; i++) {
		const struct k3_setup_file *f = &inv->files[i];
		const struct k3_setup_record *r = state ? k3_setup_state_find(state, f->path) : NULL;
		bool shard_stream = o->stream && is_shard(f->path);
		uint64_t want = f->size;   /* bytes this install mode needs of the file */
		struct stat st;

		if (!f->size_known)
			plan->files_size_unknown++;
		plan->bytes_total += f->size;
		plan->eventual_bytes += f->size;
		if (shard_stream) {
			if (f->spine_known)
				want = f->spine_bytes;
			else
				plan->spine_unknown = true;
		}
		if (dfd >= 0 && fstatat(dfd, f->path, &st, AT_SYMLINK_NOFOLLOW) == 0) {
			if (S_ISLNK(st.st_mode) || !S_ISREG(st.st_mode)) {
				if (!plan->problem[0])
					snprintf(plan->problem, sizeof(plan->problem), "'%s/%s' is %s: the"
						 " install will refuse to write through or replace it", o->dir,
						 f->path, S_ISLNK(st.st_mode) ? "a symbolic link" : "not a regular file");
				continue;
			}
			if (r && k3_setup_record_same_file(r, &st) && r->have == K3_SETUP_HAVE_VERIFIED) {
				plan->files_present++;
				plan->bytes_present += f->size;
				continue;
			}
			if (r && k3_setup_record_same_file(r, &st) && r->have == K3_SETUP_HAVE_SPARSE) {
				uint64_t spine = f->spine_known ? f->spine_bytes : 0;
				plan->bytes_present += spine;
				if (shard_stream) {
					plan->files_present++;
				} else {
					/* the holes fill in place */
					plan->files_to_fetch++;
					plan->bytes_to_fetch += f->size - spine;
					plan->peak_bytes += f->size - spine;
				}
				continue;
			}
			if (r && k3_setup_record_same_file(r, &st)) {
				/* ours, known incomplete or bad: fetched afresh */
				plan->files_to_fetch++;
				plan->bytes_to_fetch += want;
				plan->peak_bytes += want;
				continue;
			}
			if (f->size_known && (uint64_t)st.st_size == f->size) {
				plan->files_to_hash++;
				plan->bytes_present += f->size;
				continue;
			}
			if (!plan->problem[0])
				snprintf(plan->problem, sizeof(plan->problem), "'%s/%s' exists with %jd bytes,"
					 " the inventory pins %" PRIu64 ": k3ctl never replaces a file it did not"
					 " verify (move it away)", o->dir, f->path, (intmax_t)st.st_size, f->size);
			continue;
		}
		{
			uint64_t have = 0;
			struct stat ps;
			char part[K3_SETUP_NAME_MAX + 16];
			snprintf(part, sizeof(part), "%s.partial", f->path);
			if (!shard_stream && dfd >= 0) {
				have = k3_setup_partial_estimate(dfd, f->path);
				if (have > want)
					have = want;
			}
			plan->files_to_fetch++;
			plan->bytes_present += have;
			plan->bytes_to_fetch += want - have;
			/* a partial already holds its bytes on disk; it grows to want */
			if (dfd >= 0 && fstatat(dfd, part, &ps, AT_SYMLINK_NOFOLLOW) == 0 &&
			    S_ISREG(ps.st_mode) && (uint64_t)ps.st_blocks * 512 < want)
				plan->peak_bytes += want - (uint64_t)ps.st_blocks * 512;
			else if (dfd < 0 || fstatat(dfd, part, &ps, AT_SYMLINK_NOFOLLOW) != 0)
				plan->peak_bytes += want;
		}
	}
	/* the setup's own files: state, pinned inventory, expert map */
	plan->peak_bytes += 16ull << 20;
	plan->fits = plan->free_bytes >= plan->peak_bytes + plan->reserve_bytes;
	k3_setup_state_free(state);
	if (dfd >= 0)
		close(dfd);
	return 0;
}

void k3_setup_plan_print(const struct k3_setup_plan *plan, const struct k3_setup_inventory *inv,
			 const struct k3_setup_opts *o, bool json, FILE *out)
{
	char a[32], b[32], c[32], d[32], e[32];

	if (json) {
		json_t *j = json_pack("{ss ss ss ss sb sI sI sI sI sI sI sI sI sI sI sI sI sb sb ss}",
				      "repository", inv->repository, "revision", inv->revision,
				      "dir", o->dir, "mode", o->stream ? "stream" : "full",
				      "fits", plan->fits,
				      "files", (json_int_t)plan->files,
				      "files_present", (json_int_t)plan->files_present,
				      "files_to_fetch", (json_int_t)plan->files_to_fetch,
				      "files_to_hash", (json_int_t)plan->files_to_hash,
				      "files_size_from_listing", (json_int_t)plan->files_size_unknown,
				      "bytes_total", (json_int_t)plan->bytes_total,
				      "bytes_present", (json_int_t)plan->bytes_present,
				      "bytes_to_fetch", (json_int_t)plan->bytes_to_fetch,
				      "peak_bytes", (json_int_t)plan->peak_bytes,
				      "free_bytes", (json_int_t)plan->free_bytes,
				      "reserve_bytes", (json_int_t)plan->reserve_bytes,
				      "eventual_bytes", (json_int_t)plan->eventual_bytes,
				      "spine_unknown", plan->spine_unknown,
				      "network", false, "problem", plan->problem);
		char *s = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
		if (s)
			fprintf(out, "%s\n", s);
		free(s);
		json_decref(j);
		return;
	}
	k3_setup_bytes_str(plan->bytes_total, a, sizeof(a));
	k3_setup_bytes_str(plan->bytes_present, b, sizeof(b));
	k3_setup_bytes_str(plan->bytes_to_fetch, c, sizeof(c));
	fprintf(out, "plan: %s@%s into %s (%s install; read from disk only, nothing fetched or"
		" written)\n", inv->repository, inv->revision, o->dir, o->stream ? "streaming" : "full");
	fprintf(out, "  files:      %zu: %zu present and verified, %zu to fetch, %zu present to verify"
		" by hashing\n", plan->files, plan->files_present, plan->files_to_fetch,
		plan->files_to_hash);
	fprintf(out, "  bytes:      %s in all, %s present, %s to fetch\n", a, b, c);
	k3_setup_bytes_str(plan->peak_bytes, a, sizeof(a));
	k3_setup_bytes_str(plan->free_bytes, b, sizeof(b));
	k3_setup_bytes_str(plan->fs_bytes, c, sizeof(c));
	k3_setup_bytes_str(plan->reserve_bytes, d, sizeof(d));
	fprintf(out, "  peak disk:  %s more than now%s\n", a,
		plan->spine_unknown ? " (at most: some shards' spine sizes are not in the inventory)" : "");
	fprintf(out, "  free space: %s of %s, %s of it kept free\n", b, c, d);
	if (o->stream) {
		k3_setup_bytes_str(plan->eventual_bytes, e, sizeof(e));
		fprintf(out, "  streaming:  routed experts arrive on demand; the install grows up to %s"
			" as they do\n", e);
	}
	if (plan->files_size_unknown)
		fprintf(out, "  note:       the size of %zu file%s comes from the remote listing at %s"
			" on first use (counted as 0 here)\n", plan->files_size_unknown,
			plan->files_size_unknown == 1 ? "" : "s", inv->revision);
	if (plan->fits) {
		k3_setup_bytes_str(plan->free_bytes - plan->peak_bytes - plan->reserve_bytes, e, sizeof(e));
		fprintf(out, "  result:     fits (%s to spare)\n", e);
	} else {
		k3_setup_bytes_str(plan->peak_bytes + plan->reserve_bytes - plan->free_bytes, e, sizeof(e));
		fprintf(out, "  result:     does NOT fit: %s more free space is needed (or a smaller"
			" --reserve%s)\n", e, o->stream ? "" : ", or --stream");
	}
	if (plan->problem[0])
		fprintf(out, "  problem:    %s\n", plan->problem);
}

/* ---- the audit ---- */

struct audit {
	size_t verified, sparse, missing, mismatched, partial, unrecorded;
	json_t *files;
};

static void note(struct audit *a, bool json, FILE *out, const char *path, const char *status,
		 const char *detail)
{
	if (json)
		json_array_append_new(a->files, json_pack("{ss ss ss}", "path", path, "status", status,
							  "detail", detail ? detail : ""));
	else
		fprintf(out, "  %-10s %s%s%s\n", status, path, detail && *detail ? ": " : "",
			detail ? detail : "");
}

static void audit_file(struct k3_setup_session *s, const struct k3_setup_file *f, bool rehash,
		       bool json, struct audit *a)
{
	FILE *out = s->o->out;
	struct k3_setup_record *r = k3_setup_state_find(s->state, f->path);
	char detail[K3_ERR_MSG_MAX + 64], what[4096];
	struct k3_err err = { 0, "" };
	uint8_t d[32];
	struct stat st;
	int fd;

	k3_setup_session_path(s, f->path, what, sizeof(what));
	if (fstatat(s->dirfd, f->path, &st, AT_SYMLINK_NOFOLLOW) != 0) {
		uint64_t have = k3_setup_partial_estimate(s->dirfd, f->path);
		if (have) {
			snprintf(detail, sizeof(detail), "%" PRIu64 " of %" PRIu64 " bytes in .partial"
				 " (run k3ctl setup to resume)", have, f->size);
			a->partial++;
			note(a, json, out, f->path, "partial", detail);
		} else {
			a->missing++;
			note(a, json, out, f->path, "missing", NULL);
		}
		return;
	}
	if (!S_ISREG(st.st_mode)) {
		a->mismatched++;
		note(a, json, out, f->path, "refused", S_ISLNK(st.st_mode) ? "a symbolic link" :
			 "not a regular file");
		return;
	}
	if ((uint64_t)st.st_size != f->size) {
		snprintf(detail, sizeof(detail), "%jd bytes, the inventory pins %" PRIu64,
			 (intmax_t)st.st_size, f->size);
		a->mismatched++;
		note(a, json, out, f->path, "MISMATCH", detail);
		return;
	}
	if (r && k3_setup_record_same_file(r, &st) && r->have == K3_SETUP_HAVE_SPARSE && !rehash) {
		a->sparse++;
		note(a, json, out, f->path, "sparse", "header and spine present, routed experts on demand");
		return;
	}
	if (r && k3_setup_record_same_file(r, &st) && r->have == K3_SETUP_HAVE_VERIFIED && !rehash &&
	    memcmp(r->sha256, f->sha256, 32) == 0) {
		a->verified++;
		note(a, json, out, f->path, "verified", NULL);
		return;
	}
	if (r && k3_setup_record_same_file(r, &st) && r->have == K3_SETUP_HAVE_SPARSE) {
		a->sparse++;
		note(a, json, out, f->path, "sparse", "not rehashed: its experts arrive on demand");
		return;
	}
	fd = k3_setup_open_file(s->dirfd, f->path, O_RDONLY, 0, what, &err);
	if (fd < 0 || k3_setup_sha256_fd(fd, 0, f->size, d, what, &err) != 0) {
		if (fd >= 0)
			close(fd);
		a->mismatched++;
		note(a, json, out, f->path, "unreadable", err.msg);
		return;
	}
	close(fd);
	if (memcmp(d, f->sha256, 32) != 0) {
		char hex[K3_SETUP_SHA256_HEX];
		k3_setup_sha256_hex(d, hex);
		snprintf(detail, sizeof(detail), "SHA-256 %s differs from the inventory", hex);
		a->mismatched++;
		note(a, json, out, f->path, "MISMATCH", detail);
		return;
	}
	if (r && k3_setup_record_same_file(r, &st)) {
		a->verified++;
		note(a, json, out, f->path, "verified", "rehashed");
	} else {
		a->unrecorded++;
		a->verified++;
		note(a, json, out, f->path, "verified", "hashed now (not recorded by setup)");
	}
}

/* "layer 1: 0,3-5; layer 2: 7" for the experts in state `want` (at most
 * max bytes, then " ..."); every one also into arr when given. */
static void list_experts(const struct k3_setup_expert_map *map, enum k3_setup_expert_have want,
			 char *buf, size_t max, json_t *arr)
{
	uint32_t nl = k3_setup_expert_map_layers(map), ne = k3_setup_expert_map_experts(map);
	bool cut = false;
	size_t len = 0;

	buf[0] = '\0';
	for (uint32_t l = 0; l < nl; l++) {
		bool first = true;
		for (uint32_t e = 0; e < ne; e++) {
			uint32_t end = e;
			if (k3_setup_expert_map_get(map, l, e) != want)
				continue;
			while (end + 1 < ne && k3_setup_expert_map_get(map, l, end + 1) == want)
				end++;
			for (uint32_t k = e; arr && k <= end; k++)
				json_array_append_new(arr, json_pack("[ii]", (int)l, (int)k));
			if (len + 48 < max) {
				if (first)
					len += (size_t)snprintf(buf + len, max - len, "%slayer %u: ",
								len ? "; " : "", l);
				else
					len += (size_t)snprintf(buf + len, max - len, ",");
				len += (size_t)(end > e ? snprintf(buf + len, max - len, "%u-%u", e, end)
							: snprintf(buf + len, max - len, "%u", e));
			} else if (!cut) {
				snprintf(buf + len, max - len, " ...");
				len += 4;
				cut = true;
			}
			first = false;
			e = end;
		}
	}
}

int k3_setup_check(const struct k3_setup_inventory *inv, const struct k3_setup_opts *o,
		   bool rehash, bool json, struct k3_err *err)
{
	struct k3_setup_session s;
	struct k3_setup_expert_map *map = NULL;
	struct audit a = { 0 };
	json_t *root = NULL, *tls = NULL;
	uint64_t counts[4] = { 0 };
	char tls_list[2048] = "";
	int rc;

	rc = k3_setup_session_open(&s, o, inv, false, false, err);
	if (rc)
		return rc;
	if (json) {
		root = json_object();
		a.files = json_array();
		tls = json_array();
	} else {
		fprintf(o->out, "check: %s@%s in %s (offline)\n", s.inv->repository, s.inv->revision, o->dir);
	}
	for (size_t i = 0; i < s.inv->n_files; i++)
		audit_file(&s, &s.inv->files[i], rehash, json, &a);
	if (k3_setup_expert_map_open(s.dirfd, false, &map, NULL) == 0) {
		k3_setup_expert_map_counts(map, counts);
		list_experts(map, K3_SETUP_EXPERT_TLS, tls_list, sizeof(tls_list), tls);
	}
	if (json) {
		json_object_set_new(root, "repository", json_string(s.inv->repository));
		json_object_set_new(root, "revision", json_string(s.inv->revision));
		json_object_set_new(root, "stream", json_boolean(s.state->stream));
		json_object_set_new(root, "files", a.files);
		json_object_set_new(root, "experts", json_pack("{sI sI sI sI}",
			"absent", (json_int_t)counts[0], "tls_only", (json_int_t)counts[1],
			"verified_expert", (json_int_t)counts[2], "verified_shard", (json_int_t)counts[3]));
		json_object_set_new(root, "tls_only", tls);
	} else {
		fprintf(o->out, "files: %zu verified, %zu sparse, %zu missing, %zu partial, %zu wrong\n",
			a.verified, a.sparse, a.missing, a.partial, a.mismatched);
		if (map) {
			fprintf(o->out, "routed experts: %" PRIu64 " absent (fetched on demand), %" PRIu64
				" verified against the per-expert table, %" PRIu64 " verified with their"
				" whole shard, %" PRIu64 " verified only by TLS so far\n", counts[0],
				counts[2], counts[3], counts[1]);
			if (counts[1])
				fprintf(o->out, "verified only by TLS so far: %s\n", tls_list);
		}
	}
	if (a.mismatched)
		rc = k3_err_set(err, -EBADMSG, "%zu file%s of '%s' do not match the inventory", a.mismatched,
				a.mismatched == 1 ? "" : "s", o->dir);
	else if (a.missing || a.partial)
		rc = k3_err_set(err, -ENOENT, "the install at '%s' is incomplete: %zu file%s missing or"
				" partial (run k3ctl setup)", o->dir, a.missing + a.partial,
				a.missing + a.partial == 1 ? "" : "s");
	if (rc == 0 && !map && a.sparse)
		rc = k3_err_set(err, -EBADMSG, "'%s' has sparse shards but no expert map", o->dir);
	if (rc == 0) {
		struct k3_model *m = NULL;
		struct k3_err me = { 0, "" };
		if (k3_model_open(o->dir, &m, &me) != 0)
			rc = k3_err_set(err, me.code ? me.code : -EINVAL, "'%s' does not open as a"
					" checkpoint: %s", o->dir, me.msg);
		else if (!json)
			fprintf(o->out, "checkpoint: %u layers, %u routed experts per MoE layer, vocab %u:"
				" opens as k3d will open it\n", k3_model_config(m)->num_hidden_layers,
				k3_model_config(m)->num_experts, k3_model_config(m)->vocab_size);
		k3_model_free(m);
	}
	if (json) {
		json_object_set_new(root, "ok", json_boolean(rc == 0));
		json_object_set_new(root, "message", json_string(rc && err ? err->msg : ""));
		char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
		if (text)
			fprintf(o->out, "%s\n", text);
		free(text);
		json_decref(root);
	}
	k3_setup_expert_map_close(map);
	k3_setup_session_close(&s);
	return rc;
}
