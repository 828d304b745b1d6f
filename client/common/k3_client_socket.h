/*
 * k3_client_socket.h - where a client (k3ctl, k3-gateway) looks for k3d's
 * socket when it is not told: one rule for both, so a k3d that k3ctl
 * finds is one the gateway finds too.
 */
#ifndef K3_CLIENT_SOCKET_H
#define K3_CLIENT_SOCKET_H

#include <stddef.h>

/* The systemd unit's socket (systemd/k3d.socket). */
#define K3_CLIENT_SYSTEMD_SOCKET "/run/k3d/k3d.sock"

/* $K3D_SOCKET unless unset or empty, else $XDG_RUNTIME_DIR/k3d.sock when
 * that path exists (where a k3d started by hand without --socket listens),
 * else K3_CLIENT_SYSTEMD_SOCKET. Returns a string
 * owned by the environment or by a static buffer (not thread-safe; call it
 * once at start-up). Never NULL. */
const char *k3_client_default_socket(void);

/* The longest socket path a client can connect to: sun_path of struct
 * sockaddr_un (108 bytes on Linux) less its terminating NUL. */
#define K3_CLIENT_SOCKET_PATH_MAX 107

/* 0 when path fits a sockaddr_un; -EINVAL when it is empty (why says
 * --socket needs a path and names the default); -ENAMETOOLONG when it is
 * too long (why names the path, its length and the limit). why gets
 * why_size bytes, truncated to fit. Both clients refuse an empty path as a
 * usage error (exit 2) and a too-long one as a k3d they cannot reach (exit
 * 3): k3-gateway at start-up (rather than a 503 on every request), k3ctl
 * when it connects. */
int k3_client_socket_check(const char *path, char *why, size_t why_size);

/* The exit codes both clients give for a socket path (k3ctl.1,
 * k3-gateway.8): an empty path is a usage error; a path too long for
 * sun_path, from --socket or $K3D_SOCKET alike, names a k3d that cannot
 * be reached, the same as one that does not answer. */
enum {
	K3_CLIENT_EXIT_USAGE = 2,
	K3_CLIENT_EXIT_UNAVAILABLE = 3,
};

/* The exit code for what k3_client_socket_check returned: 0 for 0,
 * K3_CLIENT_EXIT_USAGE for -EINVAL, K3_CLIENT_EXIT_UNAVAILABLE for
 * -ENAMETOOLONG (or any other refusal). */
int k3_client_socket_exit_code(int check);

#endif
