/*
 * spaced-cp — the control plane.
 *
 *   spaced-cp --state DIR --listen HOST:PORT [--db sqlite:PATH | --db postgresql://…]
 *             [--ack-timeout MS] [--idle-timeout S] [--max-lifetime S] [--threads N] [--op-lease S]
 *             [--quota sandboxes=N,memory=SIZE,disk=SIZE,templates=SIZE,pids=N]
 *             [--head-timeout MS] [--max-conns N] [--max-conns-per-ip N]
 *             [--metrics-listen HOST:PORT] [--log-format text|json] [--config FILE]
 *             [--store-listen HOST:PORT] [--template-max SIZE] [--snapshot-max SIZE] [--snapshot-grace S]
 *             [--build-cache SIZE] [--retain-deleted S] [--create-rate N]
 *             (--tls-cert FILE --tls-key FILE [--tls-client-ca FILE] | --plaintext)
 *   spaced-cp admin --state DIR [--db URL] create-tenant NAME
 *   spaced-cp admin --state DIR [--db URL] create-api-key TENANT_NAME
 *   spaced-cp admin --state DIR [--db URL] create-join-token WORKER_ID [TTL_SECONDS]
 *       (single use, bound to that worker ID, valid TTL_SECONDS, default 3600)
 *   spaced-cp admin --state DIR [--db URL] revoke-worker WORKER_ID
 *       (its worker key and unused join tokens stop working; a new join token lets it join again)
 *   spaced-cp admin --state DIR [--db URL] worker-lost WORKER_ID
 *       (the machine is gone: what it was sent and never acknowledged no longer holds a sandbox's
 *       start on another worker or its delete; until the worker says hello again)
 *   spaced-cp admin --state DIR [--db URL] create-admin-key
 *   spaced-cp admin --state DIR [--db URL] set-quota TENANT_NAME sandboxes=N,memory=SIZE,disk=SIZE,templates=SIZE,pids=N
 *       (each value, or "default" for the control plane's --quota)
 *
 * Admin commands print the new key once on standard output; only its hash is stored.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "channel.h"
#include "config.h"
#include "cp.h"
#include "log.h"
#include "observe.h"
#include "spaced_error.h"
#include "resources.h"
#include "tls.h"

static const char usage[] =
	"usage: spaced-cp --state DIR --listen HOST:PORT [--db sqlite:PATH | --db postgresql://…]\n"
	"                 [--ack-timeout MS] [--idle-timeout S] [--max-lifetime S] [--threads N] [--op-lease S]\n"
	"                 [--move-drain MS] [--quota sandboxes=N,memory=SIZE,disk=SIZE,templates=SIZE,pids=N]\n"
	"                 [--default-substrate S]\n"
	"                 [--metrics-listen HOST:PORT] [--log-format text|json] [--config FILE]\n"
	"                 [--head-timeout MS] [--max-conns N] [--max-conns-per-ip N]\n"
	"                 [--store-listen HOST:PORT] [--template-max SIZE] [--snapshot-max SIZE] [--snapshot-grace S]\n"
	"                 [--snapshot-timeout MS]\n"
	"                 [--build-cache SIZE] [--retain-deleted S] [--create-rate N]\n"
	"                 (--tls-cert FILE --tls-key FILE [--tls-client-ca FILE] | --plaintext)\n"
	"       spaced-cp admin --state DIR [--db URL] create-tenant NAME | create-api-key TENANT_NAME |\n"
	"                 create-join-token WORKER_ID [TTL_SECONDS] | revoke-worker WORKER_ID |\n"
	"                 worker-lost WORKER_ID |\n"
	"                 create-admin-key |\n"
	"                 set-quota TENANT_NAME sandboxes=N|default,memory=SIZE|default,disk=SIZE|default,\n"
	"                 templates=SIZE|default,pids=N|default\n";

/* "sandboxes=N,memory=SIZE,disk=SIZE,templates=SIZE,pids=N" (any subset); a value "default" is -1
 * when allow_default, 0 means no limit. Returns 0 or -1. */
static int parse_quota(const char *text, struct cp_quota *q, int allow_default)
{
	char buf[256];
	if (strlen(text) >= sizeof buf)
		return -1;
	snprintf(buf, sizeof buf, "%s", text);
	for (char *save = NULL, *it = strtok_r(buf, ",", &save); it; it = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(it, '=');
		uint64_t v = 0;
		int64_t *dst;
		if (eq == NULL)
			return -1;
		*eq = 0;
		if (strcmp(it, "sandboxes") == 0)
			dst = &q->sandboxes;
		else if (strcmp(it, "memory") == 0)
			dst = &q->memory;
		else if (strcmp(it, "disk") == 0)
			dst = &q->disk;
		else if (strcmp(it, "templates") == 0)
			dst = &q->templates;
		else if (strcmp(it, "pids") == 0)
			dst = &q->pids;
		else
			return -1;
		if (allow_default && strcmp(eq + 1, "default") == 0)
			*dst = -1;
		else if (spaced_size_parse(eq + 1, &v) < 0 || v > (uint64_t)INT64_MAX)
			return -1;
		else
			*dst = (int64_t)v;
	}
	return 0;
}

static void *reaper_thread(void *arg)
{
	struct cp *cp = arg;
	struct cp_store *st = NULL;
	if (cp_store_open(cp->db_url, &st) < 0)
		return NULL;
	/* the store's snapshots, the build cache and deleted sandboxes are swept
	 * every minute, or every grace period when that is shorter */
	int sweep_every = cp->snapshot_grace < 60 ? cp->snapshot_grace : 60, ticks = 0, compact_ticks = 0;
	while (!cp->stopping) {
		for (int i = 0; i < 10 && !cp->stopping; i++)
			usleep(100000);
		cp_observe_flush(false); /* refusals' summaries that are due */
		if (!cp->stopping)
			cp_reap(cp, st);
		if (!cp->stopping)
			cp_store_usage_fold(st); /* PostgreSQL: the counts' changes added in */
		if (!cp->stopping && ++compact_ticks >= 10) {
			compact_ticks = 0;
			cp_outbox_compact(cp, st); /* every 10 s: acknowledged bodies are not kept */
		}
		if (!cp->stopping && ++ticks >= sweep_every) {
			ticks = 0;
			cp_snapshots_sweep(cp, st);
			cp_build_cache_sweep(cp, st);
			cp_deleted_sweep(cp, st);
		}
	}
	cp_store_close(st);
	return NULL;
}

/* The replica's stable name, created once in STATE/replica.id. */
static int replica_id(struct cp *cp)
{
	char path[1100], buf[32] = "";
	snprintf(path, sizeof path, "%s/replica.id", cp->state_dir);
	FILE *f = fopen(path, "r");
	if (f != NULL) {
		if (fgets(buf, sizeof buf, f) == NULL)
			buf[0] = 0;
		fclose(f);
		buf[strcspn(buf, "\n")] = 0;
	}
	if (strlen(buf) != 17 || buf[0] != 'r') {
		char name[SPACED_NAME_MAX];
		cp_random_name(name, "r");
		memcpy(buf, name, 18); /* "r" + 16 hex + NUL */
		f = fopen(path, "w");
		if (f == NULL)
			return -1;
		fprintf(f, "%s\n", buf);
		if (fclose(f) != 0)
			return -1;
	}
	memcpy(cp->replica_id, buf, 18);
	return 0;
}

static int admin(const char *db, int argc, char **argv)
{
	struct cp_store *st = NULL;
	char *key = NULL, tid[SPACED_NAME_MAX];
	int r;
	if (argc < 1) {
		fputs(usage, stderr);
		return 2;
	}
	if ((r = cp_store_open(db, &st)) < 0) {
		fprintf(stderr, "spaced-cp: cannot open store %s: %s\n", db, spaced_strerror(r));
		return 1;
	}
	if (strcmp(argv[0], "create-tenant") == 0 && argc == 2) {
		if (!spaced_name_valid(argv[1], strlen(argv[1]))) {
			fprintf(stderr, "spaced-cp: a tenant name is 1-63 characters of [A-Za-z0-9._-]\n");
			r = SPACED_EINVAL;
			goto out;
		}
		if ((r = cp_store_begin(st)) < 0 || (r = cp_tenant_create(st, argv[1], tid)) < 0 ||
		    (r = cp_key_create(st, CP_ROLE_TENANT, tid, 0, &key)) < 0 || (r = cp_store_commit(st)) < 0)
			goto out;
		fprintf(stderr, "tenant %s (%s) created; its API key (shown once):\n", argv[1], tid);
	} else if (strcmp(argv[0], "create-api-key") == 0 && argc == 2) {
		struct cp_rows *rows = NULL;
		if ((r = CP_Q(st, &rows, NULL, "SELECT id FROM tenants WHERE name = $1", argv[1])) < 0)
			goto out;
		if (rows->nrows != 1) {
			cp_rows_free(rows);
			r = SPACED_ENOENT;
			goto out;
		}
		r = cp_key_create(st, CP_ROLE_TENANT, cp_rows_get(rows, 0, 0), 0, &key);
		cp_rows_free(rows);
		if (r < 0)
			goto out;
	} else if (strcmp(argv[0], "create-join-token") == 0 && (argc == 2 || argc == 3)) {
		char *end = NULL;
		long ttl = argc == 3 ? strtol(argv[2], &end, 10) : 3600;
		if (!spaced_name_valid(argv[1], strlen(argv[1])) || (argc == 3 && (*end || ttl < 1 || ttl > 30 * 86400))) {
			fprintf(stderr, "spaced-cp: create-join-token wants a worker ID (1-63 of [A-Za-z0-9._-]) and a "
			                "lifetime of 1 .. 2592000 seconds\n");
			r = SPACED_EINVAL;
			goto out;
		}
		if ((r = cp_key_create(st, CP_ROLE_JOIN, argv[1], spaced_now() + ttl, &key)) < 0)
			goto out;
		fprintf(stderr, "join token for worker %s, single use, valid %ld s (shown once):\n", argv[1], ttl);
	} else if (strcmp(argv[0], "revoke-worker") == 0 && argc == 2) {
		long ch = 0;
		if ((r = CP_Q(st, NULL, &ch, "DELETE FROM api_keys WHERE role IN ('worker', 'join') AND tenant = $1",
		              argv[1])) < 0)
			goto out;
		fprintf(stderr, "%ld key(s) of worker %s revoked\n", ch, argv[1]);
		cp_store_close(st);
		return 0;
	} else if (strcmp(argv[0], "worker-lost") == 0 && argc == 2) {
		long ch = 0;
		char now[24];
		if ((r = CP_Q(st, NULL, &ch, "UPDATE workers SET lost = $2 WHERE id = $1", argv[1],
		              cp_i64(now, spaced_now()))) < 0)
			goto out;
		if (ch != 1) {
			r = SPACED_ENOENT;
			goto out;
		}
		fprintf(stderr,
		        "worker %s declared lost: its sandboxes may start elsewhere and their deletes complete; if it "
		        "comes back it is sent what it missed\n",
		        argv[1]);
		cp_store_close(st);
		return 0;
	} else if (strcmp(argv[0], "create-admin-key") == 0 && argc == 1) {
		if ((r = cp_key_create(st, CP_ROLE_ADMIN, NULL, 0, &key)) < 0)
			goto out;
	} else if (strcmp(argv[0], "set-quota") == 0 && argc == 3) {
		struct cp_quota q = {-2, -2, -2, -2, -2}; /* -2: not named, stays */
		char a[24], b[24], c[24], d[24], e[24];
		long ch = 0;
		if (parse_quota(argv[2], &q, 1) < 0) {
			fprintf(stderr,
			        "spaced-cp: set-quota wants sandboxes=N,memory=SIZE,disk=SIZE,templates=SIZE,pids=N (or =default)\n");
			r = SPACED_EINVAL;
			goto out;
		}
		r = CP_Q(st, NULL, &ch,
		         "UPDATE tenants SET max_sandboxes = CASE WHEN CAST($2 AS BIGINT) = -2 THEN max_sandboxes "
		         "ELSE CAST($2 AS BIGINT) END, "
		         "max_memory = CASE WHEN CAST($3 AS BIGINT) = -2 THEN max_memory ELSE CAST($3 AS BIGINT) END, "
		         "max_disk = CASE WHEN CAST($4 AS BIGINT) = -2 THEN max_disk ELSE CAST($4 AS BIGINT) END, "
		         "max_templates = CASE WHEN CAST($5 AS BIGINT) = -2 THEN max_templates ELSE CAST($5 AS BIGINT) END, "
		         "max_pids = CASE WHEN CAST($6 AS BIGINT) = -2 THEN max_pids ELSE CAST($6 AS BIGINT) END "
		         "WHERE name = $1",
		         argv[1], cp_i64(a, q.sandboxes), cp_i64(b, q.memory), cp_i64(c, q.disk), cp_i64(d, q.templates),
		         cp_i64(e, q.pids));
		if (r == 0 && ch != 1)
			r = SPACED_ENOENT;
		if (r < 0)
			goto out;
		fprintf(stderr, "quota of tenant %s set\n", argv[1]);
		cp_store_close(st);
		return 0;
	} else {
		fputs(usage, stderr);
		cp_store_close(st);
		return 2;
	}
	printf("%s\n", key);
	r = 0;
out:
	if (r < 0) {
		cp_store_rollback(st);
		fprintf(stderr, "spaced-cp: admin %s: %s\n", argv[0], spaced_strerror(r));
	}
	if (key != NULL) {
		sodium_memzero(key, strlen(key));
		free(key);
	}
	cp_store_close(st);
	return r < 0 ? 1 : 0;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"state", required_argument, NULL, 's'},    {"listen", required_argument, NULL, 'l'},
		{"db", required_argument, NULL, 'd'},       {"ack-timeout", required_argument, NULL, 'a'},
		{"idle-timeout", required_argument, NULL, 'i'}, {"max-lifetime", required_argument, NULL, 'm'},
		{"threads", required_argument, NULL, 't'},  {"op-lease", required_argument, NULL, 'o'},
		{"move-drain", required_argument, NULL, 'D'},
		{"quota", required_argument, NULL, 'Q'},
		{"default-substrate", required_argument, NULL, 5},
		{"head-timeout", required_argument, NULL, 'H'},
		{"max-conns", required_argument, NULL, 'C'},
		{"max-conns-per-ip", required_argument, NULL, 'P'},
		{"tls-cert", required_argument, NULL, 1},
		{"tls-key", required_argument, NULL, 2},
		{"tls-client-ca", required_argument, NULL, 3},
		{"plaintext", no_argument, NULL, 4},
		{"metrics-listen", required_argument, NULL, 'M'},
		{"log-format", required_argument, NULL, 'L'},
		{"store-listen", required_argument, NULL, 'S'},
		{"template-max", required_argument, NULL, 'T'},
		{"snapshot-max", required_argument, NULL, 'X'},
		{"snapshot-grace", required_argument, NULL, 6},
		{"snapshot-timeout", required_argument, NULL, 9},
		{"build-cache", required_argument, NULL, 7},
		{"retain-deleted", required_argument, NULL, 8},
		{"create-rate", required_argument, NULL, 10},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0}};
	/* tenants' default quotas: 50 sandboxes, 32 GiB of memory limits, 200 GiB of disk limits */
	struct cp cp = {.ack_timeout_ms = 10000, .snapshot_timeout_ms = 100000, .nthreads = 8, .signer_fd = -1, .port = -1, .op_lease = CP_OP_LEASE,
	                 .move_drain_ms = CP_MOVE_DRAIN_MS, .quota_default = {50, 32ll << 30, 200ll << 30, 50ll << 30, 32768},
	                 .head_timeout_ms = 10000, .max_conns = 4096, .max_conns_per_ip = 256,
	                 .snapshot_grace = CP_SNAPSHOT_GRACE, .retain_deleted = 7 * 86400,
	                 .create_rate = CP_CREATE_RATE};
	const char *listen = NULL, *metrics_listen = NULL;
	char dbbuf[1200], cfg_err[256];
	const char *store_listen = NULL;
	uint64_t sz;
	/* templates up to 8 GiB of archive and of content; snapshots up to 64 GiB */
	cp.template_max = UINT64_C(8) << 30;
	cp.snapshot_max = UINT64_C(64) << 30;
	cp.build_cache_max = UINT64_C(20) << 30; /* build steps' trees no template names */
	spaced_rootfs_limits_default(&cp.template_limits);
	int is_admin = argc > 1 && strcmp(argv[1], "admin") == 0, c, r;
	if (sodium_init() < 0)
		return 1;
	struct spaced_tls_opts tls = {0};
	char cerr[600];
	if (is_admin) {
		argc--;
		argv++;
	} else if (spaced_config_expand(argc, argv, &argc, &argv, cfg_err, sizeof cfg_err) < 0) {
		fprintf(stderr, "spaced-cp: --config: %s\n", cfg_err);
		return 2;
	}
	while ((c = getopt_long(argc, argv, "+h", longopts, NULL)) != -1) {
		switch (c) {
		case 's': cp.state_dir = optarg; break;
		case 'l': listen = optarg; break;
		case 'd': cp.db_url = optarg; break;
		case 'a': cp.ack_timeout_ms = atoi(optarg); break;
		case 9: cp.snapshot_timeout_ms = atoi(optarg); break;
		case 'i': cp.idle_timeout = atoll(optarg); break;
		case 'm': cp.max_lifetime = atoll(optarg); break;
		case 't': cp.nthreads = atoi(optarg); break;
		case 'o': cp.op_lease = atoll(optarg); break;
		case 'D': cp.move_drain_ms = atoi(optarg); break;
		case 'H': cp.head_timeout_ms = atoi(optarg); break;
		case 'C': cp.max_conns = atoi(optarg); break;
		case 'P': cp.max_conns_per_ip = atoi(optarg); break;
		case 1: tls.cert = optarg; break;
		case 2: tls.key = optarg; break;
		case 3: tls.client_ca = optarg; break;
		case 4: tls.plaintext = true; break;
		case 'M': metrics_listen = optarg; break;
		case 'L': {
			enum spaced_log_format lf;
			if (spaced_log_format_parse(optarg, &lf) < 0) {
				fprintf(stderr, "spaced-cp: --log-format wants text or json\n");
				return 2;
			}
			spaced_log_set_format(lf);
			break;
		}
		case 'S': store_listen = optarg; break;
		case 'T':
		case 'X':
			if (spaced_size_parse(optarg, &sz) < 0 || sz == 0) {
				fprintf(stderr, "spaced-cp: --%s wants a size\n", c == 'T' ? "template-max" : "snapshot-max");
				return 2;
			}
			if (c == 'T')
				cp.template_max = cp.template_limits.max_bytes = sz;
			else
				cp.snapshot_max = sz;
			break;
		case 6: {
			char *end;
			long g = strtol(optarg, &end, 10);
			if (*end || g < 1 || g > 30L * 86400) {
				fprintf(stderr, "spaced-cp: --snapshot-grace wants seconds (1 .. 2592000)\n");
				return 2;
			}
			cp.snapshot_grace = (int)g;
			break;
		}
		case 8: {
			char *end;
			long d = strtol(optarg, &end, 10);
			if (*end || d < 0 || d > 3650L * 86400) {
				fprintf(stderr, "spaced-cp: --retain-deleted wants seconds (0: forever)\n");
				return 2;
			}
			cp.retain_deleted = d;
			break;
		}
		case 10: {
			char *end;
			long n = strtol(optarg, &end, 10);
			if (*end || end == optarg || n < 0 || n > 100000) {
				fprintf(stderr, "spaced-cp: --create-rate wants creates a second per tenant (0: no bound; at "
				                "most 100000)\n");
				return 2;
			}
			cp.create_rate = (unsigned)n;
			break;
		}
		case 7:
			if (spaced_size_parse(optarg, &sz) < 0) {
				fprintf(stderr, "spaced-cp: --build-cache wants a size\n");
				return 2;
			}
			cp.build_cache_max = sz;
			break;
		case 'Q':
			if (parse_quota(optarg, &cp.quota_default, 0) < 0) {
				fprintf(stderr, "spaced-cp: --quota wants sandboxes=N,memory=SIZE,disk=SIZE,templates=SIZE,pids=N (0: no limit)\n");
				return 2;
			}
			break;
		case 5:
			if (!spaced_name_valid(optarg, strlen(optarg))) {
				fprintf(stderr, "spaced-cp: --default-substrate wants a substrate name\n");
				return 2;
			}
			snprintf(cp.default_substrate, sizeof cp.default_substrate, "%s", optarg);
			break;
		case 'h': fputs(usage, stdout); return 0;
		default: fputs(usage, stderr); return 2;
		}
	}
	if (cp.state_dir == NULL || cp.ack_timeout_ms < 100 || cp.snapshot_timeout_ms < 100 || cp.nthreads < 1 ||
	    cp.nthreads > 64 ||
	    cp.idle_timeout < 0 || cp.max_lifetime < 0 || cp.op_lease < 1 ||
	    cp.move_drain_ms < 0 || cp.move_drain_ms > 10000 || cp.head_timeout_ms < 100 ||
	    cp.head_timeout_ms > 600000 || cp.max_conns < 1 || cp.max_conns_per_ip < 1) {
		fputs(usage, stderr);
		return 2;
	}
	if (mkdir(cp.state_dir, 0700) < 0 && errno != EEXIST) {
		fprintf(stderr, "spaced-cp: cannot create %s: %s\n", cp.state_dir, strerror(errno));
		return 1;
	}
	/* absolute: snapshot paths handed to workers must be absolute */
	static char abs_state[PATH_MAX];
	if (realpath(cp.state_dir, abs_state) == NULL) {
		fprintf(stderr, "spaced-cp: %s: %s\n", cp.state_dir, strerror(errno));
		return 1;
	}
	cp.state_dir = abs_state;
	if (cp.db_url == NULL) {
		if (strlen(cp.state_dir) + sizeof "sqlite:/cp.db" > sizeof dbbuf) {
			fprintf(stderr, "spaced-cp: state directory path too long\n");
			return 1;
		}
		snprintf(dbbuf, sizeof dbbuf, "sqlite:%.*s/cp.db", (int)(sizeof dbbuf - sizeof "sqlite:/cp.db"),
		         cp.state_dir);
		cp.db_url = dbbuf;
	}
	if (is_admin) {
		int rc = admin(cp.db_url, argc - optind, argv + optind);
		if (optind < argc && cp_audit_open(cp.state_dir) == 0)
			cp_audit_admin(argv[optind], optind + 1 < argc ? argv[optind + 1] : "", rc == 0);
		return rc;
	}
	if (listen == NULL || optind != argc) {
		fputs(usage, stderr);
		return 2;
	}
	/* TLS on the listener unless --plaintext says otherwise; with a client
	 * CA, the worker endpoints want a client certificate naming the worker */
	if (spaced_tls_opts_check(&tls, cerr, sizeof cerr) < 0) {
		fprintf(stderr, "spaced-cp: %s\n", cerr);
		return 2;
	}
	if (!tls.plaintext) {
		char terr[600];
		if (spaced_tls_server_ctx(tls.cert, tls.key, tls.client_ca, false, &cp.tls, terr, sizeof terr) < 0) {
			fprintf(stderr, "spaced-cp: %s\n", terr);
			return 2;
		}
		cp.mtls = tls.client_ca != NULL;
	}
	const char *colon = strrchr(listen, ':');
	if (colon == NULL || (size_t)(colon - listen) >= sizeof cp.listen_host || colon == listen) {
		fputs(usage, stderr);
		return 2;
	}
	memcpy(cp.listen_host, listen, (size_t)(colon - listen));
	cp.port = atoi(colon + 1);
	if (cp.port < 0 || cp.port > 65535) {
		fputs(usage, stderr);
		return 2;
	}
	if (metrics_listen) {
		const char *mc = strrchr(metrics_listen, ':');
		if (!mc || mc == metrics_listen || (size_t)(mc - metrics_listen) >= sizeof cp.metrics_host ||
		    atoi(mc + 1) < 0 || atoi(mc + 1) > 65535) {
			fprintf(stderr, "spaced-cp: --metrics-listen wants HOST:PORT\n");
			return 2;
		}
		memcpy(cp.metrics_host, metrics_listen, (size_t)(mc - metrics_listen));
		cp.metrics_port = atoi(mc + 1);
	}
	if (cp_audit_open(cp.state_dir) < 0) {
		fprintf(stderr, "spaced-cp: cannot open %s/audit.log\n", cp.state_dir);
		return 1;
	}
	char snaps[1100];
	snprintf(snaps, sizeof snaps, "%s/snapshots", cp.state_dir);
	mkdir(snaps, 0700);
	/* the store listens on the API's host unless told otherwise, on a port of its own */
	snprintf(cp.store_host, sizeof cp.store_host, "%s", cp.listen_host);
	cp.store_port = 0;
	if (store_listen != NULL) {
		const char *sc = strrchr(store_listen, ':');
		if (sc == NULL || sc == store_listen || (size_t)(sc - store_listen) >= sizeof cp.store_host ||
		    atoi(sc + 1) < 0 || atoi(sc + 1) > 65535) {
			fputs(usage, stderr);
			return 2;
		}
		memcpy(cp.store_host, store_listen, (size_t)(sc - store_listen));
		cp.store_host[sc - store_listen] = 0;
		cp.store_port = atoi(sc + 1);
	}
	if (snprintf(cp.store_dir, sizeof cp.store_dir, "%s/store", cp.state_dir) >= (int)sizeof cp.store_dir) {
		fprintf(stderr, "spaced-cp: state directory path too long\n");
		return 1;
	}
	if ((r = cp_blobs_start(&cp)) < 0) {
		fprintf(stderr, "spaced-cp: the store cannot listen on %s:%d: %s\n", cp.store_host, cp.store_port,
		        spaced_strerror(r));
		return 1;
	}
	if (replica_id(&cp) < 0) {
		fprintf(stderr, "spaced-cp: cannot read or create %s/replica.id\n", cp.state_dir);
		return 1;
	}
	pthread_mutex_init(&cp.mu, NULL);
	pthread_mutex_init(&cp.signer_mu, NULL);
	pthread_mutex_init(&cp.recent_mu, NULL);
	if ((r = cp_store_open(cp.db_url, &cp.loop_st)) < 0) {
		fprintf(stderr, "spaced-cp: cannot open store %s: %s\n", cp.db_url, spaced_strerror(r));
		return 1;
	}
	if ((r = cp_store_usage_setup(cp.loop_st)) < 0) {
		fprintf(stderr, "spaced-cp: cannot count the workers' sandboxes in %s: %s\n", cp.db_url, spaced_strerror(r));
		cp_store_close(cp.loop_st);
		return 1;
	}
	if ((r = cp_chan_seq_restart(cp.loop_st)) < 0) {
		fprintf(stderr, "spaced-cp: cannot make %s durable: %s\n", cp.db_url, spaced_strerror(r));
		cp_store_close(cp.loop_st);
		return 1;
	}
	if ((r = cp_signer_start(&cp)) < 0 || (r = cp_keys_sync(&cp, cp.loop_st)) < 0) {
		fprintf(stderr, "spaced-cp: signer: %s\n", spaced_strerror(r));
		cp_signer_stop(&cp);
		cp_store_close(cp.loop_st);
		return 1;
	}
	/* Leases this replica held before a crash are dead: release them so the
	 * reaper finishes those operations (other replicas' leases stay). */
	char like[40];
	snprintf(like, sizeof like, "%%@%s", cp.replica_id);
	CP_Q(cp.loop_st, NULL, NULL, "UPDATE sandboxes SET op_until = 0 WHERE op LIKE $1", like);
	/* and so are the channels it held */
	CP_Q(cp.loop_st, NULL, NULL, "UPDATE workers SET channel_until = 0 WHERE channel_replica = $1", cp.replica_id);
	pthread_t reaper;
	int have_reaper = pthread_create(&reaper, NULL, reaper_thread, &cp) == 0;
	r = cp_server_run(&cp);
	cp.stopping = 1;
	if (have_reaper)
		pthread_join(reaper, NULL);
	cp_observe_flush(true);
	cp_signer_stop(&cp);
	cp_store_close(cp.loop_st);
	SSL_CTX_free(cp.tls);
	return r < 0 ? 1 : 0;
}
