#!/bin/sh
# run-tests: paired, about 7 s
# The control plane with two real spaced-node workers (development mode, the
# real spaced-guest), each joined to the control plane itself: a sandbox moves back
# and forth with every step visible in `spacectl inspect`; capabilities from
# the signer are accepted by the worker that serves the execution (C1, C2, R1),
# answers carry its identity, and after a move the old worker answers the old
# capability with REFRESH_ROUTE (R3) while the new route works.
# Exit 77 when spaced-node or spaced-guest is not built.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
. "$SPACED_TOP/tests/cp_node_lib.sh"
cp_node_setup
cp_node_start 4

node_status() { # WORKER -> the worker's own record of the sandbox: "generation activation state"
	python3 - "$W/$1/admin.sock" "$X" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b'{"type":"status"}\n')
buf = b""
while not buf.endswith(b"\n"):
    d = s.recv(65536)
    if not d:
        break
    buf += d
st = json.loads(buf)["result"]
for r in st["records"]:
    if r["identity"]["sandbox"] == sys.argv[2]:
        print(r["identity"]["generation"], r["identity"]["activation"], r["state"])
PY
}
exec_at() { # ROUTE_FILE -> "status identity-header stdout"
	u=$(jq -r .worker_url "$1"); c=$(jq -r .capability "$1")
	curl -s -D "$W/h" -o "$W/b" -H "Authorization: Bearer $c" -d '{"argv":["/bin/echo","hello"]}' "$u/v1/sandboxes/$X/exec" >/dev/null
	echo "$(head -n 1 "$W/h" | cut -d' ' -f2) $(grep -i '^x-spaced-identity:' "$W/h" | cut -d' ' -f2 | tr -d '\r') $(jq -r '.stdout // .outcome' "$W/b" | tr -d '\n')"
}
canon() { jq -r '"sandbox=\(.sandbox);generation=\(.generation);worker=\(.worker);substrate=\(.substrate);activation=\(.activation);pod_uid=\(.pod_uid // "")"' "$1"; }

X=$("$SC" create --worker na)
expect "create on na" "$("$SC" inspect "$X" --json | jq -r '.state + " " + (.generation|tostring) + " " + .worker')" "running 1 na"
"$SC" inspect "$X" --json | jq .route >"$W/id1.json"
expect "na's own record: generation 1, same activation" "$(node_status na)" "1 $(jq -r .activation "$W/id1.json") running"
"$SC" route "$X" --purpose exec --json >"$W/r1.json"
expect "exec with the capability at na: answered by generation 1 there" "$(exec_at "$W/r1.json")" "200 $(canon "$W/id1.json") hello"

gen=1
for to in nb na nb; do
	from=$("$SC" inspect "$X" --json | jq -r .worker)
	"$SC" route "$X" --purpose exec --json >"$W/old.json"
	"$SC" move "$X" --to $to >/dev/null
	gen=$((gen + 1))
	"$SC" inspect "$X" --json | jq .route >"$W/id.json"
	expect "move $from -> $to: inspect shows generation $gen on $to" "$(jq -r '(.generation|tostring) + " " + .worker' "$W/id.json")" "$gen $to"
	expect "$to's own record matches" "$(node_status $to)" "$gen $(jq -r .activation "$W/id.json") running"
	expect "the snapshot it came from is recorded with its hash (issue 5 item 7)" \
		"$("$SC" inspect "$X" --json | jq -r '.snapshot_hash | test("^[0-9a-f]{64}$")')" true
	expect "the old capability at $from: REFRESH_ROUTE (R3)" "$(exec_at "$W/old.json" | cut -d' ' -f1,3)" "409 REFRESH_ROUTE"
	"$SC" route "$X" --purpose exec --json >"$W/new.json"
	expect "the new route reaches generation $gen on $to" "$(exec_at "$W/new.json")" "200 $(canon "$W/id.json") hello"
done
"$SC" pause "$X" >/dev/null
expect "pause: the worker's execution is paused, same generation" "$(node_status nb | cut -d' ' -f1,3)" "$gen paused"
"$SC" resume "$X" >/dev/null
expect "resume in place" "$(node_status nb | cut -d' ' -f1,3)" "$gen running"
"$SC" rm "$X" >/dev/null
expect "rm: gone from the control plane" "$("$SC" inspect "$X" --json 2>/dev/null | wc -c)" 0
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
