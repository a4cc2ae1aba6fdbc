#!/bin/sh
# run-tests: paired, about 30 s
# Supervision on a real cluster (`spacectl dev up`, process substrate; issue 12 item 3): every
# process of a worker that dies is started again with its records — node-api, the gate, the
# executor and the link by spaced-node's supervisor, spaced-node itself and the control plane by
# the dev keeper, each on the same port. After every kill the sandbox answers from the same
# identity with its files, in the same uid range (the range is never handed to another
# execution), and a victim tenant's sandbox on the other worker keeps working. A worker whose
# control channel is gone is shown not connected, and connected again once its link is back. An
# execution that dies under its record (its launcher killed, while the worker runs or while it is
# down) is reported: the sandbox is failed, and nothing serves its generation again (I2); what it
# left (a paused one's frozen tasks, its cgroups, its disk's loop device) is reaped at once.
# worker-1 holds a PM QoS request (--cpu-latency-us 7) for as long as its supervisor runs, a new
# supervisor asks again, and the kernel drops it when the cluster is gone; bad values are refused.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
SC=$SPACED_BUILD/spacectl/spacectl
need_substrate
W=$(mktemp -d)
D=$W/cluster
export SPACED_ROUTE_CACHE="$W/routes"
trap '"$SC" dev down --dir "$D" >/dev/null 2>&1; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT

# the CPUs' wake-up latency the kernel honours now: the smallest request held (PM QoS)
qos() { od -An -t d4 -N4 /dev/cpu_dma_latency | tr -d ' '; }
QOS0=$(qos)
QOSW=$([ "$QOS0" -lt 7 ] && echo "$QOS0" || echo 7)
NODE=$SPACED_BUILD/spaced-node/spaced-node
for bad in "--cpu-latency-us -1" "--cpu-latency-us 1000001" "--cpu-latency-us 5us" "--net-conns 10" "--net-conns x" \
	"--net-conns -100" "--pool 3x" "--capacity 0" "--stall-timeout 3601" "--max-streams 63"; do
	# shellcheck disable=SC2086 # the option and its value
	out=$("$NODE" --state "$W/bad" --worker-id w-bad --listen 127.0.0.1:0 --plaintext $bad 2>&1)
	rc=$?
	case "$rc:$out" in
	2:*"${bad%% *} wants"*) ok "spaced-node $bad is refused: $out" ;;
	*) fail "spaced-node $bad: exit $rc, $out" ;;
	esac
done
# an empty value is no number (it was read as 0: --stall-timeout "" meant "never")
for opt in --stall-timeout --pool --capacity --max-streams --acks-kept --cpu-latency-us; do
	out=$("$NODE" --state "$W/bad" --worker-id w-bad --listen 127.0.0.1:0 --plaintext "$opt" "" 2>&1)
	rc=$?
	case "$rc:$out" in
	2:*"$opt wants"*) ok "spaced-node $opt '' is refused" ;;
	*) fail "spaced-node $opt '': exit $rc, $out" ;;
	esac
done
if ! "$SC" dev up --workers 2 --dir "$D" --cpu-latency-us 7 >"$W/up.out" 2>"$W/up.err"; then
	cat "$W/up.err"; tail -n 20 "$D"/*.log 2>/dev/null
	echo "FAIL: dev up"; exit 1
fi
. "$D/env"
VICTIM=$("$CP" admin --state "$D/cp" create-tenant victim 2>/dev/null)
as_victim() { SPACED_API_KEY=$VICTIM SPACED_ROUTE_CACHE="$W/victim-routes" "$SC" "$@"; }
VX=$(as_victim create --worker worker-2)
printf 'victim data\n' | as_victim fs write "$VX" /workspace/v.txt
X=$("$SC" create --worker worker-1)
printf 'kept across restarts\n' | "$SC" fs write "$X" /workspace/k.txt
ident() { "$SC" -v fs read "$X" /workspace/k.txt 2>&1 >/dev/null | sed -n 's/.*identity \([^ )]*\).*/\1/p' | tail -n 1; }
ID0=$(ident)
[ -n "$ID0" ] || { echo "FAIL: no identity on an answer"; exit 1; }
uid_base() { "$SC" node status --admin "$D/worker-1/admin.sock" | jq -r ".result.records[] | select(.identity.sandbox == \"$X\") | .uid_base"; }
BASE0=$(uid_base)
PORT0=$(cat "$D/worker-1/api.port")
SUP=$(awk '$1 == "worker-1" {print $2}' "$D/pids")
expect "the workers hold their PM QoS request (--cpu-latency-us 7)" "$(qos)" "$QOSW"
grep -q "event=cpu-latency us=7" "$D/worker-1.log" && ok "worker-1 logged its request" || fail "no event=cpu-latency in worker-1.log"

served() { [ "$("$SC" fs read "$X" /workspace/k.txt 2>/dev/null)" = "kept across restarts" ]; }
after_kill() { # WHAT: the sandbox is served again as before, the victim too
	WAIT_SECONDS=30 wait_for "$1: the sandbox is served again" served
	expect "$1: the same identity answers" "$(ident)" "$ID0"
	expect "$1: the same uid range" "$(uid_base)" "$BASE0"
	expect "$1: node-api on the same port" "$(cat "$D/worker-1/api.port")" "$PORT0"
	expect "$1: exec works" "$("$SC" exec "$X" -- sh -c 'echo ran' 2>&1)" "ran"
	expect "$1: the victim is served" "$(as_victim fs read "$VX" /workspace/v.txt 2>&1)" "victim data"
}

for role in spaced-api spaced-gate spaced-executor; do
	p=$(role_pid $role)
	[ -n "$p" ] || { fail "no $role process under worker-1's supervisor"; continue; }
	kill -9 "$p"
	after_kill "kill -9 of $role"
	[ "$(role_pid $role)" != "$p" ] && [ -n "$(role_pid $role)" ] && ok "$role runs again (new pid)" ||
		fail "$role did not come back"
done
expect "the supervisor itself was never restarted" "$(awk '$1 == "worker-1" {print $2}' "$D/pids")" "$SUP"
expect "the PM QoS request outlived the restarts of node-api, the gate and the executor" "$(qos)" "$QOSW"

# ---- the link: the control plane sees the channel go and come back ----
connected() { "$SC" workers --json | jq -r ".[] | select(.id == \"worker-1\") | .connected"; }
wait_for "worker-1 connected" sh -c "[ \"\$('$SC' workers --json | jq -r '.[] | select(.id == \"worker-1\") | .connected')\" = true ]"
LP=$(role_pid spaced-link)
kill -STOP "$LP"
t0=$(date +%s%N)
WAIT_SECONDS=15 wait_for "a silent channel: worker-1 shown not connected" sh -c "[ \"\$('$SC' workers --json | jq -r '.[] | select(.id == \"worker-1\") | .connected')\" = false ]"
echo "link stopped -> not connected after $((($(date +%s%N) - t0) / 1000000)) ms"
for i in 1 2 3; do
	z=$("$SC" create 2>/dev/null)
	echo "$("$SC" inspect "$z" --json | jq -r .route.worker)" >>"$W/placed"
done
expect "while worker-1's channel is gone nothing is placed on it" "$(sort -u "$W/placed" | tr '\n' ' ')" "worker-2 "
kill -9 "$LP"
wait_for "worker-1's link is started again and connected" sh -c "[ \"\$('$SC' workers --json | jq -r '.[] | select(.id == \"worker-1\") | .connected')\" = true ]"
after_kill "kill -9 of the link"
Y=$("$SC" create --worker worker-1)
expect "placement on worker-1 again" "$([ -n "$Y" ] && "$SC" exec "$Y" -- echo ok 2>&1)" "ok"

# ---- a gate that takes long over a control message: the channel stays up meanwhile ----
GP=$(role_pid spaced-gate)
kill -STOP "$GP"
"$SC" pause "$X" >"$W/pause.out" 2>&1 &
PZ=$!
down=0
for i in 1 2 3 4 5 6 7 8; do
	sleep 1
	[ "$(connected)" = "true" ] || down=$((down + 1))
done
kill -CONT "$GP"
wait "$PZ"
expect "the pause waited for the stopped gate and then succeeded" "$?" 0
expect "for 8 s of a gate busy with it, worker-1 was never shown not connected (pings answered)" "$down" 0
"$SC" resume "$X" >/dev/null 2>&1
after_kill "a gate stopped for 8 s"

# ---- the supervisor itself, and the control plane: the dev keeper starts them again ----
kill -9 "$SUP"
wait_for "the keeper started worker-1 again" sh -c "[ \"\$(awk '\$1 == \"worker-1\" {print \$2}' '$D/pids')\" != $SUP ]"
after_kill "kill -9 of spaced-node"
expect "a new supervisor holds the PM QoS request again" "$(qos)" "$QOSW"
wait_for "worker-1 connected again" sh -c "[ \"\$('$SC' workers --json | jq -r '.[] | select(.id == \"worker-1\") | .connected')\" = true ]"
CPP=$(awk '$1 == "spaced-cp" {print $2}' "$D/pids")
kill -9 "$CPP"
wait_for "the keeper started the control plane again" sh -c "'$SC' ls >/dev/null 2>&1"
expect "the sandboxes are still listed" "$("$SC" ls --json 2>/dev/null | jq -r "[.[] | select(.id == \"$X\")] | length")" 1
wait_for "both workers connected to the new control plane" sh -c "[ \"\$('$SC' workers --json | jq '[.[] | select(.connected)] | length')\" = 2 ]"
after_kill "kill -9 of spaced-cp"
grep -q "is gone; starting it again" "$D/keeper.log" && ok "the keeper logged its restarts" || fail "no restart in keeper.log"

# ---- an execution that dies under its record: ended, reported, started again only as a new generation (I2) ----
# (its launcher killed; the same happens when its guest is OOM-killed): the worker sees it at once,
# makes the record a tombstone in state "ended" (requests of that generation get REFRESH_ROUTE, its
# bridge ends) and tells the control plane on its channel, which marks the sandbox failed. Nothing
# serves that generation again: a resume is a new, greater generation, which only the control
# plane assigns (I2), and the capability of the dead one is refused by the worker.
E=$("$SC" create --worker worker-1)
printf 'before the end\n' | "$SC" fs write "$E" /workspace/e.txt
"$SC" route "$E" --purpose fs.read --json >"$W/e-route.json"
ECAP=$(jq -r .capability "$W/e-route.json"); EURL=$(jq -r .worker_url "$W/e-route.json")
EGEN=$(jq -r .identity.generation "$W/e-route.json")
rec=$("$SC" node status --admin "$D/worker-1/admin.sock" | jq -c ".result.records[] | select(.identity.sandbox == \"$E\") | [.pid, .host_pid]")
EL=$(echo "$rec" | jq '.[0]'); EB=$(echo "$rec" | jq '.[1]')
kill -9 "$EL"
wait_for "the worker said the execution ended under its record" \
	grep -q "event=execution-ended sandbox=$E" "$D/worker-1.log"
wait_for "the dead execution's bridge is gone" sh -c "[ \"\$(cat /proc/$EB/comm 2>/dev/null)\" != spaced-host ]"
expect "the record is a tombstone in state ended" \
	"$("$SC" node status --admin "$D/worker-1/admin.sock" | jq -r ".result.records[] | select(.identity.sandbox == \"$E\") | .state + \" \" + (.active|tostring)")" "ended false"
wait_for "the control plane marked the sandbox failed" sh -c "\"$SC\" inspect $E --json | jq -e '.state == \"failed\"' >/dev/null"
expect "its last_error says where and why" "$("$SC" inspect "$E" --json | jq -r .last_error)" \
	"its execution ended on worker worker-1: its launcher ended while its record says it runs"
st=$(curl -s --cacert "$SPACED_CA_FILE" -o "$W/e-old.body" -w '%{http_code}' -H "Authorization: Bearer $ECAP" "$EURL/v1/sandboxes/$E/stat?path=/")
expect "R3: the dead generation's capability gets REFRESH_ROUTE from the worker" "$st $(jq -r .outcome "$W/e-old.body")" "409 REFRESH_ROUTE"
"$SC" exec "$E" -- hostname >"$W/e-exec.out" 2>&1 && fail "an exec on a failed sandbox ran" || \
	expect "an exec says the sandbox failed" "$(grep -c failed "$W/e-exec.out")" 1
"$SC" resume "$E" >/dev/null
expect "I2: the resume is a new, greater generation" "$("$SC" inspect "$E" --json | jq -r '.state + " " + ((.generation > '"$EGEN"')|tostring)')" "running true"
expect "the new generation serves (from its template: the dead one's files are gone)" \
	"$("$SC" exec "$E" -- sh -c 'hostname; cat /workspace/e.txt 2>/dev/null || echo no-file' 2>&1)" "$E
no-file"
st=$(curl -s --cacert "$SPACED_CA_FILE" -o "$W/e-old.body" -w '%{http_code}' -H "Authorization: Bearer $ECAP" "$EURL/v1/sandboxes/$E/stat?path=/")
expect "R2: the old capability is refused by the new generation" "$st $(jq -r .outcome "$W/e-old.body")" "409 REFRESH_ROUTE"

# ---- a paused execution whose launcher dies: its tasks are frozen (on cgroup v1 they cannot even
# die until thawed) and held its memory, its mount namespace and so its disk's loop device until
# the sandbox was deleted. Now the worker reaps it at once: thawed, killed, cgroups removed. ----
PZ=$("$SC" create --worker worker-1)
"$SC" exec "$PZ" -- sh -c 'sleep 1000 >/dev/null 2>&1 &'
"$SC" pause "$PZ" >/dev/null
rec=$("$SC" node status --admin "$D/worker-1/admin.sock" | jq -c ".result.records[] | select(.identity.sandbox == \"$PZ\") | [.pid, .uid_base]")
PL=$(echo "$rec" | jq '.[0]'); PB=$(echo "$rec" | jq '.[1]')
PSTATE=$(tr '\0' '\n' <"/proc/$PL/cmdline" | sed -n '/^--state$/{n;p;}')
tasks_of_range() { ps -eo uid= | awk -v b="$PB" '$1 >= b && $1 < b + 65536' | wc -l | tr -d ' '; }
loop_held() { losetup -a | grep -qF "($PSTATE/disk.img)"; }
cgroups_left() { ls -d /sys/fs/cgroup/*/spaced*/spaced-"$PL"-* /sys/fs/cgroup/spaced*/spaced-"$PL"-* 2>/dev/null | wc -l | tr -d ' '; }
expect "the paused execution's tasks are frozen (guest and sleep)" \
	"$([ "$(tasks_of_range)" -ge 2 ] && loop_held && [ "$(cgroups_left)" -gt 0 ] && echo yes)" yes
# its tasks, by pid (once they are gone, another cluster beside this one may take the uid range)
PZT=$(ps -eo pid=,uid= | awk -v b="$PB" '$2 >= b && $2 < b + 65536 {print $1}' | tr '\n' ' ')
[ -n "$PZT" ] || fail "no task of the paused execution found in its uid range ($PB)"
kill -9 "$PL"
wait_for "the worker said the paused execution ended" grep -q "event=execution-ended sandbox=$PZ" "$D/worker-1.log"
wait_for "its frozen tasks were thawed and killed" sh -c "for p in $PZT; do u=\$(awk '/^Uid:/ {print \$2}' /proc/\$p/status 2>/dev/null); [ -n \"\$u\" ] && [ \"\$u\" -ge $PB ] && [ \"\$u\" -lt $((PB + 65536)) ] && exit 1; done; exit 0"
wait_for "its disk's loop device is let go" sh -c "! losetup -a | grep -qF '($PSTATE/disk.img)'"
expect "its cgroups are removed" "$(cgroups_left)" 0
wait_for "the control plane marked the paused sandbox failed" sh -c "\"$SC\" inspect $PZ --json | jq -e '.state == \"failed\"' >/dev/null"

# ---- the same when the execution died while no gate watched it (found at the worker's start) ----
F=$("$SC" create --worker worker-1)
FL=$("$SC" node status --admin "$D/worker-1/admin.sock" | jq ".result.records[] | select(.identity.sandbox == \"$F\") | .pid")
SUP=$(awk '$1 == "worker-1" {print $2}' "$D/pids")
GP=$(role_pid spaced-gate)
kill -STOP "$GP" # the gate sees nothing end from here
kill -9 "$FL"
kill -9 "$SUP" "$GP"
wait_for "spaced-node is started again by the keeper" sh -c "[ \"\$(awk '\$1 == \"worker-1\" {print \$2}' '$D/pids')\" != '$SUP' ]"
wait_for "the restarted worker found the execution ended (no start under its generation)" \
	grep -q "event=execution-ended sandbox=$F .*found ended when the worker started" "$D/worker-1.log"
wait_for "and the control plane marked it failed" sh -c "\"$SC\" inspect $F --json | jq -e '.state == \"failed\"' >/dev/null"
"$SC" resume "$F" >/dev/null
expect "its resume serves as a new generation" "$("$SC" exec "$F" -- hostname 2>&1)" "$F"

# ---- with --restart on-failure the control plane resumes a failed sandbox by itself (a new generation) ----
R=$("$SC" create --worker worker-1 --restart on-failure)
RGEN=$("$SC" inspect "$R" --json | jq .generation)
RL=$("$SC" node status --admin "$D/worker-1/admin.sock" | jq ".result.records[] | select(.identity.sandbox == \"$R\") | .pid")
kill -9 "$RL"
WAIT_SECONDS=30 wait_for "the failed sandbox came back by itself as a greater generation" sh -c \
	"\"$SC\" inspect $R --json | jq -e '.state == \"running\" and .generation > $RGEN and .restarts == 1' >/dev/null"
expect "and serves" "$("$SC" exec "$R" -- hostname 2>&1)" "$R"

# ---- dev down stops the keeper first: nothing comes back ----
"$SC" dev down --dir "$D" >"$W/down" 2>&1
sleep 1
left=$(ps -eo args= | grep -F "$D/" | grep -v grep | wc -l | tr -d ' ')
expect "after dev down no process of the cluster runs (the keeper started nothing again)" "$left" 0
expect "with the workers gone the kernel dropped their PM QoS request" "$(qos)" "$QOS0"
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
