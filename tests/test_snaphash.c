/*
 * test_snaphash.c — the snapshot content hash (spaced-node/mgr_hash.c,
 * docs/control-messages.md "Snapshot hash"; issue 5 item 7) on real trees:
 * equal for equal trees however they were made, different for every change
 * the definition covers, unchanged by what it leaves out (times).
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "spaced_error.h"
#include "mgr.h"

static char top[64];

static void setup(void)
{
	snprintf(top, sizeof top, "/tmp/snaphash-XXXXXX");
	cr_assert_not_null(mkdtemp(top));
}

static void teardown(void)
{
	pid_t p = fork();
	if (p == 0) {
		execlp("rm", "rm", "-rf", "--", top, (char *)NULL);
		_exit(127);
	}
	waitpid(p, NULL, 0);
}

TestSuite(snaphash, .init = setup, .fini = teardown);

static const char *at(const char *rel)
{
	static char buf[8][256];
	static int n;
	char *b = buf[n++ % 8];
	snprintf(b, 256, "%s/%s", top, rel);
	return b;
}

static void put(const char *rel, const char *text, mode_t mode)
{
	int fd = open(at(rel), O_WRONLY | O_CREAT | O_TRUNC, mode);
	cr_assert(fd >= 0, "create %s", rel);
	cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	cr_assert_eq(chmod(at(rel), mode), 0);
}

/* a small tree of every kind, created in the given order */
static void tree(const char *root, bool reverse)
{
	char p[128];
	snprintf(p, sizeof p, "%s", root);
	cr_assert_eq(mkdir(at(p), 0755), 0);
	const char *names[] = {"a", "a-b", "b"};
	for (int k = 0; k < 3; k++) {
		const char *nm = names[reverse ? 2 - k : k];
		snprintf(p, sizeof p, "%s/%s", root, nm);
		if (strcmp(nm, "a") == 0) {
			cr_assert_eq(mkdir(at(p), 0700), 0);
			snprintf(p, sizeof p, "%s/a/b", root);
			put(p, "inner", 0600);
			snprintf(p, sizeof p, "%s/a/l", root);
			cr_assert_eq(symlink("b", at(p)), 0);
		} else {
			put(p, nm, 0644);
		}
	}
	snprintf(p, sizeof p, "%s/fifo", root);
	cr_assert_eq(mkfifo(at(p), 0640), 0);
}

static void hash(const char *rel, char out[MGR_HASH_HEX])
{
	uint64_t bytes = 0;
	cr_assert_eq(mgr_snapshot_hash(at(rel), out, &bytes), 0, "hash of %s", rel);
	cr_assert_eq(strlen(out), 64);
	cr_assert_eq(strspn(out, "0123456789abcdef"), 64);
}

Test(snaphash, same_tree_same_hash_whatever_the_creation_order)
{
	char h1[MGR_HASH_HEX], h2[MGR_HASH_HEX];
	uint64_t bytes = 0;
	tree("x", false);
	tree("y", true);
	hash("x", h1);
	hash("y", h2);
	cr_expect_str_eq(h1, h2);
	cr_assert_eq(mgr_snapshot_hash(at("x"), h1, &bytes), 0);
	cr_expect_eq(bytes, strlen("inner") + strlen("a-b") + strlen("b"), "bytes: the regular files' sizes");
}

Test(snaphash, times_are_not_part_of_it)
{
	char h1[MGR_HASH_HEX], h2[MGR_HASH_HEX];
	tree("x", false);
	hash("x", h1);
	struct timeval tv[2] = {{1000000, 0}, {1000000, 0}};
	cr_assert_eq(utimes(at("x/a/b"), tv), 0);
	cr_assert_eq(utimes(at("x"), tv), 0);
	hash("x", h2);
	cr_expect_str_eq(h1, h2);
}

/* each change the definition covers gives another hash */
static void changed(void (*change)(void), const char *what)
{
	char h1[MGR_HASH_HEX], h2[MGR_HASH_HEX];
	tree("x", false);
	hash("x", h1);
	change();
	hash("x", h2);
	cr_expect_str_neq(h1, h2, "%s did not change the hash", what);
}

static void c_byte(void) { put("x/a/b", "innes", 0600); }
static void c_size(void) { put("x/a/b", "inner!", 0600); }
static void c_add(void) { put("x/new", "", 0644); }
static void c_add_dir(void) { cr_assert_eq(mkdir(at("x/a/empty"), 0755), 0); }
static void c_remove(void) { cr_assert_eq(unlink(at("x/a-b")), 0); }
static void c_mode(void) { cr_assert_eq(chmod(at("x/b"), 04644), 0); }
static void c_dir_mode(void) { cr_assert_eq(chmod(at("x/a"), 0755), 0); }
static void c_root_mode(void) { cr_assert_eq(chmod(at("x"), 0700), 0); }
static void c_owner(void) { cr_assert_eq(lchown(at("x/b"), 1234, 1234), 0); }
static void c_rename(void) { cr_assert_eq(rename(at("x/b"), at("x/c")), 0); }
static void c_move_between_dirs(void)
{
	/* "a-b" at the top and "a/b" inside "a" are different paths */
	cr_assert_eq(rename(at("x/a/b"), at("x/a-c")), 0);
}
static void c_link_target(void)
{
	cr_assert_eq(unlink(at("x/a/l")), 0);
	cr_assert_eq(symlink("c", at("x/a/l")), 0);
}
static void c_type(void)
{
	/* a symlink to "b" replaced by a file holding "b" */
	cr_assert_eq(unlink(at("x/a/l")), 0);
	put("x/a/l", "b", 0777);
}

Test(snaphash, a_changed_byte) { changed(c_byte, "a changed byte"); }
Test(snaphash, a_changed_size) { changed(c_size, "a longer file"); }
Test(snaphash, an_added_file) { changed(c_add, "an added empty file"); }
Test(snaphash, an_added_directory) { changed(c_add_dir, "an added empty directory"); }
Test(snaphash, a_removed_file) { changed(c_remove, "a removed file"); }
Test(snaphash, a_mode) { changed(c_mode, "a setuid bit"); }
Test(snaphash, a_directory_mode) { changed(c_dir_mode, "a directory's mode"); }
Test(snaphash, the_root_mode) { changed(c_root_mode, "the root's mode"); }
Test(snaphash, an_owner)
{
	if (geteuid() != 0)
		cr_skip_test("chown needs root");
	changed(c_owner, "an owner");
}
Test(snaphash, a_rename) { changed(c_rename, "a rename"); }
Test(snaphash, a_move_between_directories) { changed(c_move_between_dirs, "a move to another directory"); }
Test(snaphash, a_symlink_target) { changed(c_link_target, "a symlink's target"); }
Test(snaphash, a_type) { changed(c_type, "a symlink turned into a file"); }

Test(snaphash, refusals)
{
	char h[MGR_HASH_HEX] = "unchanged";
	put("file", "x", 0644);
	cr_expect_eq(mgr_snapshot_hash(at("none"), h, NULL), SPACED_ENOENT);
	cr_expect_eq(mgr_snapshot_hash(at("file"), h, NULL), SPACED_EINVAL, "not a directory");
	cr_expect_eq(mgr_snapshot_hash("relative/path", h, NULL), SPACED_EINVAL);
	cr_expect_str_eq(h, "unchanged", "no output on failure");
	/* a symlink to a directory is not followed as the root either */
	cr_assert_eq(mkdir(at("d"), 0755), 0);
	cr_assert_eq(symlink("d", at("ln")), 0);
	cr_expect_eq(mgr_snapshot_hash(at("ln"), h, NULL), SPACED_EINVAL);
}

Test(snaphash, a_tree_too_deep_is_refused)
{
	char p[4096];
	char h[MGR_HASH_HEX];
	snprintf(p, sizeof p, "%s/deep", top);
	cr_assert_eq(mkdir(p, 0755), 0);
	cr_assert_eq(chdir(p), 0);
	for (int i = 0; i < 300; i++) {
		cr_assert_eq(mkdir("d", 0755), 0);
		cr_assert_eq(chdir("d"), 0);
	}
	cr_assert_eq(chdir("/"), 0);
	cr_expect_eq(mgr_snapshot_hash(p, h, NULL), SPACED_ETOOBIG);
}
