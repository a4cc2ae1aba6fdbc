#!/bin/sh
# run-tests: light, about 7 s
# A flood of refused keys cannot fill the control plane's disk through its
# audit log (libspaced/ratelimit.h): every refused request is answered 401,
# but one caller address adds at most 200 lines at once and 20 a second after;
# what is held back is counted by caller and reason in a deny-summary line
# within a few seconds (every refusal is a line or counted in one, DESIGN §5)
# and in spaced_cp_audit_suppressed_total, and another caller's refusals are
# still written. No timed assertion: the bound grows with the flood's own duration.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
command -v python3 >/dev/null 2>&1 || { echo "python3 is not installed"; exit 77; }
python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.5", 0))' 2>/dev/null ||
	{ echo "127.0.0.5 is not a local address here"; exit 77; }
W=$(mktemp -d)
trap 'cleanup; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
HC="python3 $SPACED_TOP/tests/hostile_client.py"

mkdir -p "$W/cp"
TA=$(admin create-tenant alpha)
[ -n "$TA" ] || { echo "admin commands failed"; exit 1; }
start_cp cp --metrics-listen 127.0.0.1:0
PORT=${CP_URL##*:}
AUDIT=$W/cp/audit.log
lines() { grep "\"caller\":\"$1\"" "$AUDIT" | grep -c '"event":"unauthorized"'; }

$HC denyflood "$PORT" 127.0.0.5 "spk-not-a-key-of-anyone" sbx-x 3000 >"$W/flood.json"
echo "flood: $(cat "$W/flood.json")"
expect "every request with a wrong key was refused 401" "$(jq -r '.answers["401"]' "$W/flood.json")" 3000
n=$(lines 127.0.0.5)
secs=$(jq -r '.seconds | ceil' "$W/flood.json")
expect "the flood added its caller's burst and no more than its rate after ($n lines in $secs s)" \
	"$([ "$n" -ge 200 ] && [ "$n" -le $((200 + 20 * (secs + 1))) ] && echo yes)" yes
$HC denyflood "$PORT" 127.0.0.6 "spk-not-a-key-of-anyone" sbx-x 5 >/dev/null
expect "another caller's refusals are still written" "$(lines 127.0.0.6)" 5
counted() {
	[ "$(grep '"caller":"127.0.0.5"' "$AUDIT" |
		jq -s '([.[] | select(.event == "unauthorized")] | length) + ([.[] | select(.event == "deny-summary") | .total] | add // 0)')" = 3000 ]
}
wait_for "every refusal of the caller is a line of its own or counted in its deny-summary" counted
expect "the summary names the reason" \
	"$(grep '"caller":"127.0.0.5"' "$AUDIT" | jq -r 'select(.event == "deny-summary") | .held_back | keys[]' | sort -u | tr '\n' ' ')" \
	"unauthorized "
MP=$(cat "$W/cp/metrics.port" 2>/dev/null)
expect "spaced_cp_audit_suppressed_total counts them" \
	"$(curl -s "http://127.0.0.1:$MP/metrics" | awk '$1 == "spaced_cp_audit_suppressed_total" {print ($2 > 2000)}')" 1
expect "the control plane still answers a right key" \
	"$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $TA" "$CP_URL/v1/sandboxes")" 200
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
