#!/bin/sh
# run-tests: light, about 9 s
# A deleted sandbox's row is kept a week (--retain-deleted): a control plane
# that creates steadily holds many more deleted rows than live ones. What a
# create costs the store (placement's sums per worker, the quota's count,
# the delete that follows) and what an idle control plane costs it each
# second (the reaper's timeouts, a metrics scrape) must not grow with them.
# Measured in steps of SQLite's virtual machine (spaced_cp_sql_vm_steps_total:
# a count of work, not a time) for five create-and-delete pairs and for 3 s
# of an idle control plane, before and after 32,768 deleted rows (copies of
# a deleted sandbox's row) are added to the store. Without the index over
# live rows (store.c) each create visits every row kept.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
store_test_setup
start_cp cp --metrics-listen 127.0.0.1:0
register wa 64
start_worker wa
MP=$(cat "$W/cp/metrics.port")
steps() { curl -s "http://127.0.0.1:$MP/metrics" | awk '$1 == "spaced_cp_sql_vm_steps_total" {print $2}'; }
[ -n "$(steps)" ] || { echo "FAIL: no spaced_cp_sql_vm_steps_total"; exit 1; }

expect "create a sandbox that stays" "$(api "$TA" POST /v1/sandboxes '{"worker":"wa"}')" 201
STAY=$(body .id)
expect "create one to delete" "$(api "$TA" POST /v1/sandboxes '{"worker":"wa"}')" 201
GONE=$(body .id)
expect "delete it" "$(api "$TA" DELETE "/v1/sandboxes/$GONE")" 200

# steps per create-and-delete pair (five of them)
pair_steps() {
	a=$(steps)
	for i in 1 2 3 4 5; do
		st=$(api "$TA" POST /v1/sandboxes '{"worker":"wa"}')
		[ "$st" = 201 ] || { fail "create $i: $st $(cat "$W/body")"; return; }
		id=$(body .id)
		st=$(api "$TA" DELETE "/v1/sandboxes/$id")
		[ "$st" = 200 ] || fail "delete $i: $st"
	done
	b=$(steps)
	echo $(((b - a) / 5))
}
idle_steps() {
	a=$(steps)
	sleep 3
	b=$(steps)
	echo $((b - a))
}
pair0=$(pair_steps)
idle0=$(idle_steps)
echo "before: $pair0 steps per create and delete, $idle0 steps in 3 s idle"

q "CREATE TEMP TABLE t AS SELECT * FROM sandboxes WHERE id = '$GONE';
$(i=0; while [ $i -lt 15 ]; do echo "INSERT INTO t SELECT * FROM t;"; i=$((i + 1)); done)
UPDATE t SET id = 'gone-' || rowid;
INSERT INTO sandboxes SELECT * FROM t;" || fail "the deleted rows could not be added"
expect "the store holds 32,768 more deleted sandboxes" \
	"$(q "SELECT COUNT(*) FROM sandboxes WHERE deleted > 0 AND id LIKE 'gone-%'")" 32768

pair1=$(pair_steps)
idle1=$(idle_steps)
echo "after:  $pair1 steps per create and delete, $idle1 steps in 3 s idle"
# a scan of the rows kept would add at least one step per row (32,768)
[ "$pair1" -le $((pair0 + 4000)) ] && ok "a create's store work does not grow with deleted rows ($pair0 -> $pair1)" ||
	fail "a create's store work grew with the deleted rows: $pair0 -> $pair1 steps"
[ "$idle1" -le $((idle0 + 4000)) ] && ok "an idle control plane's store work does not grow with deleted rows ($idle0 -> $idle1)" ||
	fail "an idle control plane's store work grew with the deleted rows: $idle0 -> $idle1 steps in 3 s"
expect "the sandbox that stays still answers" "$(api "$TA" GET "/v1/sandboxes/$STAY"; body .state)" 200running
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
