#!/bin/sh
# run-tests: light, about 15 s
# The executor's job slots (issue 12: a victim tenant's operations keep working while another
# abuses its own sandboxes). Snapshots and stages (a snapshot's download) are the long jobs a
# tenant can ask for many of at once, one per paused sandbox: they take at most half of the slots
# (spaced-node --executor-jobs N, default 64), the other half stays for every tenant's starts,
# stops and pauses. A worker with --executor-jobs 2, driven through its admin socket: two paused
# sandboxes' snapshots upload to a store that takes the connection and never answers (each would
# hold its slot for 30 s); the second waits for a bulk slot, and a third sandbox's pause is answered
# meanwhile. Before, both snapshots took both slots and the pause waited behind them.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
SC=$SPACED_BUILD/spacectl/spacectl
NODE=$SPACED_BUILD/spaced-node/spaced-node
[ "$(id -u)" -eq 0 ] || { echo "the process substrate needs root"; exit 77; }
for b in "$NODE" "$SPACED_BUILD/spaced-node/spaced-launch" "$SPACED_BUILD/spaced-host/spaced-host" \
	"$SPACED_BUILD/spaced-guest/spaced-guest"; do
	[ -x "$b" ] || { echo "$b is not built"; exit 77; }
done
command -v python3 >/dev/null 2>&1 || { echo "python3 is not installed"; exit 77; }
W=$(mktemp -d)
NPID="" STALL="" SA="" SB=""
cleanup() {
	for p in $SA $SB $STALL; do kill "$p" 2>/dev/null; done
	[ -n "$NPID" ] && kill "$NPID" 2>/dev/null && wait "$NPID" 2>/dev/null
	for p in $(ls /proc | grep -E '^[0-9]+$'); do
		{ tr '\0' ' ' <"/proc/$p/cmdline" | grep -q "$W/" && kill -9 "$p"; } 2>/dev/null
	done
	umount -l "$W/w/net/ns" 2>/dev/null
	[ -n "${CP_KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT

"$SC" token keygen --json >"$W/key.json"
printf '{"version":1,"keys":[{"key":"%s","not_before":"2020-01-01T00:00:00Z","not_after":"2099-01-01T00:00:00Z"}]}\n' \
	"$(jq -r .public "$W/key.json")" >"$W/bundle.json"
"$NODE" --state "$W/w" --worker-id wa --listen 127.0.0.1:0 --guest-bin "$SPACED_BUILD/spaced-guest/spaced-guest" \
	--launcher "$SPACED_BUILD/spaced-node/spaced-launch" --host "$SPACED_BUILD/spaced-host/spaced-host" \
	--uid-range 1880096768:8 --pool 0 --executor-jobs 2 --plaintext 2>"$W/node.log" &
NPID=$!
i=0
until [ -S "$W/w/admin.sock" ] && [ -s "$W/w/api.port" ]; do
	i=$((i + 1)); [ $i -lt 500 ] || { echo "FAIL: spaced-node did not start"; cat "$W/node.log"; exit 1; }
	sleep 0.02
done
ADM="--admin $W/w/admin.sock"
"$SC" node keys $ADM "$W/bundle.json" >/dev/null || { echo "FAIL: keys"; exit 1; }
seq=100
node() { # COMMAND SANDBOX [ARGS...]: the worker's control message for SANDBOX (generation 1)
	c=$1 s=$2; shift 2
	seq=$((seq + 1))
	"$SC" node "$c" $ADM --sandbox "$s" --generation 1 --worker wa --seq $seq "$@"
}
for s in A B V; do node install "$s" >"$W/inst-$s.out" 2>&1 || { cat "$W/inst-$s.out"; fail "install $s"; exit 1; }; done
for s in A B; do node pause "$s" >/dev/null 2>&1 || fail "pause $s"; done
# a store that takes every connection and never reads or answers; it counts them
python3 -c '
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", 0)); s.listen(16)
open(sys.argv[1] + ".tmp", "w").write(str(s.getsockname()[1])); __import__("os").rename(sys.argv[1] + ".tmp", sys.argv[1])
held = []
while True:
    c, _ = s.accept(); held.append(c)
    open(sys.argv[2], "a").write("upload\n")
' "$W/stall.port" "$W/stall.seen" &
STALL=$!
i=0; until [ -s "$W/stall.port" ] || [ $i -ge 100 ]; do sleep 0.05; i=$((i + 1)); done
SP=$(cat "$W/stall.port")
# the upload authenticates with the worker's key (a worker that joined a control plane has one)
printf 'wk-test\n' >"$W/w/worker.key"
chmod 600 "$W/w/worker.key"
uploads() { cat "$W/stall.seen" 2>/dev/null | wc -l; }
# (each message its own seq: a seq in progress answers a second message of the same seq when it is done)
seq=$((seq + 1))
"$SC" node snapshot $ADM --sandbox A --generation 1 --worker wa --seq $seq --url "http://127.0.0.1:$SP/a" \
	>"$W/snap-A.out" 2>&1 &
SA=$!
wait_for "A's snapshot is uploading (to the store that never answers)" sh -c "[ \$(cat '$W/stall.seen' 2>/dev/null | wc -l) -ge 1 ]"
seq=$((seq + 1))
"$SC" node snapshot $ADM --sandbox B --generation 1 --worker wa --seq $seq --url "http://127.0.0.1:$SP/b" \
	>"$W/snap-B.out" 2>&1 &
SB=$!
sleep 1
expect "B's snapshot waits for a bulk slot: the store saw one upload (the other slot stays free)" "$(uploads)" 1
t0=$(date +%s%N)
seq=$((seq + 1))
timeout 20 "$SC" node pause $ADM --sandbox V --generation 1 --worker wa --seq $seq >"$W/pause-V.out" 2>&1
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
expect "V's pause is answered (${ms} ms) while A's snapshot stalls and B's waits" \
	"$rc $(kill -0 "$SA" 2>/dev/null && echo waiting) $(kill -0 "$SB" 2>/dev/null && echo waiting)" "0 waiting waiting"
# the store goes away: A's upload fails, then B's snapshot gets the bulk slot and fails at once
kill "$STALL"; wait "$STALL" 2>/dev/null; STALL=""
wait "$SA"; wait "$SB"
expect "then both snapshots are answered, an error each (no store): A's, then B's in its turn" \
	"$(grep -q 'upload' "$W/snap-A.out" && echo failed) $(grep -q 'upload' "$W/snap-B.out" && echo failed)" "failed failed"
SA="" SB=""
expect "spaced-node serves on" "$("$SC" node status $ADM >/dev/null 2>&1 && kill -0 "$NPID" && echo yes)" yes
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
