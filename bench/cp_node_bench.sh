#!/bin/sh
# cp_node_bench.sh BUILD [ROUTES] [MOVES] — spaced-cp (SQLite, or $CP_DB) with two real
# spaced-node workers (development mode, real spaced-guest) reached through
# their own link (spaced-node --cp, a join token each); runs bench-cp in "poll" mode: the R4 window is the time from the
# move request to the old worker's first refusal of the old execution's capability.
set -eu
build=$(cd "$1" && pwd)
W=$(mktemp -d)
chmod 755 "$W"
pids=""
trap 'for p in $pids; do kill $p 2>/dev/null || true; done; sleep 0.5; rm -rf "$W"' EXIT
cp=$build/spaced-cp/spaced-cp
db=${CP_DB:-}
TK=$("$cp" admin --state "$W/cp" ${db:+--db "$db"} create-tenant bench 2>/dev/null)
"$cp" --state "$W/cp" --listen 127.0.0.1:0 ${db:+--db "$db"} --plaintext >"$W/cp.log" 2>&1 &
pids="$pids $!"
while [ ! -s "$W/cp/cp.port" ]; do sleep 0.05; done
port=$(cat "$W/cp/cp.port")
url="http://127.0.0.1:$port"
until curl -s -o /dev/null "$url/v1/healthz"; do sleep 0.05; done
for w in na nb; do
	mkdir -p "$W/$w"
	"$cp" admin --state "$W/cp" ${db:+--db "$db"} create-join-token $w >"$W/$w.join" 2>/dev/null
	"$build/spaced-node/spaced-node" --state "$W/$w" --worker-id $w --listen 127.0.0.1:0 \
		--guest-bin "$build/spaced-guest/spaced-guest" --cp "$url" --join-token-file "$W/$w.join" --plaintext \
		>"$W/$w.log" 2>&1 &
	pids="$pids $!"
done
until curl -s -H "Authorization: Bearer $TK" "$url/v1/workers" | grep -q '"connected":true.*"connected":true'; do sleep 0.1; done
id=$(curl -s -H "Authorization: Bearer $TK" -d '{"worker":"na"}' "$url/v1/sandboxes" | sed -n 's/^{"id":"\([^"]*\)".*/\1/p')
echo "spaced-cp + 2 spaced-node workers ($build), sandbox $id"
"$build/bench/bench-cp" "$url" "$TK" "$id" na nb - - "${2:-300}" "${3:-20}" poll
