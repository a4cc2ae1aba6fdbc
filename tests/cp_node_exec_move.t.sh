#!/bin/sh
# run-tests: paired, about 5 s
# A move while an exec stream is open (issue 5 item 8; S1, R3): a control
# plane and two real spaced-node workers (development mode, the real
# spaced-guest), each joined to the control plane itself. A long exec (sh -c '... sleep 300') runs
# on the sandbox through na's node API with a capability from `spacectl route`;
# the sandbox moves to nb while it runs. Then:
#  - the move completes (generation 2 on nb);
#  - the open exec ends at na with the refresh-route outcome (409
#    REFRESH_ROUTE: its lease ended when na deactivated the execution, S1)
#    instead of hanging or completing against the old execution, and its
#    command does not run on: no process of it is left once na destroyed the
#    old execution;
#  - a request through the new route reaches generation 2 on nb (identity
#    header), and the old capability is refused at na (409 REFRESH_ROUTE, R3).
# Exit 77 when spaced-node or spaced-guest is not built.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
. "$SPACED_TOP/tests/cp_node_lib.sh"
cp_node_setup
cp_node_start 8

exec_at() { # ROUTE_FILE ARGV_JSON -> "status identity-header stdout-or-outcome"
	u=$(jq -r .worker_url "$1"); c=$(jq -r .capability "$1")
	curl -s -D "$W/h" -o "$W/b" -H "Authorization: Bearer $c" -d "{\"argv\":$2}" "$u/v1/sandboxes/$X/exec" >/dev/null
	echo "$(head -n 1 "$W/h" | cut -d' ' -f2) $(grep -i '^x-spaced-identity:' "$W/h" | cut -d' ' -f2 | tr -d '\r') $(jq -r '.stdout // .outcome' "$W/b" | tr -d '\n')"
}
canon() { jq -r '"sandbox=\(.sandbox);generation=\(.generation);worker=\(.worker);substrate=\(.substrate);activation=\(.activation);pod_uid=\(.pod_uid // "")"' "$1"; }
# the processes whose environment holds TOKEN (read from /proc, nothing is
# signalled; the exec's children inherit it, this shell does not have it)
procs_with() {
	for d in /proc/[0-9]*; do
		tr '\0' '\n' 2>/dev/null <"$d/environ" | grep -qx -- "SPACED_TEST_TOKEN=$1" && echo "${d#/proc/}"
	done
	true
}
no_procs_with() { [ -z "$(procs_with "$1")" ]; }

X=$("$SC" create --worker na)
"$SC" inspect "$X" --json | jq .route >"$W/id1.json"
"$SC" route "$X" --purpose exec --json >"$W/r1.json"
expect "exec at na with the route's capability: generation 1" \
	"$(exec_at "$W/r1.json" '["/bin/echo","hello"]')" "200 $(canon "$W/id1.json") hello"

# the long exec: a unique token in its environment names its processes; it marks its start
TOKEN="spaced-long-exec-$$-$(date +%s)"
u=$(jq -r .worker_url "$W/r1.json"); c=$(jq -r .capability "$W/r1.json")
jq -n --arg m "$W/started" --arg t "$TOKEN" \
	'{argv: ["/bin/sh", "-c", "touch \"$1\"; sleep 300; echo completed", "long", $m],
	  env: {SPACED_TEST_TOKEN: $t}, timeout_ms: 120000}' >"$W/long.json"
# --max-time only keeps a broken run from hanging the suite; the outcome is what is checked
curl -s --max-time 120 -D "$W/lh" -o "$W/lb" -H "Authorization: Bearer $c" --data-binary @"$W/long.json" \
	"$u/v1/sandboxes/$X/exec" >/dev/null &
CURL=$!
wait_for "the long exec runs on na's execution" test -e "$W/started"
expect "its processes are there" "$([ -n "$(procs_with "$TOKEN")" ] && echo yes)" yes

"$SC" move "$X" --to nb >/dev/null
expect "the move completes while the exec is open: generation 2 on nb" \
	"$("$SC" inspect "$X" --json | jq -r '.state + " " + (.generation|tostring) + " " + .worker')" "running 2 nb"
wait $CURL
expect "the open exec ended (curl returned)" "$?" 0
expect "it ended with the refresh-route outcome, not a completion (S1)" \
	"$(head -n 1 "$W/lh" | cut -d' ' -f2) $(jq -r '.outcome // .stdout' "$W/lb")" "409 REFRESH_ROUTE"
expect "the old execution is gone from na" "$(node_status na "$X")" ""
wait_for "no process of the long exec is left" no_procs_with "$TOKEN"

"$SC" inspect "$X" --json | jq .route >"$W/id2.json"
"$SC" route "$X" --purpose exec --json >"$W/r2.json"
expect "the new route names nb" "$(jq -r .worker_url "$W/r2.json")" "http://127.0.0.1:$(cat "$W/nb/api.port")"
expect "a request through the new route reaches generation 2 on nb (identity header)" \
	"$(exec_at "$W/r2.json" '["/bin/echo","hello"]')" "200 $(canon "$W/id2.json") hello"
expect "the old capability at na: 409 REFRESH_ROUTE (R3)" \
	"$(exec_at "$W/r1.json" '["/bin/echo","hello"]' | cut -d' ' -f1,3)" "409 REFRESH_ROUTE"
"$SC" rm "$X" >/dev/null
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
