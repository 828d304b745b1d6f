/* test_client_socket.c - client/common: where a client looks for k3d's
 * socket, the path check and the exit codes k3ctl and k3-gateway share
 * for a path no k3d can listen on. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "k3_client_socket.h"
#include "t.h"

static void test_check(void)
{
	char why[512], path[256];

	T_EQ_INT(k3_client_socket_check("", why, sizeof(why)), -EINVAL);
	T_OK(strstr(why, "--socket needs a path") != NULL);
	T_EQ_INT(k3_client_socket_exit_code(-EINVAL), K3_CLIENT_EXIT_USAGE);

	/* 107 bytes fit sun_path with its NUL; 108 do not */
	memset(path, 'd', 107);
	path[0] = '/';
	path[107] = '\0';
	T_EQ_INT(k3_client_socket_check(path, why, sizeof(why)), 0);
	T_EQ_INT(k3_client_socket_exit_code(0), 0);
	path[107] = 'x';
	path[108] = '\0';
	T_EQ_INT(k3_client_socket_check(path, why, sizeof(why)), -ENAMETOOLONG);
	T_OK(strstr(why, path) != NULL);   /* the path is named, whole */
	T_OK(strstr(why, "is 108 bytes; a Unix socket path may have at most 107") != NULL);
	T_EQ_INT(k3_client_socket_exit_code(-ENAMETOOLONG), K3_CLIENT_EXIT_UNAVAILABLE);
	/* a message that does not fit is cut, never overrun */
	T_EQ_INT(k3_client_socket_check(path, why, 16), -ENAMETOOLONG);
	T_EQ_INT(strlen(why), 15);
}

static void test_default(void)
{
	char dir[] = "/tmp/k3-test-sock-XXXXXX", sock[128];

	T_OK(mkdtemp(dir) != NULL);
	snprintf(sock, sizeof(sock), "%s/k3d.sock", dir);
	setenv("K3D_SOCKET", "/somewhere/k3d.sock", 1);
	setenv("XDG_RUNTIME_DIR", dir, 1);
	T_EQ_STR(k3_client_default_socket(), "/somewhere/k3d.sock");
	/* an empty K3D_SOCKET counts as unset; $XDG_RUNTIME_DIR/k3d.sock only
	 * when it exists */
	setenv("K3D_SOCKET", "", 1);
	T_EQ_STR(k3_client_default_socket(), K3_CLIENT_SYSTEMD_SOCKET);
	T_EQ_INT(mkfifo(sock, 0600), 0);
	T_EQ_STR(k3_client_default_socket(), sock);
	unlink(sock);
	rmdir(dir);
}

int main(void)
{
	test_check();
	test_default();
	return t_done();
}
