/* model_tensors.c - the sorted tensor table and fp32 reads of its values
 * (see model_tensors.h, model.h). */
#include "model/model_tensors.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/mxfp4.h"

static int cmp_tensor(const void *a, const void *b)
{
	return strcmp(((const struct k3_tensor *)a)->name, ((const struct k3_tensor *)b)->name);
}

void k3_tensors_sort(struct k3_tensor *v, size_t n)
{
	if (n)   /* qsort(NULL, 0) is undefined */
		qsort(v, n, sizeof(*v), cmp_tensor);
}

const struct k3_tensor *k3_tensors_find(const struct k3_tensor *v, size_t n, const char *name)
{
	struct k3_tensor key = { .name = name };

	return n ? bsearch(&key, v, n, sizeof(key), cmp_tensor) : NULL;
}

/* IEEE half -> float, exact (every half is representable in float). */
static float half_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
	float f;

	if (exp == 0) {
		/* zero or subnormal: man * 2^-24 */
		f = (float)man * 0x1p-24f;
		return sign ? -f : f;
	}
	if (exp == 31)
		u = sign | 0x7f800000u | (man << 13);
	else
		u = sign | ((exp + 112u) << 23) | (man << 13);
	memcpy(&f, &u, sizeof(f));
	return f;
}

int k3_tensor_read_f32(const struct k3_tensor *t, uint64_t first, size_t n, float *out)
{
	const uint8_t *p = t->data;

	if (first > t->nelem || n > t->nelem - first)
		return -ERANGE;
	switch (t->dtype) {
	case K3_DTYPE_BF16:
		k3_bf16_to_f32_row(p + 2 * first, out, n);
		return 0;
	case K3_DTYPE_F16:
		for (size_t i = 0; i < n; i++) {
			const uint8_t *q = p + 2 * (first + i);
			out[i] = half_to_f32((uint16_t)(q[0] | (q[1] << 8)));
		}
		return 0;
	case K3_DTYPE_F32:
		memcpy(out, p + 4 * first, n * sizeof(float));
		return 0;
	default:
		return -EINVAL;
	}
}
