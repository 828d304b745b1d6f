/* model.c - opening a checkpoint (stub: the contract in model.h comes first). */
#include "model/model.h"

#include <errno.h>
#include <stdlib.h>

int k3_model_config_parse(const char *json, size_t len,
			  struct k3_model_config *out, struct k3_err *err)
{
	(void)json; (void)len; (void)out;
	return k3_err_set(err, -ENOSYS, "config parsing not implemented yet");
}

int k3_model_open(const char *dir, struct k3_model **out, struct k3_err *err)
{
	(void)dir;
	*out = NULL;
	return k3_err_set(err, -ENOSYS, "model loading not implemented yet");
}

void k3_model_free(struct k3_model *m) { (void)m; }
const struct k3_model_config *k3_model_config(const struct k3_model *m) { (void)m; return NULL; }
const struct k3_model_plan *k3_model_plan(const struct k3_model *m) { (void)m; return NULL; }
const struct k3_tensor *k3_model_tensor(const struct k3_model *m, const char *name) { (void)m; (void)name; return NULL; }
const struct k3_tensor *k3_model_tensors(const struct k3_model *m, size_t *n_out) { (void)m; *n_out = 0; return NULL; }
const char *k3_model_dir(const struct k3_model *m) { (void)m; return NULL; }
uint32_t k3_model_shard_count(const struct k3_model *m) { (void)m; return 0; }
const char *k3_model_shard_path(const struct k3_model *m, uint32_t i) { (void)m; (void)i; return NULL; }
uint64_t k3_model_shard_size(const struct k3_model *m, uint32_t i) { (void)m; (void)i; return 0; }
int k3_tensor_read_f32(const struct k3_tensor *t, uint64_t first, size_t n, float *out) { (void)t; (void)first; (void)n; (void)out; return -ENOSYS; }
const char *k3_dtype_name(enum k3_dtype t) { (void)t; return NULL; }
size_t k3_dtype_size(enum k3_dtype t) { (void)t; return 0; }
int k3_dtype_parse(const char *s, enum k3_dtype *out) { (void)s; (void)out; return -ENOSYS; }
