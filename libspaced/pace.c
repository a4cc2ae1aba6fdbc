/*
 * pace.c — write-behind for bulk writes (pace.h).
 */
#include "pace.h"

#include <errno.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

void spaced_pace_init(struct spaced_pace *p, uint64_t rate, bool drop)
{
	*p = (struct spaced_pace){.rate = rate, .drop = drop, .fd = -1};
}

void spaced_pace_init_stream(struct spaced_pace *p, uint64_t rate)
{
	*p = (struct spaced_pace){.rate = rate, .stream = true, .fd = -1};
}

/* The oldest region under writeback: waited for, its pages dropped when asked. */
static void wait_oldest(struct spaced_pace *p)
{
	struct spaced_pace_region *r = &p->ring[p->head];
	(void)sync_file_range(r->fd, r->off, (off_t)r->len,
	                      SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
	if (p->drop)
		(void)posix_fadvise(r->fd, r->off, (off_t)r->len, POSIX_FADV_DONTNEED);
	close(r->fd);
	p->inflight -= r->len;
	p->head = (p->head + 1) % SPACED_PACE_RING;
	p->n--;
}

/* The current region's writeback starts; the writer waits while too much
 * is under way. A region whose descriptor cannot be kept is written back
 * now (synchronously) instead. */
static void start_current(struct spaced_pace *p)
{
	if (p->fd < 0 || p->len == 0) {
		p->fd = -1;
		return;
	}
	(void)sync_file_range(p->fd, p->off, (off_t)p->len, SYNC_FILE_RANGE_WRITE);
	if (p->len < SPACED_PACE_SMALL) {
		p->fd = -1;
		p->len = 0;
		return;
	}
	if (p->n == SPACED_PACE_RING)
		wait_oldest(p);
	int dup_fd = fcntl(p->fd, F_DUPFD_CLOEXEC, 0);
	if (dup_fd < 0) {
		(void)sync_file_range(p->fd, p->off, (off_t)p->len,
		                      SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
	} else {
		p->ring[(p->head + p->n) % SPACED_PACE_RING] = (struct spaced_pace_region){dup_fd, p->off, p->len};
		p->n++;
		p->inflight += p->len;
	}
	while (p->n > 0 && p->inflight > SPACED_PACE_WINDOW)
		wait_oldest(p);
	p->fd = -1;
	p->len = 0;
}

/* Sleeps until total bytes fit the rate since the first. */
static void keep_rate(struct spaced_pace *p)
{
	if (p->rate == 0)
		return;
	uint64_t due = p->t0_ns + (uint64_t)((double)p->total * 1e9 / (double)p->rate), now = spaced_mono_ns();
	if (due <= now)
		return;
	uint64_t ns = due - now;
	struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

void spaced_pace_wrote(struct spaced_pace *p, int fd, off_t off, uint64_t len)
{
	if (!p || len == 0)
		return;
	if (p->total == 0)
		p->t0_ns = spaced_mono_ns();
	p->total += len;
	if (!p->stream) {
		if (p->fd != fd || off != p->off + (off_t)p->len)
			start_current(p);
		if (p->fd < 0) {
			p->fd = fd;
			p->off = off;
			p->len = 0;
		}
		p->len += len;
		if (p->len >= SPACED_PACE_CHUNK)
			start_current(p);
	}
	/* the rate by bytes, however they are split into files */
	if (p->total - p->rate_mark >= SPACED_PACE_CHUNK) {
		p->rate_mark = p->total;
		keep_rate(p);
	}
}

void spaced_pace_drop(struct spaced_pace *p)
{
	if (!p)
		return;
	while (p->n > 0) {
		close(p->ring[p->head].fd);
		p->inflight -= p->ring[p->head].len;
		p->head = (p->head + 1) % SPACED_PACE_RING;
		p->n--;
	}
	p->fd = -1;
	p->len = 0;
}

void spaced_pace_closing(struct spaced_pace *p, int fd)
{
	if (p && !p->stream && p->fd == fd)
		start_current(p);
}

void spaced_pace_end(struct spaced_pace *p)
{
	if (!p)
		return;
	start_current(p);
	while (p->n > 0)
		wait_oldest(p);
	keep_rate(p);
}
