/*
 * fuzz_main.c - replay driver for the fuzz targets when libFuzzer is not
 * linked: feeds every file of the corpus directory (argv[1]) to
 * LLVMFuzzerTestOneInput, then K3_FUZZ_MUTATIONS (default 20000) seeded
 * mutations of them (bit flips, truncation, byte insertion, splicing), so
 * the ordinary test run explores past the seeds too. The seed is printed
 * so a failure can be replayed.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct seed { uint8_t *data; size_t len; };

static uint64_t rng_state;
static uint64_t rng(void)
{
	/* splitmix64: deterministic across platforms */
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static int load(const char *path, struct seed *s)
{
	FILE *f = fopen(path, "rb");
	long n;

	if (!f)
		return -1;
	if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || n > (1 << 24) || fseek(f, 0, SEEK_SET)) {
		fclose(f);
		return -1;
	}
	s->data = malloc((size_t)n + 1);
	s->len = (size_t)n;
	if (!s->data || fread(s->data, 1, s->len, f) != s->len) {
		fclose(f);
		free(s->data);
		return -1;
	}
	fclose(f);
	return 0;
}

int main(int argc, char **argv)
{
	struct seed seeds[4096];
	size_t n = 0, mutations = 20000;
	const char *env = getenv("K3_FUZZ_MUTATIONS");
	DIR *d;
	struct dirent *e;

	if (argc < 2) {
		fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
		return 2;
	}
	if (env)
		mutations = strtoul(env, NULL, 10);
	d = opendir(argv[1]);
	if (!d) {
		printf("FAIL: cannot open corpus '%s'\n", argv[1]);
		return 1;
	}
	while ((e = readdir(d)) && n < sizeof(seeds) / sizeof(seeds[0])) {
		char path[4096];

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", argv[1], e->d_name);
		if (load(path, &seeds[n]) == 0) {
			LLVMFuzzerTestOneInput(seeds[n].data, seeds[n].len);
			n++;
		}
	}
	closedir(d);
	if (n == 0) {
		printf("FAIL: corpus '%s' is empty\n", argv[1]);
		return 1;
	}
	rng_state = 0x6b33645f66757a7aull;   /* fixed: reproducible runs */
	printf("replayed %zu seeds; %zu mutations with seed 0x%llx\n", n, mutations,
	       (unsigned long long)rng_state);
	for (size_t i = 0; i < mutations; i++) {
		const struct seed *s = &seeds[rng() % n];
		size_t cap = s->len + 64, len = s->len;
		uint8_t *buf = malloc(cap);

		memcpy(buf, s->data, s->len);
		for (int k = 0, m = 1 + (int)(rng() % 4); k < m; k++) {
			switch (rng() % 5) {
			case 0: if (len) buf[rng() % len] ^= (uint8_t)(1u << (rng() % 8)); break;
			case 1: if (len) len = rng() % len; break;
			case 2: if (len < cap) { size_t at = rng() % (len + 1);
				memmove(buf + at + 1, buf + at, len - at); buf[at] = (uint8_t)rng(); len++; } break;
			case 3: if (len) buf[rng() % len] = (uint8_t)rng(); break;
			case 4: { const struct seed *o = &seeds[rng() % n];
				size_t at = len ? rng() % len : 0, take = o->len ? rng() % o->len : 0;
				if (at + take > cap) take = cap - at;
				memcpy(buf + at, o->data, take); if (at + take > len) len = at + take; } break;
			}
		}
		LLVMFuzzerTestOneInput(buf, len);
		free(buf);
	}
	for (size_t i = 0; i < n; i++)
		free(seeds[i].data);
	printf("1 checks, 0 failed\n");
	return 0;
}
