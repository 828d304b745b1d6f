/* proto_err.c - decoder/encoder error reports and the names of status and
 * error codes and of draft policies (see k3_proto.h, proto_internal.h). */
#include "proto_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int k3_proto_fail(struct k3_proto_err *err, int code, const char *fmt, ...)
{
	va_list ap;

	if (err) {
		err->code = code;
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
		va_end(ap);
	}
	return code;
}

const char *k3_proto_status_name(uint32_t status)
{
	static const char *const names[K3_STATUS_COUNT] = {
		[K3_STATUS_OK] = "ok",
		[K3_STATUS_BAD_REQUEST] = "bad_request",
		[K3_STATUS_UNSUPPORTED_VERSION] = "unsupported_version",
		[K3_STATUS_UNKNOWN_TYPE] = "unknown_type",
		[K3_STATUS_TOO_LARGE] = "too_large",
		[K3_STATUS_BUSY] = "busy",
		[K3_STATUS_NOT_FOUND] = "not_found",
		[K3_STATUS_CANCELLED] = "cancelled",
		[K3_STATUS_UNAUTHORIZED] = "unauthorized",
		[K3_STATUS_SHUTTING_DOWN] = "shutting_down",
		[K3_STATUS_NOT_READY] = "not_ready",
		[K3_STATUS_CONTEXT_EXCEEDED] = "context_length_exceeded",
		[K3_STATUS_INVALID_ARGUMENT] = "invalid_argument",
		[K3_STATUS_UNSUPPORTED] = "unsupported",
		[K3_STATUS_INTERNAL] = "internal",
		[K3_STATUS_IDLE_TIMEOUT] = "idle_timeout",
	};
	return status < K3_STATUS_COUNT ? names[status] : "unknown_status";
}

const char *k3_proto_error_name(int code)
{
	static const char *const names[] = {
		"ok", "bad_magic", "bad_version", "unknown_type", "bad_flags",
		"reserved_nonzero", "oversized", "truncated", "trailing_bytes",
		"field_overrun", "unknown_field", "duplicate_field", "missing_field",
		"field_size", "too_long", "too_many", "bad_utf8", "bad_value",
		"no_memory",
	};
	int i = -code;

	_Static_assert(sizeof(names) / sizeof(names[0]) == -K3_PROTO_E_COUNT_, "error names");
	return i >= 0 && i < (int)(sizeof(names) / sizeof(names[0])) ? names[i] : "unknown_error";
}

static const char *const draft_names[K3_PROTO_DRAFT_COUNT] = {
	"unset", "off", "auto", "ngram", "dspark",
};

const char *k3_proto_draft_policy_name(uint32_t p)
{
	return p < K3_PROTO_DRAFT_COUNT ? draft_names[p] : "?";
}

int k3_proto_draft_policy_parse(const char *s, uint32_t *out)
{
	for (uint32_t i = K3_PROTO_DRAFT_OFF; i < K3_PROTO_DRAFT_COUNT; i++)
		if (strcmp(s, draft_names[i]) == 0) {
			*out = i;
			return 0;
		}
	return -1;
}
