/* setup_inventory.c - parse, check, write and scan inventories (see setup_inventory.h). */
#include "setup/setup_inventory.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "setup/setup_experts.h"
#include "setup/setup_publish.h"
#include "setup/setup_verify.h"

#define FORMAT_NAME "k3-inventory"

/* 1..max bytes of letters, digits and the characters in `extra`. */
static bool chars_ok(const char *s, size_t max, const char *extra)
{
	size_t n = strlen(s);

	if (n == 0 || n > max)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)s[i]) && !strchr(extra, s[i]))
			return false;
	return true;
}

bool k3_setup_name_ok(const char *name)
{
	size_t n = name ? strlen(name) : 0;

	if (!name || !chars_ok(name, K3_SETUP_NAME_MAX, "._-") || strcmp(name, ".") == 0 ||
	    strcmp(name, "..") == 0)
		return false;
	/* Our own names: the setup directory, partial downloads and their
	 * journals, packs. A release never needs them. */
	if (strncmp(name, ".k3-", 4) == 0 || strcmp(name, "k3-packs") == 0)
		return false;
	if ((n > 8 && strcmp(name + n - 8, ".partial") == 0) ||
	    (n > 4 && strcmp(name + n - 4, ".k3j") == 0))
		return false;
	return true;
}

static bool revision_ok(const char *s)
{
	return chars_ok(s, 128, "._-");
}

static bool repository_ok(const char *s)
{
	return chars_ok(s, 256, "._-/");
}

static bool host_ok(const char *h)
{
	size_t n = strlen(h);

	if (strncmp(h, "*.", 2) == 0) {
		h += 2;
		n -= 2;
	}
	if (n == 0 || n > K3_SETUP_HOST_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!islower((unsigned char)h[i]) && !isdigit((unsigned char)h[i]) && h[i] != '.' &&
		    h[i] != '-')
			return false;
	return true;
}

int k3_setup_url_host(const char *url, char *host, size_t size)
{
	const char *p, *end;
	size_t n;

	if (!url || strncmp(url, "https://", 8) != 0)
		return -EINVAL;
	p = url + 8;
	end = p + strcspn(p, "/?#");
	/* user info is never ours to send; take what follows the last '@' */
	for (const char *q = p; q < end; q++)
		if (*q == '@')
			p = q + 1;
	if (*p == '[') {        /* IPv6 literal */
		const char *close = memchr(p, ']', (size_t)(end - p));
		if (!close)
			return -EINVAL;
		n = (size_t)(close - p - 1);
		p++;
	} else {
		const char *colon = memchr(p, ':', (size_t)(end - p));
		n = (size_t)((colon ? colon : end) - p);
	}
	if (n == 0 || n >= size)
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		host[i] = (char)tolower((unsigned char)p[i]);
	host[n] = '\0';
	return 0;
}

bool k3_setup_host_allowed(const char *host, char *const *hosts, size_t n)
{
	size_t hl = strlen(host);

	for (size_t i = 0; i < n; i++) {
		const char *a = hosts[i];
		if (strncmp(a, "*.", 2) == 0) {
			size_t al = strlen(a + 1);   /* ".x" */
			if (hl > al && strcmp(host + hl - al, a + 1) == 0)
				return true;
		} else if (strcmp(host, a) == 0) {
			return true;
		}
	}
	return false;
}

static bool url_ok(const char *s, bool dir)
{
	size_t n = strlen(s);
	char host[K3_SETUP_HOST_MAX + 1];

	if (n > K3_SETUP_URL_MAX || k3_setup_url_host(s, host, sizeof(host)) != 0)
		return false;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] <= ' ' || (unsigned char)s[i] >= 0x7f)
			return false;
	return !dir || s[n - 1] == '/';
}

/* The inventory's top-level strings, in the order they are checked: the
 * one list that parsing and freeing both walk. */
static const struct {
	const char *key;
	size_t off;          /* of the char * in struct k3_setup_inventory */
	bool required;
} inv_strs[] = {
	{ "name", offsetof(struct k3_setup_inventory, name), true },
	{ "repository", offsetof(struct k3_setup_inventory, repository), true },
	{ "revision", offsetof(struct k3_setup_inventory, revision), true },
	{ "base_url", offsetof(struct k3_setup_inventory, base_url), false },
	{ "listing_url", offsetof(struct k3_setup_inventory, listing_url), false },
	{ "expert_table", offsetof(struct k3_setup_inventory, expert_table), false },
};

static char **inv_str(struct k3_setup_inventory *inv, size_t i)
{
	return (char **)((char *)inv + inv_strs[i].off);
}

void k3_setup_inventory_free(struct k3_setup_inventory *inv)
{
	if (!inv)
		return;
	for (size_t i = 0; i < sizeof(inv_strs) / sizeof(inv_strs[0]); i++)
		free(*inv_str(inv, i));
	for (size_t i = 0; i < inv->n_allow_hosts; i++)
		free(inv->allow_hosts[i]);
	free(inv->allow_hosts);
	for (size_t i = 0; i < inv->n_files; i++)
		free(inv->files[i].path);
	free(inv->files);
	free(inv);
}

static int cmp_file(const void *a, const void *b)
{
	return strcmp(((const struct k3_setup_file *)a)->path, ((const struct k3_setup_file *)b)->path);
}

#define BAD(...) do { rc = k3_err_set(err, -EINVAL, __VA_ARGS__); goto out; } while (0)

/* A string field: required (must be a string) or optional (absent or null). */
static int get_str(json_t *o, const char *key, bool required, char **out, struct k3_err *err)
{
	json_t *v = json_object_get(o, key);

	*out = NULL;
	if (!v || json_is_null(v)) {
		if (required)
			return k3_err_set(err, -EINVAL, "inventory: '%s' is missing", key);
		return 0;
	}
	if (!json_is_string(v))
		return k3_err_set(err, -EINVAL, "inventory: '%s' must be a string", key);
	*out = strdup(json_string_value(v));
	return *out ? 0 : k3_err_set(err, -ENOMEM, "out of memory");
}

static int parse_file(json_t *f, size_t i, struct k3_setup_file *out, struct k3_err *err)
{
	const char *key;
	json_t *v, *path, *size, *sha;
	int rc = 0;

	if (!json_is_object(f))
		return k3_err_set(err, -EINVAL, "inventory: files[%zu] must be an object", i);
	json_object_foreach(f, key, v)
		if (strcmp(key, "path") && strcmp(key, "size") && strcmp(key, "sha256") &&
		    strcmp(key, "spine_bytes"))
			return k3_err_set(err, -EINVAL, "inventory: files[%zu]: unknown key '%s'", i, key);
	path = json_object_get(f, "path");
	size = json_object_get(f, "size");
	sha = json_object_get(f, "sha256");
	if (!json_is_string(path) || !k3_setup_name_ok(json_string_value(path)))
		return k3_err_set(err, -EINVAL, "inventory: files[%zu].path must be a plain file name"
				  " (1-%d bytes of A-Z a-z 0-9 . _ -)", i, K3_SETUP_NAME_MAX);
	if (!size || (!json_is_null(size) && (!json_is_integer(size) || json_integer_value(size) < 0 ||
					      (uint64_t)json_integer_value(size) >= K3_SETUP_MAX_FILE_BYTES)))
		return k3_err_set(err, -EINVAL, "inventory: files[%zu].size ('%s') must be a byte count"
				  " below 2^50 or null", i, json_string_value(path));
	if (!sha || (!json_is_null(sha) && (!json_is_string(sha) ||
					    k3_setup_sha256_parse(json_string_value(sha), out->sha256))))
		return k3_err_set(err, -EINVAL, "inventory: files[%zu].sha256 ('%s') must be 64 hex"
				  " digits or null", i, json_string_value(path));
	out->sha_known = !json_is_null(sha);
	out->size_known = !json_is_null(size);
	out->size = out->size_known ? (uint64_t)json_integer_value(size) : 0;
	v = json_object_get(f, "spine_bytes");
	if (v && !json_is_null(v)) {
		if (!json_is_integer(v) || json_integer_value(v) < 8 ||
		    (out->size_known && (uint64_t)json_integer_value(v) > out->size))
			return k3_err_set(err, -EINVAL, "inventory: files[%zu].spine_bytes ('%s') must be"
					  " a byte count between 8 and the size", i, json_string_value(path));
		out->spine_bytes = (uint64_t)json_integer_value(v);
		out->spine_known = true;
	}
	out->path = strdup(json_string_value(path));
	if (!out->path)
		rc = k3_err_set(err, -ENOMEM, "out of memory");
	return rc;
}

int k3_setup_inventory_parse(const char *json, size_t len, struct k3_setup_inventory **out,
			     struct k3_err *err)
{
	static const char *const keys[] = { "format", "version", "name", "repository", "revision",
		"base_url", "listing_url", "allow_hosts", "expert_table", "files", "notes" };
	struct k3_setup_inventory *inv = NULL;
	json_error_t je;
	json_t *root = NULL, *v, *files, *hosts;
	const char *key;
	int rc = 0;

	*out = NULL;
	if (len > K3_SETUP_INVENTORY_MAX_BYTES)
		return k3_err_set(err, -EFBIG, "inventory: %zu bytes is over the 16 MiB limit", len);
	root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return k3_err_set(err, -EINVAL, "inventory: line %d: %s", je.line, je.text);
	if (!json_is_object(root))
		BAD("inventory: not a JSON object");
	json_object_foreach(root, key, v) {
		bool known = false;
		for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++)
			known = known || strcmp(key, keys[k]) == 0;
		if (!known)
			BAD("inventory: unknown key '%s'", key);
	}
	v = json_object_get(root, "format");
	if (!json_is_string(v) || strcmp(json_string_value(v), FORMAT_NAME) != 0)
		BAD("inventory: 'format' must be \"" FORMAT_NAME "\"");
	v = json_object_get(root, "version");
	if (!json_is_integer(v) || json_integer_value(v) != K3_SETUP_INVENTORY_VERSION)
		BAD("inventory: 'version' must be %d", K3_SETUP_INVENTORY_VERSION);
	inv = calloc(1, sizeof(*inv));
	if (!inv) {
		rc = k3_err_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < sizeof(inv_strs) / sizeof(inv_strs[0]); i++)
		if ((rc = get_str(root, inv_strs[i].key, inv_strs[i].required, inv_str(inv, i), err)))
			goto out;
	if (!k3_setup_name_ok(inv->name))
		BAD("inventory: 'name' must be a plain directory name");
	if (!repository_ok(inv->repository))
		BAD("inventory: 'repository' must be owner/name");
	if (!revision_ok(inv->revision))
		BAD("inventory: 'revision' must be 1-128 bytes of A-Z a-z 0-9 . _ -");
	if (inv->base_url && !url_ok(inv->base_url, true))
		BAD("inventory: 'base_url' must be an https:// URL ending in '/'");
	if (inv->listing_url && !url_ok(inv->listing_url, false))
		BAD("inventory: 'listing_url' must be an https:// URL");
	v = json_object_get(root, "notes");
	if (v && !json_is_array(v) && !json_is_string(v))
		BAD("inventory: 'notes' must be a string or a list of strings");
	hosts = json_object_get(root, "allow_hosts");
	if (hosts && !json_is_null(hosts)) {
		if (!json_is_array(hosts) || json_array_size(hosts) > K3_SETUP_MAX_ALLOW_HOSTS)
			BAD("inventory: 'allow_hosts' must be a list of at most %d host names",
			    K3_SETUP_MAX_ALLOW_HOSTS);
		inv->allow_hosts = calloc(json_array_size(hosts) + 1, sizeof(char *));
		if (!inv->allow_hosts) {
			rc = k3_err_set(err, -ENOMEM, "out of memory");
			goto out;
		}
		for (size_t i = 0; i < json_array_size(hosts); i++) {
			json_t *h = json_array_get(hosts, i);
			if (!json_is_string(h) || !host_ok(json_string_value(h)))
				BAD("inventory: allow_hosts[%zu] must be a lower-case host name"
				    " or '*.' and one", i);
			if (!(inv->allow_hosts[i] = strdup(json_string_value(h)))) {
				rc = k3_err_set(err, -ENOMEM, "out of memory");
				goto out;
			}
			inv->n_allow_hosts++;
		}
	}
	files = json_object_get(root, "files");
	if (!json_is_array(files) || json_array_size(files) == 0 ||
	    json_array_size(files) > K3_SETUP_MAX_FILES)
		BAD("inventory: 'files' must be a list of 1 to %d files", K3_SETUP_MAX_FILES);
	inv->files = calloc(json_array_size(files), sizeof(*inv->files));
	if (!inv->files) {
		rc = k3_err_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < json_array_size(files); i++) {
		rc = parse_file(json_array_get(files, i), i, &inv->files[i], err);
		if (rc)
			goto out;
		inv->n_files++;
	}
	qsort(inv->files, inv->n_files, sizeof(*inv->files), cmp_file);
	for (size_t i = 1; i < inv->n_files; i++)
		if (strcmp(inv->files[i - 1].path, inv->files[i].path) == 0)
			BAD("inventory: '%s' is listed twice", inv->files[i].path);
	if (inv->expert_table && !k3_setup_inventory_find(inv, inv->expert_table))
		BAD("inventory: expert_table '%s' is not one of the files", inv->expert_table);
out:
	json_decref(root);
	if (rc) {
		k3_setup_inventory_free(inv);
		return rc;
	}
	*out = inv;
	return 0;
}

int k3_setup_inventory_load(const char *path, struct k3_setup_inventory **out,
			    struct k3_err *err)
{
	char *buf = NULL;
	size_t len;
	int fd, rc;

	*out = NULL;
	/* the user's path: a link there is the user's choice */
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return k3_err_set(err, -errno, "cannot open inventory '%s': %s", path, strerror(errno));
	rc = k3_setup_read_fd(fd, K3_SETUP_INVENTORY_MAX_BYTES, &buf, &len, path, err);
	close(fd);
	if (rc)
		return rc;
	rc = k3_setup_inventory_parse(buf, len, out, err);
	free(buf);
	if (rc)
		k3_err_prefix(err, "%s", path);
	return rc;
}

char *k3_setup_inventory_dump(const struct k3_setup_inventory *inv)
{
	json_t *root = json_object(), *files = json_array(), *hosts = NULL;
	char *text = NULL, *out = NULL;

	if (!root || !files)
		goto done;
	json_object_set_new(root, "format", json_string(FORMAT_NAME));
	json_object_set_new(root, "version", json_integer(K3_SETUP_INVENTORY_VERSION));
	json_object_set_new(root, "name", json_string(inv->name));
	json_object_set_new(root, "repository", json_string(inv->repository));
	json_object_set_new(root, "revision", json_string(inv->revision));
	json_object_set_new(root, "base_url", inv->base_url ? json_string(inv->base_url) : json_null());
	if (inv->listing_url)
		json_object_set_new(root, "listing_url", json_string(inv->listing_url));
	if (inv->n_allow_hosts) {
		hosts = json_array();
		for (size_t i = 0; hosts && i < inv->n_allow_hosts; i++)
			json_array_append_new(hosts, json_string(inv->allow_hosts[i]));
		json_object_set_new(root, "allow_hosts", hosts);
	}
	json_object_set_new(root, "expert_table",
			    inv->expert_table ? json_string(inv->expert_table) : json_null());
	for (size_t i = 0; i < inv->n_files; i++) {
		const struct k3_setup_file *f = &inv->files[i];
		char hex[K3_SETUP_SHA256_HEX];
		json_t *o = json_object();
		if (!o)
			goto done;
		k3_setup_sha256_hex(f->sha256, hex);
		json_object_set_new(o, "path", json_string(f->path));
		json_object_set_new(o, "size", f->size_known ? json_integer((json_int_t)f->size) : json_null());
		json_object_set_new(o, "sha256", f->sha_known ? json_string(hex) : json_null());
		if (f->spine_known)
			json_object_set_new(o, "spine_bytes", json_integer((json_int_t)f->spine_bytes));
		json_array_append_new(files, o);
	}
	json_object_set_new(root, "files", files);
	files = NULL;
	text = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
	if (text && (out = malloc(strlen(text) + 2)))
		sprintf(out, "%s\n", text);
done:
	free(text);
	json_decref(files);
	json_decref(root);
	return out;
}

const struct k3_setup_file *k3_setup_inventory_find(const struct k3_setup_inventory *inv,
						    const char *path)
{
	struct k3_setup_file key = { .path = (char *)path };

	return bsearch(&key, inv->files, inv->n_files, sizeof(key), cmp_file);
}

const struct k3_setup_file *k3_setup_inventory_incomplete(const struct k3_setup_inventory *inv)
{
	for (size_t i = 0; i < inv->n_files; i++)
		if (!inv->files[i].size_known || !inv->files[i].sha_known)
			return &inv->files[i];
	return NULL;
}

uint64_t k3_setup_inventory_bytes(const struct k3_setup_inventory *inv)
{
	uint64_t n = 0;

	for (size_t i = 0; i < inv->n_files; i++)
		n += inv->files[i].size_known ? inv->files[i].size : 0;
	return n;
}

int k3_setup_inventory_apply_listing(struct k3_setup_inventory *inv, const char *json,
				     size_t len, bool *seen, struct k3_err *err)
{
	json_error_t je;
	json_t *root = json_loadb(json, len, 0, &je);
	int rc = 0;

	if (!root)
		return k3_err_set(err, -EINVAL, "remote listing: line %d: %s", je.line, je.text);
	if (!json_is_array(root))
		BAD("remote listing: not a JSON list");
	for (size_t i = 0; i < json_array_size(root); i++) {
		json_t *e = json_array_get(root, i), *type, *path, *size, *lfs, *oid = NULL;
		struct k3_setup_file *f;
		uint8_t sha[32];
		bool have_sha = false;

		if (!json_is_object(e))
			BAD("remote listing: entry %zu is not an object", i);
		type = json_object_get(e, "type");
		path = json_object_get(e, "path");
		if (!json_is_string(type) || !json_is_string(path))
			BAD("remote listing: entry %zu has no type or path", i);
		if (strcmp(json_string_value(type), "file") != 0)
			continue;
		f = (struct k3_setup_file *)k3_setup_inventory_find(inv, json_string_value(path));
		if (!f)
			continue;
		seen[f - inv->files] = true;
		size = json_object_get(e, "size");
		if (!json_is_integer(size) || json_integer_value(size) < 0 ||
		    (uint64_t)json_integer_value(size) >= K3_SETUP_MAX_FILE_BYTES)
			BAD("remote listing: '%s' has no valid size", f->path);
		lfs = json_object_get(e, "lfs");
		if (json_is_object(lfs))
			oid = json_object_get(lfs, "oid");
		if (json_is_string(oid)) {
			const char *s = json_string_value(oid);
			if (strncmp(s, "sha256:", 7) == 0)
				s += 7;
			if (k3_setup_sha256_parse(s, sha) != 0)
				BAD("remote listing: '%s' has a malformed LFS oid", f->path);
			have_sha = true;
		}
		if (f->size_known && f->size != (uint64_t)json_integer_value(size)) {
			rc = k3_err_set(err, -EBADMSG, "manifest mismatch: the remote listing at %s says"
					" '%s' has %" PRIu64 " bytes, the inventory pins %" PRIu64,
					inv->revision, f->path, (uint64_t)json_integer_value(size), f->size);
			goto out;
		}
		if (have_sha && f->sha_known && memcmp(sha, f->sha256, 32) != 0) {
			char a[K3_SETUP_SHA256_HEX], b[K3_SETUP_SHA256_HEX];
			k3_setup_sha256_hex(sha, a);
			k3_setup_sha256_hex(f->sha256, b);
			rc = k3_err_set(err, -EBADMSG, "manifest mismatch: the remote listing at %s says"
					" '%s' has SHA-256 %s, the inventory pins %s", inv->revision,
					f->path, a, b);
			goto out;
		}
		f->size = (uint64_t)json_integer_value(size);
		f->size_known = true;
		if (have_sha && !f->sha_known) {
			memcpy(f->sha256, sha, 32);
			f->sha_known = true;
		}
	}
out:
	json_decref(root);
	return rc;
}

int k3_setup_inventory_agree(const struct k3_setup_inventory *pinned,
			     const struct k3_setup_inventory *local, struct k3_err *err)
{
	if (strcmp(pinned->repository, local->repository) || strcmp(pinned->revision, local->revision))
		return k3_err_set(err, -EBADMSG, "the install is %s@%s, the inventory is %s@%s",
				  local->repository, local->revision, pinned->repository, pinned->revision);
	if (pinned->n_files != local->n_files)
		return k3_err_set(err, -EBADMSG, "the install lists %zu files, the inventory %zu",
				  local->n_files, pinned->n_files);
	for (size_t i = 0; i < pinned->n_files; i++) {
		const struct k3_setup_file *p = &pinned->files[i], *l = &local->files[i];
		if (strcmp(p->path, l->path) != 0)
			return k3_err_set(err, -EBADMSG, "'%s' is in the inventory, not in the install",
					  p->path);
		if ((p->size_known && (!l->size_known || p->size != l->size)) ||
		    (p->sha_known && (!l->sha_known || memcmp(p->sha256, l->sha256, 32) != 0)))
			return k3_err_set(err, -EBADMSG, "'%s': the install's pinned copy of the"
					  " inventory disagrees with the inventory", p->path);
	}
	return 0;
}

static int scan_add(struct k3_setup_inventory *inv, int dfd, const char *dir, const char *name,
		    struct k3_err *err)
{
	char what[4096];
	struct stat st;
	struct k3_setup_file *f;
	int fd, rc;

	snprintf(what, sizeof(what), "%s/%s", dir, name);
	fd = openat(dfd, name, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return k3_err_set(err, -errno, "cannot open '%s': %s", what, strerror(errno));
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
	    (uint64_t)st.st_size >= K3_SETUP_MAX_FILE_BYTES) {
		close(fd);
		return 0;   /* a directory or a device: not part of a release */
	}
	if (inv->n_files == K3_SETUP_MAX_FILES) {
		close(fd);
		return k3_err_set(err, -E2BIG, "'%s' holds more than %d files", dir, K3_SETUP_MAX_FILES);
	}
	f = &inv->files[inv->n_files];
	memset(f, 0, sizeof(*f));
	rc = k3_setup_sha256_fd(fd, 0, (uint64_t)st.st_size, f->sha256, what, err);
	if (rc == 0 && strlen(name) > 12 && strcmp(name + strlen(name) - 12, ".safetensors") == 0)
		rc = k3_setup_spine_bytes(fd, (uint64_t)st.st_size, what, &f->spine_bytes, err);
	f->spine_known = rc == 0 && f->spine_bytes > 0;
	close(fd);
	if (rc)
		return rc;
	if (!(f->path = strdup(name)))
		return k3_err_set(err, -ENOMEM, "out of memory");
	f->size = (uint64_t)st.st_size;
	f->size_known = f->sha_known = true;
	inv->n_files++;
	return 0;
}

int k3_setup_inventory_scan(const char *dir, const struct k3_setup_scan_opts *opts,
			    struct k3_setup_inventory **out, struct k3_err *err)
{
	struct k3_setup_inventory *inv = calloc(1, sizeof(*inv));
	char namebuf[4096];
	const char *base;
	struct dirent *de;
	DIR *d = NULL;
	size_t n;
	int rc = 0;

	*out = NULL;
	if (!inv)
		return k3_err_set(err, -ENOMEM, "out of memory");
	/* the directory's base name, ignoring trailing slashes */
	snprintf(namebuf, sizeof(namebuf), "%s", dir);
	n = strlen(namebuf);
	while (n > 1 && namebuf[n - 1] == '/')
		namebuf[--n] = '\0';
	base = strrchr(namebuf, '/');
	base = base ? base + 1 : namebuf;
	inv->name = strdup(opts && opts->name ? opts->name : base);
	inv->repository = strdup(opts && opts->repository ? opts->repository : "local");
	inv->revision = strdup(opts && opts->revision ? opts->revision : "local");
	inv->base_url = opts && opts->base_url ? strdup(opts->base_url) : NULL;
	inv->files = calloc(K3_SETUP_MAX_FILES, sizeof(*inv->files));
	if (!inv->name || !inv->repository || !inv->revision || !inv->files ||
	    (opts && opts->base_url && !inv->base_url)) {
		rc = k3_err_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	if (!k3_setup_name_ok(inv->name) || !repository_ok(inv->repository) ||
	    !revision_ok(inv->revision) || (inv->base_url && !url_ok(inv->base_url, true))) {
		rc = k3_err_set(err, -EINVAL, "inventory of '%s': bad name, repository, revision or"
				" base URL (an https:// URL ending in '/')", dir);
		goto out;
	}
	d = opendir(dir);
	if (!d) {
		rc = k3_err_set(err, -errno, "cannot read directory '%s': %s", dir, strerror(errno));
		goto out;
	}
	while ((de = readdir(d)) != NULL) {
		if (de->d_name[0] == '.' || !k3_setup_name_ok(de->d_name))
			continue;
		rc = scan_add(inv, dirfd(d), dir, de->d_name, err);
		if (rc)
			goto out;
	}
	if (inv->n_files == 0) {
		rc = k3_err_set(err, -ENOENT, "'%s' holds no model files", dir);
		goto out;
	}
	qsort(inv->files, inv->n_files, sizeof(*inv->files), cmp_file);
	if (k3_setup_inventory_find(inv, K3_SETUP_EXPERT_TABLE_NAME) &&
	    !(inv->expert_table = strdup(K3_SETUP_EXPERT_TABLE_NAME)))
		rc = k3_err_set(err, -ENOMEM, "out of memory");
out:
	if (d)
		closedir(d);
	if (rc) {
		k3_setup_inventory_free(inv);
		return rc;
	}
	*out = inv;
	return 0;
}
