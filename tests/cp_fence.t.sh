#!/bin/sh
# run-tests: paired, about 63 s
# I2, R4, R5: a worker cut off from the control plane fences itself (spaced-node/gate_fence.c; docs/control-plane.md,
# "At most one execution"; docs/control-messages.md, "Fence"): on a real two-worker cluster (`spacectl
# dev up --fence-after 10`, process substrate), worker-2's link is stopped (SIGSTOP) — its node-api and
# its executions keep running, as on a worker whose network to the control plane is cut:
#  - a move of sandbox B off worker-2 is not acknowledged (504, `error`), and a delete of C leaves it
#    `deleting`; a resume of B on worker-1 is held (409 earlier-execution-unconfirmed, retry_after);
#  - 10 s after its last answered ping worker-2 fences: a request its capability allows gets
#    REFRESH_ROUTE `fenced`, at node-api and at A's ServicePort gateway, and its executions are frozen
#    (A's clock loop writes nothing meanwhile);
#  - the control plane counts worker-2 fenced 10 + 18 s after it last saw it: B then resumes on worker-1
#    from its last snapshot, and C's delete completes (it no longer counts against the quota);
#  - the link runs again: worker-2 applies what it missed (B's deactivate, the destroys) before it lifts
#    its fence; A thaws and answers, and each sandbox runs once in all;
#  - with its gate stopped too (SIGSTOP), the fence holds without it: once the lease the gate kept in
#    STATE/lease ends, A's launcher freezes it and A's ServicePort gateway refuses on their own; the
#    gate, back, fences at once and lifts the fence after the link's replay;
#  - only the gate held (SIGSTOP) past its lease while the link stays connected: the gate fences when
#    it runs again, and lifts the fence when the link asks again;
#  - an idle link wakes only for its pings and its lease (at most 12 times a second).
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
SC=$SPACED_BUILD/spacectl/spacectl
need_substrate
W=$(mktemp -d)
D=$W/cluster
export SPACED_ROUTE_CACHE="$W/routes"
LINK=""
trap '[ -n "$LINK" ] && kill -CONT "$LINK" 2>/dev/null; "$SC" dev down --dir "$D" >/dev/null 2>&1; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
dev_up --workers 2 --pool 0 --fence-after 10 --ack-timeout 5000
LINK=$(role_pid spaced-link worker-2)
[ -n "$LINK" ] || { echo "FAIL: worker-2's link process"; exit 1; }
# (the control plane writes what a hello says from a writer thread of its own: shortly after the
# worker counts as live, which is when dev up returns)
says_fence_after() { [ "$(sqlite3 "$D/cp/cp.db" "SELECT fence_after FROM workers WHERE id = 'worker-2'")" = 10 ]; }
WAIT_SECONDS=10 wait_for "worker-2 says in its hello that it fences after 10 s" says_fence_after
# an idle link wakes for its pings and its lease, not on a 50 ms tick (26 a second with one: now ~7)
lw() { cat /proc/"$LINK"/task/*/status 2>/dev/null | awk '/_ctxt_switches/ {s += $2} END {print s + 0}'; }
w0=$(lw); sleep 3; w1=$(lw)
expect "worker-2's idle link woke at most 36 times in 3 s" \
	"$([ $((w1 - w0)) -le 36 ] && echo yes || echo "no: $((w1 - w0))")" yes

A=$("$SC" create --worker worker-2) || fail "create A"
"$SC" exec "$A" -- sh -c 'nohup sh -c "while :; do date +%s >>/workspace/ticks; sleep 0.2; done" >/dev/null 2>&1 &'
"$SC" exec "$A" -- sh -c 'cd /tmp && echo hello-from-A >index.html && setsid python3 -m http.server 8080 --bind 127.0.0.1 >/dev/null 2>&1 & sleep 1' >/dev/null 2>&1
"$SC" expose "$A" 8080 --json >"$W/exp.json"
URL=$(jq -r .url "$W/exp.json"); AC=$(jq -r .capability "$W/exp.json")
expect "A's ServicePort answers" "$(curl -s -m 5 --cacert "$SPACED_CA_FILE" -H "Authorization: Bearer $AC" "${URL}index.html")" hello-from-A
B=$("$SC" create --worker worker-2) || fail "create B"
"$SC" exec "$B" -- sh -c 'echo in-the-snapshot >/workspace/f'
"$SC" pause "$B" >/dev/null && "$SC" snapshot "$B" >/dev/null && "$SC" resume "$B" >/dev/null || fail "B's snapshot"
"$SC" exec "$B" -- sh -c 'echo after-the-snapshot >/workspace/f'
C=$("$SC" create --worker worker-2) || fail "create C"
used=$("$SC" quota --json | jq -r .used.sandboxes)

kill -STOP "$LINK"
"$SC" move "$B" --to worker-1 >/dev/null 2>"$W/move.err"
expect "B's move off the cut-off worker-2: 504, B error" \
	"$(grep -c 504 "$W/move.err") $("$SC" inspect "$B" --json | jq -r .state)" "1 error"
"$SC" rm "$C" >/dev/null 2>&1
expect "C's delete: deleting" "$("$SC" inspect "$C" --json | jq -r .state)" deleting
curl -s --cacert "$SPACED_CA_FILE" -H "Authorization: Bearer $SPACED_API_KEY" -X POST \
	-d '{"worker":"worker-1"}' "$SPACED_CP_URL/v1/sandboxes/$B/resume" >"$W/held.json"
expect "a resume of B on worker-1 before worker-2 has surely fenced: held, naming worker-2, with retry_after" \
	"$(jq -r '[.error, .worker, (.retry_after > 0)] | join(" ")' "$W/held.json")" "earlier-execution-unconfirmed worker-2 true"

wait_for "worker-2 fences itself" grep -q "event=fenced" "$D/worker-2.log"
"$SC" exec "$A" -- echo hi >/dev/null 2>"$W/a.err"
expect "a request to A on the fenced worker: REFRESH_ROUTE fenced" "$(grep -c 'fenced' "$W/a.err")" 1
sed 's/^/  /' "$W/a.err" | head -n 2
expect "A's ServicePort gateway refuses a new open: 409 fenced" \
	"$(curl -s -m 10 --cacert "$SPACED_CA_FILE" -o "$W/gw.json" -w '%{http_code}' -H "Authorization: Bearer $AC" "${URL}index.html") $(jq -r .reason "$W/gw.json" 2>/dev/null)" \
	"409 fenced"

i=0
until curl -s --cacert "$SPACED_CA_FILE" -H "Authorization: Bearer $SPACED_API_KEY" -X POST \
	-d '{"worker":"worker-1"}' "$SPACED_CP_URL/v1/sandboxes/$B/resume" >"$W/resume.json" &&
	[ "$(jq -r .state "$W/resume.json")" = running ] || [ $i -ge 40 ]; do
	sleep 1; i=$((i + 1))
done
expect "once worker-2 has surely fenced, B resumes on worker-1" "$(jq -r '.state + " " + .worker' "$W/resume.json")" "running worker-1"
expect "from its last snapshot (what came after it stayed on the fenced worker)" "$("$SC" exec "$B" -- cat /workspace/f)" in-the-snapshot
wait_for "C's delete completes" sh -c "! '$SC' inspect '$C' >/dev/null 2>&1"
expect "C no longer counts against the quota" "$("$SC" quota --json | jq -r .used.sandboxes)" "$((used - 1))"

kill -CONT "$LINK"
LINK=""
wait_for "worker-2 back: it lifts its fence" grep -q "event=unfenced" "$D/worker-2.log"
expect "A answers again" "$("$SC" exec "$A" -- echo back)" back
expect "and its ServicePort" "$(curl -s -m 5 --cacert "$SPACED_CA_FILE" -H "Authorization: Bearer $AC" "${URL}index.html")" hello-from-A
"$SC" exec "$A" -- cat /workspace/ticks >"$W/ticks"
gap=$(awk 'NR > 1 && $1 - p > g { g = $1 - p } { p = $1 } END { print g + 0 }' "$W/ticks")
expect "A's clock loop stopped while fenced (its longest gap: $gap s)" "$([ "$gap" -ge 10 ] && echo yes)" yes
i=0
while [ "$(running_on 2 "$B")$(running_on 2 "$C")" != 00 ] && [ $i -lt 60 ]; do sleep 0.5; i=$((i + 1)); done
expect "worker-2 applied what it missed: nothing of B or C runs there" "$(running_on 2 "$B") $(running_on 2 "$C")" "0 0"
expect "each sandbox runs once in all: A on worker-2, B on worker-1" \
	"$(running_on 2 "$A") $(running_on 1 "$A") $(running_on 1 "$B")" "1 0 1"
grep -E "event=(fenced|unfenced)" "$D/worker-2.log" | sed 's/^/  /'

# ---- the fence holds without the gate: its gate and its link stopped, the worker's lease ends ----
# (the launcher freezes its execution and the ServicePort gateway refuses on their own, from the
# lease the gate kept in STATE/lease; before, an execution ran on, and its gateway served, while
# the gate was down, however long)
GATE=$(role_pid spaced-gate worker-2)
LINK=$(role_pid spaced-link worker-2)
[ -n "$GATE" ] && [ -n "$LINK" ] || fail "worker-2's gate and link processes"
ticks_before=$("$SC" exec "$A" -- wc -l /workspace/ticks | awk '{ print $1 }')
kill -STOP "$GATE" "$LINK"
wait_for "the gateway refuses on its own once the lease ended: 409 fenced" sh -c \
	"[ \"\$(curl -s -m 5 --cacert '$SPACED_CA_FILE' -o '$W/gw2.json' -w '%{http_code}' -H 'Authorization: Bearer $AC' '${URL}index.html') \$(jq -r .reason '$W/gw2.json' 2>/dev/null)\" = '409 fenced' ]"
wait_for "A's launcher froze it on its own" grep -rqs "lease ended" "$D/worker-2/log" "$D/worker-2/exec"
# the gate's own lease ends up to 2 s after STATE/lease says (whole seconds there, rounded down
# twice; nanoseconds in the gate): held until then, or the link's first renewal finds the gate's
# lease running and the gate rightly never fences
lu=$(cat "$D/worker-2/lease" 2>/dev/null || echo 0)
i=0; while [ "$(date +%s)" -le $((lu + 2)) ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
kill -CONT "$GATE" "$LINK"
LINK=""
wait_for "the gate, back, fences and then lifts the fence" sh -c "[ \"\$(grep -c 'event=unfenced' '$D/worker-2.log')\" -ge 2 ]" ||
	grep -E 'fence|lease|link|channel' "$D/worker-2.log" | tail -n 30
expect "A answers again" "$("$SC" exec "$A" -- echo back)" back
"$SC" exec "$A" -- cat /workspace/ticks >"$W/ticks2"
# since the stop only (the file holds the first fence's gap too): printed, not asserted — the
# launcher's freeze is asserted by its own log line above, and it lasts only from the lease's end
# to the gate's unfencing once both run again (under 2 s in some runs)
gap=$(awk -v from="${ticks_before:-1}" 'NR > from && $1 - p > g { g = $1 - p } { p = $1 } END { print g + 0 }' "$W/ticks2")
echo "  A's clock loop, longest gap since the stop: $gap s"

# ---- only the gate held past its lease, the link connected all along ----
# (the gate fences when it runs again; the link, whose channel never dropped, asks again to unfence
# while the gate answers that it is fenced: before, it asked once per connection and the worker stayed
# fenced for good, live to the control plane)
GATE=$(role_pid spaced-gate worker-2)
fences=$(grep -c 'event=fenced' "$D/worker-2.log")
unfences=$(grep -c 'event=unfenced' "$D/worker-2.log")
kill -STOP "$GATE"
sleep 12
kill -CONT "$GATE"
wait_for "the gate fences once it runs again" sh -c "[ \"\$(grep -c 'event=fenced' '$D/worker-2.log')\" -gt $fences ]"
wait_for "and lifts the fence on the link's asking again" sh -c "[ \"\$(grep -c 'event=unfenced' '$D/worker-2.log')\" -gt $unfences ]"
expect "A answers" "$("$SC" exec "$A" -- echo again)" again
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
