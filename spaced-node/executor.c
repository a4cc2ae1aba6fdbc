/*
 * executor.c — the executor process of sbx-manager (executor.h).
 *
 * One poll() loop over: the link to the gate, the bridge connections being
 * made (connect jobs), the result pipes of the job children, and a signalfd
 * for SIGCHLD (the executor is a child subreaper: launchers and bridges whose
 * job child has exited are its children, and it reaps them).
 */
#include "executor.h"
#include "fetch.h"
#include "links.h"
#include "log.h"
#include "mgr.h"
#include "net.h"
#include "node.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sodium.h>

#include "spaced_error.h"
#include "frame.h"
#include "guest_proto.h"
#include "host_client.h"
#include "pidref.h"
#include "rootfs.h"
#include "treehash.h"

#define EXE_MAX_CHILDREN 64   /* job children at once by default (--executor-jobs); more wait their turn */
#define EXE_MAX_CONNECTS 1024 /* bridge connections being made at once */
#define EXE_RESULT_MAX (48u * 1024u)
#define EXE_MAX_CLAIMS 256    /* pooled executions being claimed at once */
#define EXE_CLAIM_TIMEOUT_MS 5000

/* A job running in a child process. */
struct xjob {
	struct xjob *next;
	uint32_t id;
	pid_t pid;
	int rfd; /* the child's result pipe; -1 once read to its end */
	struct spaced_buf out;
	char kind[16];
	bool bulk;    /* a snapshot's or a stage's (job_bulk) */
	char tenant[SPACED_NAME_MAX]; /* whose sandbox it serves ("": the worker's own, the pool's) */
	json_t *args; /* while it waits for a free child slot */
};

/* A connection to an execution being made. */
struct xconn {
	struct xconn *next;
	uint32_t id;
	int fd;
	uint64_t deadline;
	int slot;         /* its place in this turn's poll array; -1 when made after the poll */
	bool handoff;     /* wait for the bridge's HANDOFF frame */
	bool connected;   /* connect(2) completed */
	uint8_t hdr[SPACED_FRAME_HDR_LEN];
	size_t hlen;
	int passed;       /* the descriptor that came with the frame */
	uint8_t payload[2048];
	size_t plen, want;
};

/* A pooled execution being claimed (pool.h): its identity sent, the
 * launcher's answer awaited on fd. Done in this loop, not in a child, when
 * the claim waits for nothing (mgr_pool_claim_inline): a few small writes
 * and one read. */
struct xclaim {
	struct xclaim *next;
	uint32_t id;
	int fd;
	int slot;    /* its place in this turn's poll array; -1 when made after the poll */
	uint64_t deadline;
	int answers; /* the launcher's answers still to come */
	json_t *rec; /* the result */
	char exec_name[sizeof ((struct mgr_rec *)0)->exec_name]; /* mgr_pool_claim_ended */
	int gateway; /* its ServicePort gateway's port, 0 without one */
};

struct executor {
	const struct mgr_config *cfg;
	int link;
	int sigfd;
	struct xjob *jobs, *waiting;
	size_t nchildren, max_children;
	size_t nbulk, max_bulk; /* bulk jobs' children, and how many at most (job_bulk) */
	struct xconn *conns;
	size_t nconns;
	struct xclaim *claims;
	size_t nclaims;
};

static void xlog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void xlog(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	spaced_vlog("executor", fmt, ap);
	va_end(ap);
}

/* ---- to the gate ---- */

/* One DONE message, with fd (>= 0) passed along. The gate reads its link
 * promptly; a full link is waited for. */
static void send_done(struct executor *x, uint32_t id, int status, const char *msg, const char *result, int fd)
{
	struct spaced_buf b;
	uint8_t hdr[SPACED_FRAME_HDR_LEN];
	spaced_buf_init(&b, EXE_MSG_MAX - SPACED_FRAME_HDR_LEN);
	if (spaced_field_put_i64(&b, status) < 0 || spaced_field_put_str(&b, msg ? msg : "") < 0 ||
	    spaced_field_put_str(&b, result && *result ? result : "{}") < 0) {
		/* too large or no memory: the job still ends, with an error */
		b.len = 0;
		spaced_field_put_i64(&b, SPACED_ETOOBIG);
		spaced_field_put_str(&b, "job result too large");
		spaced_field_put_str(&b, "{}");
	}
	struct spaced_frame_hdr h = {.len = (uint32_t)b.len, .type = EXE_DONE, .flags = SPACED_FRAME_F_END, .id = id};
	spaced_frame_hdr_encode(hdr, &h);
	struct iovec iov[2] = {{hdr, sizeof hdr}, {b.data, b.len}};
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int))];
	} cb;
	struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
	if (fd >= 0) {
		memset(&cb, 0, sizeof cb);
		mh.msg_control = cb.buf;
		mh.msg_controllen = sizeof cb.buf;
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	while (sendmsg(x->link, &mh, MSG_NOSIGNAL) < 0 && errno == EINTR)
		;
	spaced_buf_free(&b);
}

/* ---- connect jobs ---- */

static void conn_finish(struct executor *x, struct xconn *c, int status, const char *why, int fd)
{
	send_done(x, c->id, status, why, NULL, fd);
	if (fd >= 0)
		close(fd);
	if (c->fd >= 0 && c->fd != fd)
		close(c->fd);
	if (c->passed >= 0 && c->passed != fd)
		close(c->passed);
	c->fd = -1;
	c->passed = -1;
}

static void conn_start(struct executor *x, uint32_t id, json_t *args)
{
	json_t *target = json_object_get(args, "target"), *port = json_object_get(args, "port");
	struct xconn *c = calloc(1, sizeof *c);
	if (!c) {
		send_done(x, id, SPACED_ENOMEM, "out of memory", NULL, -1);
		return;
	}
	c->id = id;
	c->fd = -1;
	c->passed = -1;
	c->slot = -1;
	c->deadline = spaced_mono_ns() + (uint64_t)EXE_CONNECT_TIMEOUT_MS * 1000000u;
	int r;
	if (json_is_string(target)) {
		struct sockaddr_un sa = {.sun_family = AF_UNIX};
		if (json_string_length(target) >= sizeof sa.sun_path) {
			conn_finish(x, c, SPACED_EINVAL, "target path too long", -1);
			free(c);
			return;
		}
		memcpy(sa.sun_path, json_string_value(target), json_string_length(target) + 1);
		/* through a bridge (substrate mode), a verified connection is handed over */
		c->handoff = x->cfg->launch_bin && x->cfg->host_bin;
		c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		r = c->fd < 0 ? -1 : connect(c->fd, (struct sockaddr *)&sa, sizeof sa);
	} else if (json_is_integer(port) && json_integer_value(port) > 0 && json_integer_value(port) < 65536) {
		/* a development execution shares the host's network */
		struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)json_integer_value(port)),
		                         .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
		c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		r = c->fd < 0 ? -1 : connect(c->fd, (struct sockaddr *)&sa, sizeof sa);
	} else {
		conn_finish(x, c, SPACED_EINVAL, "connect needs a target or a port", -1);
		free(c);
		return;
	}
	if (r < 0 && errno != EINPROGRESS && errno != EAGAIN) {
		char why[160];
		snprintf(why, sizeof why, "execution unreachable: %s", strerror(errno));
		conn_finish(x, c, SPACED_ECLOSED, why, -1);
		free(c);
		return;
	}
	c->connected = r == 0;
	if (c->connected && !c->handoff) {
		/* nothing to wait for: the connection is the execution's */
		int fl = fcntl(c->fd, F_GETFL);
		fcntl(c->fd, F_SETFL, fl & ~O_NONBLOCK);
		conn_finish(x, c, 0, "", c->fd);
		free(c);
		return;
	}
	c->next = x->conns;
	x->conns = c;
	x->nconns++;
}

/* Progress on c; true when it is finished. */
static bool conn_step(struct executor *x, struct xconn *c, short revents)
{
	if (!c->connected) {
		int err = 0;
		socklen_t el = sizeof err;
		if (!(revents & (POLLOUT | POLLERR | POLLHUP)))
			return false;
		if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0 || err != 0) {
			conn_finish(x, c, SPACED_ECLOSED, "execution unreachable", -1);
			return true;
		}
		c->connected = true;
	}
	if (!c->handoff) {
		int fl = fcntl(c->fd, F_GETFL);
		fcntl(c->fd, F_SETFL, fl & ~O_NONBLOCK);
		conn_finish(x, c, 0, "", c->fd);
		return true;
	}
	if (!(revents & (POLLIN | POLLERR | POLLHUP)))
		return false;
	/* the bridge's answer: one frame, the verified connection with it */
	while (c->hlen < sizeof c->hdr) {
		union {
			struct cmsghdr align;
			char b[CMSG_SPACE(sizeof(int) * 4)];
		} cb;
		struct iovec iov = {c->hdr + c->hlen, sizeof c->hdr - c->hlen};
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b, .msg_controllen = sizeof cb.b};
		ssize_t n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return false;
		for (struct cmsghdr *m = CMSG_FIRSTHDR(&mh); n > 0 && m; m = CMSG_NXTHDR(&mh, m)) {
			if (m->cmsg_level != SOL_SOCKET || m->cmsg_type != SCM_RIGHTS)
				continue;
			for (size_t i = 0; i < (m->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
				int got;
				memcpy(&got, CMSG_DATA(m) + i * sizeof(int), sizeof(int));
				if (c->passed < 0)
					c->passed = got;
				else
					close(got); /* one descriptor only */
			}
		}
		if (n <= 0) {
			conn_finish(x, c, SPACED_ECLOSED, "the bridge closed the connection", -1);
			return true;
		}
		c->hlen += (size_t)n;
		if (c->hlen == sizeof c->hdr) {
			struct spaced_frame_hdr h;
			if (spaced_frame_hdr_decode(&h, c->hdr, sizeof c->payload) < 0) {
				conn_finish(x, c, SPACED_EPROTO, "malformed answer from the bridge", -1);
				return true;
			}
			c->want = h.len;
		}
	}
	while (c->plen < c->want) {
		ssize_t n = recv(c->fd, c->payload + c->plen, c->want - c->plen, MSG_DONTWAIT);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return false;
		if (n <= 0) {
			conn_finish(x, c, SPACED_ECLOSED, "the bridge closed the connection", -1);
			return true;
		}
		c->plen += (size_t)n;
	}
	struct spaced_frame_hdr h;
	spaced_frame_hdr_decode(&h, c->hdr, sizeof c->payload);
	if (h.type == SPACED_HOST_HANDOFF && h.id == 0 && c->passed >= 0) {
		int fd = c->passed;
		c->passed = -1;
		conn_finish(x, c, 0, "", fd);
		return true;
	}
	/* a refusal: RESULT with a negative status and the reason */
	struct spaced_field_reader rd;
	int64_t status = SPACED_EPROTO;
	char why[512] = "unexpected answer from the bridge";
	spaced_field_reader_init(&rd, c->payload, c->plen);
	if (h.type != SPACED_GUEST_OUT_RESULT || spaced_field_get_i64(&rd, &status) < 0 || status >= 0 ||
	    spaced_field_get_strbuf(&rd, why, sizeof why) < 0)
		status = SPACED_EPROTO;
	xlog("level=warn event=bridge-refused reason=\"%s\"", why);
	conn_finish(x, c, (int)status, why, -1);
	return true;
}

/* ---- claims of pooled executions ---- */

/* Claims in this loop when the claim waits for nothing; false (nothing
 * done, nothing answered) when it is a job for a child. */
static bool claim_start(struct executor *x, uint32_t id, json_t *args)
{
	struct mgr_rec rec;
	char why[512] = "";
	int fd = -1, gw = 0;
	json_t *jr = json_object_get(args, "rec");
	if (!jr || mgr_rec_from_json(jr, &rec) < 0) {
		send_done(x, id, SPACED_EINVAL, "malformed record", NULL, -1);
		return true;
	}
	if (x->nclaims >= EXE_MAX_CLAIMS || !mgr_pool_claim_inline(x->cfg, &rec, json_object_get(args, "network")))
		return false;
	/* the slot is the sandbox's before its identity goes out, as a job's
	 * claim with a policy of its own does it */
	int e = net_claim_as(x->cfg, &rec, NET_CLAIM_QUICK, why, sizeof why);
	if (e == SPACED_EBUSY)
		return false;
	int answers = 0;
	if (e == 0)
		e = mgr_pool_claim_send(x->cfg, &rec, &fd, &answers, why, sizeof why);
	if (e == 0 && (e = mgr_pool_claim_finish(x->cfg, &rec, false, &gw)) < 0)
		snprintf(why, sizeof why, "the claimed execution's ServicePort gateway does not take its identity");
	struct xclaim *c = e == 0 ? calloc(1, sizeof *c) : NULL;
	if (!c) {
		if (fd >= 0)
			close(fd);
		send_done(x, id, e < 0 ? e : SPACED_ENOMEM, why[0] ? why : "out of memory", NULL, -1);
		return true;
	}
	c->id = id;
	c->fd = fd;
	c->answers = answers;
	c->gateway = gw;
	c->slot = -1;
	c->deadline = spaced_mono_ns() + (uint64_t)EXE_CLAIM_TIMEOUT_MS * 1000000u;
	c->rec = json_incref(jr);
	memcpy(c->exec_name, rec.exec_name, sizeof c->exec_name);
	c->next = x->claims;
	x->claims = c;
	x->nclaims++;
	return true;
}

/* Progress on c; true when it is finished. */
static bool claim_step(struct executor *x, struct xclaim *c, bool timed_out)
{
	char why[512] = "";
	int e = timed_out ? SPACED_ETIMEDOUT : mgr_pool_claim_done(c->fd, &c->answers, why, sizeof why);
	if (e == SPACED_EBUSY)
		return false;
	if (e == 0) {
		mgr_pool_claim_ended(x->cfg, c->exec_name);
		json_t *res = json_pack("{s:O}", "rec", c->rec);
		if (res && c->gateway > 0)
			json_object_set_new(res, "gateway", json_integer(c->gateway));
		char *text = res ? json_dumps(res, JSON_COMPACT) : NULL;
		send_done(x, c->id, 0, "", text, -1);
		free(text);
		json_decref(res);
	} else {
		send_done(x, c->id, e, why[0] ? why : "the launcher did not answer the claim in time", NULL, -1);
	}
	close(c->fd);
	json_decref(c->rec);
	return true;
}

/* ---- jobs in children ---- */

/* Keeps the template cache within its bound, never touching the templates
 * of live executions (keep: a JSON array of hashes) nor this one. */
static void evict_templates(const struct mgr_config *cfg, const char *current, json_t *keep)
{
	const char *k[1025];
	size_t n = 0, i;
	json_t *v;
	k[n++] = current;
	json_array_foreach(keep, i, v) {
		if (json_is_string(v) && n < 1025)
			k[n++] = json_string_value(v);
	}
	tmpl_evict(cfg, cfg->tmpl_cache_max, k, n);
}

/* The process that packs a snapshot into the upload's pipe. */
struct packer_proc {
	pid_t pid;
	int why_fd; /* its reason, when it fails */
};

/* The packer's verdict, once its archive ended (fetch_upload_stream). */
static int packer_ended(void *arg, char *why, size_t whysz)
{
	struct packer_proc *p = arg;
	int st = 0;
	pid_t w = -1;
	if (p->pid > 0)
		while ((w = waitpid(p->pid, &st, 0)) < 0 && errno == EINTR)
			;
	p->pid = -1;
	if (w > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return 0;
	ssize_t n = read(p->why_fd, why, whysz - 1);
	if (n > 0)
		why[n] = 0;
	else
		spaced_why(why, whysz, "packing the snapshot failed");
	return WIFEXITED(st) && WEXITSTATUS(st) < 64 ? -(int)WEXITSTATUS(st) : SPACED_EIO;
}

/* Packs local into an archive (holes and whiteouts kept) streamed to url:
 * nothing of it is written to the worker's disk, and it comes at the
 * execution's disk bound at most. */
static int pack_and_upload(const struct mgr_config *cfg, const char *local, const char *url, char *why,
                           size_t whysz)
{
	int data[2], reason[2];
	if (pipe2(data, O_CLOEXEC) < 0) {
		spaced_why(why, whysz, "pipe: %s", strerror(errno));
		return SPACED_ESYS;
	}
	if (pipe2(reason, O_CLOEXEC | O_NONBLOCK) < 0) {
		spaced_why(why, whysz, "pipe: %s", strerror(errno));
		close(data[0]);
		close(data[1]);
		return SPACED_ESYS;
	}
	struct packer_proc pk = {.pid = fork(), .why_fd = reason[0]};
	if (pk.pid == 0) {
		char w[512] = "";
		signal(SIGPIPE, SIG_IGN); /* an upload cut short: EPIPE, then exit */
		close(data[0]);
		int e = spaced_rootfs_pack_fd(local, data[1], cfg->disk_bps, w, sizeof w);
		if (e < 0)
			(void)!write(reason[1], w, strlen(w));
		_exit(e < 0 ? (-e < 64 ? -e : 63) : 0);
	}
	close(data[1]);
	close(reason[1]);
	int e = SPACED_ESYS;
	if (pk.pid < 0)
		spaced_why(why, whysz, "fork: %s", strerror(errno));
	if (pk.pid > 0) {
		/* the upload starts once the archive does: the packer first walks
		 * the whole tree to measure it (a tree of millions of names takes
		 * a while), which the store's and curl's progress bounds would
		 * count as a stalled transfer */
		struct pollfd pf = {.fd = data[0], .events = POLLIN};
		while (poll(&pf, 1, -1) < 0 && errno == EINTR)
			;
		e = fetch_upload_stream(cfg, url, data[0], packer_ended, &pk, why, whysz);
	}
	close(data[0]);
	if (pk.pid > 0) {
		/* the upload ended first (refused, cut): the packer goes too */
		kill(pk.pid, SIGKILL);
		while (waitpid(pk.pid, NULL, 0) < 0 && errno == EINTR)
			;
	}
	close(reason[0]);
	return e;
}

/* A snapshot uploaded to the control plane's store: taken here (copied out
 * of the execution, written behind at its disk bound), hashed, packed and
 * sent to url in one stream; the local copy goes. The ack carries the hash
 * the destination checks. */
static int snapshot_to_store(const struct mgr_config *cfg, struct mgr_rec *rec, const char *url, json_t **result,
                             char *why, size_t whysz)
{
	char dir[4200], local[4400], hex[MGR_HASH_HEX], rnd[17];
	uint64_t bytes = 0, r64;
	int e;
	randombytes_buf(&r64, sizeof r64);
	snprintf(rnd, sizeof rnd, "%016llx", (unsigned long long)r64);
	snprintf(dir, sizeof dir, "%s/snapout", cfg->state_dir);
	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		snprintf(why, whysz, "mkdir %.200s: %s", dir, strerror(errno));
		return SPACED_ESYS;
	}
	snprintf(local, sizeof local, "%s/%s-%s", dir, rec->r.id.sandbox, rnd);
	char sw[400] = "";
	if ((e = mgr_exec_snapshot(cfg, rec, local, &bytes, sw, sizeof sw)) < 0)
		snprintf(why, whysz, "snapshot failed: %s", sw[0] ? sw : spaced_strerror(e));
	else if ((e = mgr_snapshot_hash(local, hex, &bytes)) < 0)
		snprintf(why, whysz, "cannot hash the snapshot: %s", spaced_strerror(e));
	else
		e = pack_and_upload(cfg, local, url, why, whysz);
	const char *rm[] = {"rm", "-rf", "--", local, NULL};
	mgr_run_wait(rm);
	if (e < 0)
		return e;
	*result = json_pack("{s:s,s:I,s:s}", "url", url, "bytes", (json_int_t)bytes, "hash", hex);
	return 0;
}

/* The blocking work of one job; runs in the child. *result is a new object. */
static int run_job(const struct mgr_config *cfg, const char *kind, json_t *args, json_t **result, char *why,
                   size_t whysz)
{
	struct mgr_rec rec;
	json_t *jr = json_object_get(args, "rec");
	bool has_rec = jr && mgr_rec_from_json(jr, &rec) == 0;
	int e;
	*result = NULL;
	if (jr && !has_rec) {
		snprintf(why, whysz, "malformed record");
		return SPACED_EINVAL;
	}
	if (strcmp(kind, "net") == 0)
		return net_job(cfg, args, result, why, whysz);
	if (strcmp(kind, "start") == 0 && has_rec) {
		json_t *snap = json_object_get(args, "snapshot"), *used = json_object_get(args, "used"), *v;
		/* the egress policy it starts under (net.h), kept for later starts */
		json_t *net = json_object_get(args, "network");
		if (net && !json_is_null(net) && (e = net_policy_store(cfg, rec.r.id.sandbox, net, why, whysz)) < 0)
			return e;
		uint32_t u[1024];
		size_t nu = 0, i;
		json_array_foreach(used, i, v) {
			if (json_is_integer(v) && nu < 1024)
				u[nu++] = (uint32_t)json_integer_value(v);
		}
		e = mgr_exec_start_fresh(cfg, &rec, json_is_string(snap) ? json_string_value(snap) : NULL, u, nu, why,
		                         whysz);
		if (e == 0) {
			*result = json_pack("{s:o}", "rec", mgr_rec_to_json(&rec));
			/* where its ServicePort gateway listens (docs/network.md) */
			char gp[4200];
			snprintf(gp, sizeof gp, "%s/exec/%s.%llu/gateway.port", cfg->state_dir, rec.r.id.sandbox,
			         (unsigned long long)rec.r.id.generation);
			FILE *f = fopen(gp, "r");
			int port = 0;
			if (f) {
				if (fscanf(f, "%d", &port) != 1)
					port = 0;
				fclose(f);
			}
			if (port > 0 && port < 65536 && *result)
				json_object_set_new(*result, "gateway", json_integer(port));
		}
		if (rec.tmpl[0])
			evict_templates(cfg, rec.tmpl, json_object_get(args, "templates"));
		return e;
	}
	/* the warm pool (pool.c): start one, claim one on a template (checked
	 * first: the pooled execution's lower layer is the cached tree as it is
	 * now), reap what an earlier gate left */
	if ((strcmp(kind, "claim-checked") == 0 || strcmp(kind, "claim") == 0) && has_rec) {
		if (rec.tmpl[0] && (e = tmpl_unchanged(cfg, rec.tmpl)) < 0) {
			snprintf(why, whysz, "template %s changed in the cache since its check", rec.tmpl);
			return e;
		}
		/* Its egress: the sandbox's policy, kept for later starts. Another
		 * policy than the default one has its filter in place before the
		 * identity goes out; the default one's filter is the pooled
		 * execution's already (net_claim), so its slot and stored policy are
		 * written while the guest takes its identity. So is the identity of
		 * its ServicePort gateway (started with it, mgr_pool_exec_start): it
		 * reaches the guest only for a client, and no client learns of it
		 * before the install's ack. */
		json_t *net = json_object_get(args, "network");
		bool net_default = !json_is_object(net) || net_policy_is_default(net);
		e = 0;
		if (!net_default) {
			e = net_policy_store(cfg, rec.r.id.sandbox, net, why, whysz);
			if (e == 0)
				e = net_claim(cfg, &rec, why, whysz);
		}
		int fd = -1, answers = 0, gw = 0;
		if (e == 0 && (e = mgr_pool_claim_send(cfg, &rec, &fd, &answers, why, whysz)) == 0) {
			if (net_default && json_is_object(net))
				e = net_policy_store(cfg, rec.r.id.sandbox, net, why, whysz);
			if (e == 0 && net_default)
				e = net_claim(cfg, &rec, why, whysz);
			if (e == 0 && (e = mgr_pool_claim_finish(cfg, &rec, true, &gw)) < 0)
				snprintf(why, whysz, "the claimed execution's ServicePort gateway does not take its identity");
			if (e == 0)
				e = SPACED_EBUSY;
			while (e == SPACED_EBUSY) {
				struct pollfd p = {.fd = fd, .events = POLLIN};
				e = poll(&p, 1, EXE_CLAIM_TIMEOUT_MS) == 1 ? mgr_pool_claim_done(fd, &answers, why, whysz)
				                                           : SPACED_ETIMEDOUT;
			}
			close(fd);
		}
		if (e == 0) {
			mgr_pool_claim_ended(cfg, rec.exec_name);
			*result = json_pack("{s:o}", "rec", mgr_rec_to_json(&rec));
			if (gw > 0 && *result)
				json_object_set_new(*result, "gateway", json_integer(gw));
		}
		return e;
	}
	if (strcmp(kind, "pool-start") == 0 && has_rec && json_is_string(json_object_get(args, "name"))) {
		json_t *used = json_object_get(args, "used"), *v;
		uint32_t u[1024];
		size_t nu = 0, i;
		uint64_t pss = 0;
		json_array_foreach(used, i, v) {
			if (json_is_integer(v) && nu < 1024)
				u[nu++] = (uint32_t)json_integer_value(v);
		}
		e = mgr_pool_exec_start(cfg, json_string_value(json_object_get(args, "name")), &rec, u, nu, &pss, why, whysz);
		/* where its ServicePort gateway listens already: the claim's ack
		 * names it (written while the claim goes on, gate_ctl.c) */
		int gw = 0;
		if (e == 0)
			(void)mgr_pool_gateway_port(cfg, &rec, &gw); /* 0 when none */
		if (e == 0)
			*result = json_pack("{s:o,s:I,s:i}", "rec", mgr_rec_to_json(&rec), "pss_kib", (json_int_t)pss,
			                    "gateway", gw);
		return e;
	}
	if (strcmp(kind, "pool-reap") == 0) {
		json_t *keep = json_object_get(args, "keep"), *v;
		const char *k[1024];
		size_t nk = 0, i;
		json_array_foreach(keep, i, v) {
			if (json_is_string(v) && nk < 1024)
				k[nk++] = json_string_value(v);
		}
		mgr_pool_exec_reap(cfg, k, nk);
		return 0;
	}
	if (strcmp(kind, "stop") == 0 && has_rec) {
		mgr_exec_stop(cfg, &rec);
		return 0;
	}
	if (strcmp(kind, "pause") == 0 && has_rec)
		return mgr_exec_pause(cfg, &rec, json_is_true(json_object_get(args, "pause")));
	if (strcmp(kind, "snapshot") == 0 && has_rec && json_is_string(json_object_get(args, "url")))
		return snapshot_to_store(cfg, &rec, json_string_value(json_object_get(args, "url")), result, why, whysz);
	if (strcmp(kind, "snapshot") == 0 && has_rec && json_is_string(json_object_get(args, "path"))) {
		const char *path = json_string_value(json_object_get(args, "path"));
		char hex[MGR_HASH_HEX];
		uint64_t bytes = 0;
		char sw[400] = "";
		if ((e = mgr_exec_snapshot(cfg, &rec, path, &bytes, sw, sizeof sw)) < 0) {
			snprintf(why, whysz, "snapshot failed: %s", sw[0] ? sw : spaced_strerror(e));
			return e;
		}
		if ((e = mgr_snapshot_hash(path, hex, &bytes)) < 0) {
			snprintf(why, whysz, "cannot hash the snapshot: %s", spaced_strerror(e));
			return e;
		}
		*result = json_pack("{s:s,s:I,s:s}", "path", path, "bytes", (json_int_t)bytes, "hash", hex);
		return 0;
	}
	if (strcmp(kind, "stage") == 0) {
		json_t *sb = json_object_get(args, "sandbox"), *src = json_object_get(args, "src");
		json_t *h = json_object_get(args, "hash");
		char staged[4096];
		if (!json_is_string(sb) || !json_is_string(src))
			return SPACED_EINVAL;
		e = mgr_exec_stage_snapshot(cfg, json_string_value(sb), json_string_value(src),
		                            json_is_string(h) ? json_string_value(h) : NULL, staged, sizeof staged);
		if (e == 0)
			*result = json_pack("{s:s}", "staged", staged);
		return e;
	}
	if (strcmp(kind, "unstage") == 0 && json_is_string(json_object_get(args, "staged"))) {
		mgr_exec_unstage(json_string_value(json_object_get(args, "staged")));
		return 0;
	}
	if (strcmp(kind, "remove") == 0 && json_is_string(json_object_get(args, "sandbox"))) {
		mgr_exec_remove(cfg, json_string_value(json_object_get(args, "sandbox")));
		return 0;
	}
	if (strcmp(kind, "activate") == 0 && has_rec) {
		e = mgr_exec_activate(cfg, &rec, json_is_true(json_object_get(args, "thaw")));
		if (e == 0)
			*result = json_pack("{s:o}", "rec", mgr_rec_to_json(&rec));
		return e;
	}
	if (strcmp(kind, "rebridge") == 0 && has_rec) {
		e = mgr_exec_rebridge(cfg, &rec);
		if (e == 0)
			*result = json_pack("{s:o}", "rec", mgr_rec_to_json(&rec));
		return e;
	}
	if (strcmp(kind, "usage") == 0 && has_rec) {
		e = mgr_exec_usage(cfg, &rec, result);
		if (e == 0)
			json_object_set_new(*result, "sandbox", json_string(rec.r.id.sandbox));
		return e;
	}
	if (strcmp(kind, "usage-all") == 0 && json_is_array(json_object_get(args, "recs"))) {
		/* what each live execution uses, for the metrics; one that does not
		 * answer is left out */
		json_t *all = json_object(), *jone;
		size_t i;
		json_array_foreach(json_object_get(args, "recs"), i, jone) {
			struct mgr_rec one;
			json_t *u = NULL;
			if (mgr_rec_from_json(jone, &one) == 0 && mgr_exec_usage(cfg, &one, &u) == 0)
				json_object_set_new(all, one.r.id.sandbox, u);
		}
		*result = all;
		return 0;
	}
	if (strcmp(kind, "net-revive") == 0) {
		char what[64];
		int re = net_revive(cfg, what, sizeof what, why, whysz);
		*result = json_pack("{s:s}", "started", what);
		return re;
	}
	if (strcmp(kind, "reap") == 0) {
		if (cfg->launch_bin) {
			const char *argv[] = {cfg->launch_bin, "reap", NULL};
			mgr_run_wait(argv);
		}
		mgr_vm_reap(cfg);
		return 0;
	}
	snprintf(why, whysz, "unknown job kind or arguments: %s", kind);
	return SPACED_EINVAL;
}

static __attribute__((noreturn)) void job_child(const struct mgr_config *cfg, const char *kind, json_t *args, int wfd)
{
	char why[512] = "";
	json_t *result = NULL;
	int e = run_job(cfg, kind, args, &result, why, sizeof why);
	char *text = result ? json_dumps(result, JSON_COMPACT) : NULL;
	struct spaced_buf b;
	spaced_buf_init(&b, EXE_RESULT_MAX);
	if (spaced_field_put_i64(&b, e) < 0 || spaced_field_put_str(&b, why[0] ? why : e < 0 ? spaced_strerror(e) : "") < 0 ||
	    spaced_field_put_str(&b, text ? text : "{}") < 0) {
		b.len = 0;
		spaced_field_put_i64(&b, SPACED_ETOOBIG);
		spaced_field_put_str(&b, "job result too large");
		spaced_field_put_str(&b, "{}");
	}
	spaced_io_write_full(wfd, b.data, b.len);
	_exit(0);
}

static void job_spawn(struct executor *x, struct xjob *j)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC) < 0) {
		send_done(x, j->id, SPACED_ESYS, "pipe failed", NULL, -1);
		j->rfd = -1;
		return;
	}
	pid_t pid = fork();
	if (pid == 0) {
		close(p[0]);
		close(x->link);
		close(x->sigfd);
		for (struct xconn *c = x->conns; c; c = c->next)
			if (c->fd >= 0)
				close(c->fd);
		for (struct xclaim *c = x->claims; c; c = c->next)
			close(c->fd);
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		job_child(x->cfg, j->kind, j->args, p[1]);
	}
	close(p[1]);
	if (pid < 0) {
		close(p[0]);
		send_done(x, j->id, SPACED_ESYS, "fork failed", NULL, -1);
		j->rfd = -1;
		return;
	}
	j->pid = pid;
	j->rfd = p[0];
	fcntl(j->rfd, F_SETFL, O_NONBLOCK);
	json_decref(j->args);
	j->args = NULL;
	x->nchildren++;
	x->nbulk += j->bulk;
}

/* A snapshot (copy, hash, pack, upload: a minute for a large sandbox), a
 * stage (a snapshot's download and check) and a start — a sandbox's or the
 * warm pool's — that must first fetch its template (hundreds of megabytes to
 * download, check and unpack; the pool starts executions of a template as
 * soon as it is asked for) are
 * the long jobs a tenant can ask for many of at once (one per paused
 * sandbox, one per template it imported, at the control plane's rates).
 * They take at most half of the child slots: the others stay for every
 * tenant's starts from what is here, stops, pauses and claims, which would
 * otherwise wait behind a tenant's storm of snapshots or fetches. */
static bool job_bulk(const struct mgr_config *cfg, const char *kind, json_t *args)
{
	if (strcmp(kind, "snapshot") == 0 || strcmp(kind, "stage") == 0)
		return true;
	if (strcmp(kind, "start") != 0 && strcmp(kind, "pool-start") != 0)
		return false;
	const char *t = json_string_value(json_object_get(json_object_get(args, "rec"), "template"));
	char root[4400];
	struct stat sb;
	if (!t || !spaced_treehash_hex_valid(t))
		return false; /* the worker's own files, or refused by the job itself */
	snprintf(root, sizeof root, "%s/templates/%s/root", cfg->state_dir, t);
	return lstat(root, &sb) < 0; /* not in the cache: fetched first (tmpl_ensure) */
}

/* The bulk slots are shared between tenants: while several have bulk jobs
 * running or waiting, none starts more than its share of them (the bulk
 * slots over the number of such tenants, one at least). A tenant with a
 * storm of snapshots then holds the slots only while nobody else asks: a
 * slot that frees up goes to another tenant's job waiting behind the storm,
 * which waits for one job's end, not the storm's. The share now: one pass
 * over the jobs (the tenants counted up to 64 distinct; past that, a share
 * of one slot each). */
static size_t bulk_share(const struct executor *x)
{
	const char *seen[64];
	size_t ntenants = 0;
	const struct xjob *lists[2] = {x->jobs, x->waiting};
	for (int l = 0; l < 2; l++) {
		for (const struct xjob *o = lists[l]; o && ntenants < sizeof seen / sizeof seen[0]; o = o->next) {
			if (!o->bulk)
				continue;
			size_t k = 0;
			while (k < ntenants && strcmp(seen[k], o->tenant) != 0)
				k++;
			if (k == ntenants)
				seen[ntenants++] = o->tenant;
		}
	}
	size_t share = ntenants > 0 ? x->max_bulk / ntenants : x->max_bulk;
	return share > 0 ? share : 1;
}

/* How many bulk jobs of tenant run (at most the child slots). */
static size_t bulk_held(const struct executor *x, const char *tenant)
{
	size_t held = 0;
	for (const struct xjob *o = x->jobs; o; o = o->next)
		held += o->bulk && strcmp(o->tenant, tenant) == 0;
	return held;
}

/* Starts what waits, in the order it came, while there are child slots; a
 * bulk job waits while bulk jobs hold their half, or while its tenant holds
 * its share of that half (bulk_share), and what came after it may pass it. */
static void jobs_start(struct executor *x)
{
	size_t share = 0; /* bulk_share, once a bulk job could start (starting one leaves it as it is) */
	for (struct xjob **pp = &x->waiting; *pp && x->nchildren < x->max_children;) {
		struct xjob *j = *pp;
		if (j->bulk && x->nbulk < x->max_bulk && share == 0)
			share = bulk_share(x);
		if (j->bulk && (x->nbulk >= x->max_bulk || bulk_held(x, j->tenant) >= share)) {
			pp = &j->next;
			continue;
		}
		*pp = j->next;
		j->next = x->jobs;
		x->jobs = j;
		job_spawn(x, j);
	}
}

/* Reads a child's result; at its end, sends DONE and forgets the job. */
static bool job_readable(struct executor *x, struct xjob *j)
{
	uint8_t tmp[8192];
	for (;;) {
		ssize_t n = read(j->rfd, tmp, sizeof tmp);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return false;
		if (n > 0 && spaced_buf_append(&j->out, tmp, (size_t)n) == 0)
			continue;
		break; /* the end (or too much) */
	}
	close(j->rfd);
	j->rfd = -1;
	struct spaced_field_reader rd;
	int64_t status;
	char *msg = NULL, *res = NULL;
	spaced_field_reader_init(&rd, j->out.data, j->out.len);
	if (spaced_field_get_i64(&rd, &status) < 0 || spaced_field_get_strdup(&rd, 4096, &msg) < 0 ||
	    spaced_field_get_strdup(&rd, EXE_RESULT_MAX, &res) < 0 || spaced_field_end(&rd) < 0)
		send_done(x, j->id, SPACED_EIO, "the job ended without a result", NULL, -1);
	else
		send_done(x, j->id, (int)status, msg, res, -1);
	free(msg);
	free(res);
	return true;
}

/* ---- the link ---- */

static void on_job(struct executor *x, uint32_t id, const uint8_t *p, size_t n)
{
	struct spaced_field_reader rd;
	char kind[16];
	const char *a;
	size_t al;
	json_error_t jerr;
	spaced_field_reader_init(&rd, p, n);
	spaced_field_get_strbuf(&rd, kind, sizeof kind);
	spaced_field_get_str(&rd, &a, &al);
	json_t *args = spaced_field_end(&rd) == 0 ? json_loadb(a, al, JSON_REJECT_DUPLICATES, &jerr) : NULL;
	if (!json_is_object(args)) {
		json_decref(args);
		send_done(x, id, SPACED_EPROTO, "malformed job", NULL, -1);
		return;
	}
	if (strcmp(kind, "claim") == 0 && claim_start(x, id, args)) {
		json_decref(args);
		return;
	}
	if (strcmp(kind, "connect") == 0) {
		if (x->nconns >= EXE_MAX_CONNECTS)
			send_done(x, id, SPACED_EBUSY, "too many connections being made", NULL, -1);
		else
			conn_start(x, id, args);
		json_decref(args);
		return;
	}
	struct xjob *j = calloc(1, sizeof *j);
	if (!j) {
		json_decref(args);
		send_done(x, id, SPACED_ENOMEM, "out of memory", NULL, -1);
		return;
	}
	j->id = id;
	j->rfd = -1;
	j->args = args;
	snprintf(j->kind, sizeof j->kind, "%s", kind);
	j->bulk = job_bulk(x->cfg, kind, args);
	const char *tn = json_string_value(json_object_get(json_object_get(args, "rec"), "tenant"));
	if (!tn)
		tn = json_string_value(json_object_get(args, "tenant")); /* a stage's */
	snprintf(j->tenant, sizeof j->tenant, "%s", tn ? tn : "");
	spaced_buf_init(&j->out, EXE_RESULT_MAX);
	/* in the order they came, as child slots free up */
	struct xjob **tail = &x->waiting;
	while (*tail)
		tail = &(*tail)->next;
	*tail = j;
}

/* Whether job id is being worked on (a connection or a child). */
static bool job_in_flight(const struct executor *x, uint32_t id)
{
	for (const struct xconn *c = x->conns; c; c = c->next)
		if (c->id == id)
			return true;
	for (const struct xclaim *c = x->claims; c; c = c->next)
		if (c->id == id)
			return true;
	for (const struct xjob *j = x->jobs; j; j = j->next)
		if (j->id == id)
			return true;
	return false;
}

/* Reads one message from the gate (links.c's table: EXE_JOB for an id not in
 * flight); false when the gate went away or broke the table. */
static bool link_readable(struct executor *x)
{
	uint8_t buf[EXE_MSG_MAX];
	ssize_t n = recv(x->link, buf, sizeof buf, MSG_DONTWAIT | MSG_TRUNC);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return true;
	if (n <= 0)
		return false;
	struct spaced_frame_hdr h;
	if ((size_t)n > sizeof buf || n < SPACED_FRAME_HDR_LEN || spaced_frame_hdr_decode(&h, buf, EXE_MSG_MAX) < 0 ||
	    h.len != (size_t)n - SPACED_FRAME_HDR_LEN ||
	    link_check(LINK_EXECUTOR, &h, job_in_flight(x, h.id) ? LINK_ID_INFLIGHT : LINK_ID_FREE) != LINK_HANDLE) {
		xlog("level=error event=protocol-error from=gate");
		return false;
	}
	on_job(x, h.id, buf + SPACED_FRAME_HDR_LEN, h.len);
	return true;
}

static void reap_children(struct executor *x)
{
	struct signalfd_siginfo si;
	while (read(x->sigfd, &si, sizeof si) == sizeof si)
		;
	pid_t pid;
	while ((pid = waitpid(-1, NULL, WNOHANG)) > 0) {
		for (struct xjob *j = x->jobs; j; j = j->next)
			if (j->pid == pid) {
				j->pid = 0;
				x->nchildren--;
				x->nbulk -= j->bulk;
			}
	}
}

int executor_run(const struct mgr_config *cfg_in, int link)
{
	struct mgr_config cfg = *cfg_in;
	struct executor x = {.cfg = &cfg, .link = link};
	/* every bridge is started to accept this process as its caller */
	cfg.exe_pid = getpid();
	if (spaced_proc_start_time(cfg.exe_pid, &cfg.exe_start) < 0)
		return 1;
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	sigset_t chld;
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigprocmask(SIG_BLOCK, &chld, NULL);
	x.sigfd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
	signal(SIGPIPE, SIG_IGN);
	if (x.sigfd < 0)
		return 1;
	x.max_children = cfg.executor_jobs ? cfg.executor_jobs : EXE_MAX_CHILDREN;
	x.max_bulk = x.max_children > 1 ? x.max_children / 2 : 1;
	struct pollfd *pfd = calloc(2 + x.max_children + EXE_MAX_CONNECTS + EXE_MAX_CLAIMS, sizeof *pfd);
	if (!pfd)
		return 1;
	bool up = true;
	while (up) {
		jobs_start(&x);
		nfds_t n = 0;
		pfd[n++] = (struct pollfd){.fd = link, .events = POLLIN};
		pfd[n++] = (struct pollfd){.fd = x.sigfd, .events = POLLIN};
		nfds_t first_job = n;
		for (struct xjob *j = x.jobs; j; j = j->next)
			pfd[n++] = (struct pollfd){.fd = j->rfd, .events = POLLIN};
		nfds_t first_conn = n;
		uint64_t now = spaced_mono_ns(), next = now + 1000000000u;
		for (struct xconn *c = x.conns; c; c = c->next) {
			c->slot = (int)n;
			pfd[n++] = (struct pollfd){.fd = c->fd, .events = c->connected ? POLLIN : POLLOUT};
			if (c->deadline < next)
				next = c->deadline;
		}
		for (struct xclaim *c = x.claims; c; c = c->next) {
			c->slot = (int)n;
			pfd[n++] = (struct pollfd){.fd = c->fd, .events = POLLIN};
			if (c->deadline < next)
				next = c->deadline;
		}
		int r = poll(pfd, n, next > now ? (int)((next - now) / 1000000u) + 1 : 0);
		if (r < 0 && errno != EINTR)
			break;
		if (pfd[0].revents && !link_readable(&x))
			up = false;
		if (pfd[1].revents)
			reap_children(&x);
		nfds_t i = first_job;
		for (struct xjob **pp = &x.jobs; *pp;) {
			struct xjob *j = *pp;
			bool done = j->rfd < 0;
			if (!done && i < first_conn && pfd[i].revents)
				done = job_readable(&x, j);
			i++;
			/* gone from the list once its result is sent; its process is
			 * reaped by reap_children whenever it exits */
			if (done && j->pid == 0) {
				*pp = j->next;
				spaced_buf_free(&j->out);
				json_decref(j->args);
				free(j);
			} else {
				pp = &j->next;
			}
		}
		/* a claim or connection the link's job made in this turn (at the
		 * list's head) has no slot in the poll array yet: the others are
		 * found by their own slot, not by their place in the list, or one
		 * new entry would hide every other's readiness for a turn (and a
		 * burst of jobs, one per turn, for the whole burst) */
		now = spaced_mono_ns();
		for (struct xclaim **pp = &x.claims; *pp;) {
			struct xclaim *c = *pp;
			bool done = false;
			if (c->slot >= 0 && pfd[c->slot].revents)
				done = claim_step(&x, c, false);
			if (!done && now >= c->deadline)
				done = claim_step(&x, c, true);
			if (done) {
				*pp = c->next;
				free(c);
				x.nclaims--;
			} else {
				pp = &c->next;
			}
		}
		for (struct xconn **pp = &x.conns; *pp;) {
			struct xconn *c = *pp;
			bool done = false;
			if (c->slot >= 0 && pfd[c->slot].revents)
				done = conn_step(&x, c, pfd[c->slot].revents);
			if (!done && now >= c->deadline) {
				conn_finish(&x, c, SPACED_ETIMEDOUT, "the bridge did not hand over a connection in time", -1);
				done = true;
			}
			if (done) {
				*pp = c->next;
				free(c);
				x.nconns--;
			} else {
				pp = &c->next;
			}
		}
	}
	free(pfd);
	for (struct xconn *c = x.conns; c; c = c->next)
		if (c->fd >= 0)
			close(c->fd);
	return 0;
}
