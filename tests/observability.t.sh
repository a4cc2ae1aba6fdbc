#!/bin/sh
# run-tests: alone (measures a CPU share and a route rate)
# What an operator sees of a worker (issue 16 items 2 and 3): GET /metrics on the worker's metrics
# listener passes `promtool check metrics` and counts outcomes by reason, control operations with
# their time to acknowledgement, and each sandbox's usage; every DENY is in STATE/audit.log with
# the caller, the reason, the request id the client sent (or one made for it) and the identity the
# capability named; every lifecycle change is there too; with --log-format json every log line of
# the worker is one JSON object, the request id among its fields.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
SC=$SPACED_BUILD/spacectl/spacectl
[ "$(id -u)" -eq 0 ] || { echo "the process substrate needs root"; exit 77; }
command -v promtool >/dev/null 2>&1 || { echo "promtool is not installed (Debian's prometheus package)"; exit 77; }
for b in "$SC" "$SPACED_BUILD/spaced-node/spaced-node" "$CP"; do
	[ -x "$b" ] || { echo "$b is not built"; exit 77; }
done
W=$(mktemp -d)
D=$W/cluster
export SPACED_ROUTE_CACHE="$W/routes"
trap '"$SC" dev down --dir "$D" >/dev/null 2>&1; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
if ! "$SC" dev up --workers 2 --dir "$D" --log-format json >"$W/up.out" 2>"$W/up.err"; then
	cat "$W/up.err"; tail -n 20 "$D"/*.log 2>/dev/null
	echo "FAIL: dev up"; exit 1
fi
. "$D/env"
X=$("$SC" create --worker worker-1)
printf 'hello\n' | "$SC" fs write "$X" /workspace/a.txt
"$SC" exec "$X" -- sh -c 'echo ran' >/dev/null
"$SC" route "$X" --purpose fs.read --json >"$W/route.json"
URL=$(jq -r .worker_url "$W/route.json")
CAP=$(jq -r .capability "$W/route.json")
# a forged capability (the real one with its signature changed) from a client with its own request id
FORGED=$(printf '%s' "$CAP" | python3 -c '
import base64, sys
parts = sys.stdin.read().strip().split(".")
body = bytearray(base64.urlsafe_b64decode(parts[2] + "=" * (-len(parts[2]) % 4)))
body[-1] ^= 1  # the last byte of the signature
parts[2] = base64.urlsafe_b64encode(bytes(body)).decode().rstrip("=")
print(".".join(parts))')
st=$(curl -s --cacert "$SPACED_CA_FILE" -o "$W/deny.body" -w '%{http_code}' -H "X-Request-Id: audit-check-1" -H "Authorization: Bearer $FORGED" \
	"$URL/v1/sandboxes/$X/stat?path=/")
expect "a forged capability is denied" "$st" 401
# another tenant's sandbox named with this capability: DENY other-sandbox, its identity verified
Y=$("$SC" create --worker worker-1)
st=$(curl -s --cacert "$SPACED_CA_FILE" -o /dev/null -w '%{http_code}' -H "X-Request-Id: audit-check-2" -H "Authorization: Bearer $CAP" \
	"$URL/v1/sandboxes/$Y/stat?path=/")
expect "a capability for another sandbox is denied" "$st" 403
# ten requests one after the other: the gate keeps its connection to the execution for the next
for i in 1 2 3 4 5 6 7 8 9 10; do
	curl -s --cacert "$SPACED_CA_FILE" -o /dev/null -H "Authorization: Bearer $CAP" "$URL/v1/sandboxes/$X/stat?path=/"
done
"$SC" move "$X" --to worker-2 >/dev/null

# ---- /metrics ----
MP=$(cat "$D/worker-1/metrics.port")
# the metrics listener speaks TLS with node-api's certificate
curl -s --cacert "$SPACED_CA_FILE" "https://127.0.0.1:$MP/metrics" >"$W/metrics"
promtool check metrics <"$W/metrics" >"$W/promtool.out" 2>&1
expect "promtool check metrics accepts the worker's metrics" "$?" 0
[ -s "$W/promtool.out" ] && cat "$W/promtool.out"
val() { awk -v k="$1" '$1 == k {print $2}' "$W/metrics"; }
expect "DENY bad-signature counted" "$(val 'spaced_node_requests_total{outcome="DENY",reason="bad-signature"}')" 1
expect "DENY other-sandbox counted" "$(val 'spaced_node_requests_total{outcome="DENY",reason="other-sandbox"}')" 1
expect "ALLOW counted" "$([ "$(val 'spaced_node_requests_total{outcome="ALLOW",reason="ok"}')" -ge 2 ] && echo yes)" yes
expect "streams on a kept connection counted (ten requests in a row: nine at least)" \
	"$([ "$(val 'spaced_node_bridge_connections_total{connection="kept"}')" -ge 9 ] && echo yes)" yes
expect "streams on a new connection counted" \
	"$([ "$(val 'spaced_node_bridge_connections_total{connection="new"}')" -ge 1 ] && echo yes)" yes
expect "installs timed (histogram count)" "$([ "$(val 'spaced_node_control_seconds_count{kind="install"}')" -ge 2 ] && echo yes)" yes
expect "the move's deactivation timed" "$(val 'spaced_node_control_seconds_count{kind="deactivate"}')" 1
expect "the live sandbox's memory is reported" \
	"$([ "$(val "spaced_sandbox_memory_bytes{sandbox=\"$Y\"}")" -gt 0 ] 2>/dev/null && echo yes)" yes
expect "the moved sandbox is no longer measured here" "$(grep -c "sandbox=\"$X\"" "$W/metrics")" 0
expect "only GET /metrics is served there" "$(curl -s --cacert "$SPACED_CA_FILE" -o /dev/null -w '%{http_code}' "https://127.0.0.1:$MP/v1/sandboxes")" 404

# ---- the audit log ----
A=$D/worker-1/audit.log
expect "the audit log is not readable by others" "$(stat -c %a "$A")" 600
jq -e -s 'length > 0' "$A" >/dev/null && ok "every audit line is JSON" || fail "audit.log is not JSON lines"
d1=$(jq -c 'select(.event == "deny" and .request_id == "audit-check-1")' "$A")
expect "the forged capability's DENY: reason and caller" "$(echo "$d1" | jq -r '.reason + " " + .caller + " " + .purpose')" \
	"bad-signature 127.0.0.1 fs.read"
d2=$(jq -c 'select(.event == "deny" and .request_id == "audit-check-2")' "$A")
expect "the other-sandbox DENY names the identity the capability carried" \
	"$(echo "$d2" | jq -r '.reason + " " + (.identity | split(";")[0])')" "other-sandbox sandbox=$X"
expect "the lifecycle is audited: install and deactivate of the moved sandbox" \
	"$(jq -r "select(.event != \"deny\" and .identity != null and (.identity | startswith(\"sandbox=$X;\"))) | .event" "$A" | sort -u | tr '\n' ' ')" \
	"deactivate install snapshot "

# ---- JSON logs ----
bad=$(grep -v '^{' "$D/worker-1.log" | grep -cv '^\s*$')
expect "every line of the worker's log is a JSON object" "$bad" 0
jq -e -s 'all(.[]; .time and .component)' "$D/worker-1.log" >/dev/null && ok "each carries time and component" ||
	fail "log lines without time or component"
expect "the refusal is logged with the client's request id" \
	"$(jq -r 'select(.event == "refused" and .request_id == "audit-check-1") | .reason' "$D/worker-1.log")" "bad-signature"
# ---- the control plane: /metrics, audit log, JSON logs ----
st=$(curl -s --cacert "$SPACED_CA_FILE" -o /dev/null -w '%{http_code}' -H "X-Request-Id: cp-audit-1" -H "Authorization: Bearer spk_0000000000000000_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA" "$SPACED_CP_URL/v1/sandboxes")
expect "a wrong API key -> 401" "$st" 401
"$CP" admin --state "$D/cp" create-tenant audited >/dev/null 2>&1
CMP=$(cat "$D/cp/metrics.port")
curl -s --cacert "$SPACED_CA_FILE" "https://127.0.0.1:$CMP/metrics" >"$W/cp-metrics"
promtool check metrics <"$W/cp-metrics" >"$W/cp-promtool.out" 2>&1
expect "promtool check metrics accepts the control plane's metrics" "$?" 0
[ -s "$W/cp-promtool.out" ] && cat "$W/cp-promtool.out"
cval() { awk -v k="$1" '$1 == k {print $2}' "$W/cp-metrics"; }
expect "creates counted" "$(cval 'spaced_cp_requests_total{endpoint="create",status="2xx"}')" 2
expect "the move timed" "$(cval 'spaced_cp_request_seconds_count{endpoint="move"}')" 1
expect "the wrong key counted" "$(cval 'spaced_cp_unauthorized_total')" 1
expect "both workers connected" "$(cval 'spaced_cp_worker_connected{worker="worker-1"}') $(cval 'spaced_cp_worker_connected{worker="worker-2"}')" "1 1"
expect "two sandboxes running" "$(cval 'spaced_cp_sandboxes{state="running"}')" 2
CA=$D/cp/audit.log
expect "the control plane's audit log is private" "$(stat -c %a "$CA")" 600
expect "each create is audited with its tenant and sandbox" \
	"$(jq -r 'select(.event == "create") | .sandbox' "$CA" | sort | tr '\n' ' ')" "$(printf '%s\n' "$X" "$Y" | sort | tr '\n' ' ')"
expect "the move is audited with the new worker" "$(jq -r "select(.event == \"move\" and .sandbox == \"$X\") | .worker" "$CA")" worker-2
expect "the refused key is audited with its caller and request id" \
	"$(jq -r 'select(.event == "unauthorized" and .request_id == "cp-audit-1") | .caller' "$CA")" 127.0.0.1
expect "an admin command is audited (never its secret)" \
	"$(jq -r 'select(.event == "admin" and .command == "create-tenant" and .subject == "audited") | .ok' "$CA")" true
expect "no key is ever in the audit logs" "$(cat "$CA" "$D"/worker-*/audit.log | grep -c 'spk_')" 0
# routes change nothing but name who got a capability: audited at a rate per tenant, the rest
# summarized (before: a client looping on routes wrote every one, 0.9 MB a second)
r0=$(jq -r 'select(.event == "route") | .event' "$CA" | wc -l)
python3 - "$SPACED_CP_URL" "$SPACED_API_KEY" "$SPACED_CA_FILE" "$Y" <<'PY'
import http.client, ssl, sys, time
url, key, ca, sb = sys.argv[1:5]
host, port = url.split('//')[1].rsplit(':', 1)
c = http.client.HTTPSConnection(host, int(port), context=ssl.create_default_context(cafile=ca), timeout=10)
h = {'Authorization': 'Bearer ' + key, 'Content-Type': 'application/json'}
end = time.time() + 20
for i in range(600):
    if time.time() > end:
        break
    c.request('POST', '/v1/sandboxes/%s/route' % sb, body='{}', headers=h)
    r = c.getresponse(); r.read()
    assert r.status == 200, r.status
PY
r1=$(jq -r 'select(.event == "route") | .event' "$CA" | wc -l)
i=0; until grep -q '"event":"route-summary"' "$CA" || [ $i -ge 100 ]; do i=$((i + 1)); sleep 0.1; done
echo "route lines: $r0 before 600 routes, $r1 after"
expect "600 routes in a burst: at most the burst's 200 lines and a few more" "$([ $((r1 - r0)) -le 260 ] && [ $((r1 - r0)) -ge 20 ] && echo yes)" yes
expect "the rest in one route-summary line of the tenant" \
	"$(jq -r 'select(.event == "route-summary") | (.caller | startswith("tenant/")) and (.held_back.route > 0)' "$CA" | sort -u)" true
expect "answers carry their request id" \
	"$(curl -s --cacert "$SPACED_CA_FILE" -D - -o /dev/null -H "X-Request-Id: cp-rid-7" -H "Authorization: Bearer $SPACED_API_KEY" "$SPACED_CP_URL/v1/sandboxes" | tr -d '\r' | awk -F': ' 'tolower($1) == "x-request-id" {print $2}')" cp-rid-7
# the CPU share `top` shows is the recent one: the launcher samples it when asked (and at least
# every 30 s), not with a tick a second per execution
Z=$("$SC" create --worker worker-1)
"$SC" exec "$Z" -- sh -c 'nohup sh -c "while :; do :; done" >/dev/null 2>&1 &' >/dev/null
"$SC" top "$Z" --json >/dev/null
sleep 1.5
busy=$("$SC" top "$Z" --json | jq -r '.cpu_pct')
"$SC" exec "$Z" -- sh -c 'pkill -f "while :" || kill $(pgrep -f "while :")' >/dev/null 2>&1
"$SC" top "$Z" --json >/dev/null
sleep 1.5
idle=$("$SC" top "$Z" --json | jq -r '.cpu_pct')
echo "top: $busy % while a loop ran, $idle % after it ended"
expect "top: a busy loop shows as most of its one CPU (never more)" "$(echo "$busy" | awk '$1 > 50 && $1 <= 110 {print "yes"}')" yes
expect "top: once it ended, the share over the last interval is near 0" "$(echo "$idle" | awk '$1 < 20 {print "yes"}')" yes
# a sandbox its CPU quota keeps throttling is held to its limit's CPUs, and `top` shows which
# (docs/substrate.md "CPU: how many at once"): four busy processes under --cpus 0.5
if [ "$(nproc)" -ge 2 ] && [ -e /sys/fs/cgroup/cpuset/cpuset.cpus ]; then
	H=$("$SC" create --worker worker-1 --cpus 0.5)
	"$SC" exec "$H" -- sh -c 'for i in 1 2 3 4; do nohup timeout 30 sh -c "while :; do :; done" >/dev/null 2>&1 & done' \
		>/dev/null
	held=null
	i=0
	while [ "$held" = null ] && [ $i -lt 60 ]; do
		sleep 0.25
		i=$((i + 1))
		held=$("$SC" top "$H" --json | jq -r '.cpus_held')
	done
	echo "top: the busy sandbox held to CPUs $held after about $((i / 4)) s"
	expect "top: a sandbox its quota throttles is held to one CPU" "$(echo "$held" | grep -cE '^[0-9]+$')" 1
	expect "top's line says so" "$("$SC" top "$H" | grep -c "held to CPUs $held\$")" 1
	expect "top: an idle sandbox is held to none" "$("$SC" top "$Z" --json | jq -r '.cpus_held')" null
	"$SC" rm "$H" >/dev/null
fi
bad=$(grep -v '^{' "$D/cp.log" | grep -cv '^\s*$')
expect "every line of the control plane's log is a JSON object" "$bad" 0
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
