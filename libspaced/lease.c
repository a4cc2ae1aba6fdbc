/*
 * lease.c — the worker's lease as read by the processes that keep its fence
 * without the gate (lease.h).
 */
#include "lease.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

static enum spaced_lease_state read_fd(int fd, long long *ended_s, long long *until_out);

static enum spaced_lease_state read_path(const char *path, long long *ended_s, long long *until)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? SPACED_LEASE_GONE : SPACED_LEASE_UNREADABLE;
	enum spaced_lease_state s = read_fd(fd, ended_s, until);
	close(fd);
	return s;
}

enum spaced_lease_state spaced_lease_read(const char *path, long long *ended_s)
{
	return read_path(path, ended_s, NULL);
}

enum spaced_lease_state spaced_lease_read_fd(int fd, long long *ended_s)
{
	return read_fd(fd, ended_s, NULL);
}

/* spaced_lease_read_fd; *until_out (may be NULL): the lease's end, when VALID. */
static enum spaced_lease_state read_fd(int fd, long long *ended_s, long long *until_out)
{
	/* one decimal number (leading blanks, then digits: as fscanf's %lld took it) */
	char buf[64];
	ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
	if (n <= 0)
		return SPACED_LEASE_UNREADABLE;
	buf[n] = 0;
	char *end;
	errno = 0;
	long long until = strtoll(buf, &end, 10);
	if (end == buf || errno != 0)
		return SPACED_LEASE_UNREADABLE;
	long long now = (long long)time(NULL);
	if (now <= until) {
		if (until_out)
			*until_out = until;
		return SPACED_LEASE_VALID;
	}
	if (ended_s)
		*ended_s = now - until;
	return SPACED_LEASE_ENDED;
}

long long spaced_lease_watch_due(const struct spaced_lease_watch *w)
{
	if (w->path == NULL || w->frozen || w->valid_until <= 0 || w->valid_until + 1 <= (long long)time(NULL))
		return 0;
	return w->valid_until + 1;
}

bool spaced_lease_gate_fenced(const char *lease_path)
{
	char fenced[PATH_MAX];
	const char *slash = strrchr(lease_path, '/');
	snprintf(fenced, sizeof fenced, "%.*sfenced", slash ? (int)(slash - lease_path + 1) : 0, lease_path);
	return access(fenced, F_OK) == 0;
}

enum spaced_lease_action spaced_lease_watch_step(struct spaced_lease_watch *w, bool paused, long long *ended_s)
{
	uint64_t now = spaced_mono_ns();
	if (w->path == NULL || now - w->checked_ns < 1000000000ull)
		return SPACED_LEASE_NOTHING;
	w->checked_ns = now;
	long long until = 0;
	w->valid_until = 0;
	enum spaced_lease_state s = read_path(w->path, ended_s, &until);
	switch (s) {
	case SPACED_LEASE_VALID:
	case SPACED_LEASE_GONE: {
		if (spaced_lease_gate_fenced(w->path))
			return SPACED_LEASE_NOTHING;
		bool thaw = w->frozen && paused;
		w->frozen = false;
		if (s == SPACED_LEASE_VALID && !thaw)
			w->valid_until = until;
		return thaw ? SPACED_LEASE_THAW : SPACED_LEASE_NOTHING;
	}
	case SPACED_LEASE_ENDED:
		return w->frozen || paused ? SPACED_LEASE_NOTHING : SPACED_LEASE_FREEZE;
	case SPACED_LEASE_UNREADABLE:
		break;
	}
	return SPACED_LEASE_NOTHING;
}
