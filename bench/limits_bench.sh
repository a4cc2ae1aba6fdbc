#!/bin/sh
# bench-limits: how exactly a worker holds sandboxes to their limits (issue 11), on a real
# `spacectl dev up` cluster (process substrate, needs root).
#
#  - CPU: a hog (4 busy processes) in one tenant's sandbox and a CPU-bound job (2 busy
#    processes) in another tenant's, both with the same --cpus, on one worker. Each should get
#    its share: min(its CPUs, what it can use) — here one CPU each. Measured from each
#    sandbox's CPU time (cpuacct / cpu.stat) over WINDOW seconds. The baseline, in the same
#    run, is the same load without spaced's CPU control (the two groups of processes side by
#    side on the host, as executions ran before they had CPU cgroups): the scheduler then
#    shares by process, so the hog takes more than its share and the job gets less.
#  - memory: a hog allocating 1 MiB at a time under --memory 128M; its sandbox's peak
#    memory against the limit.
#  - disk: /workspace filled under --disk 128M until ENOSPC; the bytes written against the limit.
#
#   limits_bench.sh BUILD [WINDOW_SECONDS]
# Last line: {"cpu_share_error":…, "mem_limit_error":…, "disk_limit_error":…, …}
set -u
BUILD=$(cd "${1:?usage: limits_bench.sh BUILD [WINDOW]}" && pwd)
WINDOW=${2:-10}
SC=$BUILD/spacectl/spacectl
CP=$BUILD/spaced-cp/spaced-cp
[ "$(id -u)" -eq 0 ] || { echo "bench-limits: the process substrate needs root"; exit 1; }
W=$(mktemp -d)
D=$W/cluster
export SPACED_ROUTE_CACHE="$W/routes"
trap '"$SC" dev down --dir "$D" >/dev/null 2>&1; rm -rf "$W"' EXIT
"$SC" dev up --workers 1 --dir "$D" >/dev/null 2>"$W/up.err" || { cat "$W/up.err"; exit 1; }
. "$D/env"
B_KEY=$("$CP" admin --state "$D/cp" create-tenant second 2>/dev/null)
as_b() { SPACED_API_KEY=$B_KEY SPACED_ROUTE_CACHE="$W/routes-b" "$SC" "$@"; }
NCPU=$(nproc)
MiB=1048576
busy() { # N: N busy processes for WINDOW+3 seconds
	echo "for i in \$(seq $1); do (end=\$((\$(date +%s) + $WINDOW + 3)); while [ \$(date +%s) -lt \$end ]; do :; done) & done; wait"
}
cpu_usec() { "$1" top "$2" --json | jq -r .cpu_usec; }

# share CPUS: one run of the pair; prints "hog_cpus job_cpus" (CPUs used on average)
share() {
	A=$("$SC" create --cpus "$1")
	B=$(as_b create --cpus "$1")
	"$SC" exec "$A" -- sh -c "$(busy 4)" >/dev/null 2>&1 &
	PA=$!
	as_b exec "$B" -- sh -c "$(busy 2)" >/dev/null 2>&1 &
	PB=$!
	sleep 2 # both running
	a0=$(cpu_usec "$SC" "$A"); b0=$(cpu_usec as_b "$B"); t0=$(date +%s%N)
	sleep "$WINDOW"
	a1=$(cpu_usec "$SC" "$A"); b1=$(cpu_usec as_b "$B"); t1=$(date +%s%N)
	wait $PA $PB
	"$SC" rm "$A" >/dev/null
	as_b rm "$B" >/dev/null
	echo "$a0 $a1 $b0 $b1 $t0 $t1" | awk '{w = ($6 - $5) / 1000; printf "%.3f %.3f\n", ($2 - $1) / w, ($4 - $3) / w}'
}

echo "bench-limits: $NCPU CPUs, windows of $WINDOW s; load average $(cut -d' ' -f1-3 /proc/loadavg)"
set -- $(share 1)
hog=$1 job=$2
set -- $(python3 - "$WINDOW" <<'PY'
import os, subprocess, sys, time
window = float(sys.argv[1])
def busy(n):
    return [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(n)]
def cpu(ps):  # seconds of CPU time of these processes (utime + stime)
    t = 0
    for p in ps:
        f = open("/proc/%d/stat" % p.pid).read().rsplit(")", 1)[1].split()
        t += int(f[11]) + int(f[12])
    return t / os.sysconf("SC_CLK_TCK")
hog, job = busy(4), busy(2)
time.sleep(2)
h0, j0, t0 = cpu(hog), cpu(job), time.time()
time.sleep(window)
h1, j1, t1 = cpu(hog), cpu(job), time.time()
for p in hog + job:
    p.kill()
    p.wait()
print("%.3f %.3f" % ((h1 - h0) / (t1 - t0), (j1 - j0) / (t1 - t0)))
PY
)
bhog=$1 bjob=$2
echo "  --cpus 1 each:  hog (4 processes) $hog CPUs, job (2 processes) $job CPUs; each's share is 1"
echo "  baseline, no CPU control: hog $bhog CPUs, job $bjob CPUs (shared by process, not by sandbox)"

M=$("$SC" create --memory 128M)
"$SC" exec "$M" -- python3 -c '
b = []
while True:
    b.append(bytearray(1 << 20))
' >/dev/null 2>&1
peak=$("$SC" top "$M" --json | jq -r .memory_peak_bytes)
ooms=$("$SC" top "$M" --json | jq -r .oom_kills)
echo "  memory: peak $peak bytes under a limit of $((128 * MiB)); OOM kills $ooms"

K=$("$SC" create --disk 128M)
filled=$("$SC" exec "$K" -- sh -c 'dd if=/dev/zero of=/workspace/f bs=1M >/dev/null 2>&1; stat -c %s /workspace/f')
echo "  disk: $filled bytes written before ENOSPC under a limit of $((128 * MiB))"

python3 - "$hog" "$job" "$bhog" "$bjob" "$peak" "$filled" "$((128 * MiB))" <<'PY'
import json, sys
hog, job, bhog, bjob, peak, filled, lim = map(float, sys.argv[1:])
cpu_err = max(abs(hog - 1.0), abs(job - 1.0))  # both shares are one CPU
base_err = max(abs(bhog - 1.0), abs(bjob - 1.0))
print(json.dumps({"cpu_share_error": round(cpu_err, 3), "mem_limit_error": round(abs(peak - lim) / lim, 4),
                  "disk_limit_error": round(abs(filled - lim) / lim, 4), "hog_cpus": hog, "job_cpus": job,
                  "baseline_cpu_share_error": round(base_err, 3), "baseline_hog_cpus": bhog,
                  "baseline_job_cpus": bjob}))
PY
