/*
 * spaced-guest — the agent inside every execution: files, processes,
 * terminals and watches over the guest protocol (docs/guest-protocol.md).
 *
 *   spaced-guest --root DIR --identity TEXT --listen PATH
 *   spaced-guest --root DIR --control-fd N [--oom-fd M] [--identity TEXT]
 *   spaced-guest --root DIR [--identity TEXT] --vsock-port N [--vsock-control-port M]
 *                [--vsock-forward-port F]
 *
 * With --vsock-port (the qemu substrate: spaced-guest is PID 1 of a microVM,
 * docs/substrate.md) the guest listens on AF_VSOCK port N of any local CID;
 * the host reaches it through the VM's vsock device (spaced-vsockd and its
 * hybrid Unix socket, docs/vm-transport.md). With --vsock-forward-port it
 * also serves the VM's ServicePorts on vsock port F: "CONNECT <port>\n",
 * answered "OK <port>\n" once 127.0.0.1:<port> inside is connected (fwd.c).
 *
 * In control-fd mode, fd N is an AF_UNIX SOCK_SEQPACKET socket from the
 * launcher carrying "IDENTITY <canonical text>" (once, when --identity was not
 * given; again only for another activation of the same execution, S4) and "CONN <port>" with one connected stream socket (SCM_RIGHTS) per
 * message; the guest says "WAITING" when it starts without identity (a warm
 * pool's execution, ready to be claimed) and "READY" once it has one. When the control
 * socket closes the guest exits. With --service-ports, a CONN for any port
 * other than SPACED_GUEST_API_PORT is joined to 127.0.0.1:<port> (ServicePort). As PID 1 it reaps every zombie and ignores
 * the signals init ignores.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <linux/vm_sockets.h>

#include "spaced_error.h"
#include "guest.h"

struct guest G;

static bool verbose;
static char listen_path[sizeof(((struct sockaddr_un *)0)->sun_path)];

void guest_log(const char *fmt, ...)
{
	if (!verbose)
		return;
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "spaced-guest: ");
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

void guest_warn(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "spaced-guest: warning: ");
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

static void die(const char *what)
{
	fprintf(stderr, "spaced-guest: %s: %s\n", what, strerror(errno));
	exit(1);
}

/* The execution's identity: the first one, or the one it has under another
 * activation (S4); anything else is refused (SPACED_EPERM). */
static int set_identity(const char *text, size_t n)
{
	struct spaced_identity id, cur;
	int e = spaced_identity_decode(&id, text, n);
	if (e < 0)
		return e;
	if (G.have_identity && (spaced_identity_decode(&cur, G.identity, strlen(G.identity)) < 0 ||
	                        !spaced_identity_activation_change(&cur, &id)))
		return SPACED_EPERM;
	e = spaced_identity_encode(&id, G.identity, sizeof G.identity);
	if (e < 0)
		return e;
	G.have_identity = true;
	return 0;
}

static void control_send(const char *msg)
{
	if (send(G.control_fd, msg, strlen(msg), MSG_NOSIGNAL) < 0)
		guest_log("control send failed: %s", strerror(errno));
}

/* One launcher message. Returns false when the guest must stop. */
static bool control_readable(void)
{
	static char buf[16384 + 16];
	union {
		char b[CMSG_SPACE(8 * sizeof(int))];
		struct cmsghdr align;
	} cm;
	struct iovec iov = {.iov_base = buf, .iov_len = sizeof buf - 1};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b,
	                    .msg_controllen = sizeof cm.b};
	ssize_t n = recvmsg(G.control_fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	if (n < 0)
		return errno == EINTR || errno == EAGAIN;
	if (n == 0) {
		guest_log("control socket closed");
		G.exit_code = 0;
		return false;
	}
	int fds[8];
	size_t nfds = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c != NULL; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k && nfds < 8; i++)
			memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
	}
	buf[n] = 0;
	bool ok = true;
	int take = -1;
	if ((mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || memchr(buf, 0, (size_t)n) != NULL) {
		guest_warn("control: malformed message ignored");
	} else if (strncmp(buf, "IDENTITY ", 9) == 0) {
		/* once, or again for another activation of the same execution */
		int e = set_identity(buf + 9, (size_t)n - 9);
		if (e < 0) {
			fprintf(stderr, "spaced-guest: %s identity from the launcher\n",
			        e == SPACED_EPERM ? "a second, other" : "an invalid");
			G.exit_code = 2;
			ok = false;
		} else {
			guest_log("identity %s", G.identity);
			control_send("READY");
		}
	} else if (strncmp(buf, "CONFIG ", 7) == 0) {
		if (proc_config(buf + 7, (size_t)n - 7) < 0)
			guest_warn("control: malformed CONFIG ignored");
	} else if (strncmp(buf, "CONN ", 5) == 0) {
		char *end;
		errno = 0;
		unsigned long port = strtoul(buf + 5, &end, 10);
		int type = 0;
		socklen_t tl = sizeof type;
		if (errno || *end || end == buf + 5 || port > UINT32_MAX || nfds != 1)
			guest_warn("control: bad CONN message ignored");
		else if (getsockopt(fds[0], SOL_SOCKET, SO_TYPE, &type, &tl) < 0 || type != SOCK_STREAM)
			guest_warn("control: CONN fd is not a stream socket");
		else
			take = fds[0];
		if (take >= 0) {
			(void)fcntl(take, F_SETFL, fcntl(take, F_GETFL) | O_NONBLOCK);
			guest_log("control: connection for port %lu", port);
			if (G.service_ports && port != SPACED_GUEST_API_PORT)
				(void)fwd_start(take, (uint32_t)port);
			else
				(void)conn_new(take);
		}
	} else {
		guest_warn("control: unknown message ignored");
	}
	for (size_t i = 0; i < nfds; i++)
		if (fds[i] != take)
			close(fds[i]);
	return ok;
}

static void accept_all(void)
{
	for (;;) {
		int fd = accept4(G.listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR)
				continue;
			return;
		}
		(void)conn_new(fd);
	}
}

static bool signal_readable(void)
{
	struct signalfd_siginfo si;
	bool go_on = true;
	while (read(G.sig_fd, &si, sizeof si) == (ssize_t)sizeof si) {
		if (si.ssi_signo == SIGCHLD)
			continue;
		if ((si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) && !G.pid1) {
			guest_log("signal %u: exiting", si.ssi_signo);
			go_on = false;
		}
	}
	proc_on_sigchld();
	return go_on;
}

enum tag_kind { T_LISTEN, T_CONTROL, T_SIGNAL, T_CONN, T_WATCH, T_PROC_OUT, T_PROC_IN, T_FWD, T_VCTL_LISTEN, T_VCTL };

struct tag {
	enum tag_kind kind;
	void *ptr;
};

static struct pollfd *pfds;
static struct tag *tags;
static size_t pcap;

static void add_pfd(size_t *n, int fd, short events, enum tag_kind kind, void *ptr)
{
	if (*n == pcap) {
		size_t nc = pcap ? pcap * 2 : 16;
		struct pollfd *np = realloc(pfds, nc * sizeof *np);
		if (np == NULL)
			return;
		pfds = np;
		struct tag *nt = realloc(tags, nc * sizeof *nt);
		if (nt == NULL)
			return;
		tags = nt;
		pcap = nc;
	}
	pfds[*n] = (struct pollfd){.fd = fd, .events = events};
	tags[*n] = (struct tag){kind, ptr};
	(*n)++;
}

static size_t *fwd_n;

static void add_fwd_pfd(int fd, short ev, void *ptr)
{
	add_pfd(fwd_n, fd, ev, T_FWD, ptr);
}

static void add_vctl_pfd(int fd)
{
	add_pfd(fwd_n, fd, POLLIN, T_VCTL, NULL);
}

static bool conn_input_paused(const struct conn *c)
{
	for (const struct stream *s = c->streams; s != NULL; s = s->next)
		if (!s->dead && s->proc != NULL && s->proc->inq_len - s->proc->inq_off > GUEST_STDIN_HIGH)
			return true;
	return false;
}

static void loop(void)
{
	while (!G.quit) {
		size_t n = 0;
		bool pump = false;
		if (G.listen_fd >= 0)
			add_pfd(&n, G.listen_fd, POLLIN, T_LISTEN, NULL);
		if (G.control_fd >= 0)
			add_pfd(&n, G.control_fd, POLLIN, T_CONTROL, NULL);
		add_pfd(&n, G.sig_fd, POLLIN, T_SIGNAL, NULL);
		for (struct conn *c = G.conns; c != NULL; c = c->next) {
			if (c->dead)
				continue;
			bool paused = conn_input_paused(c) || c->rd_eof;
			short ev = paused ? 0 : POLLIN;
			if (!paused && conn_has_input(c))
				pump = true;
			if (c->oq_head != NULL || c->wblocked)
				ev |= POLLOUT;
			add_pfd(&n, c->fd, ev, T_CONN, c);
			bool room = c->oq_bytes < GUEST_OUT_HIGH && !c->wblocked;
			for (struct stream *s = c->streams; s != NULL; s = s->next) {
				if (s->dead || !room)
					continue;
				if (s->kind == ST_WATCH && s->watch != NULL)
					add_pfd(&n, watch_fd(s->watch), POLLIN, T_WATCH, s);
				if (s->kind == ST_READ && fs_read_ready(s))
					pump = true;
			}
		}
		for (struct proc *p = G.procs; p != NULL; p = p->next) {
			if (proc_output_allowed(p)) {
				if (p->out_fd >= 0)
					add_pfd(&n, p->out_fd, POLLIN, T_PROC_OUT, p);
				if (p->err_fd >= 0)
					add_pfd(&n, p->err_fd, POLLIN, T_PROC_OUT, p);
			}
			if (p->in_fd >= 0 && p->inq_off < p->inq_len)
				add_pfd(&n, p->in_fd, POLLOUT, T_PROC_IN, p);
		}
		fwd_n = &n;
		fwd_poll_add(add_fwd_pfd);
		if (G.vctl_fd >= 0)
			add_pfd(&n, G.vctl_fd, POLLIN, T_VCTL_LISTEN, NULL);
		vctl_poll_add(add_vctl_pfd);
		int timeout = -1;
		uint64_t dl = proc_next_deadline(), fdl = fwd_next_deadline();
		if (fdl != 0 && (dl == 0 || fdl < dl))
			dl = fdl;
		if (pump) {
			timeout = 0;
		} else if (dl != 0) {
			uint64_t now = spaced_mono_ns();
			uint64_t ms = dl > now ? (dl - now) / 1000000u + 1 : 0;
			timeout = ms > INT_MAX ? INT_MAX : (int)ms;
		}
		int r = poll(pfds, n, timeout);
		if (r < 0 && errno != EINTR)
			die("poll");
		for (size_t i = 0; r > 0 && i < n && !G.quit; i++) {
			short re = pfds[i].revents;
			if (re == 0)
				continue;
			struct tag t = tags[i];
			switch (t.kind) {
			case T_LISTEN:
				accept_all();
				break;
			case T_CONTROL:
				if (!control_readable())
					G.quit = true;
				break;
			case T_SIGNAL:
				if (!signal_readable())
					G.quit = true;
				break;
			case T_CONN: {
				struct conn *c = t.ptr;
				if (!c->dead && (re & POLLOUT))
					conn_on_writable(c);
				if (!c->dead && (re & (POLLIN | POLLHUP | POLLERR)))
					conn_on_readable(c);
				break;
			}
			case T_WATCH: {
				struct stream *s = t.ptr;
				if (!s->dead && s->watch != NULL)
					watch_on_readable(s->watch);
				break;
			}
			case T_PROC_OUT: {
				struct proc *p = t.ptr;
				if (pfds[i].fd == p->out_fd || pfds[i].fd == p->err_fd)
					proc_on_output(p, pfds[i].fd);
				break;
			}
			case T_FWD:
				fwd_on_event(t.ptr, pfds[i].fd, re);
				break;
			case T_VCTL_LISTEN:
				vctl_accept();
				break;
			case T_VCTL:
				vctl_on_readable(pfds[i].fd);
				break;
			case T_PROC_IN: {
				struct proc *p = t.ptr;
				if (pfds[i].fd == p->in_fd)
					proc_on_stdin_writable(p);
				break;
			}
			}
		}
		for (struct conn *c = G.conns; c != NULL; c = c->next) {
			if (!c->dead && conn_has_input(c) && !conn_input_paused(c))
				conn_parse(c);
			for (struct stream *s = c->streams; s != NULL; s = s->next)
				for (int k = 0; k < 16 && !s->dead && s->kind == ST_READ && fs_read_ready(s); k++)
					fs_read_pump(s);
			if (!c->dead && c->oq_head != NULL)
				conn_on_writable(c);
			if (conn_done(c))
				conn_kill(c, "peer closed");
		}
		proc_check_timeouts(spaced_mono_ns());
		guest_reap_dead();
		fwd_reap();
	}
}

static void setup_signals(void)
{
	signal(SIGPIPE, SIG_IGN);
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
		die("sigprocmask");
	G.sig_fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
	if (G.sig_fd < 0)
		die("signalfd");
	if (G.pid1) {
		/* init ignores what it does not handle; so does the guest */
		int ign[] = {SIGUSR1, SIGUSR2, SIGQUIT, SIGALRM, SIGTSTP, SIGTTIN, SIGTTOU};
		for (size_t i = 0; i < sizeof ign / sizeof ign[0]; i++)
			signal(ign[i], SIG_IGN);
	}
}

static void open_listener(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof sa.sun_path) {
		fprintf(stderr, "spaced-guest: --listen path too long\n");
		exit(1);
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	struct stat st;
	if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
		(void)unlink(path);
	G.listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (G.listen_fd < 0)
		die("socket");
	mode_t old = umask(077);
	if (bind(G.listen_fd, (struct sockaddr *)&sa, sizeof sa) < 0)
		die("bind");
	umask(old);
	if (listen(G.listen_fd, 64) < 0)
		die("listen");
	memcpy(listen_path, path, strlen(path) + 1);
}

int guest_vsock_listen(unsigned port, int backlog)
{
	struct sockaddr_vm sa = {.svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_ANY, .svm_port = port};
	int fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return SPACED_ESYS;
	if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, backlog) < 0) {
		close(fd);
		return SPACED_ESYS;
	}
	return fd;
}

static void usage(void)
{
	fprintf(stderr, "usage: spaced-guest [--root DIR] [--identity TEXT] "
	                "(--listen PATH | --control-fd N | --vsock-port N [--vsock-control-port M] [--vsock-forward-port F])\n"
	                "       [--oom-fd N] [--service-ports] [--verbose]\n");
	exit(64);
}

int main(int argc, char **argv)
{
	const char *root = "/", *identity = NULL, *listen = NULL;
	long control = -1, oomfd = -1;
	unsigned long vsock_port = 0, vctl_port = 0, vfwd_port = 0;
	static const struct option opts[] = {
		{"root", required_argument, NULL, 'r'},
		{"identity", required_argument, NULL, 'i'},
		{"listen", required_argument, NULL, 'l'},
		{"control-fd", required_argument, NULL, 'c'},
		{"oom-fd", required_argument, NULL, 'o'},
		{"verbose", no_argument, NULL, 'v'},
		{"service-ports", no_argument, NULL, 'p'},
		{"vsock-port", required_argument, NULL, 'V'},
		{"vsock-control-port", required_argument, NULL, 'K'},
		{"vsock-forward-port", required_argument, NULL, 'F'},
		{NULL, 0, NULL, 0},
	};
	int o;
	while ((o = getopt_long(argc, argv, "r:i:l:c:o:vpV:K:F:", opts, NULL)) != -1) {
		char *end;
		switch (o) {
		case 'r':
			root = optarg;
			break;
		case 'i':
			identity = optarg;
			break;
		case 'l':
			listen = optarg;
			break;
		case 'c':
			errno = 0;
			control = strtol(optarg, &end, 10);
			if (errno || *end || control < 0 || control > INT_MAX)
				usage();
			break;
		case 'o':
			errno = 0;
			oomfd = strtol(optarg, &end, 10);
			if (errno || *end || oomfd < 0 || oomfd > INT_MAX)
				usage();
			break;
		case 'v':
			verbose = true;
			break;
		case 'p':
			G.service_ports = true;
			break;
		case 'V':
			errno = 0;
			vsock_port = strtoul(optarg, &end, 10);
			if (errno || *end || optarg[0] < '1' || optarg[0] > '9' || vsock_port >= VMADDR_PORT_ANY)
				usage();
			break;
		case 'K':
			errno = 0;
			vctl_port = strtoul(optarg, &end, 10);
			if (errno || *end || optarg[0] < '1' || optarg[0] > '9' || vctl_port >= VMADDR_PORT_ANY)
				usage();
			break;
		case 'F':
			errno = 0;
			vfwd_port = strtoul(optarg, &end, 10);
			if (errno || *end || optarg[0] < '1' || optarg[0] > '9' || vfwd_port >= VMADDR_PORT_ANY)
				usage();
			break;
		default:
			usage();
		}
	}
	if (optind != argc || (listen == NULL && control < 0 && vsock_port == 0) ||
	    (vsock_port != 0 && (listen != NULL || control >= 0 || (identity == NULL && vctl_port == 0))) ||
	    (vctl_port != 0 && (vsock_port == 0 || vctl_port == vsock_port)) ||
	    (vfwd_port != 0 && (vsock_port == 0 || vfwd_port == vsock_port || vfwd_port == vctl_port)))
		usage();
	G.listen_fd = G.control_fd = G.vctl_fd = -1;
	G.oom_fd = (int)oomfd;
	if (G.oom_fd >= 0)
		(void)fcntl(G.oom_fd, F_SETFD, FD_CLOEXEC);
	G.pid1 = getpid() == 1;
	if (identity != NULL && set_identity(identity, strlen(identity)) < 0) {
		fprintf(stderr, "spaced-guest: invalid --identity\n");
		return 1;
	}
	G.rootfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (G.rootfd < 0)
		die("open root");
	if (realpath(root, G.root) == NULL)
		die("realpath root");
	int probe;
	int e = fs_resolve(".", O_PATH | O_DIRECTORY, 0, &probe);
	if (e < 0) {
		errno = -e;
		die("openat2");
	}
	close(probe);
	setup_signals();
	if (control >= 0) {
		G.control_fd = (int)control;
		int type = 0;
		socklen_t tl = sizeof type;
		if (getsockopt(G.control_fd, SOL_SOCKET, SO_TYPE, &type, &tl) < 0 ||
		    type != SOCK_SEQPACKET) {
			fprintf(stderr, "spaced-guest: --control-fd is not a SOCK_SEQPACKET socket\n");
			return 1;
		}
		(void)fcntl(G.control_fd, F_SETFD, FD_CLOEXEC);
	}
	if (listen != NULL)
		open_listener(listen);
	if (vsock_port != 0 && (G.listen_fd = guest_vsock_listen((unsigned)vsock_port, 64)) < 0)
		die("listen on the vsock port");
	if (vctl_port != 0 && vctl_listen((unsigned)vctl_port) < 0)
		die("listen on the vsock control port");
	if (vfwd_port != 0 && fwd_vsock_listen((unsigned)vfwd_port) < 0)
		die("listen on the vsock forward port");
	if (G.control_fd >= 0)
		control_send(G.have_identity ? "READY" : "WAITING");
	if (listen != NULL) {
		printf("READY %s\n", listen);
		fflush(stdout);
	} else if (vsock_port != 0) {
		printf("spaced-guest: %s vsock port %lu\n", G.have_identity ? "READY" : "WAITING", vsock_port);
		fflush(stdout);
	}
	loop();
	proc_kill_all();
	if (listen_path[0])
		(void)unlink(listen_path);
	return G.exit_code;
}
