# cp_node_lib.sh — shared by the cp_node*.t.sh scripts: a control plane and two real spaced-node
# workers (na, nb; development mode), each registered with its node-api address and connected
# through spaced-cp-link. Source it after cp_lib.sh.
#
#   cp_node_setup                     checks the binaries (exit 77 when one is not built), makes $W
#   cp_node_start CAPACITY [ARGS...]  starts the control plane (ARGS go to start_cp) and the workers;
#                                     sets TA (tenant key), EK (enrollment key), LINK_na / LINK_nb
#                                     (the links' pids) and exports SPACED_CP_URL / SPACED_API_KEY.
#                                     A worker that does not start is a failure, not a skip.
#   node_status WORKER SANDBOX        the worker's own record of the sandbox: "generation state"

NODE=$SPACED_BUILD/spaced-node/spaced-node
GUEST=$SPACED_BUILD/spaced-guest/spaced-guest
LINK=$SPACED_BUILD/spaced-cp/spaced-cp-link
SC=$SPACED_BUILD/spacectl/spacectl

cp_node_setup() {
	for b in "$NODE" "$GUEST" "$LINK" "$SC"; do
		[ -x "$b" ] || { echo "$b is not built"; exit 77; }
	done
	command -v python3 >/dev/null 2>&1 || { echo "python3 is not installed"; exit 77; }
	W=$(mktemp -d)
	chmod 755 "$W"
	trap 'cleanup; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
	CP_DB=""
	mkdir -p "$W/cp"
}

cp_node_start() {
	capacity=$1
	shift
	TA=$(admin create-tenant alpha)
	EK=$(admin create-enrollment-key)
	start_cp cp "$@"
	for w in na nb; do
		mkdir -p "$W/$w"
		"$NODE" --state "$W/$w" --worker-id $w --listen 127.0.0.1:0 --guest-bin "$GUEST" >"$W/$w.log" 2>&1 &
		PIDS="$PIDS $!"
	done
	for w in na nb; do
		i=0
		while [ ! -S "$W/$w/admin.sock" ] || [ ! -s "$W/$w/api.port" ]; do
			i=$((i + 1))
			if [ $i -ge 200 ]; then tail -n 5 "$W/$w.log"; echo "spaced-node $w did not start"; exit 1; fi
			sleep 0.05
		done
		st=$(api "$EK" POST /v1/workers "{\"id\":\"$w\",\"url\":\"http://127.0.0.1:$(cat "$W/$w/api.port")\",\"capacity\":$capacity,\"substrates\":[\"process\"]}")
		expect "register $w with its node-api address" "$st" 200
		"$LINK" --cp "ws://${CP_URL#http://}" --worker $w --key "$EK" --admin "$W/$w/admin.sock" >"$W/link-$w.log" 2>&1 &
		PIDS="$PIDS $!"
		eval "LINK_$w=$!"
	done
	export SPACED_CP_URL="$CP_URL" SPACED_API_KEY="$TA"
	wait_for "both workers connected" sh -c "'$SC' workers --json | jq -e '[.[] | select(.connected)] | length == 2' >/dev/null"
}

node_status() {
	python3 - "$W/$1/admin.sock" "$2" <<'PY'
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
for r in json.loads(buf)["result"]["records"]:
    if r["identity"]["sandbox"] == sys.argv[2] and r["state"] != "destroyed":
        print(r["identity"]["generation"], r["state"])
PY
}
