#!/bin/sh
# run-tests: alone (a 1.5 s drain window)
# The move drain window (docs/control-plane.md "Moves"; R4, V2): a route handed
# out just before a move keeps working until the old execution is deactivated,
# because the control plane stops issuing routes ('moving') and then waits the
# drain window before it deactivates. Without the window, a client's one retry
# holding such a route would be refused a second time.
# Two real spaced-node workers (development mode), the real spaced-guest, a
# control plane started with --move-drain 1500 so the window is wide enough
# to act in from a shell.
# Exit 77 when spaced-node or spaced-guest is not built.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
. "$SPACED_TOP/tests/cp_node_lib.sh"
cp_node_setup
cp_node_start 4 --move-drain 1500

exec_at() { # ROUTE_FILE -> "status outcome-or-stdout generation"
	u=$(jq -r .worker_url "$1"); c=$(jq -r .capability "$1")
	curl -s -D "$W/h" -o "$W/b" -H "Authorization: Bearer $c" -d '{"argv":["/bin/echo","hello"]}' "$u/v1/sandboxes/$X/exec" >/dev/null
	echo "$(head -n 1 "$W/h" | cut -d' ' -f2) $(jq -r '.stdout // .outcome' "$W/b" | tr -d '\n')"
}
state() { "$SC" inspect "$X" --json | jq -r .state; }

X=$("$SC" create --worker na)
expect "create on na" "$("$SC" inspect "$X" --json | jq -r '.state + " " + .worker')" "running na"
"$SC" route "$X" --purpose exec --json >"$W/old.json"
expect "the route reaches generation 1" "$(exec_at "$W/old.json")" "200 hello"

"$SC" move "$X" --to nb >"$W/move.out" 2>&1 &
MOVE=$!
wait_for "the move started: state 'moving'" sh -c "[ \"\$('$SC' inspect '$X' --json | jq -r .state)\" = moving ]"
st=$(api "$TA" POST "/v1/sandboxes/$X/route" '{}')
expect "while 'moving' the control plane issues no route" "$st $(body .error)" "409 not-running"
expect "within the drain window the route issued before the move still reaches generation 1" \
	"$(exec_at "$W/old.json")" "200 hello"
wait "$MOVE"
expect "the move completed" "$?" 0
expect "now on nb, generation 2" "$("$SC" inspect "$X" --json | jq -r '.state + " " + (.generation|tostring) + " " + .worker')" "running 2 nb"
expect "after the window the old route is refused with REFRESH_ROUTE (R3)" "$(exec_at "$W/old.json")" "409 REFRESH_ROUTE"
"$SC" route "$X" --purpose exec --json >"$W/new.json"
expect "the new route reaches generation 2" "$(exec_at "$W/new.json")" "200 hello"
"$SC" rm "$X" >/dev/null
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
