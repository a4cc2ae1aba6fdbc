#!/bin/sh
# run-tests: light, about 20 s
# The executor's job slots (issue 12: a victim tenant's operations keep working while another
# abuses its own sandboxes). Snapshots and stages (a snapshot's download) are the long jobs a
# tenant can ask for many of at once, one per paused sandbox: they take at most half of the slots
# (spaced-node --executor-jobs N, default 64), the other half stays for every tenant's starts,
# stops and pauses. A worker with --executor-jobs 2, driven through its admin socket: two paused
# sandboxes' snapshots upload to a store that takes the connection and never answers (each would
# hold its slot for 30 s); the second waits for a bulk slot, and a third sandbox's pause is answered
# meanwhile. Before, both snapshots took both slots and the pause waited behind them. A start that
# must first fetch its template counts as such a job too.
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
NPID="" STALL="" SA="" SB="" SF=""
cleanup() {
	for p in $SA $SB $SF $STALL; do kill "$p" 2>/dev/null; done
	own_worker_down "$W/w"
	own_worker_down "$W/w2"
	[ -n "${CP_KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT

WID=wa
own_worker_up "$W/w" --worker-id $WID --uid-range 1880096768:8 --pool 0 --executor-jobs 2
seq=100
node() { # COMMAND SANDBOX [ARGS...]: the worker's control message for SANDBOX (generation 1)
	c=$1 s=$2; shift 2
	seq=$((seq + 1))
	"$SC" node "$c" $ADM --sandbox "$s" --generation 1 --worker $WID --seq $seq "$@"
}
# install_spec SANDBOX SPEC_JSON: an install with a spec the spacectl command does not make (a
# template, a tenant), straight on the admin socket, as message $seq (the caller takes it: this may
# run in the background); prints the worker's acknowledgement line
install_spec() {
	python3 - "${ADM#--admin }" "$seq" "$1" "$WID" "$2" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
m = {"seq": int(sys.argv[2]), "type": "install", "handoff": False,
     "identity": {"sandbox": sys.argv[3], "generation": 1, "worker": sys.argv[4], "substrate": "process",
                  "activation": "act-1"},
     "spec": json.loads(sys.argv[5])}
s.sendall((json.dumps(m) + "\n").encode())
print(s.makefile().readline().strip())
PY
}
# snap SANDBOX: its snapshot to the store, in the background (SNAP: its pid), answer in
# snap-SANDBOX.out (its seq taken here: a background function's would not count)
snap() {
	seq=$((seq + 1))
	"$SC" node snapshot $ADM --sandbox "$1" --generation 1 --worker $WID --seq $seq \
		--url "http://127.0.0.1:$SP/$1" >"$W/snap-$1.out" 2>&1 &
	SNAP=$!
}
# the upload authenticates with the worker's key (a worker that joined a control plane has one)
worker_key() {
	printf 'wk-test\n' >"$1/worker.key"
	chmod 600 "$1/worker.key"
}
for s in A B V; do node install "$s" >"$W/inst-$s.out" 2>&1 || { cat "$W/inst-$s.out"; fail "install $s"; exit 1; }; done
for s in A B; do node pause "$s" >/dev/null 2>&1 || fail "pause $s"; done
worker_key "$W/w"
# a store that takes every connection and never answers: it logs each request's first line (the
# sandbox or template it names) and lets go of its oldest connection when asked (release appears)
stall_start() {
	rm -f "$W/stall.port" "$W/stall.seen" "$W/release"
	python3 -c '
import os, socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", 0)); s.listen(16)
s.settimeout(0.05)
open(sys.argv[1] + ".tmp", "w").write(str(s.getsockname()[1])); os.rename(sys.argv[1] + ".tmp", sys.argv[1])
held = []
while True:
    try:
        c, _ = s.accept()
        c.settimeout(5)
        line = c.recv(4096).split(b"\r\n")[0].decode(errors="replace")
        held.append(c)
        open(sys.argv[2], "a").write(line + "\n")
    except OSError:
        pass
    if os.path.exists(sys.argv[3]) and held:
        os.unlink(sys.argv[3])
        held.pop(0).close()
' "$W/stall.port" "$W/stall.seen" "$W/release" &
	STALL=$!
	i=0; until [ -s "$W/stall.port" ] || [ $i -ge 100 ]; do sleep 0.05; i=$((i + 1)); done
	SP=$(cat "$W/stall.port")
}
stall_stop() { kill "$STALL"; wait "$STALL" 2>/dev/null; STALL=""; }
uploads() { cat "$W/stall.seen" 2>/dev/null | wc -l; }
# what the store was asked for, in order: the first path segment of each request
seen() { awk '{ print $2 }' "$W/stall.seen" 2>/dev/null | sed 's|^/||; s|[/?].*||' | tr '\n' ' '; }
stall_start
# (each message its own seq: a seq in progress answers a second message of the same seq when it is done)
snap A; SA=$SNAP
wait_for "A's snapshot is uploading (to the store that never answers)" sh -c "[ \$(cat '$W/stall.seen' 2>/dev/null | wc -l) -ge 1 ]"
snap B; SB=$SNAP
sleep 1
expect "B's snapshot waits for a bulk slot: the store saw one upload (the other slot stays free)" "$(uploads)" 1
t0=$(date +%s%N)
timeout 20 "$SC" node pause $ADM --sandbox V --generation 1 --worker $WID --seq $((seq += 1)) >"$W/pause-V.out" 2>&1
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
expect "V's pause is answered (${ms} ms) while A's snapshot stalls and B's waits" \
	"$rc $(kill -0 "$SA" 2>/dev/null && echo waiting) $(kill -0 "$SB" 2>/dev/null && echo waiting)" "0 waiting waiting"
# the store goes away: A's upload fails, then B's snapshot gets the bulk slot and fails at once
stall_stop
wait "$SA"; wait "$SB"
expect "then both snapshots are answered, an error each (no store): A's, then B's in its turn" \
	"$(grep -q 'upload' "$W/snap-A.out" && echo failed) $(grep -q 'upload' "$W/snap-B.out" && echo failed)" "failed failed"
SA="" SB=""

# a start that must first fetch its template (hundreds of megabytes on a real worker) is such a
# job too: F's install names a template the worker does not have, at the stalling store; A's next
# snapshot then waits for the bulk slot, and V's thaw is answered
stall_start
TH=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
seq=$((seq + 1))
install_spec F "{\"template\": {\"hash\": \"$TH\", \"url\": \"http://127.0.0.1:$SP/t\"}}" >"$W/inst-F.out" 2>&1 &
SF=$!
wait_for "F's template is being fetched (from the store that never answers)" sh -c "[ \$(cat '$W/stall.seen' 2>/dev/null | wc -l) -ge 1 ]"
snap A; SA=$SNAP
sleep 1
expect "A's snapshot waits for the bulk slot F's fetch holds: the store saw one connection" "$(uploads)" 1
timeout 20 "$SC" node thaw $ADM --sandbox V --generation 1 --worker $WID --seq $((seq += 1)) >"$W/thaw-V.out" 2>&1
expect "V's thaw is answered meanwhile" "$? $(kill -0 "$SF" 2>/dev/null && echo waiting) $(kill -0 "$SA" 2>/dev/null && echo waiting)" \
	"0 waiting waiting"
stall_stop
wait "$SF"; wait "$SA"
expect "then F's install and A's snapshot are answered, an error each (no store)" \
	"$(jq -r .ok "$W/inst-F.out" 2>/dev/null) $(grep -q 'upload' "$W/snap-A.out" && echo failed)" "false failed"
SA=""
expect "spaced-node serves on" "$("$SC" node status $ADM >/dev/null 2>&1 && kill -0 "$NPID" && echo yes)" yes

# ---- the bulk slots are shared between tenants ----
# (a worker with --executor-jobs 4: two bulk slots. Tenant hog's three snapshots: two upload, the
# third waits; then victim's snapshot waits too. When hog's first upload ends, the slot goes to
# victim's snapshot, not to hog's third, which came first: while two tenants ask, each holds at
# most one of the two. Before, a tenant's storm kept every bulk slot until its last job ended.)
own_worker_down "$W/w"
WID=wb
# (uid ranges of its own: a launcher of the first worker holds its range's lock until it exited)
own_worker_up "$W/w2" --worker-id $WID --uid-range 1880621056:8 --pool 0 --executor-jobs 4
seq=300
for s in H1 H2 H3 V2; do
	case $s in H*) tn=hog ;; *) tn=victim ;; esac
	seq=$((seq + 1))
	install_spec "$s" "{\"tenant\": \"$tn\"}" >"$W/inst-$s.out" 2>&1
	[ "$(jq -r .ok "$W/inst-$s.out" 2>/dev/null)" = true ] || { cat "$W/inst-$s.out"; fail "install $s"; }
	node pause "$s" >/dev/null 2>&1 || fail "pause $s"
done
worker_key "$W/w2"
stall_start
SNAPS=""
for s in H1 H2 H3 V2; do
	snap "$s"
	SNAPS="$SNAPS $SNAP"
	[ "$s" = H2 ] && wait_for "hog's first two snapshots are uploading" sh -c "[ \$(cat '$W/stall.seen' 2>/dev/null | wc -l) -ge 2 ]"
	sleep 0.3
done
sleep 1
expect "the two bulk slots: hog's H1 and H2 upload, H3 and victim's V2 wait" "$(seen)" "H1 H2 "
: >"$W/release"
wait_for "a third upload once H1's ends" sh -c "[ \$(cat '$W/stall.seen' 2>/dev/null | wc -l) -ge 3 ]"
expect "the freed slot went to victim's snapshot, not to hog's third (it came first)" "$(seen)" "H1 H2 V2 "
stall_stop
for p in $SNAPS; do wait "$p"; done
expect "then every snapshot is answered, an error each (no store)" \
	"$(for s in H1 H2 H3 V2; do grep -q 'upload' "$W/snap-$s.out" && echo failed; done | tr '\n' ' ')" \
	"failed failed failed failed "
expect "spaced-node serves on" "$("$SC" node status $ADM >/dev/null 2>&1 && kill -0 "$NPID" && echo yes)" yes
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
