#!/bin/sh
# run-tests: paired, about 22 s
# TLS everywhere (issue 16, item 4), on a real cluster of `spacectl dev up`
# (its own CA; TLS on the control plane, on each worker's node-api and
# metrics listener; mutual TLS between the workers and the control plane):
#  - spacectl, the Python SDK and the TypeScript SDK end to end over TLS: a
#    route, a file round trip, an exec stream (stdin in, stdout and stderr out,
#    the exit status), with the CA of SPACED_CA_FILE;
#  - a client trusting another CA is refused (spacectl, both SDKs, curl), and so
#    is a certificate that does not name the address dialled;
#  - a plaintext client on a TLS port gets a plaintext 400 naming https:// and
#    nothing served (control plane, node-api, metrics);
#  - the store speaks TLS (tenant and worker keys travel in its requests): a
#    plaintext request gets 400, its worker endpoints want the worker's own
#    certificate, a template imported by spacectl reaches a worker over it;
#  - the worker endpoints (join, register, heartbeat, channel) refuse a worker
#    without a client certificate (401) and one with another worker's (403),
#    both by the API and by a real spaced-node whose link presents neither or
#    another's: it never joins;
#  - daemons refuse to start with neither TLS files nor --plaintext, and a key
#    file others may read;
#  - the key attacks of the hostile suites against TLS listeners
#    (tests/tls_hostile.py): a slowloris that never sends a ClientHello, bounded
#    by the head deadline and the per-address budget while a victim on
#    127.0.0.2 is served; garbage instead of a ClientHello; half a ClientHello;
#    a client that stalls mid-handshake.
# Traffic to 127.0.0.x only; every wait bounded; nothing timed.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
SC=$SPACED_BUILD/spacectl/spacectl
NODE=$SPACED_BUILD/spaced-node/spaced-node
for b in "$SC" "$NODE" "$SPACED_BUILD/spaced-guest/spaced-guest" "$CP"; do
	[ -x "$b" ] || { echo "$b is not built"; exit 77; }
done
command -v python3 >/dev/null 2>&1 || { echo "python3 is not installed"; exit 77; }
python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.2", 0))' 2>/dev/null ||
	{ echo "127.0.0.2 is not a local address here"; exit 77; }
W=$(mktemp -d)
D=$W/cluster
export SPACED_ROUTE_CACHE="$W/routes"
trap 'cleanup; "$SC" dev down --dir "$D" >/dev/null 2>&1; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT

# ---- daemons without TLS files or --plaintext ----
"$CP" admin --state "$W/nocp" create-tenant x >/dev/null 2>&1
timeout 20 "$CP" --state "$W/nocp" --listen 127.0.0.1:0 >"$W/nocp.out" 2>&1
rc=$?
expect "spaced-cp with neither TLS files nor --plaintext refuses to start" "$rc" 2
grep -q "give --tls-cert FILE --tls-key FILE" "$W/nocp.out" && ok "and says which options" || { cat "$W/nocp.out"; fail "no clear message"; }
timeout 20 "$NODE" --state "$W/nonode" --worker-id w --listen 127.0.0.1:0 >"$W/nonode.out" 2>&1
expect "spaced-node with neither refuses to start" "$?" 2
grep -q "or --plaintext" "$W/nonode.out" && ok "and says which options" || { cat "$W/nonode.out"; fail "no clear message"; }
timeout 20 "$NODE" --state "$W/nonode" --worker-id w --listen 127.0.0.1:0 --plaintext --cp http://127.0.0.1:1 --tls-ca /dev/null \
	>"$W/nonode2.out" 2>&1
expect "spaced-node: TLS client options without an https:// control plane are refused" "$?" 2

# ---- a cluster over TLS ----
if ! "$SC" dev up --workers 2 --dir "$D" >"$W/up.out" 2>"$W/up.err"; then
	cat "$W/up.err"; tail -n 20 "$D"/*.log 2>/dev/null
	echo "FAIL: dev up"; exit 1
fi
. "$D/env"
T=$D/tls
expect "dev up writes SPACED_CA_FILE into DIR/env, the cluster's own CA" "$SPACED_CA_FILE" "$T/ca.pem"
case $SPACED_CP_URL in https://127.0.0.1:*) ok "SPACED_CP_URL is https:// ($SPACED_CP_URL)" ;; *) fail "SPACED_CP_URL $SPACED_CP_URL" ;; esac
expect "the keys are the owner's alone" "$(stat -c %a "$T/ca.key" "$T/cp.key" "$T/worker-1.key" "$T/worker-1-client.key" | sort -u)" 600
"$SC" workers --json >"$W/workers.json"
expect "both workers live, registered with https:// node-api URLs (they joined with mutual TLS)" \
	"$(jq -r '[.[] | select(.state == "live") | .url | startswith("https://127.0.0.1:")] | map(tostring) | join(",")' "$W/workers.json")" "true,true"
CPPORT=${SPACED_CP_URL##*:}
NPORT=$(cat "$D/worker-1/api.port")
MPORT=$(cat "$D/worker-1/metrics.port")
openssl_ok=$(command -v openssl >/dev/null 2>&1 && echo yes)
if [ -n "$openssl_ok" ]; then
	v=$(openssl s_client -connect 127.0.0.1:"$CPPORT" -CAfile "$SPACED_CA_FILE" </dev/null 2>/dev/null | sed -n 's/^New, \(TLSv[0-9.]*\),.*/\1/p' | head -n 1)
	expect "the control plane speaks TLS 1.3" "$v" TLSv1.3
	openssl s_client -connect 127.0.0.1:"$CPPORT" -CAfile "$SPACED_CA_FILE" -tls1_1 </dev/null >/dev/null 2>&1
	[ $? -ne 0 ] && ok "TLS 1.1 is refused" || fail "TLS 1.1 was accepted"
fi

# spacectl: a route, a file round trip, an exec stream
X=$("$SC" create --worker worker-1)
[ -n "$X" ] && ok "spacectl create over TLS ($X)" || fail "spacectl create"
"$SC" route "$X" --purpose fs.read --json >"$W/route.json"
expect "the route names an https:// worker" "$(jq -r '.worker_url | startswith("https://127.0.0.1:")' "$W/route.json")" true
head -c 300000 /dev/urandom >"$W/blob"
"$SC" fs write "$X" /workspace/blob <"$W/blob" && "$SC" fs read "$X" /workspace/blob >"$W/blob.back"
cmp -s "$W/blob" "$W/blob.back" && ok "spacectl: a 300 KB file round trip, byte for byte" || fail "spacectl: the file came back different"
out=$(printf 'in-through-tls\n' | "$SC" exec "$X" -- sh -c 'cat; echo to-err >&2; exit 7' 2>"$W/exec.err")
rc=$?
expect "spacectl exec: stdin in, stdout out" "$out" "in-through-tls"
expect "spacectl exec: stderr and the exit status" "$(cat "$W/exec.err"):$rc" "to-err:7"
n=$("$SC" exec "$X" -- sh -c 'head -c 5000000 /dev/zero' | wc -c)
expect "spacectl exec: 5 MB streamed out" "$n" 5000000

# the Python SDK
cat >"$W/sdk.py" <<'PY'
import sys, spaced
ok = True
with spaced.Sandbox.create() as sbx:
    data = bytes(range(256)) * 1000
    sbx.files.write("/workspace/py.bin", data)
    ok &= sbx.files.read("/workspace/py.bin") == data
    out = []
    r = sbx.commands.run("cat; echo py-err >&2; exit 5", stdin=b"py-in\n", on_stdout=out.append)
    ok &= (r.exit_code, r.stdout, r.stderr) == (5, "py-in\n", "py-err\n") and "".join(out) == "py-in\n"
print("python-sdk-ok" if ok else "python-sdk-wrong")
PY
PYTHONPATH=$SPACED_TOP/sdk/python timeout 120 python3 "$W/sdk.py" >"$W/sdk.py.out" 2>&1
expect "the Python SDK over TLS: a file round trip and an exec stream" "$(tail -n 1 "$W/sdk.py.out")" python-sdk-ok
SPACED_CA_FILE=$T/worker-1.pem PYTHONPATH=$SPACED_TOP/sdk/python timeout 60 python3 -c '
import spaced
try:
    spaced.Sandbox.list()
    print("accepted")
except spaced.SpacedError as e:
    print("refused:", e)' >"$W/sdk.py.bad" 2>&1
grep -q "^refused:.*certificate" "$W/sdk.py.bad" && ok "the Python SDK refuses a control plane its CA did not sign" ||
	{ cat "$W/sdk.py.bad"; fail "the Python SDK with another CA"; }

# the TypeScript SDK
dist=$SPACED_TOP/sdk/typescript/dist/index.js
if ! command -v node >/dev/null 2>&1; then
	echo "note: node is not installed: the TypeScript SDK part is not run"
elif [ ! -f "$dist" ]; then
	fail "the TypeScript SDK is not built (make sdk)"
else
	cat >"$W/sdk.js" <<'JS'
const { Sandbox } = require(process.env.SDK);
(async () => {
  const sbx = await Sandbox.create();
  const data = Buffer.alloc(200000, 0x5a);
  await sbx.files.write("/workspace/ts.bin", data);
  let ok = Buffer.compare(await sbx.files.read("/workspace/ts.bin"), data) === 0;
  const out = [];
  const r = await sbx.commands.run("cat; echo ts-err >&2; exit 6", { stdin: "ts-in\n", onStdout: (d) => out.push(String(d)) });
  ok = ok && r.exitCode === 6 && r.stdout === "ts-in\n" && r.stderr === "ts-err\n" && out.join("") === "ts-in\n";
  await sbx.kill();
  console.log(ok ? "ts-sdk-ok" : `ts-sdk-wrong ${JSON.stringify(r)}`);
  process.exit(0);
})().catch((e) => { console.log(`ts-sdk-error ${e}`); process.exit(1); });
JS
	SDK=$dist timeout 120 node "$W/sdk.js" >"$W/sdk.js.out" 2>&1
	expect "the TypeScript SDK over TLS: a file round trip and an exec stream" "$(tail -n 1 "$W/sdk.js.out")" ts-sdk-ok
	SPACED_CA_FILE=$T/worker-1.pem SDK=$dist timeout 60 node -e '
const { Sandbox } = require(process.env.SDK);
Sandbox.list().then(() => console.log("accepted"), (e) => console.log("refused: " + e.message));' >"$W/sdk.js.bad" 2>&1
	grep -q "^refused:.*certificate" "$W/sdk.js.bad" && ok "the TypeScript SDK refuses a control plane its CA did not sign" ||
		{ cat "$W/sdk.js.bad"; fail "the TypeScript SDK with another CA"; }
fi

# ---- refusals: another CA, another name, plaintext ----
"$SC" dev certs --dir "$W/other" --workers 1 >/dev/null
OTHER=$W/other/tls/ca.pem
SPACED_CA_FILE=$OTHER "$SC" workers >"$W/other.out" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "certificate is refused" "$W/other.out" && ok "spacectl refuses a control plane of another CA" ||
	{ cat "$W/other.out"; fail "spacectl trusting another CA (exit $rc)"; }
SPACED_CA_FILE=$OTHER "$SC" fs read --route "$W/route.json" "$X" /workspace/blob >/dev/null 2>"$W/other2.out"
[ $? -ne 0 ] && grep -q "certificate is refused" "$W/other2.out" && ok "spacectl refuses a worker of another CA" ||
	{ cat "$W/other2.out"; fail "spacectl read from a worker trusting another CA"; }
curl -s -o /dev/null --cacert "$OTHER" "$SPACED_CP_URL/v1/healthz"
expect "curl trusting another CA: certificate refused (60)" "$?" 60
# the worker's certificate names 127.0.0.1 and localhost, not 127.0.0.2
curl -s -o /dev/null --cacert "$SPACED_CA_FILE" --resolve "elsewhere.test:$NPORT:127.0.0.1" "https://elsewhere.test:$NPORT/"
expect "a certificate that does not name the host dialled is refused (60)" "$?" 60
expect "by its name it is accepted" \
	"$(curl -s -o /dev/null -w '%{http_code}' --cacert "$SPACED_CA_FILE" "https://localhost:$NPORT/v1/sandboxes/$X/stat?path=/")" 401
for p in "$CPPORT:control plane" "$NPORT:node-api" "$MPORT:metrics listener"; do
	st=$(curl -s -o "$W/plain.body" -w '%{http_code}' "http://127.0.0.1:${p%%:*}/v1/healthz")
	expect "a plaintext request to the ${p#*:}: 400" "$st" 400
	grep -q '"tls-required"' "$W/plain.body" && ok "naming https://" || fail "plaintext answer: $(cat "$W/plain.body")"
done
expect "the metrics answer over TLS" \
	"$(curl -s -o /dev/null -w '%{http_code}' --cacert "$SPACED_CA_FILE" "https://127.0.0.1:$MPORT/metrics")" 200

# ---- mutual TLS on the worker endpoints ----
K1=$(cat "$D/worker-1/worker.key")
c1="--cert $T/worker-1-client.pem --key $T/worker-1-client.key"
c2="--cert $T/worker-2-client.pem --key $T/worker-2-client.key"
# wapi CERTOPTS KEY METHOD PATH [BODY] — status of a worker call
wapi() {
	certs=$1 key=$2 method=$3 path=$4
	# shellcheck disable=SC2086
	curl -s -o "$W/body" -w '%{http_code}' --cacert "$SPACED_CA_FILE" $certs -H "Authorization: Bearer $key" \
		-X "$method" -H 'content-type: application/json' ${5:+--data-binary "$5"} "$SPACED_CP_URL$path"
}
expect "heartbeat with the worker key, no client certificate: 401" "$(wapi "" "$K1" POST /v1/workers/worker-1/heartbeat)" 401
expect "heartbeat with another worker's certificate: 403" "$(wapi "$c2" "$K1" POST /v1/workers/worker-1/heartbeat)" 403
expect "heartbeat with its own certificate: 200" "$(wapi "$c1" "$K1" POST /v1/workers/worker-1/heartbeat)" 200
REG='{"id":"worker-1","url":"https://127.0.0.1:1","capacity":8,"substrates":["process"]}'
expect "register without a client certificate: 401" "$(wapi "" "$K1" POST /v1/workers "$REG")" 401
expect "register with another worker's certificate: 403" "$(wapi "$c2" "$K1" POST /v1/workers "$REG")" 403
JT=$("$CP" admin --state "$D/cp" create-join-token worker-2 2>/dev/null)
JOIN='{"id":"worker-2","url":"https://127.0.0.1:1","capacity":8,"substrates":["process"]}'
expect "join without a client certificate: 401" "$(wapi "" "$JT" POST /v1/workers/join "$JOIN")" 401
expect "join with another worker's certificate: 403" "$(wapi "$c1" "$JT" POST /v1/workers/join "$JOIN")" 403
# chupg CERTOPTS — the channel's WebSocket upgrade for worker-1 with its key
chupg() {
	# shellcheck disable=SC2086
	curl -s -o /dev/null -w '%{http_code}' --max-time 5 --cacert "$SPACED_CA_FILE" $1 -H "Authorization: Bearer $K1" \
		-H 'Connection: Upgrade' -H 'Upgrade: websocket' -H 'Sec-WebSocket-Version: 13' \
		-H 'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==' "$SPACED_CP_URL/v1/workers/worker-1/channel"
}
expect "the channel without a client certificate: 401" "$(chupg "")" 401
expect "the channel with another worker's certificate: 403" "$(chupg "$c2")" 403
# the store (templates and snapshots): keys travel in its requests, so it is TLS too, and its
# worker endpoints take the worker's certificate as the API's do
SPORT=$(cat "$D/cp/store.port")
st=$(curl -s -o "$W/plain.body" -w '%{http_code}' "http://127.0.0.1:$SPORT/v1/blobs/templates/x")
expect "a plaintext request to the store: 400 tls-required" "$st $(jq -r .error "$W/plain.body" 2>/dev/null)" "400 tls-required"
sapi() { # CERTOPTS — a worker's GET of a blob that does not exist, with worker-1's key
	# shellcheck disable=SC2086
	curl -s -o /dev/null -w '%{http_code}' --cacert "$SPACED_CA_FILE" $1 -H "Authorization: Bearer $K1" \
		"https://127.0.0.1:$SPORT/v1/blobs/snapshots/none-such"
}
expect "the store, worker key without a client certificate: 401" "$(sapi "")" 401
expect "the store, worker key with another worker's certificate: 403" "$(sapi "$c2")" 403
expect "the store, worker key with its own certificate: past the checks (404: no such blob)" "$(sapi "$c1")" 404
# a small root: cat and the libraries it and the guest need (tests/mk_rootfs.py)
python3 "$SPACED_TOP/tests/mk_rootfs.py" tarball "$W/tiny.tar" --bin /usr/bin/cat \
	--libs-of "$SPACED_BUILD/spaced-guest/spaced-guest" --file etc/tls-marker=tls || fail "mk_rootfs"
expect "spacectl template import through the store over TLS" \
	"$("$SC" template import tlstiny "$W/tiny.tar" >/dev/null 2>"$W/ti.err" && echo imported || cat "$W/ti.err")" imported
TX=$("$SC" create --template tlstiny 2>"$W/tc.err")
expect "a worker fetches it over TLS (mutual): a sandbox from it sees its file" \
	"$("$SC" exec "$TX" -- cat /etc/tls-marker 2>&1)" tls
"$SC" workers --json >"$W/workers2.json"
expect "the real workers stay live through it" "$(jq -r '[.[] | select(.state == "live")] | length' "$W/workers2.json")" 2

# a real spaced-node whose link presents no client certificate, or another worker's: it never joins
"$CP" admin --state "$D/cp" create-join-token worker-3 >"$W/w3.join" 2>/dev/null
for how in none other; do
	st=$W/w3-$how
	mkdir -p "$st"
	cp "$W/w3.join" "$st/join"
	set -- --tls-ca "$SPACED_CA_FILE"
	[ $how = other ] && set -- "$@" --tls-client-cert "$T/worker-1-client.pem" --tls-client-key "$T/worker-1-client.key"
	"$NODE" --state "$st" --worker-id worker-3 --listen 127.0.0.1:0 --guest-bin "$SPACED_BUILD/spaced-guest/spaced-guest" \
		--tls-cert "$T/worker-2.pem" --tls-key "$T/worker-2.key" --cp "$SPACED_CP_URL" --join-token-file "$st/join" \
		"$@" >"$st.log" 2>&1 &
	npid=$!
	PIDS="$PIDS $npid"
	want=401
	[ $how = other ] && want=403
	WAIT_SECONDS=30 wait_for "a worker-3 link with $how client certificate is refused ($want)" \
		grep -q "joining was refused ($want" "$st.log"
	[ -e "$st/worker.key" ] && fail "worker-3 got a worker key" || ok "worker-3 got no worker key"
	kill "$npid" 2>/dev/null
	wait "$npid" 2>/dev/null
done
"$SC" workers --json >"$W/workers3.json"
expect "worker-3 is not registered" "$(jq -r '[.[] | select(.id == "worker-3")] | length' "$W/workers3.json")" 0

# a key file others may read is refused
cp "$T/cp.key" "$W/open.key"
chmod 644 "$W/open.key"
timeout 20 "$CP" --state "$W/nocp" --listen 127.0.0.1:0 --tls-cert "$T/cp.pem" --tls-key "$W/open.key" >"$W/openkey.out" 2>&1
expect "spaced-cp refuses a TLS key others may read" "$?" 2
grep -q "only its owner can read" "$W/openkey.out" && ok "and says so" || { cat "$W/openkey.out"; fail "no message"; }

# ---- the hostile suites' key attacks, over TLS ----
# a second control plane (the cluster's certificate) with a short head deadline and a small budget
mkdir -p "$W/cp"
start_cp_tls() {
	rm -f "$W/cp/cp.port"
	"$CP" --state "$W/cp" --listen 127.0.0.1:0 --tls-cert "$T/cp.pem" --tls-key "$T/cp.key" --tls-client-ca "$T/ca.pem" \
		--head-timeout 1500 --max-conns-per-ip 20 >>"$W/cp.log" 2>&1 &
	CP_PID=$!
	PIDS="$PIDS $CP_PID"
	i=0
	while [ ! -s "$W/cp/cp.port" ]; do
		i=$((i + 1)); [ $i -lt 300 ] || { cat "$W/cp.log"; fail "the TLS control plane did not start"; return 1; }
		sleep 0.05
	done
}
admin create-tenant hostile >/dev/null
start_cp_tls
HP=$(cat "$W/cp/cp.port")
timeout 300 python3 "$SPACED_TOP/tests/tls_hostile.py" budget "$HP" "$SPACED_CA_FILE" 20
expect "slowloris before the handshake: bounded by the head deadline and the per-address budget" "$?" 0
timeout 300 python3 "$SPACED_TOP/tests/tls_hostile.py" handshakes "$HP" "$SPACED_CA_FILE"
expect "garbage, half a ClientHello, a stalled handshake: the control plane" "$?" 0
kill -0 "$CP_PID" 2>/dev/null && ok "that control plane is alive" || fail "that control plane died"
# node-api (head deadline 10 s)
timeout 300 python3 "$SPACED_TOP/tests/tls_hostile.py" handshakes "$NPORT" "$SPACED_CA_FILE"
expect "garbage, half a ClientHello, a stalled handshake: node-api" "$?" 0
expect "node-api serves after it all" "$("$SC" fs read "$X" /workspace/blob | cmp -s - "$W/blob" && echo same)" same

# ---- spacectl: a TLS server that closes without close_notify (an answer framed by the close;
# spaced's servers do so on an abort or a send timeout, proxies often) ends the answer, not a
# "connection reset" (spacectl's own socket BIO tells OpenSSL where the stream ended) ----
if [ -n "$openssl_ok" ]; then
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$W/nc.key" -out "$W/nc.pem" \
		-days 1 -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 >/dev/null 2>&1
	cat >"$W/noclose.py" <<'PY'
import socket, ssl, sys
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(1)
ls.settimeout(30)
print(ls.getsockname()[1], flush=True)
c, _ = ls.accept()
s = ctx.wrap_socket(c, server_side=True)
s.recv(65536)
s.sendall(b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n'
          b'{"workers":[{"id":"w-noclose","url":"https://127.0.0.1:1","connected":true}]}\n')
socket.socket(fileno=s.detach()).close()  # the TCP close alone
PY
	python3 "$W/noclose.py" "$W/nc.pem" "$W/nc.key" >"$W/nc.port" 2>"$W/nc.err" &
	NC_PID=$!
	i=0; while [ ! -s "$W/nc.port" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
	got=$(SPACED_CA_FILE="$W/nc.pem" SPACED_CP_URL="https://127.0.0.1:$(cat "$W/nc.port")" "$SC" workers --json 2>&1)
	expect "an answer ended by a TCP close without close_notify is read whole" \
		"$(printf '%s' "$got" | grep -c 'w-noclose')" 1
	wait "$NC_PID"
fi
grep -q "AddressSanitizer\|runtime error" "$W/cp.log" "$D"/*.log && fail "a sanitizer report in a daemon's log" || ok "no sanitizer report"

if [ "$FAILS" -ne 0 ]; then
	for f in "$D"/*.log "$W/cp.log"; do [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }; done
fi
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
