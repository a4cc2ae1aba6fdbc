#!/bin/sh
# run-tests: paired, about 24 s
# I2: a start the worker did not acknowledge in time is called off (spaced-cp/ops.c start_called_off;
# docs/control-plane.md): on a real two-worker cluster (`spacectl dev up`, process substrate),
# worker-2's link is stopped (SIGSTOP) while a move of a sandbox to it is on its way:
#  - the move answers 504 and the sandbox is 'failed' (a resume starts a new generation, I2), its
#    last error saying the start was called off;
#  - once the link runs again, worker-2 applies the late install and then the deactivate queued
#    behind it: nothing of the sandbox runs there;
#  - a resume then runs it on one worker only, with the files the move's snapshot carried (before,
#    the sandbox was 'error' with its install still queued: a resume elsewhere ran a second execution
#    of it that the control plane neither stopped nor counted, the late one running beside it), and
#    the move's source, kept frozen on worker-1, is destroyed (it stayed until the sandbox's delete);
#  - before that, while worker-2 has acknowledged neither, a resume on worker-1 is held: 409
#    earlier-execution-unconfirmed (before, it ran a second execution beside the late one);
# and (docs/control-plane.md, "Delete"): a delete while worker-2's link is stopped leaves the sandbox
# `deleting`, still counted against the tenant's quota (a create at the quota is 429) and routed
# nowhere, until worker-2 is back and acknowledges its destroy; `spaced-cp admin worker-lost` completes
# such a delete at once, and the worker, back, destroys what it missed.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
SC=$SPACED_BUILD/spacectl/spacectl
need_substrate
W=$(mktemp -d)
D=$W/cluster
export SPACED_ROUTE_CACHE="$W/routes"
LINK=""
trap '[ -n "$LINK" ] && kill -CONT "$LINK" 2>/dev/null; "$SC" dev down --dir "$D" >/dev/null 2>&1; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
dev_up --workers 2 --pool 0 --ack-timeout 5000 # a call waits 5 s for its worker (10 by default)
LINK=$(role_pid spaced-link worker-2)
[ -n "$LINK" ] || { echo "FAIL: worker-2's link process"; exit 1; }

S=$("$SC" create --worker worker-1) || { echo "FAIL: create"; exit 1; }
"$SC" exec "$S" -- sh -c 'echo carried >/workspace/f'
kill -STOP "$LINK"
"$SC" move "$S" --to worker-2 >/dev/null 2>"$W/move.err"
expect "the move whose install worker-2 did not acknowledge: 504" "$(grep -c '504' "$W/move.err")" 1
"$SC" inspect "$S" --json >"$W/i1.json"
expect "the sandbox is failed, its start called off" \
	"$(jq -r '.state' "$W/i1.json") $(jq -r '.last_error' "$W/i1.json" | grep -c 'called off')" "failed 1"
grep -q "event=start-called-off sandbox=$S worker=worker-2" "$D"/cp*.log "$D"/*.log 2>/dev/null &&
	ok "the control plane logs the start called off" || fail "no start-called-off line"
# at most one execution: worker-2 has not acknowledged the install nor the deactivate behind it, so
# it may run the sandbox; a resume on worker-1 is held (before, it ran a second execution beside it)
"$SC" resume "$S" --worker worker-1 >/dev/null 2>"$W/held.err"
expect "a resume while worker-2 has not confirmed: 409 earlier-execution-unconfirmed naming worker-2" \
	"$(grep -c '409 earlier-execution-unconfirmed.*worker worker-2 has not confirmed' "$W/held.err")" 1
expect "the sandbox stays failed at generation 2" \
	"$("$SC" inspect "$S" --json | jq -r '.state + " " + (.generation | tostring)')" "failed 2"
kill -CONT "$LINK"
LINK=""
wait_for "worker-2 applied the late install and the deactivate behind it" \
	sh -c "[ \"\$('$SC' node status --admin '$D/worker-2/admin.sock' 2>/dev/null | jq -r --arg s '$S' '[.result.records[] | select(.identity.sandbox == \$s)] | length')\" -ge 1 ]"
sleep 2
"$SC" node status --admin "$D/worker-2/admin.sock" 2>/dev/null |
	jq -c --arg s "$S" '.result.records[] | select(.identity.sandbox == $s) | {g: .identity.generation, state, pid}' | sed 's/^/  worker-2: /'
expect "nothing of the sandbox runs on worker-2" "$(running_on 2 "$S")" 0
"$SC" resume "$S" >/dev/null 2>"$W/resume.err" || fail "resume: $(cat "$W/resume.err")"
"$SC" inspect "$S" --json >"$W/i2.json"
expect "resumed: running, a new generation" "$(jq -r '.state + " " + (.generation | tostring)' "$W/i2.json")" "running 3"
expect "with the files the move's snapshot carried" "$("$SC" exec "$S" -- cat /workspace/f)" carried
for n in 1 2; do
	"$SC" node status --admin "$D/worker-$n/admin.sock" 2>/dev/null |
		jq -c --arg s "$S" '.result.records[] | select(.identity.sandbox == $s) | {g: .identity.generation, state, pid}' | sed "s/^/  worker-$n: /"
done
# the move's source, kept frozen on worker-1 since the move stopped, is destroyed once the new
# generation runs (it was left frozen until the sandbox's delete)
i=0
while [ $(( $(running_on 1 "$S") + $(running_on 2 "$S") )) -ne 1 ] && [ $i -lt 60 ]; do sleep 0.5; i=$((i + 1)); done
expect "one execution of it runs, on one worker" "$(( $(running_on 1 "$S") + $(running_on 2 "$S") ))" 1

# ---- a delete that a cut-off worker has not confirmed keeps counting against the quota ----
# (before, 202 marked it deleted at once: with worker-2 cut off, a tenant's quota of 2 sandboxes
# ran 4 executions)
P=$("$SC" create --worker worker-2) || fail "create on worker-2"
used=$("$SC" quota --json | jq -r .used.sandboxes)
LINK=$(role_pid spaced-link worker-2)
kill -STOP "$LINK"
"$SC" rm "$P" >"$W/rm.out" 2>"$W/rm.err"
expect "the delete while worker-2 is cut off: deleting, naming worker-2" \
	"$(cat "$W/rm.out") $(grep -c 'worker worker-2 has not confirmed' "$W/rm.err")" "$P deleting 1"
expect "it still counts against the tenant's sandboxes quota" "$("$SC" quota --json | jq -r .used.sandboxes)" "$used"
"$CP" admin --state "$D/cp" set-quota dev "sandboxes=$used" 2>/dev/null
"$SC" create --worker worker-1 >/dev/null 2>"$W/q.err"
expect "so a create at the quota is refused: 429" "$(grep -c '429 quota-exceeded' "$W/q.err")" 1
"$SC" route "$P" >/dev/null 2>"$W/route.err"
expect "it gets no route: 404, being deleted" "$(grep -c 'being deleted' "$W/route.err")" 1
"$SC" rm "$P" >"$W/rm2.out" 2>/dev/null
expect "a delete again answers the same" "$(cat "$W/rm2.out")" "$P deleting"
expect "it still runs on worker-2 (cut off)" "$(running_on 2 "$P")" 1
kill -CONT "$LINK"
LINK=""
wait_for "worker-2 back: it destroys the sandbox, the delete completes" \
	sh -c "! '$SC' inspect '$P' >/dev/null 2>&1"
expect "nothing of it runs on worker-2" "$(running_on 2 "$P")" 0
expect "it no longer counts" "$("$SC" quota --json | jq -r .used.sandboxes)" "$((used - 1))"
OKC=$("$SC" create --worker worker-1) && ok "a create fits the quota again" || fail "create after the delete completed"
"$SC" rm "$OKC" >/dev/null

# ---- a worker declared lost: what it never acknowledged holds nothing back ----
"$CP" admin --state "$D/cp" set-quota dev "sandboxes=default" 2>/dev/null
L=$("$SC" create --worker worker-2) || fail "create on worker-2"
LINK=$(role_pid spaced-link worker-2)
kill -STOP "$LINK"
"$SC" rm "$L" >/dev/null 2>&1
expect "deleting while worker-2 is cut off" "$("$SC" inspect "$L" --json | jq -r .state)" deleting
"$CP" admin --state "$D/cp" worker-lost worker-2 2>"$W/lost.err" || fail "worker-lost: $(cat "$W/lost.err")"
wait_for "declared lost: the delete completes" sh -c "! '$SC' inspect '$L' >/dev/null 2>&1"
grep -q "event=deleted sandbox=$L after=confirmed" "$D"/cp*.log "$D"/*.log 2>/dev/null &&
	ok "the control plane logs the delete completed" || fail "no event=deleted line"
kill -CONT "$LINK"
LINK=""
wait_for "worker-2 says hello again: it is no longer lost" sh -c "[ \"\$(sqlite3 '$D/cp/cp.db' 'SELECT lost FROM workers WHERE id = \"worker-2\"')\" = 0 ]"
i=0
while [ "$(running_on 2 "$L")" != 0 ] && [ $i -lt 60 ]; do sleep 0.5; i=$((i + 1)); done
expect "nothing of the deleted sandbox runs on worker-2" "$(running_on 2 "$L")" 0
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
