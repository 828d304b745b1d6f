/*
 * fuzz_setup_inventory.c - any bytes as what k3ctl setup reads from files
 * and servers (setup_inventory.h, setup_experts.h): the first byte picks
 * the parser, the rest is its input. 0: an inventory; a document that
 * parses dumps to one that parses and dumps to the same text. 1: a remote
 * listing page applied to a fixed inventory with unknown values. 2: a
 * per-expert SHA-256 table. Properties: no crash, no read outside the
 * input, no leak.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "setup/setup_experts.h"
#include "setup/setup_inventory.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char fixed[] =
	"{\"format\":\"k3-inventory\",\"version\":1,\"name\":\"m\",\"repository\":\"o/m\","
	"\"revision\":\"r\",\"base_url\":\"https://h/\",\"files\":["
	"{\"path\":\"a.safetensors\",\"size\":null,\"sha256\":null},"
	"{\"path\":\"config.json\",\"size\":5,\"sha256\":"
	"\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}]}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct k3_setup_inventory *inv = NULL, *again = NULL;
	struct k3_setup_expert_table *t = NULL;
	const char *text = (const char *)data + 1;
	size_t len = size ? size - 1 : 0;

	if (size == 0)
		return 0;
	switch (data[0] % 3) {
	case 0:
		if (k3_setup_inventory_parse(text, len, &inv, NULL) == 0) {
			char *d1 = k3_setup_inventory_dump(inv), *d2;
			if (!d1 || k3_setup_inventory_parse(d1, strlen(d1), &again, NULL) != 0)
				abort();
			d2 = k3_setup_inventory_dump(again);
			if (!d2 || strcmp(d1, d2) != 0 || k3_setup_inventory_agree(inv, again, NULL) != 0)
				abort();
			free(d1);
			free(d2);
		}
		break;
	case 1: {
		bool seen[2] = { false, false };
		if (k3_setup_inventory_parse(fixed, strlen(fixed), &inv, NULL) != 0)
			abort();
		(void)k3_setup_inventory_apply_listing(inv, text, len, seen, NULL);
		break;
	}
	default:
		if (k3_setup_expert_table_parse(text, len, &t, NULL) == 0) {
			uint8_t d[32];
			(void)k3_setup_expert_table_find(t, 1, 0, d);
		}
		break;
	}
	k3_setup_expert_table_free(t);
	k3_setup_inventory_free(again);
	k3_setup_inventory_free(inv);
	return 0;
}
