/*
 * mgr_hash.c — the content hash of a snapshot tree (docs/control-messages.md,
 * "Snapshot hash"): libspaced/treehash.c computes it, for snapshots and
 * templates alike.
 */
#include "mgr.h"

#include "treehash.h"

int mgr_snapshot_hash(const char *dir, char hex[MGR_HASH_HEX], uint64_t *bytes)
{
	return spaced_treehash_dir(dir, hex, bytes);
}
