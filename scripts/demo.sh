#!/bin/sh
# The tour of spaced on the embedded default (SQLite control plane, two
# workers on this machine): a sandbox is created, used, watched and moved to
# the other worker; a request through the stale route is refused with
# REFRESH_ROUTE and repaired by one retry; the old execution refuses the old,
# unexpired capability. Every answer shows the execution that served it.
# Usage: scripts/demo.sh [BUILD_DIR]   (run as root for the process substrate)
set -eu
build=${1:-build}
build=$(cd "$build" && pwd)
S="$build/spacectl/spacectl"
[ -x "$S" ] || { echo "demo: $S is not built (make)"; exit 1; }
D=$(mktemp -d /tmp/spaced-demo.XXXXXX)
# the route cache of this tour lives with the cluster
export SPACED_ROUTE_CACHE="$D/routes"
WATCH_PID=""
finish() {
	[ -n "$WATCH_PID" ] && kill "$WATCH_PID" 2>/dev/null || true
	"$S" dev down --dir "$D/cluster" >/dev/null 2>&1 || true
	rm -rf "$D"
}
trap finish EXIT
trap 'exit 1' INT TERM

if [ -t 1 ]; then B='\033[1m' N='\033[0m'; else B='' N=''; fi
step() { printf "\n${B}== %s${N}\n" "$*"; }
say() { printf '   %s\n' "$*"; }
# Prints a command the way a person would type it, then runs it (stderr shown too).
run() {
	line="$"
	for a in "$@"; do
		case "$a" in
		"$S") a=spacectl ;;
		"$D"/*) a=${a#"$D"/} ;;
		*" "* | *\;* | *'$'*) a="'$a'" ;;
		esac
		line="$line $a"
	done
	printf '%s\n' "$line"
	"$@" 2>&1
}

step "1. Capabilities are signed for one execution (PASETO v4.public, Ed25519): the security core in one check"
keys=$("$S" token keygen)
SK=$(echo "$keys" | sed -n 's/^secret: //p')
PK=$(echo "$keys" | sed -n 's/^public: //p')
CAP=$("$S" cap issue --key "$SK" --sandbox sbx-demo --generation 7 --worker worker-a --activation act-1 --purpose exec)
say "a capability for sandbox sbx-demo, execution 7 on worker-a, checked by a worker now serving execution 8 (R3):"
"$S" cap check --key "$PK" --purpose exec \
	--installed "sandbox=sbx-demo;generation=8;worker=worker-b;substrate=process;activation=act-2;pod_uid=" "$CAP" 2>&1 |
	sed 's/^/   /' || true

step "2. A control plane and two workers on this machine"
run "$S" dev up --workers 2 --dir "$D/cluster" | sed 's/\(SPACED_API_KEY=spk_[^_]*_\).*/\1…/'
. "$D/cluster/env"
say "every connection is TLS, verified against the cluster's own CA (SPACED_CA_FILE); the workers joined with client certificates"
run "$S" workers

step "3. A sandbox on worker-1"
printf '$ spacectl create --worker worker-1\n'
X=$("$S" create --worker worker-1)
echo "$X"
"$S" fs mkdir "$X" /workspace >/dev/null 2>&1 || true # there already on the process substrate
run "$S" ls

step "4. Write a file and read it back; -v shows the execution that served each answer"
printf '$ echo "hello from the tour" | spacectl -v fs write %s /workspace/hello.txt\n' "$X"
echo "hello from the tour" | "$S" -v fs write "$X" /workspace/hello.txt 2>&1
run "$S" -v fs read "$X" /workspace/hello.txt
run "$S" fs ls "$X" /workspace

step "5. Run a command: stdout, stderr and the exit status pass through"
run "$S" -v exec "$X" -- sh -c 'echo "running as $(id -un) in $(pwd), kernel $(uname -r)"; echo "to stderr" >&2; exit 3' ||
	say "(exit status $?)"

step "6. Watch /workspace (a WebSocket stream; another client, in the background)"
printf '$ spacectl watch %s /workspace &\n' "$X"
# another client (its own route cache), as a second terminal would be
SPACED_ROUTE_CACHE="$D/watch-routes" "$S" watch "$X" /workspace >"$D/watch.out" 2>&1 &
WATCH_PID=$!
i=0
until grep -q '^spacectl: watching' "$D/watch.out" 2>/dev/null; do
	i=$((i + 1)); [ $i -lt 200 ] || break; sleep 0.05
done
printf '$ echo notes | spacectl fs write %s /workspace/notes.txt\n' "$X"
echo notes | "$S" fs write "$X" /workspace/notes.txt
i=0
until grep -q 'notes.txt' "$D/watch.out" 2>/dev/null; do
	i=$((i + 1)); [ $i -lt 200 ] || break; sleep 0.05
done
say "the watch printed:"
sed 's/^/     /' "$D/watch.out"

step "7. Save the current route (what a client caches: identity, worker address, capability)"
printf '$ spacectl route %s --json > old-route.json\n' "$X"
"$S" route "$X" --json >"$D/old-route.json"
say "identity:   $(jq -c .identity "$D/old-route.json")"
say "worker_url: $(jq -r .worker_url "$D/old-route.json")"
say "expires_at: $(jq -r .expires_at "$D/old-route.json") (the capability lives 120 s)"

step "8. Move the sandbox to worker-2: a new execution, a strictly greater generation"
run "$S" move "$X" --to worker-2
run "$S" ls

step "9. The cached route is stale now: REFRESH_ROUTE, the route is resolved again, one retry (V2)"
say "the route cache still holds the route to generation 1 on worker-1; spacectl repairs it in place (V3, V4):"
run "$S" -v fs read "$X" /workspace/hello.txt
say "a saved route file from before the move goes the same way; the cache, which holds the newer route, is left alone (V3):"
run "$S" -v fs read --route "$D/old-route.json" "$X" /workspace/hello.txt

step "10. The old execution refuses the old capability although it has not expired (R3)"
say "now $(date -u +%Y-%m-%dT%H:%M:%SZ), the capability expires at $(jq -r .expires_at "$D/old-route.json")"
run "$S" fs read --no-retry --route "$D/old-route.json" "$X" /workspace/hello.txt || say "(exit status $?: not ALLOW)"

step "11. Meanwhile the watch was cut when worker-1 installed the deactivation and reopened through admission at worker-2 (S1, V5)"
i=0
until [ "$(grep -c '^spacectl: watching' "$D/watch.out" 2>/dev/null)" -ge 2 ]; do
	i=$((i + 1)); [ $i -lt 400 ] || break; sleep 0.05
done
printf '$ echo more | spacectl fs write %s /workspace/more.txt\n' "$X"
echo more | "$S" fs write "$X" /workspace/more.txt
i=0
until grep -q 'more.txt' "$D/watch.out" 2>/dev/null; do
	i=$((i + 1)); [ $i -lt 200 ] || break; sleep 0.05
done
say "the watch printed:"
sed 's/^/     /' "$D/watch.out"

step "12. A forged capability is denied and never retried (V1, C5)"
say "the saved route with one character of the capability's signature changed:"
jq '.capability |= (split(".") | .[2] |= (.[0:-12] + (if .[-12:-11] == "A" then "B" else "A" end) + .[-11:]) | join("."))' \
	"$D/old-route.json" >"$D/forged-route.json"
run "$S" -v fs read --route "$D/forged-route.json" "$X" /workspace/hello.txt || say "(exit status $?)"

step "13. Tear down"
kill "$WATCH_PID" 2>/dev/null || true
wait "$WATCH_PID" 2>/dev/null || true
WATCH_PID=""
run "$S" rm "$X"
run "$S" dev down --dir "$D/cluster"
printf "\n${B}done.${N}\n"
