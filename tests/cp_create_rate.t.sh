#!/bin/sh
# run-tests: light, about 6 s
# A tenant's creates are bounded in rate (spaced-cp --create-rate; spaced-cp/api.c rate_allows):
# each create starts an execution on a worker and leaves rows the store keeps --retain-deleted after
# its delete, so a tenant creating and deleting in a loop would take the workers' CPU and grow the
# store without end (its quota bounds only what it holds at once). A control plane with
# --create-rate 2 (20 at once) and a fake worker:
#  - creates of one tenant as fast as they go: the first 20 are 201, then one is 429 rate-limited
#    with Retry-After: 1 and retry_after 1, and no more 201s than the rate added meanwhile;
#  - its deletes are never bounded: it deletes everything it made at once;
#  - another tenant creates at once (201): the bucket is the tenant's own;
#  - a second later the first tenant creates again (201);
#  - network policy updates as fast as they go: the first 20 applied, then 429 (no more than the
#    rate added meanwhile); its creates go on;
#  - lifecycle operations (pause, snapshot, resume, move: each writes a snapshot to the store or
#    starts an execution) as fast as they go, pause and resume in turn: none refused among the
#    first 20, then 429 rate-limited (no more than the rate added meanwhile; refused ones change
#    nothing: the sandbox is as the last answered one left it); its creates and policy updates have
#    buckets of their own;
#  - routes (each signs a capability) as fast as they go, on one kept-alive connection: the first
#    200 (ten times the rate, ten seconds' worth) answered 200, then 429 rate-limited within the rate
#    (20 a second) added meanwhile; another tenant routes at once (200);
#  - a create that names the Idempotency-Key of one made before is answered 200 even past the rate
#    (it makes nothing); spaced_cp_rate_limited_total counts the refusals;
#  - --create-rate refuses a value outside 0 (no bound) .. 100000.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
store_test_setup
start_cp cp --create-rate 2 --metrics-listen 127.0.0.1:0 --quota sandboxes=200
register wa 200
start_worker wa --capacity 200
TB=$(admin create-tenant beta)
# mk TENANT_KEY OUT: one create; prints the status, the headers go to OUT.h and the answer to OUT
mk() {
	curl -s -D "$2.h" -o "$2" -w '%{http_code}' -H "Authorization: Bearer $1" -H 'content-type: application/json' \
		-X POST --data-binary '{"worker":"wa"}' "$CP_URL/v1/sandboxes"
}
R=$W/r
mkdir -p "$R"
# creates until the first refusal (60 at most: a slow machine refills the bucket as it goes)
t0=$(date +%s%N)
made=0
limited=0
tries=0
while [ $tries -lt 60 ] && [ $limited -eq 0 ]; do
	tries=$((tries + 1))
	mk "$TA" "$R/c$tries" >"$R/s$tries"
	case "$(cat "$R/s$tries")" in 201) made=$((made + 1)) ;; 429) limited=$((limited + 1)) ;; esac
done
secs=$((($(date +%s%N) - t0 + 999999999) / 1000000000))
echo "$tries creates in ${secs} s: $made created, $limited refused"
expect "the first 20 creates (the burst) are 201" "$(for i in $(seq 1 20); do cat "$R/s$i"; echo; done | sort -u)" 201
expect "every answer is 201 or 429" "$((made + limited))" "$tries"
[ "$made" -le $((20 + 2 * secs + 1)) ] && ok "no more creates than the burst and the rate over ${secs} s ($made)" ||
	fail "$made creates in ${secs} s: more than 20 + 2 a second"
expect "then one refused" "$limited" 1
first=$tries
expect "a refused create: rate-limited, retry_after 1, Retry-After: 1" \
	"$(jq -r '.error + " " + (.retry_after | tostring)' "$R/c$first") $(grep -i '^retry-after:' "$R/c$first.h" | tr -d '\r' | awk '{ print $2 }')" \
	"rate-limited 1 1"
expect "the store holds exactly the sandboxes answered 201" "$(q "SELECT COUNT(*) FROM sandboxes WHERE deleted = 0")" "$made"

deleted=0
for id in $(for i in $(seq 1 "$tries"); do jq -r 'select(.id != null) | .id' "$R/c$i"; done); do
	st=$(api "$TA" DELETE "/v1/sandboxes/$id")
	[ "$st" = 200 ] && deleted=$((deleted + 1))
done
expect "its deletes are not bounded: all $made at once" "$deleted" "$made"
expect "another tenant creates meanwhile: 201" "$(mk "$TB" "$W/b1")" 201
sleep 1
expect "a second later the first tenant creates again: 201" "$(mk "$TA" "$W/a1")" 201

# network policy updates: a bucket of their own, at the same rate
B1=$(jq -r .id "$W/b1")
nets=""
st=""
applied=0
t0=$(date +%s%N)
while [ "$st" != 429 ] && [ $applied -lt 60 ]; do
	st=$(api "$TB" POST "/v1/sandboxes/$B1/network" '{"mode":"deny","allow_out":["198.18.0.0/15"]}')
	nets="$nets $st"
	[ "$st" = 200 ] && applied=$((applied + 1))
done
secs=$((($(date +%s%N) - t0 + 999999999) / 1000000000))
expect "policy updates as fast as they go: the first 20 applied" "$(echo $nets | tr ' ' '\n' | head -n 20 | sort -u)" 200
[ "$st" = 429 ] && [ "$(body .error)" = rate-limited ] && [ "$applied" -le $((20 + 2 * secs + 1)) ] &&
	ok "then 429 rate-limited past the rate ($applied applied in ${secs} s)" ||
	fail "policy updates: $nets in ${secs} s"
expect "the tenant's creates are not held by its policy updates: 201" "$(mk "$TB" "$W/b2")" 201

# lifecycle operations: a bucket of their own, at the same rate (each one answered 200 or 409 —
# the operation before it still holds the sandbox — counts)
ops="" st="" n=0 last=""
t0=$(date +%s%N)
while [ "$st" != 429 ] && [ $n -lt 60 ]; do
	op=$([ $((n % 2)) -eq 0 ] && echo pause || echo resume)
	st=$(api "$TB" POST "/v1/sandboxes/$B1/$op" '{}')
	ops="$ops $op:$st"
	[ "$st" = 200 ] && last=$op
	n=$((n + 1))
done
secs=$((($(date +%s%N) - t0 + 999999999) / 1000000000))
expect "pauses and resumes as fast as they go: none of the first 20 refused" \
	"$(echo $ops | tr ' ' '\n' | head -n 20 | grep -c ':429')" 0
[ "$st" = 429 ] && [ "$(body .error)" = rate-limited ] && [ "$n" -le $((21 + 2 * secs + 1)) ] &&
	ok "then 429 rate-limited past the rate ($((n - 1)) answered in ${secs} s)" ||
	fail "lifecycle operations: $ops in ${secs} s"
expect "the refused one changed nothing: the sandbox is as the last answered operation left it" \
	"$(api "$TB" GET "/v1/sandboxes/$B1" >/dev/null; body .state)" \
	"$([ "$last" = pause ] && echo paused || echo running)"
expect "the tenant's creates are not held by its lifecycle operations: 201" "$(mk "$TB" "$W/b3")" 201
# routes: ten times the rate, a bucket of their own (a kept-alive client as fast as it goes)
cat >"$W/routes.py" <<'PY'
import http.client, json, sys, time
host, port, key, sbx = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
c = http.client.HTTPConnection(host, port, timeout=10)
codes, t0 = [], time.monotonic()
while len(codes) < 3000 and time.monotonic() - t0 < 60:
    c.request("POST", "/v1/sandboxes/%s/route" % sbx, body="{}",
              headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    r = c.getresponse()
    body = r.read()
    codes.append(r.status)
    if r.status == 429:
        err = json.loads(body).get("error")
        break
else:
    err = None
print(json.dumps({"ok": codes.count(200), "n": len(codes), "last": codes[-1], "error": err,
                  "secs": time.monotonic() - t0}))
PY
CPH=${CP_URL#http://}
B3=$(jq -r .id "$W/b3") # running (B1 was left paused above)
python3 "$W/routes.py" "${CPH%:*}" "${CPH##*:}" "$TB" "$B3" >"$W/routes.json"
echo "routes: $(cat "$W/routes.json")"
expect "routes as fast as they go: the first 200 answered 200, then 429 rate-limited" \
	"$(jq -r '"\(.last) \(.error) \(.ok >= 200)"' "$W/routes.json")" "429 rate-limited true"
[ "$(jq -r '.ok <= 200 + 20 * (.secs | ceil) + 1' "$W/routes.json")" = true ] &&
	ok "no more routes than the burst and the rate meanwhile" || fail "routes: $(cat "$W/routes.json")"
A1=$(jq -r .id "$W/a1")
expect "another tenant routes meanwhile: 200" "$(api "$TA" POST "/v1/sandboxes/$A1/route" '{}')" 200
expect "nor its policy updates (a second later: 200)" \
	"$(sleep 1; api "$TB" POST "/v1/sandboxes/$B1/network" '{"mode":"deny"}')" 200

# a replay of a create already made is never held by the rate
ik() {
	curl -s -o "$2" -w '%{http_code}' -H "Authorization: Bearer $TA" -H "Idempotency-Key: $1" \
		-H 'content-type: application/json' -X POST --data-binary '{"worker":"wa"}' "$CP_URL/v1/sandboxes"
}
expect "a create with an Idempotency-Key: 201" "$(ik job-1 "$W/k0")" 201
n=0
while [ "$(mk "$TA" "$W/drain")" != 429 ] && [ $n -lt 60 ]; do n=$((n + 1)); done
# right after a refusal the bucket is empty (a token comes every 0.5 s): five replays at once
replays=$(for i in 1 2 3 4 5; do ik job-1 "$W/k$i"; echo; done | sort | uniq -c | awk '{ print $1 "x" $2 }')
expect "past the rate, the key's replays are all 200 with its sandbox" \
	"$replays $(jq -r .id "$W/k5")" "5x200 $(jq -r .id "$W/k0")"
# the creates' refusals, and one each of the policy updates, the lifecycle operations and the routes
refused=$(grep -l '"rate-limited"' "$R"/c* "$W"/drain 2>/dev/null | wc -l)
expect "spaced_cp_rate_limited_total counts every refusal" \
	"$(curl -s "http://127.0.0.1:$(cat "$W/cp/metrics.port")/metrics" | awk '$1 == "spaced_cp_rate_limited_total" { print $2 }')" \
	"$((refused + 3))"

for bad in -1 x 100001 ""; do
	"$CP" --state "$W/bad" --listen 127.0.0.1:0 --plaintext --create-rate "$bad" >/dev/null 2>"$W/bad.err"
	expect "--create-rate '$bad' refused (exit 2, naming it)" "$? $(grep -c -- --create-rate "$W/bad.err")" "2 1"
done
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
