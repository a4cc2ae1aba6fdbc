/*
 * test_util.c — libspaced's file helpers (util.h): spaced_file_replace()
 * puts the new content in place whether path exists or not, leaves the old
 * file at tmp when it swapped them (RENAME_EXCHANGE: no writeback in the
 * caller's time on ext4), and reuses a longer leftover at tmp correctly;
 * spaced_copy_range() copies a range on one filesystem and onto another.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "spaced_error.h"
#include "util.h"
#include "log.h"
#include "frame.h"
#include "pace.h"

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

/* spaced_copy_range: on one filesystem (copy_file_range) and onto another
 * (/dev/shm, a tmpfs: EXDEV, read and write instead), the same bytes at the
 * same offsets; a source that ends early stops the copy there. */
static void copy_check(const char *dst_dir)
{
	static char data[300000];
	for (size_t i = 0; i < sizeof data; i++)
		data[i] = (char)(i * 7 + i / 1000);
	int in = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	cr_assert_geq(in, 0);
	cr_assert_eq(write(in, data, sizeof data), (ssize_t)sizeof data);
	char dst[160];
	snprintf(dst, sizeof dst, "%s/copy-XXXXXX", dst_dir);
	int out = mkstemp(dst);
	cr_assert_geq(out, 0);
	cr_assert_eq(spaced_copy_range(in, out, 1000, 250000, NULL), 0);
	struct stat sb;
	cr_assert_eq(fstat(out, &sb), 0);
	cr_assert_eq(sb.st_size, 251000, "written at the same offsets: %lld", (long long)sb.st_size);
	static char back[251000];
	cr_assert_eq(pread(out, back, sizeof back, 0), (ssize_t)sizeof back);
	for (size_t i = 0; i < 1000; i++)
		cr_assert_eq(back[i], 0, "nothing before the range");
	cr_assert(memcmp(back + 1000, data + 1000, 250000) == 0, "the range's bytes");
	/* past the source's end: what there is, then 0 */
	cr_assert_eq(spaced_copy_range(in, out, 290000, 50000, NULL), 0);
	cr_assert_eq(fstat(out, &sb), 0);
	cr_assert_eq(sb.st_size, 300000, "stops where the source ends: %lld", (long long)sb.st_size);
	close(in);
	close(out);
	unlink(dst);
}

Test(copy_range, same_filesystem, .init = setup, .fini = teardown)
{
	copy_check(dir);
}

/* A paced copy (pace.h) is the same copy, written behind in chunks, and
 * holds its rate: 12 MiB at 24 MiB/s cannot end in less than about half a
 * second (a bound below, which a slow machine only exceeds further). */
Test(copy_range, paced, .init = setup, .fini = teardown)
{
	size_t size = 12u << 20;
	char *data = malloc(size), *back = malloc(size);
	cr_assert(data && back);
	for (size_t i = 0; i < size; i++)
		data[i] = (char)(i * 13 + i / 4099);
	int in = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	cr_assert_geq(in, 0);
	cr_assert_eq(spaced_io_write_full(in, data, size), 0);
	char dst[160];
	snprintf(dst, sizeof dst, "%s/paced-XXXXXX", dir);
	int out = mkstemp(dst);
	cr_assert_geq(out, 0);
	struct spaced_pace pace;
	spaced_pace_init(&pace, 24u << 20, true);
	uint64_t t0 = spaced_mono_ns();
	cr_assert_eq(spaced_copy_range(in, out, 0, (off_t)size, &pace), 0);
	spaced_pace_end(&pace);
	uint64_t took = spaced_mono_ns() - t0;
	cr_expect_eq(pace.total, size, "every byte counted: %llu", (unsigned long long)pace.total);
	cr_expect_eq(pace.n, 0u, "nothing left under writeback");
	cr_expect_eq(pace.inflight, 0u);
	cr_expect_geq(took, 400000000u, "12 MiB at 24 MiB/s took %.3f s", (double)took / 1e9);
	cr_assert_eq(pread(out, back, size, 0), (ssize_t)size);
	cr_expect(memcmp(back, data, size) == 0, "the same bytes");
	/* written in pieces, no rate: all of it, every region waited for */
	cr_assert_eq(ftruncate(out, 0), 0);
	cr_assert_eq(lseek(out, 0, SEEK_SET), 0);
	spaced_pace_init(&pace, 0, false);
	for (size_t off = 0; off < size; off += 100000) {
		size_t n = size - off < 100000 ? size - off : 100000;
		cr_assert_eq(spaced_io_write_full(out, data + off, n), 0);
		spaced_pace_wrote(&pace, out, (off_t)off, n);
	}
	spaced_pace_end(&pace);
	cr_expect_eq(pace.total, size);
	cr_expect_eq(pace.n, 0u);
	cr_assert_eq(pread(out, back, size, 0), (ssize_t)size);
	cr_expect(memcmp(back, data, size) == 0, "the same bytes");
	close(in);
	close(out);
	unlink(dst);
	free(data);
	free(back);
}

Test(copy_range, onto_another_filesystem, .init = setup, .fini = teardown)
{
	struct stat a, b;
	if (stat("/dev/shm", &b) < 0 || stat(dir, &a) < 0 || a.st_dev == b.st_dev)
		cr_skip_test("no /dev/shm on another filesystem here");
	copy_check("/dev/shm");
}

/* spaced_str_replace: a reason's host paths made the reader's own */
Test(str_replace, every_occurrence_and_the_bound)
{
	char s[64];
	snprintf(s, sizeof s, "copy /st/upper/root/a/b: x; /st/upper/root/c");
	spaced_str_replace(s, sizeof s, "/st/upper/root", "");
	cr_expect_str_eq(s, "copy /a/b: x; /c");
	snprintf(s, sizeof s, "ab ab ab");
	spaced_str_replace(s, sizeof s, "ab", "abab"); /* to holding from: no loop */
	cr_expect_str_eq(s, "abab abab abab");
	char t[8];
	snprintf(t, sizeof t, "x-y-z");
	spaced_str_replace(t, sizeof t, "-", "--"); /* grows past the bound: cut, terminated */
	cr_expect_str_eq(t, "x--y--z");
	snprintf(t, sizeof t, "a-b-c-d");
	spaced_str_replace(t, sizeof t, "-", "___");
	cr_expect_str_eq(t, "a___b__");
	snprintf(t, sizeof t, "abc");
	spaced_str_replace(t, sizeof t, "", "x"); /* an empty from: nothing */
	cr_expect_str_eq(t, "abc");
}

/* log.h: what a tenant chose (a path in a reason) can neither end a log line
 * nor forge a pair of it */
Test(log, control_bytes_become_text)
{
	char s[64];
	snprintf(s, sizeof s, "reason=\"a\nsbx-manager: level=error\r\x01\x7f\"");
	spaced_log_escape_controls(s, sizeof s);
	cr_expect_str_eq(s, "reason=\"a\\nsbx-manager: level=error\\r\\x01\\x7f\"");
	char t[8];
	snprintf(t, sizeof t, "ab\n\n\ncd");
	spaced_log_escape_controls(t, sizeof t); /* cut at the bound, never mid-escape */
	cr_expect_str_eq(t, "ab\\n\\n");
	snprintf(s, sizeof s, "plain line");
	spaced_log_escape_controls(s, sizeof s);
	cr_expect_str_eq(s, "plain line");
}

Test(log, a_forged_pair_keeps_the_line_whole_in_json)
{
	char *j = spaced_logfmt_to_json("gate", "level=info event=x reason=\"p\" level=error event=forged y=\"\"", 0);
	cr_assert_not_null(j);
	cr_expect_not_null(strstr(j, "\"msg\":"), "%s", j);
	cr_expect_null(strstr(j, "\"level\":\"error\""), "%s", j);
	free(j);
	j = spaced_logfmt_to_json("gate", "level=info event=x reason=\"p q\"", 0);
	cr_expect_not_null(strstr(j, "\"level\":\"info\""), "%s", j);
	cr_expect_not_null(strstr(j, "\"reason\":\"p q\""), "%s", j);
	free(j);
}

/* spaced_utf8_clean: a reason cut mid-character still makes a JSON string */
Test(utf8_clean, bad_and_cut_sequences_become_question_marks)
{
	char s[32];
	snprintf(s, sizeof s, "a\xc3\xa9/\xe2\x82\xac/\xf0\x9f\x98\x80 ok");
	spaced_utf8_clean(s);
	cr_expect_str_eq(s, "a\xc3\xa9/\xe2\x82\xac/\xf0\x9f\x98\x80 ok", "valid text untouched");
	snprintf(s, sizeof s, "x\xff\xc3(\xed\xa0\x80\xc0\xaf");
	spaced_utf8_clean(s); /* 0xff, a lead without its follower, a surrogate, an overlong '/' */
	cr_expect_str_eq(s, "x?" "?(" "?????");
	snprintf(s, sizeof s, "cut \xe2\x82");
	spaced_utf8_clean(s);
	cr_expect_str_eq(s, "cut ??");
}
