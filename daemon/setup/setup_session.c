/* setup_session.c - directory, lock, state, pinned inventory, engine (see setup_session.h). */
#include "setup/setup_session.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "setup/setup_publish.h"

#define LISTING_MAX ((size_t)16 << 20)
enum { LISTING_PAGES = 64 };

static struct k3_setup_inventory *inventory_dup(const struct k3_setup_inventory *inv,
						struct k3_err *err)
{
	struct k3_setup_inventory *copy = NULL;
	char *text = k3_setup_inventory_dump(inv);

	if (!text) {
		k3_err_set(err, -ENOMEM, "out of memory");
		return NULL;
	}
	if (k3_setup_inventory_parse(text, strlen(text), &copy, err) != 0)
		copy = NULL;
	free(text);
	return copy;
}

static int load_pinned(struct k3_setup_session *s, struct k3_setup_inventory **out,
		       struct k3_err *err)
{
	char *text = NULL;
	size_t len;
	int sd, rc;

	*out = NULL;
	sd = openat(s->dirfd, K3_SETUP_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (sd < 0)
		return errno == ENOENT ? -ENOENT : k3_err_set(err, -errno, "cannot open '%s/"
							       K3_SETUP_DIR "': %s", s->o->dir, strerror(errno));
	rc = k3_setup_read_file(sd, K3_SETUP_PINNED_NAME, K3_SETUP_INVENTORY_MAX_BYTES, &text, &len,
				K3_SETUP_DIR "/" K3_SETUP_PINNED_NAME, err);
	close(sd);
	if (rc)
		return rc;
	rc = k3_setup_inventory_parse(text, len, out, err);
	free(text);
	if (rc)
		k3_err_prefix(err, "%s/" K3_SETUP_DIR "/" K3_SETUP_PINNED_NAME, s->o->dir);
	return rc;
}

int k3_setup_session_open(struct k3_setup_session *s, const struct k3_setup_opts *o,
			  const struct k3_setup_inventory *inv, bool create, bool lock,
			  struct k3_err *err)
{
	struct k3_setup_inventory *pinned = NULL;
	int rc;

	memset(s, 0, sizeof(*s));
	s->o = o;
	s->dirfd = s->lockfd = -1;
	rc = k3_setup_dir_open(o->dir, create, &s->dirfd, err);
	if (rc) {
		if (rc == -ENOENT && !create)
			k3_err_set(err, -ENOENT, "no install at '%s' (k3ctl setup --full or --stream"
				   " makes one)", o->dir);
		return rc;
	}
	if (lock && (rc = k3_setup_lock(s->dirfd, false, &s->lockfd, err)) != 0)
		goto fail;
	rc = k3_setup_state_load(s->dirfd, &s->state, err);
	if (rc)
		goto fail;
	rc = load_pinned(s, &pinned, err);
	if (rc && rc != -ENOENT)
		goto fail;
	if (pinned && inv) {
		rc = k3_setup_inventory_agree(inv, pinned, err);
		if (rc) {
			k3_err_prefix(err, "manifest mismatch for the install at '%s' (use another"
				      " --model-root, or move it away)", o->dir);
			goto fail;
		}
	}
	if (pinned) {
		s->inv = pinned;
		s->inv_pinned = k3_setup_inventory_incomplete(pinned) == NULL;
		pinned = NULL;
	} else if (inv) {
		if (!(s->inv = inventory_dup(inv, err))) {
			rc = err ? err->code : -ENOMEM;
			goto fail;
		}
	} else {
		rc = k3_err_set(err, -ENOENT, "'%s' is not a k3ctl install (no " K3_SETUP_DIR "/"
				K3_SETUP_PINNED_NAME "): run k3ctl setup first, or pass --inventory FILE",
				o->dir);
		goto fail;
	}
	if (s->state->repository[0] && (strcmp(s->state->repository, s->inv->repository) ||
					strcmp(s->state->revision, s->inv->revision))) {
		rc = k3_err_set(err, -EBADMSG, "manifest mismatch: the install at '%s' holds %s@%s,"
				" the inventory is %s@%s", o->dir, s->state->repository,
				s->state->revision, s->inv->repository, s->inv->revision);
		goto fail;
	}
	snprintf(s->state->repository, sizeof(s->state->repository), "%s", s->inv->repository);
	snprintf(s->state->revision, sizeof(s->state->revision), "%s", s->inv->revision);
	if (o->from) {
		size_t n = strlen(o->from);
		if (n + 1 >= sizeof(s->base_url) || strncmp(o->from, "https://", 8) != 0) {
			rc = k3_err_set(err, -EINVAL, "--from must be an https:// URL");
			goto fail;
		}
		snprintf(s->base_url, sizeof(s->base_url), "%s%s", o->from,
			 o->from[n - 1] == '/' ? "" : "/");
	} else if (s->inv->base_url) {
		snprintf(s->base_url, sizeof(s->base_url), "%s", s->inv->base_url);
	} else if (s->state->base_url) {
		snprintf(s->base_url, sizeof(s->base_url), "%s", s->state->base_url);
	}
	k3_setup_inventory_free(pinned);
	return 0;
fail:
	k3_setup_inventory_free(pinned);
	k3_setup_session_close(s);
	return rc;
}

void k3_setup_session_close(struct k3_setup_session *s)
{
	k3_setup_net_free(s->net);
	k3_setup_progress_free(s->pr);
	k3_setup_inventory_free(s->inv);
	k3_setup_state_free(s->state);
	if (s->lockfd >= 0)
		close(s->lockfd);
	if (s->dirfd >= 0)
		close(s->dirfd);
	s->net = NULL;
	s->pr = NULL;
	s->inv = NULL;
	s->state = NULL;
	s->lockfd = s->dirfd = -1;
}

int k3_setup_session_net(struct k3_setup_session *s, struct k3_err *err)
{
	const struct k3_setup_opts *o = s->o;
	char host[K3_SETUP_HOST_MAX + 1], lhost[K3_SETUP_HOST_MAX + 1];
	char *allow[K3_SETUP_MAX_ALLOW_HOSTS + 2];
	size_t n = 0;
	struct k3_setup_net_opts no = {
		.cacert = o->cacert,
		.workers = o->workers,
		.idle_timeout_s = o->idle_timeout_s,
		.connect_timeout_s = o->idle_timeout_s < 30 ? o->idle_timeout_s : 30,
		.attempts = o->retries + 1,
		.retry_delay_ms = o->retry_delay_ms,
		.max_redirects = 5,
	};

	if (!s->base_url[0])
		return k3_err_set(err, -EINVAL, "the inventory has no base_url: pass --from URL");
	if (k3_setup_url_host(s->base_url, host, sizeof(host)) != 0)
		return k3_err_set(err, -EINVAL, "'%s' is not an https:// URL", s->base_url);
	for (size_t i = 0; i < s->inv->n_allow_hosts; i++)
		allow[n++] = s->inv->allow_hosts[i];
	allow[n++] = host;
	if (s->inv->listing_url && k3_setup_url_host(s->inv->listing_url, lhost, sizeof(lhost)) == 0)
		allow[n++] = lhost;
	no.allow_hosts = allow;
	no.n_allow_hosts = n;
	if (o->token) {
		no.token = o->token;
		no.token_host = host;
	}
	if (!s->net) {
		int rc = k3_setup_net_new(&no, &s->net, err);
		if (rc)
			return rc;
	}
	if (!s->pr && !(s->pr = k3_setup_progress_new(o->progress, stderr, o->out)))
		return k3_err_set(err, -ENOMEM, "out of memory");
	return 0;
}

int k3_setup_session_complete(struct k3_setup_session *s, struct k3_err *err)
{
	const struct k3_setup_file *missing;
	char url[K3_SETUP_URL_MAX + 1], *text = NULL, *dump;
	bool *seen;
	int sd, rc = 0;

	if (s->inv_pinned)
		return 0;
	missing = k3_setup_inventory_incomplete(s->inv);
	if (missing) {
		if (!s->inv->listing_url)
			return k3_err_set(err, -EBADMSG, "the inventory has no size or SHA-256 for '%s'"
					  " and no listing_url to take it from", missing->path);
		seen = calloc(s->inv->n_files, sizeof(bool));
		if (!seen)
			return k3_err_set(err, -ENOMEM, "out of memory");
		snprintf(url, sizeof(url), "%s", s->inv->listing_url);
		for (int page = 0; rc == 0 && url[0] && page < LISTING_PAGES; page++) {
			char next[K3_SETUP_URL_MAX + 1];
			size_t len;
			rc = k3_setup_net_fetch(s->net, url, 0, 0, 0, LISTING_MAX, &text, &len, next, err);
			if (rc == 0)
				rc = k3_setup_inventory_apply_listing(s->inv, text, len, seen, err);
			free(text);
			text = NULL;
			snprintf(url, sizeof(url), "%s", next);
		}
		if (rc == 0 && (missing = k3_setup_inventory_incomplete(s->inv)) != NULL)
			rc = k3_err_set(err, -EBADMSG, "manifest mismatch: '%s' is %s at %s", missing->path,
					seen[missing - s->inv->files] ? "listed without an LFS SHA-256"
								      : "missing from the remote listing",
					s->inv->revision);
		free(seen);
		if (rc)
			return rc;
	}
	dump = k3_setup_inventory_dump(s->inv);
	if (!dump)
		return k3_err_set(err, -ENOMEM, "out of memory");
	rc = k3_setup_subdir_open(s->dirfd, K3_SETUP_DIR, true, 0755, &sd, err);
	if (rc == 0) {
		rc = k3_setup_write_atomic(sd, K3_SETUP_PINNED_NAME, dump, strlen(dump),
					   K3_SETUP_DIR "/" K3_SETUP_PINNED_NAME, err);
		close(sd);
	}
	free(dump);
	if (rc == 0)
		s->inv_pinned = true;
	return rc;
}

int k3_setup_session_url(const struct k3_setup_session *s, const char *path, char *buf,
			 size_t size, struct k3_err *err)
{
	if ((size_t)snprintf(buf, size, "%s%s", s->base_url, path) >= size)
		return k3_err_set(err, -ENAMETOOLONG, "the URL of '%s' is too long", path);
	return 0;
}

int k3_setup_session_save(struct k3_setup_session *s, struct k3_err *err)
{
	return k3_setup_state_save(s->dirfd, s->state, err);
}

const char *k3_setup_session_path(const struct k3_setup_session *s, const char *name, char *buf,
				  size_t size)
{
	snprintf(buf, size, "%s/%s", s->o->dir, name);
	return buf;
}
