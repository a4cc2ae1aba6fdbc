/*
 * fuzz-rootfs — what libspaced/rootfs.h reads from the outside: an archive a
 * tenant imports (a root filesystem tarball, or an OCI image archive when it
 * holds a layout), and an archive a worker extracts (a template or snapshot
 * from the store). Every input must be taken or refused cleanly; what is
 * taken and written must extract again, into a private directory, with the
 * hash it was written with.
 */
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rootfs.h"
#include "treehash.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
	(void)sb;
	(void)f;
	if (flag == FTW_DP)
		rmdir(p);
	else
		unlink(p);
	return 0;
}

static char dir[64];

/* The working directory goes with the process (a run that ends normally). */
static void dir_remove(void)
{
	if (dir[0])
		nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char in[128], out[128], x[128], why[512];
	if (!dir[0]) {
		snprintf(dir, sizeof dir, "/dev/shm/fuzz-rootfs-XXXXXX");
		if (!mkdtemp(dir))
			abort();
		atexit(dir_remove);
	}
	snprintf(in, sizeof in, "%s/in", dir);
	snprintf(out, sizeof out, "%s/out.tar", dir);
	snprintf(x, sizeof x, "%s/x", dir);
	FILE *f = fopen(in, "w");
	if (!f || fwrite(data, 1, size, f) != size)
		abort();
	fclose(f);
	struct spaced_rootfs_limits lim = {.max_bytes = 1 << 20, .max_entries = 2000};
	struct spaced_rootfs *t = NULL;
	struct spaced_rootfs_info info;
	json_t *cfg = NULL;
	const char *fmt;
	if (spaced_rootfs_new(&lim, dir, &t, why, sizeof why) != 0)
		abort();
	int r = spaced_rootfs_import(t, in, &cfg, &fmt, why, sizeof why);
	json_decref(cfg);
	if (r == 0)
		r = spaced_rootfs_write(t, out, &info, why, sizeof why);
	spaced_rootfs_free(t);
	if (r == 0) {
		char hex[SPACED_TREEHASH_HEX];
		if (spaced_rootfs_extract(out, x, SPACED_ROOTFS_X_TEMPLATE, &lim, why, sizeof why) != 0 ||
		    spaced_treehash_dir(x, hex, NULL) != 0 || strcmp(hex, info.hash) != 0)
			abort(); /* what was written extracts to the tree it names */
		nftw(x, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
	}
	/* the input as a worker would take it from the store */
	if (spaced_rootfs_extract(in, x, SPACED_ROOTFS_X_SNAPSHOT, &lim, why, sizeof why) == 0)
		nftw(x, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
	unlink(in);
	unlink(out);
	return 0;
}
