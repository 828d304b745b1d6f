/* t_golden.c - loading the golden cases (t_golden.h). */
#include "t_golden.h"

#include <stdio.h>
#include <stdlib.h>

/* ../shared/<rel>, as t.h's t_shared_path finds it (K3_SHARED, else the
 * folder beside the source root); not t.h itself, whose counters are per
 * test program. */
static const char *shared_path(char *buf, size_t cap, const char *rel)
{
	const char *root = getenv("K3_SHARED");

	snprintf(buf, cap, "%s/%s", root ? root : "../shared", rel);
	return buf;
}

json_t *t_golden_json(const char *name, const char *prompt)
{
	char rel[512], path[4096];
	json_error_t jerr;
	json_t *g;

	snprintf(rel, sizeof(rel), "golden/forward/%s/golden/%s.json", name, prompt);
	g = json_load_file(shared_path(path, sizeof(path), rel), 0, &jerr);
	if (!g)
		printf("     %s: %s\n", path, jerr.text);
	return g;
}

struct k3_model *t_golden_model(const char *name)
{
	char rel[512], path[4096];
	struct k3_err err = { 0 };
	struct k3_model *model = NULL;

	snprintf(rel, sizeof(rel), "golden/forward/%s/model", name);
	if (k3_model_open(shared_path(path, sizeof(path), rel), &model, &err) != 0) {
		printf("     %s\n", err.msg);
		return NULL;
	}
	return model;
}

uint32_t t_golden_prompt(json_t *g, int32_t *ids, uint32_t cap)
{
	json_t *p = json_object_get(g, "prompt");
	size_t n = json_array_size(p);

	if (!json_is_array(p) || n > cap)
		return 0;
	for (size_t t = 0; t < n; t++)
		ids[t] = (int32_t)json_integer_value(json_array_get(p, t));
	return (uint32_t)n;
}
