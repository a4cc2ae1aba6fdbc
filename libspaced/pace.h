/*
 * pace.h — write-behind for bulk writes (snapshots, their archives, the
 * store's uploads, staged restores).
 *
 * A writer that leaves a gigabyte dirty in the page cache gets it written
 * back all at once, when the kernel's thresholds or its own fsync say so:
 * every other writer of the disk (another tenant's fsync on its sandbox's
 * disk, the control plane's commits) then waits behind it, for up to a
 * second here. A paced writer starts the writeback of each few MiB as soon
 * as they are written and waits for it once a bounded amount is in flight,
 * so it never holds more than that dirty; with a rate, it also sleeps to stay
 * within that many bytes per second (the execution's --disk-io bound, which
 * the kernel cannot apply to page-cache writes on cgroup v1).
 *
 * One pacer serves one writer (one thread) across any number of files; it
 * holds a duplicate of each file descriptor whose writeback it waits for.
 */
#ifndef SPACED_PACE_H
#define SPACED_PACE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* Bytes a region grows to before its writeback is started. */
#define SPACED_PACE_CHUNK (4u << 20)
/* Bytes under writeback before the writer waits for the oldest. */
#define SPACED_PACE_WINDOW (16u << 20)
/* A region smaller than this (a small file's) has its writeback started
 * and is not waited for: a tree of many small files is not written back
 * one file at a time. */
#define SPACED_PACE_SMALL (256u << 10)
#define SPACED_PACE_RING 32

struct spaced_pace {
	uint64_t rate;  /* bytes per second, 0 for no ceiling */
	bool drop;      /* drop the pages from the cache once written (a file not read back soon) */
	bool stream;    /* a pipe or a socket: only the rate */
	uint64_t t0_ns; /* when the first byte was written */
	uint64_t total; /* bytes written in all */
	uint64_t rate_mark; /* total when the rate was last kept */
	/* the region being written, its writeback not started: fd == -1 for none */
	int fd;
	off_t off;
	uint64_t len;
	/* regions under writeback, oldest first (each with its own descriptor) */
	struct spaced_pace_region {
		int fd;
		off_t off;
		uint64_t len;
	} ring[SPACED_PACE_RING];
	unsigned head, n;
	uint64_t inflight;
};

/* A pacer for a writer at most rate bytes per second (0: none). */
void spaced_pace_init(struct spaced_pace *p, uint64_t rate, bool drop);
/* The same for a writer into a pipe or a socket: the rate alone. */
void spaced_pace_init_stream(struct spaced_pace *p, uint64_t rate);

/* fd was written at [off, off + len). Starts writebacks, waits for them
 * and sleeps as the bounds require. A NULL p does nothing. */
void spaced_pace_wrote(struct spaced_pace *p, int fd, off_t off, uint64_t len);

/* fd is about to be closed: its last region's writeback starts now (the
 * pacer keeps a duplicate of it while it waits). Call it before closing a
 * file written through p, so that its descriptor's number, reused, is
 * never taken for it. A NULL p does nothing. */
void spaced_pace_closing(struct spaced_pace *p, int fd);

/* Lets go of what p waits for without waiting (the files are being
 * discarded): closes its duplicates. A NULL p does nothing. */
void spaced_pace_drop(struct spaced_pace *p);

/* Waits until everything written through p is on its way to the disk and
 * done; closes the duplicates. Call it before reporting success (a later
 * fsync is then cheap) and before discarding p. A NULL p does nothing. */
void spaced_pace_end(struct spaced_pace *p);

#endif
