#!/bin/sh
# run-tests: light, about 3 s
# A create's Idempotency-Key (spaced-cp/ops.c create_replayed; docs/cp-api.yaml): a client that
# retries a create whose answer it lost (a timeout, a replica gone mid-request) gets the sandbox the
# first attempt made, not a second one counted against its quota. A control plane and a fake worker:
#  - a key's first create is 201, the same key again 200 with the same sandbox (spacectl create
#    --idempotency-key too);
#  - six creates with one key at once make one sandbox, and every answer names it;
#  - another tenant's key of the same name is its own;
#  - once that sandbox is deleted the key answers 409 idempotency-key-used, naming it;
#  - a malformed key is 400;
#  - a replay while the first create still waits for its worker's acknowledgement waits with it
#    and answers the sandbox running (before: 200 with a sandbox in `starting`); two of a
#    tenant's replays wait at once at most, the others are answered at once;
#  - the fake worker, whose hello does not say it takes tentative installs, is sent none marked so.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
store_test_setup
start_cp cp
register wa
start_worker wa
TB=$(admin create-tenant beta)
# ik KEY OUTFILE [TENANT_KEY]: a create with the key; prints the status, the answer goes to OUTFILE
ik() {
	curl -s -o "$2" -w '%{http_code}' -H "Authorization: Bearer ${3:-$TA}" -H "Idempotency-Key: $1" \
		-H 'content-type: application/json' -X POST --data-binary "{\"worker\":\"${IK_WORKER:-wa}\"}" "$CP_URL/v1/sandboxes"
}
expect "a create with a key: 201" "$(ik k-1 "$W/a1")" 201
S1=$(jq -r .id "$W/a1")
expect "the same key again: 200, the same sandbox" "$(ik k-1 "$W/a2") $(jq -r .id "$W/a2")" "200 $S1"
expect "one sandbox holds the key" "$(q "SELECT COUNT(*) FROM sandboxes WHERE idem_key = 'k-1'")" 1
SC=$SPACED_BUILD/spacectl/spacectl
expect "spacectl create --idempotency-key names it too" \
	"$(SPACED_CP_URL=$CP_URL SPACED_API_KEY=$TA "$SC" create --idempotency-key k-1 2>&1)" "$S1"

pids=""
for i in 1 2 3 4 5 6; do
	ik k-2 "$W/c$i" >"$W/s$i" &
	pids="$pids $!"
done
for p in $pids; do wait "$p"; done
expect "six creates with one key at once: one sandbox" "$(q "SELECT COUNT(*) FROM sandboxes WHERE idem_key = 'k-2'")" 1
expect "every answer names it" "$(cat "$W"/c[1-6] | jq -r .id | sort -u | wc -l)" 1
expect "one 201, five 200" "$(for i in 1 2 3 4 5 6; do cat "$W/s$i"; echo; done | sort | tr -d '\n')" "200200200200200201"
expect "the tenant holds 2 sandboxes" "$(q "SELECT COUNT(*) FROM sandboxes WHERE deleted = 0")" 2

expect "another tenant's key k-1 is its own: 201" "$(ik k-1 "$W/b1" "$TB")" 201
expect "its own sandbox" "$([ "$(jq -r .id "$W/b1")" != "$S1" ] && echo yes)" yes

expect "delete the sandbox of k-1" "$(api "$TA" DELETE "/v1/sandboxes/$S1")" 200
expect "its key again: 409 idempotency-key-used, naming it" \
	"$(ik k-1 "$W/d1") $(jq -r '.error + " " + .sandbox' "$W/d1")" "409 idempotency-key-used $S1"
expect "a malformed key: 400" "$(ik 'bad key!' "$W/m1")" 400
expect "a key of 65 characters: 400" "$(ik "$(head -c 65 /dev/zero | tr '\0' k)" "$W/m2")" 400

# ---- a replay while the first create still waits for its worker: it waits with it ----
register wd
start_worker wd --delay-ms 3000 --delay-type install
IK_WORKER=wd ik k-3 "$W/e1" >"$W/es1" &
F=$!
sleep 0.4
t0=$(date +%s%N)
r=$(IK_WORKER=wd ik k-3 "$W/e2")
t1=$(date +%s%N)
wait "$F"
echo "the replay was answered after $(((t1 - t0) / 1000000)) ms"
expect "the first create, acknowledged 3 s later: 201" "$(cat "$W/es1") $(jq -r .state "$W/e1")" "201 running"
expect "a replay meanwhile: 200, its sandbox, running (not starting: it waited for the create's end)" \
	"$r $(jq -r .id "$W/e2") $(jq -r .state "$W/e2")" "200 $(jq -r .id "$W/e1") running"
# a tenant's replays in a loop hold no more than two request threads: two wait, the rest are
# answered at once with the sandbox as it is
IK_WORKER=wd ik k-4 "$W/f0" >"$W/fs0" &
F=$!
i=0
until [ "$(q "SELECT COUNT(*) FROM sandboxes WHERE idem_key = 'k-4'")" = 1 ]; do
	i=$((i + 1)); [ $i -lt 100 ] || break
	sleep 0.02
done
pids=""
for i in 1 2 3 4 5; do
	IK_WORKER=wd ik k-4 "$W/f$i" >"$W/fs$i" &
	pids="$pids $!"
done
for p in $pids $F; do wait "$p"; done
expect "five replays at once while the create waits: two wait for it (running), three are answered at once (starting)" \
	"$(for i in 1 2 3 4 5; do jq -r .state "$W/f$i"; done | sort | uniq -c | awk '{printf "%s %s ", $1, $2}')" "2 running 3 starting "
# a worker whose hello does not say it takes tentative installs (this fake worker, like a worker
# of before them) gets every install once it is durable, never marked (docs/control-messages.md)
expect "wa got installs, none of them marked tentative" \
	"$(grep -c '"type":"install"' "$W/wa.log" | awk '{print ($1 > 0)}') $(grep -c '"tentative"' "$W/wa.log")" "1 0"
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
