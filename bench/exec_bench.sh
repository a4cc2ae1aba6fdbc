#!/bin/sh
# make bench-exec: 1 GiB through a streamed exec's stdout, through `spacectl fs read`
# and through `spacectl fs write`, each in MB/s (10^6 bytes), against plain `cat` of
# the same 1 GiB file on this host measured in the same run (through a pipe:
# `cat F | cat > /dev/null`, the ratio's base; and straight to /dev/null). A dev
# cluster with one worker on the process substrate (root; else the dev substrate),
# the sandbox with --cpus 2 --memory 3G --disk 4G so its page cache holds the file.
# For every path it also prints where the CPU went, per GiB: spacectl, node-api, the
# gate (sbx-manager), the execution's bridge (spaced-host) and the sandbox (its
# guest and the command, from its cgroup's cpu_usec). And what bounds fs write (an
# acknowledged write is on disk): the sandbox's own disk, a new 1 GiB file written by
# dd inside it and fsynced, and the host's, the file copied by cat and fsynced.
#   exec_bench.sh BUILD [REPS]   (REPS runs of each, median; default 3)
# The last line is JSON.
set -u
build=$(cd "${1:?usage: exec_bench.sh BUILD [REPS]}" && pwd)
reps=${2:-3}
S=$build/spacectl/spacectl
for tool in jq; do command -v $tool >/dev/null || { echo "bench-exec: $tool is not installed"; exit 1; }; done
[ -x /usr/bin/time ] || { echo "bench-exec: /usr/bin/time is not installed"; exit 1; }
W=$(mktemp -d /tmp/bench-exec-XXXXXX)
D=$W/cluster
export SPACED_ROUTE_CACHE=$W/routes
trap '"$S" dev down --dir "$D" >/dev/null 2>&1; rm -rf "$W"' EXIT INT TERM
SIZE=1073741824
TCK=$(getconf CLK_TCK)

# the path is measured, not the operator's bound: without --disk-io a sandbox's disk is held to
# 256 MiB/s each way (spaced-node's default), which caps the fs write figure
# BENCH_CPU_LATENCY_US=N: the worker runs with --cpu-latency-us N (idle CPUs wake within N us; the
# host's cats in the same run then wake as fast: the request holds for the whole host)
# BENCH_REQUEST_CPU=LIST: the worker runs with --request-cpu LIST (weight=N,max=CPUS or off)
"$S" dev up --workers 1 --dir "$D" --disk-io "${BENCH_DISK_IO:-0}" \
	${BENCH_CPU_LATENCY_US:+--cpu-latency-us "$BENCH_CPU_LATENCY_US"} \
	${BENCH_REQUEST_CPU:+--request-cpu "$BENCH_REQUEST_CPU"} >/dev/null || { echo "bench-exec: dev up failed"; exit 1; }
. "$D/env"
X=$("$S" create --cpus 2 --memory 3G --disk 4G) || { echo "bench-exec: create failed"; exit 1; }
dir=/workspace
"$S" fs stat "$X" /workspace >/dev/null 2>&1 || dir=/tmp
echo "bench-exec: 1 GiB, $reps runs each (median), sandbox $X, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
head -c $SIZE /dev/urandom >"$W/g1"
want=$(sha256sum <"$W/g1" | cut -d' ' -f1)

now() { date +%s%N; }
median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
mbps() { echo $((SIZE * 1000 / $1)); } # ns -> MB/s

# worker-side processes: node-api (the one spaced-node of worker-1 that dropped root),
# the gate (its parent, sbx-manager) and the sandbox's bridge
pid_of() { # node-api | host
	for p in $(pgrep -f "$D/worker-1"); do
		case "$1:$(readlink "/proc/$p/exe" 2>/dev/null)" in
		node-api:*/spaced-node) [ "$(awk '/^Uid/ {print $2}' "/proc/$p/status")" != 0 ] && echo $p ;;
		host:*/spaced-host) tr '\0' ' ' <"/proc/$p/cmdline" | grep -q "$X" && echo $p ;;
		esac
	done 2>/dev/null | head -n 1
}
ticks() { [ -n "$1" ] && awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
sbx_usec() { "$S" top "$X" --json | jq .cpu_usec; }
P_API=$(pid_of node-api); P_HOST=$(pid_of host)
P_GATE=$([ -n "$P_API" ] && awk '{print $4}' "/proc/$P_API/stat")
echo "bench-exec: node-api pid ${P_API:-?}, gate pid ${P_GATE:-?}, spaced-host pid ${P_HOST:-? (none: dev substrate)}" \
	"(spaced-host hands each verified connection over to the gate: it is not on the data path)"

# run NAME CMD: times CMD (a shell line) REPS times; sets ${NAME}_ns (median) and prints the CPU per GiB
run() {
	name=$1 cmd=$2
	: >"$W/$name.ns"
	a0=$(ticks "$P_API") g0=$(ticks "$P_GATE") h0=$(ticks "$P_HOST") s0=$(sbx_usec)
	: >"$W/$name.cpu"
	i=0
	while [ $i -lt "$reps" ]; do
		a=$(now)
		/usr/bin/time -a -o "$W/$name.cpu" -f "%U %S" sh -c "$cmd" || { echo "bench-exec: $name failed"; exit 1; }
		b=$(now)
		echo $((b - a)) >>"$W/$name.ns"
		i=$((i + 1))
	done
	a1=$(ticks "$P_API") g1=$(ticks "$P_GATE") h1=$(ticks "$P_HOST") s1=$(sbx_usec)
	eval "${name}_ns=$(median <"$W/$name.ns")"
	cli=$(awk '{t += $1 + $2} END {printf "%.2f", t / NR}' "$W/$name.cpu")
	printf '  CPU s per GiB: the timed command (spacectl, or the host cats) %s, node-api %s, gate %s, spaced-host %s, sandbox (guest + command) %s\n' \
		"$cli" "$(echo "$a0 $a1" | awk -v r="$reps" -v t="$TCK" '{printf "%.2f", ($2 - $1) / t / r}')" \
		"$(echo "$g0 $g1" | awk -v r="$reps" -v t="$TCK" '{printf "%.2f", ($2 - $1) / t / r}')" \
		"$(echo "$h0 $h1" | awk -v r="$reps" -v t="$TCK" '{printf "%.2f", ($2 - $1) / t / r}')" \
		"$(echo "$s0 $s1" | awk -v r="$reps" '{printf "%.2f", ($2 - $1) / 1e6 / r}')"
}

cat "$W/g1" >/dev/null # the host's page cache
echo "host: cat FILE | cat > /dev/null"
run host_pipe "cat '$W/g1' | cat >/dev/null"
echo "host: cat FILE > /dev/null"
run host_null "cat '$W/g1' >/dev/null"
# what an acknowledged fs write is held to on the host: the same file written anew and fsynced,
# on the file system that holds the sandboxes' disks
echo "host: cat FILE > NEW, fsync (the host's own disk)"
run host_disk "rm -f '$W/copy'; cat '$W/g1' >'$W/copy' && sync '$W/copy'; rm -f '$W/copy'"
echo "spacectl fs write ID $dir/g1 < FILE"
run write "'$S' fs write '$X' $dir/g1 <'$W/g1'"
got=$("$S" exec "$X" -- sha256sum $dir/g1 | cut -d' ' -f1)
[ "$got" = "$want" ] || { echo "bench-exec: the file written is not the same ($got)"; exit 1; }
"$S" exec "$X" -- sh -c "cat $dir/g1 >/dev/null" # the sandbox's page cache
echo "spacectl exec ID -- cat $dir/g1 > /dev/null"
run exec "'$S' exec '$X' -- cat $dir/g1 >/dev/null"
echo "spacectl fs read ID $dir/g1 > /dev/null"
run read "'$S' fs read '$X' $dir/g1 >/dev/null"
echo "inside the sandbox: cat $dir/g1 > /dev/null (no stream)"
run inside "'$S' exec '$X' -- sh -c 'cat $dir/g1 >/dev/null'"
# byte-exact once each (not timed)
[ "$("$S" exec "$X" -- cat $dir/g1 | sha256sum | cut -d' ' -f1)" = "$want" ] || { echo "bench-exec: exec output differs"; exit 1; }
[ "$("$S" fs read "$X" $dir/g1 | sha256sum | cut -d' ' -f1)" = "$want" ] || { echo "bench-exec: fs read differs"; exit 1; }
# what fs write ends in: the sandbox's own disk, 1 GiB written anew and fsynced from inside (its
# sparse image on the host's file system takes each block as it is first written)
echo "inside the sandbox: dd 1 GiB to a new file, fsync (no stream: the disk fs write writes to)"
"$S" exec "$X" -- rm -f $dir/g1
run disk "'$S' exec '$X' -- sh -c 'rm -f $dir/dd; dd if=/dev/zero of=$dir/dd bs=1M count=1024 conv=fsync 2>/dev/null; rm -f $dir/dd'"

hp=$(mbps "$host_pipe_ns") hn=$(mbps "$host_null_ns") hd=$(mbps "$host_disk_ns")
e=$(mbps "$exec_ns") r=$(mbps "$read_ns") w=$(mbps "$write_ns") in=$(mbps "$inside_ns") dk=$(mbps "$disk_ns")
ratio() { echo "$1 $2" | awk '{printf "%.3f", $1 / $2}'; }
echo
printf '%-48s %6s MB/s\n' "host cat | cat > /dev/null (base)" "$hp" "host cat > /dev/null" "$hn" \
	"host cat > new file, fsync (the host's disk)" "$hd" \
	"exec stdout" "$e" "fs read" "$r" "fs write" "$w" "cat inside the sandbox (no stream)" "$in" \
	"the sandbox's disk: dd of a new file, fsync" "$dk"
echo "ratios to the piped host cat: exec $(ratio "$e" "$hp"), read $(ratio "$r" "$hp"), write $(ratio "$w" "$hp");" \
	"to cat > /dev/null: exec $(ratio "$e" "$hn"), read $(ratio "$r" "$hn"), write $(ratio "$w" "$hn");" \
	"fs write to the sandbox's own disk: $(ratio "$w" "$dk"), to the host's: $(ratio "$w" "$hd")"
printf '{"exec_mbps_ratio":%s,"read_mbps_ratio":%s,"write_mbps_ratio":%s,"exec_mbps":%s,"read_mbps":%s,"write_mbps":%s,"host_pipe_mbps":%s,"host_devnull_mbps":%s,"exec_mbps_ratio_devnull":%s,"read_mbps_ratio_devnull":%s,"write_mbps_ratio_devnull":%s,"sandbox_disk_mbps":%s,"write_to_disk_ratio":%s,"host_disk_mbps":%s,"write_to_host_disk_ratio":%s}\n' \
	"$(ratio "$e" "$hp")" "$(ratio "$r" "$hp")" "$(ratio "$w" "$hp")" "$e" "$r" "$w" "$hp" "$hn" \
	"$(ratio "$e" "$hn")" "$(ratio "$r" "$hn")" "$(ratio "$w" "$hn")" "$dk" "$(ratio "$w" "$dk")" "$hd" "$(ratio "$w" "$hd")"
