#!/bin/sh
# run-tests: paired, about 2 s
# spacectl node … against a real spaced-node: installs, at-most-once seq,
# deactivation, key bundles, and an HTTP request refused or served on the
# strength of what the admin socket installed (R3, T1, C2).
#   env: SPACED_BUILD (absolute build dir), SPACED_TOP (repo root)
set -u
build=${SPACED_BUILD:?SPACED_BUILD is not set}
ctl="$build/spacectl/spacectl"
node="$build/spaced-node/spaced-node"
guest="$build/spaced-guest/spaced-guest"
for b in "$ctl" "$node" "$guest"; do [ -x "$b" ] || { echo "FAIL: $b not built"; exit 1; }; done
command -v python3 >/dev/null 2>&1 || { echo "python3 missing"; exit 77; }
command -v curl >/dev/null 2>&1 || { echo "curl missing"; exit 77; }

tmp=$(mktemp -d /tmp/node-t-XXXXXX)
npid=
cleanup() {
	if [ -n "$npid" ]; then
		"$ctl" node destroy --admin "$tmp/w/admin.sock" --sandbox S >/dev/null 2>&1
		kill "$npid" 2>/dev/null
		wait "$npid" 2>/dev/null
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM
fail=0
pass() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }
field() { python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print(eval("d"+sys.argv[1]))' "$1"; }

"$ctl" token keygen --json > "$tmp/key.json" || { echo "FAIL: keygen"; exit 1; }
sk=$(field '["secret"]' < "$tmp/key.json")
pk=$(field '["public"]' < "$tmp/key.json")
printf '{"version":1,"keys":[{"key":"%s","not_before":"2020-01-01T00:00:00Z","not_after":"2099-01-01T00:00:00Z"}]}\n' "$pk" > "$tmp/bundle.json"

"$node" --state "$tmp/w" --worker-id worker-a --listen 127.0.0.1:0 --keys "$tmp/bundle.json" \
	--guest-bin "$guest" --plaintext 2> "$tmp/node.log" &
npid=$!
i=0
while [ ! -S "$tmp/w/admin.sock" ] || [ ! -s "$tmp/w/api.port" ]; do
	i=$((i + 1)); [ $i -gt 500 ] && { echo "FAIL: spaced-node did not start"; cat "$tmp/node.log"; exit 1; }
	sleep 0.02
done
port=$(cat "$tmp/w/api.port")
adm="--admin $tmp/w/admin.sock"

out=$("$ctl" node install $adm --sandbox S --generation 7 --worker worker-a --seq 3) && pass "install acknowledged" || bad "install: $out"
[ "$(echo "$out" | field '["ack"]')" = 3 ] && pass "ack carries seq 3" || bad "ack: $out"
again=$("$ctl" node install $adm --sandbox S --generation 9 --worker worker-a --seq 3)
[ "$again" = "$out" ] && pass "seq 3 again: same acknowledgement" || bad "replay differs: $again"
st=$("$ctl" node status $adm)
[ "$(echo "$st" | field '["result"]["records"][0]["identity"]["generation"]')" = 7 ] && pass "replay had no effect" || bad "status: $st"
"$ctl" node install $adm --sandbox S --generation 6 --worker worker-a >/dev/null 2>&1 && bad "backwards install accepted" || pass "backwards install refused"
"$ctl" node install $adm --sandbox S --generation 8 --worker worker-b >/dev/null 2>&1 && bad "other worker accepted" || pass "other worker refused"

cap7=$("$ctl" cap issue --key "$sk" --sandbox S --generation 7 --worker worker-a --activation act-1 --purpose fs.read)
code=$(curl -s -o "$tmp/body" -w '%{http_code}' -H "Authorization: Bearer $cap7" "http://127.0.0.1:$port/v1/sandboxes/S/stat?path=/")
[ "$code" = 200 ] && pass "capability for 7 served" || bad "stat: $code $(cat "$tmp/body")"
"$ctl" node deactivate $adm --sandbox S --generation 7 --worker worker-a >/dev/null && pass "deactivated" || bad "deactivate"
code=$(curl -s -o "$tmp/body" -w '%{http_code}' -H "Authorization: Bearer $cap7" "http://127.0.0.1:$port/v1/sandboxes/S/stat?path=/")
[ "$code" = 409 ] && grep -q '"reason":"deactivated"' "$tmp/body" && pass "R3: 7 refused after its deactivation" || bad "after deactivation: $code $(cat "$tmp/body")"

"$ctl" node keys $adm "$tmp/bundle.json" >/dev/null 2>&1 && pass "same bundle version accepted" || bad "bundle v1 again"
printf '{"version":0,"keys":[]}\n' > "$tmp/old.json"
"$ctl" node keys $adm "$tmp/old.json" > "$tmp/out" 2>&1 && bad "stale bundle accepted" || { grep -q stale "$tmp/out" && pass "stale bundle refused" || bad "stale: $(cat "$tmp/out")"; }

[ $fail -eq 0 ] || exit 1
echo "all spacectl node checks passed"
