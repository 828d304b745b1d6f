/* k3_client_socket.c - see k3_client_socket.h. */
#include "k3_client_socket.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>

_Static_assert(K3_CLIENT_SOCKET_PATH_MAX + 1 == sizeof(((struct sockaddr_un *)0)->sun_path),
	       "K3_CLIENT_SOCKET_PATH_MAX is sun_path less its NUL");

const char *k3_client_default_socket(void)
{
	/* sun_path of struct sockaddr_un: a longer path could not be used */
	static char buf[108];
	const char *env = getenv("K3D_SOCKET"), *xdg = getenv("XDG_RUNTIME_DIR");
	struct stat st;

	if (env && *env)
		return env;
	if (xdg && *xdg && (size_t)snprintf(buf, sizeof(buf), "%s/k3d.sock", xdg) < sizeof(buf) &&
	    stat(buf, &st) == 0)
		return buf;
	return K3_CLIENT_SYSTEMD_SOCKET;
}

int k3_client_socket_exit_code(int check)
{
	if (check == 0)
		return 0;
	return check == -EINVAL ? K3_CLIENT_EXIT_USAGE : K3_CLIENT_EXIT_UNAVAILABLE;
}

int k3_client_socket_check(const char *path, char *why, size_t why_size)
{
	size_t n = strlen(path);

	/* Only an explicit --socket '' gets here (an empty $K3D_SOCKET counts
	 * as unset): a typo or an unset shell variable, which connect() would
	 * report as a confusing "cannot reach k3d at ''". */
	if (n == 0) {
		snprintf(why, why_size, "--socket needs a path, got an empty one (leave --socket out "
			 "for the default: $K3D_SOCKET, else $XDG_RUNTIME_DIR/k3d.sock when it exists, "
			 "else %s)", K3_CLIENT_SYSTEMD_SOCKET);
		return -EINVAL;
	}
	if (n <= K3_CLIENT_SOCKET_PATH_MAX)
		return 0;
	snprintf(why, why_size, "k3d socket path '%s' is %zu bytes; a Unix socket path may have at "
		 "most %d (use a shorter --socket or K3D_SOCKET, e.g. under /run or $XDG_RUNTIME_DIR)",
		 path, n, K3_CLIENT_SOCKET_PATH_MAX);
	return -ENAMETOOLONG;
}
