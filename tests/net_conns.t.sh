#!/bin/sh
# run-tests: paired, about 17 s
# The connections a worker's egress carries (pasta: two open files each, its open-file limit shared
# by every execution of the worker) are split so that no tenant takes them from another (DESIGN §5
# Resources). Before, each sandbox could hold 4096 connections and pasta 9872 in all (its 20000
# open files): three sandboxes holding theirs left pasta nothing, and every other sandbox of the
# worker lost its network. Now each slot is guaranteed an equal part of half of `--net-conns` and
# draws beyond it from the other half, shared. On a worker with `--net-conns 2048` and 256 slots
# (4 guaranteed each, 1024 shared), two hostile sandboxes ask 700 connections each of an outside
# host (a namespace made here, 198.18.0.0/15 only) that greets and holds them: the first gets its
# 700, the second only what is left of the pool, and a victim tenant still holds its guaranteed
# connections and reaches the outside host once it lets them go. The DNS flows each sandbox may hold
# in the egress namespace's conntrack table are bounded too.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
. "$SPACED_TOP/tests/net_lib.sh"
SC=$SPACED_BUILD/spacectl/spacectl
need_substrate pasta nft ip python3 curl
[ -x "$SPACED_BUILD/spaced-node/spaced-netd" ] || { echo "spaced-netd is not built"; exit 77; }
W=$(mktemp -d)
D=$W/cluster
export SPACED_ROUTE_CACHE="$W/routes"
BG=""
trap 'for p in $BG; do kill $p 2>/dev/null; done; "$SC" dev down --dir "$D" >/dev/null 2>&1; net_host_down; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT

NH_LOG=$W/host.log
net_host_up || { echo "cannot make the outside host's namespace here"; exit 77; }
if ! SPACED_NET_DNS=$NH_A:53 "$SC" dev up --workers 1 --dir "$D" --net-conns 2048 >"$W/up.out" 2>"$W/up.err"; then
	cat "$W/up.err"; tail -n 20 "$D"/*.log 2>/dev/null
	echo "FAIL: dev up"; exit 1
fi
. "$D/env"
VICTIM=$("$CP" admin --state "$D/cp" create-tenant victim 2>/dev/null)
as_victim() { SPACED_API_KEY=$VICTIM SPACED_ROUTE_CACHE="$W/victim-routes" "$SC" "$@"; }

# HOLD N SECONDS FLAG [RETRIES]: opens N connections to the outside host's port 9001 (each greeted),
# a refused one tried again after 20 ms up to RETRIES times in all (0 unless given), prints "ok K",
# the kinds of refusal and "retried R", holds them until FLAG exists inside or SECONDS pass
cat >"$W/hold.py" <<'PY'
import os, resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
host, n, secs, flag = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
retries = int(sys.argv[5]) if len(sys.argv) > 5 else 0
held, errs, retried = [], {}, 0
for i in range(n):
    while True:
        try:
            c = socket.create_connection((host, 9001), timeout=5)
            if c.recv(3) != b"hi\n":
                raise OSError("no greeting")
            held.append(c)
        except ConnectionRefusedError:
            if retried < retries:
                retried += 1
                time.sleep(0.02)
                continue
            errs["Connection refused"] = errs.get("Connection refused", 0) + 1
        except OSError as e:
            k = e.strerror or str(e)
            errs[k] = errs.get(k, 0) + 1
        break
print("ok %d refused %s retried %d" % (len(held), sorted(errs.items()), retried), flush=True)
t = time.time()
while time.time() - t < secs and not os.path.exists(flag):
    time.sleep(0.2)
PY
# waits (at most 60 s) until FILE has a line, prints it
first_line() {
	i=0
	while [ ! -s "$1" ] && [ $i -lt 300 ]; do i=$((i + 1)); sleep 0.2; done
	head -n 1 "$1"
}
ok_count() { sed -n 's/^ok \([0-9]*\) .*/\1/p'; }

A1=$("$SC" create --worker worker-1)
A2=$("$SC" create --worker worker-1)
VX=$(as_victim create --worker worker-1)
[ -n "$A1" ] && [ -n "$A2" ] && [ -n "$VX" ] || { echo "FAIL: the sandboxes"; tail "$D"/worker-1.log; exit 1; }
for x in "$A1" "$A2"; do "$SC" fs write "$x" /tmp/hold.py <"$W/hold.py" || fail "hold.py into $x"; done
as_victim fs write "$VX" /tmp/hold.py <"$W/hold.py" || fail "hold.py into the victim's"
grep "event=egress-up" "$D/worker-1.log"
expect "the worker's share: 4 guaranteed to each of 256 slots, 1024 shared" \
	"$(grep -c 'event=egress-up pasta_conns=2048 guaranteed=4 slots=256 shared=1024' "$D/worker-1.log")" 1

"$SC" exec "$A1" -- python3 /tmp/hold.py "$NH_A" 700 120 /tmp/done >"$W/a1.out" 2>&1 &
BG="$BG $!"
r1=$(first_line "$W/a1.out")
echo "first hostile sandbox: $r1"
expect "the first hostile sandbox gets its 700 (4 guaranteed, 696 of the pool)" "$(echo "$r1" | ok_count)" 700
"$SC" exec "$A2" -- python3 /tmp/hold.py "$NH_A" 700 120 /tmp/done >"$W/a2.out" 2>&1 &
BG="$BG $!"
r2=$(first_line "$W/a2.out")
echo "second hostile sandbox: $r2"
n2=$(echo "$r2" | ok_count)
# 4 guaranteed and the 328 the pool has left; refused ones counted a moment in the pool may take a few
expect "the second gets what is left of the pool: 300 to 332 (all 700 before)" \
	"$([ "${n2:-0}" -ge 300 ] && [ "${n2:-0}" -le 332 ] && echo yes)" yes
expect "its refusals are immediate (a TCP reset: connection refused)" \
	"$(echo "$r2" | grep -c "Connection refused")" 1
pfd=$(ls /proc/"$(cat "$D/worker-1/net/pasta.pid")"/fd | wc -l)
echo "pasta holds $pfd open files"
expect "pasta holds no more than its share allows (2 × 2048 + its own)" "$([ "$pfd" -le $((2 * 2048 + 256)) ] && echo yes)" yes

# the victim: its 4 guaranteed connections while the pool is full, then the outside host again
rv=$(as_victim exec "$VX" -- python3 /tmp/hold.py "$NH_A" 4 0 /tmp/done 2>&1 | head -n 1)
echo "victim: $rv"
expect "the victim holds its 4 guaranteed connections while the others fill the pool" "$(echo "$rv" | ok_count)" 4
got=$(as_victim exec "$VX" -- curl -s -m 5 "http://$NH_A:8080/" 2>&1)
expect "the victim reaches the outside host" "$got" "outside-host $NH_A"

# the first lets its connections go: the pool is the second's and the others' again
"$SC" exec "$A1" -- touch /tmp/done
i=0
while [ $i -lt 50 ] && kill -0 "$(echo $BG | cut -d' ' -f1)" 2>/dev/null; do i=$((i + 1)); sleep 0.2; done
# The kernel counts a connection until its close is done both ways (TIME_WAIT; the process's exit
# only starts the 700 closes through pasta and the outside host), and takes closed ones out of a
# count lazily: a few (at most 9) each time a connection is counted. Right after a sandbox closed
# 700 at once, a burst of new connections can find the pool full for a moment; a refused one, tried
# again 20 ms later, finds its room (at most 250 tries in all: five seconds).
r3=$("$SC" exec "$A1" -- python3 /tmp/hold.py "$NH_A" 300 0 /tmp/never 250 2>&1 | head -n 1)
echo "the first again, once it let its connections go: $r3"
expect "connections let go return to the pool" "$(echo "$r3" | ok_count)" 300
"$SC" exec "$A2" -- touch /tmp/done
for x in "$A1" "$A2"; do "$SC" exec "$x" -- true >/dev/null 2>&1 || fail "$x still answers"; done

# ---- DNS flows: the egress namespace's one conntrack table ----
# every sandbox's queries pass it (not counted with the connections above): five sandboxes keeping
# answered queries alive filled its 262144 entries and every other sandbox's queries and connections
# were dropped. Each slot may hold an equal part of half of it (504 here) and an answered flow goes
# after 5 s (10 s unanswered), not 30 or 120. A burst of 1500 queries from 1500 ports:
egress_ct() { nsenter --net="$D/worker-1/net/ns" cat /proc/sys/net/netfilter/nf_conntrack_count; }
CT0=$(egress_ct)
"$SC" exec "$A1" -- python3 -c '
import socket, struct
ns = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
q = lambda i: struct.pack(">HHHHHH", i & 0xffff, 0x0100, 1, 0, 0, 0) + b"\x07allowed\x04test\x00\x00\x01\x00\x01"
socks = []
for i in range(1500):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(q(i), (ns, 53))
    socks.append(s)
print("sent", len(socks))
' >"$W/dns.out" 2>&1
CT1=$(egress_ct)
echo "DNS burst: $(cat "$W/dns.out"); the egress conntrack table: $CT0 entries before, $CT1 after"
expect "one sandbox's 1500 queries hold at most its 504 flows in the table" \
	"$([ "$CT1" -le $((CT0 + 504 + 16)) ] && [ "$CT1" -ge $((CT0 + 400)) ] && echo yes)" yes
expect "another tenant's sandbox still resolves a name meanwhile" \
	"$(as_victim exec "$VX" -- sh -c 'getent ahostsv4 allowed.test | head -n 1 | cut -d" " -f1')" "$NH_A"
WAIT_SECONDS=30 wait_for "the burst's flows leave the table within seconds (DNS timeouts: 5 s answered, 10 s not)" \
	sh -c "[ \$(nsenter --net='$D/worker-1/net/ns' cat /proc/sys/net/netfilter/nf_conntrack_count) -le $((CT0 + 16)) ]"

# ---- the resolver's questions upstream: 64 places per slot ----
# the resolver holds each question it sends upstream for up to 5 s; three sandboxes asking 400 names
# an upstream never answers took every place of its one table of 1024 and another tenant's names
# went unanswered until they expired. Now each slot has 64 places of 32768.
A3=$("$SC" create --worker worker-1)
STALL='
import socket, struct, sys
ns = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(400):
    name = b"".join(bytes([len(p)]) + p for p in (b"q%d" % i, b"stall", b"test")) + b"\x00"
    s.sendto(struct.pack(">HHHHHH", i, 0x0100, 1, 0, 0, 0) + name + b"\x00\x01\x00\x01", (ns, 53))
print("asked 400")
'
SP=""
for x in "$A1" "$A2" "$A3"; do
	"$SC" exec "$x" -- python3 -c "$STALL" >"$W/stall-$x.out" 2>&1 &
	SP="$SP $!"
done
for p in $SP; do wait "$p"; done
expect "three sandboxes asked 400 unanswerable names each" "$(cat "$W"/stall-*.out | grep -c 'asked 400')" 3
expect "another tenant's sandbox still gets its name answered at once (2 s, one try)" \
	"$(as_victim exec "$VX" -- env RES_OPTIONS='timeout:2 attempts:1' getent ahostsv4 allowed.test | head -n 1 | cut -d' ' -f1)" "$NH_A"
# ---- a sandbox that is gone takes its flows out of the counts ----
# A microVM's guest that is killed closes nothing: its flows stayed established in the egress
# namespace's conntrack table (for the kernel's five days), counted in its slot's and the shared
# pool's connections, so one tenant could leave the pool full after it left. The host's root takes
# a sandbox's link down in its namespace (its closes then never leave it, as a killed guest's), and
# the sandbox is removed while it holds 700 connections.
H=$("$SC" create --worker worker-1)
"$SC" fs write "$H" /tmp/hold.py <"$W/hold.py" || fail "hold.py into $H"
pasta_fds() { ls /proc/"$(cat "$D/worker-1/net/pasta.pid")"/fd | wc -l; }
PF0=$(pasta_fds)
"$SC" exec "$H" -- python3 /tmp/hold.py "$NH_A" 700 120 /tmp/done >"$W/h.out" 2>&1 &
HP=$!
BG="$BG $HP"
expect "a sandbox holds 700 connections" "$(first_line "$W/h.out" | ok_count)" 700
HA=$("$SC" exec "$H" -- sh -c "ip -4 -o addr show dev eth0 | sed 's|.* inet \([0-9.]*\)/.*|\1|'")
PH=$(netns_of "$H" "$HA")
egress_flows() { nsenter --net="$D/worker-1/net/ns" conntrack -L -s "$1" 2>/dev/null | grep -c ESTABLISHED; }
if [ -n "$PH" ]; then
	nsenter --net="/proc/$PH/ns/net" ip link set eth0 down
	echo "its flows in the egress namespace: $(egress_flows "$HA"); pasta's open files: $PF0 before, $(pasta_fds) now"
	"$SC" rm "$H" >/dev/null || fail "rm $H"
	wait "$HP" 2>/dev/null
	# pasta closes a connection on a reset from the namespace's side: its host sockets go too
	WAIT_SECONDS=10 wait_for "pasta lets their host sockets go (back to $PF0 open files or fewer)" \
		sh -c "[ \$(ls /proc/$(cat "$D/worker-1/net/pasta.pid")/fd | wc -l) -le $PF0 ]"
	WAIT_SECONDS=10 wait_for "once it is removed, none of its flows is left" sh -c "[ \$(nsenter --net='$D/worker-1/net/ns' conntrack -L -s '$HA' 2>/dev/null | grep -c ESTABLISHED) -eq 0 ]"
	N=$("$SC" create --worker worker-1)
	"$SC" fs write "$N" /tmp/hold.py <"$W/hold.py" || fail "hold.py into $N"
	rn=$("$SC" exec "$N" -- python3 /tmp/hold.py "$NH_A" 700 0 /tmp/never 250 2>&1 | head -n 1)
	echo "a new sandbox: $rn"
	expect "a new sandbox holds 700 again (4 guaranteed and the pool)" "$(echo "$rn" | ok_count)" 700
else
	fail "the namespace of $H ($HA) not found"
fi

for p in spaced-gate spaced-api spaced-executor; do
	[ -n "$(role_pid "$p")" ] || fail "$p died"
done

echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
