/*
 * sockact.h - systemd socket activation: the listening sockets systemd
 * passed to this process ($LISTEN_PID, $LISTEN_FDS; fds from 3), taken
 * with libsystemd's sd_listen_fds and checked before an event loop adopts
 * them. k3d (k3d.socket, a Unix socket) and k3-gateway (k3-gateway.socket,
 * TCP) both start this way.
 */
#ifndef K3_BASE_SOCKACT_H
#define K3_BASE_SOCKACT_H

#include "base/err.h"

/* First passed fd (SD_LISTEN_FDS_START) and the most sockets accepted. */
#define K3_SOCKACT_FIRST_FD 3
#define K3_SOCKACT_MAX 64

/*
 * Returns n >= 0, the number of sockets passed (fds K3_SOCKACT_FIRST_FD ..
 * K3_SOCKACT_FIRST_FD + n - 1): 0 when none were, or when the variables
 * name another process. Each one is checked to be a listening SOCK_STREAM
 * socket of family (AF_UNIX, AF_INET, ...; AF_UNSPEC: any) and is set
 * close-on-exec and non-blocking. The variables are unset in every case,
 * so children do not inherit them. unit names the socket unit for the
 * error message ("k3d.socket").
 * Errors, with the values in err: -EINVAL or -ERANGE when the variables
 * are malformed and -E2BIG for more than K3_SOCKACT_MAX sockets (both
 * configuration errors); -ENOTSOCK when a passed fd is not a listening
 * stream socket of family, or fcntl's errno (the socket is unusable).
 */
int k3_sockact_listen_fds(int family, const char *unit, struct k3_err *err);

#endif
