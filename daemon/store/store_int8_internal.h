/*
 * store_int8_internal.h - what store_int8.c (the manifest, the check) and
 * store_int8_write.c (the writer) share. Not part of the contract.
 */
#ifndef K3_STORE_INT8_INTERNAL_H
#define K3_STORE_INT8_INTERNAL_H

#include <jansson.h>

#include "store/store_pack.h"

/* One identity as the manifest records it (new reference). */
json_t *k3_store_int8_ident_json(const struct k3_store_pack_ident *id);

#endif
