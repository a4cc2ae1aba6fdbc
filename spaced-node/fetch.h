/*
 * fetch.h — blobs between a worker and the control plane's store
 * (templates and snapshots over HTTP, docs/templates.md), and the worker's
 * cache of templates (tmpl_cache.c). Used by the executor's job children.
 */
#ifndef SPACED_NODE_FETCH_H
#define SPACED_NODE_FETCH_H

#include <stddef.h>
#include <stdint.h>

#include "treehash.h"

struct mgr_config;

/* Downloads url into dst (appending to what dst already holds: a download
 * cut short goes on where it ended, Range: bytes=N-), with the worker key
 * of cfg's state directory; at most max bytes. An https:// store is verified
 * against cfg->tls_ca (else the system's trust store) and given the worker's
 * client certificate when cfg names one. Returns 0, SPACED_ENOENT (404),
 * SPACED_EPERM (401/403), SPACED_ETOOBIG, SPACED_EINVAL (not http), SPACED_EIO. */
int fetch_blob(const struct mgr_config *cfg, const char *url, const char *dst, uint64_t max, char *why,
               size_t whysz);

/* PUTs what comes out of fd (a pipe) to url, chunked (201 expected), as
 * fetch_blob connects. At fd's end, ended(arg, why, whysz) says whether
 * its producer finished (0) or failed (< 0, why set): then the transfer is
 * cut before its last chunk and that error returned, so the store takes
 * nothing. 0 or SPACED_EIO, SPACED_EINVAL, ended's error. */
int fetch_upload_stream(const struct mgr_config *cfg, const char *url, int fd,
                        int (*ended)(void *arg, char *why, size_t whysz), void *arg, char *why, size_t whysz);

/* ---- tmpl_cache.c ---- */

/* Makes sure the template named by hash is in this worker's cache and
 * unchanged, and returns its root (STATE/templates/HASH/root) in root:
 *   - not there: fetched from url (resumable), extracted (libspaced/rootfs.h:
 *     only a canonical archive is accepted), and its tree hash recomputed:
 *     unless it equals hash nothing is kept (SPACED_EIDENTITY);
 *   - there: its metadata fingerprint (every entry's path, type, mode,
 *     owner, size, inode, mtime and ctime) must equal the one recorded when
 *     it was verified; when it differs the tree hash is recomputed, and a
 *     tree that no longer has its hash is thrown away and fetched again.
 * Serialized per template by STATE/templates/HASH.lock. *fetched (may be
 * NULL) tells whether it was fetched now. Returns 0 or a SPACED_E* code with
 * a reason in why. */
int tmpl_ensure(const struct mgr_config *cfg, const char *hash, const char *url, char *root, size_t rootsz,
                int *fetched, char *why, size_t whysz);

/* 0 when the cached template's metadata fingerprint is the one recorded at
 * its verification (what a claim of a pooled execution on it checks),
 * SPACED_EIDENTITY when not (or it is not here). */
int tmpl_unchanged(const struct mgr_config *cfg, const char *hash);

/* Removes least recently used templates until the cache holds at most max
 * bytes, never one of keep[0..nkeep) nor one used in the last minute. */
void tmpl_evict(const struct mgr_config *cfg, uint64_t max, const char *const *keep, size_t nkeep);

#endif
