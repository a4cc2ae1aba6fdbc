#!/bin/sh
# run-tests: paired, about 25 s
# The warm pool on the real create path (issue 13), on a real cluster (`spacectl dev up --pool 4`,
# one worker of the process substrate):
#  - creates are served from the pool (its hits count them), and eight creates at once each get
#    an execution of their own: distinct processes and uid ranges, each guest naming its own
#    sandbox (a pooled execution serves one sandbox at most);
#  - a pooled execution runs under the limits of the sandbox that claims it: demand for other
#    limits makes a pool of them, and a sandbox claimed from it is held to its memory limit;
#  - a pooled execution takes the egress policy of the sandbox that claims it (docs/network.md):
#    exactly the sandbox's policy (deny, an allow list, the default), changed live like any, its
#    slot held by that sandbox, the default policy stored as none, a claim under a teardown's egress
#    lock served once the lock is free (skipped without pasta, nft or a network namespace of its
#    own for an outside host);
#  - pooled executions that died while waiting are not handed out: the create starts one for
#    itself and succeeds; their waiting bridges end with their launchers;
#  - the pool stays within --pool-max per key;
#  - a waiting execution's ServicePort gateway listens already and answers nobody before a
#    sandbox claims the execution (it then takes that sandbox's identity: expose below);
#  - a claim allocates no inode: the gateway's record and the slot file are files made with the
#    pooled execution, renamed into place;
#  - a waiting execution's processes run below the default priority, their sessions too, and a
#    claimed one's are raised back; the pool's starts share one CPU cgroup weighed at 1/32
#    ("<parent>+background"), which a started execution's launcher, bridge and gateway leave for
#    the executor's when the start is over (a claim moves no process between cgroups: the first
#    move after a quiet while waits for an RCU grace period), while the executions' own cgroups and
#    the worker's network daemons stay out of it;
#  - the control plane's idle request threads prepare the statements others ran: a second burst
#    of creates prepares none in its requests' time.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
. "$SPACED_TOP/tests/net_lib.sh"
SC=$SPACED_BUILD/spacectl/spacectl
need_substrate
W=$(mktemp -d)
D=$W/cluster
export SPACED_ROUTE_CACHE="$W/routes"
trap '"$SC" dev down --dir "$D" >/dev/null 2>&1; net_host_down; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
if ! "$SC" dev up --workers 1 --dir "$D" --pool 4 >"$W/up.out" 2>"$W/up.err"; then
	cat "$W/up.err"; echo "FAIL: dev up"; exit 1
fi
. "$D/env"
status() { "$SC" node status --admin "$D/worker-1/admin.sock" | jq -c ".result | $1"; }
wait_ready() { # N: the default key's pool holds N ready executions (at most 60 s)
	for i in $(seq 1 600); do
		[ "$(status '.pool.keys[] | select(.default) | .ready')" -ge "$1" ] 2>/dev/null && return 0
		sleep 0.1
	done
	return 1
}
wait_ready 4 || fail "the pool fills to 4"
h0=$(status .pool.hits)

# ---- a waiting execution's ServicePort gateway is started with it and serves nobody yet ----
# (it takes the claiming sandbox's identity from a FIFO: until then connections wait unanswered)
gp=$(cat "$(ls "$D"/worker-1/pool/*/gateway.port | head -n 1)" 2>/dev/null)
expect "a waiting pooled execution has its gateway listening" "$([ -n "$gp" ] && echo yes)" yes
expect "before a claim it answers nothing, not even /metrics" \
	"$(curl -s -m 2 --cacert "$SPACED_CA_FILE" -o /dev/null -w '%{http_code}' "https://127.0.0.1:${gp:-1}/metrics")" 000

# a waiting pooled execution's launcher sleeps until its claim (no tick: nothing to report yet)
wl=$(for f in "$D"/worker-1/pool/*/launcher; do [ -e "$(dirname "$f")/identity" ] || { sed -n 's/^pid=\([0-9]*\).*/\1/p' "$f"; break; }; done)
cs() { awk '/^voluntary_ctxt_switches/ {print $2}' "/proc/$1/status" 2>/dev/null; }
c0=$(cs "$wl"); sleep 2.5; c1=$(cs "$wl")
expect "a waiting pooled launcher woke at most once in 2.5 s" \
	"$([ -n "$c0" ] && [ -n "$c1" ] && [ $((c1 - c0)) -le 1 ] && echo yes || echo "no: $c0 -> $c1")" yes

# ---- eight creates at once ----
for i in 1 2 3 4 5 6 7 8; do "$SC" create >"$W/c$i" 2>&1 & done
wait
ids=$(cat "$W"/c? | sort -u)
expect "eight creates at once: eight sandboxes" "$(echo "$ids" | grep -c '^sbx-')" 8
expect "served from the pool (hits counted)" "$([ "$(status .pool.hits)" -gt "$h0" ] && echo yes)" yes
expect "each execution its own launcher" "$(status '[.records[].pid] | unique | length')" 8
expect "each execution its own uid range" "$(status '[.records[].uid_base] | unique | length')" 8
expect "pooled ones among them" "$([ "$(status '[.records[] | select(.pooled)] | length')" -ge 1 ] && echo yes)" yes
bad=0
for id in $ids; do
	got=$("$SC" exec "$id" -- hostname 2>&1)
	[ "$got" = "$id" ] || { echo "  $id answered as '$got'"; bad=$((bad + 1)); }
	# the answer comes from the execution installed for this sandbox
	"$SC" -v exec "$id" -- true 2>"$W/v" >/dev/null
	grep -q "sandbox=$id;" "$W/v" || { echo "  $id: the serving identity is not its own"; bad=$((bad + 1)); }
done
expect "each guest names and serves its own sandbox" "$bad" 0
# a claimed execution's launcher goes on writing to the pool's log, naming the sandbox that claimed it
pid1=$(status '[.records[] | select(.pooled)][0].identity.sandbox' | tr -d '"')
"$SC" pause "$pid1" >/dev/null 2>&1 && "$SC" resume "$pid1" >/dev/null 2>&1
expect "the pool's log names the claiming sandbox on its launcher's lines" \
	"$(grep -c "^spaced-launch\[[0-9]*\] $pid1: paused" "$D/worker-1/log/pool.log")" 1
# the launcher named the claimed execution from inside its UTS namespace and came back to the host's
back=0
for lp in $(status '[.records[].pid] | .[]'); do
	[ "$(readlink "/proc/$lp/ns/uts")" = "$(readlink /proc/self/ns/uts)" ] && back=$((back + 1))
done
expect "every launcher back in the host's UTS namespace" "$back" 8
# a waiting execution's processes run below the default priority, as a session too (the kernel
# weighs each session of the root CPU cgroup as one: a process's own nice value ranks it only
# among its session's), so a refill takes no CPU from a burst's claims; a claimed one's launcher,
# bridge, gateway and the gateway's serving process are back at the default, process and session
prio() { # PID: "nice/session-nice"
	echo "$(ps -o ni= -p "$1" | tr -d ' ')/$(sed -n 's/.* nice \(-\{0,1\}[0-9]*\)$/\1/p' "/proc/$1/autogroup")"
}
lowered=0 raised=0 nproc=0
for f in "$D"/worker-1/pool/*/launcher; do
	ed=$(dirname "$f")
	gp=$(sed -n 's/^pid=\([0-9]*\).*/\1/p' "$ed/gateway" 2>/dev/null)
	pids="$(sed -n 's/^pid=\([0-9]*\).*/\1/p' "$f") $(sed -n 's/^pid=\([0-9]*\).*/\1/p' "$ed/bridge" "$ed/gateway" 2>/dev/null)"
	pids="$pids $(pgrep -P "${gp:-0}" -x spaced-netgtw)"
	for p in $pids; do
		[ -d "/proc/$p" ] || continue
		nproc=$((nproc + 1))
		if [ -e "$ed/identity" ]; then
			[ "$(prio "$p")" = 0/0 ] && raised=$((raised + 1)) || echo "  claimed $p: $(prio "$p")"
		else
			[ "$(prio "$p")" = 10/10 ] && lowered=$((lowered + 1)) || echo "  waiting $p: $(prio "$p")"
		fi
	done
done
claimed_procs=$(for f in "$D"/worker-1/pool/*/identity; do [ -e "$f" ] && echo x; done | wc -l)
expect "claimed executions' launcher, bridge, gateway and its serving process at the default priority (process and session)" \
	"$raised/$([ "$claimed_procs" -ge 1 ] && echo "$((claimed_procs * 4))" || echo "none claimed")" \
	"$((claimed_procs * 4))/$((claimed_procs * 4))"
expect "every other process of the pool below it" "$((lowered + raised))/$([ "$lowered" -ge 1 ] && echo some)" \
	"$nproc/some"
# ... and in CPU cgroups: a nice value weighs only inside a session of the root cgroup, so the
# pool's starts share one cgroup weighed at 1/32; a started execution's launcher, bridge and
# gateway (and the gateway's serving process, forked with the start) leave it for the executor's
# cgroup, where a cold start's are, before they wait: a claim moves none of them
cpucg() { # PID: its cgroup in the cpu controller (cgroup2: its one cgroup)
	c=$(awk -F: '$2 ~ /(^|,)cpu(,|$)/ {print $3}' "/proc/$1/cgroup" 2>/dev/null)
	[ -n "$c" ] || c=$(awk -F: '$1 == 0 {print $3}' "/proc/$1/cgroup" 2>/dev/null)
	echo "$c"
}
EXE=$(role_pid spaced-executor)
home=$(cpucg "$EXE")
if [ -n "$home" ] && { [ -e /sys/fs/cgroup/cpu/cpu.shares ] || grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null; }; then
	no_start() { [ "$(status .pool.starting)" = 0 ]; }
	WAIT_SECONDS=60 wait_for "the pool's refills over" no_start
	bg=0 fg=0 wfg=0 nproc=0
	for f in "$D"/worker-1/pool/*/launcher; do
		ed=$(dirname "$f")
		gp=$(sed -n 's/^pid=\([0-9]*\).*/\1/p' "$ed/gateway" 2>/dev/null)
		for p in $(sed -n 's/^pid=\([0-9]*\).*/\1/p' "$f" "$ed/bridge" "$ed/gateway" 2>/dev/null) \
			$(pgrep -P "${gp:-0}" -x spaced-netgtw); do
			[ -d "/proc/$p" ] || continue
			nproc=$((nproc + 1))
			case "$([ -e "$ed/identity" ] && echo claimed):$(cpucg "$p")" in
			claimed:"$home") fg=$((fg + 1)) ;;
			:"$home") wfg=$((wfg + 1)) ;;
			*) bg=$((bg + 1)); echo "  $([ -e "$ed/identity" ] && echo claimed || echo waiting) $p: $(cpucg "$p")" ;;
			esac
		done
	done
	expect "claimed executions' launcher, bridge, gateway and its serving process in the executor's CPU cgroup ($home)" \
		"$fg" "$((claimed_procs * 4))"
	expect "waiting ones' there too, their starts over (none left in the background CPU cgroup)" \
		"$((wfg + fg))/$([ "$wfg" -ge 1 ] && echo some)/$bg" "$nproc/some/0"
	bgdir=/sys/fs/cgroup$([ -e /sys/fs/cgroup/cpu/cpu.shares ] && echo /cpu)${home%/}/${SPACED_CGROUP_PARENT:-spaced}+background
	expect "the background cgroup weighed at 1/32" "$(cat "$bgdir/cpu.shares" 2>/dev/null || cat "$bgdir/cpu.weight")" \
		"$([ -e "$bgdir/cpu.shares" ] && echo 32 || echo 3)"
	# the executions themselves (their guests and commands) have their cgroups where every
	# execution's are, claimed or waiting, never below the background one; and the worker's
	# network daemons, started by the first start that needed them, serve every sandbox
	under=0
	for lp in $(status '[.records[].pid] | .[]'); do
		for g in $(pgrep -P "$lp"); do case "$(cpucg "$g")" in *+background*) under=$((under + 1)) ;; esac; done
	done
	expect "no execution's own processes in or below the background cgroup" "$under" 0
	daemons="" nd=0
	for f in "$D"/worker-1/net/pasta.pid "$D"/worker-1/net/netd.pid; do
		p=$(cat "$f" 2>/dev/null)
		[ -n "$p" ] && [ -d "/proc/$p" ] || continue
		nd=$((nd + 1))
		case "$(cpucg "$p")" in *+background) daemons="$daemons $(basename "$f")" ;; esac
	done
	[ "$nd" -gt 0 ] && expect "the worker's network daemons ($nd) out of the background cgroup" "${daemons:-none}" none
else
	echo "skip: no CPU controller for the background cgroup"
fi
# ---- a stopped execution's bridge socket goes with it (they stayed in STATE/run for good) ----
bridge_socks() {
	for id in $ids; do
		sqlite3 -readonly "$D/worker-1/records.db" "SELECT CASE WHEN exec_name LIKE 'pool/%' THEN substr(exec_name, 6)
			ELSE sandbox || '.' || generation END FROM records WHERE sandbox = '$id' AND active = 1" 2>/dev/null
	done | sed "s|^\(.*\)$|$D/worker-1/run/\1.sock|"
}
socks=$(bridge_socks)
expect "the sandboxes' bridges listen on sockets in STATE/run" \
	"$(for s in $socks; do [ -S "$s" ] && echo x; done | wc -l)" "$(echo "$ids" | wc -w)"
for id in $ids; do "$SC" rm "$id" >/dev/null; done
socks_gone() { for s in $socks; do [ -e "$s" ] && return 1; done; return 0; }
WAIT_SECONDS=20 wait_for "removed, their executions' bridge sockets are gone" socks_gone

# ---- a claim allocates no inode on the worker's file system ----
# (on ext4 without a journal an allocation scans every inode freed in the last minutes of its
# group: it was a third of a burst's CPU). The gateway's record directory and the gate's temporary
# file for its record, and the slot file's temporary file, are made with the pooled execution; the
# claim renames them into place: the claimed sandbox's record.json and slot file are those inodes.
ino_set() { for f in "$@"; do [ -e "$f" ] && stat -c %i "$f"; done | sort -n | tr '\n' ' '; }
expect "each waiting pooled execution has its gateway's record directory made" \
	"$(ls -d "$D"/worker-1/gw/.pool-* 2>/dev/null | wc -l)" "$(status '.pool.keys[] | select(.default) | .ready')"
gw_tmp=$(ino_set "$D"/worker-1/gw/.pool-*/.record.json.tmp)
slot_tmp=$(ino_set "$D"/worker-1/net/slot/*.json.tmp)
I=$("$SC" create)
gi=$(stat -c %i "$D/worker-1/gw/$I/record.json" 2>/dev/null)
expect "the claimed sandbox's gateway record is a prepared inode" \
	"$(case " $gw_tmp" in *" ${gi:-x} "*) echo yes ;; *) echo "no: ${gi:-none} not in $gw_tmp" ;; esac)" yes
expect "its prepared directory became the sandbox's (none left under the pool's name)" \
	"$(ls -d "$D"/worker-1/gw/.pool-* 2>/dev/null | wc -l)" "$(status '.pool.keys[] | select(.default) | .ready')"
if [ -n "$slot_tmp" ]; then
	sf=$(grep -l "\"$I\"" "$D"/worker-1/net/slot/*.json | head -n 1)
	si=$(stat -c %i "$sf" 2>/dev/null)
	expect "its slot file is a prepared inode" \
		"$(case " $slot_tmp" in *" ${si:-x} "*) echo yes ;; *) echo "no: ${si:-none} not in $slot_tmp" ;; esac)" yes
else
	echo "skip: slot files (no network on this worker)"
fi
"$SC" rm "$I" >/dev/null
wait_ready 4 || fail "the pool fills to 4 again"

# ---- the control plane's request threads are ready for a burst ----
# (SQLite: each thread prepares its own statements; an idle one prepares ahead those the others
# ran, so a second burst of sixteen creates, served by at least eight threads that took no create
# before, prepares almost none in its requests' time: up to eight, for statements no thread ran
# before, as the end of an earlier removal may run then; without it, ≈ 110 here)
mp=$(cat "$D/cp/metrics.port")
prepared() {
	{ curl -sf --cacert "$SPACED_CA_FILE" "https://127.0.0.1:$mp/metrics" || curl -sf "http://127.0.0.1:$mp/metrics"; } |
		awk -v k="spaced_cp_sql_prepared_total{when=\"$1\"}" '$1 == k {print $2}'
}
# the idle threads done preparing: their count unchanged for a second (at most 20 s)
i1=$(prepared idle)
for i in $(seq 1 20); do
	sleep 1
	i2=$(prepared idle)
	[ "$i2" = "$i1" ] && break
	i1=$i2
done
r0=$(prepared request)
cpids=""
for i in $(seq 1 16); do "$SC" create >"$W/d$i" 2>&1 & cpids="$cpids $!"; done
for p in $cpids; do wait "$p"; done
r1=$(prepared request)
expect "a second burst of sixteen creates: sixteen sandboxes" "$(cat "$W"/d* | grep -c '^sbx-')" 16
cat "$W"/d* | grep -v '^sbx-' | sort | uniq -c | head -n 5
expect "... and (almost) no statement prepared in its requests' time" \
	"$([ -n "$r0" ] && [ -n "$r1" ] && [ $((r1 - r0)) -le 8 ] && echo none || echo "$r0 -> $r1")" none
expect "idle threads prepared them ahead" "$([ "$(prepared idle)" -gt 0 ] 2>/dev/null && echo yes)" yes
for id in $(cat "$W"/d*); do "$SC" rm "$id" >/dev/null; done
wait_ready 4 || fail "the pool fills to 4 again"

# ---- demand that does not pause is refilled while it lasts ----
# (a burst's refills wait until creates pause for 250 ms; creates that keep coming for over a second
# start refills once a quarter of the pool is left: else a steady stream of creates would empty the
# pool for good and every create past it would start cold); 40 at most: the tenant's sandboxes quota
# is 50 (a fast host makes 60 in the 4 s)
s0=$(status '.pool | .started + .starting')
t0=$(date +%s%N)
n=0
: >"$W/steady"
while [ $(($(date +%s%N) - t0)) -lt 4000000000 ] && [ $n -lt 40 ]; do
	"$SC" create >>"$W/steady" 2>&1
	n=$((n + 1))
	[ $n -eq 8 ] && mid=$(status '.pool | .started + .starting')
done
s1=$(status '.pool | .started + .starting')
echo "steady creates: $n in 4 s; pool starts $s0 -> ${mid:-?} (after 8) -> $s1"
grep -v '^sbx-' "$W/steady" | sort | uniq -c | head -n 5
expect "steady creates for 4 s: every one made" "$(grep -c '^sbx-' "$W/steady")" "$n"
expect "the pool was refilled while they kept coming (starts begun during the stream)" \
	"$([ "$s1" -gt "$s0" ] 2>/dev/null && echo yes || echo "no: $s0 -> $s1")" yes
for id in $(grep '^sbx-' "$W/steady"); do "$SC" rm "$id" >/dev/null; done
wait_ready 4 || fail "the pool fills to 4 again"

# ---- the claiming sandbox's limits ----
for i in 1 2 3; do "$SC" create --memory 96M --pids 64 >>"$W/m" || fail "create --memory 96M"; done
key='.pool.keys[] | select(.resources.memory_bytes == 100663296)'
for i in $(seq 1 600); do [ "$(status "$key | .ready")" -ge 1 ] 2>/dev/null && break; sleep 0.1; done
expect "demand for other limits makes a pool of them" "$([ "$(status "$key | .ready")" -ge 1 ] && echo yes)" yes
h1=$(status "$key | .hits")
M=$("$SC" create --memory 96M --pids 64)
expect "a create with those limits is served from it" "$(status "$key | .hits")" $((h1 + 1))
expect "the claimed execution's limits are the sandbox's" \
	"$("$SC" top "$M" --json | jq -c '[.limits.memory_bytes, .limits.pids]')" "[100663296,64]"
"$SC" exec "$M" -- sh -c 'x=a; while true; do x="$x$x"; done' >/dev/null 2>&1
expect "its memory limit holds: the hog was killed, the sandbox serves" "$("$SC" exec "$M" -- echo alive)" alive
expect "its peak is its limit" "$("$SC" top "$M" --json | jq '.memory_peak_bytes <= 100663296')" true

# ---- a pooled execution takes the claiming sandbox's egress policy ----
# CODE ID URL: the HTTP status curl gets from inside the sandbox (000: no connection)
code() { "$SC" exec "$1" -- curl -s -m 4 -o /dev/null -w '%{http_code}' "$2" 2>/dev/null; }
pooled() { status "[.records[] | select(.identity.sandbox == \"$1\") | .pooled] | first"; }
if ! command -v pasta >/dev/null 2>&1 || ! command -v nft >/dev/null 2>&1 || ! command -v curl >/dev/null 2>&1; then
	echo "skip: egress of pooled executions (pasta, nft or curl missing)"
elif ! NH_LOG=$W/host.log net_host_up; then
	echo "skip: egress of pooled executions (cannot make the outside host's namespace here)"
else
	wait_ready 4 || fail "the pool fills again"
	DN=$("$SC" create --network deny)
	AL=$("$SC" create --network deny --allow-out "$NH_A/32")
	OP=$("$SC" create)
	expect "deny, allow-list and default sandboxes came from the pool" "$(pooled "$DN") $(pooled "$AL") $(pooled "$OP")" \
		"true true true"
	expect "deny: the outside host is closed" "$(code "$DN" "http://$NH_A:8080/")" 000
	expect "allow list: the allowed address is reached" "$(code "$AL" "http://$NH_A:8080/")" 200
	expect "allow list: another address is closed" "$(code "$AL" "http://$NH_B:8080/")" 000
	expect "default (allow): the outside host is reached" "$(code "$OP" "http://$NH_B:8080/")" 200
	# the default policy is what no stored policy means: its claim (in the executor's loop) stores
	# none; another policy is stored before the claimed execution gets its identity
	expect "stored policies: deny and allow list yes, the default no" \
		"$(for x in "$DN" "$AL" "$OP"; do [ -e "$D/worker-1/net/policy/$x.json" ] && echo yes || echo no; done | tr '\n' ' ')" \
		"yes yes no "
	# a claim while a teardown holds the egress lock: the executor's loop does not wait for it,
	# the claim goes to a child that does, and is served once the lock is free
	wait_ready 1 || fail "the pool refills"
	# (the holder says when it has the lock and when it lets it go: a loaded host may start it late)
	rm -f "$W/lk.held" "$W/lk.freed"
	flock -x "$D/worker-1/net/lock" sh -c ": >'$W/lk.held'; sleep 2; date +%s%N >'$W/lk.freed'" &
	lk=$!
	for i in $(seq 1 100); do [ -e "$W/lk.held" ] && break; sleep 0.05; done
	[ -e "$W/lk.held" ] || fail "the egress lock is taken by the test"
	LK=$("$SC" create)
	t1=$(date +%s%N)
	wait "$lk"
	expect "a claim under a held egress lock: served from the pool once it is free" \
		"$(pooled "$LK") $([ "$t1" -ge "$(cat "$W/lk.freed")" ] && echo waited)" "true waited"
	expect "... and it is its sandbox's: its guest, its slot" \
		"$("$SC" exec "$LK" -- hostname) $(for f in "$D"/worker-1/net/slot/*.json; do jq -r .sandbox "$f"; done | grep -cx "$LK")" \
		"$LK 1"
	"$SC" net "$DN" --network allow >/dev/null || fail "net: a live change"
	expect "deny changed live to allow: reached" "$(code "$DN" "http://$NH_A:8080/")" 200
	# its ServicePort gateway was started with the claimed identity (its port in the install's ack)
	"$SC" exec "$OP" -- sh -c 'cd /tmp && echo hello-pooled >index.html && setsid python3 -m http.server 8080 --bind 127.0.0.1 >/dev/null 2>&1 & sleep 1' >/dev/null 2>&1
	"$SC" expose "$OP" 8080 --json >"$W/exp.json" 2>&1
	expect "a pooled sandbox's port through its gateway (expose)" \
		"$(curl -s -m 5 --cacert "$SPACED_CA_FILE" -H "Authorization: Bearer $(jq -r .capability "$W/exp.json")" \
			"$(jq -r .url "$W/exp.json")index.html")" \
		hello-pooled
	# a slot's filter is its holder's: the claimed sandboxes hold theirs, waiting pooled executions
	# (nothing runs in them before their identity) hold none
	held=$(for f in "$D"/worker-1/net/slot/*.json; do jq -r .sandbox "$f"; done | sort)
	expect "each claimed sandbox holds its slot" \
		"$(for x in "$DN" "$AL" "$OP"; do echo "$held" | grep -cx "$x"; done | tr '\n' ' ')" "1 1 1 "
	expect "waiting pooled executions hold theirs for no sandbox" \
		"$([ "$(echo "$held" | grep -cx '')" -ge 1 ] && echo yes)" yes
fi

# ---- pooled executions that died are not handed out ----
wait_ready 1 || fail "the pool refills"
bridges=""
for f in "$D"/worker-1/pool/*/launcher; do
	[ -f "$f" ] || continue
	# (a claimed one keeps its directory: its launcher wrote its identity there)
	[ -e "$(dirname "$f")/identity" ] ||
		bridges="$bridges $(sed -n 's/^pid=\([0-9]*\).*/\1/p' "$(dirname "$f")/bridge" 2>/dev/null)"
	kill -9 "$(sed -n 's/^pid=\([0-9]*\).*/\1/p' "$f")" 2>/dev/null
done
sleep 0.5
# a waiting bridge whose launcher died ends with it (it is never claimed)
left=0
for i in $(seq 1 50); do
	left=0
	for b in $bridges; do [ "$(cat "/proc/$b/comm" 2>/dev/null)" = spaced-host ] && left=$((left + 1)); done
	[ "$left" -eq 0 ] && break
	sleep 0.1
done
expect "the waiting bridges of the killed launchers ended with them ($(echo $bridges | wc -w))" "$left" 0
Z=$("$SC" create 2>"$W/z.err")
expect "a create after the pool's executions died still succeeds" "$("$SC" exec "$Z" -- hostname 2>&1)" "$Z"
expect "the worker said the claim failed and started one" \
	"$([ "$(grep -c 'event=pool-claim-failed' "$D/worker-1.log")" -ge 1 ] && echo yes)" yes

expect "the pool stays within --pool-max per key (64)" "$(status '[.pool.keys[].ready] | max <= 64')" true
# the control plane names each sandbox's tenant in its install: a claimed execution keeps it (the
# worker shares its streams between tenants by it)
expect "the claimed sandbox's record names its tenant" \
	"$(status "[.records[] | select(.identity.sandbox == \"$Z\") | .tenant | startswith(\"ten-\")] | .[0]")" true
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
