/*
 * gate_gw.c — the activation record the gate pushes to each execution's
 * ServicePort gateway (spaced-netgtw, R5; docs/network.md "ServicePorts").
 *
 * Right after every record change is on disk (and at start, for every record
 * loaded), the gate writes STATE/gw/<sandbox>/record.json —
 * {"identity": {...}, "epoch": N, "active": bool, "paused": bool, "fenced": bool}
 * — by rename, so a gateway
 * that watches the directory (inotify) reads a whole record or the previous
 * one, never a torn one. A directory per sandbox, the file written beside
 * the record (GW_RECORD_TMP) and renamed over it: a record changed wakes its
 * own gateway only, not the gateway of every execution on the worker. The gateway compares
 * every new open with it and every established stream again (S1, S4).
 */
#include "gate.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "spaced_error.h"

/* Writes text to path through tmp (rename). */
static void publish_at(const char *tmp, const char *path, const char *text, const char *sandbox)
{
	if (spaced_file_replace(tmp, path, text, strlen(text), 0600, false) < 0)
		gate_log("level=warn event=gw-publish-failed sandbox=%s", sandbox);
}

void gate_gw_publish(struct mgr *m, const struct mgr_rec *rec)
{
	char dir[4096], sdir[4200], path[4300], tmp[4300];
	struct stat st;
	/* a directory named after the sandbox: never "." or ".." (valid names) */
	if (rec->r.id.sandbox[0] == '.')
		return;
	snprintf(dir, sizeof dir, "%s/gw", m->cfg->state_dir);
	snprintf(sdir, sizeof sdir, "%s/%s", dir, rec->r.id.sandbox);
	if ((mkdir(dir, 0700) < 0 && errno != EEXIST) || (mkdir(sdir, 0700) < 0 && errno != EEXIST))
		return;
	/* in the sandbox's directory: a pooled gateway's came with its
	 * temporary file made (mgr_exec.c), so the first record of a claim
	 * allocates no inode; the gateway ignores the temporary file's events */
	snprintf(tmp, sizeof tmp, "%s/" GW_RECORD_TMP, sdir);
	json_t *j = json_pack("{s:o,s:I,s:b,s:b,s:b}", "identity", spaced_identity_to_json(&rec->r.id), "epoch",
	                      (json_int_t)rec->r.epoch, "active", rec->r.active, "paused",
	                      strcmp(rec->state, MGR_ST_PAUSED) == 0, "fenced", gate_fenced(m));
	char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	if (!text)
		return;
	snprintf(path, sizeof path, "%s/record.json", sdir);
	publish_at(tmp, path, text, rec->r.id.sandbox);
	/* a gateway started by an earlier spaced-node watches STATE/gw/<sandbox>.json:
	 * kept up to date while it is there */
	snprintf(path, sizeof path, "%s/%s.json", dir, rec->r.id.sandbox);
	if (lstat(path, &st) == 0 && S_ISREG(st.st_mode))
		publish_at(tmp, path, text, rec->r.id.sandbox);
	free(text);
}

void gate_gw_forget(struct mgr *m, const char *sandbox)
{
	char path[4300];
	if (sandbox[0] == '.')
		return;
	static const char *const files[] = {"record.json", GW_RECORD_TMP};
	for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
		snprintf(path, sizeof path, "%s/gw/%s/%s", m->cfg->state_dir, sandbox, files[i]);
		unlink(path);
	}
	snprintf(path, sizeof path, "%s/gw/%s", m->cfg->state_dir, sandbox);
	rmdir(path);
	snprintf(path, sizeof path, "%s/gw/%s.json", m->cfg->state_dir, sandbox);
	unlink(path);
}
