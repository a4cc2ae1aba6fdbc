#!/bin/sh
# run-tests: paired, about 9 s
# The `spacectl dev up` keeper and a cluster directory removed under it. Before, the keeper started
# the cluster's processes again when they died and recreated their files at the old paths: a
# cluster whose directory was removed (rm -rf, which also fails on the worker's mounted egress
# namespace) kept running in what was left, and one made again in the same place had an old
# keeper restarting the old processes into it, holding its uid ranges; `dev down` of the new one
# did not stop it. Now the keeper sees its directory (or its DIR/pids) gone, or another keeper's
# name in DIR/pids, stops what it started and — unless another cluster is there — the executions
# and the egress namespaces too (once nothing of the cluster can make them again: a pool that
# fills remade an unmounted one); another cluster made at the same path is never touched.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
SC=$SPACED_BUILD/spacectl/spacectl
[ -x "$SC" ] || { echo "spacectl is not built"; exit 77; }
W=$(mktemp -d)
trap 'for d in a b c; do "$SC" dev down --dir "$W/$d" >/dev/null 2>&1; done; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
named() { ps -eo args= | grep -F "$1" | grep -v grep | wc -l | tr -d ' '; }
# running: a zombie is not (a stopped child of a keeper that ended waits there for its reaper)
pid_alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }

# ---- removed under a running cluster with a sandbox (its egress namespace mounted) ----
A=$W/a
"$SC" dev up --workers 1 --dir "$A" >"$W/a.up" 2>&1 || { cat "$W/a.up"; echo "FAIL: dev up"; exit 1; }
X=$(SPACED_ROUTE_CACHE=$W/routes-a sh -c ". '$A/env'; '$SC' create") || { echo "FAIL: create"; exit 1; }
expect "the sandbox runs" "$(SPACED_ROUTE_CACHE=$W/routes-a sh -c ". '$A/env'; '$SC' exec $X -- echo up")" up
[ "$(named "$A/")" -gt 0 ] && ok "the cluster's processes run ($(named "$A/"))" || fail "no process names $A"
rm -rf "$A" 2>/dev/null
WAIT_SECONDS=30 wait_for "every process of the removed cluster stopped (workers, control plane, executions)" \
	sh -c "[ \$(ps -eo args= | grep -F '$A/' | grep -v grep | wc -l) -eq 0 ]"
sleep 1
made=$(find "$A" -name pids -o -name '*.log' 2>/dev/null)
expect "nothing made its files again" "$(echo "$made" | grep -c .)" 0
[ -z "$made" ] || { echo "  made again: $made"; ls -la --time-style=+%T.%N $made; }
expect "its egress namespace is unmounted" "$(grep -cF "$A/" /proc/mounts)" 0
rm -rf "$A" && ok "what rm -rf could not remove goes now" || fail "the directory still cannot be removed"
expect "no loop device holds a disk of it" "$(losetup -a 2>/dev/null | grep -cF "$A/")" 0

# ---- removed while its pool fills: each pooled start attaches to the egress namespace and makes
# it again when it is gone, so it is unmounted once the cluster's processes are stopped, not before ----
C=$W/c
"$SC" dev up --workers 1 --dir "$C" --pool 24 >"$W/c.up" 2>&1 || { cat "$W/c.up"; echo "FAIL: dev up"; exit 1; }
rm -rf "$C" 2>/dev/null
WAIT_SECONDS=30 wait_for "every process of the cluster removed while its pool filled stopped" \
	sh -c "[ \$(ps -eo args= | grep -F '$C/' | grep -v grep | wc -l) -eq 0 ]" ||
	{ ps -eo pid,ppid,sid,etimes,stat,args | grep -F "$C/" | grep -v grep | head -n 20; pgrep -af 'dev up' | head; }
sleep 1
expect "its egress namespace is unmounted" "$(grep -cF "$C/" /proc/mounts)" 0
rm -rf "$C" && ok "and the directory goes" || fail "the directory of the cluster removed while its pool filled stays"

# ---- removed and made again at once: the old keeper stops its own, never the new cluster ----
B=$W/b
"$SC" dev up --workers 1 --dir "$B" >"$W/b.up" 2>&1 || { cat "$W/b.up"; echo "FAIL: dev up"; exit 1; }
OLDK=$(awk '$1 == "keeper" {print $2}' "$B/pids")
OLDW=$(awk '$1 == "worker-1" {print $2}' "$B/pids")
rm -rf "$B"
"$SC" dev up --workers 1 --dir "$B" >"$W/b2.up" 2>&1 || { cat "$W/b2.up"; echo "FAIL: dev up again"; exit 1; }
NEWK=$(awk '$1 == "keeper" {print $2}' "$B/pids")
NEWW=$(awk '$1 == "worker-1" {print $2}' "$B/pids")
WAIT_SECONDS=15 wait_for "the old keeper ended" sh -c "! kill -0 $OLDK 2>/dev/null"
expect "the old worker was stopped" "$(pid_alive "$OLDW" && echo running || echo stopped)" stopped
sleep 2
expect "the new keeper and worker run" "$(pid_alive "$NEWK" && pid_alive "$NEWW" && echo yes)" yes
pid_alive "$NEWK" && pid_alive "$NEWW" ||
	{ echo "keeper $NEWK worker $NEWW; now: $(tr '\n' ' ' <"$B/pids")"; tail -n 15 "$B/keeper.log" "$B"/worker-1*.log; }
Y=$(SPACED_ROUTE_CACHE=$W/routes-b sh -c ". '$B/env'; '$SC' create") || fail "create on the new cluster"
expect "the new cluster serves" "$(SPACED_ROUTE_CACHE=$W/routes-b sh -c ". '$B/env'; '$SC' exec $Y -- echo fine")" fine
"$SC" dev down --dir "$B" >/dev/null 2>&1
sleep 1
expect "after dev down of the new cluster nothing of either runs" "$(named "$B/")" 0
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
