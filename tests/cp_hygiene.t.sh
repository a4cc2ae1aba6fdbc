#!/bin/sh
# run-tests: light, about 23 s
# run-tests: sanitized (malformed HTTP against the control plane)
# HTTP hygiene of the control plane (issue 12, items 3 and 5): every attack
# that libwebsockets let through is sent on raw sockets (tests/cp_hygiene.py)
# to a real spaced-cp and answered with its exact status, the connection
# closed, and the daemon keeps serving:
#  - Content-Length conflicting, repeated or malformed, with Transfer-Encoding
#    (request smuggling) -> 400 and nothing after it is read as a request;
#  - chunked bodies decoded for the handler (a chunked create takes effect),
#    bad chunk sizes and framing -> 400, over 64 KiB -> 413, other codings -> 501;
#  - NUL, control bytes, bare LF / CR, obs-fold -> 400; oversized header
#    blocks -> 431; a long target -> 414; HTTP/2 preface -> 400; h2c not taken;
#  - a head or body that does not arrive in time -> 408;
#  - WebSocket: only the channel path with the worker's own worker key
#    upgrades; unmasked client frames -> close 1002 (and the other frame
#    errors: 1002, 1007, 1009);
#  - a 300-connection slowloris from 127.0.0.1 while a victim on 127.0.0.2
#    keeps being answered (per-address budget), and the total budget on a
#    second control plane (--max-conns 40 --max-conns-per-ip 10).
# No timed assertion: deadlines only decide which status comes.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
command -v python3 >/dev/null 2>&1 || { echo "python3 is not installed"; exit 77; }
python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.2", 0))' 2>/dev/null ||
	{ echo "127.0.0.2 is not a local address here"; exit 77; }
W=$(mktemp -d)
trap 'cleanup; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
PY=$SPACED_TOP/tests/cp_hygiene.py

mkdir -p "$W/cp"
TA=$(admin create-tenant alpha)
[ -n "$TA" ] || { echo "admin commands failed"; exit 1; }
start_cp cp --head-timeout 4000
register wa
register wz
start_worker wa
PORT=${CP_URL##*:}

# ---- framing, fields, deadlines, WebSocket frames ----
timeout 600 python3 "$PY" "$PORT" "$TA" "$WK_wz" wz "$WK_wa"
rc=$?
FAILS=$((FAILS + rc))
[ $rc -lt 100 ] || fail "cp_hygiene.py did not finish (exit $rc)"
kill -0 "$CP_PID" 2>/dev/null && ok "spaced-cp is alive after the attacks" || fail "spaced-cp died"

# ---- slowloris from 127.0.0.1, a victim on 127.0.0.2 ----
expect "a sandbox for the victim's routes" "$(api "$TA" POST /v1/sandboxes '{"worker":"wa"}')" 201
VS=$(body .id)
timeout 600 python3 "$PY" slowloris "$PORT" "$TA" "$VS"
rc=$?
FAILS=$((FAILS + rc))
kill -0 "$CP_PID" 2>/dev/null && ok "spaced-cp is alive after the slowloris" || fail "spaced-cp died in the slowloris"
expect "healthz after everything" "$(curl -s -o /dev/null -w '%{http_code}' "$CP_URL/v1/healthz")" 200
expect "the worker channel survived it all" "$(api "$TA" GET /v1/workers; body '[.workers[] | select(.id == "wa") | .state + " " + (.connected|tostring)] | join(",")')" "200live true"
expect "lifecycle still works" "$(api "$TA" POST "/v1/sandboxes/$VS/pause"; body .state)" "200paused"

# ---- total and per-address budgets on a second control plane ----
CP1_URL=$CP_URL
start_cp cp2 --max-conns 40 --max-conns-per-ip 10
timeout 300 python3 "$PY" budgets "${CP_URL##*:}"
rc=$?
FAILS=$((FAILS + rc))
kill -0 "$CP_PID" 2>/dev/null && ok "the second spaced-cp is alive after the budget test" || fail "the second spaced-cp died"
grep -q "AddressSanitizer\|runtime error" "$W"/cp.log "$W"/cp2.log && fail "sanitizer report in a spaced-cp log" || ok "no sanitizer report"
: "$CP1_URL"
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
