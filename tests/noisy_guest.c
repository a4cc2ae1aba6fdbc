/*
 * noisy_guest.c — a misbehaving guest for the substrate tests: it writes
 * 24 MiB to its stdout (the supervisor's guest log), then says READY on the
 * control fd and waits until the supervisor goes away.
 *
 *   noisy-guest --root / --control-fd N [--identity TEXT]
 */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	static char block[65536];
	char buf[256];
	int ctl = -1;

	for (int i = 1; i + 1 < argc; i += 2)
		if (strcmp(argv[i], "--control-fd") == 0)
			ctl = atoi(argv[i + 1]);
	if (ctl < 0)
		return 2;
	memset(block, 'x', sizeof(block));
	for (int i = 0; i < 384; i++)
		if (write(1, block, sizeof(block)) != (ssize_t)sizeof(block))
			return 1;
	if (send(ctl, "READY", 5, MSG_NOSIGNAL) != 5)
		return 1;
	while (recv(ctl, buf, sizeof(buf), 0) > 0)
		;
	return 0;
}
