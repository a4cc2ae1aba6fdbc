#!/bin/sh
# client_bench.sh BUILD [READS] [MOVES] — spacectl against a dev cluster (`spacectl dev up`,
# two workers): the time of `spacectl dev up`; whole-command latency (process start
# included) of `spacectl fs read` and `spacectl exec true` through a cached route;
# of `spacectl fs read` through a stale cached route right after a move (REFRESH_ROUTE,
# resolution at the control plane, one retry); and of `spacectl move`.
# Prints medians and p90 in milliseconds, last line JSON.
set -eu
build=$(cd "$1" && pwd)
reads=${2:-200}
moves=${3:-10}
S=$build/spacectl/spacectl
W=$(mktemp -d)
export SPACED_ROUTE_CACHE="$W/routes"
trap '"$S" dev down --dir "$W/c" >/dev/null 2>&1 || true; rm -rf "$W"' EXIT
now() { date +%s%N; }
# stats FILE -> "p50 p90" in ms (values in ns, one a line)
stats() { sort -n "$1" | awk '{v[NR]=$1} END {printf "%.1f %.1f", v[int((NR+1)/2)]/1e6, v[int(NR*0.9+0.5)]/1e6}'; }
t0=$(now)
"$S" dev up --workers 2 --dir "$W/c" >/dev/null 2>"$W/up.err" || { cat "$W/up.err"; exit 1; }
t1=$(now)
up_ms=$(( (t1 - t0) / 1000000 ))
. "$W/c/env"
X=$("$S" create --worker worker-1)
"$S" fs mkdir "$X" /workspace >/dev/null 2>&1 || true
echo data | "$S" fs write "$X" /workspace/f
: >"$W/read"; : >"$W/exec"; : >"$W/repair"; : >"$W/move"; : >"$W/start"
i=0
while [ $i -lt "$reads" ]; do
	a=$(now); "$S" --help >/dev/null; b=$(now); echo $((b - a)) >>"$W/start"
	a=$(now); "$S" fs read "$X" /workspace/f >/dev/null; b=$(now); echo $((b - a)) >>"$W/read"
	a=$(now); "$S" exec "$X" -- true; b=$(now); echo $((b - a)) >>"$W/exec"
	i=$((i + 1))
done
to=worker-2
i=0
while [ $i -lt "$moves" ]; do
	a=$(now); "$S" move "$X" --to $to >/dev/null; b=$(now); echo $((b - a)) >>"$W/move"
	a=$(now); "$S" -v fs read "$X" /workspace/f >/dev/null 2>"$W/e"; b=$(now)
	grep -q 'REFRESH_ROUTE' "$W/e" || { echo "no REFRESH_ROUTE after a move"; cat "$W/e"; exit 1; }
	echo $((b - a)) >>"$W/repair"
	[ $to = worker-2 ] && to=worker-1 || to=worker-2
	i=$((i + 1))
done
set -- $(stats "$W/start"); s50=$1 s90=$2
set -- $(stats "$W/read"); r50=$1 r90=$2
set -- $(stats "$W/exec"); e50=$1 e90=$2
set -- $(stats "$W/repair"); p50=$1 p90=$2
set -- $(stats "$W/move"); m50=$1 m90=$2
echo "spacectl dev up (2 workers):              ${up_ms} ms"
echo "spacectl --help (process start) ($reads):   p50 ${s50} ms  p90 ${s90} ms"
echo "fs read, cached route ($reads):              p50 ${r50} ms  p90 ${r90} ms"
echo "exec true, cached route ($reads):            p50 ${e50} ms  p90 ${e90} ms"
echo "fs read, stale route repaired ($moves):      p50 ${p50} ms  p90 ${p90} ms"
echo "move ($moves):                               p50 ${m50} ms  p90 ${m90} ms"
printf '{"dev_up_ms":%s,"start_p50_ms":%s,"read_p50_ms":%s,"read_p90_ms":%s,"exec_p50_ms":%s,"exec_p90_ms":%s,"repaired_read_p50_ms":%s,"repaired_read_p90_ms":%s,"move_p50_ms":%s,"move_p90_ms":%s}\n' \
	"$up_ms" "$s50" "$r50" "$r90" "$e50" "$e90" "$p50" "$p90" "$m50" "$m90"
