#!/bin/sh
# Runs every test suite and closes with one line the CI counts: "N passed, N failed".
#   run-tests.sh SANBUILD [FUZZBUILD [SUITES SCRIPTS]]
# SUITES / SCRIPTS: shell patterns choosing the Criterion suites (test-*) and
# the integration scripts (tests/*.t.sh) to run, by default all of them
# (make check-vm: 'test-vmm' 'vm_*').
# - Criterion suites: SANBUILD/tests/test-* (each test forked; crashes count as failures);
# - integration scripts: tests/*.t.sh, each one test, run with SPACED_BUILD=SCRIPT_BUILD (default
#   SANBUILD; make check: the optimized build), except those whose header says
#   "# run-tests: sanitized", which run on SANBUILD always;
# - fuzz smoke: each target in FUZZBUILD/fuzz for FUZZ_SMOKE_SECONDS (default 2), one test each;
# the Criterion suites one after the other beside the fuzz smoke runs and the scripts marked light,
# LIGHT_JOBS (3) at a time; then the scripts marked paired, PAIRED_JOBS (2) at a time; then the
# others one at a time (see below).
set -u
build=$1
fuzzbuild=${2:-}
suites=${3:-*}
scripts=${4:-*}
script_build=${SCRIPT_BUILD:-$build}
top=$(cd "$(dirname "$0")/.." && pwd)
passed=0
failed=0
log_dir="$build/test-logs"
mkdir -p "$log_dir"
rm -f "$log_dir"/*.result

# The Criterion suites, one after the other, beside the light jobs (below): each suite's line is
# printed as it ends, the counts go to unit.counts ("PASSED FAILED") for the total
run_units() {
	upassed=0
	ufailed=0
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
			{ echo "FAIL $name: no Criterion summary (exit $rc)"; tail -n 20 "$log"; } >"$log.report"
			cat "$log.report" # (one write: not mixed with the light jobs' lines)
			ufailed=$((ufailed + 1)); continue
		fi
		bad=$((tested - pass))
		upassed=$((upassed + pass)); ufailed=$((ufailed + bad))
		if [ "$bad" -ne 0 ] || [ "$rc" -ne 0 ]; then
			[ "$bad" -eq 0 ] && ufailed=$((ufailed + 1))
			{ echo "FAIL $name: $line (exit $rc)"; grep -E '^\[----\]|\[FAIL\]|CRASH|ERROR' "$log" | head -n 40; } >"$log.report"
			cat "$log.report"
		else
			echo "ok   $name: $pass tests ($(($(date +%s) - t0)) s)"
		fi
	done
	echo "$upassed $ufailed" >"$log_dir/unit.counts"
}

# run_job NAME: runs one integration script (tests/NAME.t.sh) or, for fuzz-*, one fuzz target's
# smoke run; its exit code and seconds go to NAME.result, its output to NAME.log
run_job() {
	t0=$(date +%s)
	case "$1" in
	fuzz-*) sh "$top/scripts/fuzz.sh" "$fuzzbuild" "${FUZZ_SMOKE_SECONDS:-2}" "$1" >"$log_dir/$1.log" 2>&1 ;;
	*)
		b=$script_build
		grep -q '^# run-tests: sanitized' "$top/tests/$1.t.sh" && b=$build
		SPACED_BUILD="$(cd "$b" && pwd)" SPACED_TOP="$top" sh "$top/tests/$1.t.sh" >"$log_dir/$1.log" 2>&1 ;;
	esac
	echo "$? $(($(date +%s) - t0))" >"$log_dir/$1.result"
}
# report NAME: counts and prints what run_job wrote
report() {
	read -r rc secs <"$log_dir/$1.result" 2>/dev/null || { rc=1; secs=0; }
	kind=""
	case "$1" in fuzz-*) kind="fuzz smoke, " ;; esac
	if [ "$rc" -eq 0 ]; then
		passed=$((passed + 1)); echo "ok   $1 ($kind$secs s)"
	elif [ "$rc" -eq 77 ]; then
		echo "skip $1: $(tail -n 1 "$log_dir/$1.log")"
	else
		failed=$((failed + 1)); echo "FAIL $1 (${kind}exit $rc, $secs s)"; tail -n 30 "$log_dir/$1.log"
	fi
}

# Three kinds of job, each kind run after the one before, the longest first:
# - light, LIGHT_JOBS (3) at a time: the fuzz smoke runs and each script whose header says
#   "# run-tests: light, about N s" — it starts no worker, cgroup, namespace or dev cluster (the
#   control plane on fake workers, client tools) and holds no timing that another such job beside
#   it could upset;
# - paired, PAIRED_JOBS (2) at a time: each script whose header says "# run-tests: paired, about
#   N s" — it starts workers, but looks only at what is its own (its cluster's directory, its
#   supervisor's processes, its sandboxes), changes nothing host-wide that another script reads,
#   and measures no rate, share or latency that another script's load would upset;
# - alone, one at a time, nothing beside them: each script whose header says "# run-tests: alone
#   (why)", and any script that says neither light nor paired — they read or change host-wide
#   state (all processes, mounts, cgroups, sysctls, the kernel's memory) or hold a tight window.
light=""
paired=""
alone=""
for s in "$top"/tests/*.t.sh; do
	[ -f "$s" ] || continue
	name=$(basename "$s" .t.sh)
	case "$name" in $scripts) ;; *) continue ;; esac
	about=$(sed -n 's/^# run-tests: light, about \([0-9]*\) s$/\1/p' "$s")
	pair=$(sed -n 's/^# run-tests: paired, about \([0-9]*\) s$/\1/p' "$s")
	if [ -n "$about" ]; then light="$light$about $name
"; elif [ -n "$pair" ]; then paired="$paired$pair $name
"; else alone="$alone $name"; fi
done
if [ -n "$fuzzbuild" ]; then
	for t in "$fuzzbuild"/fuzz/fuzz-*; do
		[ -f "$t" ] && [ -x "$t" ] || continue
		case "$t" in *.log|*-crash-*|*-leak-*|*-timeout-*|*-oom-*|*.result) continue ;; esac
		light="$light${FUZZ_SMOKE_SECONDS:-2} $(basename "$t")
"
	done
fi
running="" # "pid:name" of each job running
reap() { # reports the jobs that ended; keeps the others in $running
	still=""
	for j in $running; do
		if kill -0 "${j%%:*}" 2>/dev/null; then still="$still $j"; else wait "${j%%:*}"; report "${j#*:}"; fi
	done
	running=$still
}
# run_at_once N LIST: runs the jobs of LIST ("SECONDS NAME" lines), the longest first, N at a time,
# and returns when they all ended
run_at_once() {
	for name in $(printf '%s' "$2" | sort -k1,1rn -k2,2 | awk '{print $2}'); do
		while [ "$(echo $running | wc -w)" -ge "$1" ]; do
			sleep 0.2
			reap
		done
		run_job "$name" &
		running="$running $!:$name"
	done
	while [ -n "$running" ]; do
		sleep 0.2
		reap
	done
}
rm -f "$log_dir/unit.counts"
run_units &
units=$!
# interrupted: the jobs in the background end too
trap 'kill $units ${running:+$(echo "$running" | sed "s/:[^ ]*//g")} 2>/dev/null; exit 130' INT TERM
run_at_once "${LIGHT_JOBS:-3}" "$light"
wait "$units"
if read -r up uf <"$log_dir/unit.counts"; then
	passed=$((passed + up)); failed=$((failed + uf))
else
	failed=$((failed + 1)); echo "FAIL the Criterion suites: no counts (their runner ended early)"
fi
run_at_once "${PAIRED_JOBS:-2}" "$paired"
for name in $alone; do
	run_job "$name"
	report "$name"
done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
