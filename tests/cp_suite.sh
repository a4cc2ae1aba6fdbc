# cp_suite.sh — the spaced-cp suite, run on SQLite (cp_sqlite.t.sh) and on a
# real PostgreSQL server (cp_pg.t.sh) with CP_DB set. Sourced after cp_lib.sh
# with $W a fresh directory.

mkdir -p "$W/cp"
TA=$(admin create-tenant alpha)
TB=$(admin create-tenant beta)
JX=$(admin create-join-token wx)
AK=$(admin create-admin-key)
[ -n "$TA" ] && [ -n "$TB" ] && [ -n "$JX" ] && [ -n "$AK" ] || { echo "admin commands failed"; exit 1; }
start_cp cp

# ---- malformed input: clean 4xx, the daemon keeps serving ----
expect "no key -> 401" "$(curl -s -o /dev/null -w '%{http_code}' "$CP_URL/v1/sandboxes")" 401
expect "wrong key -> 401" "$(api spk_0000000000000000_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA GET /v1/sandboxes)" 401
expect "a join token is no tenant key -> 401" "$(api "$JX" GET /v1/sandboxes)" 401
expect "malformed JSON -> 400" "$(api "$TA" POST /v1/sandboxes '{"pids":')" 400
expect "duplicate keys -> 400" "$(api "$TA" POST /v1/sandboxes '{"pids":10,"pids":11}')" 400
expect "unknown member -> 400" "$(api "$TA" POST /v1/sandboxes '{"evil":1}')" 400
expect "wrong type -> 400" "$(api "$TA" POST /v1/sandboxes '{"pids":"many"}')" 400
expect "not an object -> 400" "$(api "$TA" POST /v1/sandboxes '[1,2]')" 400
expect "NUL in JSON -> 400" "$(api "$TA" POST /v1/sandboxes '{"template":"a\u0000b"}')" 400
head -c 70000 /dev/zero | tr '\0' 'x' >"$W/big"
expect "oversized body -> 413" "$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $TA" --data-binary @"$W/big" "$CP_URL/v1/sandboxes")" 413
expect "unknown endpoint -> 404" "$(api "$TA" GET /v1/nothing)" 404
expect "PUT -> 405" "$(api "$TA" PUT /v1/sandboxes)" 405
# raw garbage, a truncated request and a bogus WebSocket frame on raw sockets
timeout 10 python3 - "${CP_URL##*:}" <<'PY' || true
import socket, sys
for data in [b"GARBAGE\r\n\r\n", b"POST /v1/sandboxes HTTP/1.1\r\nContent-Length: 50\r\n\r\n{", b"\x00\xff" * 300,
             b"GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\n" + b"X-A: " + b"a" * 9000 + b"\r\n\r\n"]:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    s.settimeout(2)
    s.sendall(data)
    try:
        s.recv(4096)
    except Exception:
        pass
    s.close()
PY
expect "healthz after garbage" "$(curl -s -o /dev/null -w '%{http_code}' "$CP_URL/v1/healthz")" 200
expect "no worker yet -> 503" "$(api "$TA" POST /v1/sandboxes '{}')" 503

# ---- workers: registration, channel, listing ----
register wa
register wb
start_worker wa
start_worker wb
expect "first message to a worker is the key bundle (C2, T1)" "$(head -n 1 "$W/wa.log" | jq -r '.seq, .type' | tr '\n' ' ')" "1 keys "
expect "workers listed" "$(api "$TA" GET /v1/workers; body '[.workers[] | .id + ":" + .state] | join(",")')" "200wa:live,wb:live"
expect "heartbeat with a tenant key -> 401" "$(api "$TA" POST /v1/workers/wa/heartbeat)" 401
# a worker peer sending garbage on its channel loses that connection, nothing else
register wz
res=$(timeout 20 python3 - "${CP_URL##*:}" "$WK_wz" <<'PY'
import base64, os, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.settimeout(5)
key = base64.b64encode(os.urandom(16)).decode()
s.sendall(("GET /v1/workers/wz/channel HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer %s\r\n\r\n" % (key, sys.argv[2])).encode())
head = s.recv(4096)
if b" 101 " not in head.split(b"\r\n")[0]:
    print("no-upgrade"); sys.exit(0)
payload = b'{"ack":"x","ok":"maybe"}'
mask = os.urandom(4)
frame = bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
s.sendall(frame)
try:
    while True:
        d = s.recv(4096)
        if not d:
            break
        if d[0] & 0x0f == 8:
            break
    print("closed")
except socket.timeout:
    print("still-open")
PY
)
expect "garbage on a channel drops that channel" "$res" closed
expect "daemon still serving after a bad channel peer" "$(curl -s -o /dev/null -w '%{http_code}' "$CP_URL/v1/healthz")" 200

# ---- create / get / list (I1, I2) ----
expect "create on wa" "$(api "$TA" POST /v1/sandboxes '{"worker":"wa","memory_bytes":134217728,"pids":64}')" 201
S1=$(body .id)
expect "new sandbox runs generation 1 on wa" "$(body '.state + " " + (.generation|tostring) + " " + .route.worker + " " + .route.sandbox')" "running 1 wa $S1"
grep -q "\"type\":\"install\".*\"sandbox\":\"$S1\",\"generation\":1" "$W/wa.log" && ok "wa received the install" || fail "wa got no install for $S1"
expect "inspect" "$(api "$TA" GET "/v1/sandboxes/$S1"; body '.id + " " + .route.activation')" "200$S1 $(jq -r .route.activation "$W/body")"
expect "list" "$(api "$TA" GET /v1/sandboxes; body '[.sandboxes[].id] | join(",")')" "200$S1"
expect "create with a substrate no worker has -> 503" "$(api "$TA" POST /v1/sandboxes '{"substrate":"qemu"}')" 503
expect "create on an unknown worker -> 404" "$(api "$TA" POST /v1/sandboxes '{"worker":"nope"}')" 404

# ---- tenancy: another tenant's sandbox is indistinguishable from none ----
api "$TB" GET /v1/sandboxes/sbx-doesnotexist0000 >/dev/null; cp "$W/body" "$W/none.json"
for req in "GET /v1/sandboxes/ID" "DELETE /v1/sandboxes/ID" "POST /v1/sandboxes/ID/route" "POST /v1/sandboxes/ID/pause" \
	"POST /v1/sandboxes/ID/resume" "POST /v1/sandboxes/ID/move" "POST /v1/sandboxes/ID/snapshot"; do
	m=${req% *}; p=$(echo "${req#* }" | sed "s/ID/$S1/")
	pn=$(echo "${req#* }" | sed "s/ID/sbx-doesnotexist0000/")
	st=$(api "$TB" "$m" "$p" '{}'); cp "$W/body" "$W/other.json"
	stn=$(api "$TB" "$m" "$pn" '{}'); cp "$W/body" "$W/none.json"
	if [ "$st" = 404 ] && [ "$stn" = 404 ] && cmp -s "$W/other.json" "$W/none.json"; then
		ok "tenant beta: $m on alpha's sandbox = nonexistent (404, same body)"
	else
		fail "tenant beta: $m on alpha's sandbox: $st $(cat "$W/other.json") vs $stn $(cat "$W/none.json")"
	fi
done
expect "beta lists nothing" "$(api "$TB" GET /v1/sandboxes; body '.sandboxes | length')" 2000
expect "alpha's sandbox untouched" "$(api "$TA" GET "/v1/sandboxes/$S1"; body .state)" 200running

# ---- route + capability (C1, C2, C3) ----
curl -s "$CP_URL/v1/keys" >"$W/bundle1.json"
expect "route" "$(api "$TA" POST "/v1/sandboxes/$S1/route" '{"purposes":["exec","fs.read"]}')" 200
cp "$W/body" "$W/route1.json"
if "$CAPCHECK" "$W/bundle1.json" "$W/route1.json" >"$W/claims1.json"; then ok "capability verifies with the bundle and names the route's identity"; else fail "capability does not verify"; fi
api "$TA" GET "/v1/sandboxes/$S1" >/dev/null
expect "route identity = current execution" "$(jq -c .identity "$W/route1.json")" "$(jq -c .route "$W/body")"
expect "purposes granted" "$(jq -c .purposes "$W/claims1.json")" '["fs.read","exec"]'
expect "lifetime 120 s (C3)" "$(jq '.exp - .iat' "$W/claims1.json")" 120
expect "worker_url from registration" "$(jq -r .worker_url "$W/route1.json")" "http://127.0.0.1:1/wa"
expect "serviceport route" "$(api "$TA" POST "/v1/sandboxes/$S1/route" '{"purposes":["serviceport"],"port":8080,"protocol":"http"}')" 200
cp "$W/body" "$W/route-sp.json"
expect "serviceport capability names port and protocol (C1)" "$("$CAPCHECK" "$W/bundle1.json" "$W/route-sp.json" | jq -r '.class + " " + (.port|tostring) + " " + .protocol')" "serviceport 8080 http"
expect "serviceport without port -> 400" "$(api "$TA" POST "/v1/sandboxes/$S1/route" '{"purposes":["serviceport"]}')" 400
expect "serviceport mixed with exec -> 400" "$(api "$TA" POST "/v1/sandboxes/$S1/route" '{"purposes":["serviceport","exec"],"port":1}')" 400
expect "port without serviceport -> 400" "$(api "$TA" POST "/v1/sandboxes/$S1/route" '{"purposes":["exec"],"port":80}')" 400
expect "unknown purpose -> 400" "$(api "$TA" POST "/v1/sandboxes/$S1/route" '{"purposes":["root"]}')" 400
expect "port out of range -> 400" "$(api "$TA" POST "/v1/sandboxes/$S1/route" '{"purposes":["serviceport"],"port":70000}')" 400

# ---- generations over pause / resume / move cycles (I2) ----
gens="1"
step() { # OP BODY EXPECTED_STATE
	st=$(api "$TA" POST "/v1/sandboxes/$S1/$1" "$2")
	if [ "$st" != 200 ] || [ "$(body .state)" != "$3" ]; then fail "$1 $2: $st $(cat "$W/body")"; return; fi
	g=$(body .generation); gens="$gens $g"
	echo "  $1 $2 -> $(body '.state + " gen=" + (.generation|tostring) + " on " + .worker + " " + .route.activation')"
}
step pause '' paused
expect "pause keeps the generation" "$(body .generation)" 1
expect "no route while paused -> 409" "$(api "$TA" POST "/v1/sandboxes/$S1/route" '{}'; body .error)" "409not-running"
step resume '' running
expect "resume in place (thaw) keeps the generation" "$(body .generation)" 1
step pause '' paused
step snapshot '' paused
expect "snapshot path recorded" "$(body '.snapshot | test("snapshots/'"$S1"'-1-[0-9a-f]+$")')" true
step resume '' running
step move '{"to":"wb"}' running
expect "move: new generation on wb" "$(body '(.generation|tostring) + " " + .route.worker')" "2 wb"
A2=$(body .route.activation)
step move '{"to":"wa"}' running
step pause '' paused
step resume '{"worker":"wb"}' running
expect "resume elsewhere = move: new generation" "$(body '(.generation|tostring) + " " + .route.worker')" "4 wb"
expect "activation changed with the generation" "$([ "$(body .route.activation)" != "$A2" ] && echo yes)" yes
prev=0; mono=yes
for g in $gens; do [ "$g" -ge "$prev" ] || mono=no; prev=$g; done
expect "generations never go backwards over the cycle ($gens)" "$mono" yes
expect "every start made a strictly greater generation" "$(echo "$gens" | tr ' ' '\n' | uniq | tr '\n' ' ')" "1 2 3 4 "
expect "move to the worker it is on -> 409" "$(api "$TA" POST "/v1/sandboxes/$S1/move" '{"to":"wb"}')" 409
# the old worker saw deactivate (kept paused) then snapshot then destroy; the new one install from the snapshot
expect "wa: deactivate, snapshot, destroy in order for generation 3" \
	"$(jq -r 'select(.identity.generation == 3 or .type == "destroy") | .type' "$W/wa.log" | grep -v install | tail -n 3 | tr '\n' ' ')" "deactivate snapshot destroy "
expect "wb: install of generation 4 from the snapshot of 3" "$(jq -r 'select(.type == "install" and .identity.generation == 4) | .spec.snapshot | test("-3-[0-9a-f]+$")' "$W/wb.log")" true
expect "keep_paused on deactivate" "$(jq -r 'select(.type == "deactivate") | .keep_paused' "$W/wa.log" | sort -u)" true
for w in wa wb; do
	gaps=$(jq -s '[.[] | select(.dup != true) | .seq] | . as $s | [range(1; length)] | map(select($s[.] != $s[. - 1] + 1)) | length' "$W/$w.log")
	expect "$w: seq increases by one per message" "$gaps" 0
done

# ---- concurrent lifecycle calls on one sandbox: serialized or 409, never interleaved ----
register wc
start_worker wc --delay-ms 400
expect "create on the slow worker" "$(api "$TA" POST /v1/sandboxes '{"worker":"wc"}')" 201
S2=$(body .id)
for i in 1 2 3; do
	( st=$(OUT="$W/race$i.body" api "$TA" POST "/v1/sandboxes/$S2/move" '{"to":"wa"}'); echo "$st" >"$W/race$i.status" ) &
done
wait_for "three concurrent moves all answered" sh -c "[ -s '$W/race1.status' ] && [ -s '$W/race2.status' ] && [ -s '$W/race3.status' ]"
wins=$(cat "$W"/race?.status | grep -c '^200$' || true)
busy=$(cat "$W"/race?.status | grep -c '^409$' || true)
expect "three concurrent moves: one wins, two get 409" "$wins $busy" "1 2"
expect "the losers were told busy" "$(cat "$W"/race?.body | jq -r 'select(.error) | .error' | sort -u | tr '\n' ' ')" "busy "
expect "exactly one new generation" "$(api "$TA" GET "/v1/sandboxes/$S2"; body '(.generation|tostring) + " " + .worker')" "2002 wa"
( st=$(OUT="$W/p1.body" api "$TA" POST "/v1/sandboxes/$S2/pause"); echo "pause $st" >"$W/p1" ) &
( st=$(OUT="$W/p2.body" api "$TA" DELETE "/v1/sandboxes/$S2"); echo "delete $st" >"$W/p2" ) &
wait_for "pause and delete at once both answer" sh -c "[ -s '$W/p1' ] && [ -s '$W/p2' ]"
outcome="$(cat "$W/p1") $(cat "$W/p2")"
case "$outcome" in
"pause 200 delete 200" | "pause 409 delete 200" | "pause 404 delete 200" | "pause 200 delete 409")
	ok "pause vs delete serialized or refused ($outcome)" ;;
*) fail "pause vs delete: $outcome" ;;
esac
final=$(api "$TA" GET "/v1/sandboxes/$S2"; body '.state // .error')
case "$outcome:$final" in
*"delete 200":404not-found | *"delete 409":200paused) ok "one consistent end state ($final)" ;;
*) fail "end state after pause vs delete: $final" ;;
esac

# ---- acks: refusal and timeout give clear errors ----
register wd
start_worker wd --refuse install
expect "worker refuses install -> 502" "$(api "$TA" POST /v1/sandboxes '{"worker":"wd"}'; body .error)" "502worker-refused"
stop_worker wd
start_worker wd --silent pause
expect "create on wd" "$(api "$TA" POST /v1/sandboxes '{"worker":"wd"}')" 201
S3=$(body .id)
expect "worker never acks pause -> 504" "$(api "$TA" POST "/v1/sandboxes/$S3/pause"; body .error)" "504worker-timeout"
stop_worker wd

# ---- replay: a reconnecting worker receives what it missed (T1) ----
register we
start_worker we --exit-after 2
expect "install to a worker that drops before acking -> 504" "$(api "$TA" POST /v1/sandboxes '{"worker":"we"}')" 504
S4=$(body .sandbox.id)
expect "the worker applied nothing past seq 1" "$(cat "$W/we.state" | cut -d' ' -f1)" 1
stop_worker we
: >"$W/we.log"
start_worker we
wait_for "replayed install reaches the worker" grep -q "\"sandbox\":\"$S4\"" "$W/we.log"
expect "replay starts right after last_seq" "$(head -n 1 "$W/we.log" | jq .seq)" 2
wait_for "the replayed install is acknowledged" sh -c "[ \"\$(cut -d' ' -f1 '$W/we.state')\" = 2 ]"
expect "resume after the failed start: same generation, new activation" "$(api "$TA" POST "/v1/sandboxes/$S4/resume"; body '.state + " " + (.generation|tostring)')" "200running 1"

# ---- rotation: the new key reaches every worker before it signs; the old one stays until expiry ----
OLD_KID=$(jq -r .kid "$W/claims1.json")
expect "rotation needs the admin key" "$(api "$TA" POST /v1/admin/rotate-keys)" 401
for w in wa wb wc we; do wc -l <"$W/$w.log" >"$W/$w.before"; done
rc=$(api "$AK" POST /v1/admin/rotate-keys)
[ "$rc" = 200 ] || echo "  the rotation answered: $(cat "$W/body")"
expect "rotate" "$rc" 200
NEW_KID=$(body .active)
expect "rotation retires the old key" "$(body .retired)" "$OLD_KID"
for w in wa wb wc we; do
	if tail -n +"$(($(cat "$W/$w.before") + 1))" "$W/$w.log" | jq -s -e --arg k "$NEW_KID" '[.[] | select(.type == "keys") | .bundle.keys[] | select(.kid == $k)] | length > 0' >/dev/null; then
		ok "$w had the new key before the first token signed with it"
	else
		fail "$w never got $NEW_KID"
	fi
done
curl -s "$CP_URL/v1/keys" >"$W/bundle2.json"
expect "route after rotation" "$(api "$TA" POST "/v1/sandboxes/$S1/route" '{"purposes":["term"]}')" 200
cp "$W/body" "$W/route2.json"
expect "new tokens carry the new key" "$("$CAPCHECK" "$W/bundle2.json" "$W/route2.json" | jq -r .kid)" "$NEW_KID"
if "$CAPCHECK" "$W/bundle2.json" "$W/route1.json" >/dev/null; then ok "a token of the old key still verifies with the new bundle"; else fail "old token rejected right after rotation"; fi
na=$(jq -r --arg k "$OLD_KID" '.keys[] | select(.kid == $k) | .not_after' "$W/bundle2.json")
exp1=$(jq -r .expires_at "$W/route1.json")
expect "old key kept at least until its last token expired (+15 s)" "$([ "$(date -d "$na" +%s)" -ge $(($(date -d "$exp1" +%s) + 15)) ] && echo yes)" yes
expect "old key leaves within 120+15 s of rotation" "$([ "$(date -d "$na" +%s)" -le $(($(date +%s) + 135)) ] && echo yes)" yes
if "$CAPCHECK" "$W/bundle2.json" "$W/route1.json" "$(($(date -d "$na" +%s) + 1))" 2>/dev/null; then fail "old key accepted after its window"; else ok "old key refused after its window"; fi

# a connected worker that never acknowledges the new key: the rotation stops, the key stays unused
register wg
start_worker wg --silent keys
expect "rotation with a connected worker not acking -> 504" "$(api "$AK" POST /v1/admin/rotate-keys; body '.error + " " + (.workers | join(","))')" "504keys-not-acked wg"
PENDING=$(body .pending)
stop_worker wg
expect "tokens still come from the active key, not the unacknowledged one" "$(api "$TA" POST "/v1/sandboxes/$S1/route" '{}'; "$CAPCHECK" "$W/bundle2.json" "$W/body" | jq -r .kid)" "200$NEW_KID"
[ "$PENDING" != "$NEW_KID" ] && ok "the pending key ($PENDING) is another key" || fail "pending key equals the active one"
# a worker claiming more applied messages than the store ever sent is refused (state loss: fail closed)
echo "999 0" >"$W/wh.state"
register wh
"$FW" --url "ws://${CP_URL#http://}" --worker wh --key "$WK_wh" --state "$W/wh.state" --log "$W/wh.log" 2>/dev/null &
WHPID=$!; PIDS="$PIDS $WHPID"
wait_for "the control plane refuses the channel of a worker ahead of it" grep -q "event=channel-refused worker=wh reason=\"hello last_seq=999 is ahead" "$W/cp.log"
kill $WHPID 2>/dev/null || true
expect "a worker ahead of the store gets nothing" "$(cat "$W/wh.log" 2>/dev/null | wc -l)" 0

# ---- the signer is the only process with a secret key (C2) ----
if nm "$CP" | grep -Eq 'spaced_secret_key|spaced_cap_issue|spaced_paseto_sign|crypto_sign_detached|crypto_sign_keypair'; then
	fail "spaced-cp links signing code"
else
	ok "spaced-cp links no signing code (nm)"
fi
nm "$SPACED_BUILD/spaced-cp/spaced-cp-signer" | grep -q spaced_cap_issue && ok "spaced-cp-signer does" || fail "signer has no signing code"
expect "key file private" "$(stat -c %a "$W/cp/signer.keys")" 600
SIGNER=$(pgrep -P "$CP_PID" || true)
[ -n "$SIGNER" ] && ok "signer runs as a child process ($SIGNER)" || fail "no signer child"
if ls -l /proc/"$CP_PID"/fd 2>/dev/null | grep -q signer.keys; then fail "spaced-cp has the key file open"; else ok "spaced-cp never holds the key file"; fi
if [ -n "$SIGNER" ]; then
	expect "signer is not dumpable (no ptrace / mem reads)" "$(stat -c %U /proc/"$SIGNER"/mem 2>/dev/null || echo root)" root
	if grep -q "$(sed -n 's/^active [0-9]* //p' "$W/cp/signer.keys" | cut -c1-30)" /proc/"$CP_PID"/environ /proc/"$CP_PID"/cmdline 2>/dev/null; then
		fail "secret in spaced-cp's environment or arguments"
	else
		ok "secret not in spaced-cp's arguments or environment"
	fi
fi

# ---- a signer that dies is started again with its keys ----
if [ -n "$SIGNER" ]; then
	kill -9 "$SIGNER"
	expect "route after the signer was killed" "$(api "$TA" POST "/v1/sandboxes/$S1/route" '{}'; "$CAPCHECK" "$W/bundle2.json" "$W/body" | jq -r .kid)" "200$NEW_KID"
	SIGNER2=$(pgrep -P "$CP_PID" || true)
	expect "a new signer process" "$([ -n "$SIGNER2" ] && [ "$SIGNER2" != "$SIGNER" ] && echo yes)" yes
fi

# ---- timeouts: idle pauses, absolute kills ----
expect "create with idle timeout 1 s" "$(api "$TA" POST /v1/sandboxes '{"worker":"wa","idle_timeout":1}')" 201
S5=$(body .id)
expect "create with absolute timeout 2 s" "$(api "$TA" POST /v1/sandboxes '{"worker":"wa","max_lifetime":2}')" 201
S6=$(body .id)
wait_for "idle sandbox paused" sh -c "curl -s -H 'Authorization: Bearer $TA' $CP_URL/v1/sandboxes/$S5 | jq -e '.state == \"paused\"' >/dev/null"
wait_for "expired sandbox killed" sh -c "[ \"\$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer $TA' $CP_URL/v1/sandboxes/$S6)\" = 404 ]"
grep -q "\"type\":\"destroy\",\"sandbox\":\"$S6\"" "$W/wa.log" && ok "the worker got destroy for the expired sandbox" || fail "no destroy for $S6"

# ---- an execution that ended on its worker (I2): reported, never served again ----
# A worker reports an execution that died under its record ({"ended":…} on its channel, after its
# hello); the control plane marks the sandbox failed only when the report names its current
# execution in full and comes from the worker that runs it. A resume is a new generation.
expect "create for the ended report" "$(api "$TA" POST /v1/sandboxes '{"worker":"wa"}')" 201
S9=$(body .id)
api "$TA" GET "/v1/sandboxes/$S9" >/dev/null
ID9=$(jq -c .route "$W/body")
ended_line() { echo "$1" | jq -c --arg r "$2" '{ended: {identity: ., reason: $r}}'; }
# wb (another worker) names wa's execution; wa names another activation, then another generation
ended_line "$(echo "$ID9" | jq -c '.')" "wb says so" >"$W/say-wb"
stop_worker wb; start_worker wb --say "$W/say-wb"
{ ended_line "$(echo "$ID9" | jq -c '.activation = "act-other"')" "wrong activation"
  ended_line "$(echo "$ID9" | jq -c '.generation = 7')" "another generation"; } >"$W/say-wa"
stop_worker wa; start_worker wa --say "$W/say-wa"
wait_for "the control plane ignored the report of another worker" grep -q "event=execution-ended worker=wb sandbox=$S9 generation=1 outcome=ignored-other-worker" "$CP_LOG"
wait_for "and the reports naming no current execution" sh -c "[ \$(grep -c 'event=execution-ended worker=wa sandbox=$S9 .*outcome=ignored-not-current' '$CP_LOG') -ge 2 ]"
expect "the sandbox still runs after foreign and stale reports" "$(api "$TA" GET "/v1/sandboxes/$S9"; body .state)" 200running
ended_line "$ID9" "its launcher ended" >"$W/say-wa"
stop_worker wa; start_worker wa --say "$W/say-wa"
wait_for "the report of the current execution makes the sandbox failed" sh -c "curl -s -H 'Authorization: Bearer $TA' $CP_URL/v1/sandboxes/$S9 | jq -e '.state == \"failed\"' >/dev/null"
expect "its last_error says why" "$(api "$TA" GET "/v1/sandboxes/$S9"; body .last_error)" "200its execution ended on worker wa: its launcher ended"
expect "no route to a failed sandbox -> 409 not-running" "$(api "$TA" POST "/v1/sandboxes/$S9/route" '{}'; body .error)" "409not-running"
expect "resume of a failed sandbox: a new generation (I2)" "$(api "$TA" POST "/v1/sandboxes/$S9/resume" '{}'; body '.state + " " + (.generation|tostring)')" "200running 2"
n9=$(grep -c "event=execution-ended worker=wa sandbox=$S9 generation=1 outcome=ignored-not-current" "$CP_LOG")
stop_worker wa; start_worker wa --say "$W/say-wa"
wait_for "the same report once more (after a reconnect) is seen" sh -c "[ \$(grep -c 'event=execution-ended worker=wa sandbox=$S9 generation=1 outcome=ignored-not-current' '$CP_LOG') -gt $n9 ]"
expect "and leaves the new generation running" "$(api "$TA" GET "/v1/sandboxes/$S9"; body '.state + " " + (.generation|tostring)')" "200running 2"
printf '%s\n' '{"ended":{"identity":{"sandbox":"x"}}}' >"$W/say-bad"
stop_worker wb; start_worker wb --say "$W/say-bad"
wait_for "a malformed report closes that channel" grep -q "event=channel-malformed worker=wb" "$CP_LOG"
stop_worker wb; start_worker wb
expect "the worker connects again and is placed on" "$(api "$TA" POST /v1/sandboxes '{"worker":"wb"}')" 201
api "$TA" DELETE "/v1/sandboxes/$(body .id)" >/dev/null

# ---- a start of the same generation again that its worker cannot make: a new generation (I2) ----
# A resume of a sandbox in error activates its generation again under a new activation; a worker
# that answers that no such execution runs there (not-running, deactivated) gets a new generation
# instead. Any other refusal is reported and changes nothing.
register wf
start_worker wf --refuse install --refuse-code not-running --refuse-count 2
expect "create on a worker that refuses its install -> 502" "$(api "$TA" POST /v1/sandboxes '{"worker":"wf"}')" 502
S10=$(api "$TA" GET /v1/sandboxes >/dev/null; jq -r '[.sandboxes[] | select(.worker == "wf")][0].id' "$W/body")
expect "it is in error, generation 1" "$(api "$TA" GET "/v1/sandboxes/$S10"; body '.state + " " + (.generation|tostring)')" "200error 1"
expect "resume: generation 1 is not running there, so generation 2 starts" \
	"$(api "$TA" POST "/v1/sandboxes/$S10/resume" '{}'; body '.state + " " + (.generation|tostring)')" "200running 2"
grep -q "event=start-again-refused sandbox=$S10 worker=wf code=not-running next=new-generation" "$CP_LOG" &&
	ok "the control plane logged why it started a new generation" || fail "no start-again-refused for $S10"
expect "wf saw generation 1 under two activations, then generation 2" \
	"$(jq -r "select(.type == \"install\" and .identity.sandbox == \"$S10\") | (.identity.generation|tostring) + \":\" + .identity.activation" "$W/wf.log" | awk -F: '{print $1}' | tr '\n' ' ')" "1 1 2 "
stop_worker wf
start_worker wf --refuse install --refuse-code io --refuse-count 2
expect "create on a worker that fails its install -> 502" "$(api "$TA" POST /v1/sandboxes '{"worker":"wf"}')" 502
S11=$(api "$TA" GET /v1/sandboxes >/dev/null; jq -r "[.sandboxes[] | select(.worker == \"wf\" and .id != \"$S10\")][0].id" "$W/body")
expect "resume refused for another reason: reported, no new generation" \
	"$(api "$TA" POST "/v1/sandboxes/$S11/resume" '{}'; body '.worker_code')" "502io"
expect "the sandbox stays in error at generation 1" "$(api "$TA" GET "/v1/sandboxes/$S11"; body '.state + " " + (.generation|tostring)')" "200error 1"
api "$TA" DELETE "/v1/sandboxes/$S10" >/dev/null; api "$TA" DELETE "/v1/sandboxes/$S11" >/dev/null
stop_worker wf

# ---- restart policy on-failure: a failed sandbox is resumed by itself, a bounded number of times ----
expect "restart must be never or on-failure" "$(api "$TA" POST /v1/sandboxes '{"restart":"always"}'; body .error)" "400bad-request"
expect "create with restart on-failure" "$(api "$TA" POST /v1/sandboxes '{"worker":"wa","restart":"on-failure"}'; body .restart)" "201on-failure"
S12=$(body .id)
rs_state() { api "$TA" GET "/v1/sandboxes/$S12" >/dev/null; body '.state + " " + (.generation|tostring) + " " + (.restarts|tostring)'; }
# each round: wa reports the current execution ended; the control plane marks it failed and,
# a second later, resumes it as the next generation; the sixth failure within 10 minutes is left
for round in 1 2 3 4 5 6; do
	api "$TA" GET "/v1/sandboxes/$S12" >/dev/null
	ended_line "$(jq -c .route "$W/body")" "round $round" >"$W/say-wa"
	stop_worker wa; start_worker wa --say "$W/say-wa"
	if [ $round -le 5 ]; then
		want="running $((round + 1)) $round"
		WAIT_SECONDS=30 wait_for "failure $round: restarted as generation $((round + 1))" sh -c "[ \"\$(curl -s -H 'Authorization: Bearer $TA' $CP_URL/v1/sandboxes/$S12 | jq -r '.state + \" \" + (.generation|tostring) + \" \" + (.restarts|tostring)')\" = '$want' ]" ||
			{ echo "  state: $(rs_state)"; grep "sandbox=$S12" "$CP_LOG" | tail -n 5; }
	fi
done
WAIT_SECONDS=20 wait_for "failure 6 within 10 minutes: left failed, and it says so" sh -c "curl -s -H 'Authorization: Bearer $TA' $CP_URL/v1/sandboxes/$S12 | jq -e '.state == \"failed\" and (.last_error | test(\"restarted 5 times within 600 s: left failed\"))' >/dev/null"
sleep 2.5
expect "and stays failed (no more restarts)" "$(rs_state)" "failed 6 5"
expect "a resume by hand starts it again" "$(api "$TA" POST "/v1/sandboxes/$S12/resume" '{}'; body '.state + " " + (.generation|tostring)')" "200running 7"
api "$TA" DELETE "/v1/sandboxes/$S12" >/dev/null

# ---- placement's per-worker counts and the quotas' per-tenant ones (worker_usage, tenant_usage,
# kept by triggers; on PostgreSQL with the changes appended beside them until the reaper adds them
# in, about once a second) agree with the sandboxes' rows ----
if [ -z "$CP_DB" ]; then
	store_sql() { sqlite3 -cmd ".timeout 5000" "$W/cp/cp.db" "$1"; }
	W_KEPT=worker_usage T_KEPT=tenant_usage
else
	store_sql() { psql "$CP_DB" -q -At -c "$1"; }
	# what a create reads: the counts with the changes not yet added in
	W_KEPT="(SELECT worker, SUM(sandboxes) AS sandboxes, SUM(memory_bytes) AS memory_bytes, SUM(pids) AS pids FROM (SELECT worker, sandboxes, memory_bytes, pids FROM worker_usage UNION ALL SELECT worker, sandboxes, memory_bytes, pids FROM worker_usage_delta) d GROUP BY worker) u"
	T_KEPT="(SELECT tenant, SUM(sandboxes) AS sandboxes, SUM(memory_bytes) AS memory_bytes, SUM(disk_bytes) AS disk_bytes, SUM(pids) AS pids FROM (SELECT tenant, sandboxes, memory_bytes, disk_bytes, pids FROM tenant_usage UNION ALL SELECT tenant, sandboxes, memory_bytes, disk_bytes, pids FROM tenant_usage_delta) d GROUP BY tenant) u"
fi
usage_compare() { # WHAT WORKER_RELATION TENANT_RELATION: both hold exactly the rows' counts and sums
	kept=$(store_sql "SELECT worker || ':' || sandboxes || ':' || memory_bytes || ':' || pids FROM $2 WHERE sandboxes <> 0 OR memory_bytes <> 0 OR pids <> 0 ORDER BY worker")
	rows=$(store_sql "SELECT worker || ':' || COUNT(*) || ':' || SUM(memory_bytes) || ':' || SUM(pids) FROM sandboxes WHERE deleted = 0 AND worker IS NOT NULL AND state IN ('starting','running','paused','moving') GROUP BY worker ORDER BY worker")
	if [ -n "$rows" ] && [ "$kept" = "$rows" ]; then ok "$1: placement's counts per worker are the live rows' ($(echo $rows))"; else fail "$1: worker counts [$(echo $kept)] but the rows say [$(echo $rows)]"; fi
	kept=$(store_sql "SELECT tenant || ':' || sandboxes || ':' || memory_bytes || ':' || disk_bytes || ':' || pids FROM $3 WHERE sandboxes <> 0 OR memory_bytes <> 0 OR disk_bytes <> 0 OR pids <> 0 ORDER BY tenant")
	rows=$(store_sql "SELECT tenant || ':' || COUNT(*) || ':' || SUM(memory_bytes) || ':' || SUM(disk_bytes) || ':' || SUM(pids) FROM sandboxes WHERE deleted = 0 GROUP BY tenant ORDER BY tenant")
	if [ -n "$rows" ] && [ "$kept" = "$rows" ]; then ok "$1: the quotas' counts per tenant are the rows' ($(echo "$rows" | wc -l) tenants)"; else fail "$1: tenant counts [$(echo $kept)] but the rows say [$(echo $rows)]"; fi
}
usage_agrees() { # WHAT: after WHAT, the counts are exactly the rows'
	usage_compare "$1" "$W_KEPT" "$T_KEPT"
	[ -n "$CP_DB" ] || return 0
	# and once the reaper added the changes in, the counters alone
	folded() { [ "$(store_sql "SELECT (SELECT COUNT(*) FROM worker_usage_delta) + (SELECT COUNT(*) FROM tenant_usage_delta)")" = 0 ]; }
	WAIT_SECONDS=10 wait_for "$1: the changes were added into the counters" folded
	usage_compare "$1, added in" worker_usage tenant_usage
}
usage_agrees "creates, moves, pauses, resumes, failures, restarts and deletes"

# ---- restart keeps state (kill -9, then start again) ----
api "$TA" GET /v1/sandboxes >/dev/null; jq -S '[.sandboxes[] | {id, state, generation, route}]' "$W/body" >"$W/before.json"
# a count gone wrong is counted again from the rows at the next start
store_sql "UPDATE worker_usage SET sandboxes = sandboxes + 1000" >/dev/null
store_sql "UPDATE tenant_usage SET memory_bytes = 0" >/dev/null
kill -9 "$CP_PID"; wait "$CP_PID" 2>/dev/null || true
start_cp cp
usage_agrees "a count gone wrong, then a restart (counted again at start)"
api "$TA" GET /v1/sandboxes >/dev/null; jq -S '[.sandboxes[] | {id, state, generation, route}]' "$W/body" >"$W/after.json"
cmp -s "$W/before.json" "$W/after.json" && ok "sandboxes, generations and routes survive kill -9" || fail "state changed across restart"
# the fake workers reconnect to the new port only if it is the same: re-point them
for w in wa wb; do stop_worker $w; start_worker $w; done
expect "the signing key survives the restart" "$(api "$TA" POST "/v1/sandboxes/$S1/route" '{}'; "$CAPCHECK" "$W/bundle2.json" "$W/body" | jq -r .kid)" "200$NEW_KID"
expect "lifecycle works after restart" "$(api "$TA" POST "/v1/sandboxes/$S1/move" '{"to":"wa"}'; body '(.generation|tostring) + " " + .worker')" "2005 wa"

# ---- spacectl, the client side (DESIGN.md section 5 forms) ----
SC=$SPACED_BUILD/spacectl/spacectl
if SPACED_CP_URL= SPACED_API_KEY= "$SC" ls 2>"$W/sc.err"; then fail "spacectl without SPACED_CP_URL"; else ok "spacectl says what is missing: $(cat "$W/sc.err")"; fi
export SPACED_CP_URL="$CP_URL" SPACED_API_KEY="$TA"
expect "spacectl workers --json" "$("$SC" workers --json | jq -r '[.[] | select(.id == "wa" or .id == "wb") | .id + ":" + .state] | join(",")')" "wa:live,wb:live"
X=$("$SC" create --worker wa)
expect "spacectl create prints the ID" "$(echo "$X" | grep -c '^sbx-')" 1
expect "spacectl inspect --json" "$("$SC" inspect "$X" --json | jq -r '.state + " " + .route.sandbox + " " + (.route.generation|tostring) + " " + .route.worker')" "running $X 1 wa"
"$SC" route "$X" --purpose exec --purpose fs.write --json >"$W/route-sc.json"
expect "spacectl route --json verifies" "$("$CAPCHECK" "$W/bundle2.json" "$W/route-sc.json" | jq -c .purposes)" '["fs.write","exec"]'
"$SC" route "$X" --purpose serviceport --port 5432 --protocol tcp --json >"$W/route-sc2.json"
expect "spacectl serviceport route" "$("$CAPCHECK" "$W/bundle2.json" "$W/route-sc2.json" | jq -r '(.port|tostring) + "/" + .protocol')" "5432/tcp"
"$SC" move "$X" --to wb >/dev/null
expect "spacectl move: visible in inspect" "$("$SC" inspect "$X" --json | jq -r '(.route.generation|tostring) + " " + .route.worker')" "2 wb"
"$SC" pause "$X" >/dev/null
expect "spacectl pause" "$("$SC" inspect "$X" --json | jq -r '.state + " " + (.generation|tostring)')" "paused 2"
"$SC" resume "$X" --worker wa >/dev/null
expect "spacectl resume --worker: new generation there" "$("$SC" inspect "$X" --json | jq -r '.state + " " + (.generation|tostring) + " " + .worker')" "running 3 wa"
expect "spacectl ls" "$("$SC" ls | grep -c "^$X ")" 1
"$SC" rm "$X" >/dev/null
if "$SC" inspect "$X" --json 2>"$W/sc.err"; then fail "inspect after rm"; else expect "spacectl inspect after rm" "$(grep -c 'HTTP 404 not-found' "$W/sc.err")" 1; fi
SPACED_API_KEY=$TB "$SC" inspect "$S1" --json 2>"$W/sc.err" >/dev/null
expect "spacectl as tenant beta sees 404 for alpha's sandbox" "$(grep -c 'HTTP 404 not-found' "$W/sc.err")" 1

# ---- delete ----
expect "delete" "$(api "$TA" DELETE "/v1/sandboxes/$S1"; body .state)" "200deleted"
expect "deleted is gone" "$(api "$TA" GET "/v1/sandboxes/$S1")" 404
grep -q "\"type\":\"destroy\",\"sandbox\":\"$S1\"" "$W/wa.log" && ok "destroy pushed" || fail "no destroy for $S1"
expect "daemon still serving" "$(curl -s -o /dev/null -w '%{http_code}' "$CP_URL/v1/healthz")" 200

# ---- delete during a move: refused cleanly, never interleaved ----
register wf
start_worker wf --delay-ms 1500
expect "create on wa for the move tests" "$(api "$TA" POST /v1/sandboxes '{"worker":"wa"}')" 201
S7=$(body .id)
( st=$(OUT="$W/mv.body" api "$TA" POST "/v1/sandboxes/$S7/move" '{"to":"wf"}'); echo "$st" >"$W/mv.status" ) &
wait_for "the move is under way" sh -c "curl -s -H 'Authorization: Bearer $TA' $CP_URL/v1/sandboxes/$S7 | jq -e '.operation == \"move\"' >/dev/null"
expect "delete during the move -> 409 busy" "$(api "$TA" DELETE "/v1/sandboxes/$S7"; body .error)" "409busy"
wait_for "the move finished" test -s "$W/mv.status"
expect "the move completed untouched" "$(cat "$W/mv.status") $(jq -r '(.generation|tostring) + " " + .worker' "$W/mv.body")" "200 2 wf"

# ---- kill -9 of the control plane in the middle of a move, then restart ----
expect "create on wa for the crash test" "$(api "$TA" POST /v1/sandboxes '{"worker":"wa"}')" 201
S8=$(body .id)
( OUT="$W/mv2.body" api "$TA" POST "/v1/sandboxes/$S8/move" '{"to":"wf"}' >/dev/null ) &
wait_for "the new generation's install reached wf" grep -q "\"sandbox\":\"$S8\",\"generation\":2" "$W/wf.log"
kill -9 "$CP_PID"; wait "$CP_PID" 2>/dev/null || true
api_state() { API_URL=$CP_URL api "$TA" GET "/v1/sandboxes/$S8" >/dev/null; body '.state + " " + (.generation|tostring) + " " + .worker'; }
start_cp cp
expect "after the crash: one consistent state, the committed generation" "$(api_state)" "starting 2 wf"
for w in wa wb wf; do stop_worker $w; start_worker $w; done
wait_for "the interrupted move is finished by the restarted control plane" sh -c "curl -s -H 'Authorization: Bearer $TA' $CP_URL/v1/sandboxes/$S8 | jq -e '.state == \"running\" and .generation == 2 and .worker == \"wf\"' >/dev/null"
expect "wf applied generation 2 exactly once (the replay was acked again)" "$(jq -s --arg s "$S8" '[.[] | select(.type == "install" and .identity.sandbox == $s)] | length' "$W/wf.log")" 1
expect "the next move makes generation 3 (none reused)" "$(api "$TA" POST "/v1/sandboxes/$S8/move" '{"to":"wa"}'; body '(.generation|tostring) + " " + .worker')" "2003 wa"

# ---- worker identity: join tokens are single-use and bound to one worker ID; only a
# worker's own key speaks for it (its URL, heartbeat, channel) ----
REG_WX='{"id":"wx","url":"http://127.0.0.1:1/wx","substrates":["process"]}'
expect "a join token joins only its own worker ID -> 403" \
	"$(api "$JX" POST /v1/workers/join '{"id":"wa","url":"http://rogue","substrates":["process"]}')" 403
expect "a tenant key cannot join -> 401" "$(api "$TA" POST /v1/workers/join "$REG_WX")" 401
expect "a worker key cannot join another worker -> 401" "$(api "$WK_wa" POST /v1/workers/join "$REG_WX")" 401
expect "join with the token bound to wx" "$(OUT=$W/jx api "$JX" POST /v1/workers/join "$REG_WX"; jq -r '.worker_key | startswith("spk_")' "$W/jx")" 200true
WK_wx=$(jq -r .worker_key "$W/jx")
expect "a join token serves once" "$(api "$JX" POST /v1/workers/join "$REG_WX")" 401
# two joins racing with one token: exactly one wins
JY=$(admin create-join-token wy)
REG_WY='{"id":"wy","url":"http://127.0.0.1:1/wy","substrates":["process"]}'
racers=""
for i in 1 2 3 4; do (OUT=$W/race-body.$i api "$JY" POST /v1/workers/join "$REG_WY" >"$W/race.$i" 2>/dev/null) & racers="$racers $!"; done
for p in $racers; do wait "$p"; done
expect "four concurrent joins with one token: one 200" "$(cat "$W/race.1" "$W/race.2" "$W/race.3" "$W/race.4" | grep -c 200)" 1
JZ=$(admin create-join-token wz 1)
sleep 2
expect "an expired join token -> 401" "$(api "$JZ" POST /v1/workers/join '{"id":"wz","url":"http://x","substrates":["process"]}')" 401
expect "a worker key cannot move another worker's URL -> 403" \
	"$(api "$WK_wx" POST /v1/workers '{"id":"wa","url":"http://rogue","substrates":["process"]}')" 403
expect "a join token cannot move a worker's URL -> 401" \
	"$(api "$JX" POST /v1/workers '{"id":"wx","url":"http://rogue","substrates":["process"]}')" 401
expect "wa's URL is unchanged" "$(api "$TA" GET /v1/workers; body '.workers[] | select(.id=="wa") | .url')" "200http://127.0.0.1:1/wa"
expect "a worker updates its own URL" "$(api "$WK_wx" POST /v1/workers '{"id":"wx","url":"http://127.0.0.1:2/wx","substrates":["process"]}')" 200
ws_status() { # KEY WORKER: the status of a channel upgrade
	curl -s -o /dev/null -w '%{http_code}' --max-time 5 -H 'Connection: Upgrade' -H 'Upgrade: websocket' \
		-H 'Sec-WebSocket-Version: 13' -H 'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==' \
		${1:+-H "Authorization: Bearer $1"} "$CP_URL/v1/workers/$2/channel" || true
}
expect "channel refused without a key" "$(ws_status "" wa)" "$(ws_status "$TA" wa)"
expect "channel refused with another worker's key" "$(ws_status "$WK_wx" wa)" "$(ws_status "$TA" wa)"
expect "channel refused with a join token" "$(ws_status "$JY" wy)" "$(ws_status "$TA" wa)"
expect "heartbeat" "$(api "$WK_wa" POST /v1/workers/wa/heartbeat)" 200
expect "heartbeat with another worker's key -> 403" "$(api "$WK_wx" POST /v1/workers/wa/heartbeat)" 403
# revoked: the key stops working; a new join token lets the worker join again with a new key
admin revoke-worker wx
expect "a revoked worker key -> 401" "$(api "$WK_wx" POST /v1/workers/wx/heartbeat)" 401
JX2=$(admin create-join-token wx)
expect "joining again after revocation" "$(OUT=$W/jx2 api "$JX2" POST /v1/workers/join "$REG_WX")" 200
expect "the new key works" "$(api "$(jq -r .worker_key "$W/jx2")" POST /v1/workers/wx/heartbeat)" 200

usage_agrees "the whole suite"
