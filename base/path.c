/* path.c - path joining (see path.h). */
#include "base/path.h"

#include <stdlib.h>
#include <string.h>

char *k3_path_join(const char *dir, const char *name)
{
	size_t a = strlen(dir), b = strlen(name);
	char *s = malloc(a + 1 + b + 1);

	if (!s)
		return NULL;
	memcpy(s, dir, a);
	s[a] = '/';
	memcpy(s + a + 1, name, b + 1);
	return s;
}
