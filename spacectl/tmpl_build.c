/*
 * tmpl_build.c — spacectl template build NAME -f SPACEFILE [--context DIR]
 * [--no-cache] [--json] (docs/templates.md, "Spacefiles").
 *
 * A Spacefile holds, one per line (a trailing '\' continues a line; '#'
 * starts a comment line):
 *   FROM debian:bookworm | FROM scratch | FROM TEMPLATE   first, once
 *   RUN COMMAND            sh -c COMMAND in a build sandbox
 *   ENV K=V [K2=V2 …]      (or ENV K V) for the RUN steps after it and the template
 *   WORKDIR DIR            where the RUN steps after it run (made when missing), and the template's
 *   COPY SRC DST           a file or directory of the context (never outside it) into the tree
 *   USER U                 who the RUN steps after it run as, and the template's default user
 *
 * Each RUN and COPY is one step: it runs in a build sandbox of the tenant
 * made from the tree so far (create with template_hash), whose changes
 * the control plane merges into a new tree (POST /v1/builds/commit). A step
 * is keyed by its parent tree and its text — for RUN with the environment,
 * directory and user it runs with; for COPY with the sha256 of what it
 * copies — and a key built before is taken from the cache (POST
 * /v1/builds/lookup) without running anything. The build sandboxes are the
 * tenant's own: held to the same limits, isolation and quotas as any.
 * The commands run through this spacectl (exec, fs), so their output shows.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>
#include <sodium.h>

#include "cli.h"
#include "http_client.h"
#include "tmpl.h"
#include "util.h"

extern char **environ;

/* Where the build's progress and its commands' output go: stdout, or
 * stderr with --json (stdout then holds the JSON answer alone). */
static FILE *progress;

#define LINE_MAX_ 16384

struct build {
	char parent[65];
	json_t *env;     /* {"K":"V"} */
	char workdir[1024];
	char user[256];
	char context[PATH_MAX];
	bool no_cache;
	int cached, built;
};

/* Runs this spacectl with argv (stdin from the descriptor in when >= 0); its
 * exit status. */
static int self(const char *const *argv, int in)
{
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	if (in >= 0)
		posix_spawn_file_actions_adddup2(&fa, in, 0);
	if (progress == stderr)
		posix_spawn_file_actions_adddup2(&fa, 2, 1);
	pid_t pid;
	int r = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, (char *const *)(uintptr_t)argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (r != 0)
		return -1;
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static json_t *config_of(const struct build *b)
{
	json_t *c = json_pack("{s:O}", "env", b->env);
	if (b->workdir[0])
		json_object_set_new(c, "workdir", json_string(b->workdir));
	if (b->user[0])
		json_object_set_new(c, "user", json_string(b->user));
	return c;
}

/* The cached tree of step on the current parent, or 0 when there is none. */
static int lookup(struct build *b, const char *step)
{
	if (b->no_cache)
		return 0;
	const char *url = getenv("SPACED_CP_URL"), *key = getenv("SPACED_API_KEY");
	char err[256], *body = NULL;
	json_t *req = json_pack("{s:s,s:s}", "parent", b->parent, "step", step);
	char *text = json_dumps(req, JSON_COMPACT);
	int status = 0, found = 0;
	json_decref(req);
	if (text && url && key && http_request(url, "POST", "/v1/builds/lookup", key, text, &status, &body, err, sizeof err) == 0 &&
	    status == 200) {
		json_error_t jerr;
		json_t *a = json_loads(body, JSON_REJECT_DUPLICATES, &jerr);
		const char *h = json_string_value(json_object_get(a, "hash"));
		if (h && strlen(h) == 64) {
			memcpy(b->parent, h, 65);
			found = 1;
		}
		json_decref(a);
	}
	free(text);
	free(body);
	return found;
}

/* A build sandbox lives at most this long: removed after its step, or by
 * the control plane's reaper when this client died before it could. */
#define BUILD_SANDBOX_LIFETIME 86400

/* A build sandbox from the current parent; its ID into id. */
static int sandbox(struct build *b, char *id, size_t idsz)
{
	json_t *a = NULL,
	       *req = json_pack("{s:s,s:i}", "template_hash", b->parent, "max_lifetime", BUILD_SANDBOX_LIFETIME);
	int r = tmpl_api("template build", "POST", "/v1/sandboxes", req, &a);
	json_decref(req);
	if (r != 0)
		return -1;
	const char *s = json_string_value(json_object_get(a, "id"));
	snprintf(id, idsz, "%s", s ? s : "");
	json_decref(a);
	return id[0] ? 0 : -1;
}

static void sandbox_rm(const char *id)
{
	char path[128];
	json_t *a = NULL;
	snprintf(path, sizeof path, "/v1/sandboxes/%s", id);
	if (tmpl_api("template build", "DELETE", path, NULL, &a) == 0)
		json_decref(a);
}

static int commit(struct build *b, const char *id, const char *step)
{
	json_t *a = NULL, *req = json_pack("{s:s,s:s,s:s,s:o}", "sandbox", id, "parent", b->parent, "step", step,
	                                   "config", config_of(b));
	int r = tmpl_api("template build", "POST", "/v1/builds/commit", req, &a);
	json_decref(req);
	if (r != 0)
		return -1;
	const char *h = json_string_value(json_object_get(a, "hash"));
	if (!h || strlen(h) != 64) {
		json_decref(a);
		return cli_fail("template build", "the commit named no tree");
	}
	memcpy(b->parent, h, 65);
	json_decref(a);
	return 0;
}

static int step_run(struct build *b, const char *cmd)
{
	char *cfg = NULL, id[128];
	json_t *c = config_of(b);
	cfg = json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS);
	json_decref(c);
	size_t kl = strlen(cmd) + (cfg ? strlen(cfg) : 0) + 16;
	char *key = malloc(kl);
	snprintf(key, kl, "RUN %s\n%s", cmd, cfg ? cfg : "{}");
	free(cfg);
	int rc = 1;
	if (lookup(b, key)) {
		fprintf(progress, "  ---> cached %.16s\n", b->parent);
		b->cached++;
		free(key);
		return 0;
	}
	if (sandbox(b, id, sizeof id) < 0)
		goto out;
	/* WORKDIR is made when missing, as the directory the command runs in */
	const char *argv[200];
	size_t n = 0;
	char cwd[1100] = "/";
	if (b->workdir[0]) {
		const char *mk[] = {"spacectl", "exec", id, "--", "mkdir", "-p", b->workdir, NULL};
		if (self(mk, -1) != 0) {
			cli_fail("template build", "WORKDIR %s could not be made", b->workdir);
			goto rm;
		}
		snprintf(cwd, sizeof cwd, "%s", b->workdir);
	}
	argv[n++] = "spacectl";
	argv[n++] = "exec";
	argv[n++] = id;
	char envs[64][4300];
	const char *k;
	json_t *v;
	size_t ne = 0;
	json_object_foreach(b->env, k, v) {
		if (ne == 64)
			break;
		snprintf(envs[ne], sizeof envs[ne], "%s=%s", k, json_string_value(v));
		argv[n++] = "--env";
		argv[n++] = envs[ne++];
	}
	argv[n++] = "--cwd";
	argv[n++] = cwd;
	if (b->user[0]) {
		argv[n++] = "--user";
		argv[n++] = b->user;
	}
	argv[n++] = "--";
	argv[n++] = "/bin/sh";
	argv[n++] = "-c";
	argv[n++] = cmd;
	argv[n] = NULL;
	fflush(progress);
	int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
	int st = self(argv, devnull);
	if (devnull >= 0)
		close(devnull);
	if (st != 0) {
		cli_fail("template build", "RUN %.200s: exit status %d", cmd, st);
		goto rm;
	}
	if (commit(b, id, key) < 0)
		goto rm;
	fprintf(progress, "  ---> %.16s\n", b->parent);
	b->built++;
	rc = 0;
rm:
	sandbox_rm(id);
out:
	free(key);
	return rc;
}

/* ---- COPY ---- */

struct copied {
	char rel[PATH_MAX];
	mode_t mode;
	bool dir;
	dev_t dev; /* the file the walk read */
	ino_t ino;
};

/* What a COPY reads: entries beneath the context's directory (a descriptor
 * opened once), each found from it again with no symlink followed on the
 * way. The context may be someone else's to change while the build runs (a
 * repository a CI job builds): a file swapped for a symlink to /etc/shadow,
 * or a directory of the source for one to /, had host files copied. */
struct copy_src {
	int ctx;             /* O_PATH descriptor of the context */
	const char *context; /* its path, for messages */
	const char *src;     /* the source, relative to the context */
};

/* src/rel relative to the context, in out; false when it does not fit. */
static bool src_path(const struct copy_src *cs, const char *rel, char *out, size_t outsz)
{
	int n = snprintf(out, outsz, "%s%s%s", cs->src, rel[0] ? "/" : "", rel);
	return n >= 0 && (size_t)n < outsz;
}

static int open_beneath(const struct copy_src *cs, const char *rel, int flags)
{
	char path[PATH_MAX * 2];
	if (!src_path(cs, rel, path, sizeof path)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	return spaced_open_beneath(cs->ctx, path, flags);
}

/* The regular file the walk read (c), opened for reading; -1 when it is no
 * longer that file (ESTALE). Non-blocking: a file swapped for a FIFO is
 * refused, not waited on. */
static int open_copied(const struct copy_src *cs, const struct copied *c)
{
	struct stat sb;
	int fd = open_beneath(cs, c->rel, O_RDONLY | O_NONBLOCK);
	if (fd >= 0 && (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode) || sb.st_dev != c->dev || sb.st_ino != c->ino)) {
		close(fd);
		fd = -1;
		errno = ESTALE;
	}
	return fd;
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every entry under the source (sorted walk), digested; directories and
 * regular files only (a symlink in the context is refused: it could point
 * out). */
static int walk(const struct copy_src *cs, const char *rel, crypto_hash_sha256_state *h, struct copied **list,
                size_t *n, size_t *cap, int depth)
{
	char path[PATH_MAX * 3], relp[PATH_MAX * 2];
	struct stat sb;
	src_path(cs, rel, relp, sizeof relp);
	snprintf(path, sizeof path, "%s/%s", cs->context, relp);
	if (depth > 64)
		return cli_fail("template build", "COPY: %s: too deep", path);
	int pfd = open_beneath(cs, rel, O_PATH);
	if (pfd < 0)
		return cli_fail("template build", "COPY: %s: %s", path,
		                errno == ELOOP ? "a symlink on the way (symlinks are not copied)" : strerror(errno));
	int st = fstat(pfd, &sb);
	close(pfd);
	if (st < 0)
		return cli_fail("template build", "COPY: %s: %s", path, strerror(errno));
	if (!S_ISDIR(sb.st_mode) && !S_ISREG(sb.st_mode))
		return cli_fail("template build", "COPY: %s is not a file or directory (symlinks are not copied)", path);
	if (*n == *cap) {
		*cap = *cap ? *cap * 2 : 32;
		*list = realloc(*list, *cap * sizeof **list);
		if (!*list)
			return 1;
	}
	struct copied *c = &(*list)[(*n)++];
	snprintf(c->rel, sizeof c->rel, "%s", rel);
	c->mode = sb.st_mode & 07777;
	c->dir = S_ISDIR(sb.st_mode);
	c->dev = sb.st_dev;
	c->ino = sb.st_ino;
	char head[PATH_MAX + 64];
	int hl = snprintf(head, sizeof head, "%s\n%o\n%c\n", rel, (unsigned)c->mode, c->dir ? 'd' : 'f');
	crypto_hash_sha256_update(h, (const unsigned char *)head, (unsigned long long)hl);
	if (!c->dir) {
		int fd = open_copied(cs, c);
		unsigned char buf[65536];
		ssize_t r;
		if (fd < 0)
			return cli_fail("template build", "COPY: %s: %s", path, strerror(errno));
		while ((r = read(fd, buf, sizeof buf)) > 0)
			crypto_hash_sha256_update(h, buf, (unsigned long long)r);
		close(fd);
		return 0;
	}
	int dfd = open_beneath(cs, rel, O_RDONLY | O_DIRECTORY);
	DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
	if (!d) {
		if (dfd >= 0)
			close(dfd);
		return cli_fail("template build", "COPY: %s: %s", path, strerror(errno));
	}
	char **names = NULL;
	size_t nn = 0, nc = 0;
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (nn == nc) {
			nc = nc ? nc * 2 : 16;
			names = realloc(names, nc * sizeof *names);
		}
		names[nn++] = strdup(de->d_name);
	}
	closedir(d);
	if (nn > 1)
		qsort(names, nn, sizeof *names, name_cmp);
	int rc = 0;
	for (size_t i = 0; i < nn && rc == 0; i++) {
		char sub[PATH_MAX];
		snprintf(sub, sizeof sub, "%s%s%s", rel, rel[0] ? "/" : "", names[i]);
		rc = walk(cs, sub, h, list, n, cap, depth + 1);
	}
	for (size_t i = 0; i < nn; i++)
		free(names[i]);
	free(names);
	return rc;
}

static int step_copy(struct build *b, const char *src, const char *dst)
{
	char id[128];
	/* the source beneath the context, never through a symlink or out of it
	 * (openat2 RESOLVE_BENEATH: "../x" and "/x" are refused) */
	struct copy_src cs = {.context = b->context, .src = src};
	if (dst[0] != '/')
		return cli_fail("template build", "COPY %s %s: the destination must be an absolute path", src, dst);
	if (src[0] == '/')
		return cli_fail("template build", "COPY %s: outside the context %s", src, b->context);
	cs.ctx = open(b->context, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (cs.ctx < 0)
		return cli_fail("template build", "COPY %s: the context %s: %s", src, b->context, strerror(errno));
	int pfd = open_beneath(&cs, "", O_PATH);
	if (pfd < 0) {
		int err = errno;
		close(cs.ctx);
		return cli_fail("template build", "COPY %s: %s", src,
		                err == EXDEV   ? "outside the context"
		                : err == ELOOP ? "a symlink on the way (symlinks are not copied)"
		                               : strerror(err));
	}
	close(pfd);
	crypto_hash_sha256_state h;
	unsigned char dg[32];
	char hex[65];
	struct copied *list = NULL;
	size_t n = 0, cap = 0;
	crypto_hash_sha256_init(&h);
	if (walk(&cs, "", &h, &list, &n, &cap, 0) != 0) {
		free(list);
		close(cs.ctx);
		return 1;
	}
	crypto_hash_sha256_final(&h, dg);
	sodium_bin2hex(hex, sizeof hex, dg, sizeof dg);
	size_t kl = strlen(dst) + 100;
	char *key = malloc(kl);
	snprintf(key, kl, "COPY %s sha256:%s", dst, hex);
	int rc = 1;
	if (lookup(b, key)) {
		fprintf(progress, "  ---> cached %.16s\n", b->parent);
		b->cached++;
		rc = 0;
		goto out;
	}
	if (sandbox(b, id, sizeof id) < 0)
		goto out;
	for (size_t i = 0; i < n; i++) {
		char to[PATH_MAX * 2], from[PATH_MAX * 3], mode[16];
		snprintf(to, sizeof to, "%s%s%s", dst, list[i].rel[0] ? "/" : "", list[i].rel);
		char relp[PATH_MAX * 2];
		src_path(&cs, list[i].rel, relp, sizeof relp);
		snprintf(from, sizeof from, "%s/%s", b->context, relp);
		snprintf(mode, sizeof mode, "%o", (unsigned)list[i].mode);
		int st;
		if (list[i].dir) {
			const char *a[] = {"spacectl", "fs", "mkdir", id, to, NULL};
			st = self(a, -1);
		} else {
			/* the parent directory of a single file copied alone */
			if (i == 0) {
				char parent[PATH_MAX * 2];
				snprintf(parent, sizeof parent, "%s", to);
				char *slash = strrchr(parent, '/');
				if (slash && slash != parent) {
					*slash = 0;
					const char *a[] = {"spacectl", "fs", "mkdir", id, parent, NULL};
					self(a, -1);
				}
			}
			const char *a[] = {"spacectl", "fs", "write", id, to, NULL};
			int in = open_copied(&cs, &list[i]);
			if (in < 0) {
				cli_fail("template build", "COPY %s: %s changed while the build ran: %s", src, from,
				         strerror(errno));
				goto rm;
			}
			st = self(a, in);
			close(in);
			if (st == 0 && (list[i].mode & 0111)) {
				const char *ch[] = {"spacectl", "exec", id, "--", "chmod", mode, to, NULL};
				self(ch, -1);
			}
		}
		if (st != 0) {
			cli_fail("template build", "COPY %s: writing %s failed", src, to);
			goto rm;
		}
	}
	if (commit(b, id, key) < 0)
		goto rm;
	fprintf(progress, "  ---> %.16s\n", b->parent);
	b->built++;
	rc = 0;
rm:
	sandbox_rm(id);
out:
	free(key);
	free(list);
	close(cs.ctx);
	return rc;
}

/* ---- the Spacefile ---- */

static char *trim(char *s)
{
	while (isspace((unsigned char)*s))
		s++;
	size_t n = strlen(s);
	while (n && isspace((unsigned char)s[n - 1]))
		s[--n] = 0;
	return s;
}

static int step_from(struct build *b, const char *from)
{
	char store[512], tmp[] = "/tmp/spacectl-from-XXXXXX";
	json_t *a = NULL;
	if (tmpl_store_url("template build", store, sizeof store) != 0)
		return 1;
	int fd = mkstemp(tmp);
	if (fd < 0)
		return cli_fail("template build", "mkstemp: %s", strerror(errno));
	json_t *req = json_pack("{s:s}", "from", from);
	char *text = json_dumps(req, JSON_COMPACT);
	json_decref(req);
	ssize_t w = text ? write(fd, text, strlen(text)) : -1;
	close(fd);
	free(text);
	if (strncmp(from, "debian:", 7) == 0)
		fprintf(progress, "  (a minimal Debian from the package archive with mmdebstrap, once: this takes a minute or more)\n");
	fflush(progress);
	int r = w > 0 ? tmpl_post_file("template build", store, "/v1/builds/from", tmp, &a) : 1;
	unlink(tmp);
	if (r != 0)
		return 1;
	const char *h = json_string_value(json_object_get(a, "hash"));
	json_t *cfg = json_object_get(a, "config"), *env = json_object_get(cfg, "env"), *v;
	if (!h || strlen(h) != 64) {
		json_decref(a);
		return cli_fail("template build", "FROM %s named no tree", from);
	}
	memcpy(b->parent, h, 65);
	/* a template's own settings carry on */
	if (json_is_object(env))
		json_object_update(b->env, env);
	else if (json_is_array(env)) {
		size_t i;
		json_array_foreach(env, i, v) {
			const char *e = json_string_value(v), *eq = e ? strchr(e, '=') : NULL;
			if (eq) {
				char k[256];
				snprintf(k, sizeof k, "%.*s", (int)(eq - e), e);
				json_object_set_new(b->env, k, json_string(eq + 1));
			}
		}
	}
	const char *wd = json_string_value(json_object_get(cfg, "workdir")), *u = json_string_value(json_object_get(cfg, "user"));
	if (wd)
		snprintf(b->workdir, sizeof b->workdir, "%s", wd);
	if (u)
		snprintf(b->user, sizeof b->user, "%s", u);
	fprintf(progress, "  ---> %.16s%s\n", b->parent, json_is_true(json_object_get(a, "cached")) ? "" : " (new)");
	json_decref(a);
	return 0;
}

static int step_env(struct build *b, char *args)
{
	char *eq = strchr(args, '=');
	char *sp = strpbrk(args, " \t");
	if (!eq || (sp && sp < eq)) { /* ENV K V */
		if (!sp)
			return cli_fail("template build", "ENV wants K=V or K V");
		*sp = 0;
		json_object_set_new(b->env, args, json_string(trim(sp + 1)));
		return 0;
	}
	/* ENV K=V [K2=V2 …] (values without blanks, or in double quotes) */
	char *p = args;
	while (*p) {
		while (isspace((unsigned char)*p))
			p++;
		if (!*p)
			break;
		char *k = p, *e = strchr(p, '=');
		if (!e)
			return cli_fail("template build", "ENV: '%s' is not K=V", p);
		*e = 0;
		char *v = e + 1, *end;
		if (*v == '"') {
			v++;
			end = strchr(v, '"');
			if (!end)
				return cli_fail("template build", "ENV: an unterminated quote");
			*end = 0;
			p = end + 1;
		} else {
			end = v + strcspn(v, " \t");
			p = *end ? end + 1 : end;
			*end = 0;
		}
		json_object_set_new(b->env, k, json_string(v));
	}
	return 0;
}

int tmpl_build(int argc, char **argv)
{
	static const char use[] = "usage: spacectl template build NAME -f SPACEFILE [--context DIR] [--no-cache] [--json]";
	const char *name = NULL, *file = NULL, *context = NULL;
	bool json = false;
	struct build b = {.env = json_object()};
	for (int i = 0; i < argc; i++) {
		if (strcmp(argv[i], "-f") == 0 && i + 1 < argc)
			file = argv[++i];
		else if (strcmp(argv[i], "--context") == 0 && i + 1 < argc)
			context = argv[++i];
		else if (strcmp(argv[i], "--no-cache") == 0)
			b.no_cache = true;
		else if (strcmp(argv[i], "--json") == 0)
			json = true;
		else if (!name && argv[i][0] != '-')
			name = argv[i];
		else
			return cli_usage(use);
	}
	if (!name || !file)
		return cli_usage(use);
	progress = json ? stderr : stdout;
	FILE *f = fopen(file, "r");
	if (!f)
		return cli_fail("template build", "%s: %s", file, strerror(errno));
	char ctx[PATH_MAX];
	if (!context) {
		snprintf(ctx, sizeof ctx, "%s", file);
		char *slash = strrchr(ctx, '/');
		if (slash)
			*slash = 0;
		else
			snprintf(ctx, sizeof ctx, ".");
		context = ctx;
	}
	if (!realpath(context, b.context)) {
		fclose(f);
		return cli_fail("template build", "--context %s: %s", context, strerror(errno));
	}
	char *line = malloc(LINE_MAX_), *acc = malloc(LINE_MAX_);
	int rc = 0, lineno = 0, nsteps = 0;
	bool have_from = false;
	acc[0] = 0;
	while (rc == 0 && fgets(line, LINE_MAX_, f)) {
		lineno++;
		line[strcspn(line, "\n")] = 0;
		char *t = trim(line);
		if (!acc[0] && (!*t || *t == '#'))
			continue;
		size_t tl = strlen(t);
		bool cont = tl && t[tl - 1] == '\\';
		if (cont)
			t[--tl] = 0;
		if (strlen(acc) + tl + 2 >= LINE_MAX_) {
			rc = cli_fail("template build", "line %d: too long", lineno);
			break;
		}
		if (acc[0])
			strcat(acc, " ");
		strcat(acc, t);
		if (cont)
			continue;
		char *ins = trim(acc), *args = ins + strcspn(ins, " \t");
		if (*args)
			*args++ = 0;
		args = trim(args);
		for (char *p = ins; *p; p++)
			*p = (char)toupper((unsigned char)*p);
		fprintf(progress, "step %d: %s %s\n", ++nsteps, ins, args);
		fflush(progress);
		if (strcmp(ins, "FROM") == 0) {
			if (have_from)
				rc = cli_fail("template build", "line %d: one FROM, first", lineno);
			else
				rc = step_from(&b, args);
			have_from = true;
		} else if (!have_from) {
			rc = cli_fail("template build", "line %d: FROM comes first", lineno);
		} else if (strcmp(ins, "RUN") == 0 && *args) {
			rc = step_run(&b, args);
		} else if (strcmp(ins, "ENV") == 0 && *args) {
			rc = step_env(&b, args);
		} else if (strcmp(ins, "WORKDIR") == 0 && *args) {
			if (args[0] == '/')
				snprintf(b.workdir, sizeof b.workdir, "%s", args);
			else if (strlen(b.workdir) + strlen(args) + 2 < sizeof b.workdir) {
				strcat(b.workdir, "/");
				strcat(b.workdir, args);
			} else {
				rc = cli_fail("template build", "line %d: WORKDIR too long", lineno);
			}
		} else if (strcmp(ins, "USER") == 0 && *args) {
			snprintf(b.user, sizeof b.user, "%s", args);
		} else if (strcmp(ins, "COPY") == 0 && *args) {
			char *sp = args + strcspn(args, " \t");
			if (!*sp) {
				rc = cli_fail("template build", "line %d: COPY SRC DST", lineno);
			} else {
				*sp = 0;
				rc = step_copy(&b, args, trim(sp + 1));
			}
		} else {
			rc = cli_fail("template build", "line %d: unknown or empty instruction %s", lineno, ins);
		}
		acc[0] = 0;
	}
	fclose(f);
	free(line);
	free(acc);
	if (rc == 0 && !have_from)
		rc = cli_fail("template build", "%s has no FROM", file);
	if (rc == 0) {
		json_t *a = NULL, *req = json_pack("{s:s,s:o}", "hash", b.parent, "config", config_of(&b));
		char path[600];
		snprintf(path, sizeof path, "/v1/templates/%s", name);
		rc = tmpl_api("template build", "POST", path, req, &a);
		json_decref(req);
		if (rc == 0) {
			if (json) {
				json_t *o = json_pack("{s:s,s:s,s:i,s:i,s:o}", "name", name, "hash", b.parent, "cached", b.cached,
				                      "built", b.built, "config", config_of(&b));
				char *s = json_dumps(o, JSON_INDENT(2));
				puts(s ? s : "{}");
				free(s);
				json_decref(o);
			} else {
				printf("%s %s (%d steps built, %d from the cache)\n", name, b.parent, b.built, b.cached);
			}
			json_decref(a);
		}
	}
	json_decref(b.env);
	return rc;
}
