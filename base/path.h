/*
 * path.h - joining file names onto directories, for the loaders that open
 * the files of a model directory by name.
 */
#ifndef K3_BASE_PATH_H
#define K3_BASE_PATH_H

/* Returns "dir/name" in a malloc'd string the caller frees, or NULL when
 * out of memory. No normalisation: dir and name are taken as given (a
 * trailing '/' on dir gives "dir//name", which the kernel reads the same). */
char *k3_path_join(const char *dir, const char *name);

#endif
