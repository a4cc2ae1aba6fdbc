#!/bin/sh
# run-tests: paired, about 8 s
# spacectl's client side against a real cluster started by `spacectl dev up`
# (spaced-cp + two spaced-node workers, each holding its own control channel):
# operations pass stdout, stderr and exit status through; after a move a
# stale route is refused with REFRESH_ROUTE and repaired by exactly one retry
# (V2); the on-disk cache entry is replaced only while it still holds the
# refused route (V3) and keeps its expiry (V4); DENY is never retried (V1, C5)
# and drops the cache entry that was refused; a write or an exec is never sent
# twice after a transport failure while an idempotent read gets one retry on a
# fresh connection; --no-retry prints the raw outcome; a watch and a terminal cut
# by the move reopen through admission at the new worker (S1, V5) while the
# person's side stays open; dev down stops it all.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
SC=$SPACED_BUILD/spacectl/spacectl
for b in "$SC" "$SPACED_BUILD/spaced-node/spaced-node" "$SPACED_BUILD/spaced-guest/spaced-guest" "$CP"; do
	[ -x "$b" ] || { echo "$b is not built"; exit 77; }
done
command -v python3 >/dev/null 2>&1 || { echo "python3 is not installed"; exit 77; }
W=$(mktemp -d)
D=$W/cluster
export SPACED_ROUTE_CACHE="$W/routes"
WATCH=""
SINK=""
TERM_PID=""
trap '[ -n "$TERM_PID" ] && kill $TERM_PID 2>/dev/null; [ -n "$WATCH" ] && kill $WATCH 2>/dev/null; [ -n "$SINK" ] && kill $SINK 2>/dev/null; "$SC" dev down --dir "$D" >/dev/null 2>&1; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT

# dev up: a control plane and two workers, their address and key in DIR/env
if ! "$SC" dev up --workers 2 --dir "$D" >"$W/up.out" 2>"$W/up.err"; then
	cat "$W/up.err"; tail -n 20 "$D"/*.log 2>/dev/null
	echo "FAIL: dev up"; exit 1
fi
. "$D/env"
expect "dev up prints SPACED_CP_URL, SPACED_API_KEY and SPACED_CA_FILE" "$(cut -d= -f1 "$W/up.out" | tr '\n' ' ')" \
	"SPACED_CP_URL SPACED_API_KEY SPACED_CA_FILE "
expect "DIR/env holds the same" "$(grep -c "^SPACED_CP_URL=$SPACED_CP_URL\$\|^SPACED_API_KEY=$SPACED_API_KEY\$" "$D/env")" 2
"$SC" dev status --dir "$D" >"$W/status" 2>&1
expect "dev status: everything running, both workers connected" "$?:$(grep -c ' running$' "$W/status"):$(grep -c ' connected ' "$W/status")" "0:4:2"

X=$("$SC" create --worker worker-1)
expect "create on worker-1" "$("$SC" inspect "$X" --json | jq -r '.worker + " " + (.generation|tostring)')" "worker-1 1"
# the process substrate has a read-only root and /workspace; development executions a writable root
dir=/workspace
"$SC" fs stat "$X" /workspace >/dev/null 2>&1 || dir=/tmp

# ---- operations and pass-through ----
printf 'line one\nline two\n' | "$SC" fs write "$X" $dir/a.txt
expect "fs write then fs read: the same bytes" "$("$SC" fs read "$X" $dir/a.txt | od -An -c | tr -s ' ')" \
	"$(printf 'line one\nline two\n' | od -An -c | tr -s ' ')"
"$SC" exec "$X" -- sh -c 'echo out; echo err >&2; exit 7' >"$W/o" 2>"$W/e"
expect "exec: exit status passes through" "$?" 7
expect "exec: stdout passes through" "$(cat "$W/o")" "out"
expect "exec: stderr passes through" "$(cat "$W/e")" "err"
expect "exec --env --cwd" "$("$SC" exec "$X" --env GREETING=hi --cwd $dir -- sh -c 'echo $GREETING $(pwd)')" "hi $dir"
"$SC" fs mkdir "$X" $dir/d/e
"$SC" fs mv "$X" $dir/a.txt $dir/d/b.txt
expect "fs mkdir, mv, ls" "$("$SC" fs ls "$X" $dir/d | awk '{print $1, $NF}' | sort | tr '\n' ' ')" "dir e file b.txt "
# names the sandbox chooses: a newline, an escape sequence, a backslash — printed escaped, one line
# each (before, a name could forge an entry or write escape sequences to the user's terminal)
"$SC" exec "$X" -- python3 -c "
for n in ('nl\nfile forged', 'esc\x1b[31mred', 'back\\\\slash'): open('$dir/d/e/' + n, 'w').close()"
"$SC" fs ls "$X" $dir/d/e >"$W/ls.out"
expect "fs ls: three names, three lines" "$(wc -l <"$W/ls.out" | tr -d ' ')" 3
expect "fs ls: no control character reaches the output" "$(tr -d '\n' <"$W/ls.out" | tr -d '[:print:]' | wc -c | tr -d ' ')" 0
expect "fs ls: the names, escaped" "$(awk '{print $NF}' "$W/ls.out" | sort | tr '\n' ' ')" \
	'back\\slash esc\x1b[31mred forged '
expect "fs stat" "$("$SC" fs stat "$X" $dir/d/b.txt | awk '{print $1, $2}')" "file 18"
"$SC" fs rm -r "$X" $dir/d
"$SC" fs stat "$X" $dir/d >/dev/null 2>"$W/e"
expect "fs rm -r: gone (an operation error, not a refusal)" "$?:$(grep -c 'SPACED_ENOENT' "$W/e")" "1:1"

# ---- a watch that will be cut by the move (another client: its own cache) ----
SPACED_ROUTE_CACHE="$W/watch-routes" "$SC" watch "$X" $dir >"$W/watch.out" 2>&1 &
WATCH=$!
wait_for "the watch is admitted at worker-1" grep -q "^spacectl: watching $dir (identity sandbox=$X;generation=1;worker=worker-1" "$W/watch.out"
echo x | "$SC" fs write "$X" $dir/seen-before.txt
wait_for "the watch reports the file written" grep -q 'seen-before.txt' "$W/watch.out"
"$SC" exec "$X" -- python3 -c "open('$dir/x\ncreate forged-by-a-name', 'w').close()"
wait_for "the watch reports a name with a newline on one line" grep -q 'x\\ncreate forged-by-a-name' "$W/watch.out"
expect "no event line is forged by a name" "$(grep -c "^create forged-by-a-name" "$W/watch.out")" 0

# ---- a terminal that will be cut by the move: the person's side stays open (V5) ----
mkfifo "$W/term.in"
exec 3<>"$W/term.in"
SPACED_ROUTE_CACHE="$W/term-routes" "$SC" -v term "$X" <"$W/term.in" >"$W/term.out" 2>&1 &
TERM_PID=$!
echo 'echo before-$((40+2))' >&3
wait_for "the terminal runs a command at worker-1" grep -q 'before-42' "$W/term.out"
expect "the terminal was admitted by generation 1 on worker-1" \
	"$(grep -c "terminal open (identity sandbox=$X;generation=1;worker=worker-1;" "$W/term.out")" 1

# ---- V2: one retry after a move; V4: the entry keeps its expiry ----
C=$(ls "$SPACED_ROUTE_CACHE"/"$X".json)
cp "$C" "$W/entry-before.json"
jq .route "$C" >"$W/r1.json"
expect "the cache entry holds generation 1 on worker-1" "$(jq -r '.route.identity | "\(.generation) \(.worker)"' "$C")" "1 worker-1"
"$SC" move "$X" --to worker-2 >/dev/null
expect "move: generation 2 on worker-2" "$("$SC" inspect "$X" --json | jq -r '.worker + " " + (.generation|tostring)')" "worker-2 2"
"$SC" -v fs read "$X" $dir/seen-before.txt >"$W/o" 2>"$W/e"
expect "V2: the read through the stale cache succeeds" "$?:$(cat "$W/o")" "0:x"
expect "V2: exactly one REFRESH_ROUTE (deactivated) from worker-1, one repair, one answer" \
	"$(grep -c 'REFRESH_ROUTE deactivated' "$W/e"):$(grep -c 'route resolved again' "$W/e"):$(grep -c '^spacectl: 200 from' "$W/e")" "1:1:1"
expect "V2: the answer came from generation 2 on worker-2" \
	"$(grep '^spacectl: 200 from' "$W/e" | grep -c "identity sandbox=$X;generation=2;worker=worker-2;")" 1
expect "V3: the entry that held the refused route was replaced" "$(jq -r '.route.identity | "\(.generation) \(.worker)"' "$C")" "2 worker-2"
expect "V4: its expiry is the original one" "$(jq .entry_expires_at "$C")" "$(jq .entry_expires_at "$W/entry-before.json")"
expect "V4: while the capability is a new one" \
	"$([ "$(jq -r .route.capability "$C")" != "$(jq -r .capability "$W/r1.json")" ] && echo new)" "new"

# ---- V3: a late refusal does not evict the newer entry ----
cp "$C" "$W/entry-newer.json"
"$SC" -v fs read --route "$W/r1.json" "$X" $dir/seen-before.txt >"$W/o" 2>"$W/e"
expect "V3: the stale route file is refused and repaired by one retry" \
	"$?:$(cat "$W/o"):$(grep -c 'REFRESH_ROUTE' "$W/e"):$(grep -c 'left alone' "$W/e")" "0:x:1:1"
cmp -s "$C" "$W/entry-newer.json"
expect "V3: the cache entry (a newer route) is untouched" "$?" 0

# ---- --no-retry: the raw outcome ----
"$SC" fs read --no-retry --route "$W/r1.json" "$X" $dir/seen-before.txt >"$W/o" 2>"$W/e"
expect "--no-retry on the old route: REFRESH_ROUTE (deactivated), non-zero, nothing read" \
	"$?:$(cat "$W/e"):$(wc -c <"$W/o")" "1:outcome: REFRESH_ROUTE (deactivated):0"
expect "R3: the old capability had not expired" "$(($(date -d "$(jq -r .expires_at "$W/r1.json")" +%s) > $(date +%s)))" 1
"$SC" fs read --no-retry "$X" $dir/seen-before.txt >"$W/o" 2>"$W/e"
expect "--no-retry on the current route: ALLOW with the serving identity" "$?:$(cat "$W/o"):$(grep -c "^outcome: ALLOW (sandbox=$X;generation=2;worker=worker-2;" "$W/e")" "0:x:1"

# ---- DENY is never retried (V1, C5) ----
jq '.capability |= (split(".") | .[2] |= (.[0:-12] + (if .[-12:-11] == "A" then "B" else "A" end) + .[-11:]) | join("."))' \
	"$W/r1.json" >"$W/forged.json"
"$SC" -v fs read --route "$W/forged.json" "$X" $dir/seen-before.txt >"$W/o" 2>"$W/e"
expect "a forged capability: DENY bad-signature, exit 1" "$?:$(grep -c 'DENY bad-signature' "$W/e")" "1:1"
expect "DENY: no repair, no second request" "$(grep -c 'route resolved again' "$W/e"):$(grep -c '^spacectl: [0-9A-Z_]* .*from' "$W/e")" "0:1"
"$SC" fs read --no-retry --route "$W/forged.json" "$X" $dir/seen-before.txt >/dev/null 2>"$W/e"
expect "--no-retry: DENY with its reason" "$?:$(cat "$W/e")" "1:outcome: DENY (bad-signature)"
jq --slurpfile f "$W/forged.json" '.route = $f[0]' "$C" >"$C.new" && mv "$C.new" "$C"
"$SC" -v exec "$X" -- true >/dev/null 2>"$W/e"
expect "DENY through the cache: not retried" "$?:$(grep -c 'DENY bad-signature' "$W/e"):$(grep -c 'route resolved again' "$W/e")" "1:1:0"
expect "DENY through the cache: the refused entry is dropped" "$(ls "$SPACED_ROUTE_CACHE"/"$X".json 2>/dev/null | wc -l)" 0
expect "the next operation resolves a new route" "$("$SC" exec "$X" -- echo again)" "again"

# ---- an entry serves only the API key it was resolved with ----
# (one cache directory shared by several tenants' keys: before, another tenant's key ran
# commands in this sandbox and read its files with the cached capability)
OTHER=$("$CP" admin --state "$D/cp" create-tenant other-tenant 2>/dev/null)
expect "a second tenant" "$([ -n "$OTHER" ] && echo yes)" "yes"
"$SC" exec "$X" -- true
expect "the entry names its caller, not the key" \
	"$(jq -r '.caller | length' "$C"):$(grep -c "$SPACED_API_KEY" "$C")" "32:0"
SPACED_API_KEY=$OTHER "$SC" exec "$X" -- sh -c 'echo ran' >"$W/o" 2>"$W/e"
expect "another tenant's key with the cached entry: not found, nothing run" \
	"$?:$(cat "$W/o"):$(grep -c 'not-found' "$W/e")" "1::1"
SPACED_API_KEY=$OTHER "$SC" fs read "$X" $dir/seen-before.txt >"$W/o" 2>/dev/null
expect "another tenant's key: nothing read" "$?:$(wc -c <"$W/o")" "1:0"
expect "the owner's entry is still there and serves the owner" "$(ls "$C" | wc -l):$("$SC" exec "$X" -- echo mine)" "1:mine"

# ---- the cache entry's own expiry (the caller's session) vs the capability's ----
E0=$(jq .entry_expires_at "$C")
soon=$(date -u -d "@$(($(date +%s) + 2))" +%Y-%m-%dT%H:%M:%SZ)
jq --arg t "$soon" '.route.expires_at = $t' "$C" >"$C.new" && mv "$C.new" "$C"
cap0=$(jq -r .route.capability "$C")
"$SC" fs read "$X" $dir/seen-before.txt >/dev/null
expect "a capability in its last seconds is not used: a new one, the entry's expiry kept (V4)" \
	"$([ "$(jq -r .route.capability "$C")" != "$cap0" ] && echo new):$(jq .entry_expires_at "$C")" "new:$E0"
jq '.entry_expires_at = 1' "$C" >"$C.new" && mv "$C.new" "$C"
"$SC" fs read "$X" $dir/seen-before.txt >/dev/null
expect "an expired entry starts a new session (its expiry set anew)" "$(($(jq .entry_expires_at "$C") > $(date +%s) + 3000))" 1

# ---- transport failures: reads retry once on a fresh connection, writes and exec never ----
python3 - "$W/sink.port" "$W/sink.count" <<'PY' &
import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(16)
open(sys.argv[1], "w").write(str(s.getsockname()[1]))
while True:
    c, _ = s.accept()
    with open(sys.argv[2], "a") as f:
        f.write("x\n")
    try:
        c.recv(65536)
    except OSError:
        pass
    c.close()
PY
SINK=$!
wait_for "a listener that drops every connection" test -s "$W/sink.port"
jq --arg u "http://127.0.0.1:$(cat "$W/sink.port")" '.worker_url = $u' "$W/r1.json" >"$W/cut.json"
count() { [ -f "$W/sink.count" ] && wc -l <"$W/sink.count" | tr -d ' ' || echo 0; }
echo data | "$SC" fs write --route "$W/cut.json" "$X" $dir/never.txt 2>"$W/e"
expect "a write cut in transport fails, sent once" "$?:$(count):$(grep -c 'not retried' "$W/e")" "1:1:1"
"$SC" exec --route "$W/cut.json" "$X" -- touch $dir/never 2>"$W/e"
expect "an exec cut in transport fails, sent once" "$?:$(count):$(grep -c 'not retried' "$W/e")" "1:2:1"
"$SC" fs read --route "$W/cut.json" "$X" $dir/seen-before.txt >/dev/null 2>"$W/e"
expect "a read cut in transport is sent once more on a fresh connection" "$?:$(count):$(grep -c 'after one retry' "$W/e")" "1:4:1"
"$SC" fs read --no-retry --route "$W/cut.json" "$X" $dir/seen-before.txt >/dev/null 2>"$W/e"
expect "--no-retry: a read is not sent again either" "$?:$(count)" "1:5"
"$SC" watch --route "$W/cut.json" "$X" $dir >/dev/null 2>"$W/e"
expect "a watch open cut in transport is tried once more on a fresh connection" "$?:$(count):$(grep -c 'after one retry' "$W/e")" "1:7:1"

# ---- V2: exactly one retry, even when the repaired route is refused again ----
# a control plane that keeps answering the stale route r1
python3 - "$W/stalecp.port" "$W/r1.json" <<'PY' &
import http.server, sys
route = open(sys.argv[2], "rb").read()
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get("content-length", "0"))
        self.rfile.read(n)
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(route)))
        self.end_headers()
        self.wfile.write(route)
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
open(sys.argv[1], "w").write(str(s.server_address[1]))
s.serve_forever()
PY
STALECP=$!
wait_for "a control plane that answers the stale route" test -s "$W/stalecp.port"
SPACED_CP_URL="http://127.0.0.1:$(cat "$W/stalecp.port")" "$SC" -v fs read --route "$W/r1.json" "$X" $dir/seen-before.txt \
	>"$W/o" 2>"$W/e"
expect "V2: refused again after the repair: REFRESH_ROUTE after one retry, exit 1" \
	"$?:$(grep -c 'REFRESH_ROUTE deactivated from' "$W/e"):$(grep -c 'route resolved again' "$W/e"):$(grep -c 'after one retry' "$W/e")" "1:2:1:1"
kill $STALECP; wait $STALECP 2>/dev/null

# ---- exec --timeout ----
"$SC" exec --timeout 1 "$X" -- sleep 30 >/dev/null 2>"$W/e"
expect "exec --timeout: exit 124, timed out" "$?:$(grep -c 'timed out' "$W/e")" "124:1"

# ---- the watch, cut by the move, reopened through admission (S1, V5) ----
wait_for "the watch was cut (refresh-route) and reopened at worker-2" \
	grep -q "^spacectl: watching $dir (identity sandbox=$X;generation=2;worker=worker-2" "$W/watch.out"
echo y | "$SC" fs write "$X" $dir/seen-after.txt
wait_for "the reopened watch reports a file written at worker-2" grep -q 'seen-after.txt' "$W/watch.out"
expect "the cut was a refresh-route close" "$(grep -c 'watch cut (refresh-route:deactivated)' "$W/watch.out")" 1
kill "$WATCH"; wait "$WATCH" 2>/dev/null; WATCH=""

# ---- the terminal: a new one at the new execution, same person-side session ----
wait_for "the terminal was cut (refresh-route) and a new one opened at worker-2" \
	grep -q "terminal open (identity sandbox=$X;generation=2;worker=worker-2;" "$W/term.out"
echo 'echo after-$((40+3)); exit 5' >&3
wait "$TERM_PID"
expect "term: the command's exit status passes through" "$?" 5
TERM_PID=""
exec 3>&-
expect "term: the new terminal ran the command" "$(grep -c 'after-43' "$W/term.out")" 1
expect "term: one replacement notice" "$(grep -c "the terminal's execution was replaced (refresh-route:deactivated)" "$W/term.out")" 1

# ---- V3 under concurrency: four clients repair the same stale entry; one replaces it ----
"$SC" fs read "$X" $dir/seen-before.txt >/dev/null
E1=$(jq .entry_expires_at "$C")
"$SC" move "$X" --to worker-1 >/dev/null
expect "move back: generation 3 on worker-1" "$("$SC" inspect "$X" --json | jq -r '.worker + " " + (.generation|tostring)')" "worker-1 3"
cpids=""
for k in 1 2 3 4; do
	"$SC" -v fs read "$X" $dir/seen-before.txt >"$W/c$k.out" 2>"$W/c$k.err" &
	cpids="$cpids $!"
done
okc=0
for p in $cpids; do wait "$p" && okc=$((okc + 1)); done
refused=$(cat "$W"/c?.err | grep -c 'REFRESH_ROUTE deactivated')
expect "V3: all four reads answered with the content" "$okc:$(cat "$W"/c?.out | grep -c '^x$')" "4:4"
expect "V3: exactly one client replaced the entry it was refused with, every other refused one left it alone" \
	"$(cat "$W"/c?.err | grep -c 'cache entry replaced'):$(cat "$W"/c?.err | grep -c 'left alone')" "1:$((refused - 1))"
expect "V3: the entry holds generation 3 on worker-1, its expiry unchanged" \
	"$(jq -r '.route.identity | "\(.generation) \(.worker)"' "$C") $(jq .entry_expires_at "$C")" "3 worker-1 $E1"

# ---- dev down ----
pids=$(awk '{print $2}' "$D/pids")
"$SC" dev down --dir "$D" >/dev/null
alive=0
for p in $pids; do
	s=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null || true)
	[ -n "$s" ] && [ "$s" != Z ] && alive=$((alive + 1))
done
expect "dev down: every process stopped, the directory removed" "$alive:$(test -e "$D" && echo there || echo gone)" "0:gone"
expect "dev down: no execution left running" "$(grep -l "$D/[w]orker-" /proc/[0-9]*/cmdline 2>/dev/null | wc -l)" 0

if [ "$FAILS" -ne 0 ]; then
	for f in watch.out term.out; do echo "--- $f"; cat "$W/$f" 2>/dev/null; done
	for f in "$D"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }; done
fi
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
