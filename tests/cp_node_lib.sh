# cp_node_lib.sh — shared by the cp_node*.t.sh scripts: a control plane and two real spaced-node
# workers (na, nb; development mode), each joining with a join token of its own and holding its
# control channel itself (spaced-node --cp). Source it after cp_lib.sh.
#
#   cp_node_setup                     checks the binaries (exit 77 when one is not built), makes $W
#   cp_node_start CAPACITY [ARGS...]  starts the control plane (ARGS go to start_cp) and the workers;
#                                     sets TA (tenant key), LINK_na / LINK_nb (the pids of the
#                                     workers' links) and exports SPACED_CP_URL / SPACED_API_KEY.
#                                     A worker that does not start is a failure, not a skip.
#   node_status WORKER SANDBOX        the worker's own record of the sandbox: "generation state"

NODE=$SPACED_BUILD/spaced-node/spaced-node
GUEST=$SPACED_BUILD/spaced-guest/spaced-guest
SC=$SPACED_BUILD/spacectl/spacectl

cp_node_setup() {
	for b in "$NODE" "$GUEST" "$SC"; do
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
	start_cp cp "$@"
	for w in na nb; do
		mkdir -p "$W/$w"
		admin create-join-token $w >"$W/$w.join"
		"$NODE" --state "$W/$w" --worker-id $w --listen 127.0.0.1:0 --guest-bin "$GUEST" --capacity "$capacity" \
			--cp "$CP_URL" --join-token-file "$W/$w.join" --plaintext >"$W/$w.log" 2>&1 &
		PIDS="$PIDS $!"
	done
	for w in na nb; do
		i=0
		while [ ! -s "$W/$w/link.pid" ] || [ ! -s "$W/$w/worker.key" ]; do
			i=$((i + 1))
			if [ $i -ge 300 ]; then tail -n 5 "$W/$w.log"; echo "spaced-node $w did not join"; exit 1; fi
			sleep 0.05
		done
		eval "LINK_$w=$(cat "$W/$w/link.pid")"
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
