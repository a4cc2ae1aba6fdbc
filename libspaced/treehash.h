/*
 * treehash.h — the content hash of a directory tree, as snapshots and
 * templates are named and checked (docs/control-messages.md, "Snapshot
 * hash"; v2).
 *
 * BLAKE2b-256 (libsodium crypto_generichash, no key) over one byte stream:
 *
 *   "spaced-snapshot-v2" 0x00
 *   then one record per entry, the root first, depth first; the entries of a
 *   directory in bytewise order of their names, a directory's record before
 *   those of its entries. A record (integers little-endian):
 *     u32 path length, path bytes    relative path ("." for the root, "a/b")
 *     u8  type                       'd' 'f' 'l' 'p' 's' 'c' 'b'
 *     u32 mode                       st_mode & 07777
 *     u32 uid, u32 gid
 *     u64 size                       file: its size; symlink: target length; else 0
 *     u64 rdev                       'c' 'b': st_rdev; else 0
 *     payload                        file: its blocks (below); symlink: its target; else none
 *
 * A file's payload: its content cut into blocks of 4096 bytes (the last one
 * shorter); for each block that is not all zeros, in order, u64 block index
 * and the block's bytes; then u64 0xffffffffffffffff. Zeros cost nothing,
 * whether written or holes.
 *
 * Times, inode numbers, link counts and extended attributes are not part of
 * it. Two ways to compute it, which must agree (tests/test_rootfs.c checks
 * that they do): a walk of a directory on disk (spaced_treehash_dir) and a
 * stream of records from a tree held elsewhere — an archive, a tree in
 * memory (spaced_treehash_entry / _data / _file_end).
 */
#ifndef SPACED_TREEHASH_H
#define SPACED_TREEHASH_H

#include <stddef.h>
#include <stdint.h>

#define SPACED_TREEHASH_HEX 65    /* 64 lowercase hex digits and a NUL */
#define SPACED_TREEHASH_DEPTH 256 /* directories deeper than this are refused */
#define SPACED_TREEHASH_PATH 4096 /* relative paths of this length or more are refused */
#define SPACED_TREEHASH_BLOCK 4096
/* what spaced_treehash_dir reads at most: the data of its files, each name of
 * a file with several read again (the stream holds each name's content) */
#define SPACED_TREEHASH_MAX_READ (UINT64_C(8) << 30)

/* BLAKE2b-256 over the canonical walk of the directory tree at dir
 * (absolute): hex receives it in lowercase, *bytes (may be NULL) the total
 * size of its regular files. Never follows a symlink. Returns 0,
 * SPACED_ENOENT, SPACED_EINVAL (not a directory, an unknown file type),
 * SPACED_ETOOBIG (too deep, a path too long, more than SPACED_TREEHASH_MAX_READ
 * of data to read), SPACED_EIO (also: a file that
 * changed while it was read), SPACED_ENOMEM. */
int spaced_treehash_dir(const char *dir, char hex[SPACED_TREEHASH_HEX], uint64_t *bytes);

/* A hash fed record by record, in the walk order above (the caller keeps
 * that order: the root ".", then sorted depth first). */
struct spaced_treehash;

/* A new stream, the tag already in. Returns 0 or SPACED_ENOMEM. */
int spaced_treehash_new(struct spaced_treehash **out);

/* One entry's record. path is relative ("." for the root); type one of
 * "dfplscb"; size as in the record; link the symlink's target (type 'l').
 * For a file ('f'), its content follows through spaced_treehash_data and
 * spaced_treehash_file_end before the next entry. Returns 0, SPACED_EINVAL
 * (a file left open, a bad type, a link target of another length). */
int spaced_treehash_entry(struct spaced_treehash *h, const char *path, char type, uint32_t mode, uint32_t uid,
                          uint32_t gid, uint64_t size, uint64_t rdev, const char *link);

/* Content of the open file: n bytes at offset off. Calls come in increasing
 * offsets (a gap between them is zeros, as a hole); data past the file's
 * size is SPACED_EINVAL. */
int spaced_treehash_data(struct spaced_treehash *h, uint64_t off, const void *p, size_t n);

/* Ends the open file's payload. */
int spaced_treehash_file_end(struct spaced_treehash *h);

/* The hash, lowercase hex; h is freed. Returns 0 or SPACED_EINVAL (a file
 * left open: h is freed too). */
int spaced_treehash_final(struct spaced_treehash *h, char hex[SPACED_TREEHASH_HEX]);

/* Frees h without a result; accepts NULL. */
void spaced_treehash_free(struct spaced_treehash *h);

/* True when s is 64 lowercase hex digits. */
int spaced_treehash_hex_valid(const char *s);

#endif
