#!/bin/sh
# run-tests: light, about 75 s
# spaced-cp on a real PostgreSQL server (started here with scripts/pg-test.sh):
# the same suite as on SQLite, then two control-plane replicas sharing the
# database and acting on the same sandbox (serialized by the row lease; each
# replica's signing key reaches the workers through the shared outbox).
# Cites I2, C1, C2, T1. Exit 77 only when PostgreSQL cannot start here.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
W=$(mktemp -d)
chmod 755 "$W"
trap 'cleanup; sh "$SPACED_TOP/scripts/pg-test.sh" stop "$W/pg"; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
out=$(sh "$SPACED_TOP/scripts/pg-test.sh" start "$W/pg")
rc=$?
if [ $rc -ne 0 ]; then
	echo "$out"
	[ $rc -eq 77 ] && exit 77
	exit 1
fi
CP_DB=$out
echo "PostgreSQL at $CP_DB"
. "$SPACED_TOP/tests/cp_suite.sh"

# ---- two replicas on one PostgreSQL ----
echo "--- two replicas"
URL1=$CP_URL
PID1=$CP_PID
mkdir -p "$W/cp2"
start_cp cp2
URL2=$CP_URL
expect "replica 2 sees replica 1's sandboxes" "$(API_URL=$URL2 api "$TA" GET /v1/sandboxes; body '.sandboxes | length > 0')" 200true
expect "create through replica 1" "$(API_URL=$URL1 api "$TA" POST /v1/sandboxes '{"worker":"wa"}')" 201
R=$(body .id)
expect "move through replica 2 (wa's channel is on replica 1)" "$(API_URL=$URL2 api "$TA" POST "/v1/sandboxes/$R/move" '{"to":"wb"}'; body '(.generation|tostring) + " " + .worker')" "2002 wb"
for i in 1 2; do
	u=$URL1; [ $i = 2 ] && u=$URL2
	( st=$(API_URL=$u OUT="$W/rr$i.body" api "$TA" POST "/v1/sandboxes/$R/move" '{"to":"wa"}'); echo "$st" >"$W/rr$i.status" ) &
done
wait_for "both replicas answered" sh -c "[ -s '$W/rr1.status' ] && [ -s '$W/rr2.status' ]"
expect "same sandbox on two replicas at once: one wins, one 409" "$(cat "$W/rr1.status" "$W/rr2.status" | sort | tr '\n' ' ')" "200 409 "
expect "exactly one new generation" "$(API_URL=$URL2 api "$TA" GET "/v1/sandboxes/$R"; body '(.generation|tostring) + " " + .worker')" "2003 wa"
curl -s "$URL2/v1/keys" >"$W/bundle-r.json"
expect "route through replica 2" "$(API_URL=$URL2 api "$TA" POST "/v1/sandboxes/$R/route" '{}')" 200
cp "$W/body" "$W/route-r2.json"
K2=$("$CAPCHECK" "$W/bundle-r.json" "$W/route-r2.json" | jq -r .kid)
[ -n "$K2" ] && ok "replica 2's capability verifies with the shared bundle" || fail "replica 2 capability"
wait_for "replica 2's key reached wa through the shared outbox" sh -c "jq -s -e --arg k '$K2' '[.[] | select(.type == \"keys\") | .bundle.keys[] | select(.kid == \$k)] | length > 0' '$W/wa.log' >/dev/null"

# ---- a tenant's rate is the tenant's, across replicas ----
# (two more replicas at --create-rate 1: ten lifecycle operations at once, one a second after.
# Fourteen pauses of a sandbox that does not exist, alternating between them, in well under a
# second: ten are counted (404: no such sandbox), four refused 429. Each replica counted on its
# own before: twenty would have passed)
echo "--- rates across replicas"
TR=$(admin create-tenant rates)
mkdir -p "$W/cp3" "$W/cp4"
start_cp cp3 --create-rate 1
URL3=$CP_URL
start_cp cp4 --create-rate 1
URL4=$CP_URL
: >"$W/rates"
for i in $(seq 1 14); do
	u=$URL3; [ $((i % 2)) -eq 0 ] && u=$URL4
	API_URL=$u OUT="$W/rate.body" api "$TR" POST /v1/sandboxes/sbx-none/pause '{}' >>"$W/rates"
	echo >>"$W/rates"
done
expect "fourteen pauses through two replicas: ten counted, four refused" \
	"$(sort "$W/rates" | uniq -c | awk '{ printf "%s:%s ", $2, $1 }')" "404:10 429:4 "
expect "the refusal says so" "$(jq -r .error "$W/rate.body")" rate-limited
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
