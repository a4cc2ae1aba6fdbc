#!/bin/sh
# A flood of refused keys cannot fill the control plane's disk through its
# audit log (libspaced/ratelimit.h): every refused request is answered 401,
# but one caller address adds at most 200 lines at once and 20 a second after;
# what is held back is counted in the caller's next line ("suppressed": every
# refusal is a line or counted in one) and in
# spaced_cp_audit_suppressed_total, and another caller's refusals are still
# written. No timed assertion: the bound grows with the flood's own duration. (DESIGN §5 asks
# for every DENY in the audit log: past the rate one is a count in its caller's next line.)
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
lines() { grep -c "\"caller\":\"$1\"" "$AUDIT"; }

$HC denyflood "$PORT" 127.0.0.5 "spk-not-a-key-of-anyone" sbx-x 3000 >"$W/flood.json"
echo "flood: $(cat "$W/flood.json")"
expect "every request with a wrong key was refused 401" "$(jq -r '.answers["401"]' "$W/flood.json")" 3000
n=$(lines 127.0.0.5)
secs=$(jq -r '.seconds | ceil' "$W/flood.json")
expect "the flood added its caller's burst and no more than its rate after ($n lines in $secs s)" \
	"$([ "$n" -ge 200 ] && [ "$n" -le $((200 + 20 * (secs + 1))) ] && echo yes)" yes
$HC denyflood "$PORT" 127.0.0.6 "spk-not-a-key-of-anyone" sbx-x 5 >/dev/null
expect "another caller's refusals are still written" "$(lines 127.0.0.6)" 5
sleep 1
$HC denyflood "$PORT" 127.0.0.5 "spk-not-a-key-of-anyone" sbx-x 1 >/dev/null
expect "every refusal of the caller is a line or counted as held back in its next one" \
	"$(grep '"caller":"127.0.0.5"' "$AUDIT" | jq -s '[.[] | .suppressed // 0] | add + length')" 3001
MP=$(cat "$W/cp/metrics.port" 2>/dev/null)
expect "spaced_cp_audit_suppressed_total counts them" \
	"$(curl -s "http://127.0.0.1:$MP/metrics" | awk '$1 == "spaced_cp_audit_suppressed_total" {print ($2 > 2000)}')" 1
expect "the control plane still answers a right key" \
	"$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $TA" "$CP_URL/v1/sandboxes")" 200
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
