#!/bin/sh
# run-tests: light, about 68 s
# spaced-cp on its embedded SQLite store: the whole control-plane suite
# (tenancy, generations, routes and capabilities, races, acks, replay,
# rotation, signer separation, timeouts, restart). Cites I1, I2, C1–C3, T1.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
W=$(mktemp -d)
trap 'cleanup; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
CP_DB=""
. "$SPACED_TOP/tests/cp_suite.sh"
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
