#!/bin/sh
# The control plane with two real spaced-node workers (development mode, the
# real spaced-guest), each reached through spaced-cp-link: a sandbox moves back
# and forth with every step visible in `spacectl inspect`; capabilities from
# the signer are accepted by the worker that serves the execution (C1, C2, R1),
# answers carry its identity, and after a move the old worker answers the old
# capability with REFRESH_ROUTE (R3) while the new route works.
# Exit 77 when spaced-node or spaced-guest is not built.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
NODE=$SPACED_BUILD/spaced-node/spaced-node
GUEST=$SPACED_BUILD/spaced-guest/spaced-guest
LINK=$SPACED_BUILD/spaced-cp/spaced-cp-link
SC=$SPACED_BUILD/spacectl/spacectl
for b in "$NODE" "$GUEST" "$LINK" "$SC"; do
	[ -x "$b" ] || { echo "$b is not built"; exit 77; }
done
W=$(mktemp -d)
chmod 755 "$W"
trap 'cleanup; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
CP_DB=""
mkdir -p "$W/cp"
TA=$(admin create-tenant alpha)
EK=$(admin create-enrollment-key)
start_cp cp
for w in na nb; do
	mkdir -p "$W/$w"
	"$NODE" --state "$W/$w" --worker-id $w --listen 127.0.0.1:0 --guest-bin "$GUEST" >"$W/$w.log" 2>&1 &
	PIDS="$PIDS $!"
done
for w in na nb; do
	i=0
	while [ ! -S "$W/$w/admin.sock" ] || [ ! -s "$W/$w/api.port" ]; do
		i=$((i + 1))
		if [ $i -ge 200 ]; then tail -n 5 "$W/$w.log"; echo "spaced-node $w did not start"; exit 77; fi
		sleep 0.05
	done
	st=$(api "$EK" POST /v1/workers "{\"id\":\"$w\",\"url\":\"http://127.0.0.1:$(cat "$W/$w/api.port")\",\"capacity\":4,\"substrates\":[\"process\"]}")
	expect "register $w with its node-api address" "$st" 200
	"$LINK" --cp "ws://${CP_URL#http://}" --worker $w --key "$EK" --admin "$W/$w/admin.sock" >"$W/link-$w.log" 2>&1 &
	PIDS="$PIDS $!"
done
export SPACED_CP_URL="$CP_URL" SPACED_API_KEY="$TA"
wait_for "both workers connected" sh -c "'$SC' workers --json | jq -e '[.[] | select(.connected)] | length == 2' >/dev/null"

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
