/*
 * rootfs.h — root filesystem trees as spaced keeps templates and moves
 * snapshots (docs/templates.md).
 *
 * A template is a tree held as one *canonical archive*: a POSIX pax tar
 * whose entries come in the walk order of treehash.h (the root "./" first,
 * then depth first by bytewise name order), holding only directories,
 * regular files (sparse where they have holes), symlinks and FIFOs, with
 * owners in the canonical range 100000 … 165535 (an execution's own ids,
 * as snapshots store them: inside id k is 100000 + k). Its name is the tree
 * hash of what it holds, so a worker that extracts it recomputes the hash
 * of the directory it made and compares (treehash.h).
 *
 * A tree is built in memory from archives read with libarchive — a root
 * filesystem tarball (gzip, xz, zstd or none), the layers of an OCI image
 * (rootfs_oci.c) with their whiteouts, a template archive, or a snapshot's
 * overlay upper directory (whiteouts as 0/0 character devices, opaque
 * directories) — then written as a canonical archive. Everything an archive
 * says is distrusted:
 *   - paths are normalized (leading "/" and "./" dropped, "." parts
 *     skipped); a ".." part, a path of 4096 bytes or more, or deeper than
 *     256 directories is refused;
 *   - an entry under a symlink or a file of the tree is refused (nothing is
 *     ever written through a link);
 *   - a hard link must name a regular file already in the tree; it becomes
 *     a copy of it (the hash ignores link counts);
 *   - device nodes are dropped (counted), sockets too; setuid and setgid
 *     bits are cleared (counted: inside an execution no_new_privs makes them
 *     inert, outside they are a hazard); extended attributes are dropped;
 *   - owners above 65535 are refused;
 *   - file content read in all (every layer, decompressed), declared sizes
 *     and entries are bounded (spaced_rootfs_limits): a compression bomb
 *     stops at the bound.
 * File content is spooled to an unnamed temporary file; holes stay holes.
 *
 * Extraction (spaced_rootfs_extract) accepts only what this module writes:
 * entries in strict walk order, every parent directory before its entries,
 * no hard links (a snapshot's excepted: without content, each naming a
 * regular file restored before it, reached beneath the new tree through no
 * symlink), no devices (a snapshot's 0/0 whiteouts excepted), owners in
 * the range the kind allows; it writes with libarchive's secure flags (no
 * "..", no absolute paths, never through a symlink) into a new directory.
 */
#ifndef SPACED_ROOTFS_H
#define SPACED_ROOTFS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "treehash.h"

#define SPACED_ROOTFS_CANON_UID 100000u /* inside id k is stored as 100000 + k */
#define SPACED_ROOTFS_IDS 65536u
/* A template's configuration as kept ({"env","workdir","user"}, compact
 * JSON) is at most this long: a worker passes it to the guest together with
 * the sandbox's own settings, all of it within 12 KiB. */
#define SPACED_ROOTFS_CONFIG_MAX 8192u

struct spaced_rootfs_limits {
	uint64_t max_bytes;   /* file content read in all, and any one file's size */
	uint64_t max_entries; /* entries read in all */
};

/* 8 GiB of content, 2,000,000 entries. */
void spaced_rootfs_limits_default(struct spaced_rootfs_limits *l);

enum spaced_rootfs_kind {
	SPACED_ROOTFS_TARBALL = 1, /* a root filesystem tarball: owners as inside (0 … 65535) */
	SPACED_ROOTFS_OCI_LAYER,   /* an OCI layer: a tarball plus ".wh." whiteouts */
	SPACED_ROOTFS_TEMPLATE,    /* a canonical archive (owners in the canonical range) */
	SPACED_ROOTFS_UPPER,       /* a snapshot archive: its upper/root/ layer applied as an overlay upper
	                            * directory (0/0 character devices are whiteouts, trusted.overlay.opaque
	                            * makes a directory opaque); owners canonical, or host root (0) for
	                            * the directories the launcher made. /dev, /proc, /.spaced,
	                            * /etc/hostname and /etc/hosts are not taken (each execution gets
	                            * its own). */
};

struct spaced_rootfs;

/* A new, empty tree (its root: a directory 0755 owned by root inside);
 * content is spooled in spool_dir. Returns 0, SPACED_ENOMEM, SPACED_ESYS. */
int spaced_rootfs_new(const struct spaced_rootfs_limits *lim, const char *spool_dir, struct spaced_rootfs **out,
                      char *why, size_t whysz);
void spaced_rootfs_free(struct spaced_rootfs *t);

/* Applies the archive at path (any compression libarchive reads) as the
 * next layer of kind. Returns 0, SPACED_EFORMAT (not an archive, or an entry
 * refused: why says which), SPACED_ETOOBIG (a bound), SPACED_EIO,
 * SPACED_ENOMEM. After a failure the tree must be freed. */
int spaced_rootfs_add_archive(struct spaced_rootfs *t, const char *path, enum spaced_rootfs_kind kind, char *why,
                              size_t whysz);

/* Imports what a user gives: an OCI image archive (a tar holding an image
 * layout: oci-layout, index.json, blobs/sha256/…) or else a root filesystem
 * tarball. For an image, *config (may be NULL) receives
 * {"env":[…],"workdir":…,"user":…} from its configuration, or NULL; an
 * image whose configuration so kept is longer than SPACED_ROOTFS_CONFIG_MAX
 * is refused (SPACED_ETOOBIG). Returns as spaced_rootfs_add_archive;
 * *format receives "oci" or "tarball". */
int spaced_rootfs_import(struct spaced_rootfs *t, const char *path, json_t **config, const char **format, char *why,
                         size_t whysz);

/* What a written tree holds. */
struct spaced_rootfs_info {
	char hash[SPACED_TREEHASH_HEX];
	uint64_t bytes;    /* sizes of its regular files */
	uint64_t entries;
	uint64_t dropped;  /* device nodes and sockets left out */
	uint64_t cleared;  /* files whose setuid/setgid bits were cleared */
};

/* Writes the tree as a canonical archive to out (created, 0600; replaced
 * when it exists) and computes its hash in the same walk. SPACED_ETOOBIG
 * when its files' sizes (each hard link a copy) pass the limits' max_bytes. */
int spaced_rootfs_write(struct spaced_rootfs *t, const char *out, struct spaced_rootfs_info *info, char *why,
                        size_t whysz);

enum spaced_rootfs_extract_kind {
	SPACED_ROOTFS_X_TEMPLATE = 1, /* a canonical archive */
	SPACED_ROOTFS_X_SNAPSHOT,     /* an archive of spaced_rootfs_pack_dir: meta, upper/<layer>/… */
};

/* Extracts archive into dst, which must not exist (made 0700, then given the
 * root entry's owner and mode). Returns 0, SPACED_EEXIST, SPACED_EFORMAT (an
 * entry refused: why), SPACED_ETOOBIG, SPACED_EIO; on failure dst is removed. */
int spaced_rootfs_extract(const char *archive, const char *dst, enum spaced_rootfs_extract_kind kind,
                          const struct spaced_rootfs_limits *lim, char *why, size_t whysz);

/* Packs the directory dir (a snapshot: its meta and upper/) into an archive
 * at out, in walk order: directories, files (holes kept), symlinks, FIFOs,
 * 0/0 character devices (whiteouts), owners and modes as they are, times,
 * and trusted.overlay.* attributes. A file's later names are hard links to
 * its first (spaced_rootfs_extract of a snapshot makes the links, each to a
 * file already restored, beneath the new tree); sockets are skipped.
 * SPACED_ETOOBIG past 8 GiB of files by their sizes (holes included, each
 * file once: what spaced_rootfs_extract takes back). The archive is written
 * behind and at rate bytes per second at most (pace.h; 0: no ceiling). */
int spaced_rootfs_pack_dir(const char *dir, const char *out, uint64_t rate, char *why, size_t whysz);
/* The same archive written into fd, a pipe or a socket (not closed), at
 * rate bytes per second at most: nothing of it is written to a disk here. */
int spaced_rootfs_pack_fd(const char *dir, int fd, uint64_t rate, char *why, size_t whysz);

/* rootfs_oci.c: true when the archive at path holds an OCI image layout
 * (an "oci-layout" or "index.json" entry at its top). */
int spaced_rootfs_is_oci(const char *path);

/* rootfs_oci.c: applies the image in the OCI image archive at path (index →
 * manifest for linux/amd64 → layers in order; every blob checked against its
 * sha256 digest and size before it is used). */
int spaced_rootfs_add_oci(struct spaced_rootfs *t, const char *path, json_t **config, char *why, size_t whysz);

/* For rootfs_oci.c: the spool directory and limits of t. */
const char *spaced_rootfs_spool_dir(const struct spaced_rootfs *t);
const struct spaced_rootfs_limits *spaced_rootfs_limits_of(const struct spaced_rootfs *t);

#endif
