/*
 * setup_session.h - what every setup command does before it fetches or
 * audits anything: open the model directory, take the install lock, load
 * the install's state and the inventory pinned in it, reconcile that with
 * the inventory given on the command line (a different release is a
 * manifest mismatch), complete unknown values from the remote listing and
 * pin the result, and set up the transfer engine with the right allow list
 * and token scope. Shared by setup_install.c, setup_stream.c,
 * setup_remote.c and setup_plan.c.
 */
#ifndef K3_SETUP_SESSION_H
#define K3_SETUP_SESSION_H

#include <stdbool.h>
#include <stddef.h>

#include "base/err.h"
#include "setup/setup_install.h"
#include "setup/setup_inventory.h"
#include "setup/setup_progress.h"
#include "setup/setup_state.h"
#include "setup/setup_transfer.h"

/* The pinned copy of the inventory inside an install. */
#define K3_SETUP_PINNED_NAME "inventory.json"

struct k3_setup_session {
	const struct k3_setup_opts *o;
	int dirfd, lockfd;
	struct k3_setup_inventory *inv;     /* owned */
	bool inv_pinned;                    /* inv is the install's pinned, complete copy */
	struct k3_setup_state *state;       /* owned */
	struct k3_setup_net *net;           /* owned, after k3_setup_session_net */
	struct k3_setup_progress *pr;       /* owned, after k3_setup_session_net */
	char base_url[K3_SETUP_URL_MAX + 1];
};

/* Opens o->dir (created when create), takes the lock when lock, loads the
 * state and the pinned inventory, and reconciles them with inv (NULL: the
 * pinned one must exist). Returns 0, -ENOENT (no install and no inventory),
 * -EBADMSG (another release), -EBUSY, or the errno. */
int k3_setup_session_open(struct k3_setup_session *s, const struct k3_setup_opts *o,
			  const struct k3_setup_inventory *inv, bool create, bool lock,
			  struct k3_err *err);
void k3_setup_session_close(struct k3_setup_session *s);

/* Sets up the transfer engine and the progress display. */
int k3_setup_session_net(struct k3_setup_session *s, struct k3_err *err);

/* Completes the inventory from the remote listing when it has unknown
 * values (fetching every page), then pins it in the install. Returns 0,
 * -EBADMSG (mismatch, or a file the listing lacks), or a transfer error. */
int k3_setup_session_complete(struct k3_setup_session *s, struct k3_err *err);

/* base URL + path into buf. 0 or -ENAMETOOLONG. */
int k3_setup_session_url(const struct k3_setup_session *s, const char *path, char *buf,
			 size_t size, struct k3_err *err);

/* Saves the state (s->state) atomically. */
int k3_setup_session_save(struct k3_setup_session *s, struct k3_err *err);

/* "DIR/name" for messages into buf. */
const char *k3_setup_session_path(const struct k3_setup_session *s, const char *name, char *buf,
				  size_t size);

#endif
