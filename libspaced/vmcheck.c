/* vmcheck.c — the checks that bind a microVM's guest-transport back-end to
 * the QEMU process whose guest memory it serves (B1, B2; vmcheck.h).
 *
 * For the qemu substrate the hybrid vsock socket is held by spaced-vsockd,
 * which the caller checks as the listener's holder (pidfd, start time,
 * executable, unix_diag: spaced-host's verify.c, spaced_peer_connect_listener).
 * Here, at every connection:
 *   1. QEMU (--vm-pid) is the process pinned at the first connection (its
 *      pidfd accepts signal 0; the start time was compared when it was
 *      pinned, so a reused PID never passes) and runs the expected executable
 *      (dev/ino of /proc/PID/exe; an execve changes it without changing the
 *      pid or the start time);
 *   2. the back-end holds a Unix socket whose peer (unix_diag UNIX_DIAG_PEER,
 *      asked about the back-end's socket, which lives in the bridge's network
 *      namespace; QEMU runs in one of its own) QEMU holds: the vhost-user
 *      connection over which QEMU handed the back-end its guest memory. A
 *      back-end serving another VM, or a QEMU whose back-end is another
 *      process, fails here;
 *   3. with --guest-cid, the back-end was started for exactly that guest CID
 *      (its command line, read through /proc of the pinned process whose
 *      executable verify.c has just compared: the CID is what it puts in the
 *      device's config space and what it requires of every guest packet).
 * What is kept between connections: QEMU's pidfd, and the descriptor number
 * and inode of the back-end's end of the link and its peer, looked at first
 * (one readlink, one exact unix_diag query, QEMU's table); when they no
 * longer match, the full search of the back-end's few descriptors runs.
 */
#include "vmcheck.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "spaced_error.h"
#include "util.h"

/* The socket inode behind descriptor fdname of pid, 0 when it is not a socket. */
static uint64_t fd_socket(pid_t pid, const char *fdname)
{
	char path[64], link[64];
	snprintf(path, sizeof path, "/proc/%d/fd/%s", (int)pid, fdname);
	ssize_t n = readlink(path, link, sizeof link - 1);
	if (n <= 0)
		return 0;
	link[n] = '\0';
	uint64_t ino = 0;
	if (sscanf(link, "socket:[%" SCNu64 "]", &ino) != 1)
		return 0;
	return ino;
}

/* Whether the back-end's socket ino is connected to a socket QEMU holds; the
 * peer's inode in *peer. The query is about the back-end's socket: it lives in
 * this bridge's network namespace (unix_diag answers for that one), QEMU's end
 * need not (QEMU runs in a network namespace of its own). */
static bool linked(struct spaced_vm_check *vc, uint64_t ino, uint64_t *peer)
{
	return spaced_unix_diag_peer_of_ino(ino, peer) == 0 && *peer != 0 &&
	       spaced_pidref_holds_socket(&vc->qemu, *peer) == 0;
}

/* Finds the link between the back-end and QEMU: the remembered one when it
 * still is, else a scan of the back-end's descriptor table (a few entries). */
static int find_link(struct spaced_vm_check *vc, const struct spaced_pidref *backend)
{
	uint64_t peer;
	if (vc->be_fd >= 0) {
		char name[16];
		snprintf(name, sizeof name, "%d", vc->be_fd);
		if (fd_socket(backend->pid, name) == vc->be_ino && linked(vc, vc->be_ino, &peer) && peer == vc->qemu_ino)
			return 0;
	}
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/fd", (int)backend->pid);
	DIR *d = opendir(path);
	if (d == NULL)
		return SPACED_ESTALE;
	int r = SPACED_ENOENT;
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		if (de->d_name[0] == '.')
			continue;
		uint64_t ino = fd_socket(backend->pid, de->d_name);
		if (ino != 0 && linked(vc, ino, &peer)) {
			vc->be_fd = atoi(de->d_name);
			vc->be_ino = ino;
			vc->qemu_ino = peer;
			r = 0;
			break;
		}
	}
	closedir(d);
	/* the back-end's table was read while its pidfd still named it */
	if (r == 0 && spaced_pidref_check(backend) < 0)
		r = SPACED_ESTALE;
	return r;
}

/* Whether the back-end's command line holds "--cid N" with N == cid. */
static int backend_cid(const struct spaced_pidref *backend, uint32_t cid, char *why, size_t whysz)
{
	char path[64], buf[4096], want[16];
	snprintf(path, sizeof path, "/proc/%d/cmdline", (int)backend->pid);
	snprintf(want, sizeof want, "%u", cid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
	if (fd >= 0)
		close(fd);
	if (n <= 0 || spaced_pidref_check(backend) < 0) {
		spaced_why(why, whysz, "back-end process %d: command line unreadable", (int)backend->pid);
		return SPACED_EPEER;
	}
	buf[n] = '\0';
	const char *found = NULL;
	for (const char *a = buf; a < buf + n; a += strlen(a) + 1)
		if (strcmp(a, "--cid") == 0 && a + strlen(a) + 1 < buf + n)
			found = a + strlen(a) + 1;
	if (found == NULL || strcmp(found, want) != 0) {
		spaced_why(why, whysz, "back-end process %d serves guest CID %s, expected %u", (int)backend->pid,
		           found ? found : "(none)", cid);
		return SPACED_EPEER;
	}
	return 0;
}

int spaced_vm_verify(struct spaced_vm_check *vc, const struct spaced_vm_expected *vm, const struct spaced_pidref *backend,
                     char *why, size_t whysz)
{
	int r = 0;
	if (vm->pid <= 0 && vm->guest_cid == 0)
		return 0;
	pthread_mutex_lock(&vc->lock);
	if (vm->pid > 0) {
		if (vc->qemu.pidfd < 0) {
			struct spaced_pidref ref = SPACED_PIDREF_NULL;
			if (spaced_pidref_from_pid(&ref, vm->pid) < 0) {
				spaced_why(why, whysz, "VM process %d is gone", (int)vm->pid);
				r = SPACED_EPEER;
				goto out;
			}
			if (ref.start_time != vm->start_time) {
				spaced_why(why, whysz,
				           "VM process %d start time %" PRIu64 " differs from the expected %" PRIu64
				           " (PID reused?)",
				           (int)vm->pid, ref.start_time, vm->start_time);
				spaced_pidref_done(&ref);
				r = SPACED_EPEER;
				goto out;
			}
			vc->qemu = ref;
		} else if (spaced_pidref_check(&vc->qemu) < 0) {
			spaced_why(why, whysz, "VM process %d is gone", (int)vm->pid);
			r = SPACED_EPEER;
			goto out;
		}
		if (vm->check_exe && (r = spaced_pidref_check_exe(&vc->qemu, &vm->exe, "VM", why, whysz)) < 0)
			goto out;
		int l = find_link(vc, backend);
		/* QEMU's table was read while its pidfd still named it */
		if (l == 0 && spaced_pidref_check(&vc->qemu) < 0)
			l = SPACED_ESTALE;
		if (l < 0) {
			vc->be_fd = -1;
			spaced_why(why, whysz, "VM process %d holds no connection to the back-end process %d (%s)",
			           (int)vm->pid, (int)backend->pid, spaced_strerror(l));
			r = SPACED_EPEER;
			goto out;
		}
	}
	if (vm->guest_cid != 0)
		r = backend_cid(backend, vm->guest_cid, why, whysz);
out:
	pthread_mutex_unlock(&vc->lock);
	return r;
}
