/*
 * vctl.c — the guest's control port inside a microVM (qemu substrate).
 *
 * With --vsock-control-port N, spaced-guest also listens on AF_VSOCK port N
 * for its supervisor on the host (spaced-vm, through the VM's vsock device),
 * the counterpart of the launcher's control socket in the process substrate.
 * One line per message, at most VCTL_LINE_MAX bytes with the newline:
 *
 *   STATUS            -> "READY <identity>" | "WAITING"
 *   IDENTITY <text>   -> "READY" | "ERR <reason>"
 *   PIDS <n>|max      -> "OK" | "ERR <reason>": the tasks limit of the guest's
 *                        cgroup holding PID 1 and all it starts (/init made
 *                        it); a VM made from a template gets its limit so
 *   NET <a.b.c.d>/<prefix> <gateway>
 *                     -> "OK" | "ERR <reason>": eth0's address, the default route
 *                        and /etc/resolv.conf (the gateway is the sandbox's
 *                        resolver); a VM made from saved memory learns the
 *                        egress link of the worker it now runs on
 *   TRIM              -> "OK" once the guest dropped its clean caches (before a
 *                        template is saved: nothing of them is kept for every
 *                        VM made from it)
 *   CONFIG <json>     -> "OK" | "ERR <reason>": the sandbox's settings for what
 *                        it runs (env, workdir, user), as the launcher's
 *                        CONFIG in the process substrate (proc_config)
 *   TASKS             -> "OK <n>" | "ERR <reason>": the tasks in that cgroup now
 *                        (pids.current; what `spacectl top` shows, as the
 *                        guest reports it)
 *   SYNC              -> "SYNCED" once sync(2) returned: the guest's dirty
 *                        pages are on its disk (before a pause or snapshot;
 *                        no process is started for it, so it works at the
 *                        pids limit too)
 *
 * An identity is taken when the guest has none (a VM booted as a template, or
 * restored from one) or when it names the same sandbox with a strictly
 * greater generation (a VM restored from a memory snapshot is a new
 * execution, I2): never an older incarnation, never another sandbox once it
 * has one. Anything else closes that control connection; the guest goes on.
 * Only host programs that can reach the VM's vsock socket (root, or the
 * execution's own uid) can connect; what the guest claims is checked by every
 * bridge anyway (B2).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <linux/vm_sockets.h>

#include "spaced_error.h"
#include "guest.h"

#define VCTL_LINE_MAX 16384 /* a CONFIG of up to 12 KiB (spaced-node's MGR_CONFIG_MAX) */
#define VCTL_MAX 4

struct vctl {
	int fd;
	size_t len;
	char buf[VCTL_LINE_MAX];
};

static struct vctl vc[VCTL_MAX];
static int nvc;

int vctl_listen(unsigned port)
{
	int fd = guest_vsock_listen(port, 4);
	if (fd < 0)
		return fd;
	G.vctl_fd = fd;
	return 0;
}

void vctl_accept(void)
{
	for (;;) {
		struct sockaddr_vm peer;
		socklen_t pl = sizeof peer;
		int fd = accept4(G.vctl_fd, (struct sockaddr *)&peer, &pl, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return;
		/* the supervisor is on the host (CID 2); nothing else may steer the guest */
		if (pl < sizeof peer || peer.svm_cid != VMADDR_CID_HOST || nvc >= VCTL_MAX) {
			close(fd);
			continue;
		}
		vc[nvc].fd = fd;
		vc[nvc].len = 0;
		nvc++;
	}
}

static void reply(int fd, const char *text)
{
	char line[VCTL_LINE_MAX + 2];
	int n = snprintf(line, sizeof line, "%s\n", text);
	if (n > 0)
		(void)send(fd, line, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* Takes a new identity under the rules above. */
static int take_identity(const char *text, size_t n, char *why, size_t whysz)
{
	struct spaced_identity id, cur;
	if (spaced_identity_decode(&id, text, n) < 0) {
		snprintf(why, whysz, "not a canonical execution identity");
		return SPACED_EINVAL;
	}
	if (G.have_identity && spaced_identity_decode(&cur, G.identity, strlen(G.identity)) == 0 &&
	    (strcmp(cur.sandbox, id.sandbox) != 0 || id.generation < cur.generation ||
	     (id.generation == cur.generation && !spaced_identity_activation_change(&cur, &id)))) {
		snprintf(why, whysz,
		         "only a newer generation of %s, or generation %llu under another activation, may follow it",
		         cur.sandbox, (unsigned long long)cur.generation);
		return SPACED_EPERM;
	}
	if (spaced_identity_encode(&id, G.identity, sizeof G.identity) < 0) {
		snprintf(why, whysz, "identity too long");
		return SPACED_EINVAL;
	}
	G.have_identity = true;
	guest_log("identity %s (from the control port)", G.identity);
	return 0;
}

/* Sets eth0 to addr/prefix, the default route via gw, and /etc/resolv.conf. */
static int net_config(const char *spec, char *why, size_t whysz)
{
	char a[32], g[32], extra;
	unsigned prefix;
	struct in_addr ia, ig;
	if (sscanf(spec, "%31[0-9.]/%u %31[0-9.]%c", a, &prefix, g, &extra) != 3 || prefix < 8 || prefix > 30 ||
	    inet_pton(AF_INET, a, &ia) != 1 || inet_pton(AF_INET, g, &ig) != 1) {
		snprintf(why, whysz, "NET wants ADDRESS/PREFIX GATEWAY");
		return SPACED_EINVAL;
	}
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return SPACED_ESYS;
	struct ifreq ifr;
	memset(&ifr, 0, sizeof ifr);
	snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "eth0");
	int e = 0;
	/* down and up again: the neighbours of the previous link are forgotten */
	if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0) {
		snprintf(why, whysz, "no eth0: %s", strerror(errno));
		close(s);
		return SPACED_ENOENT;
	}
	ifr.ifr_flags &= (short)~IFF_UP;
	(void)ioctl(s, SIOCSIFFLAGS, &ifr);
	ifr.ifr_mtu = 65520; /* the egress link's (pasta's segments) */
	(void)ioctl(s, SIOCSIFMTU, &ifr);
	struct sockaddr_in *sin = (struct sockaddr_in *)&ifr.ifr_addr;
	memset(&ifr.ifr_addr, 0, sizeof ifr.ifr_addr);
	sin->sin_family = AF_INET;
	sin->sin_addr = ia;
	if (ioctl(s, SIOCSIFADDR, &ifr) < 0)
		e = SPACED_ESYS;
	sin->sin_addr.s_addr = htonl(0xffffffffu << (32 - prefix));
	if (e == 0 && ioctl(s, SIOCSIFNETMASK, &ifr) < 0)
		e = SPACED_ESYS;
	if (e == 0 && ioctl(s, SIOCGIFFLAGS, &ifr) == 0) {
		ifr.ifr_flags |= IFF_UP;
		if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
			e = SPACED_ESYS;
	}
	if (e == 0) {
		struct rtentry rt;
		memset(&rt, 0, sizeof rt);
		((struct sockaddr_in *)&rt.rt_dst)->sin_family = AF_INET;
		((struct sockaddr_in *)&rt.rt_genmask)->sin_family = AF_INET;
		((struct sockaddr_in *)&rt.rt_gateway)->sin_family = AF_INET;
		((struct sockaddr_in *)&rt.rt_gateway)->sin_addr = ig;
		rt.rt_flags = RTF_UP | RTF_GATEWAY;
		rt.rt_dev = ifr.ifr_name;
		(void)ioctl(s, SIOCDELRT, &rt); /* the previous one, if any */
		if (ioctl(s, SIOCADDRT, &rt) < 0 && errno != EEXIST)
			e = SPACED_ESYS;
	}
	if (e < 0)
		snprintf(why, whysz, "configuring eth0: %s", strerror(errno));
	close(s);
	if (e == 0) {
		/* the sandbox's resolver; replaced, never followed */
		int etc = openat(G.rootfd, "etc", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		int fd = -1;
		if (etc >= 0) {
			unlinkat(etc, "resolv.conf", 0);
			fd = openat(etc, "resolv.conf", O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
		}
		char text[128];
		int n = snprintf(text, sizeof text, "# the sandbox's resolver (spaced)\nnameserver %s\noptions edns0\n", g);
		if (fd < 0 || write(fd, text, (size_t)n) != n) {
			snprintf(why, whysz, "cannot write /etc/resolv.conf");
			e = SPACED_EIO;
		}
		if (fd >= 0)
			close(fd);
		if (etc >= 0)
			close(etc);
	}
	return e;
}

/* One line from the supervisor. Returns false when the connection must close. */
static bool vctl_line(int fd, char *line, size_t n)
{
	char why[160];
	if (n == 6 && memcmp(line, "STATUS", 6) == 0) {
		char out[VCTL_LINE_MAX];
		if (G.have_identity)
			snprintf(out, sizeof out, "READY %s", G.identity);
		else
			snprintf(out, sizeof out, "WAITING");
		reply(fd, out);
		return true;
	}
	if (n > 5 && memcmp(line, "PIDS ", 5) == 0) {
		const char *v = line + 5;
		size_t vl = n - 5;
		bool ok = vl < 20;
		if (ok && !(vl == 3 && memcmp(v, "max", 3) == 0))
			for (size_t i = 0; i < vl; i++)
				ok = ok && v[i] >= '0' && v[i] <= '9';
		if (ok) {
			char val[24];
			memcpy(val, v, vl);
			val[vl] = '\n';
			int f = open("/sys/fs/cgroup/sandbox/pids.max", O_WRONLY | O_CLOEXEC);
			ok = f >= 0 && write(f, val, vl + 1) == (ssize_t)(vl + 1);
			if (f >= 0)
				close(f);
		}
		reply(fd, ok ? "OK" : "ERR cannot set pids.max");
		return true;
	}
	if (n > 4 && memcmp(line, "NET ", 4) == 0) {
		char out[VCTL_LINE_MAX], spec[128];
		if (n - 4 >= sizeof spec) {
			reply(fd, "ERR NET wants ADDRESS/PREFIX GATEWAY");
			return true;
		}
		memcpy(spec, line + 4, n - 4);
		spec[n - 4] = '\0';
		if (net_config(spec, why, sizeof why) < 0) {
			snprintf(out, sizeof out, "ERR %s", why);
			reply(fd, out);
		} else {
			reply(fd, "OK");
		}
		return true;
	}
	if (n == 4 && memcmp(line, "TRIM", 4) == 0) {
		sync();
		int f = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
		bool ok = f >= 0 && write(f, "3\n", 2) == 2;
		if (f >= 0)
			close(f);
		f = open("/proc/sys/vm/compact_memory", O_WRONLY | O_CLOEXEC);
		if (f >= 0) {
			(void)!write(f, "1\n", 2);
			close(f);
		}
		reply(fd, ok ? "OK" : "ERR cannot drop the caches");
		return true;
	}
	if (n > 7 && memcmp(line, "CONFIG ", 7) == 0) {
		reply(fd, proc_config(line + 7, n - 7) == 0 ? "OK" : "ERR malformed CONFIG");
		return true;
	}
	if (n == 5 && memcmp(line, "TASKS", 5) == 0) {
		char val[32] = "", out[48];
		int f = open("/sys/fs/cgroup/sandbox/pids.current", O_RDONLY | O_CLOEXEC);
		ssize_t k = f >= 0 ? read(f, val, sizeof val - 1) : -1;
		if (f >= 0)
			close(f);
		char *end = NULL;
		unsigned long long t = 0;
		if (k > 0) {
			val[k] = '\0';
			t = strtoull(val, &end, 10);
		}
		if (k > 0 && end != val && (*end == '\n' || *end == '\0'))
			snprintf(out, sizeof out, "OK %llu", t);
		else
			snprintf(out, sizeof out, "ERR cannot read pids.current");
		reply(fd, out);
		return true;
	}
	if (n == 4 && memcmp(line, "SYNC", 4) == 0) {
		sync();
		reply(fd, "SYNCED");
		return true;
	}
	if (n > 9 && memcmp(line, "IDENTITY ", 9) == 0) {
		if (take_identity(line + 9, n - 9, why, sizeof why) < 0) {
			char out[VCTL_LINE_MAX];
			snprintf(out, sizeof out, "ERR %s", why);
			reply(fd, out);
			return true;
		}
		reply(fd, "READY");
		return true;
	}
	guest_warn("control port: unknown message, connection closed");
	return false;
}

/* Reads what is there; returns false when the connection is done. */
static bool vctl_read(struct vctl *v)
{
	for (;;) {
		ssize_t r = recv(v->fd, v->buf + v->len, sizeof v->buf - v->len, MSG_DONTWAIT);
		if (r < 0 && (errno == EAGAIN || errno == EINTR))
			return true;
		if (r <= 0)
			return false;
		v->len += (size_t)r;
		char *nl;
		while ((nl = memchr(v->buf, '\n', v->len)) != NULL) {
			size_t n = (size_t)(nl - v->buf);
			if (memchr(v->buf, '\0', n) != NULL || !vctl_line(v->fd, v->buf, n))
				return false;
			memmove(v->buf, nl + 1, v->len - n - 1);
			v->len -= n + 1;
		}
		if (v->len == sizeof v->buf) {
			guest_warn("control port: line too long, connection closed");
			return false;
		}
	}
}

void vctl_on_readable(int fd)
{
	for (int i = 0; i < nvc; i++) {
		if (vc[i].fd != fd)
			continue;
		if (!vctl_read(&vc[i])) {
			close(vc[i].fd);
			vc[i] = vc[--nvc];
		}
		return;
	}
}

void vctl_poll_add(void (*add)(int fd))
{
	for (int i = 0; i < nvc; i++)
		add(vc[i].fd);
}
