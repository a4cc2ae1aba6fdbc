/*
 * fuzz_qmp.c — libFuzzer target for what QEMU sends the supervisor of a
 * qemu substrate execution over QMP (spaced-vmm/qmp.c): the input is the
 * whole stream QEMU would write (greeting, answers, events), then QEMU hangs
 * up; the client reads the greeting, negotiates, runs two commands and drains.
 * Nothing may crash, hang or leak whatever the bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "qmp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int sv[2];
	struct qmp *q = NULL;
	char why[256];
	json_t *ret = NULL;

	if (size > 150 * 1024 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return 0;
	int sz = 512 * 1024;
	setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
	if (size > 0 && write(sv[1], data, size) != (ssize_t)size) {
		close(sv[0]);
		close(sv[1]);
		return 0;
	}
	shutdown(sv[1], SHUT_WR);
	if (qmp_adopt(sv[0], 50, &q) == 0) {
		if (qmp_exec(q, "query-status", NULL, 50, &ret, why, sizeof(why)) == 0)
			json_decref(ret);
		(void)qmp_exec(q, "stop", json_pack("{s:b}", "x", 1), 50, NULL, why, sizeof(why));
		(void)qmp_drain(q);
		qmp_close(q);
	}
	close(sv[1]);
	return 0;
}
