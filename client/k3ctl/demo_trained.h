/*
 * demo_trained.h - the trained demo checkpoint embedded in k3ctl
 * (tools/train_demo/: trained by train.py, shipped in model/, embedded at
 * build time by embed.py). `k3ctl demo-model --preset trained` writes these
 * files unchanged after checking each against its recorded SHA-256.
 */
#ifndef K3CTL_DEMO_TRAINED_H
#define K3CTL_DEMO_TRAINED_H

#include <stddef.h>

#include "base/err.h"

struct k3ctl_trained_file {
	const char *name;              /* plain file name inside the model directory */
	const unsigned char *data;     /* the embedded bytes */
	size_t size;                   /* bytes */
	const char *sha256;            /* 64 lowercase hex digits, from SHA256SUMS */
};

/* The generated table (trained_blob.c), in SHA256SUMS order. */
extern const struct k3ctl_trained_file k3ctl_trained_files[];
extern const size_t k3ctl_trained_n_files;

/* Writes every embedded file into directory out (created, mode 0755, if
 * missing; files of the same names replaced), each after checking its
 * bytes against the recorded SHA-256. *bytes receives the total written.
 * Returns 0; -EBADMSG when an embedded file does not match its hash (a
 * broken build: nothing is written); or a negative errno naming the path. */
int k3ctl_trained_install(const char *out, unsigned long long *bytes, struct k3_err *err);

/* Removes what k3ctl_trained_install wrote into dir (the embedded files'
 * names only, missing ones ignored), then dir itself when that leaves it
 * empty: the cleanup of a private copy (k3ctl bench --preset trained).
 * Nothing else in dir is touched. */
void k3ctl_trained_remove(const char *dir);

#endif
