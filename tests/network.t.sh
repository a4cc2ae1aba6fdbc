#!/bin/sh
# run-tests: paired, about 37 s
# Egress under a policy on a real cluster (issue 14, DESIGN §6 "Network"): two process-substrate
# workers, an outside host in a network namespace made here (198.18.0.0/15 only). Allowed and
# denied egress by CIDR and by domain, DNS tricks (names resolving to loopback, private and the
# worker's own addresses), root inside trying ip, nft, iptables and raw sockets, no way to the
# worker's own ports, a live policy change, the policy across a move, and a victim tenant whose
# sandbox keeps working with every daemon alive.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
. "$SPACED_TOP/tests/net_lib.sh"
SC=$SPACED_BUILD/spacectl/spacectl
[ "$(id -u)" -eq 0 ] || { echo "the process substrate and network namespaces need root"; exit 77; }
for b in pasta nft ip python3 curl; do
	command -v $b >/dev/null 2>&1 || { echo "$b is not installed (scripts/setup.sh installs it)"; exit 77; }
done
[ -x "$SPACED_BUILD/spaced-node/spaced-netd" ] || { echo "spaced-netd is not built"; exit 77; }
W=$(mktemp -d)
D=$W/cluster
export SPACED_ROUTE_CACHE="$W/routes"
trap '"$SC" dev down --dir "$D" >/dev/null 2>&1; net_host_down; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT

NH_LOG=$W/host.log
net_host_up || { echo "cannot make the outside host's namespace here"; exit 77; }
# a second address of the worker's on that link: closed like the first, but not one the operator
# makes openable (--net-openable names NH_GW only)
NH_GW2=$NH_NET.$((fourth + 4))
ip addr add "$NH_GW2/32" dev "$NH_IF" || { echo "cannot add $NH_GW2"; exit 77; }
echo "outside host $NH_A and $NH_B; the worker's end of that link is $NH_GW (and $NH_GW2)"

if ! SPACED_NET_DNS=$NH_A:53 "$SC" dev up --workers 2 --dir "$D" --net-openable "$NH_GW/32" \
	--net-closed "$NH_C/32" >"$W/up.out" 2>"$W/up.err"; then
	cat "$W/up.err"; tail -n 20 "$D"/*.log 2>/dev/null
	echo "FAIL: dev up"; exit 1
fi
. "$D/env"
VICTIM=$("$CP" admin --state "$D/cp" create-tenant victim 2>/dev/null)
as_victim() { SPACED_API_KEY=$VICTIM SPACED_ROUTE_CACHE="$W/victim-routes" "$SC" "$@"; }
VX=$(as_victim create --worker worker-1)
[ -n "$VX" ] || { echo "FAIL: the victim's sandbox"; cat "$D"/worker-1.log | tail; exit 1; }
victim_ok() {
	got=$(as_victim exec "$VX" -- curl -s -m 5 "http://$NH_A:8080/" 2>&1)
	expect "victim still reaches the outside after $1" "$got" "outside-host $NH_A"
}
# CODE ID URL: the HTTP status curl gets from inside the sandbox (000: no connection)
code() { "$SC" exec "$1" -- curl -s -m 4 -o /dev/null -w '%{http_code}' "$2" 2>/dev/null; }

# ---- the default policy: mode allow, the closed set closed ----
A=$("$SC" create --worker worker-1)
expect "inspect shows the default policy" "$("$SC" inspect "$A" --json | jq -c .network)" \
	'{"mode":"allow","allow_out":[],"deny_out":[]}'
expect "allow: an outside address (198.18.0.0/15) is reached" "$(code "$A" "http://$NH_A:8080/")" 200
expect "allow: by name through the worker's resolver" "$("$SC" exec "$A" -- curl -s -m 4 http://allowed.test:8080/)" \
	"outside-host $NH_A"
expect "/etc/resolv.conf names the sandbox's resolver" \
	"$("$SC" exec "$A" -- sh -c 'grep -c "^nameserver 100\.88\." /etc/resolv.conf')" 1
API_PORT=$(cat "$D/worker-1/api.port")
CP_PORT=${SPACED_CP_URL##*:}
# (the worker's own address with a service listening on it: "a service on the worker's own address
# is closed" below, where the same address allowed by an operator's --net-openable is reached)
expect "loopback is the sandbox's own: no node-api there" "$(code "$A" "http://127.0.0.1:$API_PORT/")" 000
GWA=$("$SC" exec "$A" -- sh -c "ip -4 route show default | cut -d' ' -f3")
expect "the sandbox's gateway answers DNS only (node-api port)" "$(code "$A" "http://$GWA:$API_PORT/")" 000
expect "the egress uplink's gateway is closed" "$(code "$A" "http://100.88.255.254:$API_PORT/")" 000
# DNS tricks: names that resolve into the closed set resolve to nothing here
for n in evil.test private.test own.test; do
	expect "DNS: $n (loopback / private / the worker's address) resolves to nothing" \
		"$("$SC" exec "$A" -- sh -c "getent ahostsv4 $n | head -n 1")" ""
done
expect "DNS to another server is answered by the worker's resolver (policy still applies)" \
	"$("$SC" exec "$A" -- python3 -c "
import socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
q = b'\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00' + b'\x04evil\x04test\x00' + b'\x00\x01\x00\x01'
s.sendto(q, ('$NH_B', 53)); a = s.recv(512); print(struct.unpack('>H', a[6:8])[0])" 2>&1)" 0

# ---- UDP leaves the host from ports of spaced's own range ----
# pasta binds a host socket to a UDP flow's source port: a sandbox sending from 7777 had made it
# hold the host's 0.0.0.0:7777 (any port from 1024 up, and a microVM's root any port at all); a
# port of the range itself is not kept either (40000: it would be, unless chosen at random)
for sp in 7777 40000; do
	got=$("$SC" exec "$A" -- python3 -c "
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('0.0.0.0', $sp)); s.settimeout(3)
s.sendto(b'x', ('$NH_A', 9002)); print(s.recv(100).decode())" 2>&1)
	case "$got" in
	"from $NH_GW:"*) ok "UDP from the sandbox's port $sp reaches the outside host and is answered" ;;
	*) fail "UDP echo from $sp: $got" ;;
	esac
	port=${got##*:}
	expect "it left the host from another port of 32768-65535 (got $port)" \
		"$([ "$port" -ge 32768 ] 2>/dev/null && [ "$port" -le 65535 ] && [ "$port" != "$sp" ] && echo yes)" yes
	expect "the host's port $sp is not held by this worker's pasta" \
		"$(ss -Huapn "sport = :$sp" | grep -c "pid=$(cat "$D/worker-1/net/pasta.pid"),")" 0
done

# ---- deny mode with an allowed domain ----
B=$("$SC" create --worker worker-1 --network deny --allow-out allowed.test)
expect "deny: inspect shows the policy" "$("$SC" inspect "$B" --json | jq -c .network)" \
	'{"mode":"deny","allow_out":["allowed.test"],"deny_out":[]}'
expect "deny: an allowed domain is reached" "$("$SC" exec "$B" -- curl -s -m 4 http://allowed.test:8080/)" "outside-host $NH_A"
expect "deny: a name under an allowed domain is reached" "$(code "$B" "http://www.allowed.test:8080/")" 200
expect "deny: another domain does not resolve" "$("$SC" exec "$B" -- sh -c 'getent ahostsv4 other.test | head -n 1')" ""
expect "deny: an address no allowed name led to is closed" "$(code "$B" "http://$NH_B:8080/")" 000
# names of another zone that read as under the allowed domain once made text: a NUL in a label
# ([x][allowed][test\0][other][test], the other.test zone's) or a dot in one ([www.allowed][test]):
# the resolver drops them, nothing is asked upstream or pinned
expect "deny: a NUL or a dot inside a label is not read as the allowed domain (no answer)" \
	"$("$SC" exec "$B" -- python3 -c "
import socket
ns = [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')][0]
for labels in ([b'x', b'allowed', b'test\x00', b'other', b'test'], [b'www.allowed', b'test']):
    q = b'\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00' + b''.join(bytes([len(l)]) + l for l in labels) + b'\x00\x00\x01\x00\x01'
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2); s.sendto(q, (ns, 53))
    try:
        a = s.recv(512); print('answer rcode', a[3] & 15, end=' ')
    except socket.timeout:
        print('no-answer', end=' ')
print()" 2>&1)" "no-answer no-answer "

# ---- a guest that owns its network stack (a microVM's root) takes its neighbour's address ----
# A process sandbox cannot change its address (below), but root inside a VM can. The host's root
# in A's network namespace stands for it: it gives A's link the victim's address and sends DNS
# queries from it. The worker's resolver attributes a query to a sandbox by its source, so
# a query that came in on A's link as the victim's would be answered to the victim and spend the
# victim's query budget. The egress namespace drops any packet whose source its link does not lead
# to (DESIGN §6 "Network": one sandbox's policy and resolver are its own; T2: the worker's resolver
# is trusted, so what it attributes to a sandbox must be that sandbox's).
VA=$(as_victim exec "$VX" -- sh -c "ip -4 -o addr show dev eth0 | sed 's|.* inet \([0-9.]*\)/.*|\1|'")
AA=$("$SC" exec "$A" -- sh -c "ip -4 -o addr show dev eth0 | sed 's|.* inet \([0-9.]*\)/.*|\1|'")
PA=$(netns_of "$A" "$AA")
PV=$(netns_of "$VX" "$VA")
# SRC PORT [SECONDS]: a query for allowed.test from SRC:PORT out of A's namespace to A's resolver
# (for SECONDS, 2,000 a second), then whether an answer came
spoof_q() {
	nsenter --net="/proc/$PA/ns/net" python3 -c "
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('$1', $2))
q = b'\x51\x52\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07allowed\x04test\x00\x00\x01\x00\x01'
end = time.monotonic() + float(sys.argv[1])
s.sendto(q, ('$GWA', 53))
while time.monotonic() < end:
    s.sendto(q, ('$GWA', 53)); time.sleep(0.0005)
s.settimeout(2)
try:
    a = s.recv(512); print('answered')
except socket.timeout:
    print('none')" "${3:-0}" 2>&1
}
if [ -n "$PA" ] && [ -n "$PV" ] && [ -n "$VA" ]; then
	expect "a query from A's own address is answered (the check's control)" "$(spoof_q "$AA" 5301)" answered
	nsenter --net="/proc/$PA/ns/net" ip addr add "$VA/32" dev eth0
	# the victim listens where the answer to a spoofed query would go
	nsenter --net="/proc/$PV/ns/net" python3 -c "
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('$VA', 5302)); s.settimeout(6)
try:
    s.recv(512); print('the victim got an answer to a query it never sent')
except socket.timeout:
    print('nothing')" >"$W/victim-dns.out" 2>&1 &
	VL=$!
	sleep 0.5
	spoof_q "$VA" 5302 >/dev/null
	# and a flood of them (the resolver's budget per sandbox is a burst of 400 at 200/s) leaves the
	# victim's own queries answered: three, each given 1 s, while it goes on
	spoof_q "$VA" 5303 5 >/dev/null &
	FL=$!
	sleep 1
	expect "the victim's queries are answered while A floods in its name" "$(as_victim exec "$VX" -- python3 -c "
import socket
ns = [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')][0]
q = b'\\x61\\x62\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x07allowed\\x04test\\x00\\x00\\x01\\x00\\x01'
n = 0
for i in range(3):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1); s.sendto(q, (ns, 53))
    try:
        s.recv(512); n += 1
    except socket.timeout:
        pass
print(n)" 2>&1)" 3
	wait "$FL" "$VL"
	expect "no answer reached the victim" "$(cat "$W/victim-dns.out")" nothing
	nsenter --net="/proc/$PA/ns/net" ip addr del "$VA/32" dev eth0
	# ARP is not IP: a guest's requests to its gateway, each from another sender address, made the
	# egress namespace take a neighbour entry for each, in the kernel's one table for the whole
	# host (1024 entries): while a guest flooded, no namespace of the host, the host's own
	# included, could reach a new neighbour. 300 such requests, then the entries they made:
	nsenter --net="/proc/$PA/ns/net" python3 -c "
import socket, struct
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW); s.bind(('eth0', 0))
mac = bytes.fromhex(open('/sys/class/net/eth0/address').read().strip().replace(':', ''))
for i in range(300):
    sip = socket.inet_aton('10.90.%d.%d' % (i // 200, i % 200 + 1))
    arp = struct.pack('!HHBBH', 1, 0x0800, 6, 4, 1) + mac + sip + bytes(6) + socket.inet_aton('$GWA')
    s.send(b'\xff' * 6 + mac + b'\x08\x06' + arp)" || fail "ARP requests from A's namespace"
	sleep 0.5
	expect "ARP requests from other sender addresses leave no neighbour entry in the egress namespace" \
		"$(nsenter --net="$D/worker-1/net/ns" ip -4 neigh show | grep -c '^10\.90\.')" 0
	# and A's own address is still taken in: both ends forget each other first
	nsenter --net="/proc/$PA/ns/net" ip neigh flush dev eth0 2>/dev/null
	nsenter --net="$D/worker-1/net/ns" ip neigh flush all 2>/dev/null
	expect "A's own ARP is still answered (it reaches the outside host)" "$(code "$A" "http://$NH_A:8080/")" 200
else
	fail "the namespaces of A ($AA: $PA) and the victim ($VA: $PV) not found"
fi

# ---- a flood of queries is held at the sandbox's link ----
# The resolver's budget per sandbox (200/s) is kept after its one socket, shared by every sandbox of
# the worker, has read a packet; a guest's flood on one flow (established: no new conntrack entry
# to count) reached that socket whole and overflowed it. Now a link sends it at most 400 packets a
# second (burst 800): of 20,000 queries sent at once, the egress namespace's sockets take only
# what that allows (the kernel's count of datagrams delivered there, Udp InDatagrams).
udp_in() { nsenter --net="$D/worker-1/net/ns" awk '/^Udp:/ { if (h) print $2; h = 1 }' /proc/net/snmp; }
IN0=$(udp_in)
"$SC" exec "$A" -- python3 -c "
import socket, time
ns = [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')][0]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.setblocking(False)
q = b'\x71\x72\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07allowed\x04test\x00\x00\x01\x00\x01'
t = time.monotonic(); n = 0
while n < 20000 and time.monotonic() - t < 10:
    try:
        s.sendto(q, (ns, 53)); n += 1
    except BlockingIOError:
        time.sleep(0.001)
print(n, round(time.monotonic() - t, 2))" >"$W/flood.out" 2>&1
IN1=$(udp_in)
read -r SENT SECS <"$W/flood.out"
echo "DNS flood: $SENT queries in $SECS s; datagrams delivered in the egress namespace: $((IN1 - IN0))"
expect "20,000 queries sent at once reach the resolver's socket at most at the link's rate" \
	"$(python3 -c "import sys; print('yes' if int(sys.argv[1]) <= 800 + 400 * float(sys.argv[2]) + 300 else 'no: %s' % sys.argv[1])" "$((IN1 - IN0))" "${SECS:-0}")" yes
expect "another tenant's sandbox still resolves a name right after" \
	"$(as_victim exec "$VX" -- sh -c 'getent ahostsv4 allowed.test | head -n 1 | cut -d" " -f1')" "$NH_A"

# ---- root inside tries to widen its own policy ----
"$SC" exec "$B" -- sh -c 'ip route add 198.18.0.0/15 dev eth0' >/dev/null 2>&1
expect "root inside: ip route add refused" "$([ $? -ne 0 ] && echo refused)" refused
"$SC" exec "$B" -- ip addr add "$NH_B/32" dev eth0 >/dev/null 2>&1
expect "root inside: ip addr add refused" "$([ $? -ne 0 ] && echo refused)" refused
"$SC" exec "$B" -- ip link set eth0 down >/dev/null 2>&1
expect "root inside: ip link set down refused" "$([ $? -ne 0 ] && echo refused)" refused
"$SC" exec "$B" -- nft flush ruleset >/dev/null 2>&1
expect "root inside: nft flush ruleset refused" "$([ $? -ne 0 ] && echo refused)" refused
"$SC" exec "$B" -- sh -c 'command -v iptables >/dev/null && iptables -P OUTPUT ACCEPT' >/dev/null 2>&1
expect "root inside: iptables refused (or absent)" "$([ $? -ne 0 ] && echo refused)" refused
expect "root inside: raw sockets refused" "$("$SC" exec "$B" -- python3 -c '
import socket
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); print("raw socket")
except PermissionError:
    print("refused")' 2>&1)" refused
expect "root inside: a packet socket refused" "$("$SC" exec "$B" -- python3 -c '
import socket
try:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0); print("packet socket")
except PermissionError:
    print("refused")' 2>&1)" refused
expect "root inside: sysctl ip_forward refused" \
	"$("$SC" exec "$B" -- sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward 2>/dev/null && echo written || echo refused')" refused
expect "after the attempts: the closed address stays closed" "$(code "$B" "http://$NH_B:8080/")" 000
expect "after the attempts: the allowed domain still works" "$(code "$B" "http://allowed.test:8080/")" 200

# ---- a live change ----
"$SC" net "$B" --network allow >"$W/net.out" 2>&1
expect "spacectl net: mode allow, live" "$(head -n 1 "$W/net.out")" "mode allow"
expect "live: the address closed a moment ago is reached now" "$(code "$B" "http://$NH_B:8080/")" 200
# a connection opened under the old policy is judged again under the new one
"$SC" exec "$B" -- python3 -c "
import socket, sys, time
s = socket.create_connection(('$NH_B', 9000), timeout=3)
s.sendall(b'one\n'); print(s.recv(100).decode().strip(), flush=True)
open('/tmp/ready', 'w').close()
for i in range(100):
    time.sleep(0.1)
    try:
        open('/tmp/go').close(); break
    except OSError:
        pass
try:
    s.settimeout(3); s.sendall(b'two\n'); d = s.recv(100).decode().strip(); print(d or 'closed')
except OSError as e:
    print('cut')
" >"$W/conn.out" 2>&1 &
CONN=$!
i=0; until "$SC" exec "$B" -- test -e /tmp/ready 2>/dev/null; do i=$((i + 1)); [ $i -lt 50 ] || break; sleep 0.1; done
"$SC" net "$B" --network deny --allow-out '' >/dev/null 2>&1
"$SC" exec "$B" -- touch /tmp/go
wait $CONN
expect "live: a connection opened under the old policy gets nothing through after the change" \
	"$(tr '\n' ' ' <"$W/conn.out")" "one cut "
expect "live: deny with nothing allowed: the outside address is closed" "$(code "$B" "http://$NH_A:8080/")" 000
expect "live: deny with nothing allowed: names do not resolve" "$("$SC" exec "$B" -- sh -c 'getent ahostsv4 allowed.test | head -n 1')" ""
"$SC" net "$A" --deny-out "$NH_B" --deny-out denied.test >/dev/null 2>&1
expect "allow with a denied CIDR: that address is closed" "$(code "$A" "http://$NH_B:8080/")" 000
expect "allow with a denied CIDR: others stay open" "$(code "$A" "http://$NH_A:8080/")" 200
expect "allow with a denied domain: the name is refused" "$("$SC" exec "$A" -- sh -c 'getent ahostsv4 denied.test | head -n 1')" ""
# a service of the worker's, on its own addresses: closed until --allow-out names the address, and
# then only where the operator made it openable (--net-openable): a tenant cannot open the rest of
# the closed set (the worker's own services, a cloud's metadata address, private networks) itself
HP=$((20000 + $$ % 20000))
python3 -m http.server --bind "$NH_GW" "$HP" >/dev/null 2>&1 &
HSRV=$!
python3 -m http.server --bind "$NH_GW2" "$HP" >/dev/null 2>&1 &
HSRV2=$!
sleep 0.5
expect "a service on the worker's own address is closed" "$(code "$A" "http://$NH_GW:$HP/")" 000
"$SC" net "$A" --allow-out "$NH_GW" --allow-out "$NH_GW2" --deny-out '' >/dev/null 2>&1
expect "allow-out opens a part of the closed set the operator made openable (the worker's address, named)" \
	"$(code "$A" "http://$NH_GW:$HP/")" 200
expect "allow-out does not open a part of the closed set the operator did not make openable" \
	"$(code "$A" "http://$NH_GW2:$HP/")" 000
"$SC" net "$A" --allow-out 0.0.0.0/0 >/dev/null 2>&1
expect "allow-out 0.0.0.0/0 does not open the closed set" "$(code "$A" "http://$NH_GW2:$HP/")" 000
expect "allow-out 0.0.0.0/0 opens outside addresses" "$(code "$A" "http://$NH_A:8080/")" 200
expect "allow-out 0.0.0.0/0: a name into a private range still resolves to nothing" \
	"$("$SC" exec "$A" -- sh -c "getent ahostsv4 private.test | head -n 1")" ""
kill $HSRV $HSRV2 2>/dev/null
victim_ok "the policy changes"

# ---- a range the operator closes (--net-closed; DESIGN §6: the closed set is worker configuration):
# an outside neighbour on the worker's link (the closed set holds the worker's own addresses, not
# its subnets), closed like the rest of the set ----
CL=$("$SC" create --worker worker-1)
expect "operator-closed: an outside address is still reached" "$(code "$CL" "http://$NH_A:8080/")" 200
expect "operator-closed: the closed neighbour is not, in mode allow" "$(code "$CL" "http://$NH_C:8080/")" 000
expect "operator-closed: a name resolving into it resolves to nothing" \
	"$("$SC" exec "$CL" -- sh -c 'getent ahostsv4 closed.test | head -n 1')" ""
"$SC" net "$CL" --allow-out "$NH_C" >/dev/null 2>&1
expect "operator-closed: allow-out does not open it (the operator did not make it openable)" \
	"$(code "$CL" "http://$NH_C:8080/")" 000
expect "operator-closed: the slot file tells the resolver" \
	"$(cat "$D"/worker-1/net/slot/*.json | jq -r '.closed[]' | sort -u)" "$NH_C/32"

# ---- the policy follows a move ----
"$SC" net "$B" --network deny --allow-out allowed.test >/dev/null 2>&1
"$SC" move "$B" --to worker-2 >/dev/null 2>&1
expect "moved to worker-2" "$("$SC" inspect "$B" --json | jq -r .route.worker)" worker-2
expect "after the move: inspect shows the same policy" "$("$SC" inspect "$B" --json | jq -c .network)" \
	'{"mode":"deny","allow_out":["allowed.test"],"deny_out":[]}'
expect "after the move: the allowed domain is reached" "$(code "$B" "http://allowed.test:8080/")" 200
expect "after the move: the closed address stays closed" "$(code "$B" "http://$NH_B:8080/")" 000

# ---- bad policies are refused, nothing changes ----
"$SC" net "$A" --allow-out 10.0.0.0/33 >/dev/null 2>"$W/e"
expect "a malformed CIDR is refused with 400" "$(grep -c 'HTTP 400' "$W/e")" 1
"$SC" create --network maybe >/dev/null 2>"$W/e"
expect "an unknown mode is refused with 400" "$(grep -c 'HTTP 400' "$W/e")" 1

# ---- nothing died ----
for k in 1 2; do
	expect "worker-$k: spaced-netd alive" "$(kill -0 "$(cat "$D/worker-$k/net/netd.pid" 2>/dev/null)" 2>/dev/null && echo yes)" yes
	# it parses every execution's DNS as root: under its seccomp allow-list, no new privileges
	expect "worker-$k: spaced-netd confined (Seccomp filter, NoNewPrivs)" \
		"$(awk '/^Seccomp:/ {s = $2} /^NoNewPrivs:/ {n = $2} END {print s " " n}' "/proc/$(cat "$D/worker-$k/net/netd.pid")/status" 2>/dev/null)" "2 1"
	expect "worker-$k: pasta alive (holding the uplink)" "$(kill -0 "$(cat "$D/worker-$k/net/pasta.pid" 2>/dev/null)" 2>/dev/null &&
		nsenter --net="$D/worker-$k/net/ns" ip -o link show up0 >/dev/null 2>&1 && echo yes)" yes
done
expect "no group restart on worker-1" "$(grep -c 'starting the group again\|restarting' "$D/worker-1.log")" 0
victim_ok "everything"

# ---- a resolver or a pasta that dies is started again within seconds, the namespace kept ----
# (they serve every execution of the worker: before, nothing started them again until the next
# execution start on that worker; the gate now looks every 5 s)
# a pool start makes the egress namespace ready too (and so starts them again itself, without the
# gate's log line): the kill waits for worker-1's pool to be full and idle
pool_idle() {
	"$SC" node status --admin "$D/worker-1/admin.sock" 2>/dev/null |
		jq -e '.result.pool | .starting == 0 and all(.keys[]; .ready >= .target)' >/dev/null
}
WAIT_SECONDS=60 wait_for "worker-1's pool is full, nothing starting" pool_idle
NETD0=$(cat "$D/worker-1/net/netd.pid")
PASTA0=$(cat "$D/worker-1/net/pasta.pid")
kill -9 "$NETD0" "$PASTA0"
revived() {
	n=$(cat "$D/worker-1/net/netd.pid" 2>/dev/null) p=$(cat "$D/worker-1/net/pasta.pid" 2>/dev/null)
	[ "$n" != "$NETD0" ] && [ "$p" != "$PASTA0" ] && kill -0 "$n" 2>/dev/null && kill -0 "$p" 2>/dev/null
}
wait_for "spaced-netd and pasta killed: both started again (new pids, running)" revived
# the gate logs it when the executor's answer comes, just after the new pid files: waited for
WAIT_SECONDS=5 wait_for "the worker logged it" grep -q 'event=net-revived started=pasta,spaced-netd' "$D/worker-1.log" ||
	grep 'event=net-revive' "$D/worker-1.log"
expect "the worker logged it once" "$(grep -c 'event=net-revived started=pasta,spaced-netd' "$D/worker-1.log")" 1
expect "after it: names resolve again from the sandbox" \
	"$("$SC" exec "$A" -- curl -s -m 4 http://allowed.test:8080/)" "outside-host $NH_A"
victim_ok "the resolver and pasta were started again"

echo "network: $FAILS failure(s)"
[ "$FAILS" -eq 0 ]
