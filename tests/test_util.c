/*
 * test_util.c — libspaced's file helpers (util.h): spaced_file_replace()
 * puts the new content in place whether path exists or not, leaves the old
 * file at tmp when it swapped them (RENAME_EXCHANGE: no writeback in the
 * caller's time on ext4), and reuses a longer leftover at tmp correctly.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "util.h"

static char dir[64], path[128], tmp[128];

static void setup(void)
{
	snprintf(dir, sizeof dir, "/tmp/test-util-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(path, sizeof path, "%s/file", dir);
	snprintf(tmp, sizeof tmp, "%s/.file.tmp", dir);
}

static void teardown(void)
{
	unlink(path);
	unlink(tmp);
	rmdir(dir);
}

/* The whole content of p ("" when missing: *exists false). */
static char *slurp(const char *p, bool *exists)
{
	static char buf[256];
	int fd = open(p, O_RDONLY);
	*exists = fd >= 0;
	ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : 0;
	if (fd >= 0)
		close(fd);
	buf[n > 0 ? n : 0] = 0;
	return buf;
}

TestSuite(file_replace, .init = setup, .fini = teardown);

Test(file_replace, new_path_then_swaps)
{
	bool ex;
	cr_assert_eq(spaced_file_replace(tmp, path, "first version\n", 14, 0600, false), SPACED_OK);
	cr_assert_str_eq(slurp(path, &ex), "first version\n");
	slurp(tmp, &ex);
	cr_assert(!ex, "a plain rename onto a new path leaves no temporary file");

	/* onto an existing file: swapped, the old content is now at tmp */
	cr_assert_eq(spaced_file_replace(tmp, path, "second\n", 7, 0600, false), SPACED_OK);
	cr_assert_str_eq(slurp(path, &ex), "second\n");
	cr_assert_str_eq(slurp(tmp, &ex), "first version\n", "the old file is kept at tmp for the next write");

	/* the leftover at tmp is longer than the next content: cut to size */
	cr_assert_eq(spaced_file_replace(tmp, path, "3rd\n", 4, 0600, true), SPACED_OK);
	cr_assert_str_eq(slurp(path, &ex), "3rd\n");
	cr_assert_str_eq(slurp(tmp, &ex), "second\n");
	struct stat st;
	cr_assert_eq(stat(path, &st), 0);
	cr_assert_eq(st.st_size, 4);
	cr_assert_eq(st.st_mode & 0777, 0600);
}

Test(file_replace, prepared_tmp)
{
	bool ex;
	spaced_file_prepare(tmp, 0640);
	cr_assert_str_eq(slurp(tmp, &ex), "");
	cr_assert(ex, "spaced_file_prepare makes the temporary file");
	cr_assert_eq(spaced_file_replace(tmp, path, "x\n", 2, 0600, false), SPACED_OK);
	cr_assert_str_eq(slurp(path, &ex), "x\n");
}

Test(file_replace, unwritable_dir_fails_cleanly)
{
	char bad[160];
	snprintf(bad, sizeof bad, "%s/missing/file", dir);
	char badtmp[170];
	snprintf(badtmp, sizeof badtmp, "%s/missing/.file.tmp", dir);
	cr_assert_eq(spaced_file_replace(badtmp, bad, "x", 1, 0600, false), SPACED_EIO);
}
