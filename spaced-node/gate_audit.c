/*
 * gate_audit.c — the worker's audit log: STATE/audit.log (0600), one JSON
 * object per line, appended and never rewritten (opened O_APPEND, one write
 * per line). An operator who wants the kernel to refuse anything but appends
 * marks it `chattr +a`; shipping it off the worker is the stronger guarantee. Every DENY the gate answers is
 * there with its reason, the caller's address, the request id, the purpose
 * and the identity the capability named (when it could be verified); every
 * lifecycle change the control plane made (install, deactivate, pause, thaw,
 * snapshot, destroy) with its seq, the identity and its outcome. The lines
 * about refused requests are held to a rate per caller address and for all
 * callers together (ratelimit.h); what is held back is counted, in the
 * caller's next line ("suppressed") and in the metrics.
 */
#include "gate.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "spaced_error.h"
#include "log.h"
#include "ratelimit.h"
#include "util.h"

static int audit_fd = -1;
static struct spaced_ratelimit *refusals; /* the gate's one thread */

/* A caller's refusals held back past its rate: one line, each reason's count
 * (DESIGN §5: every DENY in the audit log with its caller and reason). */
static void refusals_summary(void *ctx, const char *caller, const struct spaced_ratelimit_held *held, size_t n)
{
	uint64_t total = 0;
	for (size_t i = 0; i < n; i++)
		total += held[i].count;
	gate_audit(ctx, spaced_ratelimit_summary_json(caller, held, n));
	gate_log("level=info event=refusals-held-back caller=%s total=%llu", caller, (unsigned long long)total);
}

int gate_audit_open(struct mgr *m)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/audit.log", m->cfg->state_dir);
	audit_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (audit_fd < 0 || !(refusals = spaced_ratelimit_audit_deny()))
		return SPACED_EIO;
	spaced_ratelimit_on_summary(refusals, refusals_summary, m);
	return 0;
}

bool gate_audit_refusal_allowed(const char *caller, const char *reason)
{
	return !refusals || spaced_ratelimit_take(refusals, caller, reason, spaced_mono_ns());
}

void gate_audit_flush(bool all)
{
	spaced_ratelimit_flush(refusals, spaced_mono_ns(), all);
}

uint64_t gate_audit_suppressed_total(void)
{
	return spaced_ratelimit_suppressed_total(refusals);
}

void gate_audit(struct mgr *m, json_t *entry)
{
	(void)m;
	if (!entry)
		return;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	char when[40];
	struct tm tm;
	gmtime_r(&ts.tv_sec, &tm);
	size_t n = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(when + n, sizeof when - n, ".%03ldZ", ts.tv_nsec / 1000000);
	json_t *line = json_pack("{s:s}", "time", when);
	json_object_update(line, entry);
	json_decref(entry);
	char *text = json_dumps(line, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(line);
	if (!text)
		return;
	size_t len = strlen(text);
	text[len] = '\n'; /* one write per line: O_APPEND keeps lines whole */
	if (audit_fd < 0 || write(audit_fd, text, len + 1) != (ssize_t)(len + 1))
		gate_log("level=error event=audit-write-failed entry=%.*s", (int)len, text);
	free(text);
}
