#!/bin/sh
# snapshot_io_bench.sh BUILD [SECONDS] [SIZE_MB] — what another tenant's snapshots cost a victim's disk.
# On a one-worker `spacectl dev up` cluster (its default --disk-io), a victim sandbox writes 4 KiB and
# fsyncs it every 10 ms for SECONDS (default 30), once quiet and once while a second tenant's sandbox,
# holding SIZE_MB (default 1200) of random data, is paused, snapshotted to the control plane's store
# and resumed twice. A snapshot moves that data three times (copied out of the sandbox, packed and
# uploaded, stored; a resume fetches, restores and copies it again); written without bound it sat
# dirty in the host's page cache and the victim's fsyncs waited behind its writeback.
# Last line: {"fsync_p99_ms_quiet":…, "fsync_p99_ms_loaded":…, "fsync_max_ms_quiet":…,
#             "fsync_max_ms_loaded":…, "fsyncs_over_100ms_loaded":…, "snapshot_s":…}
set -u
build=$(cd "$1" && pwd)
SECS=${2:-30}
SIZE_MB=${3:-1200}
S=$build/spacectl/spacectl
DIR=$(mktemp -d)
trap '"$S" dev down --dir "$DIR/c" >/dev/null 2>&1; rm -rf "$DIR"' EXIT

cat > "$DIR/victim.py" <<'PY'
import json, os, sys, time
dur, path = float(sys.argv[1]), sys.argv[2]
end, lat, buf = time.time() + dur, [], os.urandom(4096)
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
i = 0
while time.time() < end and i < 100000:
    t = time.perf_counter()
    os.pwrite(fd, buf, (i % 256) * 4096)
    os.fsync(fd)
    lat.append((time.perf_counter() - t) * 1000)
    i += 1
    time.sleep(0.01)
lat.sort()
n = len(lat)
print(json.dumps({"n": n, "p50": lat[n // 2], "p99": lat[int(n * 0.99)], "max": lat[-1],
                  "over100": sum(1 for x in lat if x > 100)}))
PY

"$S" dev up --dir "$DIR/c" --workers 1 --pool 1 >"$DIR/up.log" 2>&1 || { cat "$DIR/up.log"; exit 1; }
. "$DIR/c/env"
V=$("$S" create --disk 1G | awk '{print $1; exit}')
A=$("$S" create --disk $((SIZE_MB * 2 + 512))M | awk '{print $1; exit}')
[ -n "$V" ] && [ -n "$A" ] || { echo "create failed"; exit 1; }
"$S" exec "$A" -- sh -c "head -c $((SIZE_MB * 1000000)) /dev/urandom > /workspace/big && sync" >/dev/null ||
	{ echo "cannot fill the attacker's sandbox"; exit 1; }

quiet=$("$S" exec "$V" -- python3 -c "$(cat "$DIR/victim.py")" "$SECS" /workspace/v) || { echo "victim failed"; exit 1; }
(
	sleep 2
	for i in 1 2; do
		"$S" pause "$A" >/dev/null || exit 1
		t0=$(date +%s.%N)
		"$S" snapshot "$A" >/dev/null || { echo "snapshot $i failed" >&2; exit 1; }
		t1=$(date +%s.%N)
		echo "$t0 $t1" | awk '{printf "%.2f\n", $2 - $1}'
		"$S" resume "$A" >/dev/null || { echo "resume $i failed" >&2; exit 1; }
	done
) > "$DIR/snap.log" &
AP=$!
loaded=$("$S" exec "$V" -- python3 -c "$(cat "$DIR/victim.py")" "$((SECS + 10))" /workspace/v) ||
	{ echo "victim failed"; exit 1; }
wait $AP || { echo "the attacker's snapshots failed"; cat "$DIR/snap.log"; exit 1; }

python3 - "$quiet" "$loaded" "$DIR/snap.log" <<'PY'
import json, sys
q, l = json.loads(sys.argv[1]), json.loads(sys.argv[2])
snaps = [float(x) for x in open(sys.argv[3]).read().split()]
print("victim fsync, quiet:  n=%d p50=%.2f p99=%.2f max=%.1f ms" % (q["n"], q["p50"], q["p99"], q["max"]))
print("victim fsync, loaded: n=%d p50=%.2f p99=%.2f max=%.1f ms, %d over 100 ms" %
      (l["n"], l["p50"], l["p99"], l["max"], l["over100"]))
print("the other tenant's snapshots: %s s" % " / ".join("%.2f" % s for s in snaps))
print(json.dumps({"fsync_p99_ms_quiet": round(q["p99"], 2), "fsync_p99_ms_loaded": round(l["p99"], 2),
                  "fsync_max_ms_quiet": round(q["max"], 1), "fsync_max_ms_loaded": round(l["max"], 1),
                  "fsyncs_over_100ms_loaded": l["over100"], "snapshot_s": max(snaps) if snaps else None}))
PY
