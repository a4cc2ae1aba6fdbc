#!/bin/sh
# Runs every libFuzzer target in BUILD/fuzz (or only ONLY) for SECONDS each, starting from the
# seeds in fuzz/seeds/<target>/ (if any) and a scratch corpus in BUILD/fuzz/corpus-<target>.
# Exits non-zero if any target finds a crash.
set -u
build=$1
seconds=${2:-30}
only=${3:-}
top=$(cd "$(dirname "$0")/.." && pwd)
rc=0
for t in "$build"/fuzz/fuzz-*; do
	[ -f "$t" ] && [ -x "$t" ] || continue # not the .p object directories
	name=$(basename "$t")
	case "$name" in *.log|*-crash-*|*-leak-*|*-timeout-*|*-oom-*) continue ;; esac
	[ -n "$only" ] && [ "$name" != "$only" ] && continue
	corpus="$build/fuzz/corpus-$name"
	mkdir -p "$corpus"
	seeds=""
	[ -d "$top/fuzz/seeds/$name" ] && seeds="$top/fuzz/seeds/$name"
	if "$t" -max_total_time="$seconds" -max_len=4096 -print_final_stats=0 \
		-artifact_prefix="$build/fuzz/$name-" "$corpus" $seeds >"$build/fuzz/$name.log" 2>&1; then
		echo "fuzz: $name: ${seconds}s, no crash ($(grep -c . "$build/fuzz/$name.log") log lines)"
	else
		echo "fuzz: $name: FAILED — see $build/fuzz/$name.log"
		tail -n 30 "$build/fuzz/$name.log"
		rc=1
	fi
done
exit $rc
