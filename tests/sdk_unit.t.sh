#!/bin/sh
# run-tests: light, about 5 s
# The SDKs' own unit tests (issue 16): the route rules of the Python SDK
# (sdk/python/tests, unittest) and of the TypeScript SDK (sdk/typescript/test,
# node:test) against in-process fake control planes and workers on 127.0.0.1 —
# V1–V4, identity checks, transport rules, resolution waits, capability
# margins, unsupported features reported. The same rules against real workers
# are tests/conformance.t.sh.
set -u
: "${SPACED_TOP:?}"
command -v python3 >/dev/null 2>&1 || { echo "python3 is not installed (scripts/setup.sh installs it)"; exit 77; }
command -v node >/dev/null 2>&1 || { echo "node is not installed (scripts/setup.sh installs it)"; exit 77; }
[ -f "$SPACED_TOP/sdk/typescript/build/test/client.test.js" ] || {
	echo "the TypeScript SDK is not built (make sdk: npm ci and tsc in sdk/typescript)"; exit 77; }
rc=0
python3 -m unittest discover -s "$SPACED_TOP/sdk/python/tests" || rc=1
(cd "$SPACED_TOP/sdk/typescript" && node --test build/test/) || rc=1
exit $rc
