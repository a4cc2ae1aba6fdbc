#!/bin/sh
# cp_bench.sh BUILD [ROUTES] [MOVES] — starts spaced-cp (SQLite, or $CP_DB) with two
# cp-fake-worker peers in a temporary directory and runs bench-cp against them.
set -eu
build=$(cd "$1" && pwd)
W=$(mktemp -d)
chmod 755 "$W"
pids=""
trap 'for p in $pids; do kill $p 2>/dev/null || true; done; rm -rf "$W"' EXIT
cp=$build/spaced-cp/spaced-cp
db=${CP_DB:-}
TK=$("$cp" admin --state "$W/cp" ${db:+--db "$db"} create-tenant bench 2>/dev/null)
"$cp" --state "$W/cp" --listen 127.0.0.1:0 ${db:+--db "$db"} >"$W/cp.log" 2>&1 &
pids="$pids $!"
while [ ! -s "$W/cp/cp.port" ]; do sleep 0.05; done
url="http://127.0.0.1:$(cat "$W/cp/cp.port")"
until curl -s -o /dev/null "$url/v1/healthz"; do sleep 0.05; done
for w in wa wb; do
	jt=$("$cp" admin --state "$W/cp" ${db:+--db "$db"} create-join-token $w 2>/dev/null)
	wk=$(curl -s -H "Authorization: Bearer $jt" -d "{\"id\":\"$w\",\"url\":\"http://127.0.0.1:1\",\"substrates\":[\"process\"]}" \
		"$url/v1/workers/join" | sed -n 's/.*"worker_key":"\([^"]*\)".*/\1/p')
	"$build/tests/cp-fake-worker" --url "ws://127.0.0.1:$(cat "$W/cp/cp.port")" --worker $w --key "$wk" \
		--state "$W/$w.state" --log "$W/$w.log" 2>/dev/null &
	pids="$pids $!"
	while [ ! -s "$W/$w.log" ]; do sleep 0.05; done
done
id=$(curl -s -H "Authorization: Bearer $TK" -d '{"worker":"wa"}' "$url/v1/sandboxes" | sed -n 's/^{"id":"\([^"]*\)".*/\1/p')
echo "spaced-cp ($build, store: $(curl -s "$url/v1/healthz" | sed -n 's/.*"store":"\([a-z]*\)".*/\1/p')), sandbox $id"
"$build/bench/bench-cp" "$url" "$TK" "$id" wa wb "$W/wa.log" "$W/wb.log" "${2:-500}" "${3:-20}"
