/* vm_disk.c — the disk of a qemu substrate execution, its snapshots' disks
 * and meta, and where templates live (vm_int.h; docs/substrate.md). */
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "pace.h"
#include "spaced_error.h"
#include "util.h"
#include "vm_int.h"

static uint32_t vcpus_of(uint32_t milli)
{
	uint32_t n = (milli + 999) / 1000;
	return n ? n : 1;
}

static const char *machine_name(enum vm_machine m)
{
	return m == VM_PC ? "pc" : "microvm";
}

/* The base image of the worker's root tree for a disk of `disk` bytes:
 * IMAGES/cache/base-<bytes>.img, an ext4 filesystem of exactly that size (a
 * sparse file), built once under a lock and then only read. */
static int base_image(uint64_t disk, char *out, size_t outsz, char *why, size_t whysz)
{
	char cache[PATH_MAX + 16], lockp[PATH_MAX + 32], tmp[PATH_MAX + 128], rootfs[PATH_MAX + 16], size[32];
	snprintf(cache, sizeof cache, "%s/cache", V.images);
	if (mkdir(cache, 0755) < 0 && errno != EEXIST) {
		spaced_why(why, whysz, "mkdir %s: %s", cache, strerror(errno));
		return SPACED_ESYS;
	}
	if ((size_t)snprintf(out, outsz, "%s/base-%" PRIu64 ".img", cache, disk) >= outsz)
		return SPACED_ETOOBIG;
	if (access(out, R_OK) == 0)
		return 0;
	snprintf(lockp, sizeof lockp, "%s/.lock", cache);
	int lk = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (lk < 0 || flock(lk, LOCK_EX) < 0) {
		spaced_why(why, whysz, "lock %s: %s", lockp, strerror(errno));
		if (lk >= 0)
			close(lk);
		return SPACED_ESYS;
	}
	int e = 0;
	if (access(out, R_OK) != 0) {
		snprintf(tmp, sizeof tmp, "%s.tmp.%d", out, (int)getpid());
		snprintf(rootfs, sizeof rootfs, "%s/rootfs", V.images);
		snprintf(size, sizeof size, "%" PRIu64 "k", disk / 1024);
		/* no journal (a generation starts from its snapshot, taken after a
		 * sync), lazily initialised inode tables that the guest never zeroes
		 * (noinit_itable): an empty disk costs a few hundred KiB */
		const char *argv[] = {"mke2fs", "-q", "-F", "-t", "ext4", "-T", "default", "-m", "0", "-O",
		                      "^has_journal,^resize_inode", "-E", "lazy_itable_init=1,nodiscard,root_owner=0:0",
		                      "-L", "spaced", "-d", rootfs, tmp, size, NULL};
		e = vm_run_tool(argv);
		if (e == 0 && (chmod(tmp, 0644) < 0 || rename(tmp, out) < 0))
			e = SPACED_ESYS;
		if (e < 0) {
			unlink(tmp);
			spaced_why(why, whysz, "cannot build the base image %s from %s", out, rootfs);
		}
	}
	close(lk);
	return e;
}

/* A snapshot's disk must stand alone: a backing or external data file named
 * inside it would make QEMU read a host file as the guest's disk. */
static int disk_standalone(const char *path, char *why, size_t whysz)
{
	int pfd[2];
	if (pipe2(pfd, O_CLOEXEC) < 0)
		return SPACED_ESYS;
	pid_t p = fork();
	if (p < 0) {
		close(pfd[0]);
		close(pfd[1]);
		return SPACED_ESYS;
	}
	if (p == 0) {
		int nul = open("/dev/null", O_RDWR);
		dup2(nul, 0);
		dup2(pfd[1], 1);
		dup2(nul, 2);
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		execlp("qemu-img", "qemu-img", "info", "-U", "--output=json", "-f", "qcow2", path, (char *)NULL);
		_exit(127);
	}
	close(pfd[1]);
	struct spaced_buf b;
	spaced_buf_init(&b, 256 * 1024);
	char chunk[4096];
	ssize_t n;
	int e = 0;
	while ((n = read(pfd[0], chunk, sizeof chunk)) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 || spaced_buf_append(&b, chunk, (size_t)n) < 0) {
			e = SPACED_EIO;
			break;
		}
	}
	close(pfd[0]);
	int st;
	while (waitpid(p, &st, 0) < 0 && errno == EINTR)
		;
	json_t *o = NULL;
	if (e == 0 && (!WIFEXITED(st) || WEXITSTATUS(st) != 0))
		e = SPACED_EIO;
	if (e == 0) {
		json_error_t jerr;
		o = json_loadb((const char *)b.data, b.len, JSON_REJECT_DUPLICATES, &jerr);
		if (!json_is_object(o))
			e = SPACED_EPROTO;
	}
	if (e == 0) {
		const char *fmt = json_string_value(json_object_get(o, "format"));
		json_t *fs = json_object_get(json_object_get(o, "format-specific"), "data");
		if (!fmt || strcmp(fmt, "qcow2") != 0 || json_object_get(o, "backing-filename") != NULL ||
		    json_object_get(o, "full-backing-filename") != NULL || json_object_get(fs, "data-file") != NULL) {
			spaced_why(why, whysz, "the snapshot's disk is not a standalone qcow2 image");
			e = SPACED_EPERM;
		}
	} else {
		spaced_why(why, whysz, "qemu-img info of the snapshot's disk failed");
	}
	json_decref(o);
	spaced_buf_free(&b);
	return e;
}

int vm_read_meta(const char *dir, struct vm_snapmeta *m, char *why, size_t whysz)
{
	char path[PATH_MAX + 16], buf[2048];
	snprintf(path, sizeof path, "%s/meta", dir);
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) {
		spaced_why(why, whysz, "no snapshot at %s (meta missing)", dir);
		return SPACED_ENOENT;
	}
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0 || (size_t)n >= sizeof buf - 1) {
		spaced_why(why, whysz, "unreadable snapshot meta");
		return SPACED_EPROTO;
	}
	buf[n] = '\0';
	struct vm_snapmeta r;
	memset(&r, 0, sizeof r);
	unsigned seen = 0;
	char *save = NULL;
	for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *eq = strchr(line, '=');
		char *end;
		unsigned bit;
		if (eq == NULL)
			goto bad;
		*eq++ = '\0';
		errno = 0;
		if (strcmp(line, "identity") == 0) {
			bit = 1;
			if (*eq && spaced_identity_decode(&r.id, eq, strlen(eq)) < 0)
				goto bad;
		} else if (strcmp(line, "substrate") == 0) {
			bit = 2;
			if (strcmp(eq, "qemu") != 0)
				goto bad;
		} else if (strcmp(line, "machine") == 0) {
			bit = 4;
			if (strcmp(eq, "pc") == 0)
				r.machine = VM_PC;
			else if (strcmp(eq, "microvm") == 0)
				r.machine = VM_MICROVM;
			else
				goto bad;
		} else if (strcmp(line, "memory") == 0) {
			bit = 8;
			if (strcmp(eq, "saved") == 0)
				r.memory = true;
			else if (strcmp(eq, "none") != 0)
				goto bad;
		} else if (strcmp(line, "memory_bytes") == 0) {
			bit = 16;
			r.memory_bytes = strtoull(eq, &end, 10);
			if (errno || *end || end == eq)
				goto bad;
		} else if (strcmp(line, "disk_bytes") == 0) {
			bit = 32;
			r.disk_bytes = strtoull(eq, &end, 10);
			if (errno || *end || end == eq)
				goto bad;
		} else if (strcmp(line, "vcpus") == 0) {
			bit = 64;
			unsigned long v = strtoul(eq, &end, 10);
			if (errno || *end || end == eq || v == 0 || v > 1024)
				goto bad;
			r.vcpus = (uint32_t)v;
		} else {
			goto bad;
		}
		if (seen & bit)
			goto bad;
		seen |= bit;
	}
	if (seen != 127)
		goto bad;
	*m = r;
	return 0;
bad:
	spaced_why(why, whysz, "the snapshot's meta is not a qemu substrate snapshot's");
	return SPACED_EPROTO;
}

int vm_write_meta(const char *dir, bool memory)
{
	char meta[SPACED_IDENTITY_TEXT_MAX + 256];
	snprintf(meta, sizeof meta,
	         "identity=%s\nsubstrate=qemu\nmachine=%s\nmemory=%s\nmemory_bytes=%" PRIu64 "\nvcpus=%u\ndisk_bytes=%" PRIu64
	         "\n",
	         V.have_identity ? V.idtext : "", machine_name(V.machine), memory ? "saved" : "none", V.memory,
	         vcpus_of(V.cpu_milli), V.disk);
	return vm_write_file(dir, "meta", meta, 0600);
}

int vm_template_path(char *out, size_t outsz)
{
	struct stat st;
	if (stat(V.qemu_bin, &st) < 0)
		return SPACED_ESYS;
	/* a QEMU of another build could not read the saved device state, and a
	 * template booted with other kernel arguments is another kernel state */
	uint32_t k = spaced_fnv1a(VM_BOOT_ARGS " " VM_BOOT_ARGS_PC);
	int n = snprintf(out, outsz, "%s/cache/template2-%s-%" PRIu64 "m-%uc-%" PRIu64 "-q%llx.%llx-k%08x", V.images,
	                 machine_name(V.machine), V.memory >> 20, vcpus_of(V.cpu_milli), V.disk,
	                 (unsigned long long)st.st_ino, (unsigned long long)st.st_mtime, (unsigned)k);
	return (n < 0 || (size_t)n >= outsz) ? SPACED_ETOOBIG : 0;
}

/* Whether a snapshot (or template) with meta m can give this VM its memory. */
static bool memory_fits(const struct vm_snapmeta *m)
{
	return m->memory && m->machine == V.machine && V.machine == VM_PC && m->memory_bytes == V.memory &&
	       m->vcpus == vcpus_of(V.cpu_milli);
}

static int open_image(const char *dir, const char *name, int *fd, char *why, size_t whysz)
{
	char p[PATH_MAX + 32];
	snprintf(p, sizeof p, "%s/%s", dir, name);
	*fd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (*fd < 0) {
		spaced_why(why, whysz, "open %s: %s", p, strerror(errno));
		return SPACED_ESYS;
	}
	return 0;
}

int vm_make_disk(char *why, size_t whysz)
{
	char disk[PATH_MAX + 16];
	snprintf(disk, sizeof disk, "%s/disk.qcow2", V.vmdir);
	int e;
	if (V.restore) {
		/* a new execution of the same sandbox (I2): a copy of the saved disk,
		 * and the saved memory when it fits this VM */
		char src[PATH_MAX + 16];
		struct vm_snapmeta m;
		snprintf(src, sizeof src, "%s/disk.qcow2", V.restore);
		if ((e = vm_read_meta(V.restore, &m, why, whysz)) < 0)
			return e;
		if (strcmp(m.id.sandbox, V.id.sandbox) != 0 || V.id.generation <= m.id.generation) {
			spaced_why(why, whysz,
			           "a restore needs the same sandbox and a newer generation (snapshot of %s generation %" PRIu64 ")",
			           m.id.sandbox[0] ? m.id.sandbox : "a template", m.id.generation);
			return SPACED_EPERM;
		}
		if ((e = disk_standalone(src, why, whysz)) < 0)
			return e;
		const char *cp[] = {"cp", "--sparse=always", "--", src, disk, NULL};
		if ((e = vm_run_tool(cp)) < 0) {
			spaced_why(why, whysz, "cannot copy the snapshot's disk");
			return e;
		}
		/* the copy is what QEMU opens: check it too (the store may change) */
		if ((e = disk_standalone(disk, why, whysz)) < 0)
			return e;
		V.disk = m.disk_bytes;
		if (memory_fits(&m)) {
			if ((e = open_image(V.restore, "state", &V.state_fd, why, whysz)) < 0 ||
			    (e = open_image(V.restore, "ram", &V.ram_src_fd, why, whysz)) < 0)
				return e;
			V.need_identity = true;
		} else if (m.memory) {
			vm_log("the snapshot's memory does not fit this VM (machine, memory or vCPUs): a fresh boot of its disk");
		}
	} else if (V.template_dir[0]) {
		/* from a booted template: an overlay over its disk, its memory */
		struct vm_snapmeta m;
		char tdisk[PATH_MAX + 32];
		if ((e = vm_read_meta(V.template_dir, &m, why, whysz)) < 0)
			return e;
		if (!memory_fits(&m) || m.disk_bytes != V.disk || m.id.sandbox[0]) {
			spaced_why(why, whysz, "the template at %s is not this VM's", V.template_dir);
			return SPACED_EINVAL;
		}
		snprintf(tdisk, sizeof tdisk, "%s/disk.qcow2", V.template_dir);
		if ((e = open_image(V.template_dir, "disk.qcow2", &V.base_fd, why, whysz)) < 0 ||
		    (e = open_image(V.template_dir, "state", &V.state_fd, why, whysz)) < 0 ||
		    (e = open_image(V.template_dir, "ram", &V.ram_src_fd, why, whysz)) < 0)
			return e;
		V.base_fmt = "qcow2";
		V.need_identity = true;
		const char *argv[] = {"qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", tdisk, disk, NULL};
		if ((e = vm_run_tool(argv)) < 0) {
			spaced_why(why, whysz, "qemu-img create of the execution's disk failed");
			return e;
		}
	} else {
		char base[PATH_MAX + 64];
		if ((e = base_image(V.disk, base, sizeof base, why, whysz)) < 0)
			return e;
		V.base_fd = open(base, O_RDONLY | O_CLOEXEC);
		if (V.base_fd < 0) {
			spaced_why(why, whysz, "open %s: %s", base, strerror(errno));
			return SPACED_ESYS;
		}
		V.base_fmt = "raw";
		const char *argv[] = {"qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", base, disk, NULL};
		if ((e = vm_run_tool(argv)) < 0) {
			spaced_why(why, whysz, "qemu-img create of the execution's disk failed");
			return e;
		}
	}
	if (chown(disk, V.uid, V.uid) < 0 || chmod(disk, 0600) < 0) {
		spaced_why(why, whysz, "chown %s: %s", disk, strerror(errno));
		return SPACED_ESYS;
	}
	return 0;
}

/* Copies what src holds to dst (both open, dst empty): data only, chunk by
 * chunk, a chunk of zeros left a hole. */
static int copy_sparse(int src, int dst, uint64_t size)
{
	enum { CHUNK = 64 * 1024 };
	static const uint8_t zero[CHUNK];
	uint8_t *buf = malloc(CHUNK);
	if (buf == NULL)
		return SPACED_ENOMEM;
	int e = 0;
	off_t pos = 0;
	while (e == 0 && (uint64_t)pos < size) {
		off_t data = lseek(src, pos, SEEK_DATA);
		if (data < 0)
			break; /* only a hole is left */
		off_t hole = lseek(src, data, SEEK_HOLE);
		if (hole < 0 || (uint64_t)hole > size)
			hole = (off_t)size;
		for (off_t at = data; e == 0 && at < hole; at += CHUNK) {
			size_t n = (size_t)(hole - at < CHUNK ? hole - at : CHUNK);
			ssize_t r = pread(src, buf, n, at);
			if (r != (ssize_t)n) {
				e = SPACED_EIO;
				break;
			}
			if (memcmp(buf, zero, n) == 0)
				continue;
			if (pwrite(dst, buf, n, at) != (ssize_t)n)
				e = SPACED_EIO;
		}
		pos = hole;
	}
	free(buf);
	if (e == 0 && ftruncate(dst, (off_t)size) < 0)
		e = SPACED_EIO;
	return e;
}

int vm_make_ram(char *why, size_t whysz)
{
	unlink(V.ram_path); /* what an execution of this uid range that died left */
	V.ram_fd = open(V.ram_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (V.ram_fd < 0) {
		spaced_why(why, whysz, "create %s: %s", V.ram_path, strerror(errno));
		return SPACED_ESYS;
	}
	/* QEMU, as the execution's uid, opens it again through its descriptor */
	if (fchown(V.ram_fd, V.uid, V.uid) < 0 || ftruncate(V.ram_fd, (off_t)V.memory) < 0) {
		spaced_why(why, whysz, "prepare %s: %s", V.ram_path, strerror(errno));
		return SPACED_ESYS;
	}
	if (V.ram_src_fd < 0)
		return 0;
	/* the saved RAM's pages are charged to the VM's cgroup: a child in it copies */
	pid_t p = fork();
	if (p < 0)
		return SPACED_ESYS;
	if (p == 0) {
		char w[128];
		if (V.have_cg && sub_cgroup_add(&V.cg, getpid(), w, sizeof w) < 0)
			_exit(2);
		_exit(copy_sparse(V.ram_src_fd, V.ram_fd, V.memory) == 0 ? 0 : 1);
	}
	int st;
	while (waitpid(p, &st, 0) < 0)
		if (errno != EINTR)
			return SPACED_ESYS;
	close(V.ram_src_fd);
	V.ram_src_fd = -1;
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		spaced_why(why, whysz, "cannot load the saved RAM into %s", V.ram_path);
		return SPACED_EIO;
	}
	return 0;
}

int vm_save_ram(const char *dst, char *why, size_t whysz)
{
	int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (out < 0) {
		spaced_why(why, whysz, "create %s: %s", dst, strerror(errno));
		return SPACED_ESYS;
	}
	int e = copy_sparse(V.ram_fd, out, V.memory);
	if (e == 0 && fsync(out) < 0)
		e = SPACED_EIO;
	close(out);
	if (e < 0) {
		unlink(dst);
		spaced_why(why, whysz, "cannot save the guest's RAM");
	}
	return e;
}

/* Copies the regular file at src (in the execution's directory, so opened
 * without following a link and checked to belong to the execution's uid)
 * to dst, created new. Holes stay holes. */
static int copy_out(const char *src, const char *dst, char *why, size_t whysz)
{
	int in = open(src, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	struct stat st;
	if (in < 0 || fstat(in, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != V.uid || st.st_nlink != 1) {
		spaced_why(why, whysz, "the converted disk is not a plain file of the execution");
		if (in >= 0)
			close(in);
		return SPACED_EPERM;
	}
	int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (out < 0) {
		close(in);
		spaced_why(why, whysz, "create %s: %s", dst, strerror(errno));
		return SPACED_ESYS;
	}
	int e = 0;
	off_t pos = 0;
	/* written behind as it goes: a VM's disk of gigabytes never sits dirty
	 * in the host's page cache for another tenant's fsync to wait behind */
	struct spaced_pace pace;
	spaced_pace_init(&pace, 0, true);
	while (e == 0 && pos < st.st_size) {
		off_t data = lseek(in, pos, SEEK_DATA);
		if (data < 0)
			break; /* only a hole is left */
		off_t hole = lseek(in, data, SEEK_HOLE);
		if (hole < 0)
			hole = st.st_size;
		if (spaced_copy_range(in, out, data, hole - data, &pace) < 0)
			e = SPACED_EIO;
		pos = hole;
	}
	spaced_pace_end(&pace);
	if (e == 0 && (ftruncate(out, st.st_size) < 0 || fsync(out) < 0))
		e = SPACED_EIO;
	close(in);
	close(out);
	if (e < 0) {
		unlink(dst);
		spaced_why(why, whysz, "cannot copy the snapshot's disk");
	}
	return e;
}

/* qemu-img runs as the execution's uid with the disk's graph given whole, as
 * QEMU got it: the image's header was writable by QEMU, and a backing or data
 * file named there must not make a root process read a host file into the
 * snapshot. -U: QEMU holds the image (stopped, its writes flushed). */
int vm_save_disk(const char *dst, char *why, size_t whysz)
{
	char spec[PATH_MAX + 512], tmp[PATH_MAX + 32], backing[256];
	snprintf(tmp, sizeof tmp, "%s/snapshot.qcow2", V.vmdir);
	unlink(tmp);
	if (V.base_fd < 0)
		snprintf(backing, sizeof backing, "null");
	else if (strcmp(V.base_fmt, "qcow2") == 0)
		snprintf(backing, sizeof backing,
		         "{\"driver\":\"qcow2\",\"file\":{\"driver\":\"file\",\"filename\":\"/proc/self/fd/3\"},\"backing\":null}");
	else
		snprintf(backing, sizeof backing, "{\"driver\":\"raw\",\"file\":{\"driver\":\"file\",\"filename\":\"/proc/self/fd/3\"}}");
	snprintf(spec, sizeof spec,
	         "json:{\"driver\":\"qcow2\",\"file\":{\"driver\":\"file\",\"filename\":\"%s/disk.qcow2\"},\"backing\":%s}",
	         V.vmdir, backing);
	const char *argv[] = {"/usr/bin/qemu-img", "convert", "-U", "-O", "qcow2", spec, tmp, NULL};
	int keep[1] = {V.base_fd};
	int e = vm_spawn_wait(argv, keep, V.base_fd >= 0 ? 1 : 0, why, whysz);
	if (e < 0) {
		if (!why[0])
			spaced_why(why, whysz, "qemu-img convert of the disk failed");
		unlink(tmp);
		return e;
	}
	e = copy_out(tmp, dst, why, whysz);
	unlink(tmp);
	return e;
}
