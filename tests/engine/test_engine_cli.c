/*
 * test_engine_cli.c - `k3ctl forward --json` against the golden it is
 * meant to be diffed with: same field names, identical greedy tokens and
 * route sets, last_logits within relative L2 1e-4.
 */
#include <jansson.h>

#include "t.h"

int main(void)
{
	const char *build = getenv("K3_BUILD_ROOT");
	char cmd[4096];
	json_error_t jerr;

	if (!build)
		return t_skip("K3_BUILD_ROOT unset");
	json_t *g = json_load_file(t_shared_path("golden/forward/k3tiny_b/golden/p8.json"), 0, &jerr);
	if (!T_OK(g != NULL))
		return t_done();
	char ids[256] = "";
	json_t *p = json_object_get(g, "prompt");
	for (size_t i = 0; i < json_array_size(p); i++)
		snprintf(ids + strlen(ids), sizeof(ids) - strlen(ids), "%s%lld", i ? "," : "",
			 (long long)json_integer_value(json_array_get(p, i)));
	snprintf(cmd, sizeof(cmd), "'%s/client/k3ctl/k3ctl' forward --model '%s' --ids %s --steps 8 --json --threads 1",
		 build, t_shared_path("golden/forward/k3tiny_b/model"), ids);
	FILE *f = popen(cmd, "r");
	T_OK(f != NULL);
	json_t *a = f ? json_loadf(f, 0, &jerr) : NULL;
	if (f)
		T_EQ_INT(pclose(f), 0);
	if (!T_OK(a != NULL)) {
		printf("     %s\n", jerr.text);
		json_decref(g);
		return t_done();
	}
	T_OK(json_equal(json_object_get(a, "prompt"), p));
	T_OK(json_equal(json_object_get(json_object_get(a, "greedy"), "tokens"),
			json_object_get(json_object_get(g, "greedy"), "tokens")));
	json_t *al = json_object_get(a, "last_logits"), *gl = json_object_get(g, "last_logits");
	T_EQ_INT(json_array_size(al), json_array_size(gl));
	double num = 0, den = 0;
	for (size_t i = 0; i < json_array_size(gl); i++) {
		double x = json_number_value(json_array_get(al, i)), y = json_number_value(json_array_get(gl, i));
		num += (x - y) * (x - y);
		den += y * y;
	}
	printf("k3ctl forward last_logits rel L2 %.3g\n", sqrt(num / den));
	T_OK(sqrt(num / den) <= 1e-4);
	const char *lists[2][2] = { { "routes", NULL }, { "greedy", "decode_routes" } };
	for (int w = 0; w < 2; w++) {
		json_t *ra = json_object_get(a, lists[w][0]), *rg = json_object_get(g, lists[w][0]);
		if (lists[w][1]) {
			ra = json_object_get(ra, lists[w][1]);
			rg = json_object_get(rg, lists[w][1]);
		}
		T_EQ_INT(json_array_size(ra), json_array_size(rg));
		for (size_t l = 0; l < json_array_size(rg) && l < json_array_size(ra); l++) {
			json_t *xa = json_array_get(ra, l), *xg = json_array_get(rg, l);
			T_OK(json_equal(json_object_get(xa, "layer"), json_object_get(xg, "layer")));
			T_OK(json_equal(json_object_get(xa, "positions"), json_object_get(xg, "positions")));
			json_t *ea = json_object_get(xa, "experts"), *eg = json_object_get(xg, "experts");
			T_EQ_INT(json_array_size(ea), json_array_size(eg));
			for (size_t t = 0; t < json_array_size(eg) && t < json_array_size(ea); t++) {
				json_t *sa = json_array_get(ea, t), *sg = json_array_get(eg, t);
				bool ok = json_array_size(sa) == json_array_size(sg);
				for (size_t i = 0; ok && i < json_array_size(sg); i++) {
					bool found = false;
					for (size_t j = 0; j < json_array_size(sa); j++)
						found |= json_integer_value(json_array_get(sa, j)) ==
							 json_integer_value(json_array_get(sg, i));
					ok = found;
				}
				T_OK(ok);
			}
		}
	}
	json_decref(a);
	json_decref(g);
	return t_done();
}
