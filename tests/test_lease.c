/*
 * test_lease.c — libspaced/lease.h: how an execution's supervisor (spaced-launch, spaced-vm) keeps
 * the worker's fence while its gate is not running (docs/control-messages.md "Fence"). The lease
 * file holds the wall-clock second the lease ends; STATE/fenced beside it says the gate is fenced.
 * A supervisor freezes its execution once the lease ended and it runs, never twice; it thaws only
 * what it froze itself, once the lease is valid again (or gone: no fence) and the gate is not
 * fenced; an unreadable file says nothing; it reads at most once a second, and while the lease is
 * valid and nothing is frozen it need not read before the lease's end (spaced_lease_watch_due).
 */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lease.h"

static char dir[64];
static char lease[PATH_MAX], fenced[PATH_MAX];

static void setup(void)
{
	snprintf(dir, sizeof dir, "/tmp/spaced-test-lease-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(lease, sizeof lease, "%s/lease", dir);
	snprintf(fenced, sizeof fenced, "%s/fenced", dir);
}

static void teardown(void)
{
	unlink(lease);
	unlink(fenced);
	rmdir(dir);
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs(text, f);
	fclose(f);
}

/* the lease ends `in` seconds from now (negative: it ended) */
static void lease_ends_in(long long in)
{
	char t[32];
	snprintf(t, sizeof t, "%lld\n", (long long)time(NULL) + in);
	write_file(lease, t);
}

/* one step as if a second had passed since the last */
static enum spaced_lease_action step(struct spaced_lease_watch *w, bool paused, long long *ago)
{
	w->checked_ns = 0;
	return spaced_lease_watch_step(w, paused, ago);
}

TestSuite(lease, .init = setup, .fini = teardown);

Test(lease, read_says_valid_ended_gone_or_unreadable)
{
	long long ago = -1;
	cr_expect_eq(spaced_lease_read(lease, &ago), SPACED_LEASE_GONE);
	lease_ends_in(30);
	cr_expect_eq(spaced_lease_read(lease, &ago), SPACED_LEASE_VALID);
	lease_ends_in(-7);
	cr_expect_eq(spaced_lease_read(lease, &ago), SPACED_LEASE_ENDED);
	cr_expect(ago >= 7 && ago <= 8, "ended %lld s ago, expected 7", ago);
	write_file(lease, "not a number\n");
	cr_expect_eq(spaced_lease_read(lease, NULL), SPACED_LEASE_UNREADABLE);
	cr_expect_not(spaced_lease_gate_fenced(lease));
	write_file(fenced, "");
	cr_expect(spaced_lease_gate_fenced(lease));
}

/* spaced-netgtw reads the lease from a descriptor its helper opened (it may
 * open no file there itself): the same answers, whatever was read before */
Test(lease, read_from_a_descriptor_says_the_same)
{
	lease_ends_in(30);
	int fd = open(lease, O_RDONLY | O_CLOEXEC);
	cr_assert(fd >= 0);
	char skip[4];
	cr_expect(read(fd, skip, sizeof skip) > 0);
	cr_expect_eq(spaced_lease_read_fd(fd, NULL), SPACED_LEASE_VALID);
	close(fd);
	lease_ends_in(-7);
	long long ago = -1;
	fd = open(lease, O_RDONLY | O_CLOEXEC);
	cr_expect_eq(spaced_lease_read_fd(fd, &ago), SPACED_LEASE_ENDED);
	cr_expect(ago >= 7 && ago <= 8, "ended %lld s ago, expected 7", ago);
	close(fd);
	write_file(lease, "");
	fd = open(lease, O_RDONLY | O_CLOEXEC);
	cr_expect_eq(spaced_lease_read_fd(fd, NULL), SPACED_LEASE_UNREADABLE, "an empty file says nothing");
	close(fd);
	write_file(lease, "x12\n");
	fd = open(lease, O_RDONLY | O_CLOEXEC);
	cr_expect_eq(spaced_lease_read_fd(fd, NULL), SPACED_LEASE_UNREADABLE);
	close(fd);
	cr_expect_eq(spaced_lease_read_fd(-1, NULL), SPACED_LEASE_UNREADABLE);
}

Test(lease, no_lease_file_option_means_nothing_to_do)
{
	struct spaced_lease_watch w = {0};
	lease_ends_in(-100);
	cr_expect_eq(step(&w, false, NULL), SPACED_LEASE_NOTHING);
}

Test(lease, ended_freezes_once_and_valid_again_thaws_what_it_froze)
{
	struct spaced_lease_watch w = {.path = lease};
	long long ago = 0;
	lease_ends_in(30);
	cr_expect_eq(step(&w, false, &ago), SPACED_LEASE_NOTHING, "a valid lease: nothing");
	lease_ends_in(-3);
	cr_expect_eq(step(&w, false, &ago), SPACED_LEASE_FREEZE, "ended, running: freeze");
	cr_expect(ago >= 3 && ago <= 4);
	w.frozen = true; /* the caller froze it */
	cr_expect_eq(step(&w, true, &ago), SPACED_LEASE_NOTHING, "frozen already: not again");
	lease_ends_in(30);
	cr_expect_eq(step(&w, true, &ago), SPACED_LEASE_THAW, "valid again, gate not fenced: thaw");
	cr_expect_not(w.frozen);
	cr_expect_eq(step(&w, false, &ago), SPACED_LEASE_NOTHING);
}

Test(lease, a_fenced_gate_thaws_not_the_supervisor)
{
	struct spaced_lease_watch w = {.path = lease, .frozen = true};
	lease_ends_in(30);
	write_file(fenced, "");
	cr_expect_eq(step(&w, true, NULL), SPACED_LEASE_NOTHING, "the gate is fenced: it thaws when its fence lifts");
	cr_expect(w.frozen, "still the supervisor's freeze");
	unlink(fenced);
	cr_expect_eq(step(&w, true, NULL), SPACED_LEASE_THAW, "renewed in the second before the gate's own fence");
}

Test(lease, the_fence_turned_off_thaws_what_it_froze)
{
	struct spaced_lease_watch w = {.path = lease, .frozen = true};
	cr_expect_eq(step(&w, true, NULL), SPACED_LEASE_THAW, "no lease file: no fence");
}

Test(lease, what_the_gate_paused_is_never_thawed_here)
{
	struct spaced_lease_watch w = {.path = lease};
	lease_ends_in(-5);
	cr_expect_eq(step(&w, true, NULL), SPACED_LEASE_NOTHING, "paused by the gate (or the tenant): nothing to freeze");
	lease_ends_in(30);
	cr_expect_eq(step(&w, true, NULL), SPACED_LEASE_NOTHING, "and nothing to thaw: it did not freeze it");
}

Test(lease, unreadable_says_nothing)
{
	struct spaced_lease_watch w = {.path = lease, .frozen = true};
	write_file(lease, "garbage");
	cr_expect_eq(step(&w, true, NULL), SPACED_LEASE_NOTHING);
	cr_expect(w.frozen);
	w.frozen = false;
	cr_expect_eq(step(&w, false, NULL), SPACED_LEASE_NOTHING, "nor freezes");
}

Test(lease, read_at_most_once_a_second)
{
	struct spaced_lease_watch w = {.path = lease};
	lease_ends_in(30);
	cr_expect_eq(step(&w, false, NULL), SPACED_LEASE_NOTHING);
	lease_ends_in(-3);
	cr_expect_eq(spaced_lease_watch_step(&w, false, NULL), SPACED_LEASE_NOTHING, "read less than a second ago");
	cr_expect_eq(step(&w, false, NULL), SPACED_LEASE_FREEZE);
}

/* The next step worth making (spaced_lease_watch_due): the second after the end of a lease read
 * valid, for a timer (an idle supervisor is not woken every second); every second (0) otherwise. */
Test(lease, due_at_the_end_of_a_valid_lease_else_every_second)
{
	struct spaced_lease_watch w = {.path = lease};
	cr_expect_eq(spaced_lease_watch_due(&w), 0, "nothing read yet: every second");
	long long until = (long long)time(NULL) + 30;
	lease_ends_in(30);
	cr_expect_eq(step(&w, false, NULL), SPACED_LEASE_NOTHING);
	long long due = spaced_lease_watch_due(&w);
	cr_expect(due == until + 1 || due == until + 2, "valid: the second after its end (%lld, %lld)", due, until);
	lease_ends_in(-3);
	cr_expect_eq(step(&w, false, NULL), SPACED_LEASE_FREEZE);
	cr_expect_eq(spaced_lease_watch_due(&w), 0, "ended: every second");
	w.frozen = true;
	lease_ends_in(30);
	write_file(fenced, "");
	cr_expect_eq(step(&w, true, NULL), SPACED_LEASE_NOTHING);
	cr_expect_eq(spaced_lease_watch_due(&w), 0, "valid, but the gate fenced and a freeze of its own: every second");
	unlink(fenced);
	cr_expect_eq(step(&w, true, NULL), SPACED_LEASE_THAW);
	cr_expect_eq(spaced_lease_watch_due(&w), 0, "just thawed: read again in a second");
	cr_expect_eq(step(&w, false, NULL), SPACED_LEASE_NOTHING);
	cr_expect_neq(spaced_lease_watch_due(&w), 0, "then valid and nothing frozen: at its end");
	unlink(lease);
	cr_expect_eq(step(&w, false, NULL), SPACED_LEASE_NOTHING);
	cr_expect_eq(spaced_lease_watch_due(&w), 0, "no lease file: every second");
}
