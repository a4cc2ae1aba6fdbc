/*
 * test_rootfs.c — templates as trees (libspaced/rootfs.h): tarballs and OCI
 * image archives built here with libarchive, imported, written as canonical
 * archives, extracted; the hash of the archive must be the hash of the
 * directory it extracts to. Hostile archives: "..", entries under symlinks,
 * hard links out of the tree, devices, setuid files, foreign owners, bombs,
 * archives out of order.
 */
#include <archive.h>
#include <archive_entry.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "spaced_error.h"
#include "rootfs.h"
#include "treehash.h"

struct ent {
	const char *path;
	char type; /* d f l h(hard link) c(char dev) p s */
	unsigned mode;
	int64_t uid, gid;
	const char *data; /* file content, link target or hard link target */
	int64_t size;     /* -1: strlen(data) */
};

static char dir[256];

static void setup(void)
{
	snprintf(dir, sizeof dir, "/tmp/test-rootfs-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	cr_assert_eq(system(cmd), 0);
}

TestSuite(rootfs, .init = setup, .fini = teardown, .timeout = 60);

/* Writes entries as a tar at path (gzip when gz). */
static void mk_tar(const char *path, bool gz, const struct ent *es, size_t n)
{
	struct archive *a = archive_write_new();
	archive_write_set_format_pax_restricted(a);
	if (gz)
		archive_write_add_filter_gzip(a);
	cr_assert_eq(archive_write_open_filename(a, path), ARCHIVE_OK);
	for (size_t i = 0; i < n; i++) {
		const struct ent *x = &es[i];
		struct archive_entry *e = archive_entry_new();
		archive_entry_set_pathname(e, x->path);
		archive_entry_set_perm(e, x->mode ? x->mode : 0644);
		archive_entry_set_uid(e, x->uid);
		archive_entry_set_gid(e, x->gid);
		size_t len = 0;
		switch (x->type) {
		case 'd': archive_entry_set_filetype(e, AE_IFDIR); break;
		case 'l':
			archive_entry_set_filetype(e, AE_IFLNK);
			archive_entry_set_symlink(e, x->data);
			break;
		case 'h':
			archive_entry_set_filetype(e, AE_IFREG);
			archive_entry_set_hardlink(e, x->data);
			break;
		case 'c':
			archive_entry_set_filetype(e, AE_IFCHR);
			archive_entry_set_rdev(e, makedev(1, 3));
			break;
		case 'p': archive_entry_set_filetype(e, AE_IFIFO); break;
		default:
			archive_entry_set_filetype(e, AE_IFREG);
			len = x->data ? strlen(x->data) : 0;
			archive_entry_set_size(e, x->size >= 0 ? x->size : (int64_t)len);
		}
		cr_assert_eq(archive_write_header(a, e), ARCHIVE_OK, "%s", archive_error_string(a));
		if (len)
			archive_write_data(a, x->data, len);
		archive_entry_free(e);
	}
	archive_write_close(a);
	archive_write_free(a);
}

#define E(...) {__VA_ARGS__, .size = -1}

/* Imports src as kind, writes it, extracts it; returns the extracted
 * directory (static) and checks that the hashes agree. */
static const char *roundtrip(const char *src, int *err, char *why, size_t whysz, struct spaced_rootfs_info *info)
{
	static char out[400], ext[400];
	struct spaced_rootfs *t = NULL;
	const char *fmt;
	json_t *cfg = NULL;
	snprintf(out, sizeof out, "%s/canon.tar", dir);
	snprintf(ext, sizeof ext, "%s/x", dir);
	cr_assert_eq(spaced_rootfs_new(NULL, dir, &t, why, whysz), 0);
	*err = spaced_rootfs_import(t, src, &cfg, &fmt, why, whysz);
	json_decref(cfg);
	if (*err == 0)
		*err = spaced_rootfs_write(t, out, info, why, whysz);
	spaced_rootfs_free(t);
	if (*err < 0)
		return NULL;
	char cmd[900];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", ext);
	cr_assert_eq(system(cmd), 0);
	int r = spaced_rootfs_extract(out, ext, SPACED_ROOTFS_X_TEMPLATE, NULL, why, whysz);
	cr_assert_eq(r, 0, "extract: %s", why);
	char hex[SPACED_TREEHASH_HEX];
	cr_assert_eq(spaced_treehash_dir(ext, hex, NULL), 0);
	cr_assert_str_eq(hex, info->hash, "the archive's hash is the hash of the tree it extracts to");
	return ext;
}

/* The output of the shell command "cd DIR && rest". */
static void sh(const char *cd, const char *rest, char *out, size_t outsz)
{
	char cmd[1200];
	snprintf(cmd, sizeof cmd, "cd '%s' && %s", cd, rest);
	FILE *f = popen(cmd, "r");
	cr_assert_not_null(f);
	size_t n = fread(out, 1, outsz - 1, f);
	out[n] = 0;
	pclose(f);
}

Test(rootfs, tarball_roundtrip_owners_modes_links)
{
	char src[300], why[512] = "", out[2048];
	struct spaced_rootfs_info info;
	int err;
	snprintf(src, sizeof src, "%s/in.tar.gz", dir);
	struct ent es[] = {
		E(.path = "./", .type = 'd', .mode = 0755),
		E(.path = "./etc/", .type = 'd', .mode = 0755),
		E(.path = "./etc/hostname", .type = 'f', .data = "template\n"),
		E(.path = "/usr/bin/tool", .type = 'f', .mode = 04755, .data = "#!/bin/sh\necho tool\n"),
		E(.path = "home/app/notes", .type = 'f', .mode = 0600, .uid = 1000, .gid = 1000, .data = "mine"),
		E(.path = "bin", .type = 'l', .data = "usr/bin"),
		E(.path = "etc/abs", .type = 'l', .data = "/etc/hostname"),
		E(.path = "usr/bin/tool2", .type = 'h', .mode = 04755, .data = "usr/bin/tool"),
		E(.path = "dev/null", .type = 'c'),
		E(.path = "run/fifo", .type = 'p', .mode = 0600),
	};
	mk_tar(src, true, es, sizeof es / sizeof es[0]);
	const char *x = roundtrip(src, &err, why, sizeof why, &info);
	cr_assert_eq(err, 0, "%s", why);
	cr_assert_eq(info.dropped, 1, "the device node is dropped");
	cr_assert_eq(info.cleared, 2, "setuid cleared on the file and its hard link copy");
	sh(x, "find . | sort && stat -c '%n %a %u:%g' etc/hostname usr/bin/tool home/app/notes home/app && "
	      "readlink bin etc/abs && cat usr/bin/tool2",
	   out, sizeof out);
	cr_assert(strstr(out, "./dev\n") != NULL, "%s", out); /* the directory stays, not the node */
	cr_assert(strstr(out, "./dev/null") == NULL, "%s", out);
	cr_assert(strstr(out, "etc/hostname 644 100000:100000") != NULL, "%s", out);
	cr_assert(strstr(out, "usr/bin/tool 755 100000:100000") != NULL, "setuid cleared, canonical owner: %s", out);
	cr_assert(strstr(out, "home/app/notes 600 101000:101000") != NULL, "uid 1000 inside: %s", out);
	cr_assert(strstr(out, "usr/bin\n/etc/hostname\n#!/bin/sh") != NULL, "%s", out);
}

Test(rootfs, hostile_tarballs_are_refused)
{
	static const struct {
		struct ent e[3];
		size_t n;
		const char *what;
	} cases[] = {
		{{E(.path = "../escape", .type = 'f', .data = "x")}, 1, "'..'"},
		{{E(.path = "a/../../escape", .type = 'f', .data = "x")}, 1, "'..'"},
		{{E(.path = "etc", .type = 'l', .data = "/etc"), E(.path = "etc/passwd", .type = 'f', .data = "x")}, 2,
		 "symlink"},
		{{E(.path = "lnk", .type = 'l', .data = "/"), E(.path = "lnk/x", .type = 'd')}, 2, "symlink"},
		{{E(.path = "f", .type = 'f', .data = "x"), E(.path = "f/x", .type = 'f', .data = "y")}, 2, "not a directory"},
		{{E(.path = "x", .type = 'h', .data = "/etc/shadow")}, 1, "no file of the tree"},
		{{E(.path = "x", .type = 'h', .data = "../outside")}, 1, "'..'"},
		{{E(.path = "big", .type = 'f', .uid = 70000, .data = "x")}, 1, "above 65535"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char src[300], why[512] = "";
		struct spaced_rootfs_info info;
		int err;
		snprintf(src, sizeof src, "%s/bad%zu.tar", dir, i);
		mk_tar(src, false, cases[i].e, cases[i].n);
		cr_assert_null(roundtrip(src, &err, why, sizeof why, &info), "case %zu accepted", i);
		cr_assert_lt(err, 0);
		cr_assert(strstr(why, cases[i].what) != NULL, "case %zu: %s", i, why);
	}
}

Test(rootfs, bombs_stop_at_the_bound)
{
	char src[300], why[512] = "", cmd[600];
	struct spaced_rootfs *t;
	struct spaced_rootfs_limits lim = {.max_bytes = 1 << 20, .max_entries = 100};
	const char *fmt;
	snprintf(src, sizeof src, "%s/bomb.tar.gz", dir);
	/* 64 MiB of zeros compress to about 64 KiB */
	snprintf(cmd, sizeof cmd, "cd '%s' && head -c 67108864 /dev/zero >zeros && tar czf bomb.tar.gz zeros && rm zeros", dir);
	cr_assert_eq(system(cmd), 0);
	cr_assert_eq(spaced_rootfs_new(&lim, dir, &t, why, sizeof why), 0);
	cr_assert_eq(spaced_rootfs_import(t, src, NULL, &fmt, why, sizeof why), SPACED_ETOOBIG, "%s", why);
	spaced_rootfs_free(t);
	/* too many entries */
	snprintf(cmd, sizeof cmd, "cd '%s' && mkdir many && for i in $(seq 200); do : >many/$i; done && tar cf many.tar many", dir);
	cr_assert_eq(system(cmd), 0);
	snprintf(src, sizeof src, "%s/many.tar", dir);
	cr_assert_eq(spaced_rootfs_new(&lim, dir, &t, why, sizeof why), 0);
	cr_assert_eq(spaced_rootfs_import(t, src, NULL, &fmt, why, sizeof why), SPACED_ETOOBIG, "%s", why);
	spaced_rootfs_free(t);
}

/* Content an entry carries that the tree does not take — a hard link's, a
 * whiteout's, a directory's — is decompressed all the same: it counts in the
 * bound of content read, before it is read (a few KiB of gzip held 16 GiB
 * of a hard link's "data" and took a control plane minutes). */
Test(rootfs, content_the_tree_does_not_take_counts)
{
	char src[300], why[512] = "", cmd[1200];
	struct spaced_rootfs *t;
	struct spaced_rootfs_limits lim = {.max_bytes = 1 << 20, .max_entries = 100};
	/* a hard link whose pax size gives it a body, a whiteout holding data */
	static const char *const kinds[] = {"hardlink", "whiteout"};
	for (size_t i = 0; i < 2; i++) {
		snprintf(src, sizeof src, "%s/%s.tar.gz", dir, kinds[i]);
		snprintf(cmd, sizeof cmd,
		         "python3 -c 'import io, sys, tarfile\n"
		         "hl = sys.argv[2] == \"hardlink\"\n"
		         "with tarfile.open(sys.argv[1], \"w:gz\", format=tarfile.PAX_FORMAT) as t:\n"
		         "    f = tarfile.TarInfo(\"f\"); f.size = 1; t.addfile(f, io.BytesIO(b\"x\"))\n"
		         "    e = tarfile.TarInfo(\"h\" if hl else \".wh.f\")\n"
		         "    if hl:\n"
		         "        e.type, e.linkname = tarfile.LNKTYPE, \"f\"\n"
		         "    e.size = 4 << 20\n"
		         "    e.pax_headers = {\"size\": str(4 << 20)}\n"
		         "    t.addfile(e, io.BytesIO(bytes([1]) * (4 << 20)))\n' '%s' '%s'",
		         src, kinds[i]);
		cr_assert_eq(system(cmd), 0, "%s", kinds[i]);
		why[0] = 0;
		cr_assert_eq(spaced_rootfs_new(&lim, dir, &t, why, sizeof why), 0);
		int r = spaced_rootfs_add_archive(t, src, SPACED_ROOTFS_OCI_LAYER, why, sizeof why);
		cr_expect_eq(r, SPACED_ETOOBIG, "%s: %d %s", kinds[i], r, why);
		cr_expect(strstr(why, "does not take") != NULL, "%s: %s", kinds[i], why);
		spaced_rootfs_free(t);
	}
}

/* An OCI layout, written file by file: blobs named by their sha256. */
static void blob(const char *root, const void *p, size_t n, char digest[72])
{
	uint8_t h[32];
	char hex[65], path[600];
	crypto_hash_sha256(h, p, n);
	sodium_bin2hex(hex, sizeof hex, h, sizeof h);
	snprintf(digest, 72, "sha256:%s", hex);
	snprintf(path, sizeof path, "%s/blobs/sha256/%s", root, hex);
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	fwrite(p, 1, n, f);
	fclose(f);
}

static char *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f);
	static char buf[1 << 16];
	*n = fread(buf, 1, sizeof buf, f);
	fclose(f);
	return buf;
}

Test(rootfs, oci_layers_whiteouts_config)
{
	char root[300], cmd[900], why[512] = "", d1[72], d2[72], dc[72], dm[72], l1[300], l2[300], out[2048];
	size_t n;
	cr_assert_eq(sodium_init() >= 0, 1);
	snprintf(root, sizeof root, "%s/layout", dir);
	snprintf(cmd, sizeof cmd, "mkdir -p '%s/blobs/sha256'", root);
	cr_assert_eq(system(cmd), 0);
	snprintf(l1, sizeof l1, "%s/l1.tar.gz", dir);
	snprintf(l2, sizeof l2, "%s/l2.tar.gz", dir);
	struct ent a[] = {
		E(.path = "etc/", .type = 'd'),
		E(.path = "etc/keep", .type = 'f', .data = "keep"),
		E(.path = "etc/gone", .type = 'f', .data = "gone"),
		E(.path = "opt/old/", .type = 'd'),
		E(.path = "opt/old/a", .type = 'f', .data = "a"),
		E(.path = "opt/old/b", .type = 'f', .data = "b"),
	};
	struct ent b[] = {
		E(.path = "etc/.wh.gone", .type = 'f', .data = ""),
		E(.path = "opt/old/new", .type = 'f', .data = "new"),
		E(.path = "opt/old/.wh..wh..opq", .type = 'f', .data = ""),
		E(.path = "etc/added", .type = 'f', .data = "added"),
	};
	mk_tar(l1, true, a, sizeof a / sizeof a[0]);
	mk_tar(l2, true, b, sizeof b / sizeof b[0]);
	char *p = slurp(l1, &n);
	blob(root, p, n, d1);
	size_t s1 = n;
	p = slurp(l2, &n);
	blob(root, p, n, d2);
	size_t s2 = n;
	const char *config = "{\"architecture\":\"amd64\",\"os\":\"linux\",\"config\":{\"Env\":[\"PATH=/usr/bin:/bin\","
	                     "\"APP=1\"],\"WorkingDir\":\"/srv\",\"User\":\"app\"},\"rootfs\":{\"type\":\"layers\"}}";
	blob(root, config, strlen(config), dc);
	char manifest[1200];
	snprintf(manifest, sizeof manifest,
	         "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\","
	         "\"config\":{\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\"digest\":\"%s\",\"size\":%zu},"
	         "\"layers\":[{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar+gzip\",\"digest\":\"%s\",\"size\":%zu},"
	         "{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar+gzip\",\"digest\":\"%s\",\"size\":%zu}]}",
	         dc, strlen(config), d1, s1, d2, s2);
	blob(root, manifest, strlen(manifest), dm);
	snprintf(cmd, sizeof cmd,
	         "cd '%s' && echo '{\"imageLayoutVersion\":\"1.0.0\"}' >oci-layout && "
	         "printf '{\"schemaVersion\":2,\"manifests\":[{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\","
	         "\"digest\":\"%s\",\"size\":%zu,\"platform\":{\"os\":\"linux\",\"architecture\":\"amd64\"}}]}' >index.json && "
	         "tar cf ../image.tar oci-layout index.json blobs",
	         root, dm, strlen(manifest));
	cr_assert_eq(system(cmd), 0);
	char src[300];
	snprintf(src, sizeof src, "%s/image.tar", dir);
	cr_assert(spaced_rootfs_is_oci(src));
	struct spaced_rootfs *t;
	json_t *cfg = NULL;
	const char *fmt;
	cr_assert_eq(spaced_rootfs_new(NULL, dir, &t, why, sizeof why), 0);
	cr_assert_eq(spaced_rootfs_import(t, src, &cfg, &fmt, why, sizeof why), 0, "%s", why);
	cr_assert_str_eq(fmt, "oci");
	char *cj = json_dumps(cfg, JSON_COMPACT | JSON_SORT_KEYS);
	cr_assert_str_eq(cj, "{\"env\":[\"PATH=/usr/bin:/bin\",\"APP=1\"],\"user\":\"app\",\"workdir\":\"/srv\"}");
	free(cj);
	json_decref(cfg);
	struct spaced_rootfs_info info;
	char canon[300], ext[300];
	snprintf(canon, sizeof canon, "%s/canon.tar", dir);
	snprintf(ext, sizeof ext, "%s/x", dir);
	cr_assert_eq(spaced_rootfs_write(t, canon, &info, why, sizeof why), 0, "%s", why);
	spaced_rootfs_free(t);
	cr_assert_eq(spaced_rootfs_extract(canon, ext, SPACED_ROOTFS_X_TEMPLATE, NULL, why, sizeof why), 0, "%s", why);
	sh(ext, "find . -mindepth 1 | sort | tr '\\n' ' '", out, sizeof out);
	cr_assert_str_eq(out, "./etc ./etc/added ./etc/keep ./opt ./opt/old ./opt/old/new ");

	/* a blob that does not match its digest is refused */
	snprintf(cmd, sizeof cmd, "cd '%s' && f=blobs/sha256/%s && printf X >>$f && tar cf ../bad.tar oci-layout index.json blobs",
	         root, d1 + 7);
	cr_assert_eq(system(cmd), 0);
	snprintf(src, sizeof src, "%s/bad.tar", dir);
	cr_assert_eq(spaced_rootfs_new(NULL, dir, &t, why, sizeof why), 0);
	cr_assert_eq(spaced_rootfs_import(t, src, NULL, &fmt, why, sizeof why), SPACED_EFORMAT);
	cr_assert(strstr(why, "descriptor says") != NULL || strstr(why, "digest") != NULL, "%s", why);
	spaced_rootfs_free(t);
}

Test(rootfs, extract_refuses_what_it_did_not_write)
{
	static const struct {
		struct ent e[3];
		size_t n;
	} cases[] = {
		{{E(.path = "./", .type = 'd', .uid = 100000, .gid = 100000),
		  E(.path = "b", .type = 'f', .uid = 100000, .gid = 100000, .data = "x"),
		  E(.path = "a", .type = 'f', .uid = 100000, .gid = 100000, .data = "x")}, 3},               /* order */
		{{E(.path = "./", .type = 'd', .uid = 100000, .gid = 100000),
		  E(.path = "a/b", .type = 'f', .uid = 100000, .gid = 100000, .data = "x")}, 2},             /* no parent */
		{{E(.path = "./", .type = 'd', .uid = 100000, .gid = 100000),
		  E(.path = "../x", .type = 'f', .uid = 100000, .gid = 100000, .data = "x")}, 2},            /* .. */
		{{E(.path = "./", .type = 'd', .uid = 100000, .gid = 100000),
		  E(.path = "n", .type = 'c', .uid = 100000, .gid = 100000)}, 2},                            /* device */
		{{E(.path = "./", .type = 'd', .uid = 100000, .gid = 100000),
		  E(.path = "r", .type = 'f', .uid = 0, .gid = 0, .data = "x")}, 2},                         /* host root */
		{{E(.path = "./", .type = 'd', .uid = 100000, .gid = 100000),
		  E(.path = "l", .type = 'l', .uid = 100000, .gid = 100000, .data = "/"),
		  E(.path = "l/x", .type = 'f', .uid = 100000, .gid = 100000, .data = "x")}, 3},             /* via symlink */
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char src[300], ext[300], why[512] = "";
		snprintf(src, sizeof src, "%s/x%zu.tar", dir, i);
		snprintf(ext, sizeof ext, "%s/ex%zu", dir, i);
		mk_tar(src, false, cases[i].e, cases[i].n);
		int r = spaced_rootfs_extract(src, ext, SPACED_ROOTFS_X_TEMPLATE, NULL, why, sizeof why);
		cr_assert_lt(r, 0, "case %zu extracted", i);
		cr_assert_eq(access(ext, F_OK), -1, "case %zu: the directory is removed", i);
	}
	struct stat sb;
	cr_assert_eq(lstat("/x", &sb), -1, "nothing written outside");
}

Test(rootfs, snapshot_pack_extract_keeps_hash_holes_whiteouts)
{
	char snap[300], tarp[300], ext[300], cmd[4000], why[512] = "", h1[SPACED_TREEHASH_HEX], h2[SPACED_TREEHASH_HEX];
	snprintf(snap, sizeof snap, "%s/snap", dir);
	snprintf(tarp, sizeof tarp, "%s/snap.tar", dir);
	snprintf(ext, sizeof ext, "%s/stage", dir);
	snprintf(cmd, sizeof cmd,
	         "mkdir -p %s/upper/root/workspace %s/upper/root/etc/opq && echo identity=x >%s/meta && "
	         "echo hi >%s/upper/root/workspace/f && truncate -s 3G %s/upper/root/workspace/sparse && "
	         "printf data | dd of=%s/upper/root/workspace/sparse bs=1 seek=1073741824 conv=notrunc 2>/dev/null && "
	         "mknod %s/upper/root/etc/gone c 0 0 && python3 -c \"import os,sys; os.setxattr(sys.argv[1], 'trusted.overlay.opaque', b'y')\" %s/upper/root/etc/opq && "
	         "ln -s /etc/x %s/upper/root/abs && chown -R 100000:100000 %s/upper/root/workspace",
	         snap, snap, snap, snap, snap, snap, snap, snap, snap, snap);
	cr_assert_eq(system(cmd), 0);
	cr_assert_eq(spaced_treehash_dir(snap, h1, NULL), 0);
	cr_assert_eq(spaced_rootfs_pack_dir(snap, tarp, 0, why, sizeof why), 0, "%s", why);
	struct stat sb;
	cr_assert_eq(stat(tarp, &sb), 0);
	cr_assert_lt(sb.st_size, 1 << 20, "a 3 GiB sparse file packs small: %lld", (long long)sb.st_size);
	cr_assert_eq(spaced_rootfs_extract(tarp, ext, SPACED_ROOTFS_X_SNAPSHOT, NULL, why, sizeof why), 0, "%s", why);
	cr_assert_eq(spaced_treehash_dir(ext, h2, NULL), 0);
	cr_assert_str_eq(h1, h2, "the extracted snapshot hashes as the original");
	char out[512];
	snprintf(cmd, sizeof cmd, "%s/upper/root/workspace/sparse", ext);
	cr_assert_eq(stat(cmd, &sb), 0);
	cr_assert_lt(sb.st_blocks * 512, 1 << 20, "holes stay holes");
	sh(ext, "python3 -c \"import os; print(os.getxattr('upper/root/etc/opq', 'trusted.overlay.opaque').decode(), end='')\"",
	   out, sizeof out);
	cr_assert_str_eq(out, "y");
	/* a template archive is never extracted as a snapshot with devices allowed */
	char ext2[300];
	snprintf(ext2, sizeof ext2, "%s/stage2", dir);
	cr_assert_lt(spaced_rootfs_extract(tarp, ext2, SPACED_ROOTFS_X_TEMPLATE, NULL, why, sizeof why), 0);
}

/* A snapshot packed into a pipe (what the worker streams to the store, no
 * archive on its disk) is byte for byte the archive packed into a file; a
 * snapshot past the size bound fails before writing anything into it. */
Test(rootfs, snapshot_pack_into_a_pipe_is_the_same_archive)
{
	char snap[300], tarp[300], cmd[4000], why[512] = "";
	snprintf(snap, sizeof snap, "%s/snap", dir);
	snprintf(tarp, sizeof tarp, "%s/snap.tar", dir);
	snprintf(cmd, sizeof cmd,
	         "mkdir -p %s/upper/root/w && echo identity=x >%s/meta && head -c 3000000 /dev/urandom >%s/upper/root/w/a && "
	         "ln %s/upper/root/w/a %s/upper/root/w/b && truncate -s 1G %s/upper/root/w/sparse && ln -s a %s/upper/root/w/l",
	         snap, snap, snap, snap, snap, snap, snap);
	cr_assert_eq(system(cmd), 0);
	cr_assert_eq(spaced_rootfs_pack_dir(snap, tarp, 0, why, sizeof why), 0, "%s", why);
	int p[2];
	cr_assert_eq(pipe(p), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(p[0]);
		_exit(spaced_rootfs_pack_fd(snap, p[1], 64u << 20, why, sizeof why) == 0 ? 0 : 1);
	}
	close(p[1]);
	size_t cap = 8u << 20, len = 0;
	uint8_t *got = malloc(cap);
	cr_assert(got);
	ssize_t n;
	while ((n = read(p[0], got + len, cap - len)) > 0)
		len += (size_t)n;
	close(p[0]);
	int st = 0;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the packer succeeded");
	struct stat sb;
	cr_assert_eq(stat(tarp, &sb), 0);
	cr_assert_eq((off_t)len, sb.st_size, "%zu bytes through the pipe, %lld in the file", len, (long long)sb.st_size);
	uint8_t *want = malloc(len);
	int fd = open(tarp, O_RDONLY);
	cr_assert(want && fd >= 0);
	cr_assert_eq(read(fd, want, len), (ssize_t)len);
	close(fd);
	cr_expect(memcmp(got, want, len) == 0, "the same archive");
	free(got);
	free(want);
	/* 9 GiB of sizes (sparse): refused before the stream gets a byte */
	snprintf(cmd, sizeof cmd, "truncate -s 9G %s/upper/root/w/huge", snap);
	cr_assert_eq(system(cmd), 0);
	cr_assert_eq(pipe(p), 0);
	cr_expect_eq(spaced_rootfs_pack_fd(snap, p[1], 0, why, sizeof why), SPACED_ETOOBIG, "%s", why);
	close(p[1]);
	uint8_t c;
	cr_expect_eq(read(p[0], &c, 1), 0, "nothing written");
	close(p[0]);
}

Test(rootfs, upper_layer_merges_onto_template)
{
	char why[512] = "", base[300], snap[300], snaptar[300], canon[300], out2[300], ext[300], cmd[4000], out[2048];
	struct spaced_rootfs *t;
	struct spaced_rootfs_info info;
	const char *fmt;
	snprintf(base, sizeof base, "%s/base.tar", dir);
	struct ent es[] = {
		E(.path = "etc/", .type = 'd'),
		E(.path = "etc/a", .type = 'f', .data = "a"),
		E(.path = "etc/b", .type = 'f', .data = "b"),
		E(.path = "var/lib/", .type = 'd'),
		E(.path = "var/lib/x", .type = 'f', .data = "x"),
	};
	mk_tar(base, false, es, sizeof es / sizeof es[0]);
	snprintf(canon, sizeof canon, "%s/canon.tar", dir);
	cr_assert_eq(spaced_rootfs_new(NULL, dir, &t, why, sizeof why), 0);
	cr_assert_eq(spaced_rootfs_import(t, base, NULL, &fmt, why, sizeof why), 0, "%s", why);
	cr_assert_eq(spaced_rootfs_write(t, canon, &info, why, sizeof why), 0, "%s", why);
	spaced_rootfs_free(t);
	/* what a RUN step left in the upper directory: etc/b removed, var/lib
	 * made opaque with a new file, a new file, the launcher's own dirs */
	snprintf(snap, sizeof snap, "%s/snap", dir);
	snprintf(cmd, sizeof cmd,
	         "mkdir -p %s/upper/root/etc %s/upper/root/var/lib %s/upper/root/dev %s/upper/root/.spaced && "
	         "echo id >%s/meta && mknod %s/upper/root/etc/b c 0 0 && echo new >%s/upper/root/etc/c && "
	         "echo h >%s/upper/root/etc/hostname && python3 -c \"import os,sys; os.setxattr(sys.argv[1], 'trusted.overlay.opaque', b'y')\" %s/upper/root/var/lib && "
	         "echo y >%s/upper/root/var/lib/y && chown -R 100000:100000 %s/upper/root/etc %s/upper/root/var",
	         snap, snap, snap, snap, snap, snap, snap, snap, snap, snap, snap, snap);
	cr_assert_eq(system(cmd), 0);
	snprintf(snaptar, sizeof snaptar, "%s/snap.tar", dir);
	cr_assert_eq(spaced_rootfs_pack_dir(snap, snaptar, 0, why, sizeof why), 0, "%s", why);
	cr_assert_eq(spaced_rootfs_new(NULL, dir, &t, why, sizeof why), 0);
	cr_assert_eq(spaced_rootfs_add_archive(t, canon, SPACED_ROOTFS_TEMPLATE, why, sizeof why), 0, "%s", why);
	cr_assert_eq(spaced_rootfs_add_archive(t, snaptar, SPACED_ROOTFS_UPPER, why, sizeof why), 0, "%s", why);
	snprintf(out2, sizeof out2, "%s/merged.tar", dir);
	cr_assert_eq(spaced_rootfs_write(t, out2, &info, why, sizeof why), 0, "%s", why);
	spaced_rootfs_free(t);
	snprintf(ext, sizeof ext, "%s/x", dir);
	cr_assert_eq(spaced_rootfs_extract(out2, ext, SPACED_ROOTFS_X_TEMPLATE, NULL, why, sizeof why), 0, "%s", why);
	sh(ext, "find . -mindepth 1 | sort | tr '\\n' ' '", out, sizeof out);
	cr_assert_str_eq(out, "./etc ./etc/a ./etc/c ./var ./var/lib ./var/lib/y ");
}

/* A file of holes only (no data extent) stays holes: a tiny upload or a
 * sandbox's `truncate -s 1G` once wrote its whole size of zeros into the
 * canonical archive or the snapshot (disk amplification on the control
 * plane and the worker). */
Test(rootfs, a_file_of_holes_only_stays_small)
{
	char cmd[1200], src[300], why[512] = "", snap[300], tarp[300];
	snprintf(cmd, sizeof cmd,
	         "cd '%s' && mkdir sp && truncate -s 1G sp/hole && tar --sparse --format=pax -cf holes.tar -C sp . && "
	         "mkdir -p snap/upper/root && truncate -s 1G snap/upper/root/hole && echo identity=x >snap/meta",
	         dir);
	cr_assert_eq(system(cmd), 0);
	snprintf(src, sizeof src, "%s/holes.tar", dir);
	int err;
	struct spaced_rootfs_info info;
	const char *ext = roundtrip(src, &err, why, sizeof why, &info);
	cr_assert_eq(err, 0, "%s", why);
	struct stat sb;
	snprintf(cmd, sizeof cmd, "%s/canon.tar", dir);
	cr_assert_eq(stat(cmd, &sb), 0);
	cr_expect_lt(sb.st_size, 1 << 20, "the canonical archive of a 1 GiB hole: %lld bytes", (long long)sb.st_size);
	snprintf(cmd, sizeof cmd, "%s/hole", ext);
	cr_assert_eq(stat(cmd, &sb), 0);
	cr_expect_eq(sb.st_size, 1 << 30, "its size is kept");
	cr_expect_lt(sb.st_blocks * 512, 1 << 20, "and extracted as a hole");
	snprintf(snap, sizeof snap, "%s/snap", dir);
	snprintf(tarp, sizeof tarp, "%s/snap.tar", dir);
	cr_assert_eq(spaced_rootfs_pack_dir(snap, tarp, 0, why, sizeof why), 0, "%s", why);
	cr_assert_eq(stat(tarp, &sb), 0);
	cr_expect_lt(sb.st_size, 1 << 20, "a snapshot of a 1 GiB hole: %lld bytes", (long long)sb.st_size);
}

/* A snapshot packs no more than a restore takes (8 GiB of files, by their
 * sizes: a sparse file counts in full), so a sandbox with a small disk
 * cannot make the worker write terabytes. Hard links stay hard links: 300
 * names of a file are the file once in the archive and in the restored tree
 * (as copies, a sandbox whose files fit its disk only as links could be
 * snapshotted, and never restored into its disk). */
Test(rootfs, a_snapshot_past_what_a_restore_takes_is_refused)
{
	char cmd[1200], why[512] = "", snap[300], tarp[300];
	snprintf(cmd, sizeof cmd,
	         "cd '%s' && mkdir -p snap/upper/root && echo identity=x >snap/meta && "
	         "truncate -s 100G snap/upper/root/huge && printf x | dd of=snap/upper/root/huge bs=1 seek=4096 "
	         "conv=notrunc 2>/dev/null",
	         dir);
	cr_assert_eq(system(cmd), 0);
	snprintf(snap, sizeof snap, "%s/snap", dir);
	snprintf(tarp, sizeof tarp, "%s/snap.tar", dir);
	cr_expect_eq(spaced_rootfs_pack_dir(snap, tarp, 0, why, sizeof why), SPACED_ETOOBIG, "%s", why);
	cr_expect(strstr(why, "huge") != NULL, "the refusal names the file: %s", why);
	/* 300 hard links of a 1 MiB file */
	snprintf(cmd, sizeof cmd,
	         "cd '%s' && rm -rf snap snap.tar && mkdir -p snap/upper/root && echo identity=x >snap/meta && "
	         "head -c 1048576 /dev/urandom >snap/upper/root/f && for i in $(seq 300); do ln snap/upper/root/f "
	         "snap/upper/root/l$i; done",
	         dir);
	cr_assert_eq(system(cmd), 0);
	cr_assert_eq(spaced_rootfs_pack_dir(snap, tarp, 0, why, sizeof why), 0, "%s", why);
	struct stat sb, sl;
	cr_assert_eq(stat(tarp, &sb), 0);
	cr_expect_lt(sb.st_size, 2 << 20, "300 names of a 1 MiB file: %lld bytes of archive", (long long)sb.st_size);
	char ext[300], hex_src[SPACED_TREEHASH_HEX], hex_ext[SPACED_TREEHASH_HEX], p[400];
	uint64_t b1 = 0, b2 = 0;
	snprintf(ext, sizeof ext, "%s/x", dir);
	cr_assert_eq(spaced_rootfs_extract(tarp, ext, SPACED_ROOTFS_X_SNAPSHOT, NULL, why, sizeof why), 0, "%s", why);
	snprintf(p, sizeof p, "%s/upper/root/f", ext);
	cr_assert_eq(stat(p, &sb), 0);
	cr_expect_eq(sb.st_nlink, 301, "the file has its 301 names again");
	snprintf(p, sizeof p, "%s/upper/root/l300", ext);
	cr_assert_eq(stat(p, &sl), 0);
	cr_expect_eq(sl.st_ino, sb.st_ino, "a name is the same file");
	cr_assert_eq(spaced_treehash_dir(snap, hex_src, &b1), 0);
	cr_assert_eq(spaced_treehash_dir(ext, hex_ext, &b2), 0);
	cr_expect_str_eq(hex_ext, hex_src, "the restored tree has the snapshot's hash");
}

/* A snapshot archive's hard link names a regular file already restored,
 * below the new tree and through no symbolic link: one to a file after it,
 * to a directory, through a link out of the tree, out with "..", or to an
 * absolute path is refused and nothing is linked. */
Test(rootfs, a_snapshot_hard_link_out_of_its_tree_is_refused)
{
	char tarp[300], ext[300], why[512] = "", outside[300];
	snprintf(outside, sizeof outside, "%s/outside", dir);
	FILE *f = fopen(outside, "w");
	cr_assert_not_null(f);
	fputs("secret", f);
	fclose(f);
	const char *bad[] = {"upper/root/z", "upper/root/d", "upper/root/s/outside", "upper/root/../../outside",
	                     outside, outside + 1};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct ent es[] = {
			{.path = "./", .type = 'd', .mode = 0755, .size = -1},
			{.path = "meta", .type = 'f', .data = "identity=x\n", .size = -1},
			{.path = "upper/", .type = 'd', .mode = 0755, .size = -1},
			{.path = "upper/root/", .type = 'd', .mode = 0755, .size = -1},
			{.path = "upper/root/a", .type = 'f', .data = "a", .size = -1},
			{.path = "upper/root/d/", .type = 'd', .mode = 0755, .size = -1},
			{.path = "upper/root/s", .type = 'l', .data = dir, .size = -1},
			{.path = "upper/root/t", .type = 'h', .data = bad[i], .size = -1},
			{.path = "upper/root/z", .type = 'f', .data = "z", .size = -1},
		};
		snprintf(tarp, sizeof tarp, "%s/bad%zu.tar", dir, i);
		mk_tar(tarp, false, es, sizeof es / sizeof es[0]);
		snprintf(ext, sizeof ext, "%s/x%zu", dir, i);
		cr_expect_eq(spaced_rootfs_extract(tarp, ext, SPACED_ROOTFS_X_SNAPSHOT, NULL, why, sizeof why),
		             SPACED_EFORMAT, "a hard link to %s: %s", bad[i], why);
		struct stat sb;
		cr_expect_eq(stat(ext, &sb), -1, "nothing of it stays");
		cr_assert_eq(stat(outside, &sb), 0);
		cr_expect_eq(sb.st_nlink, 1, "the file outside gained no name");
	}
	/* the same archive with a link to a file before it restores */
	struct ent ok[] = {
		{.path = "./", .type = 'd', .mode = 0755, .size = -1},
		{.path = "meta", .type = 'f', .data = "identity=x\n", .size = -1},
		{.path = "upper/", .type = 'd', .mode = 0755, .size = -1},
		{.path = "upper/root/", .type = 'd', .mode = 0755, .size = -1},
		{.path = "upper/root/a", .type = 'f', .data = "a", .size = -1},
		{.path = "upper/root/h", .type = 'h', .data = "upper/root/a", .size = -1},
	};
	snprintf(tarp, sizeof tarp, "%s/ok.tar", dir);
	mk_tar(tarp, false, ok, sizeof ok / sizeof ok[0]);
	snprintf(ext, sizeof ext, "%s/xok", dir);
	cr_assert_eq(spaced_rootfs_extract(tarp, ext, SPACED_ROOTFS_X_SNAPSHOT, NULL, why, sizeof why), 0, "%s", why);
	char p[400];
	struct stat sa, sh2;
	snprintf(p, sizeof p, "%s/upper/root/a", ext);
	cr_assert_eq(stat(p, &sa), 0);
	snprintf(p, sizeof p, "%s/upper/root/h", ext);
	cr_assert_eq(stat(p, &sh2), 0);
	cr_expect_eq(sa.st_ino, sh2.st_ino, "the link is the file");
	/* and a template's archive takes no hard link */
	snprintf(ext, sizeof ext, "%s/xt", dir);
	cr_expect_eq(spaced_rootfs_extract(tarp, ext, SPACED_ROOTFS_X_TEMPLATE, NULL, why, sizeof why), SPACED_EFORMAT,
	             "%s", why);
}

/* A hard link that names itself (or a directory holding what it names)
 * replaced the node it was about to copy: read after free. Now it is a copy
 * of the content as it was. And a tree whose hard links, as copies, pass
 * the bound is refused when written, not written past it. */
Test(rootfs, hard_links_to_themselves_and_past_the_bound)
{
	char src[300], why[512] = "";
	static const char data[] = "0123456789abcdef";
	const struct ent es[] = {E("a", 'f', 0644, 0, 0, data), {"a", 'h', 0644, 0, 0, "a", -1},
	                         E("d", 'd', 0755, 0, 0, NULL), E("d/x", 'f', 0644, 0, 0, data),
	                         {"d", 'h', 0644, 0, 0, "d/x", -1}};
	snprintf(src, sizeof src, "%s/self.tar", dir);
	mk_tar(src, false, es, sizeof es / sizeof es[0]);
	int err;
	struct spaced_rootfs_info info;
	const char *ext = roundtrip(src, &err, why, sizeof why, &info);
	cr_assert_eq(err, 0, "%s", why);
	char out[256];
	sh(ext, "cat a; echo; cat d", out, sizeof out);
	cr_expect_str_eq(out, "0123456789abcdef\n0123456789abcdef", "both keep the content they named");

	/* 600 KiB and three links under a 1 MiB bound: read 600 KiB, written 2.4 MiB */
	char *big = malloc(600 * 1024 + 1);
	memset(big, 'z', 600 * 1024);
	big[600 * 1024] = 0;
	const struct ent ls[] = {E("f", 'f', 0644, 0, 0, big), {"l1", 'h', 0644, 0, 0, "f", -1},
	                         {"l2", 'h', 0644, 0, 0, "f", -1}, {"l3", 'h', 0644, 0, 0, "f", -1}};
	snprintf(src, sizeof src, "%s/links.tar", dir);
	mk_tar(src, false, ls, sizeof ls / sizeof ls[0]);
	free(big);
	struct spaced_rootfs *t;
	struct spaced_rootfs_limits lim = {.max_bytes = 1 << 20, .max_entries = 100};
	const char *fmt;
	char canon[300];
	snprintf(canon, sizeof canon, "%s/links-canon.tar", dir);
	cr_assert_eq(spaced_rootfs_new(&lim, dir, &t, why, sizeof why), 0);
	cr_assert_eq(spaced_rootfs_import(t, src, NULL, &fmt, why, sizeof why), 0, "%s", why);
	cr_expect_eq(spaced_rootfs_write(t, canon, &info, why, sizeof why), SPACED_ETOOBIG, "%s", why);
	/* refused before a byte of the archive was written: 10 MB of tarball
	 * with 1000 links of one file had the control plane write 8 GiB first */
	struct stat cst;
	cr_expect(stat(canon, &cst) < 0 && errno == ENOENT, "no archive was started (%s)", canon);
	spaced_rootfs_free(t);
}

/* One directory holds at most 100,000 entries. The names come in reverse
 * order, the worst for a tree that keeps a directory's children sorted as
 * they come (an insert moved every entry after it: 100,000 names cost ≈ 12 s,
 * 49 s under the sanitizers); they are sorted once, as the tree is written. */
Test(rootfs, a_directory_of_too_many_entries_is_refused)
{
	char cmd[1000], gen[300], src[300], why[512] = "";
	snprintf(gen, sizeof gen, "%s/wide-bound.py", dir);
	snprintf(src, sizeof src, "%s/wide.tar", dir);
	FILE *f = fopen(gen, "w");
	cr_assert_not_null(f);
	/* ustar headers made here: tarfile takes seconds for 100,001 of them */
	fputs("import sys\n"
	      "with open(sys.argv[1], 'wb') as f:\n"
	      "    for i in range(100001, 0, -1):\n"
	      "        h = bytearray(512)\n"
	      "        h[0:8] = b'd/%06d' % i\n"
	      "        h[100:157] = b'0000644\\x000000000\\x000000000\\x0000000000000\\x0000000000000\\x00        0'\n"
	      "        h[257:265] = b'ustar\\x0000'\n"
	      "        h[148:155] = b'%06o\\x00' % sum(h)\n"
	      "        f.write(h)\n"
	      "    f.write(bytes(1024))\n",
	      f);
	fclose(f);
	snprintf(cmd, sizeof cmd, "python3 '%s' '%s'", gen, src);
	cr_assert_eq(system(cmd), 0);
	struct spaced_rootfs *t;
	const char *fmt;
	cr_assert_eq(spaced_rootfs_new(NULL, dir, &t, why, sizeof why), 0);
	cr_expect_eq(spaced_rootfs_import(t, src, NULL, &fmt, why, sizeof why), SPACED_ETOOBIG, "%s", why);
	cr_expect(strstr(why, "more than 100000 entries") != NULL, "%s", why);
	spaced_rootfs_free(t);
}

/* A wide directory's names in any order, whiteouts and names made again by
 * an upper layer: the written tree lists exactly the names left, in strcmp
 * order, with each one's last content, and hashes as the same tree given in
 * order does (the directory's table of names, its removals that move the
 * last entry into the hole, and the sort before writing). */
Test(rootfs, a_wide_directory_in_any_order_is_written_sorted)
{
	char gen[300], cmd[2000], why[512] = "", l1[300], l2[300], same[300], out1[300], out2[300];
	snprintf(gen, sizeof gen, "%s/wide-gen.py", dir);
	FILE *f = fopen(gen, "w");
	cr_assert_not_null(f);
	fputs("import io, random, sys, tarfile\n"
	      "def add(t, name, data):\n"
	      "    e = tarfile.TarInfo(name); e.size = len(data); t.addfile(e, io.BytesIO(data))\n"
	      "names = ['n%05d' % i for i in range(3000)]\n"
	      "random.Random(7).shuffle(names)\n"
	      "what, path = sys.argv[1], sys.argv[2]\n"
	      "if what == 'lower':\n"
	      "    with tarfile.open(path, 'w') as t:\n"
	      "        for n in names: add(t, 'd/' + n, n.encode())\n"
	      "elif what == 'upper':\n"
	      "    with tarfile.open(path, 'w') as t:\n"
	      "        for n in names:\n"
	      "            i = int(n[1:])\n"
	      "            if i % 3 == 0: add(t, 'd/.wh.' + n, b'')\n"
	      "            if i % 6 == 0: add(t, 'd/' + n, b'again')\n"
	      "            if i % 5 == 0: add(t, 'd/x' + n, b'x')\n"
	      "elif what == 'same':\n"
	      "    left = {}\n"
	      "    for n in names:\n"
	      "        i = int(n[1:])\n"
	      "        if i % 3: left[n] = n.encode()\n"
	      "        if i % 6 == 0: left[n] = b'again'\n"
	      "        if i % 5 == 0: left['x' + n] = b'x'\n"
	      "    with tarfile.open(path, 'w') as t:\n"
	      "        for n in sorted(left): add(t, 'd/' + n, left[n])\n"
	      "else:\n"
	      "    with tarfile.open(path) as t:\n"
	      "        got = [(m.name, t.extractfile(m).read()) for m in t.getmembers() if m.isfile()]\n"
	      "    print(len(got), got == sorted(got), got[0], got[-1])\n",
	      f);
	fclose(f);
	snprintf(l1, sizeof l1, "%s/wide-lower.tar", dir);
	snprintf(l2, sizeof l2, "%s/wide-upper.tar", dir);
	snprintf(same, sizeof same, "%s/wide-same.tar", dir);
	snprintf(out1, sizeof out1, "%s/wide-out1.tar", dir);
	snprintf(out2, sizeof out2, "%s/wide-out2.tar", dir);
	snprintf(cmd, sizeof cmd, "python3 '%s' lower '%s' && python3 '%s' upper '%s' && python3 '%s' same '%s'", gen, l1,
	         gen, l2, gen, same);
	cr_assert_eq(system(cmd), 0);

	struct spaced_rootfs *t;
	struct spaced_rootfs_info layered, given;
	cr_assert_eq(spaced_rootfs_new(NULL, dir, &t, why, sizeof why), 0);
	cr_assert_eq(spaced_rootfs_add_archive(t, l1, SPACED_ROOTFS_OCI_LAYER, why, sizeof why), 0, "%s", why);
	cr_assert_eq(spaced_rootfs_add_archive(t, l2, SPACED_ROOTFS_OCI_LAYER, why, sizeof why), 0, "%s", why);
	cr_assert_eq(spaced_rootfs_write(t, out1, &layered, why, sizeof why), 0, "%s", why);
	spaced_rootfs_free(t);
	cr_assert_eq(spaced_rootfs_new(NULL, dir, &t, why, sizeof why), 0);
	cr_assert_eq(spaced_rootfs_add_archive(t, same, SPACED_ROOTFS_TARBALL, why, sizeof why), 0, "%s", why);
	cr_assert_eq(spaced_rootfs_write(t, out2, &given, why, sizeof why), 0, "%s", why);
	spaced_rootfs_free(t);

	char listing[600], q[700];
	snprintf(q, sizeof q, "python3 '%s' list '%s'", gen, out1);
	sh(dir, q, listing, sizeof listing);
	/* the lower layer's 3000 names less every third (1000), 500 of those
	 * made again, and 600 new names */
	cr_expect_str_eq(listing, "3100 True ('d/n00000', b'again') ('d/xn02995', b'x')\n");
	cr_expect_str_eq(layered.hash, given.hash);
	cr_expect_eq(layered.entries, given.entries);
}

/* a tenant names its files as it likes: bytes that are not UTF-8, a newline,
 * control characters; its snapshot (and so its move) keeps them byte for byte
 * (a name that was not UTF-8 failed the snapshot, "(io)" and no reason) */
Test(rootfs, snapshot_keeps_names_that_are_not_utf8)
{
	char snap[300], tarp[300], ext[300], cmd[1200], why[512] = "", h1[SPACED_TREEHASH_HEX], h2[SPACED_TREEHASH_HEX];
	snprintf(snap, sizeof snap, "%s/snapn", dir);
	snprintf(tarp, sizeof tarp, "%s/snapn.tar", dir);
	snprintf(ext, sizeof ext, "%s/stagen", dir);
	snprintf(cmd, sizeof cmd,
	         "mkdir -p %s/upper/root/w && echo identity=x >%s/meta && python3 -c \"import sys\n"
	         "for n in (b'bad\\\\xff\\\\xfe', b'nl\\\\nname', b'\\\\x01ctl', b'\\\\xc3\\\\xa9'): open(sys.argv[1].encode() + b'/' + n, 'wb').write(n)\" "
	         "%s/upper/root/w",
	         snap, snap, snap);
	cr_assert_eq(system(cmd), 0);
	cr_assert_eq(spaced_treehash_dir(snap, h1, NULL), 0);
	cr_assert_eq(spaced_rootfs_pack_dir(snap, tarp, 0, why, sizeof why), 0, "%s", why);
	cr_assert_eq(spaced_rootfs_extract(tarp, ext, SPACED_ROOTFS_X_SNAPSHOT, NULL, why, sizeof why), 0, "%s", why);
	cr_assert_eq(spaced_treehash_dir(ext, h2, NULL), 0);
	cr_assert_str_eq(h1, h2, "the extracted snapshot hashes as the original");
	char out[512];
	sh(ext, "python3 -c \"import os; print(sorted(n for n in os.listdir(b'upper/root/w') if open(b'upper/root/w/' + n, 'rb').read() == n))\"",
	   out, sizeof out);
	cr_assert_str_eq(out, "[b'\\x01ctl', b'bad\\xff\\xfe', b'nl\\nname', b'\\xc3\\xa9']\n");
}

/* The tree hash reads each name of a file again (the stream holds each
 * name's content): a thousand names of a big file would have the worker read
 * it a thousand times for one snapshot. What a walk reads is bounded
 * (SPACED_TREEHASH_MAX_READ, 8 GiB), counted before it reads: two names of a
 * 4.5 GiB file (allocated, never written: nothing to read) are refused, one
 * is not. */
Test(rootfs, the_tree_hash_reads_a_bounded_amount)
{
	char cmd[1000], t[300], hex[SPACED_TREEHASH_HEX];
	snprintf(t, sizeof t, "%s/big", dir);
	snprintf(cmd, sizeof cmd, "mkdir '%s' && fallocate -l 4608M '%s/f'", t, t);
	if (system(cmd) != 0)
		cr_skip_test("fallocate of 4.5 GiB is not possible in %s", dir);
	cr_expect_eq(spaced_treehash_dir(t, hex, NULL), 0, "one name: read once");
	snprintf(cmd, sizeof cmd, "ln '%s/f' '%s/g'", t, t);
	cr_assert_eq(system(cmd), 0);
	cr_expect_eq(spaced_treehash_dir(t, hex, NULL), SPACED_ETOOBIG, "two names: 9 GiB to read");
}
