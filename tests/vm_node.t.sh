#!/bin/sh
# run-tests: paired, about 60 s
# The qemu substrate end to end through the normal path (spacectl -> spaced-cp
# -> spaced-node -> spaced-host -> spaced-vsockd -> spaced-guest as PID 1 of a
# microVM): `spacectl dev up --substrate qemu` with two workers, then on one
# sandbox (qemu by default):
#   - both workers offer qemu; the route names substrate qemu; answers carry it;
#   - the guest is PID 1 of a VM (QEMU's virtual CPU) and listens on AF_VSOCK;
#   - exec: output, stderr and exit status pass through;
#   - files: write, read (bytes identical), ls, stat, mkdir, mv, rm;
#   - a terminal and a watch; the pids limit holds inside the guest (fork gets
#     EAGAIN at exactly the limit);
#   - pause keeps a running process and an open terminal (QMP stop/cont); both
#     go on after the resume; an exec sent while paused is answered after it;
#   - move to the other worker: memory, processes and files come along (a
#     memory snapshot: the vsock device unplugged, QEMU's state saved, restored
#     on the other worker with a new device), the generation is new and the
#     guest reports it, a route to the old execution is refused (REFRESH_ROUTE);
#   - egress follows the sandbox's policy (an outside host in a namespace made
#     here): reached by address and by name, refused after a live change to
#     deny, also when root inside changes its address; after a move the guest
#     gets the new worker's link on its control port;
#   - ServicePorts: a server inside the VM through its gateway (the printed
#     URL, TLS), 502 for a port nothing listens on, port-forward's tunnel, a
#     gateway naming another guest CID or another process as the VM refused,
#     and the same server through the new worker's gateway after the move;
#   - the guest's disk I/O is held to the workers' --disk-io (a QEMU throttle group);
#   - with the worker's gate stopped, spaced-vm stops the VM once the worker's lease ended
#     (--fence-after 10) and the VM runs again once the gate is back and unfenced;
#   - rm and dev down leave no VM running.
# With SPACED_VM_FULL=1 (make check-vm) also: a memory hog inside the VM is
# killed by the guest's kernel and the sandbox stays up; a guest that lets go of its vsock device
# is stopped after spaced-vm's grace (30 s), and a stream open then ends.
# Exit 77 (reason on the last line) when a VM cannot boot here. Every wait is bounded.
set -u
build=${SPACED_BUILD:?}
top=${SPACED_TOP:?}
. "$top/tests/vm_lib.sh"
why=$(vm_prereqs) || { echo "$why"; exit 77; }
command -v jq >/dev/null || { echo "jq not installed"; exit 77; }
SC=$build/spacectl/spacectl
W=$(mktemp -d /tmp/spaced-vmnode-XXXXXX)
D=$W/cluster
export SPACED_ROUTE_CACHE="$W/routes"
BG=""
NET=0
. "$top/tests/net_lib.sh"
trap 'for p in $BG; do kill $p 2>/dev/null; done; exec 3>&- 2>/dev/null; "$SC" dev down --dir "$D" >/dev/null 2>&1; net_host_down; rm -rf "$W"' EXIT
# an outside host (198.18.0.0/15, a namespace made here) for the egress checks
if command -v pasta >/dev/null && command -v nft >/dev/null && command -v curl >/dev/null &&
	[ -x "$build/spaced-node/spaced-netd" ]; then
	NH_LOG=$W/host.log
	net_host_up && NET=1
fi
[ "$NET" = 1 ] || echo "note: no egress checks (pasta, nft, curl or a namespace for the outside host missing)"
failed=0
T0=$(date +%s)
ok() { printf 'ok: %s [%s s]\n' "$*" $(($(date +%s) - T0)); }
fail() { printf 'FAIL: %s [%s s]\n' "$*" $(($(date +%s) - T0)); failed=1; }
expect() { if [ "$2" = "$3" ]; then ok "$1"; else fail "$1: got '$2', expected '$3'"; fi; }
# wait_for WHAT SECONDS CMD…: polls CMD every 0.2 s
wait_for() {
	what=$1 secs=$2
	shift 2
	i=0
	while ! "$@" >/dev/null 2>&1; do
		i=$((i + 1))
		[ $i -gt $((secs * 5)) ] && { fail "$what (not within $secs s)"; return 1; }
		sleep 0.2
	done
	ok "$what"
}

t0=$(now_ms)
if ! SPACED_NET_DNS=${NH_A:+$NH_A:53} "$SC" dev up --workers 2 --dir "$D" --substrate qemu --disk-io bps=32M,iops=4000 --fence-after 10 \
	>"$W/up.out" 2>"$W/up.err"; then
	cat "$W/up.err" "$D/vm-images.log" 2>/dev/null; tail -n 20 "$D"/*.log 2>/dev/null
	echo "FAIL: dev up --substrate qemu"; exit 1
fi
. "$D/env"
ok "dev up --substrate qemu: $(( $(now_ms) - t0 )) ms (VM images built)"
expect "both workers offer qemu" "$("$SC" workers --json | jq -c '[.[].substrates | index("qemu") != null]')" '[true,true]'

t0=$(now_ms)
S=$("$SC" create --worker worker-1 --memory 192M --pids 64 --disk 256M 2>"$W/create.err")
[ -n "$S" ] || { cat "$W/create.err"; tail -n 20 "$D"/worker-1/log/*.log "$D"/worker-1/exec/*/console.log 2>/dev/null; echo "FAIL: create"; exit 1; }
ok "create (the first of its shape on this worker: a template booted and saved, then the VM made from it): $(( $(now_ms) - t0 )) ms"
t0=$(now_ms)
S2=$("$SC" create --worker worker-1 --memory 192M --pids 64 --disk 256M --env GREETING='hi there' 2>"$W/create2.err")
[ -n "$S2" ] && ok "a second create of that shape, from the template: $(( $(now_ms) - t0 )) ms" ||
	fail "second create: $(cat "$W/create2.err")"
expect "it is its own sandbox (identity learned on the control port)" \
	"$("$SC" -v exec "$S2" -- true 2>&1 | grep -c "identity sandbox=$S2;generation=1;worker=worker-1;substrate=qemu")" 1
expect "the sandbox's settings reach the guest (CONFIG on the control port): its env" \
	"$("$SC" exec "$S2" -- sh -c 'echo "$GREETING"' 2>&1)" "hi there"
[ -n "$S2" ] && "$SC" rm "$S2" >/dev/null
# templates (docs/templates.md) are root trees for the process substrate: a
# qemu create naming one is refused, not quietly given the VM image's root
python3 - "$W/tiny.tar" <<'PY'
import io, sys, tarfile
with tarfile.open(sys.argv[1], "w") as t:
    ti = tarfile.TarInfo("etc/marker"); ti.size = 2
    t.addfile(ti, io.BytesIO(b"hi"))
PY
if "$SC" template import tiny "$W/tiny.tar" >/dev/null 2>"$W/ti.err"; then
	expect "a qemu create naming a template is refused (substrate-unsupported)" \
		"$("$SC" create --worker worker-1 --template tiny 2>&1 | grep -c 'does not take templates')" 1
else
	fail "template import: $(cat "$W/ti.err")"
fi
"$SC" inspect "$S" --json >"$W/inspect.json"
expect "the route names substrate qemu (the control plane's default here)" "$(jq -r .route.substrate "$W/inspect.json")" qemu
expect "resources as asked" "$(jq -c '.resources | [.memory_bytes, .pids, .disk_bytes]' "$W/inspect.json")" \
	"[201326592,64,268435456]"

out=$("$SC" -v exec "$S" -- sh -c 'tr "\0" " " </proc/1/cmdline; echo; grep -m1 "model name" /proc/cpuinfo' 2>"$W/v.err")
case "$out" in
*"/.spaced/spaced-guest --root / --vsock-port 1024 --vsock-control-port 1023"*QEMU*)
	ok "PID 1 is spaced-guest on AF_VSOCK inside a QEMU VM (made from a template: no identity on its command line)" ;;
*) fail "PID 1 / CPU: $out" ;;
esac
grep -q "identity sandbox=$S;generation=1;worker=worker-1;substrate=qemu;" "$W/v.err" &&
	ok "the answer carries the serving identity (substrate qemu)" || fail "identity header: $(cat "$W/v.err")"
"$SC" exec "$S" -- sh -c 'echo out; echo err >&2; exit 7' >"$W/o" 2>"$W/e"
rc=$?
expect "exec: exit status" "$rc" 7
expect "exec: stdout and stderr" "$(cat "$W/o")/$(cat "$W/e")" "out/err"

head -c 300000 /dev/urandom >"$W/blob"
"$SC" fs write "$S" /workspace/blob <"$W/blob" && "$SC" fs read "$S" /workspace/blob | cmp -s - "$W/blob" &&
	ok "fs write / read: 300,000 random bytes identical" || fail "fs write/read"
"$SC" fs mkdir "$S" /workspace/d/e && "$SC" fs mv "$S" /workspace/blob /workspace/d/e/b2 &&
	expect "fs mkdir, mv, stat" "$("$SC" fs stat "$S" /workspace/d/e/b2 | awk '{ print $1, $2 }')" "file 300000" ||
	fail "fs mkdir/mv"
"$SC" fs ls "$S" /workspace/d/e | grep -q b2 && ok "fs ls" || fail "fs ls"
"$SC" fs rm "$S" /workspace/d/e/b2 && ! "$SC" fs stat "$S" /workspace/d/e/b2 >/dev/null 2>&1 && ok "fs rm" ||
	fail "fs rm"

# a watch
"$SC" watch "$S" /workspace >"$W/watch.out" 2>&1 &
BG="$BG $!"
wait_for "the watch is open" 30 grep -q 'watching /workspace' "$W/watch.out"
echo x | "$SC" fs write "$S" /workspace/w.txt
wait_for "the watch reports the new file" 30 grep -q 'w.txt' "$W/watch.out"

# the pids limit, inside the guest's own cgroup: fork fails with EAGAIN at
# exactly 64 tasks (spaced-guest, the shell and 62 sleeps)
"$SC" exec "$S" -- sh -c 'for i in $(seq 1 80); do sleep 3 & echo $i; done' >"$W/p.out" 2>"$W/p.err"
expect "pids 64: the 63rd child of the shell is refused" "$(tail -n 1 "$W/p.out")" 62
grep -q "can't fork: Resource temporarily unavailable" "$W/p.err" && ok "fork failed with EAGAIN" ||
	fail "pids: $(cat "$W/p.err")"
sleep 3

# disk I/O: the guest's disk sits behind a QEMU throttle group at the workers' --disk-io (32 MiB/s
# here); 64 MiB written directly take 2 s or more (a busy host only makes it longer)
# (the QEMU among the descendants of this sandbox's spaced-vm: another cluster may run VMs too)
vsup=$(pgrep -f "^$build/spaced-vmm/spaced-vm --state $D/worker-1/exec/$S.1" | head -n 1)
expect "QEMU's disk is throttled at --disk-io" \
	"$(ps -eo pid=,ppid=,args= | awk -v top="${vsup:-0}" '{ parent[$1] = $2; line[$1] = $0 }
		END { for (p in parent) { q = p; while (q > 1 && q != top) q = parent[q]; if (q == top && p != top) print line[p] } }' |
		grep -c '[t]hrottle-group,id=io,x-bps-read=33554432,x-bps-write=33554432,x-iops-read=4000')" 1
t=$("$SC" exec "$S" -- sh -c 's=$(cut -d" " -f1 /proc/uptime); dd if=/dev/zero of=/workspace/io bs=1M count=64 oflag=direct 2>/dev/null; e=$(cut -d" " -f1 /proc/uptime); rm -f /workspace/io; echo "$s $e" | awk "{print \$2 - \$1}"')
echo "64 MiB written directly inside the VM: $t s"
expect "the guest's direct writes held to 32 MiB/s" \
	"$(python3 -c 'import sys; print("yes" if float(sys.argv[1]) >= 1.6 else "no")' "$t" 2>&1)" yes

if [ "${SPACED_VM_FULL:-0}" = 1 ]; then
	# memory: the guest's own kernel kills a hog inside the VM; the sandbox stays up
	out=$("$SC" exec "$S" -- sh -c 'head -c 600m /dev/zero | tail -n 1 >/dev/null; echo "hog status $?"' 2>&1)
	case "$out" in
	*"hog status 137"*) ok "a 600 MiB hog in a 192 MiB VM is killed (SIGKILL)" ;;
	*) fail "memory hog: $out" ;;
	esac
	"$SC" exec "$S" -- dmesg | grep -q 'Out of memory: Killed process [0-9]* (tail)' &&
		ok "by the guest kernel's OOM killer, which picked the hog" || fail "no OOM kill of the hog in the guest's log"
	expect "the sandbox stays up" "$("$SC" exec "$S" -- echo alive)" alive
fi

# egress under the sandbox's policy (docs/network.md): the VM's NIC is bridged
# to the execution's link into the worker's egress namespace
# (busybox's nc: its static wget crashes resolving through glibc's NSS without its modules)
outside() { "$SC" exec "$S" -- sh -c "printf 'GET / HTTP/1.0\r\n\r\n' | timeout 8 nc $1 8080 | tail -n 1" 2>/dev/null; }
if [ "$NET" = 1 ]; then
	case "$("$SC" exec "$S" -- ip -4 -o addr show dev eth0)" in
	*"inet 100.88."*"/30"*) ok "the guest's eth0 has its slot's address" ;;
	*) fail "eth0: $("$SC" exec "$S" -- ip -4 -o addr show dev eth0 2>&1)" ;;
	esac
	expect "allow (the default): an outside address is reached from the VM" "$(outside "$NH_A")" "outside-host $NH_A"
	expect "the worker's resolver answers the VM (allowed.test)" \
		"$("$SC" exec "$S" -- sh -c 'nslookup allowed.test | awk "/^Address/ { a = \$2 } END { print a }"')" "$NH_A"
	"$SC" net "$S" --network deny >/dev/null || fail "spacectl net --network deny"
	expect "deny, changed live: nothing outside is reached" "$(outside "$NH_A")" ""
	"$SC" exec "$S" -- sh -c 'ip addr flush dev eth0; ip addr add 100.88.255.1/30 dev eth0; ip route add default via 100.88.255.2' 2>/dev/null
	expect "root in the VM moving to another address gets nothing through" "$(outside "$NH_A")" ""
	"$SC" net "$S" --network allow >/dev/null || fail "spacectl net --network allow"
fi

# ServicePorts (R5, B1, B2, B4; docs/network.md): spaced-netgtw reaches a port inside the VM
# through the guest's vsock forward port, after the same back-end and VM
# checks as the bridge's (libspaced/vmcheck.h)
"$SC" exec "$S" -- sh -c 'mkdir -p /tmp/www && echo hello-from-vm >/tmp/www/index.html && httpd -p 127.0.0.1:8080 -h /tmp/www' ||
	fail "httpd in the VM"
gw_get() { # EXPOSE-JSON [PATH]: the page through the URL expose printed, with its capability
	curl -s -m 10 --cacert "$SPACED_CA_FILE" -H "Authorization: Bearer $(jq -r .capability "$1")" "$(jq -r .url "$1")${2:-}"
}
"$SC" expose "$S" 8080 --json >"$W/exp.json" || fail "expose 8080"
expect "a ServicePort of the VM through its gateway (TLS, the printed URL)" "$(gw_get "$W/exp.json" index.html)" hello-from-vm
"$SC" expose "$S" 8081 --json >"$W/exp1.json" || fail "expose 8081"
expect "a port nothing listens on inside: 502" \
	"$(curl -s -m 10 -o /dev/null -w '%{http_code}' --cacert "$SPACED_CA_FILE" \
		-H "Authorization: Bearer $(jq -r .capability "$W/exp1.json")" "$(jq -r .url "$W/exp1.json")")" 502
"$SC" port-forward "$S" 8080 0 >"$W/pf.out" 2>"$W/pf.err" &
PF=$!
BG="$BG $PF"
i=0; until grep -q forwarding "$W/pf.out"; do i=$((i + 1)); [ $i -lt 200 ] || break; sleep 0.05; done
LP=$(sed -n 's/forwarding 127.0.0.1:\([0-9]*\) .*/\1/p' "$W/pf.out")
expect "port-forward: a local port reaches the VM's port (a TCP tunnel)" \
	"$(curl -s -m 10 "http://127.0.0.1:$LP/index.html")" hello-from-vm
kill "$PF" 2>/dev/null
# impostors at the gateway (B1, B2): the same gateway started by hand, naming another
# guest CID, or another process as the VM: every open refused, the reason logged
GWP=$(pgrep -f "spaced-netgtw .*$S.*--guest-cid" | head -n 1)
if [ -n "$GWP" ]; then
	tr '\0' '\n' <"/proc/$GWP/cmdline" >"$W/gw.args"
	cid=$(sed -n '/^--guest-cid$/{n;p;}' "$W/gw.args")
	sup=$(pgrep -f "^$build/spaced-vmm/spaced-vm --state $D/worker-1/exec/$S.1" | head -n 1)
	sup_start=$(awk '{ print $22 }' "/proc/$sup/stat")
	for what in cid vm; do
		case $what in
		cid) sed "/^--guest-cid$/{n;s/.*/$((cid + 1))/;}" "$W/gw.args" ;;
		vm) sed "/^--vm-pid$/{n;s/.*/$sup/;}; /^--vm-start$/{n;s/.*/$sup_start/;}; /^--vm-exe$/{n;s|.*|$build/spaced-vmm/spaced-vm|;}" "$W/gw.args" ;;
		esac | sed "/^--port-file$/{n;s|.*|$W/gw-$what.port|;}; /^--audit$/{n;s|.*|$W/gw-$what.audit|;}" >"$W/gw-$what.args"
		tr '\n' '\0' <"$W/gw-$what.args" | xargs -0 sh -c 'exec "$@" 2>'"$W/gw-$what.log" sh &
		BG="$BG $!"
		i=0; until [ -s "$W/gw-$what.port" ]; do i=$((i + 1)); [ $i -lt 200 ] || break; sleep 0.05; done
		p=$(cat "$W/gw-$what.port" 2>/dev/null)
		expect "a gateway whose back-end check names another $([ $what = cid ] && echo 'guest CID' || echo 'process as the VM'): 502" \
			"$(curl -s -m 10 -o /dev/null -w '%{http_code}' --cacert "$SPACED_CA_FILE" \
				-H "Authorization: Bearer $(jq -r .capability "$W/exp.json")" "https://8080-$S.gw.localhost:$p/")" 502
	done
	grep -q "serves guest CID $cid, expected $((cid + 1))" "$W/gw-cid.log" &&
		grep -q "holds no connection to the back-end" "$W/gw-vm.log" && ok "and the reasons are logged" ||
		fail "impostor reasons: $(cat "$W/gw-cid.log" "$W/gw-vm.log")"
else
	fail "no VM gateway runs"
fi

# ---- the worker's gate not running: spaced-vm keeps the fence on its own ----
# With the gate stopped nothing renews the worker's lease (--fence-after 10 here) and nothing of the
# gate's can fence; spaced-vm (--lease-file) stops the VM once the lease ended, as a process
# execution's launcher freezes its execution (docs/control-messages.md "Fence"). Back, the gate
# fences at once (the lease ended) and lifts the fence once the link asked again: the VM runs.
wsup=$(awk '$1 == "worker-1" {print $2}' "$D/pids")
GATE=""
for p in $(pgrep -x spaced-gate); do
	q=$p
	while [ "$q" -gt 1 ]; do
		[ "$q" = "$wsup" ] && { GATE=$p; break; }
		q=$(awk '{print $4}' "/proc/$q/stat" 2>/dev/null || echo 1)
	done
	[ -n "$GATE" ] && break
done
if [ -n "$GATE" ]; then
	# (stopped no longer than this section: the EXIT trap's dev down needs it)
	trap 'kill -CONT "$GATE" 2>/dev/null; for p in $BG; do kill $p 2>/dev/null; done; exec 3>&- 2>/dev/null; "$SC" dev down --dir "$D" >/dev/null 2>&1; net_host_down; rm -rf "$W"' EXIT
	kill -STOP "$GATE"
	wait_for "with worker-1's gate stopped, spaced-vm stops the VM once the lease ended" 40 \
		grep -q "the worker's lease ended .* stopped until its gate lifts the fence" "$D/worker-1/log/$S.log"
	expect "the VM is stopped (spaced-vm STATUS)" \
		"$("$build/spaced-vmm/spaced-vm" ctl --state "$D/worker-1/exec/$S.1" STATUS 2>&1 | grep -o 'paused=[01]')" paused=1
	kill -CONT "$GATE"
	wait_for "the gate back, its fence lifts and the VM runs again" 60 sh -c "\"$SC\" exec $S -- echo back | grep -q back"
else
	fail "worker-1's gate not found"
fi

# a running process and an open terminal across pause and resume
printf '#!/bin/sh\ni=0\nwhile true; do i=$((i+1)); echo $i >/workspace/c.tmp; mv /workspace/c.tmp /workspace/counter; sleep 0.2; done\n' |
	"$SC" fs write "$S" /workspace/loop.sh
"$SC" exec "$S" -- sh -c 'chmod +x /workspace/loop.sh; setsid /workspace/loop.sh </dev/null >/dev/null 2>&1 & echo $! >/workspace/loop.pid'
LOOP=$("$SC" fs read "$S" /workspace/loop.pid)
mkfifo "$W/term.in"
exec 3<>"$W/term.in"
"$SC" term "$S" <"$W/term.in" >"$W/term.out" 2>&1 &
BG="$BG $!"
echo 'echo before-$((40+2))' >&3
wait_for "a terminal runs" 30 grep -q before-42 "$W/term.out"
wait_for "the loop counts" 20 sh -c "[ \"\$('$SC' fs read '$S' /workspace/counter)\" -gt 2 ]"
t0=$(now_ms)
"$SC" pause "$S" >/dev/null && ok "pause ($(( $(now_ms) - t0 )) ms through the control plane)" || fail "pause"
expect "inspect: paused" "$("$SC" inspect "$S" --json | jq -r .state)" paused
# a request sent while paused waits for the resume (the back-end holds a new
# connection's CONNECT while the rings are stopped) instead of failing at once
# with 502: an exec, and a ServicePort request (a new guest connection each)
"$SC" exec --no-retry "$S" -- echo answered-after-resume >"$W/pe.out" 2>"$W/pe.err" &
PE=$!
gw_get "$W/exp.json" index.html >"$W/pg.out" 2>&1 &
PG=$!
sleep 2
t0=$(now_ms)
"$SC" resume "$S" >/dev/null && ok "resume in place ($(( $(now_ms) - t0 )) ms)" || fail "resume"
wait $PE
expect "an exec sent while paused is answered after the resume" "$(cat "$W/pe.out")$(grep -v "^outcome: ALLOW" "$W/pe.err")" answered-after-resume
wait $PG
expect "a ServicePort request sent while paused is answered after the resume" "$(cat "$W/pg.out")" hello-from-vm
c1=$("$SC" fs read "$S" /workspace/counter)
sleep 1
c2=$("$SC" fs read "$S" /workspace/counter)
[ "$c2" -gt "$c1" ] 2>/dev/null && ok "the process kept running across the pause (counter $c1 -> $c2)" ||
	fail "counter after resume: $c1 -> $c2"
"$SC" exec "$S" -- kill -0 "$LOOP" && ok "the same process (pid $LOOP) after the resume" || fail "loop process gone"
echo 'echo after-$((40+3))' >&3
wait_for "the terminal opened before the pause answers after the resume" 30 grep -q after-43 "$W/term.out"
echo 'exit 4' >&3

"$SC" exec "$S" -- sh -c 'for i in 1 2 3 4 5; do setsid sleep 20 </dev/null >/dev/null 2>&1 & done'
usage=$("$SC" top "$S" --json 2>/dev/null)
expect "top: the disk's size" "$(echo "$usage" | jq -r '.disk_total // .limits.disk_bytes // empty' | head -n 1)" 268435456
# the guest's own count of its tasks (its control port): PID 1, the loop and
# its sleep, five sleeps of ours, within the limit of 64
n=$(echo "$usage" | jq -r '.pids')
[ "$n" -ge 8 ] 2>/dev/null && [ "$n" -le 64 ] && ok "top: the guest's tasks ($n of 64)" || fail "top pids: $n"

# move: disk carried, new generation elsewhere, old route refused
"$SC" route "$S" --json >"$W/old.route"
head -c 100000 /dev/urandom >"$W/blob2"
"$SC" fs write "$S" /workspace/keep.bin <"$W/blob2"
OLDQ=$(pgrep -f "^$build/spaced-vmm/spaced-vm --state $D/worker-1/exec/$S.1" | head -n 1)
t0=$(now_ms)
if "$SC" move "$S" --to worker-2 >/dev/null 2>"$W/move.err"; then
	ok "move to worker-2: $(( $(now_ms) - t0 )) ms (pause, memory and disk snapshot, restore)"
else
	fail "move: $(cat "$W/move.err")"
fi
"$SC" inspect "$S" --json >"$W/inspect2.json"
expect "after the move: generation 2 on worker-2, substrate qemu" \
	"$(jq -c '.route | [.generation, .worker, .substrate]' "$W/inspect2.json")" '[2,"worker-2","qemu"]'
"$SC" fs read "$S" /workspace/keep.bin | cmp -s - "$W/blob2" && ok "the files came along (100,000 bytes identical)" ||
	fail "file after the move"
out=$("$SC" exec --route "$W/old.route" --no-retry "$S" -- true 2>&1)
case "$out" in
*REFRESH_ROUTE*) ok "a route to the old execution: $out" ;;
*) fail "old route: $out" ;;
esac
"$SC" exec "$S" -- kill -0 "$LOOP" && ok "the process started before the move runs on worker-2 (pid $LOOP: memory moved)" ||
	fail "the loop process did not survive the move"
c1=$("$SC" fs read "$S" /workspace/counter)
sleep 1
c2=$("$SC" fs read "$S" /workspace/counter)
[ "$c2" -gt "$c1" ] 2>/dev/null && ok "and goes on counting there ($c1 -> $c2)" || fail "counter after the move: $c1 -> $c2"
expect "the guest reports generation 2 (learned on its control port after the restore)" \
	"$("$SC" -v exec "$S" -- true 2>&1 | grep -c "identity sandbox=$S;generation=2;worker=worker-2;substrate=qemu")" 1
[ -z "$OLDQ" ] || ! kill -0 "$OLDQ" 2>/dev/null && ok "the old worker's VM is gone" || fail "old VM still runs"
"$SC" expose "$S" 8080 --json >"$W/exp2.json" || fail "expose after the move"
expect "after the move the same server answers through worker-2's gateway (its memory moved)" \
	"$(gw_get "$W/exp2.json" index.html)" hello-from-vm
if [ "$NET" = 1 ]; then
	expect "after the move the guest reaches the outside through worker-2's link (given on its control port)" \
		"$(outside "$NH_A")" "outside-host $NH_A"
fi

# a guest that lets go of its vsock device (root inside unbinds the driver; `echo 1 > …/remove`
# of its PCI device does the same): spaced-vm stops the VM after its grace (30 s) and the
# sandbox's execution ends, a stream open at that moment with it (before, that stream waited for
# good and the sandbox stayed listed running)
if [ "${SPACED_VM_FULL:-0}" = 1 ]; then
	VMQ=$(pgrep -f "^$build/spaced-vmm/spaced-vm --state $D/worker-2/exec/$S.2" | head -n 1)
	timeout 120 "$SC" exec "$S" -- sh -c 'echo open; exec sleep 600' >"$W/held.out" 2>"$W/held.err" &
	HELD=$!
	wait_for "a stream is open" 30 grep -q open "$W/held.out"
	t0=$(now_ms)
	timeout 60 "$SC" exec "$S" -- sh -c 'd=/sys/bus/virtio/drivers/vmw_vsock_virtio_transport
		for v in "$d"/virtio*; do echo "${v##*/}" >"$d/unbind"; done' >/dev/null 2>&1
	wait_for "the VM without its vsock driver is stopped" 90 sh -c "[ -n '$VMQ' ] && ! kill -0 '$VMQ' 2>/dev/null"
	wait_for "the stream open then ends" 30 sh -c "! kill -0 $HELD 2>/dev/null"
	ok "the VM stopped and the stream ended $(( $(now_ms) - t0 )) ms after the unbind"
	state=$("$SC" inspect "$S" --json | jq -r '.state')
	[ "$state" != running ] && ok "the sandbox is no longer listed running ($state)" || fail "still listed running"
	grep -h "no vsock driver" "$D"/worker-2/exec/"$S".2/vm.log 2>/dev/null | head -n 1 | sed 's/^/  /'
fi

"$SC" rm "$S" >/dev/null || fail "rm"
wait_for "rm stops the VM" 30 sh -c "! pgrep -f '^$build/spaced-vmm/spaced-vm --state $D/' >/dev/null"

if [ "$failed" -ne 0 ]; then
	tail -n 30 "$D"/worker-*/log/*.log 2>/dev/null
	exit 1
fi
echo "ok: all"
exit 0
