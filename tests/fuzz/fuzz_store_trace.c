/*
 * fuzz_store_trace.c - any bytes as one router trace line (store_trace.h).
 * Properties: no crash, no read outside the input; a line that parses
 * formats back to a line that parses to the same record (ids and weight
 * bits round trip exactly).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "store/store_trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct k3_store_trace_rec rec, again;
	char line[K3_STORE_TRACE_LINE_MAX];
	int n;

	if (k3_store_trace_parse((const char *)data, size, &rec, NULL) != 0)
		return 0;
	n = k3_store_trace_format(&rec, line, sizeof(line));
	if (n <= 0)
		abort();
	if (k3_store_trace_parse(line, (size_t)n, &again, NULL) != 0 ||
	    memcmp(&rec, &again, sizeof(rec)) != 0)
		abort();
	return 0;
}
