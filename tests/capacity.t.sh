#!/bin/sh
# run-tests: alone (caps the executions' parent cgroup every one-worker cluster shares, reads the disk's free space)
# A worker's capacity (spaced-node --allocatable; DESIGN §5 Resources): what one tenant's sandboxes
# can take from the host and from the other tenants on a worker, all together.
#   - Before: every worker accepted `--pids 32768` (its maximum), the whole process table of a host
#     whose kernel.pid_max is 32768, and any number of sandboxes whose limits added up past the
#     host's memory and tasks: one tenant's fork bombs took every PID of the host (the daemons'
#     forks failed) and its memory hogs the host's memory.
#   - Now: maxima are lowered to the worker's allocatable; the limits of its sandboxes add up to
#     at most that (tasks exactly, memory twice: --memory-overcommit), checked by the control
#     plane's placement (503 no-worker with room) and again by the worker (no-capacity); all
#     executions together are capped in their parent cgroups, so past it the kernel kills
#     inside the executions, never the host's daemons.
#   - The host's disk (the filesystem of the worker's records, logs and cache): the sandboxes' sparse
#     disks may still write at most twice what it has free beyond a reserve (--disk-reserve,
#     --disk-overcommit), else no-capacity — and the control plane then places the create on another
#     worker with room.
# A victim tenant's sandbox on the same worker keeps forking and working throughout.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
SC=$SPACED_BUILD/spacectl/spacectl
need_substrate python3
[ -d /sys/fs/cgroup/pids ] && [ -d /sys/fs/cgroup/memory ] || { echo "no cgroup v1 memory and pids hierarchies"; exit 77; }
W=$(mktemp -d)
D=$W/cluster
export SPACED_ROUTE_CACHE="$W/routes"
trap '"$SC" dev down --dir "$D" >/dev/null 2>&1; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
MiB=1048576

# ---- malformed capacity settings are refused before anything starts ----
refused_flag --allocatable memory=1X
refused_flag --allocatable cpus=2
refused_flag --memory-overcommit 0.5
refused_flag --disk-overcommit -1
refused_flag --disk-reserve lots
refused_flag --cgroup-parent other
refused_flag --cgroup-parent spaced.

cluster_up --allocatable memory=1G,pids=1200

expect "the worker reports what its sandboxes may take" \
	"$("$SC" workers --json | jq -cS '.[0].limits.allocatable')" '{"memory_bytes":1073741824,"memory_overcommit":2,"pids":1200}'
expect "its maxima are lowered to it" "$("$SC" workers --json | jq -c '[.[0].limits.max.memory_bytes, .[0].limits.max.pids]')" \
	"[1073741824,1200]"
# all executions together, in their parent cgroups: memory, and tasks with room for the warm pool
node=$(awk '$1 == "worker-1" { print $2 }' "$D/pids")
memcg=$(sed -n 's/^[0-9]*:memory://p' "/proc/$node/cgroup")
pidcg=$(sed -n 's/^[0-9]*:pids://p' "/proc/$node/cgroup")
[ "$memcg" = / ] && memcg=""
[ "$pidcg" = / ] && pidcg=""
expect "all executions together: memory capped at 1 GiB" \
	"$(cat "/sys/fs/cgroup/memory$memcg/spaced/memory.limit_in_bytes")" $((1024 * MiB))
expect "all executions together: tasks capped at 1200 and 1024 for the pool" \
	"$(cat "/sys/fs/cgroup/pids$pidcg/spaced/pids.max")" 2224

"$SC" create --pids 5000 >/dev/null 2>"$W/e"
expect "a sandbox asking more tasks than the worker has: 422 limit-exceeded" "$(grep -c '422 limit-exceeded' "$W/e")" 1

VX=$(as_victim create --pids 64 --memory 128M)
printf 'victim data\n' | as_victim fs write "$VX" /workspace/v.txt
victim_ok() { # the victim's exec (a fork inside), write and read still work
	got=$(as_victim exec "$VX" -- sh -c 'for i in $(seq 1 30); do sleep 1 & done; wait; echo alive; cat /workspace/v.txt' 2>&1 | tr '\n' ' ')
	expect "victim still served $1 (30 children forked)" "$got" "alive victim data "
}

# ---- tasks: placed only where the limits fit; a fork bomb stops at its own limit ----
H1=$("$SC" create --pids 1000 --memory 400M)
[ -n "$H1" ] || { echo "FAIL: the first hostile sandbox"; exit 1; }
"$SC" create --pids 500 >/dev/null 2>"$W/e"
expect "limits past the worker's tasks: 503 no-worker (1064 + 500 > 1200)" "$(grep -c '503 no-worker' "$W/e")" 1
# the worker refuses it by itself too (a control plane with an older view)
"$SC" exec "$H1" -- python3 -c '
import os, time
n = 0
try:
    while n < 5000:
        if os.fork() == 0:
            time.sleep(4)
            os._exit(0)
        n += 1
except OSError:
    pass
print(n, flush=True)
' >"$W/bomb.out" 2>&1
expect "the fork bomb stops at its own limit (the shell and python are two of its 1000 tasks)" \
	"$(awk '{ print ($1 >= 990 && $1 <= 999) ? "yes" : $1 }' "$W/bomb.out")" yes
victim_ok "beside the fork bomb"
host=$(sh -c 'for i in $(seq 1 50); do sleep 1 & done; wait; echo ok' 2>&1)
expect "the host forks beside it" "$host" ok

sleep 4 # the bomb's children end

# ---- memory: over the worker's memory, the kernel kills inside the executions only ----
H2=$("$SC" create --memory 900M --pids 64)
[ -n "$H2" ] || { echo "FAIL: a sandbox within the memory overcommit (128 + 400 + 900 MiB <= 2 GiB)"; exit 1; }
"$SC" exec "$H1" -- python3 -c '
import time
b = bytearray(380 << 20)
for i in range(0, len(b), 4096):
    b[i] = 1
print("held", flush=True)
time.sleep(60)
' >"$W/h1.out" 2>&1 &
H1P=$!
for i in $(seq 200); do grep -q held "$W/h1.out" && break; sleep 0.1; done
expect "a sandbox holds 380 MiB" "$(cat "$W/h1.out")" held
"$SC" exec "$H2" -- python3 -c '
b = []
while len(b) < 880:
    b.append(bytearray(1 << 20))
    for j in range(0, 1 << 20, 4096):
        b[-1][j] = 1
    print(len(b), flush=True)
' >"$W/h2.out" 2>"$W/h2.err"
got=$(tail -n 1 "$W/h2.out")
echo "the second hog reached $got MiB of its 900 MiB limit"
expect "the hog is killed when all executions reach 1 GiB, before its own limit" \
	"$([ "${got:-0}" -ge 100 ] && [ "${got:-0}" -lt 700 ] && echo yes)" yes
expect "the other sandbox's memory is left alone" "$(kill -0 $H1P 2>/dev/null && echo running)" running
kill $H1P 2>/dev/null
expect "spaced-node is alive" "$(kill -0 "$node" 2>/dev/null && echo yes)" yes
victim_ok "after the memory pressure"

# ---- capacity comes back when a sandbox goes ----
"$SC" rm "$H1" >/dev/null
H3=$("$SC" create --pids 500)
expect "after rm, the tasks it held are placed again" "$([ -n "$H3" ] && echo yes)" yes

# ---- the host's disk: what sandboxes may still write to their sparse disks stays within twice
# what the filesystem has free beyond the reserve (before: 64 sandboxes x 2 GiB on any filesystem) ----
"$SC" dev down --dir "$D" >/dev/null
avail=$(df -B1 --output=avail "$W" | tail -n 1 | tr -d ' ')
reserve=$((avail - 1500 * MiB)) # twice 1500 MiB: one 2 GiB disk fits, two do not
cluster_up --disk-reserve "$reserve"
K1=$("$SC" create --disk 2G)
expect "a 2 GiB disk within twice what is free beyond the reserve" "$([ -n "$K1" ] && echo yes)" yes
"$SC" create --disk 2G >/dev/null 2>"$W/e"
expect "a second one past it: refused no-capacity" "$(grep -c 'no-capacity.*could write' "$W/e")" 1
"$SC" rm "$K1" >/dev/null
# (the execution is stopped after the answer: its promise goes with it)
for i in $(seq 20); do K2=$("$SC" create --disk 2G 2>/dev/null) && break; sleep 0.5; done
expect "after rm, the disk it promised is placed again" "$([ -n "$K2" ] && echo yes)" yes

# ---- a worker's refusal for want of room (what only it knows: its disk's free space) does not fail
# the create: the control plane places it on another worker, as a new generation (before: 502
# worker-refused to the client while another worker had room) ----
"$SC" dev down --dir "$D" >/dev/null
avail=$(df -B1 --output=avail "$W" | tail -n 1 | tr -d ' ')
reserve=$((avail - 1600 * MiB)) # each worker: twice 1600 MiB
cluster_up --workers 2 --disk-reserve "$reserve"
worker_gen() { "$SC" inspect "$1" --json | jq -r '.worker + " " + (.generation|tostring)'; }
R1=$("$SC" create --disk 2G)
R2=$("$SC" create --disk 512M)
expect "placement: a 2 GiB disk on worker-1, then 512 MiB on worker-2 (the one with more room)" \
	"$(worker_gen "$R1" | cut -d' ' -f1) $(worker_gen "$R2" | cut -d' ' -f1)" "worker-1 worker-2"
# two workers of one host (before: one parent cgroup, capped at whichever worker set it last)
for w in 1 2; do
	n=$(awk -v w=worker-$w '$1 == w { print $2 }' "$D/pids")
	mcg=$(sed -n 's/^[0-9]*:memory://p' "/proc/$n/cgroup"); [ "$mcg" = / ] && mcg=""
	p=/sys/fs/cgroup/memory$mcg/spaced.worker-$w
	expect "worker-$w caps its own executions (its sandbox, its pool) in a parent of its own" \
		"$([ -f "$p/memory.limit_in_bytes" ] && [ "$(ls -d "$p"/spaced-* 2>/dev/null | wc -l)" -ge 1 ] && echo yes)" yes
done
# as many sandboxes each: worker-1 first, which refuses (2 GiB + 2 GiB past twice 1600 MiB);
# worker-2 takes it (512 MiB + 2 GiB within)
R3=$("$SC" create --disk 2G 2>"$W/e")
expect "a create worker-1 refused no-capacity runs on worker-2, as generation 2 (I2: a new generation)" "$(worker_gen "$R3" 2>&1)" "worker-2 2"
expect "the control plane logged where it went" \
	"$(grep -c "event=start-elsewhere sandbox=$R3 refused-by=worker-1 worker=worker-2" "$D/cp.log")" 1
expect "the sandbox answers there" "$("$SC" exec "$R3" -- echo here 2>&1)" here
# no worker with room: the worker's refusal is the answer
"$SC" create --disk 2G >/dev/null 2>"$W/e"
expect "past both workers: 502 worker-refused no-capacity" "$(grep -c 'worker-refused.*no-capacity\|no-capacity.*could write' "$W/e")" 1

echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
