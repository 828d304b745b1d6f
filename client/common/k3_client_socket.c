/* k3_client_socket.c - see k3_client_socket.h. */
#include "k3_client_socket.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

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
