#!/bin/sh
# run-tests: alone (a 6 s lock window)
# The gate's loop never waits for its records' disk (issue 12, item 2: sbx-manager never blocks).
# Every write of the worker's records — an install with its acknowledgement, a tombstone, the
# forgetting of old ones — goes to a writer thread of its own (spaced-node/gate_commit.c); the
# loop goes on verifying and forwarding meanwhile, and an acknowledgement still leaves only once
# its record is on disk. Here another process holds the write lock of the worker's records.db
# for 6 s (what a transaction waiting for a slow disk does): a create issued meanwhile is
# answered only after the lock is let go (and then succeeds), while a victim's reads issued
# after it are all answered before the lock is let go. On a loop that wrote its records itself,
# the create's commit held the loop in SQLite's busy wait: every read waited for the lock too.
# A delete of a second sandbox asked meanwhile: its tombstone refuses the old capability at once
# (R4: the window closes when the worker installs the deactivation), before it can reach the disk,
# and the delete is answered only after the lock is let go (R1: the record a worker compares with
# is its persisted one, so an acknowledgement means on disk). Then an install whose record cannot
# be written at all: the execution claimed for it is stopped (R1: nothing persisted names it).
# Ordering and counts only, no timed assertion. Cites R1, R4 and B3.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
SC=$SPACED_BUILD/spacectl/spacectl
command -v python3 >/dev/null 2>&1 || { echo "python3 is not installed"; exit 77; }
W=$(mktemp -d)
D=$W/cluster
export SPACED_ROUTE_CACHE="$W/routes"
HOLDER=""
trap '[ -n "$HOLDER" ] && kill $HOLDER 2>/dev/null; "$SC" dev down --dir "$D" >/dev/null 2>&1; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT

if ! "$SC" dev up --workers 1 --dir "$D" >"$W/up.out" 2>"$W/up.err"; then
	cat "$W/up.err"; tail -n 20 "$D"/*.log 2>/dev/null
	echo "FAIL: dev up"; exit 1
fi
. "$D/env"
DB=$D/worker-1/records.db
[ -f "$DB" ] || { echo "FAIL: no records.db at $DB"; ls "$D/worker-1"; exit 1; }
V=$("$SC" create --worker worker-1) || { echo "FAIL: the victim's sandbox"; tail "$D/worker-1.log"; exit 1; }
echo "the victim's file" | "$SC" fs write "$V" /tmp/f || fail "the victim's file"
P=$("$SC" create --worker worker-1) || { echo "FAIL: the sandbox to delete"; exit 1; }
echo "its file" | "$SC" fs write "$P" /tmp/f || fail "the file of the sandbox to delete"

# the holder: the write lock for 6 s, then the time it let it go (ns, the wall clock `date` reads)
hold_store_lock "$DB" 6 "$W/held"
expect "another process holds the records' write lock" "$(head -n 1 "$W/held")" held

# a create now: its install's write waits for the lock
( "$SC" create --worker worker-1 >"$W/new.id" 2>"$W/new.err"; echo $? >"$W/new.rc"; date +%s%N >"$W/new.at" ) &
CREATOR=$!
sleep 0.5
# the victim's reads, issued after it
ok=0
n=0
while [ $n -lt 6 ]; do
	[ "$("$SC" fs read "$V" /tmp/f 2>/dev/null)" = "the victim's file" ] && ok=$((ok + 1))
	n=$((n + 1))
done
reads_at=$(date +%s%N)
# a delete now: its tombstone refuses the old capability before its write can be done (the route
# taken just before: a capability lives seconds)
"$SC" route "$P" --json >"$W/p-route.json" || fail "the route of the sandbox to delete"
( "$SC" rm "$P" >/dev/null 2>"$W/rm.err"; echo $? >"$W/rm.rc"; date +%s%N >"$W/rm.at" ) &
REMOVER=$!
n=0
refused=""
while [ $n -lt 40 ] && [ -z "$refused" ]; do
	timeout 10 "$SC" fs read --no-retry --route "$W/p-route.json" "$P" /tmp/f >/dev/null 2>"$W/p-read.err"
	grep -q '^outcome: REFRESH_ROUTE (deactivated)' "$W/p-read.err" && refused=$(date +%s%N)
	n=$((n + 1))
	[ -n "$refused" ] || sleep 0.05
done
echo "the deleted sandbox's old capability, last outcome: $(cat "$W/p-read.err")"
wait "$HOLDER"
HOLDER=""
released_at=$(sed -n 2p "$W/held")
wait "$CREATOR"
wait "$REMOVER"
echo "reads done $(( (released_at - reads_at) / 1000000 )) ms before the lock was let go;" \
	"the create answered $(( ($(cat "$W/new.at") - released_at) / 1000000 )) ms after"
expect "six reads of the victim's file, issued while the create waited for the disk: all answered" "$ok" 6
expect "and all before the lock was let go (the loop did not wait for it)" \
	"$([ "$reads_at" -lt "$released_at" ] && echo yes)" yes
expect "the create issued while the lock was held succeeded" "$(cat "$W/new.rc")" 0
expect "and was answered only after the lock was let go (acknowledged means on disk)" \
	"$([ "$(cat "$W/new.at")" -gt "$released_at" ] && echo yes)" yes
expect "R4: the delete's tombstone refused the old capability (REFRESH_ROUTE deactivated)" \
	"$([ -n "$refused" ] && echo refused)" refused
expect "R4: and did so while its record could not be written yet" \
	"$([ -n "$refused" ] && [ "$refused" -lt "$released_at" ] && echo yes)" yes
expect "R1: the delete succeeded" "$(cat "$W/rm.rc")" 0
expect "R1: and was answered only after its tombstone was on disk" \
	"$([ "$(cat "$W/rm.at")" -gt "$released_at" ] && echo yes)" yes
N=$(cat "$W/new.id")
expect "the new sandbox runs" "$("$SC" exec "$N" -- echo up 2>&1)" up

# ---- a record that cannot be written: the store's lock held past the writer's busy timeout (5 s)
# makes the install's write fail. Its reply carries no acknowledgement (the control plane sends the
# install again, and the create succeeds then), and the execution claimed for it is stopped: nothing
# names it, so no request would reach it and no admission would count it (it used to stay until
# the worker restarted). Counted as the executions' launchers, once the pool has refilled. ----
# the executor, not a child it forked for a job (which keeps its name until it execs)
EXE=$(role_pid spaced-executor)
launchers() { pgrep -P "$EXE" -x spaced-launch | wc -l; }
# the count once it has not changed for 2 s (the pool's refills done), at most 30 s
settled() {
	last=-1; same=0; i=0
	while [ $same -lt 10 ] && [ $i -lt 150 ]; do
		c=$(launchers)
		if [ "$c" = "$last" ]; then same=$((same + 1)); else same=0; last=$c; fi
		i=$((i + 1)); sleep 0.2
	done
	echo "$last"
}
C0=$(settled)
hold_store_lock "$DB" 7 "$W/held2"
L=$("$SC" create --worker worker-1 2>"$W/late.err")
expect "a create whose first install could not be written succeeds (sent again)" "$?" 0
wait "$HOLDER"
HOLDER=""
expect "the worker says the install's record was not written" \
	"$([ "$(grep -c 'event=install-unwritten' "$D/worker-1.log")" -ge 1 ] && echo yes)" yes
C1=$(settled)
echo "executions before: $C0, after: $C1"
expect "R1: one more execution than before: the sandbox's (none left behind for the unwritten install)" "$C1" "$((C0 + 1))"
expect "the sandbox runs" "$("$SC" exec "$L" -- echo up 2>&1)" up

echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
