#!/bin/sh
# run-tests: paired, about 9 s
# Each sandbox's network path out is held to the worker's --net-rate, each way apart (DESIGN §5
# Resources: a limit holds everything the execution makes the host do). Before, one sandbox sent
# and received as fast as the worker's egress carried, taking it from every other sandbox of the
# worker. On a worker started with `--net-rate 16M` (2 MB/s), a hostile sandbox sends 6 MB to an
# outside host (a namespace made here, 198.18.0.0/15 only) and receives 6 MB from it: each takes
# 2.5 s or more (3.0 at the rate, less its 256 KiB burst; a busy host makes it longer, never
# shorter: unbounded, the download took 0.04 s), and root inside cannot take the
# queue off its eth0. A victim tenant's sandbox still reaches the outside host meanwhile.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
. "$SPACED_TOP/tests/net_lib.sh"
SC=$SPACED_BUILD/spacectl/spacectl
need_substrate pasta nft ip tc python3 curl
[ -x "$SPACED_BUILD/spaced-node/spaced-netd" ] || { echo "spaced-netd is not built"; exit 77; }
W=$(mktemp -d)
D=$W/cluster
export SPACED_ROUTE_CACHE="$W/routes"
BG=""
trap 'for p in $BG; do kill $p 2>/dev/null; done; "$SC" dev down --dir "$D" >/dev/null 2>&1; net_host_down; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT

NH_LOG=$W/host.log
net_host_up || { echo "cannot make the outside host's namespace here"; exit 77; }
# a sink (port 9100) and a source of 6 MB (port 9101) on the outside host
ip netns exec "$NH_NS" python3 -c '
import socket, threading
def sink():
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 9100)); s.listen(8)
    while True:
        c, _ = s.accept()
        while c.recv(65536):
            pass
        c.close()
def source():
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 9101)); s.listen(8)
    while True:
        c, _ = s.accept()
        c.sendall(b"x" * (6 << 20))
        c.close()
threading.Thread(target=sink, daemon=True).start()
source()
' >"$W/servers.log" 2>&1 &
BG="$BG $!"

for bad in 16X -5 1e9 100; do # (100 bits/s: below the 8 kbit/s floor)
	refused_flag --net-rate "$bad"
done
SPACED_NET_DNS=$NH_A:53 cluster_up --net-rate 16M
VX=$(as_victim create)
A=$("$SC" create)
[ -n "$A" ] && [ -n "$VX" ] || { echo "FAIL: the sandboxes"; exit 1; }

expect "the sandbox's eth0 has the rate's queue" \
	"$("$SC" exec "$A" -- sh -c 'tc qdisc show dev eth0 | grep -c "tbf.*rate 16Mbit"')" 1
"$SC" exec "$A" -- tc qdisc del dev eth0 root >/dev/null 2>"$W/del.err"
expect "root inside cannot take it off" \
	"$("$SC" exec "$A" -- sh -c 'tc qdisc show dev eth0 | grep -c "tbf.*rate 16Mbit"')" 1

# seconds taken by a transfer from inside the sandbox (python's monotonic clock)
transfer() { # DIRECTION: up | down
	"$SC" exec "$A" -- python3 -c '
import socket, sys, time
host, way = sys.argv[1], sys.argv[2]
t = time.monotonic()
s = socket.create_connection((host, 9100 if way == "up" else 9101), timeout=60)
n = 0
if way == "up":
    buf = b"y" * 65536
    while n < (6 << 20):
        s.sendall(buf); n += len(buf)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
else:
    while True:
        b = s.recv(65536)
        if not b:
            break
        n += len(b)
print("%d %.2f" % (n, time.monotonic() - t))
' "$NH_A" "$1"
}
at_least() { python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= float(sys.argv[2]) else 1)' "$@"; }
transfer up >"$W/up.txt" 2>&1 &
UP=$!
sleep 0.5
victim=$(as_victim exec "$VX" -- curl -s -m 10 "http://$NH_A:8080/" 2>&1)
expect "the victim reaches the outside host while the other sends" "$victim" "outside-host $NH_A"
wait $UP
read -r n t <"$W/up.txt"
echo "sent $n bytes in $t s"
expect "sending held to 16 Mbit/s: 6 MiB take 2.5 s or more" "$([ "${n:-0}" -eq $((6 << 20)) ] && at_least "$t" 2.5 && echo yes)" yes
transfer down >"$W/down.txt" 2>&1
read -r n t <"$W/down.txt"
echo "received $n bytes in $t s"
expect "receiving held to 16 Mbit/s: 6 MiB take 2.5 s or more" "$([ "${n:-0}" -eq $((6 << 20)) ] && at_least "$t" 2.5 && echo yes)" yes

echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
