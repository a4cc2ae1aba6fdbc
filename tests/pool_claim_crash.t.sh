#!/bin/sh
# run-tests: paired, about 7 s
# A pooled execution's record is written while its claim goes on (spaced-node/gate_ctl.c,
# claim_write_start: the wait for the disk and the claim's trip to the launcher, guest, bridge and
# gateway overlap), and the install is acknowledged only once both are done. An install sent again
# meanwhile (the worker's link restarted: the control plane replays what is unacknowledged) waits
# for the claim too, though its acknowledgement is on disk already: held here by the executor,
# stopped (SIGSTOP), until it goes on; the create then runs. Then the gate stops
# in between, on a real cluster (`spacectl dev up --pool 2`, process substrate): the executor is
# held (SIGSTOP) so the claim cannot be delivered, a create's record reaches the disk meanwhile
# with the claim's FIFOs still in place, then the gate and the executor are killed (-9). At the
# gate's next start that execution, which never took its identity, ends (its launcher goes, its
# record is a tombstone): the create is refused, never answered as running by an execution that
# cannot serve it, and nothing serves its generation again (I2). The worker then creates and
# serves again. An install sent again and again on one connection while in flight is answered
# once, and the connection goes on; a claim that had to start the sandbox's gateway again leaves
# nothing that a later start of the gate takes for an unfinished claim. Cites R1 (an
# acknowledgement means on disk) and I2.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
SC=$SPACED_BUILD/spacectl/spacectl
need_substrate sqlite3 jq
W=$(mktemp -d)
D=$W/cluster
export SPACED_ROUTE_CACHE="$W/routes"
HELD=""
trap '[ -n "$HELD" ] && kill -CONT "$HELD" 2>/dev/null; "$SC" dev down --dir "$D" >/dev/null 2>&1; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
if ! "$SC" dev up --workers 1 --dir "$D" --pool 2 >"$W/up.out" 2>"$W/up.err"; then
	cat "$W/up.err"; tail -n 20 "$D"/*.log 2>/dev/null
	echo "FAIL: dev up"; exit 1
fi
. "$D/env"
status() { "$SC" node status --admin "$D/worker-1/admin.sock" | jq -c ".result | $1"; }
pool_ready() { # the default key's pool holds 2 ready executions (at most 60 s)
	for i in $(seq 1 600); do
		[ "$(status '.pool.keys[] | select(.default) | .ready')" -ge 2 ] 2>/dev/null && break
		sleep 0.1
	done
	expect "the pool is ready" "$(status '.pool.keys[] | select(.default) | .ready >= 2')" true
}
pool_ready

GATE=$(role_pid spaced-gate)
EXE=$(role_pid spaced-executor)
[ -n "$GATE" ] && [ -n "$EXE" ] || { echo "FAIL: no gate or executor under worker-1's supervisor"; exit 1; }
DB=$D/worker-1/records.db
# held_create OUT [SANDBOX...] — the executor held (SIGSTOP), a create in the background (its output
# in $W/OUT.out and .err, its pid in CREATE); once the record of the execution claimed for it (none
# of the SANDBOXes') is on disk, its sandbox in S and the pooled execution's name in NAME
held_create() {
	out=$1
	shift
	others="''"
	for o in "$@"; do others="$others, '$o'"; done
	kill -STOP "$EXE"
	HELD=$EXE
	"$SC" create >"$W/$out.out" 2>"$W/$out.err" &
	CREATE=$!
	row=""
	for i in $(seq 1 100); do
		row=$(sqlite3 -readonly "$DB" "SELECT sandbox || ' ' || exec_name FROM records WHERE active = 1 AND state = 'running' AND exec_name LIKE 'pool/%' AND sandbox NOT IN ($others)" 2>/dev/null | head -n 1)
		[ -n "$row" ] && break
		sleep 0.1
	done
	S=${row%% *}
	NAME=${row#* pool/}
}

# ---- sent again while its claim waits: answered when the claim ends, not from the disk ----
held_create c1
S1=$S
C1=$CREATE
expect "a claimed execution's record and acknowledgement are on disk while its claim waits" \
	"$([ -n "$S1" ] && sqlite3 -readonly "$DB" "SELECT count(*) FROM acks WHERE json_extract(line, '$.ok') = 1 AND json_extract(line, '$.result.pid') = (SELECT pid FROM records WHERE sandbox = '$S1')")" 1
LINK=$(role_pid spaced-link)
kill -9 "$LINK"
resent() { grep -q "event=sent-again-in-progress" "$D/worker-1.log"; }
WAIT_SECONDS=30 wait_for "the control plane sent the install again (the link restarted)" resent
sleep 0.5
expect "the create waits for the claim, not answered from the stored acknowledgement" \
	"$(kill -0 "$C1" 2>/dev/null && echo waiting)" waiting
kill -CONT "$EXE"
HELD=""
wait "$C1"
expect "once the claim ends the create succeeds ($(head -c 300 "$W/c1.err" | tr '\n' ' '))" "$(cat "$W/c1.out")" "$S1"
expect "and its sandbox is served" "$("$SC" exec "$S1" -- hostname 2>&1)" "$S1"

# ---- sent again and again on one connection while in flight: one answer, the connection goes on ----
# (each copy taken on the connection waits for an answer; a copy that attached to the op in
# flight used to hold its place for good: 256 of them and the gate read nothing more from it)
pool_ready
EXE=$(role_pid spaced-executor)
held_create c2 "$S1"
S2=$S
C2=$CREATE
BODY=$(sqlite3 -readonly "$D/cp/cp.db" "SELECT body FROM outbox WHERE worker = 'worker-1' AND type = 'install' AND body LIKE '%\"$S2\"%' ORDER BY seq DESC LIMIT 1")
python3 - "$D/worker-1/admin.sock" "$BODY" "$EXE" >"$W/resend.out" 2>&1 <<'PY'
import json, os, signal, socket, sys, time
path, body, exe = sys.argv[1], sys.argv[2], int(sys.argv[3])
seq = json.loads(body)["seq"]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(path)
s.settimeout(0.5)
s.sendall((body + "\n").encode() * 300 + b'{"type":"status"}\n')
buf, acks, status, t0, resumed = b"", 0, False, time.time(), False
while time.time() - t0 < 20 and not (status and acks):
    if status and not resumed:  # the executor goes on: the op ends and answers
        os.kill(exe, signal.SIGCONT)
        resumed = True
    try:
        got = s.recv(65536)
    except socket.timeout:
        continue
    if not got:
        break
    buf += got
    while b"\n" in buf:
        line, buf = buf.split(b"\n", 1)
        o = json.loads(line)
        if o.get("ack") == seq:
            acks += 1
        elif "pool" in (o.get("result") or {}):
            status = True
if not resumed:
    os.kill(exe, signal.SIGCONT)
time.sleep(0.5)  # a second answer would come now
s.setblocking(False)
try:
    acks += sum(1 for l in s.recv(65536).split(b"\n") if l and json.loads(l).get("ack") == seq)
except BlockingIOError:
    pass
print("status" if status else "no-status", acks)
PY
HELD=""
expect "300 copies of an install in flight on one connection: what follows them is still read and answered, and the install is answered once ($(tr '\n' ' ' <"$W/resend.out" | head -c 300))" \
	"$(tail -n 1 "$W/resend.out")" "status 1"
# the link's own copy was answered on that connection: the control plane has it once the link restarts
kill -9 "$(role_pid spaced-link)"
wait "$C2"
expect "and the create ends as created ($(head -c 300 "$W/c2.err" | tr '\n' ' '))" "$(cat "$W/c2.out")" "$S2"

# ---- a claim whose gateway had to be started again: the sandbox serves across a restart of the gate ----
# (a pooled gateway that died while it waited: the claim starts one; the FIFO that gateway never read
# stayed behind, and every later start of the gate took the sandbox for an unfinished claim and ended it)
pool_ready
for g in "$D"/worker-1/pool/*/gateway; do
	kill -9 "$(sed -n 's/^pid=\([0-9]*\).*/\1/p' "$g")" 2>/dev/null
done
G=$("$SC" create --deny-out 198.18.7.0/24 2>"$W/g.err")
expect "a create whose claim starts its gateway again ($(head -c 300 "$W/g.err" | tr '\n' ' '))" "$("$SC" exec "$G" -- hostname 2>&1)" "$G"
GATE=$(role_pid spaced-gate)
kill -9 "$GATE"
regated() { P=$(role_pid spaced-gate); [ -n "$P" ] && [ "$P" != "$GATE" ] && "$SC" exec "$G" -- true >/dev/null 2>&1; }
WAIT_SECONDS=30 wait_for "the gate started again and serves" regated
expect "the sandbox still serves after the gate's restart" "$("$SC" exec "$G" -- hostname 2>&1)" "$G"
expect "and was not ended as an unfinished claim" \
	"$(grep -c "event=execution-ended sandbox=$G " "$D/worker-1.log")" 0

# ---- the gate stops between such a claim's two writes: the acknowledgement names the new gateway ----
# (its record and acknowledgement are written first with the pooled gateway's port, then again with
# the port of the gateway the claim started; a gate stopped in between left the first, which the
# control plane got for the install sent again: ServicePort URLs to a port nothing listens on.
# The supervisor is held so the gate stays down while that state is made.)
ack_gw() {
	sqlite3 -readonly "$DB" "SELECT json_extract(a.line, '\$.result.gateway') FROM acks a JOIN records r
		ON json_extract(a.line, '\$.result.epoch') = r.epoch WHERE r.sandbox = '$G' AND r.active = 1" 2>/dev/null | sort -u
}
GW_NOW=$(ack_gw)
expect "the sandbox's acknowledgement names its gateway" "$(echo "$GW_NOW" | grep -cE '^[0-9]+$')" 1
SUP=$(awk '$1 == "worker-1" {print $2}' "$D/pids")
kill -STOP "$SUP"
HELD=$SUP
GATE=$(role_pid spaced-gate)
kill -9 "$GATE"
downed() { ! kill -0 "$GATE" 2>/dev/null || grep -q '^State:.Z' "/proc/$GATE/status" 2>/dev/null; }
WAIT_SECONDS=10 wait_for "the gate is down" downed
sqlite3 "$DB" "UPDATE acks SET line = json_set(line, '\$.result.gateway', 1) WHERE json_extract(line, '\$.result.epoch') =
	(SELECT epoch FROM records WHERE sandbox = '$G' AND active = 1)"
expect "the first write's acknowledgement is on disk" "$(ack_gw)" 1
kill -CONT "$SUP"
HELD=""
WAIT_SECONDS=30 wait_for "the gate started again and serves" regated
expect "the restarted gate's acknowledgement names the gateway that listens ($GW_NOW)" "$(ack_gw)" "$GW_NOW"
expect "and it said so" "$(grep -c "event=ack-gateway-corrected seq=[0-9]* gateway=$GW_NOW" "$D/worker-1.log")" 1

# ---- the gate stops between the record's write and the claim's end ----
pool_ready
GATE=$(role_pid spaced-gate)
EXE=$(role_pid spaced-executor)
held_create create "$S1" "$S2" "$G"
expect "the claimed execution's record is on disk while its claim has not reached it" \
	"$([ -n "$S" ] && [ -p "$D/worker-1/run/$NAME.in" ] && echo yes)" yes
LAUNCHER=$(sed -n 's/^pid=\([0-9]*\).*/\1/p' "$D/worker-1/pool/$NAME/launcher" 2>/dev/null)
expect "no acknowledgement left the worker meanwhile (the create waits)" \
	"$(kill -0 "$CREATE" 2>/dev/null && echo waiting)" waiting
kill -9 "$GATE" "$EXE"
HELD=""

wait "$CREATE"
rc=$?
expect "the create is refused (exit $rc: $(head -c 300 "$W/create.err" | tr '\n' ' '))" "$([ "$rc" -ne 0 ] && echo refused)" refused
ended() { grep -q "event=execution-ended sandbox=$S .*its claim did not finish" "$D/worker-1.log"; }
WAIT_SECONDS=30 wait_for "the restarted gate ended the execution whose claim was cut" ended
gone() { [ -n "$LAUNCHER" ] && ! kill -0 "$LAUNCHER" 2>/dev/null; }
WAIT_SECONDS=30 wait_for "its launcher is gone" gone
expect "its record is a tombstone" \
	"$(sqlite3 -readonly "$DB" "SELECT active || ' ' || state FROM records WHERE sandbox = '$S'" 2>/dev/null)" "0 ended"
expect "the control plane does not show it running" \
	"$("$SC" ls 2>/dev/null | awk -v s="$S" '$1 == s {print $2}' | grep -c '^running$')" 0
expect "nothing serves its generation" "$("$SC" exec "$S" -- true >/dev/null 2>&1 && echo served || echo refused)" refused

X=$("$SC" create 2>"$W/x.err")
expect "the worker creates again" "$("$SC" exec "$X" -- hostname 2>&1)" "$X"
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
