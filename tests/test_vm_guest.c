/*
 * test_vm_guest.c — spaced-vm's exchanges with its guest's control port
 * (spaced-vmm/vm_guest.c) against a guest of our own behind a hybrid vsock
 * socket: an answer in time is taken; a guest that trickles its answer one
 * byte at a time, each byte well within the bound, is cut at the bound for
 * the whole line (spaced-vm's loop waits for no guest longer than that: its
 * PAUSE and STOP come next), and so is one that trickles the CONNECT answer.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "spaced_error.h"
#include "vm_int.h"

struct vm V;

enum guest_mode { PROMPT, TRICKLE_ANSWER, TRICKLE_CONNECT };

struct fake {
	int lfd;
	enum guest_mode mode;
	pthread_t th;
};

static void send_slowly(int fd, const char *s)
{
	for (; *s; s++) {
		usleep(300000); /* each byte well within the 1 s bound */
		if (send(fd, s, 1, MSG_NOSIGNAL) != 1)
			return;
	}
}

/* One line from fd (at most n - 1 bytes), blocking. */
static void read_line(int fd, char *buf, size_t n)
{
	size_t got = 0;
	while (got + 1 < n && recv(fd, buf + got, 1, 0) == 1 && buf[got] != '\n')
		got++;
	buf[got] = '\0';
}

static void *guest(void *arg)
{
	struct fake *f = arg;
	char line[128];
	int fd = accept(f->lfd, NULL, NULL);
	if (fd < 0)
		return NULL;
	read_line(fd, line, sizeof line); /* CONNECT <port> */
	if (f->mode == TRICKLE_CONNECT)
		send_slowly(fd, "OK 1073741824\n");
	else
		(void)!send(fd, "OK 1073741824\n", 14, MSG_NOSIGNAL);
	read_line(fd, line, sizeof line); /* the command */
	if (f->mode == TRICKLE_ANSWER)
		send_slowly(fd, "OK 5\n");
	else
		(void)!send(fd, "OK 5\n", 5, MSG_NOSIGNAL);
	usleep(200000);
	close(fd);
	return NULL;
}

static void fake_start(struct fake *f, enum guest_mode mode)
{
	char tmpl[] = "/tmp/test-vm-guest-XXXXXX";
	cr_assert_not_null(mkdtemp(tmpl));
	snprintf(V.vmdir, sizeof V.vmdir, "%s", tmpl);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s/guest.sock", tmpl);
	f->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_geq(f->lfd, 0);
	cr_assert_eq(bind(f->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
	cr_assert_eq(listen(f->lfd, 4), 0);
	f->mode = mode;
	cr_assert_eq(pthread_create(&f->th, NULL, guest, f), 0);
}

static void fake_stop(struct fake *f)
{
	char p[PATH_MAX + 16];
	pthread_join(f->th, NULL);
	close(f->lfd);
	snprintf(p, sizeof p, "%s/guest.sock", V.vmdir);
	unlink(p);
	rmdir(V.vmdir);
}

Test(vm_guest, answer_in_time_is_taken)
{
	struct fake f;
	char ans[64];
	fake_start(&f, PROMPT);
	cr_assert_eq(vm_guest_control("TASKS", ans, sizeof ans, 1000), 0);
	cr_assert_str_eq(ans, "OK 5");
	fake_stop(&f);
}

Test(vm_guest, trickled_answer_is_cut_at_the_bound)
{
	struct fake f;
	char ans[64];
	fake_start(&f, TRICKLE_ANSWER);
	/* five bytes 300 ms apart: 1.5 s in all, past the 1 s bound for the line */
	cr_assert_eq(vm_guest_control("TASKS", ans, sizeof ans, 1000), SPACED_ETIMEDOUT);
	fake_stop(&f);
}

Test(vm_guest, trickled_connect_answer_is_cut_at_the_bound)
{
	struct fake f;
	char ans[64];
	fake_start(&f, TRICKLE_CONNECT);
	cr_assert_eq(vm_guest_control("TASKS", ans, sizeof ans, 1000), SPACED_ECLOSED);
	fake_stop(&f);
}
