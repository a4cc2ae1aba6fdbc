#!/bin/sh
# run-tests: paired, about 3 s
# `make demo` as a test: scripts/demo.sh runs the whole tour on a dev cluster
# and its key lines are checked: every step ran, answers came from the right
# execution, the stale route was refused with REFRESH_ROUTE and repaired by one
# retry (V2), the old execution refused the unexpired old capability (R3), the
# watch reopened at the new worker (S1, V5), a forged capability was denied and
# not retried (C5) and the cluster was torn down.
set -u
: "${SPACED_BUILD:?}" "${SPACED_TOP:?}"
for tool in jq; do
	command -v $tool >/dev/null 2>&1 || { echo "$tool is not installed (scripts/setup.sh installs it)"; exit 77; }
done
[ -x "$SPACED_BUILD/spaced-node/spaced-node" ] || { echo "spaced-node is not built"; exit 77; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
sh "$SPACED_TOP/scripts/demo.sh" "$SPACED_BUILD" >"$out" 2>&1
rc=$?
cat "$out"
fails=0
check() { # WHAT PATTERN [COUNT]
	n=$(grep -c -- "$2" "$out")
	if [ "$n" -ge "${3:-1}" ]; then echo "ok: $1"; else echo "FAIL: $1 (pattern '$2' seen $n times)"; fails=$((fails + 1)); fi
}
[ $rc -eq 0 ] && echo "ok: demo.sh exits 0" || { echo "FAIL: demo.sh exit $rc"; fails=$((fails + 1)); }
for i in 1 2 3 4 5 6 7 8 9 10 11 12 13; do check "step $i printed" "^== $i\. "; done
check "the file read back" "^hello from the tour$"
check "exec output and status" "(exit status 3)"
check "answers from generation 1 on worker-1" "^spacectl: 200 from .*generation=1;worker=worker-1;"
check "answers from generation 2 on worker-2 after the move" "^spacectl: 200 from .*generation=2;worker=worker-2;" 2
check "the stale route refused by worker-1 (V2)" "^spacectl: REFRESH_ROUTE deactivated from .*generation=1;worker=worker-1;" 2
check "the cache entry repaired in place after the retry (V3, V4)" "^spacectl: cache entry replaced, its expiry kept$"
check "the saved route repaired, the newer cache entry left alone (V3)" "^spacectl: cache entry left alone: it holds another route$"
check "the old execution refuses the old capability (R3)" "^outcome: REFRESH_ROUTE (deactivated)$"
check "the watch saw a file before the move" "notes.txt"
check "the watch reopened at worker-2 (V5)" "watching /workspace (identity sandbox=.*generation=2;worker=worker-2"
check "the watch saw a file after the move" "more.txt"
check "a forged capability denied, not retried (C5)" "DENY (bad-signature): not retried"
check "torn down" "^stopped 4 processes"
check "the end" "^done\.$"
echo "$fails failures"
[ $fails -eq 0 ]
