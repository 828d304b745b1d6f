/*
 * k3_client_socket.h - where a client (k3ctl, k3-gateway) looks for k3d's
 * socket when it is not told: one rule for both, so a k3d that k3ctl
 * finds is one the gateway finds too.
 */
#ifndef K3_CLIENT_SOCKET_H
#define K3_CLIENT_SOCKET_H

/* The systemd unit's socket (systemd/k3d.socket). */
#define K3_CLIENT_SYSTEMD_SOCKET "/run/k3d/k3d.sock"

/* $K3D_SOCKET unless unset or empty, else $XDG_RUNTIME_DIR/k3d.sock when
 * that path exists (where a k3d started by hand without --socket listens),
 * else K3_CLIENT_SYSTEMD_SOCKET. Returns a string
 * owned by the environment or by a static buffer (not thread-safe; call it
 * once at start-up). Never NULL. */
const char *k3_client_default_socket(void);

#endif
