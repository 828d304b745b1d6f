/* sockact.c - systemd socket activation through libsystemd (see sockact.h). */
#include "base/sockact.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <systemd/sd-daemon.h>

_Static_assert(K3_SOCKACT_FIRST_FD == SD_LISTEN_FDS_START, "systemd passes fds from 3");

int k3_sockact_listen_fds(int family, const char *unit, struct k3_err *err)
{
	/* Copied before sd_listen_fds unsets them, for the error message. */
	const char *pid_env = getenv("LISTEN_PID"), *fds_env = getenv("LISTEN_FDS");
	char pid[32], fds[32];
	int n;

	snprintf(pid, sizeof(pid), "%s", pid_env ? pid_env : "");
	snprintf(fds, sizeof(fds), "%s", fds_env ? fds_env : "");
	n = sd_listen_fds(1);
	if (n < 0)
		return k3_err_set(err, n, "cannot read sockets passed by systemd (LISTEN_PID='%s', "
				  "LISTEN_FDS='%s'): %s", pid, fds, strerror(-n));
	if (n > K3_SOCKACT_MAX)
		return k3_err_set(err, -E2BIG, "systemd passed %d sockets; at most %d are supported "
				  "(check ListenStream= in %s)", n, K3_SOCKACT_MAX, unit);
	for (int fd = K3_SOCKACT_FIRST_FD; fd < K3_SOCKACT_FIRST_FD + n; fd++) {
		int flags;

		if (sd_is_socket(fd, family, SOCK_STREAM, 1) <= 0)
			return k3_err_set(err, -ENOTSOCK, "passed fd %d is not a listening %sstream socket; "
					  "check ListenStream= in %s", fd,
					  family == AF_UNIX ? "Unix " : family == AF_UNSPEC ? "" : "IP ", unit);
		/* sd_listen_fds set FD_CLOEXEC already; the loop needs O_NONBLOCK. */
		if ((flags = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0 ||
		    fcntl(fd, F_SETFD, FD_CLOEXEC) != 0)
			return k3_err_set(err, -errno, "fd %d: %s", fd, strerror(errno));
	}
	return n;
}
