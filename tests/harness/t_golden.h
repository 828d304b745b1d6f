/*
 * t_golden.h - the golden cases of ../shared/golden/forward (libk3test;
 * docs/shared-data.md): a case's checkpoint, a prompt's JSON record and
 * its prompt ids. Each prints why it failed, so a test only asserts.
 */
#ifndef K3_TEST_T_GOLDEN_H
#define K3_TEST_T_GOLDEN_H

#include <stdint.h>

#include <jansson.h>

#include "model/model.h"

/* golden/forward/<name>/golden/<prompt>.json, parsed (the caller
 * json_decref's it); NULL after printing the path and the parse error. */
json_t *t_golden_json(const char *name, const char *prompt);

/* Opens golden/forward/<name>/model (the caller k3_model_free's it); NULL
 * after printing the reason. */
struct k3_model *t_golden_model(const char *name);

/* The record's "prompt" ids into ids[0..cap); returns their count, 0 when
 * the prompt is no array or longer than cap (nothing is written then). */
uint32_t t_golden_prompt(json_t *g, int32_t *ids, uint32_t cap);

#endif
