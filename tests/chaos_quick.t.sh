#!/bin/sh
# run-tests: paired, about 42 s
# run-tests: sanitized (moves racing requests: a use after free would show here)
# The route-chaos soak, short (`make chaos-quick`'s program, run inside make
# check): a 3-worker dev cluster with the process substrate, 20 sandboxes
# paused, resumed and moved while client threads write, read and exec through
# cached routes and watches stay open (docs/client.md "Route chaos").
# Fails when any answer came from another execution than the one selected or
# with another sandbox's content (I2, R2, R3: misdelivered), when an admitted
# stream ended other than by a refresh-route close (S1, S2), when the run did
# not reach its operations, or when no move, refresh and stream cut happened
# (the chaos did not run). The error rate is printed, not asserted: it depends
# on how loaded the machine is.
# Exit 77 when the process substrate cannot run here (not root).
set -u
: "${SPACED_BUILD:?}"
CHAOS=$SPACED_BUILD/bench/bench-chaos
[ -x "$CHAOS" ] || { echo "$CHAOS is not built"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "the process substrate needs root"; exit 77; }
command -v jq >/dev/null 2>&1 || { echo "jq is not installed (scripts/setup.sh installs it)"; exit 77; }
ops=${CHAOS_QUICK_OPS:-3000}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
CHAOS_MAX_SECONDS=${CHAOS_MAX_SECONDS:-300} "$CHAOS" "$ops" >"$out"
rc=$?
cat "$out"
last=$(tail -n 1 "$out")
FAILS=0
check() { # WHAT JQ-EXPRESSION
	if echo "$last" | jq -e "$2" >/dev/null 2>&1; then echo "ok: $1"; else echo "FAIL: $1 ($last)"; FAILS=$((FAILS + 1)); fi
}
check "bench-chaos ended with its JSON line (exit $rc)" '.ops != null'
check "no answer from another execution or with other content (misdelivered = 0)" '.misdelivered == 0'
check "no admitted stream dropped other than by refresh-route (streams_dropped_wrongly = 0)" '.streams_dropped_wrongly == 0'
check "all $ops operations ran" ".ops >= $ops"
check "sandboxes were moved and paused meanwhile" '.moves >= 1 and .pauses >= 1'
check "stale routes were refreshed and streams cut on replacement" '.refreshes >= 1 and .streams_cut_on_replacement >= 1'
echo "error rate $(echo "$last" | jq -r .error_rate) ($(echo "$last" | jq -r .failed_after_retry) of $(echo "$last" | jq -r .ops) failed after the one retry)"
echo "$FAILS failures"
[ "$FAILS" -eq 0 ] && [ "$rc" -eq 0 ]
