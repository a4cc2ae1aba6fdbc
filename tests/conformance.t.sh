#!/bin/sh
# run-tests: paired, about 19 s
# The client conformance suite (issue 16): the same scenarios against spacectl,
# the Python SDK and the TypeScript SDK on one real `spacectl dev up --workers 2`
# cluster — files round trip with arbitrary bytes; exec stdout/stderr/exit code
# and stdin; a stale route after a move repaired by exactly one retry (V2) with
# the cache entry compare-and-swapped (V3) and its expiry kept (V4), also under
# four concurrent clients; one retry only, against a control plane that keeps
# answering the stale route; DENY never retried (V1, C5); answers that do not
# name the route's execution refused (I2, I3); transport rules (a write and a
# command sent once, a read twice); a watch and a terminal cut by a move
# reopened through admission (S1, V5); each SDK's example agent loop.
# Checked against the workers' own counters, a dropping listener, a fake worker
# and a fake control plane, not only the clients' word. tests/conformance/README.md.
set -u
: "${SPACED_BUILD:?}" "${SPACED_TOP:?}"
for b in "$SPACED_BUILD/spacectl/spacectl" "$SPACED_BUILD/spaced-node/spaced-node" "$SPACED_BUILD/spaced-cp/spaced-cp"; do
	[ -x "$b" ] || { echo "$b is not built"; exit 77; }
done
# the scenarios work in /workspace of process-substrate executions, which need root
[ "$(id -u)" -eq 0 ] || { echo "the process substrate needs root (spacectl dev up falls back to development executions)"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "python3 is not installed (scripts/setup.sh installs it)"; exit 77; }
command -v node >/dev/null 2>&1 || { echo "node is not installed (scripts/setup.sh installs it)"; exit 77; }
dist=$SPACED_TOP/sdk/typescript/dist/index.js
ex=$SPACED_TOP/sdk/typescript/build/examples/agent_loop.js
if [ ! -f "$dist" ] || [ ! -f "$ex" ]; then
	echo "the TypeScript SDK is not built (make sdk: npm ci and tsc in sdk/typescript)"
	exit 77
fi
exec python3 "$SPACED_TOP/tests/conformance/run.py"
