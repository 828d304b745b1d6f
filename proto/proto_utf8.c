/* proto_utf8.c - strict UTF-8 validation (RFC 3629, see k3_proto.h). */
#include "k3_proto.h"

bool k3_proto_utf8_valid(const void *p, size_t n)
{
	const uint8_t *s = p;
	size_t i = 0;

	while (i < n) {
		uint8_t c = s[i];
		size_t need;
		uint32_t cp;

		if (c < 0x80) {
			i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf) {
			need = 1; cp = c & 0x1f;
		} else if (c >= 0xe0 && c <= 0xef) {
			need = 2; cp = c & 0x0f;
		} else if (c >= 0xf0 && c <= 0xf4) {
			need = 3; cp = c & 0x07;
		} else {
			return false;   /* continuation byte, 0xc0/0xc1 or > 0xf4 */
		}
		if (n - i <= need)
			return false;
		for (size_t k = 1; k <= need; k++) {
			if ((s[i + k] & 0xc0) != 0x80)
				return false;
			cp = cp << 6 | (s[i + k] & 0x3f);
		}
		/* overlongs, surrogates, past U+10FFFF */
		if ((need == 2 && cp < 0x800) || (need == 3 && cp < 0x10000) ||
		    (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
			return false;
		i += need + 1;
	}
	return true;
}
