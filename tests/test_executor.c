/*
 * test_executor.c — the executor's loop (spaced-node/executor.c) driven
 * through its link, as the gate drives it.
 *
 * A connection to a bridge is handed over — the bridge's HANDOFF, sent only
 * after it verified the guest (B3) — while the gate keeps sending jobs (a
 * burst of creates, or of new streams): its answer must go out at the turn
 * the HANDOFF arrives, not once the jobs stop. The executor
 * used to find each connection in progress by its place in the list, and a
 * job read in a turn put a new one at the list's head: every other one was
 * out of line for that turn, so under a steady stream of jobs none ever
 * completed (past its deadline it failed as unanswered).
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "spaced_error.h"
#include "executor.h"
#include "frame.h"
#include "host_client.h"
#include "node.h"
#include "util.h"

#define JOBS_BEFORE 300 /* jobs sent before the bridge hands over */
#define JOBS_AFTER 700  /* and after it: more than a link holds (net.unix.max_dgram_qlen, 512 by
                         * default), so the executor reads them while the test still writes */

static int listen_at(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert(fd >= 0);
	cr_assert(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "bind %s: %s", path, strerror(errno));
	cr_assert(listen(fd, 4096) == 0);
	return fd;
}

/* One EXE_JOB message: connect to target. */
static size_t job_msg(uint8_t *out, size_t cap, uint32_t id, const char *target)
{
	struct spaced_buf b;
	char args[300];
	snprintf(args, sizeof args, "{\"target\":\"%s\"}", target);
	spaced_buf_init(&b, EXE_MSG_MAX);
	cr_assert(spaced_field_put_str(&b, "connect") == 0 && spaced_field_put_str(&b, args) == 0);
	struct spaced_frame_hdr h = {.len = (uint32_t)b.len, .type = EXE_JOB, .id = id};
	cr_assert(SPACED_FRAME_HDR_LEN + b.len <= cap);
	spaced_frame_hdr_encode(out, &h);
	memcpy(out + SPACED_FRAME_HDR_LEN, b.data, b.len);
	size_t n = SPACED_FRAME_HDR_LEN + b.len;
	spaced_buf_free(&b);
	return n;
}

/* Reads the DONE messages waiting on link; notes job 1's status and
 * whether it came while jobs were still being written (*writing). */
static void read_answers(int link, bool writing, int *job1_status, int *job1_while_writing)
{
	for (;;) {
		uint8_t buf[4096];
		union {
			struct cmsghdr align;
			char b[CMSG_SPACE(sizeof(int))];
		} cb;
		struct iovec iov = {buf, sizeof buf};
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b, .msg_controllen = sizeof cb.b};
		ssize_t n = recvmsg(link, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		cr_assert(n >= SPACED_FRAME_HDR_LEN, "the executor closed its link (%zd: %s)", n, strerror(errno));
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
			if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
				int fd;
				memcpy(&fd, CMSG_DATA(c), sizeof fd);
				close(fd);
			}
		struct spaced_frame_hdr h;
		cr_assert(spaced_frame_hdr_decode(&h, buf, EXE_MSG_MAX) == 0 && h.type == EXE_DONE);
		cr_assert_eq(h.id, 1, "job %u answered (only job 1 can be)", h.id);
		struct spaced_field_reader r;
		int64_t st = 0;
		spaced_field_reader_init(&r, buf + SPACED_FRAME_HDR_LEN, h.len);
		spaced_field_get_i64(&r, &st);
		*job1_status = (int)st;
		*job1_while_writing = writing;
	}
}

Test(executor, connection_handed_over_while_jobs_keep_coming)
{
	char dir[] = "/tmp/test-executor-XXXXXX", a[200], b[200], none[200];
	cr_assert(mkdtemp(dir) != NULL);
	snprintf(a, sizeof a, "%s/bridge-a.sock", dir);
	snprintf(b, sizeof b, "%s/bridge-b.sock", dir);
	snprintf(none, sizeof none, "%s/no-bridge.sock", dir);
	int la = listen_at(a), lb = listen_at(b); /* b never accepts: its connections wait */
	int link[2];
	cr_assert(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, link) == 0);
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		/* the process substrate's names: connections wait for a HANDOFF */
		struct mgr_config cfg = {.state_dir = dir, .worker_id = "w", .launch_bin = "/bin/true",
		                         .host_bin = "/bin/true"};
		struct rlimit rl = {4096, 4096};
		setrlimit(RLIMIT_NOFILE, &rl); /* a connection waiting for each job */
		close(link[0]);
		_exit(executor_run(&cfg, link[1]));
	}
	close(link[1]);
	int gate = link[0];
	uint8_t msg[1024];
	size_t n = job_msg(msg, sizeof msg, 1, a);
	cr_assert(send(gate, msg, n, 0) == (ssize_t)n);
	/* the executor connected to bridge a (it waits for its HANDOFF) */
	struct pollfd pa = {.fd = la, .events = POLLIN};
	cr_assert(poll(&pa, 1, 10000) == 1, "the executor never connected to the bridge");
	int bridge = accept4(la, NULL, NULL, SOCK_CLOEXEC);
	cr_assert(bridge >= 0);

	/* jobs that each leave a connection waiting (bridge b never accepts),
	 * as a burst of creates leaves claims; bridge a hands over between
	 * the two halves */
	int job1_status = 1, job1_while_writing = -1;
	uint32_t id = 2;
	for (int k = 0; k < JOBS_BEFORE + JOBS_AFTER; k++) {
		n = job_msg(msg, sizeof msg, id++, b);
		for (;;) {
			ssize_t w = send(gate, msg, n, MSG_DONTWAIT);
			if (w == (ssize_t)n)
				break;
			cr_assert(w < 0 && (errno == EAGAIN || errno == EINTR), "send: %s", strerror(errno));
			struct pollfd p = {.fd = gate, .events = POLLIN | POLLOUT};
			poll(&p, 1, 1000);
			read_answers(gate, true, &job1_status, &job1_while_writing);
		}
		if (k == JOBS_BEFORE - 1) {
			/* the bridge hands over a connection (any descriptor) */
			uint8_t hdr[SPACED_FRAME_HDR_LEN];
			struct spaced_frame_hdr h = {.len = 0, .type = SPACED_HOST_HANDOFF, .id = 0};
			spaced_frame_hdr_encode(hdr, &h);
			int passed = open("/dev/null", O_RDONLY | O_CLOEXEC);
			union {
				struct cmsghdr align;
				char b[CMSG_SPACE(sizeof(int))];
			} cb;
			memset(&cb, 0, sizeof cb);
			struct iovec iov = {hdr, sizeof hdr};
			struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b, .msg_controllen = sizeof cb.b};
			struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(c), &passed, sizeof(int));
			cr_assert(sendmsg(bridge, &mh, MSG_NOSIGNAL) == (ssize_t)sizeof hdr);
			close(passed);
		}
		read_answers(gate, true, &job1_status, &job1_while_writing);
	}
	/* every job written: job 1 is answered by now or soon */
	for (int t = 0; t < 500 && job1_while_writing < 0; t++) {
		struct pollfd p = {.fd = gate, .events = POLLIN};
		poll(&p, 1, 10);
		read_answers(gate, false, &job1_status, &job1_while_writing);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	close(gate);
	close(bridge);
	close(la);
	close(lb);
	unlink(a);
	unlink(b);
	rmdir(dir);
	cr_assert(job1_while_writing >= 0, "the handed-over connection was never answered");
	cr_expect_eq(job1_status, 0, "the handed-over connection failed: %d", job1_status);
	/* answered at the turn it was handed over, while jobs kept coming */
	cr_expect(job1_while_writing == 1,
	          "the handed-over connection was answered only once the jobs stopped coming: the executor "
	          "ignored it while each turn brought a new job");
}
