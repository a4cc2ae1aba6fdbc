/* vm_pids.c — STATE/pids of a spaced-vm execution (vm.h). */
#include "vm.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "spaced_error.h"

int vm_read_pids(const char *state, pid_t *vsockd, uint64_t *vsockd_start, pid_t *qemu, uint64_t *qemu_start)
{
	char path[4200], buf[256];
	snprintf(path, sizeof path, "%s/pids", state);
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return errno == ENOENT ? SPACED_ENOENT : SPACED_ESYS;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0 || (size_t)n >= sizeof buf - 1)
		return SPACED_EPROTO;
	buf[n] = '\0';
	int vp, qp, used = 0;
	uint64_t vs, qs;
	if (sscanf(buf, "vsockd %d %" SCNu64 "\nqemu %d %" SCNu64 "\n%n", &vp, &vs, &qp, &qs, &used) != 4 ||
	    used != n || vp <= 0 || qp <= 0)
		return SPACED_EPROTO;
	*vsockd = vp;
	*vsockd_start = vs;
	*qemu = qp;
	*qemu_start = qs;
	return 0;
}
