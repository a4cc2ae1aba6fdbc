#!/bin/sh
# cp_bench.sh BUILD [ROUTES] [MOVES] — starts spaced-cp (SQLite, or $CP_DB) with two
# cp-fake-worker peers in a temporary directory and runs bench-cp against them, twice in
# the same run: first without TLS (--plaintext), then with TLS on the listener and mutual
# TLS for the peers (certificates from `spacectl dev certs`). bench-cp's client opens a new
# connection per request, so a TLS route pays a whole handshake. CP_BENCH_TLS=0: plaintext only.
set -eu
build=$(cd "$1" && pwd)
W=$(mktemp -d)
chmod 755 "$W"
pids=""
trap 'for p in $pids; do kill $p 2>/dev/null || true; done; rm -rf "$W"' EXIT
cp=$build/spaced-cp/spaced-cp
db=${CP_DB:-}
# the CA, the control plane's certificate and the peers' client certificates (worker-1, worker-2)
"$build/spacectl/spacectl" dev certs --dir "$W/certs" --workers 2 >/dev/null
T=$W/certs/tls

# run MODE (plain | tls): a control plane and its two peers, then bench-cp; its JSON line to $W/MODE.json
run() {
	mode=$1
	S=$W/$mode
	mkdir -p "$S"
	if [ "$mode" = tls ]; then
		tlsopt="--tls-cert $T/cp.pem --tls-key $T/cp.key --tls-client-ca $T/ca.pem"
		scheme=https wscheme=wss
		curlopt="--cacert $T/ca.pem"
	else
		tlsopt="--plaintext" scheme=http wscheme=ws curlopt=""
	fi
	TK=$("$cp" admin --state "$S/cp" ${db:+--db "$db"} create-tenant bench 2>/dev/null)
	# the creates phase makes a few hundred sandboxes (the default quota is 50)
	"$cp" admin --state "$S/cp" ${db:+--db "$db"} set-quota bench sandboxes=0 >/dev/null
	# shellcheck disable=SC2086
	# --create-rate 0: the route loop measures the control plane, not a tenant's rate bound
	"$cp" --state "$S/cp" --listen 127.0.0.1:0 ${db:+--db "$db"} --create-rate 0 $tlsopt >"$S/cp.log" 2>&1 &
	cpid=$!
	pids="$pids $cpid"
	while [ ! -s "$S/cp/cp.port" ]; do sleep 0.05; done
	port=$(cat "$S/cp/cp.port")
	url="$scheme://127.0.0.1:$port"
	# shellcheck disable=SC2086
	until curl -s $curlopt -o /dev/null "$url/v1/healthz"; do sleep 0.05; done
	for w in worker-1 worker-2; do
		jt=$("$cp" admin --state "$S/cp" ${db:+--db "$db"} create-join-token $w 2>/dev/null)
		cert=""
		if [ "$mode" = tls ]; then
			cert="--cert $T/$w-client.pem --key $T/$w-client.key"
		fi
		# shellcheck disable=SC2086
		wk=$(curl -s $curlopt $cert -H "Authorization: Bearer $jt" \
			-d "{\"id\":\"$w\",\"url\":\"http://127.0.0.1:1\",\"substrates\":[\"process\"]}" \
			"$url/v1/workers/join" | sed -n 's/.*"worker_key":"\([^"]*\)".*/\1/p')
		fw=""
		if [ "$mode" = tls ]; then
			fw="--ca $T/ca.pem --cert $T/$w-client.pem --key-file $T/$w-client.key"
		fi
		# shellcheck disable=SC2086
		"$build/tests/cp-fake-worker" --url "$wscheme://127.0.0.1:$port" --worker $w --key "$wk" \
			--state "$S/$w.state" --log "$S/$w.log" --capacity 100000 $fw 2>/dev/null &
		pids="$pids $!"
		while [ ! -s "$S/$w.log" ]; do sleep 0.05; done
	done
	# shellcheck disable=SC2086
	id=$(curl -s $curlopt -H "Authorization: Bearer $TK" -d '{"worker":"worker-1"}' "$url/v1/sandboxes" |
		sed -n 's/^{"id":"\([^"]*\)".*/\1/p')
	# shellcheck disable=SC2086
	echo "spaced-cp ($build, store: $(curl -s $curlopt "$url/v1/healthz" | sed -n 's/.*"store":"\([a-z]*\)".*/\1/p'), $mode), sandbox $id"
	SPACED_CA_FILE=$T/ca.pem "$build/bench/bench-cp" "$url" "$TK" "$id" worker-1 worker-2 "$S/worker-1.log" "$S/worker-2.log" "${ROUTES:-500}" \
		"${MOVES:-20}" | tee "$S/out"
	tail -n 1 "$S/out" >"$W/$mode.json"
	for p in $pids; do kill "$p" 2>/dev/null || true; done
	pids=""
	sleep 0.3
}

ROUTES=${2:-500}
MOVES=${3:-20}
run plain
[ "${CP_BENCH_TLS:-1}" = 0 ] && exit 0
run tls
printf '{"plain":%s,"tls":%s}\n' "$(cat "$W/plain.json")" "$(cat "$W/tls.json")"
