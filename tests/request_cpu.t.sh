#!/bin/sh
# run-tests: alone (sets the request path's CPU cgroups, which every worker joins)
# The request path's CPU share (spaced-node --request-cpu), on a real cluster (`spacectl dev up`,
# two workers of the process substrate, plaintext: the flood speaks raw HTTP):
#  - the gate, node-api and the link run in a CPU cgroup of their own beside the executions'
#    parent ("spaced.worker-1+request"), weighed as the executions together by default; the executor
#    and the executions are not in it;
#  - its ceiling holds under a tenant's request flood (forged capabilities: each costs the gate a
#    signature check, and needs no sandbox of the flooder's): the kernel throttled the request
#    path, and the CPU it took stayed near its ceiling (a bound with the kernel's slack, not a
#    timing), while a victim tenant's operations kept succeeding and no daemon died (C5: every
#    forged capability refused); a move away from the flooded worker still takes effect there
#    (R3/R4: its link and gate, held to the ceiling, install the deactivation, and the old
#    capability is refused);
#  - the worker's metrics count the request path's CPU and the periods its ceiling held it back;
#  - `--request-cpu` refuses what it cannot mean, and a worker does not start with one it cannot
#    enforce (a cgroup2 hierarchy without the cpu controller); `off` leaves the processes where
#    they are;
#  - the cgroup goes with the worker.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
SC=$SPACED_BUILD/spacectl/spacectl
NODE=$SPACED_BUILD/spaced-node/spaced-node
[ "$(id -u)" -eq 0 ] || { echo "the process substrate needs root"; exit 77; }
for b in "$SC" "$NODE" "$SPACED_BUILD/spaced-node/spaced-launch" "$SPACED_BUILD/spaced-host/spaced-host" "$CP"; do
	[ -x "$b" ] || { echo "$b is not built"; exit 77; }
done
[ -f /sys/fs/cgroup/cpu/cpu.shares ] && [ -f /sys/fs/cgroup/cpuacct/cpuacct.usage ] ||
	{ echo "no cgroup v1 cpu and cpuacct hierarchies of their own here"; exit 77; }
W=$(mktemp -d)
D=$W/cluster
export SPACED_ROUTE_CACHE="$W/routes"
trap '"$SC" dev down --dir "$D" >/dev/null 2>&1; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT

# ---- the option refuses what it cannot mean (before anything starts) ----
for bad in weight=0 weight=101 max=0.05 max=-1 speed=2 "" "weight=8,"; do
	out=$("$NODE" --state "$W/x" --worker-id w --listen 127.0.0.1:0 --request-cpu "$bad" 2>&1)
	expect "--request-cpu '$bad' is refused" "$?:$(echo "$out" | grep -c 'request-cpu wants')" "2:1"
done
# a ceiling the host cannot hold is refused, not accepted and left unenforced
if grep -qw cgroup2 /proc/filesystems; then
	out=$(unshare -m sh -c 'mount --make-rprivate / && mount -t cgroup2 none /sys/fs/cgroup || exit 77
		exec timeout 20 "$1" --state "$2" --worker-id w --listen 127.0.0.1:0 --plaintext --request-cpu max=1' \
		sh "$NODE" "$W/cg2" 2>&1)
	rc=$?
	if [ $rc -eq 77 ]; then
		echo "skip: cannot mount cgroup2 in a mount namespace here"
	elif [ -e /sys/fs/cgroup/unified/cgroup.subtree_control ] &&
		grep -qw cpu /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null; then
		echo "skip: this host's cgroup2 has the cpu controller (the refusal is for hosts without it)"
	else
		expect "a --request-cpu that cannot be enforced stops the worker's start" \
			"$rc:$(echo "$out" | grep -c 'request-cpu cannot be enforced')" "2:1"
	fi
fi

# ---- a worker whose request path may take 0.2 CPU at most ----
if ! "$SC" dev up --workers 2 --dir "$D" --plaintext --request-cpu max=0.2 >"$W/up.out" 2>"$W/up.err"; then
	cat "$W/up.err"; echo "FAIL: dev up"; exit 1
fi
. "$D/env"
CPU=/sys/fs/cgroup/cpu/spaced.worker-1+request
ACCT=/sys/fs/cgroup/cpuacct/spaced.worker-1+request
cg_of() { sed -n 's/^[0-9]*:cpu:\(.*\)/\1/p' "/proc/$1/cgroup"; }
for n in spaced-gate spaced-api spaced-link; do
	p=$(role_pid $n)
	expect "$n runs in the request path's CPU cgroup" "$(cg_of "$p")" "/spaced.worker-1+request"
done
expect "the executor does not" "$(cg_of "$(role_pid spaced-executor)")" "/"
expect "its weight is the executions' parent's by default" "$(cat $CPU/cpu.shares)" 1024
expect "its ceiling is 0.2 CPU per 10 ms" "$(cat $CPU/cpu.cfs_period_us) $(cat $CPU/cpu.cfs_quota_us)" "10000 2000"
expect "the executions' parent keeps the default weight" "$(cat /sys/fs/cgroup/cpu/spaced.worker-1/cpu.shares)" 1024

# ---- a victim tenant, and a flooder who holds a sandbox's capability and forges others ----
VICTIM=$("$CP" admin --state "$D/cp" create-tenant victim)
v=$(as_victim create --worker worker-1) || fail "victim create"
as_victim exec "$v" -- sh -c 'echo kept >/workspace/f' || fail "victim write"
vl=$("$SC" node status --admin "$D/worker-1/admin.sock" |
	jq -r --arg s "$v" '.result.records[] | select(.identity.sandbox == $s) | .pid')
expect "the victim's guest runs below the executions' parent" \
	"$(cg_of "$(pgrep -P "$vl" | head -n 1)" | cut -d/ -f2)" spaced.worker-1
a=$("$SC" create --worker worker-1) || fail "flooder create"
m=$(as_victim create --worker worker-1) || fail "create of the sandbox to move"
mcap=$(SPACED_API_KEY=$VICTIM "$SC" route "$m" --json | jq -r .capability)
sleep 0.3 # past the control plane's route drain (V2), so the move is not held by it
cap=$("$SC" route "$a" --json | jq -r .capability)
# the signature's bytes changed: well formed, and refused only by the signature check
forged=$(python3 -c '
import sys
h, p, body, foot = sys.argv[1].split(".")
i = len(body) - 20
print(".".join([h, p, body[:i] + ("B" if body[i] != "B" else "C") + body[i + 1:], foot]))' "$cap")
port=$(cat "$D/worker-1/api.port")
expect "the forged capability is refused (C5)" \
	"$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $forged" "http://127.0.0.1:$port/v1/sandboxes/$a/stat?path=/")" 401
grep -q "reason=bad-signature" "$D/worker-1.log" && ok "by its signature" || fail "the forged capability is refused for its signature"
gate0=$(role_pid spaced-gate)
api0=$(role_pid spaced-api)

thr0=$(awk '$1 == "nr_throttled" {print $2}' $CPU/cpu.stat)
use0=$(cat $ACCT/cpuacct.usage)
t0=$(date +%s%N)
python3 "$SPACED_TOP/tests/request_flood.py" "$port" 8 4 "$a" "$forged" >"$W/flood.out" 2>&1 &
FLOOD=$!
sleep 1
vfail=0
for i in 1 2 3 4 5; do
	[ "$(as_victim exec "$v" -- cat /workspace/f 2>/dev/null)" = kept ] || vfail=$((vfail + 1))
	[ "$(as_victim fs read "$v" /workspace/f 2>/dev/null)" = kept ] || vfail=$((vfail + 1))
done
# R3/R4 under the binding ceiling: the move's deactivation reaches the flooded worker, which then
# refuses the capability of the execution it no longer serves
as_victim move "$m" --to worker-2 >/dev/null 2>&1 && ok "a move away from the flooded worker succeeds" ||
	fail "the move away from the flooded worker"
old=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $mcap" \
	"http://127.0.0.1:$port/v1/sandboxes/$m/stat?path=/")
expect "the flooded worker refuses the moved sandbox's old capability (R3/R4)" "$old" 409
mthr_mid=$(awk '$1 == "nr_throttled" {print $2}' $CPU/cpu.stat)
[ "$mthr_mid" -gt "$thr0" ] && ok "the ceiling was binding while the move took effect" ||
	fail "the request path was not throttled before the move"
wait "$FLOOD"
t1=$(date +%s%N)
use1=$(cat $ACCT/cpuacct.usage)
thr1=$(awk '$1 == "nr_throttled" {print $2}' $CPU/cpu.stat)
echo "flood: $(cat "$W/flood.out") refused requests in $(( (t1 - t0) / 1000000 )) ms; request path CPU" \
	"$(( (use1 - use0) / 1000000 )) ms; throttled $((thr1 - thr0)) times"
expect "the victim's exec and reads succeeded during the flood" "$vfail" 0
[ "$(cat "$W/flood.out")" -gt 100 ] 2>/dev/null && ok "the flood was answered" || fail "the flood was answered: $(cat "$W/flood.out")"
[ $((thr1 - thr0)) -gt 0 ] && ok "the kernel held the request path to its ceiling" ||
	fail "the request path was never throttled under the flood"
# 0.2 CPU of the wall time, with the kernel's slack (an overrun of up to a tick per period on
# a CPU): twice the ceiling at most, where unbounded the flood takes 0.9 CPU here
limit=$(( (t1 - t0) * 2 / 5 ))
[ $((use1 - use0)) -le $limit ] && ok "the request path's CPU stayed within twice its ceiling" ||
	fail "the request path took $(( (use1 - use0) / 1000000 )) ms of CPU in $(( (t1 - t0) / 1000000 )) ms (ceiling 0.2)"
# an operator sees it: the worker's metrics count the request path's CPU and its throttling
curl -s "http://127.0.0.1:$(cat "$D/worker-1/metrics.port")/metrics" >"$W/metrics"
mval() { awk -v k="$1" '$1 == k {print $2}' "$W/metrics"; }
mthr=$(mval spaced_node_request_cpu_throttled_total)
[ "${mthr:-0}" -ge $((thr1 - thr0)) ] 2>/dev/null && [ "$mthr" -gt 0 ] &&
	ok "spaced_node_request_cpu_throttled_total counts the flood's throttling ($mthr)" ||
	fail "spaced_node_request_cpu_throttled_total: '$mthr', the cgroup counted $((thr1 - thr0))"
msec=$(mval spaced_node_request_cpu_seconds_total)
[ -n "$msec" ] && awk -v s="$msec" 'BEGIN { exit !(s > 0.5) }' &&
	ok "spaced_node_request_cpu_seconds_total counts its CPU ($msec s)" ||
	fail "spaced_node_request_cpu_seconds_total: '$msec'"
expect "the gate did not die" "$(role_pid spaced-gate)" "$gate0"
expect "node-api did not die" "$(role_pid spaced-api)" "$api0"
expect "the victim's file is intact" "$(as_victim exec "$v" -- cat /workspace/f)" kept

# ---- the cgroup goes with the worker ----
"$SC" dev down --dir "$D" >/dev/null 2>&1
expect "dev down removes the request path's cgroups" "$(ls -d $CPU $ACCT 2>/dev/null | wc -l)" 0

# ---- off: the processes stay in the host's CPU share ----
# (one worker: the default cgroup parent, whose name another cluster on this host may use too;
# what counts is that this one made none and put nothing in one)
CPU=/sys/fs/cgroup/cpu/spaced+request
before=$(ls -d $CPU 2>/dev/null | wc -l)
if ! "$SC" dev up --workers 1 --dir "$D" --plaintext --request-cpu off >"$W/up2.out" 2>"$W/up2.err"; then
	cat "$W/up2.err"; echo "FAIL: dev up (off)"; exit 1
fi
expect "with off, the gate stays in its parent's CPU cgroup" "$(cg_of "$(role_pid spaced-gate)")" "/"
expect "and no request path cgroup is made" "$(ls -d $CPU 2>/dev/null | wc -l)" "$before"
expect "none of its request path's processes is in one" \
	"$(for n in spaced-gate spaced-api spaced-link; do for p in $(role_pids $n); do cg_of "$p"; done; done | grep -c '+request')" 0

echo "$FAILS failure(s)"
[ "$FAILS" -eq 0 ]
