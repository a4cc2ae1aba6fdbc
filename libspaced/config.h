/*
 * config.h — one configuration file per daemon.
 *
 * A daemon started with `--config FILE` reads FILE as its options: one per
 * line, `name value` (or `name` alone for a flag), `#` starting a comment,
 * blank lines ignored; `name` is the long option without its dashes
 * (`listen 127.0.0.1:7801` is `--listen 127.0.0.1:7801`). The file's options
 * come first and the command line's after them, so the command line wins
 * where a daemon takes the last of a repeated option.
 */
#ifndef SPACED_CONFIG_H
#define SPACED_CONFIG_H

#include <stddef.h>

/* Returns a new argv (argv[0], the file's options, then the command line's
 * without `--config FILE`) in *out_argv / *out_argc, or argv itself when there
 * is no --config. Returns 0, or -1 with a message in err (unreadable file, a
 * line that is not `name [value]`, a file over 64 KiB or 256 options). The
 * new argv lives until the process ends. */
int spaced_config_expand(int argc, char **argv, int *out_argc, char ***out_argv, char *err, size_t errsz);

#endif
