/* proc.c — processes and terminals of spaced-guest.
 *
 * Every process runs in its own session (setsid), so a timeout or a kill
 * reaches its whole process group. Foreground processes belong to the stream
 * that started them and are killed when its connection goes away; background
 * processes outlive connections, keep the last SPACED_GUEST_RING bytes of
 * stdout and stderr, and can be re-attached by id. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <grp.h>
#include <jansson.h>

#include "spaced_error.h"
#include "guest.h"

extern char **environ;

#define DEFAULT_PATH "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

static struct proc *proc_find(uint64_t id)
{
	for (struct proc *p = G.procs; p != NULL; p = p->next)
		if (p->id == id && !(p->forget && p->done))
			return p;
	return NULL;
}

static void ring_append(struct ring *r, const uint8_t *p, size_t n)
{
	const size_t cap = SPACED_GUEST_RING;
	if (r->buf == NULL) {
		r->buf = malloc(cap);
		if (r->buf == NULL)
			return;
	}
	if (n >= cap) {
		p += n - cap;
		n = cap;
	}
	for (size_t i = 0; i < n;) {
		size_t pos = (r->start + r->len) % cap;
		size_t chunk = cap - pos < n - i ? cap - pos : n - i;
		memcpy(r->buf + pos, p + i, chunk);
		i += chunk;
		r->len += chunk;
		if (r->len > cap) {
			r->start = (r->start + (r->len - cap)) % cap;
			r->len = cap;
		}
	}
}

static void ring_replay(struct ring *r, struct conn *c, uint16_t type, uint32_t id)
{
	const size_t cap = SPACED_GUEST_RING;
	if (r->buf == NULL || r->len == 0)
		return;
	size_t first = cap - r->start < r->len ? cap - r->start : r->len;
	(void)conn_queue_frame(c, type, 0, id, r->buf + r->start, first);
	if (first < r->len)
		(void)conn_queue_frame(c, type, 0, id, r->buf, r->len - first);
}

static void proc_free(struct proc *p)
{
	if (p->in_fd >= 0)
		close(p->in_fd);
	if (p->out_fd >= 0)
		close(p->out_fd);
	if (p->err_fd >= 0)
		close(p->err_fd);
	free(p->inq);
	free(p->ring_out.buf);
	free(p->ring_err.buf);
	free(p);
}

static int put_exit(struct spaced_buf *x, const struct proc *p)
{
	int64_t code = -1, sig = 0;
	if (WIFEXITED(p->status))
		code = WEXITSTATUS(p->status);
	else if (WIFSIGNALED(p->status))
		sig = WTERMSIG(p->status);
	int e = spaced_field_put_i64(x, code);
	if (e == 0)
		e = spaced_field_put_i64(x, sig);
	if (e == 0)
		e = spaced_field_put_u64(x, p->timed_out ? 1 : 0);
	return e;
}

/* Ends the process's attached stream once it has exited and its output is
 * drained. */
static void proc_maybe_done(struct proc *p)
{
	if (p->done || !p->exited || p->out_fd >= 0 || p->err_fd >= 0)
		return;
	p->done = true;
	if (p->in_fd >= 0)
		close(p->in_fd);
	p->in_fd = -1;
	if (p->attached != NULL) {
		struct stream *s = p->attached;
		struct spaced_buf x;
		spaced_buf_init(&x, 64);
		(void)put_exit(&x, p);
		stream_finish(s, 0, "", &x);
		spaced_buf_free(&x);
	}
	if (!p->background)
		p->forget = true;
}

void proc_reap_done(void)
{
	struct proc **pp = &G.procs;
	while (*pp != NULL) {
		struct proc *p = *pp;
		if (p->forget && p->done && p->attached == NULL) {
			*pp = p->next;
			proc_free(p);
		} else {
			pp = &p->next;
		}
	}
}

/* A pipe's output that no ring keeps goes to its stream without a copy. */
static bool splices(const struct proc *p)
{
	return !p->pty && !p->background;
}

bool proc_output_allowed(const struct proc *p)
{
	if (p->attached != NULL && !p->attached->dead) {
		const struct conn *c = p->attached->conn;
		if (splices(p))
			return c->oq_head == NULL && !c->wblocked;
		return c->oq_bytes < GUEST_OUT_HIGH;
	}
	return true;
}

/* Output a stream takes from a pipe: spliced to its connection, a frame
 * at a time while the pipe holds a good part of one. Returns 1 after one
 * frame or more (or when the connection died), 0 when it must wait for the
 * connection (output queued before it, or its socket full: the pipe holds
 * what comes meanwhile), 2 when too little is there (the copying read takes
 * it, and sees the end). */
static int splice_output(struct proc *p, int fd, uint16_t type)
{
	struct conn *c = p->attached->conn;
	uint32_t id = p->attached->id;
	for (int sent = 0; sent < 16; sent++) {
		int avail;
		if (c->oq_head != NULL || c->wblocked)
			return sent > 0 ? 1 : 0;
		if (ioctl(fd, FIONREAD, &avail) < 0 || avail < (int)GUEST_SPLICE_MIN)
			return sent > 0 ? 1 : 2;
		size_t n = (size_t)avail < SPACED_FRAME_CHUNK ? (size_t)avail : SPACED_FRAME_CHUNK;
		ssize_t k = conn_send_from_fd(c, type, id, fd, NULL, n);
		if (k < 0)
			return 1; /* c is dead, and the stream with it */
		if (k == 0)
			return sent > 0 ? 1 : 0;
	}
	return 1;
}

/* Reads one chunk from fd (the process's stdout, stderr or pty master).
 * Returns 1 after data, 0 when nothing is available now, -1 when the fd
 * reached its end and was closed. Output a stream waits for is spliced
 * (splice_output) or read straight into its frame; drain: the process is
 * gone and fd is read to its end now, so nothing waits for the
 * connection. */
static int read_output(struct proc *p, int *fdp, uint16_t type, bool drain)
{
	bool to_stream = p->attached != NULL && !p->attached->dead;
	if (to_stream && splices(p)) {
		int r = splice_output(p, *fdp, type);
		if (r == 1 || (r == 0 && !drain))
			return r;
	}
	struct outbuf *o = to_stream ? conn_frame_alloc(SPACED_FRAME_CHUNK) : NULL;
	uint8_t *ring_only = to_stream ? NULL : malloc(SPACED_FRAME_CHUNK);
	uint8_t *buf = o != NULL ? o->data + SPACED_FRAME_HDR_LEN : ring_only;
	if (buf == NULL)
		return 0;
	ssize_t k;
	do
		k = read(*fdp, buf, SPACED_FRAME_CHUNK);
	while (k < 0 && errno == EINTR);
	if (k > 0) {
		if (p->background)
			ring_append(type == SPACED_GUEST_OUT_STDOUT ? &p->ring_out : &p->ring_err, buf,
			            (size_t)k);
		if (o != NULL && (size_t)k < SPACED_FRAME_CHUNK / 2) {
			/* a short read keeps no chunk's worth queued: the queue's bound
			 * counts bytes, so a trickle to a slow client stays that small */
			struct outbuf *fit = realloc(o, sizeof *o + SPACED_FRAME_HDR_LEN + (size_t)k);
			if (fit != NULL)
				o = fit;
		}
		if (o != NULL)
			(void)conn_frame_commit(p->attached->conn, o, type, 0, p->attached->id, (size_t)k);
		free(ring_only);
		return 1;
	}
	free(o);
	free(ring_only);
	if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		return 0;
	/* End of file, or EIO from a pty master whose slave side is gone. */
	close(*fdp);
	*fdp = -1;
	return -1;
}

void proc_on_output(struct proc *p, int fd)
{
	if (fd == p->out_fd)
		(void)read_output(p, &p->out_fd, SPACED_GUEST_OUT_STDOUT, false);
	else if (fd == p->err_fd)
		(void)read_output(p, &p->err_fd, SPACED_GUEST_OUT_STDERR, false);
	proc_maybe_done(p);
}

/* After the process exited: take what is left in its pipes, then close them
 * (a grandchild holding them open must not keep the request alive). */
static void drain_and_close(struct proc *p)
{
	int *fds[2] = {&p->out_fd, &p->err_fd};
	uint16_t types[2] = {SPACED_GUEST_OUT_STDOUT, SPACED_GUEST_OUT_STDERR};
	for (int i = 0; i < 2; i++) {
		if (*fds[i] < 0)
			continue;
		int fl = fcntl(*fds[i], F_GETFL);
		(void)fcntl(*fds[i], F_SETFL, fl | O_NONBLOCK);
		for (int round = 0; round < 64; round++)
			if (read_output(p, fds[i], types[i], true) <= 0)
				break;
		if (*fds[i] >= 0) {
			close(*fds[i]);
			*fds[i] = -1;
		}
	}
}

void proc_on_sigchld(void)
{
	for (;;) {
		int st;
		pid_t pid = waitpid(-1, &st, WNOHANG);
		if (pid <= 0)
			break;
		struct proc *p;
		for (p = G.procs; p != NULL; p = p->next)
			if (p->pid == pid && !p->exited)
				break;
		if (p == NULL) {
			guest_log("reaped orphan pid=%d", (int)pid);
			continue;
		}
		p->exited = true;
		p->status = st;
		p->deadline_ns = 0;
		drain_and_close(p);
		proc_maybe_done(p);
	}
}

void proc_on_stdin_writable(struct proc *p)
{
	while (p->in_fd >= 0 && p->inq_off < p->inq_len) {
		ssize_t k = write(p->in_fd, p->inq + p->inq_off, p->inq_len - p->inq_off);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return;
			/* The reader is gone: drop what is queued. */
			p->inq_off = p->inq_len;
			if (!p->pty) {
				close(p->in_fd);
				p->in_fd = -1;
			}
			break;
		}
		p->inq_off += (size_t)k;
	}
	if (p->inq_off == p->inq_len) {
		free(p->inq);
		p->inq = NULL;
		p->inq_len = p->inq_off = 0;
		if (p->in_close && !p->pty && p->in_fd >= 0) {
			close(p->in_fd);
			p->in_fd = -1;
		}
	}
}

void proc_stdin(struct stream *s, const uint8_t *d, size_t n, bool end)
{
	struct proc *p = s->proc;
	if (p == NULL || p->in_fd < 0 || p->in_close)
		return; /* input after its end is dropped */
	if (n > 0) {
		size_t keep = p->inq_len - p->inq_off;
		uint8_t *q = malloc(keep + n);
		if (q == NULL) {
			conn_kill(s->conn, "out of memory");
			return;
		}
		if (keep)
			memcpy(q, p->inq + p->inq_off, keep);
		memcpy(q + keep, d, n);
		free(p->inq);
		p->inq = q;
		p->inq_len = keep + n;
		p->inq_off = 0;
	}
	if (end)
		p->in_close = true;
	proc_on_stdin_writable(p);
}

void proc_signal_stream(struct stream *s, int sig)
{
	struct proc *p = s->proc;
	if (p == NULL || p->exited)
		return;
	/* the command leads a session of its own: its pid is its group's id */
	if (kill(-p->pid, sig) < 0 && errno == ESRCH)
		(void)kill(p->pid, sig);
}

void proc_resize(struct stream *s, uint64_t rows, uint64_t cols)
{
	struct proc *p = s->proc;
	if (p == NULL || !p->pty || p->in_fd < 0)
		return;
	struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
	(void)ioctl(p->in_fd, TIOCSWINSZ, &ws);
}

static void kill_group(struct proc *p)
{
	if (p->exited)
		return;
	(void)kill(-p->pid, SIGKILL);
	(void)kill(p->pid, SIGKILL);
}

void proc_kill_all(void)
{
	for (struct proc *p = G.procs; p != NULL; p = p->next)
		kill_group(p);
}

void proc_detach_stream(struct stream *s, bool kill_fg)
{
	struct proc *p = s->proc;
	if (p == NULL)
		return;
	if (p->attached == s)
		p->attached = NULL;
	if (!p->background) {
		if (kill_fg)
			kill_group(p);
		p->forget = true;
	}
	s->proc = NULL;
}

void proc_check_timeouts(uint64_t now)
{
	for (struct proc *p = G.procs; p != NULL; p = p->next) {
		if (p->deadline_ns != 0 && !p->exited && now >= p->deadline_ns) {
			p->timed_out = true;
			p->deadline_ns = 0;
			kill_group(p);
		}
	}
}

uint64_t proc_next_deadline(void)
{
	uint64_t best = 0;
	for (struct proc *p = G.procs; p != NULL; p = p->next)
		if (p->deadline_ns != 0 && !p->exited && (best == 0 || p->deadline_ns < best))
			best = p->deadline_ns;
	return best;
}

/* ---- starting processes ---- */

static void free_strv(char **v)
{
	if (v == NULL)
		return;
	for (size_t i = 0; v[i] != NULL; i++)
		free(v[i]);
	free(v);
}

/* Reads "u count, s × count" into a NULL-terminated vector. */
static int get_strv(struct spaced_field_reader *r, size_t min, char ***out)
{
	uint64_t n = 0;
	if (spaced_field_get_u64(r, &n) < 0 || n < min || n > SPACED_GUEST_MAX_ARGS)
		return SPACED_EPROTO;
	char **v = calloc((size_t)n + 1, sizeof *v);
	if (v == NULL)
		return SPACED_ENOMEM;
	for (size_t i = 0; i < n; i++) {
		if (spaced_field_get_strdup(r, SPACED_FIELD_STR_MAX, &v[i]) < 0) {
			free_strv(v);
			return SPACED_EPROTO;
		}
	}
	*out = v;
	return 0;
}

static bool env_has(char **env, const char *key)
{
	size_t kl = strlen(key);
	for (size_t i = 0; env != NULL && env[i] != NULL; i++)
		if (strncmp(env[i], key, kl) == 0 && env[i][kl] == '=')
			return true;
	return false;
}

int proc_config(const char *json, size_t len)
{
	json_error_t jerr;
	json_t *o = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr), *env, *v;
	if (!json_is_object(o)) {
		json_decref(o);
		return -1;
	}
	env = json_object_get(o, "env");
	const char *wd = json_string_value(json_object_get(o, "workdir"));
	const char *user = json_string_value(json_object_get(o, "user"));
	size_t n = json_is_object(env) ? json_object_size(env) : json_is_array(env) ? json_array_size(env) : 0;
	char **e = calloc(n + 1, sizeof *e);
	size_t k = 0;
	if (!e || (wd && strlen(wd) >= sizeof G.cfg_workdir) || (user && strlen(user) >= sizeof G.cfg_user)) {
		free(e);
		json_decref(o);
		return -1;
	}
	if (json_is_object(env)) {
		const char *key;
		json_object_foreach(env, key, v) {
			if (json_is_string(v) && *key && !strchr(key, '=') &&
			    asprintf(&e[k], "%s=%s", key, json_string_value(v)) > 0)
				k++;
		}
	} else if (json_is_array(env)) {
		size_t i;
		json_array_foreach(env, i, v) {
			const char *s = json_string_value(v);
			if (s && strchr(s, '=') && s[0] != '=' && (e[k] = strdup(s)) != NULL)
				k++;
		}
	}
	for (size_t i = 0; G.cfg_env && G.cfg_env[i]; i++)
		free(G.cfg_env[i]);
	free(G.cfg_env);
	G.cfg_env = e;
	snprintf(G.cfg_workdir, sizeof G.cfg_workdir, "%s", wd ? wd : "");
	snprintf(G.cfg_user, sizeof G.cfg_user, "%s", user ? user : "");
	json_decref(o);
	return 0;
}

/* uid, gid and home of user ("name", "uid" or "uid:gid", a name looked up
 * in the execution's own /etc/passwd). Returns 0 or an errno value. */
static int resolve_user(const char *user, uid_t *uid, gid_t *gid, char *home, size_t homesz)
{
	char name[256], *colon;
	snprintf(name, sizeof name, "%s", user);
	snprintf(home, homesz, "/");
	if ((colon = strchr(name, ':')) != NULL)
		*colon++ = 0;
	char *end;
	errno = 0;
	unsigned long u = strtoul(name, &end, 10);
	bool numeric = name[0] && *end == 0 && errno == 0 && u < 65536;
	long g = -1;
	if (colon) {
		unsigned long gv = strtoul(colon, &end, 10);
		if (!*colon || *end || gv >= 65536)
			return EINVAL;
		g = (long)gv;
	}
	int fd = -1;
	struct stat pst;
	/* the sandbox's /etc/passwd is its tenant's: a regular file, read up to
	 * a bound (a FIFO or /dev/zero there would hold the guest's one loop) */
	if (fs_resolve("/etc/passwd", O_RDONLY | O_NONBLOCK, 0, &fd) == 0 && (fstat(fd, &pst) < 0 || !S_ISREG(pst.st_mode))) {
		close(fd);
		fd = -1;
	}
	if (fd >= 0) {
		FILE *f = fdopen(fd, "r");
		char line[1024];
		size_t lines = 0;
		while (f && lines++ < 100000 && fgets(line, sizeof line, f)) {
			char *fl[7] = {0};
			char *p = line;
			int nf = 0;
			line[strcspn(line, "\n")] = 0;
			/* name:pw:uid:gid:gecos:home:shell (empty fields kept) */
			for (; nf < 7; nf++) {
				fl[nf] = p;
				char *c = strchr(p, ':');
				if (!c)
					break;
				*c = 0;
				p = c + 1;
			}
			if (nf < 5 || !fl[2] || !fl[3])
				continue;
			unsigned long pu = strtoul(fl[2], NULL, 10), pg = strtoul(fl[3], NULL, 10);
			if ((numeric && pu == u) || (!numeric && strcmp(fl[0], name) == 0)) {
				u = pu;
				if (g < 0)
					g = (long)pg;
				if (fl[5])
					snprintf(home, homesz, "%s", fl[5]);
				numeric = true;
				break;
			}
		}
		if (f)
			fclose(f);
		else
			close(fd);
	}
	if (!numeric || u >= 65536)
		return ENOENT;
	*uid = (uid_t)u;
	*gid = (gid_t)(g < 0 ? (long)u : g);
	return 0;
}

/* The child's environment: the request's entries, the sandbox's (CONFIG)
 * where the request does not set them, plus PATH, HOME and (for a terminal)
 * TERM when neither sets them. */
static char **build_env(char **req, bool term, const char *home)
{
	size_t n = 0, nc = 0;
	while (req != NULL && req[n] != NULL)
		n++;
	while (G.cfg_env != NULL && G.cfg_env[nc] != NULL)
		nc++;
	char **e = calloc(n + nc + 4, sizeof *e);
	if (e == NULL)
		return NULL;
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		e[k++] = req[i];
	for (size_t i = 0; i < nc; i++) {
		char key[256];
		size_t kl = strcspn(G.cfg_env[i], "=");
		snprintf(key, sizeof key, "%.*s", (int)(kl < 255 ? kl : 255), G.cfg_env[i]);
		if (!env_has(req, key))
			e[k++] = G.cfg_env[i];
	}
	static char home_entry[4200];
	snprintf(home_entry, sizeof home_entry, "HOME=%s", home);
	if (!env_has(e, "PATH"))
		e[k++] = (char *)(uintptr_t)DEFAULT_PATH;
	if (!env_has(e, "HOME"))
		e[k++] = home_entry;
	if (term && !env_has(req, "TERM"))
		e[k++] = (char *)(uintptr_t)"TERM=xterm-256color";
	return e;
}

/* The signals the guest ignores, which a child must not inherit ignored (the
 * guest installs no handlers: it reads signals from a signalfd). Looked up
 * once: the guest's dispositions do not change after it started. */
static const sigset_t *ignored_signals(void)
{
	static sigset_t set;
	static bool known;
	if (!known) {
		sigemptyset(&set);
		for (int sig = 1; sig < NSIG; sig++) {
			struct sigaction sa;
			if (sigaction(sig, NULL, &sa) == 0 && sa.sa_handler == SIG_IGN)
				sigaddset(&set, sig);
		}
		known = true;
	}
	return &set;
}

/* Where execvp would find name with envp's PATH (the request's, not the
 * guest's own) in the child's working directory cwdfd: name itself when it
 * holds a '/', else the first executable regular file PATH names. Returns 0,
 * or ENOENT / EACCES / ENAMETOOLONG. */
static int find_in_path(const char *name, char **envp, int cwdfd, char *out, size_t outsz)
{
	if (strchr(name, '/') != NULL) {
		if (strlen(name) >= outsz)
			return ENAMETOOLONG;
		snprintf(out, outsz, "%s", name);
		return 0;
	}
	const char *path = &DEFAULT_PATH[5]; /* the value after "PATH=" */
	for (size_t i = 0; envp[i] != NULL; i++)
		if (strncmp(envp[i], "PATH=", 5) == 0)
			path = envp[i] + 5;
	int err = ENOENT;
	for (const char *d = path;; d++) {
		const char *end = strchrnul(d, ':');
		size_t dl = (size_t)(end - d);
		int n = snprintf(out, outsz, "%.*s%s%s", (int)dl, d, dl ? "/" : "", name);
		if (n > 0 && (size_t)n < outsz) {
			struct stat st;
			if (fstatat(cwdfd, out, &st, 0) == 0 && S_ISREG(st.st_mode)) {
				if (faccessat(cwdfd, out, X_OK, 0) == 0)
					return 0;
				err = EACCES;
			}
		}
		if (*end == 0)
			break;
		d = end;
	}
	return err;
}

/* The OOM score adjustment of every command the guest starts. When an
 * execution reaches its memory limit, the kernel kills the task with the
 * highest score in it: commands start 500 above the guest, so the guest (PID
 * 1: its end is the execution's end) is never the one picked while any command
 * runs. Raising a score needs no privilege; a command may lower its own back
 * to 0, which only makes its own execution's guest a candidate again. */
#define GUEST_CHILD_OOM_ADJ "500"

static void oom_adj_self(const char *v)
{
	/* the launcher's descriptor: the guest, never dumpable, cannot open its
	 * own /proc files (they belong to a root it cannot act as) */
	if (G.oom_fd >= 0) {
		(void)!pwrite(G.oom_fd, v, strlen(v), 0);
		return;
	}
	int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
	if (fd >= 0) {
		(void)!write(fd, v, strlen(v));
		close(fd);
	}
}

/* Starts argv in its own session with in/out/err as 0/1/2 and cwdfd as its
 * working directory, every signal unblocked and at its default. posix_spawn
 * shares the guest's memory until the exec (no page-table copy) and reports a
 * failed exec as its result. Returns 0 with *pid set, or an errno value. */
static int spawn_plain(char **argv, char **envp, int cwdfd, int in, int out, int err, pid_t *pid)
{
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	sigset_t none;
	sigemptyset(&none);
	int r = posix_spawn_file_actions_init(&fa);
	if (r != 0)
		return r;
	if ((r = posix_spawnattr_init(&at)) != 0) {
		posix_spawn_file_actions_destroy(&fa);
		return r;
	}
	if (r == 0)
		r = posix_spawn_file_actions_adddup2(&fa, in, 0);
	if (r == 0)
		r = posix_spawn_file_actions_adddup2(&fa, out, 1);
	if (r == 0)
		r = posix_spawn_file_actions_adddup2(&fa, err, 2);
	if (r == 0)
		r = posix_spawn_file_actions_addfchdir_np(&fa, cwdfd);
	if (r == 0)
		r = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
	if (r == 0)
		r = posix_spawnattr_setsigmask(&at, &none);
	if (r == 0)
		r = posix_spawnattr_setsigdefault(&at, ignored_signals());
	char file[PATH_MAX];
	if (r == 0)
		r = find_in_path(argv[0], envp, cwdfd, file, sizeof file);
	if (r == 0) {
		/* the child takes the score it has at the spawn: raise ours for it */
		oom_adj_self(GUEST_CHILD_OOM_ADJ);
		r = posix_spawn(pid, file, &fa, &at, argv, envp);
		oom_adj_self("0");
	}
	posix_spawnattr_destroy(&at);
	posix_spawn_file_actions_destroy(&fa);
	return r;
}

/* A terminal's child: it also takes the terminal as its controlling one,
 * which posix_spawn cannot do. */
static void child_exec(char **argv, char **envp, int cwdfd, int in, int out, int err, int errpipe,
                       bool term, long uid, long gid)
{
	sigset_t all;
	sigemptyset(&all);
	sigprocmask(SIG_SETMASK, &all, NULL);
	const sigset_t *ign = ignored_signals();
	for (int sig = 1; sig < NSIG; sig++)
		if (sigismember(ign, sig) == 1)
			(void)signal(sig, SIG_DFL);
	(void)setsid();
	if (term)
		(void)ioctl(in, TIOCSCTTY, 0);
	if (dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0)
		goto fail;
	if (fchdir(cwdfd) < 0)
		goto fail;
	/* another user of the execution (exec --user, USER): no supplementary
	 * groups, its group, then its uid, for good */
	if (uid >= 0 && (setgroups(0, NULL) < 0 || setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) < 0 ||
	                 setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) < 0))
		goto fail;
	environ = envp;
	execvp(argv[0], argv);
fail:;
	int e = errno;
	(void)!write(errpipe, &e, sizeof e);
	_exit(127);
}

static void reply_errno(struct conn *c, uint32_t id, const char *what, int err)
{
	char msg[160];
	snprintf(msg, sizeof msg, "%s: %s", what, strerror(err));
	reply_result(c, id, errno_to_spaced(err), msg, NULL);
}

static int count_bg(void)
{
	int n = 0;
	for (struct proc *p = G.procs; p != NULL; p = p->next)
		if (p->background && !p->forget)
			n++;
	return n;
}

/* Makes room for one more background process by forgetting the oldest
 * finished one. Returns false when all are still running. */
static bool bg_make_room(void)
{
	if (count_bg() < GUEST_MAX_BG)
		return true;
	struct proc *old = NULL;
	for (struct proc *p = G.procs; p != NULL; p = p->next)
		if (p->background && !p->forget && p->done && p->attached == NULL &&
		    (old == NULL || p->id < old->id))
			old = p;
	if (old == NULL)
		return false;
	old->forget = true;
	return true;
}

int proc_exec(struct conn *c, uint32_t id, struct spaced_field_reader *r, bool term)
{
	char **argv = NULL, **env = NULL, **envp = NULL;
	char cwd[SPACED_GUEST_PATH_MAX];
	uint64_t a = 0, b = 0;
	int ret = 0;
	int cwdfd = -1, errp[2] = {-1, -1};
	int pin[2] = {-1, -1}, pout[2] = {-1, -1}, perr[2] = {-1, -1};
	int master = -1, slave = -1;

	int e = get_strv(r, 1, &argv);
	if (e == 0)
		e = get_strv(r, 0, &env);
	char user[256] = "";
	if (e == 0 && (spaced_field_get_strbuf(r, cwd, sizeof cwd) < 0 ||
	               spaced_field_get_u64(r, &a) < 0 || spaced_field_get_u64(r, &b) < 0 ||
	               /* optional: the user to run it as */
	               (r->off < r->len && spaced_field_get_strbuf(r, user, sizeof user) < 0) ||
	               spaced_field_end(r) < 0))
		e = SPACED_EPROTO;
	if (e < 0) {
		ret = e == SPACED_ENOMEM ? 0 : SPACED_EPROTO;
		if (e == SPACED_ENOMEM)
			reply_result(c, id, e, NULL, NULL);
		goto out;
	}
	for (size_t i = 0; env[i] != NULL; i++) {
		if (strchr(env[i], '=') == NULL || env[i][0] == '=') {
			reply_result(c, id, SPACED_EINVAL, "environment entries are KEY=VALUE", NULL);
			goto out;
		}
	}
	uint64_t timeout_ms = term ? 0 : a, flags = term ? 0 : b;
	uint64_t rows = term ? a : 0, cols = term ? b : 0;
	if (flags & ~(uint64_t)(SPACED_GUEST_EXEC_BACKGROUND | SPACED_GUEST_EXEC_STDIN) ||
	    ((flags & SPACED_GUEST_EXEC_BACKGROUND) && (flags & SPACED_GUEST_EXEC_STDIN)) ||
	    (term && (rows == 0 || cols == 0 || rows > 65535 || cols > 65535)) ||
	    timeout_ms > UINT64_C(1) << 40) {
		reply_result(c, id, SPACED_EINVAL, "bad flags, timeout or window size", NULL);
		goto out;
	}
	bool background = (flags & SPACED_GUEST_EXEC_BACKGROUND) != 0;
	if (background && !bg_make_room()) {
		reply_result(c, id, SPACED_EBUSY, "too many background processes", NULL);
		goto out;
	}
	/* the sandbox's defaults where the request leaves them out */
	const char *as = user[0] ? user : G.cfg_user;
	long run_uid = -1, run_gid = -1;
	char home[4096] = "/root";
	if (as[0] && strcmp(as, "root") != 0 && strcmp(as, "0") != 0) {
		uid_t uu;
		gid_t gg;
		int ue = resolve_user(as, &uu, &gg, home, sizeof home);
		if (ue != 0) {
			reply_result(c, id, SPACED_ENOENT, "no such user in the sandbox", NULL);
			goto out;
		}
		run_uid = uu;
		run_gid = gg;
	}
	if (!cwd[0] && G.cfg_workdir[0])
		snprintf(cwd, sizeof cwd, "%s", G.cfg_workdir);
	/* exec --user without a directory or a WORKDIR: in that user's home,
	 * when it is one (else at the root, as any exec) */
	e = 0;
	if (cwd[0] || !user[0] || fs_resolve(home, O_PATH | O_DIRECTORY, 0, &cwdfd) < 0)
		e = fs_resolve(cwd, O_PATH | O_DIRECTORY, 0, &cwdfd);
	if (e < 0) {
		reply_errno(c, id, "cwd", -e);
		goto out;
	}
	envp = build_env(env, term, home);
	struct proc *p = calloc(1, sizeof *p);
	if (envp == NULL || p == NULL) {
		free(p);
		reply_result(c, id, SPACED_ENOMEM, NULL, NULL);
		goto out;
	}
	p->in_fd = p->out_fd = p->err_fd = -1;
	if (pipe2(errp, O_CLOEXEC) < 0)
		goto sysfail;
	if (term) {
		char name[64];
		struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
		master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
		if (master < 0 || grantpt(master) < 0 || unlockpt(master) < 0 ||
		    ptsname_r(master, name, sizeof name) != 0)
			goto sysfail;
		slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
		if (slave < 0 || ioctl(slave, TIOCSWINSZ, &ws) < 0)
			goto sysfail;
	} else {
		if (pipe2(pin, O_CLOEXEC) < 0 || pipe2(pout, O_CLOEXEC) < 0 ||
		    pipe2(perr, O_CLOEXEC) < 0)
			goto sysfail;
		/* stdout holds 1 MiB (the default 64 KiB stopped a command that
		 * writes fast every 64 KiB, and woke this loop as often); best
		 * effort: past the sandbox's share of pipe pages it stays small */
		(void)fcntl(pout[0], F_SETPIPE_SZ, 1 << 20);
	}
	pid_t pid = -1;
	int cerr = 0;
	ssize_t k = 0;
	if (term || run_uid >= 0) {
		/* a terminal's child, or one that changes user: forked (posix_spawn
		 * can do neither) */
		(void)ignored_signals(); /* looked up before the fork, once */
		/* the child takes the score it has at the fork: raise ours for it */
		oom_adj_self(GUEST_CHILD_OOM_ADJ);
		pid = fork();
		if (pid != 0)
			oom_adj_self("0");
		if (pid < 0)
			goto sysfail;
		if (pid == 0) {
			if (term)
				child_exec(argv, envp, cwdfd, slave, slave, slave, errp[1], true, run_uid, run_gid);
			child_exec(argv, envp, cwdfd, pin[0], pout[1], perr[1], errp[1], false, run_uid, run_gid);
		}
		close(errp[1]);
		errp[1] = -1;
		do
			k = read(errp[0], &cerr, sizeof cerr);
		while (k < 0 && errno == EINTR);
	} else if ((cerr = spawn_plain(argv, envp, cwdfd, pin[0], pout[1], perr[1], &pid)) != 0) {
		/* nothing was started (posix_spawn reaps a child whose exec failed) */
		free(p);
		reply_errno(c, id, "exec", cerr);
		goto out;
	}
	p->pid = pid;
	p->id = ++G.next_proc;
	p->background = background;
	p->pty = term;
	snprintf(p->argv0, sizeof p->argv0, "%s", argv[0]);
	if (term) {
		p->out_fd = master;
		p->in_fd = dup(master);
		(void)fcntl(p->in_fd, F_SETFD, FD_CLOEXEC);
		master = -1;
	} else {
		p->out_fd = pout[0];
		p->err_fd = perr[0];
		pout[0] = perr[0] = -1;
		if (flags & SPACED_GUEST_EXEC_STDIN) {
			p->in_fd = pin[1];
			pin[1] = -1;
		}
	}
	int fds[3] = {p->in_fd, p->out_fd, p->err_fd};
	for (int i = 0; i < 3; i++)
		if (fds[i] >= 0)
			(void)fcntl(fds[i], F_SETFL, fcntl(fds[i], F_GETFL) | O_NONBLOCK);
	p->next = G.procs;
	G.procs = p;
	if (k == (ssize_t)sizeof cerr) {
		/* exec failed: the child exits 127; report it as the request's error. */
		p->forget = true;
		reply_errno(c, id, "exec", cerr);
		goto out;
	}
	if (timeout_ms > 0)
		p->deadline_ns = spaced_mono_ns() + timeout_ms * 1000000u;
	guest_log("proc start id=%llu pid=%d argv0=\"%s\" bg=%d pty=%d", (unsigned long long)p->id,
	          (int)pid, p->argv0, background, term);
	struct spaced_buf x;
	spaced_buf_init(&x, 64);
	(void)spaced_field_put_u64(&x, p->id);
	(void)spaced_field_put_u64(&x, (uint64_t)pid);
	if (background) {
		reply_result(c, id, 0, "", &x);
	} else {
		struct stream *s = stream_new(c, id, term ? ST_TERM : ST_EXEC);
		if (s == NULL) {
			kill_group(p);
			p->forget = true;
			reply_result(c, id, SPACED_ENOMEM, NULL, NULL);
		} else {
			s->proc = p;
			p->attached = s;
			(void)conn_queue_frame(c, SPACED_GUEST_OUT_STARTED, 0, id, x.data, x.len);
		}
	}
	spaced_buf_free(&x);
	goto out;
sysfail:
	reply_errno(c, id, "start", errno);
	free(p);
out:
	if (cwdfd >= 0)
		close(cwdfd);
	int all[] = {errp[0], errp[1], pin[0], pin[1], pout[0], pout[1], perr[0], perr[1], master, slave};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		if (all[i] >= 0)
			close(all[i]);
	free(envp);
	free_strv(argv);
	free_strv(env);
	return ret;
}

/* ---- background process management ---- */

void proc_list(struct conn *c, uint32_t id)
{
	struct spaced_buf b;
	spaced_buf_init(&b, SPACED_FRAME_MAX);
	int e = 0;
	for (struct proc *p = G.procs; p != NULL && e == 0; p = p->next) {
		if (!p->background || p->forget)
			continue;
		int64_t code = -1, sig = 0;
		if (p->exited && WIFEXITED(p->status))
			code = WEXITSTATUS(p->status);
		if (p->exited && WIFSIGNALED(p->status))
			sig = WTERMSIG(p->status);
		e = spaced_field_put_u64(&b, p->id);
		if (e == 0)
			e = spaced_field_put_u64(&b, (uint64_t)p->pid);
		if (e == 0)
			e = spaced_field_put_u64(&b, p->exited ? 0 : 1);
		if (e == 0)
			e = spaced_field_put_i64(&b, code);
		if (e == 0)
			e = spaced_field_put_i64(&b, sig);
		if (e == 0)
			e = spaced_field_put_str(&b, p->argv0);
	}
	if (e == 0 && b.len > 0)
		(void)conn_queue_frame(c, SPACED_GUEST_OUT_PROCS, 0, id, b.data, b.len);
	spaced_buf_free(&b);
	reply_result(c, id, e, NULL, NULL);
}

void proc_attach(struct conn *c, uint32_t id, uint64_t procid)
{
	struct proc *p = proc_find(procid);
	if (p == NULL || !p->background || p->forget) {
		reply_result(c, id, SPACED_ENOENT, "no such background process", NULL);
		return;
	}
	if (p->attached != NULL) {
		struct stream *old = p->attached;
		p->attached = NULL;
		stream_finish(old, SPACED_EBUSY, "attached elsewhere", NULL);
	}
	struct stream *s = stream_new(c, id, ST_ATTACH);
	if (s == NULL) {
		reply_result(c, id, SPACED_ENOMEM, NULL, NULL);
		return;
	}
	ring_replay(&p->ring_out, c, SPACED_GUEST_OUT_STDOUT, id);
	ring_replay(&p->ring_err, c, SPACED_GUEST_OUT_STDERR, id);
	if (s->dead || c->dead)
		return; /* the replay found the connection over its bounds: it is gone, s with it */
	if (p->done) {
		struct spaced_buf x;
		spaced_buf_init(&x, 64);
		(void)put_exit(&x, p);
		stream_finish(s, 0, "", &x);
		spaced_buf_free(&x);
		return;
	}
	s->proc = p;
	p->attached = s;
}

void proc_signal(struct conn *c, uint32_t id, uint64_t procid, int64_t sig)
{
	struct proc *p = proc_find(procid);
	if (sig < 1 || sig >= NSIG) {
		reply_result(c, id, SPACED_EINVAL, "bad signal number", NULL);
		return;
	}
	if (p == NULL || p->exited) {
		reply_result(c, id, SPACED_ENOENT, "no such running process", NULL);
		return;
	}
	if (kill(p->pid, (int)sig) < 0) {
		reply_errno(c, id, "kill", errno);
		return;
	}
	reply_result(c, id, 0, "", NULL);
}

void proc_kill(struct conn *c, uint32_t id, uint64_t procid)
{
	struct proc *p = proc_find(procid);
	if (p == NULL) {
		reply_result(c, id, SPACED_ENOENT, "no such process", NULL);
		return;
	}
	kill_group(p);
	if (p->background)
		p->forget = true;
	reply_result(c, id, 0, "", NULL);
}
