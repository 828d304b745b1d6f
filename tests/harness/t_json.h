/*
 * t_json.h - test helpers over jansson for the golden files
 * (../shared/golden, docs/shared-data.md). Include after t.h; the test
 * links jansson.
 */
#ifndef K3_TEST_T_JSON_H
#define K3_TEST_T_JSON_H

#include <jansson.h>
#include <math.h>
#include <stdint.h>

/* Relative L2 error |got - ref| / |ref| of n floats against a JSON array
 * of n numbers; INFINITY when ref is not such an array. */
static inline double t_rel_l2_json(const float *got, json_t *ref, uint32_t n)
{
	double num = 0.0, den = 0.0;
	if (!json_is_array(ref) || json_array_size(ref) != n)
		return INFINITY;
	for (uint32_t i = 0; i < n; i++) {
		double r = json_number_value(json_array_get(ref, i));
		num += (got[i] - r) * (got[i] - r);
		den += r * r;
	}
	return sqrt(num) / sqrt(den);
}

#endif
