#!/bin/sh
# run-tests: alone (a 2 s idle timeout)
# Create-time settings on a real cluster (issue 13; DESIGN §6 "Resources", "Templates", "Exec"):
#  - --env reaches every command of the sandbox (a request's own --env wins), on a pooled and on a
#    cold execution alike, and after a move;
#  - --meta labels a sandbox; ls --meta K=V lists those that carry every pair asked for;
#  - timeout ID SECONDS sets when it is reaped (0: never); a far lifetime or idle timeout is not
#    reaped early;
#  - a template's USER, ENV and WORKDIR are every command's defaults; exec --user U runs as another
#    user of the sandbox (a name of its /etc/passwd, a uid or uid:gid), an unknown user is refused;
#  - --auto-resume: a sandbox paused for idleness is resumed by its next use; one without it stays
#    paused and its next use is refused (409 not-running);
#  - a route resolved before the pause and still held by a client, used after the pause's first
#    3 s: the worker refuses it at once (REFRESH_ROUTE paused, a recognized refresh signal: V1)
#    instead of holding the request for the frozen guest; resolved again, the route resumes an
#    auto-resume sandbox and the one rebuilt retry (V2) is served, or says it is paused.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
SC=$SPACED_BUILD/spacectl/spacectl
GUEST=$SPACED_BUILD/spaced-guest/spaced-guest
MK=$SPACED_TOP/tests/mk_rootfs.py
[ "$(id -u)" -eq 0 ] || { echo "the process substrate needs root"; exit 77; }
for b in "$SC" "$SPACED_BUILD/spaced-node/spaced-node" "$SPACED_BUILD/spaced-node/spaced-launch" \
	"$SPACED_BUILD/spaced-host/spaced-host" "$CP" "$GUEST"; do
	[ -x "$b" ] || { echo "$b is not built"; exit 77; }
done
command -v python3 >/dev/null 2>&1 || { echo "python3 is not installed"; exit 77; }
W=$(mktemp -d)
D=$W/cluster
export SPACED_ROUTE_CACHE="$W/routes"
trap '"$SC" dev down --dir "$D" >/dev/null 2>&1; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
if ! "$SC" dev up --workers 2 --dir "$D" --pool 2 >"$W/up.out" 2>"$W/up.err"; then
	cat "$W/up.err"; echo "FAIL: dev up"; exit 1
fi
. "$D/env"

# ---- environment ----
E=$("$SC" create --worker worker-1 --env GREETING=hello --env 'SPACED="quoted value"')
expect "--env reaches a command" "$("$SC" exec "$E" -- sh -c 'echo "$GREETING $SPACED"')" 'hello "quoted value"'
expect "a request's own --env wins" "$("$SC" exec "$E" --env GREETING=bye -- sh -c 'echo $GREETING')" bye
C=$("$SC" create --worker worker-1 --memory 80M --env GREETING=cold) # other limits: started for it
expect "--env on an execution started for it" "$("$SC" exec "$C" -- sh -c 'echo $GREETING')" cold
"$SC" move "$E" --to worker-2 >/dev/null 2>&1 || fail "move"
expect "--env after a move" "$("$SC" exec "$E" -- sh -c 'echo $GREETING')" hello

# ---- metadata ----
R=$("$SC" create --meta team=red --meta run=7)
B=$("$SC" create --meta team=blue)
expect "inspect shows the metadata" "$("$SC" inspect "$R" --json | jq -c .metadata)" '{"run":"7","team":"red"}'
expect "ls --meta team=red" "$("$SC" ls --meta team=red --json | jq -r '[.[].id] | join(" ")')" "$R"
expect "ls --meta team=red --meta run=7" "$("$SC" ls --meta team=red --meta run=7 --json | jq length)" 1
expect "ls --meta team=red --meta run=8" "$("$SC" ls --meta team=red --meta run=8 --json | jq length)" 0
expect "ls --meta team=blue" "$("$SC" ls --meta team=blue --json | jq -r '[.[].id] | join(" ")')" "$B"
"$SC" create --meta 'bad key=x' >/dev/null 2>"$W/e"
expect "a metadata key outside [A-Za-z0-9._-] is refused (400)" "$(grep -c '400' "$W/e")" 1
# the longest value a create takes (256 bytes, each sent as %XX) is a filter a list takes too
# (before: 414, the request URI bounded at 255 bytes)
LONGV=$(printf '/%.0s' $(seq 256))
LG=$("$SC" create --meta "path=$LONGV")
expect "ls --meta with a 256-byte value of slashes" "$("$SC" ls --meta "path=$LONGV" --json | jq -r '[.[].id] | join(" ")')" "$LG"

# ---- timeout ----
# a lifetime and an idle timeout far away: three ticks of the control plane's reaper (1 s each)
# leave the sandbox running (in SQLite a sum compared with a text-bound parameter is always less:
# every such sandbox was reaped or paused at the next tick)
L=$("$SC" create --max-lifetime 3600 --idle-timeout 600)
sleep 3.5
expect "a far lifetime and idle timeout: still running after three reaper ticks" \
	"$("$SC" inspect "$L" --json 2>&1 | jq -r .state 2>/dev/null)" running
"$SC" rm "$L" >/dev/null 2>&1
"$SC" timeout "$B" 3600 || fail "timeout"
expect "timeout: reaped an hour from now" "$("$SC" inspect "$B" --json | jq '.max_lifetime >= 3600 and .max_lifetime < 3700')" true
"$SC" timeout "$B" 1 >/dev/null
for i in $(seq 1 100); do "$SC" inspect "$B" >/dev/null 2>&1 || break; sleep 0.2; done
expect "timeout 1: reaped" "$("$SC" inspect "$B" >/dev/null 2>&1 && echo alive || echo gone)" gone

# ---- a template's USER, ENV, WORKDIR; exec --user ----
python3 "$MK" tarball "$W/u.tar.gz" --gz --bin /bin/dash --bin /usr/bin/cat --bin /usr/bin/id --bin /usr/bin/mkdir \
	--bin /usr/bin/rm --bin /usr/bin/mkfifo \
	--link usr/bin/sh=dash --libs-of "$GUEST" --file 'etc/passwd=root:x:0:0:root:/root:/bin/sh
app:x:1000:1000::/home/app:/bin/sh
' --file home/app/.keep= --own home/app=1000 --own home/app/.keep=1000 || fail "mk tarball"
"$SC" template import users "$W/u.tar.gz" >/dev/null || fail "import"
printf 'FROM users\nENV MODE=built\nWORKDIR /srv/app\nRUN echo "$MODE" > marker\nUSER app\nRUN id -u > /home/app/who\n' >"$W/Spacefile"
"$SC" template build appuser -f "$W/Spacefile" >"$W/build.out" 2>&1 || { cat "$W/build.out"; fail "build"; }
U=$("$SC" create --template appuser)
expect "USER: commands run as the template's user" "$("$SC" exec "$U" -- id -u)" 1000
expect "RUN after USER ran as it" "$("$SC" exec "$U" -- cat /home/app/who)" 1000
expect "WORKDIR and ENV are the defaults" "$("$SC" exec "$U" -- sh -c 'echo $(pwd) $MODE $HOME; cat marker' | tr '\n' ' ')" \
	"/srv/app built /home/app built "
expect "exec --user root" "$("$SC" exec --user root "$U" -- id -u)" 0
expect "exec --user 1000:1000" "$("$SC" exec --user 1000:1000 "$U" -- sh -c 'id -u; id -g' | tr '\n' ' ')" "1000 1000 "
# without a WORKDIR, exec --user starts in that user's home (at the root when it has none)
H=$("$SC" create --template users)
expect "exec --user app: in its home, HOME set" "$("$SC" exec --user app "$H" -- sh -c 'echo $(pwd) $HOME')" "/home/app /home/app"
expect "exec --user root: in /root" "$("$SC" exec --user root "$H" -- sh -c 'pwd')" "/root"
"$SC" exec "$H" -- sh -c 'rm -r /home/app' || fail "rm /home/app"
expect "exec --user app whose home is gone: at the root" "$("$SC" exec --user app "$H" -- sh -c 'pwd')" "/"
expect "exec --user app --cwd /tmp: where asked" "$("$SC" exec --user app --cwd /tmp "$H" -- sh -c 'pwd')" "/tmp"
expect "exec without --user: at the root" "$("$SC" exec "$H" -- sh -c 'pwd')" "/"
"$SC" rm "$H" >/dev/null 2>&1
"$SC" exec --user nosuch "$U" -- id >/dev/null 2>"$W/e"
rc=$?
# the streamed exec names the refusal by its code (docs/node-api.md: 1011 error:SPACED_E…)
expect "an unknown user is refused (127)" "$rc" 127
expect "an unknown user is refused" "$(grep -c 'could not be run: SPACED_ENOENT' "$W/e")" 1
expect "the user cannot write what root owns" "$("$SC" exec "$U" -- sh -c 'echo x > /etc/x 2>/dev/null && echo wrote || echo refused')" refused
# the sandbox's /etc/passwd is its tenant's: a FIFO there (or /dev/zero) held the guest's one loop
# on the next exec --user; now it is not read, and the guest goes on serving
P=$("$SC" create --template users)
"$SC" exec "$P" -- sh -c 'rm -f /etc/passwd && mkfifo /etc/passwd' || fail "a FIFO as /etc/passwd"
timeout -s KILL 20 "$SC" exec --user nosuch "$P" -- id >/dev/null 2>&1
expect "exec --user with a FIFO as /etc/passwd is refused at once (127, not held)" "$?" 127
expect "the guest goes on serving" "$(timeout -s KILL 20 "$SC" exec "$P" -- sh -c 'echo alive')" alive
# a top-level name of dots only is a name, not the root ("..." was taken for "/")
printf dots | "$SC" fs write "$P" /... || fail "fs write /..."
expect "fs read /... reads the file named ..." "$("$SC" fs read "$P" /...)" dots
"$SC" fs rm "$P" /... && expect "fs rm /... removes it" "$("$SC" fs stat "$P" /... >/dev/null 2>&1 && echo there || echo gone)" gone
"$SC" rm "$P" >/dev/null

# ---- auto-resume ----
A=$("$SC" create --idle-timeout 2 --auto-resume)
N=$("$SC" create --idle-timeout 2)
for i in $(seq 1 100); do
	[ "$("$SC" inspect "$A" --json | jq -r .state)" = paused ] && [ "$("$SC" inspect "$N" --json | jq -r .state)" = paused ] && break
	sleep 0.2
done
expect "idle: both paused" "$("$SC" inspect "$A" --json | jq -r .state) $("$SC" inspect "$N" --json | jq -r .state)" "paused paused"
gen=$("$SC" inspect "$A" --json | jq -r .generation)
expect "--auto-resume: the next use resumes it" "$(SPACED_ROUTE_CACHE="$W/r2" "$SC" exec "$A" -- echo back)" back
expect "resumed: running, the same execution (thawed)" "$("$SC" inspect "$A" --json | jq -r '.state + " " + (.generation|tostring)')" "running $gen"
SPACED_ROUTE_CACHE="$W/r3" "$SC" exec "$N" -- echo no >/dev/null 2>"$W/e"
expect "without it: refused while paused (409 not-running)" "$(grep -c '409 not-running' "$W/e")" 1

# ---- a route held from before the pause ----
HA=$("$SC" create --idle-timeout 2 --auto-resume)
HN=$("$SC" create --idle-timeout 2)
SPACED_ROUTE_CACHE="$W/held" "$SC" exec "$HA" -- true || fail "exec on $HA"
SPACED_ROUTE_CACHE="$W/held" "$SC" exec "$HN" -- true || fail "exec on $HN"
for i in $(seq 1 100); do
	[ "$("$SC" inspect "$HA" --json | jq -r .state)" = paused ] && [ "$("$SC" inspect "$HN" --json | jq -r .state)" = paused ] && break
	sleep 0.2
done
expect "idle: both paused, their routes held" "$("$SC" inspect "$HA" --json | jq -r .state) $("$SC" inspect "$HN" --json | jq -r .state)" "paused paused"
sleep 3.5 # past the first 3 s of a pause, in which a request waits for a resume (SPACED_PAUSE_HOLD_MS)
out=$(SPACED_ROUTE_CACHE="$W/held" timeout -s KILL 30 "$SC" -v exec "$HA" -- echo back 2>"$W/ha.err")
expect "held route, --auto-resume: refused as paused, resumed, served" "$out $(grep -c 'REFRESH_ROUTE paused' "$W/ha.err")" "back 1"
SPACED_ROUTE_CACHE="$W/held" timeout -s KILL 30 "$SC" -v exec "$HN" -- echo no >/dev/null 2>"$W/hn.err"
expect "held route, without it: refused as paused at once, then 409 not-running" \
	"$(grep -c 'REFRESH_ROUTE paused' "$W/hn.err") $(grep -c '409 not-running' "$W/hn.err")" "1 1"

echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
