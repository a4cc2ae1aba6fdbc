#!/bin/sh
# run-tests: light, about 6 s
# A tenant's creates are bounded in rate (spaced-cp --create-rate; spaced-cp/api.c create_allowed):
# each create starts an execution on a worker and leaves rows the store keeps --retain-deleted after
# its delete, so a tenant creating and deleting in a loop would take the workers' CPU and grow the
# store without end (its quota bounds only what it holds at once). A control plane with
# --create-rate 2 (20 at once) and a fake worker:
#  - 30 creates of one tenant as fast as they go: the first 20 are 201, then 429 rate-limited with
#    Retry-After: 1 and retry_after 1, and no more 201s than the rate added meanwhile;
#  - its deletes are never bounded: it deletes everything it made at once;
#  - another tenant creates at once (201): the bucket is the tenant's own;
#  - a second later the first tenant creates again (201);
#  - 25 network policy updates at once: the first 20 applied, the last ones 429; its creates go on;
#  - --create-rate takes 0 (no bound) up to 100000 creates a second, and refuses anything else.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
store_test_setup
start_cp cp --create-rate 2
register wa 64
start_worker wa --capacity 64
TB=$(admin create-tenant beta)
# mk TENANT_KEY OUT: one create; prints the status, the headers go to OUT.h and the answer to OUT
mk() {
	curl -s -D "$2.h" -o "$2" -w '%{http_code}' -H "Authorization: Bearer $1" -H 'content-type: application/json' \
		-X POST --data-binary '{"worker":"wa"}' "$CP_URL/v1/sandboxes"
}
R=$W/r
mkdir -p "$R"
t0=$(date +%s%N)
for i in $(seq 1 30); do
	mk "$TA" "$R/c$i" >"$R/s$i"
done
secs=$((($(date +%s%N) - t0 + 999999999) / 1000000000))
made=0
limited=0
for i in $(seq 1 30); do
	case "$(cat "$R/s$i")" in 201) made=$((made + 1)) ;; 429) limited=$((limited + 1)) ;; esac
done
echo "30 creates in ${secs} s: $made created, $limited refused"
expect "the first 20 creates (the burst) are 201" "$(for i in $(seq 1 20); do cat "$R/s$i"; echo; done | sort -u)" 201
expect "every other answer is 201 or 429" "$((made + limited))" 30
[ "$made" -le $((20 + 2 * secs + 1)) ] && ok "no more creates than the burst and the rate over ${secs} s ($made)" ||
	fail "$made creates in ${secs} s: more than 20 + 2 a second"
[ "$limited" -ge 1 ] && ok "the rest refused ($limited)" || fail "nothing refused"
first=""
for i in $(seq 21 30); do
	[ "$(cat "$R/s$i")" = 429 ] && { first=$i; break; }
done
if [ -n "$first" ]; then
	expect "a refused create: rate-limited, retry_after 1, Retry-After: 1" \
		"$(jq -r '.error + " " + (.retry_after | tostring)' "$R/c$first") $(grep -i '^retry-after:' "$R/c$first.h" | tr -d '\r' | awk '{ print $2 }')" \
		"rate-limited 1 1"
fi
expect "the store holds exactly the sandboxes answered 201" "$(q "SELECT COUNT(*) FROM sandboxes WHERE deleted = 0")" "$made"

deleted=0
for id in $(for i in $(seq 1 30); do jq -r 'select(.id != null) | .id' "$R/c$i"; done); do
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
for i in $(seq 1 25); do
	nets="$nets $(api "$TB" POST "/v1/sandboxes/$B1/network" '{"mode":"deny","allow_out":["198.18.0.0/15"]}')"
done
expect "25 policy updates at once: the first 20 applied, then 429 rate-limited" \
	"$(echo $nets | tr ' ' '\n' | head -n 20 | sort -u) $(echo $nets | tr ' ' '\n' | tail -n 3 | sort -u) $(body .error)" \
	"200 429 rate-limited"
expect "the tenant's creates are not held by its policy updates: 201" "$(mk "$TB" "$W/b2")" 201

for bad in -1 x 100001 ""; do
	"$CP" --state "$W/bad" --listen 127.0.0.1:0 --plaintext --create-rate "$bad" >/dev/null 2>"$W/bad.err"
	expect "--create-rate '$bad' refused (exit 2, naming it)" "$? $(grep -c -- --create-rate "$W/bad.err")" "2 1"
done
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
