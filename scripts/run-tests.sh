#!/bin/sh
# Runs every test suite and closes with one line the CI counts: "N passed, N failed".
#   run-tests.sh SANBUILD [FUZZBUILD [SUITES SCRIPTS]]
# SUITES / SCRIPTS: shell patterns choosing the Criterion suites (test-*) and
# the integration scripts (tests/*.t.sh) to run, by default all of them
# (make check-vm: 'test-vmm' 'vm_*').
# - Criterion suites: SANBUILD/tests/test-* (each test forked; crashes count as failures);
# - integration scripts: tests/*.t.sh, each one test, run with SPACED_BUILD=SANBUILD (those marked
#   light two at a time, first; the others one at a time);
# - fuzz smoke: each target in FUZZBUILD/fuzz for FUZZ_SMOKE_SECONDS (default 2), one test each.
set -u
build=$1
fuzzbuild=${2:-}
suites=${3:-*}
scripts=${4:-*}
top=$(cd "$(dirname "$0")/.." && pwd)
passed=0
failed=0
log_dir="$build/test-logs"
mkdir -p "$log_dir"

for t in "$build"/tests/test-*; do
	[ -x "$t" ] || continue
	case "$(basename "$t")" in $suites) ;; *) continue ;; esac
	case "$t" in *.p|*.sh) continue ;; esac
	name=$(basename "$t")
	log="$log_dir/$name.log"
	t0=$(date +%s)
	LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$top/tests/lsan.supp" "$t" --jobs 2 >"$log" 2>&1
	rc=$?
	line=$(grep 'Synthesis:' "$log" | tail -n 1)
	tested=$(echo "$line" | sed -n 's/.*Tested: \([0-9]*\).*/\1/p')
	pass=$(echo "$line" | sed -n 's/.*Passing: \([0-9]*\).*/\1/p')
	if [ -z "$tested" ]; then
		echo "FAIL $name: no Criterion summary (exit $rc)"; tail -n 20 "$log"
		failed=$((failed + 1)); continue
	fi
	bad=$((tested - pass))
	passed=$((passed + pass)); failed=$((failed + bad))
	if [ "$bad" -ne 0 ] || [ "$rc" -ne 0 ]; then
		[ "$bad" -eq 0 ] && failed=$((failed + 1))
		echo "FAIL $name: $line (exit $rc)"
		grep -E '^\[----\]|\[FAIL\]|CRASH|ERROR' "$log" | head -n 40
	else
		echo "ok   $name: $pass tests ($(($(date +%s) - t0)) s)"
	fi
done

# run_script NAME PATH: runs one integration script; its exit code and seconds go to NAME.result
run_script() {
	t0=$(date +%s)
	SPACED_BUILD="$(cd "$build" && pwd)" SPACED_TOP="$top" sh "$2" >"$log_dir/$1.log" 2>&1
	echo "$? $(($(date +%s) - t0))" >"$log_dir/$1.result"
}
# report NAME: counts and prints what run_script wrote
report() {
	read -r rc secs <"$log_dir/$1.result"
	if [ "$rc" -eq 0 ]; then
		passed=$((passed + 1)); echo "ok   $1 ($secs s)"
	elif [ "$rc" -eq 77 ]; then
		echo "skip $1: $(tail -n 1 "$log_dir/$1.log")"
	else
		failed=$((failed + 1)); echo "FAIL $1 (exit $rc, $secs s)"; tail -n 30 "$log_dir/$1.log"
	fi
}

# Light scripts run two at a time, the longest first: a script whose header
# says "# run-tests: light, about N s" starts no worker, cgroup, namespace or
# dev cluster (the control plane on fake workers, client tools) and holds no
# timing that another such script beside it could upset. The others run
# one at a time after them.
light=""
heavy=""
for s in "$top"/tests/*.t.sh; do
	[ -f "$s" ] || continue
	name=$(basename "$s" .t.sh)
	case "$name" in $scripts) ;; *) continue ;; esac
	about=$(sed -n 's/^# run-tests: light, about \([0-9]*\) s$/\1/p' "$s")
	if [ -n "$about" ]; then light="$light$about $name
"; else heavy="$heavy $name"; fi
done
slot1=""; slot2=""; name1=""; name2=""
for name in $(printf '%s' "$light" | sort -rn | awk '{print $2}'); do
	while [ -n "$slot1" ] && [ -n "$slot2" ]; do
		if ! kill -0 "$slot1" 2>/dev/null; then wait "$slot1"; report "$name1"; slot1=""
		elif ! kill -0 "$slot2" 2>/dev/null; then wait "$slot2"; report "$name2"; slot2=""
		else sleep 0.2; fi
	done
	if [ -z "$slot1" ]; then run_script "$name" "$top/tests/$name.t.sh" & slot1=$!; name1=$name
	else run_script "$name" "$top/tests/$name.t.sh" & slot2=$!; name2=$name; fi
done
[ -n "$slot1" ] && { wait "$slot1"; report "$name1"; }
[ -n "$slot2" ] && { wait "$slot2"; report "$name2"; }
for name in $heavy; do
	run_script "$name" "$top/tests/$name.t.sh"
	report "$name"
done

if [ -n "$fuzzbuild" ]; then
	for t in "$fuzzbuild"/fuzz/fuzz-*; do
		[ -f "$t" ] && [ -x "$t" ] || continue
		case "$t" in *.log|*-crash-*|*-leak-*|*-timeout-*|*-oom-*) continue ;; esac
		if sh "$top/scripts/fuzz.sh" "$fuzzbuild" "${FUZZ_SMOKE_SECONDS:-2}" "$(basename "$t")" >"$log_dir/$(basename "$t").log" 2>&1; then
			passed=$((passed + 1)); echo "ok   $(basename "$t") (fuzz smoke)"
		else
			failed=$((failed + 1)); echo "FAIL $(basename "$t") (fuzz smoke)"; tail -n 20 "$log_dir/$(basename "$t").log"
		fi
	done
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
