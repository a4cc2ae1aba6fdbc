#!/bin/sh
# run-tests: paired, about 48 s
# spaced-netgtw, the ServicePort gateway (issue 14, R5, S1–S4, B4), in two parts.
#  1. A worker driven through its admin socket (seqs of our own, so identities can be
#     changed at will): ALLOW, wrong port, wrong protocol, another sandbox (DENY), a stale
#     generation (REFRESH_ROUTE), the guest API's port refused, an established stream kept
#     across an activation-only change (S4) while new opens need the new identity, and cut by
#     a deactivation (S1: the time from the admin's acknowledgement to the cut is printed); a
#     record written wakes its own gateway only. The gateway's two processes: the serving one
#     confined (seccomp, Landlock beneath its record directory), its supervisor making the guest
#     transport's checks and reading the keys for it, and starting it again on the same port when
#     it is killed.
#  2. A cluster (`spacectl dev up`, TLS: the gateways speak it too, https://PORT-ID.gw.localhost):
#     spacectl expose and the printed URL with curl (another CA refused, a plaintext client and 60
#     stalled or garbage handshakes get nothing while a client is served; paused, a new open is
#     refused at once, also by a gateway started again meanwhile), a browser's
#     capability-for-cookie exchange, spacectl port-forward, and a stream cut by a move.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
# under AddressSanitizer every freed buffer waits in a quarantine (256 MiB by default), which
# would hide what a gateway gives back; without it its RSS shows its buffers
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=0"
SC=$SPACED_BUILD/spacectl/spacectl
NODE=$SPACED_BUILD/spaced-node/spaced-node
[ "$(id -u)" -eq 0 ] || { echo "the process substrate needs root"; exit 77; }
for b in "$NODE" "$SPACED_BUILD/spaced-netgtw/spaced-netgtw" "$SPACED_BUILD/spaced-node/spaced-launch" \
	"$SPACED_BUILD/spaced-host/spaced-host"; do
	[ -x "$b" ] || { echo "$b is not built"; exit 77; }
done
command -v python3 >/dev/null 2>&1 || { echo "python3 is not installed"; exit 77; }
W=$(mktemp -d)
D=$W/cluster
NPID=""
export SPACED_ROUTE_CACHE="$W/routes"
cleanup() {
	own_worker_down "$W/w"
	own_worker_down "$W" # and part 2's cluster
	"$SC" dev down --dir "$D" >/dev/null 2>&1
	"$SPACED_BUILD/spaced-node/spaced-launch" reap >/dev/null 2>&1
	[ -n "${CP_KEEP:-}" ] || rm -rf "$W"
}
trap cleanup EXIT

# ---------------- part 1: a worker of our own ----------------
# no warm pool: the executions' files are read at exec/S.G below (tests/pool.t.sh covers pooled ones)
own_worker_up "$W/w" --worker-id wa --uid-range 1879048192:16 --pool 0 --gateway-memory 48M
SK=$OWN_SK PK=$OWN_PK
seq=100
install() { # SANDBOX GEN ACT
	seq=$((seq + 1))
	"$SC" node install $ADM --sandbox "$1" --generation "$2" --worker wa --activation "$3" --seq $seq >"$W/inst.out" 2>&1
	rc=$?; cp "$W/inst.out" "$W/inst-$1.out"; return $rc
}
install S 1 act-1 || { cat "$W/inst.out"; tail "$W/w.log"; echo "FAIL: install"; exit 1; }
install T 1 act-1 || { echo "FAIL: install T"; exit 1; }
# the port is in the install's ack (a pooled execution's files are in pool/, not exec/S.G)
gwport() { jq -r '.result.gateway // empty' "$W/inst-$1.out" 2>/dev/null | grep . || cat "$W/w/exec/$1.$2/gateway.port" 2>/dev/null; }
GS=$(gwport S 1); GT=$(gwport T 1)
[ -n "$GS" ] && [ -n "$GT" ] || { echo "FAIL: no gateway port"; tail "$W/w.log"; exit 1; }
ok "gateways listen: S on $GS, T on $GT"
# a record written wakes its own gateway only (a directory of records per sandbox): twenty of
# T's records written, S's gateway (idle: no tick without connections) wakes for none of them
ctxsw() { awk '/^voluntary_ctxt_switches/ {print $2}' "/proc/$1/status" 2>/dev/null; }
# a gateway is two processes holding its listening socket: the supervisor the executor started
# ("spaced-netgtw-s") and the serving process it forked ("spaced-netgtw")
gwpid() { ss -Hltnp "sport = :$1" | grep -o '"spaced-netgtw",pid=[0-9]*' | head -n 1 | sed 's/.*pid=//'; }
gwsup() { ss -Hltnp "sport = :$1" | grep -o '"spaced-netgtw-s",pid=[0-9]*' | head -n 1 | sed 's/.*pid=//'; }
GSP=$(gwpid "$GS")
# the gateway reads what clients send as root: it runs under its seccomp allow-list, with no new
# privileges (libspaced/confine.c; a call outside the list kills it)
expect "spaced-node --gateway-memory 48M: the gateway's relay budget" \
	"$(tr '\0' '\n' <"/proc/$GSP/cmdline" | sed -n '/^--relay-budget$/{n;p;}')" 50331648
expect "the gateway is confined (Seccomp filter, NoNewPrivs)" \
	"$(awk '/^Seccomp:/ {s = $2} /^NoNewPrivs:/ {n = $2} END {print s " " n}' "/proc/$GSP/status" 2>/dev/null)" "2 1"
# ... and reads files only beneath its record directory (Landlock, where the kernel has it): the
# guest transport's checks (the launcher's /proc files), the keys and the lease reach it through its
# supervisor, itself under a filter (tests/test_confine.c: what Landlock refuses)
abi=$(python3 -c 'import ctypes; print(max(0, ctypes.CDLL(None, use_errno=True).syscall(444, None, 0, 1)))' 2>/dev/null || echo 0)
expect "it reads files only beneath its record directory (Landlock ABI $abi here)" \
	"$(cat "$W"/w/log/*.log | grep "event=serving port=$GS " | sed -n 's/.*files=\([^ ]*\).*/\1/p')" \
	"$([ "${abi:-0}" -ge 1 ] && echo beneath-dir || echo "any(no-landlock)")"
GSS=$(gwsup "$GS")
expect "its supervisor is its parent, confined (Seccomp filter, NoNewPrivs)" \
	"$(awk '/^PPid:/ {p = $2} /^Seccomp:/ {s = $2} /^NoNewPrivs:/ {n = $2} END {print p " " s " " n}' "/proc/$GSP/status" \
		2>/dev/null | cut -d' ' -f1) $(awk '/^Seccomp:/ {s = $2} /^NoNewPrivs:/ {n = $2} END {print s " " n}' \
		"/proc/${GSS:-0}/status" 2>/dev/null)" "${GSS:-none} 2 1"
v0=$(ctxsw "$GSP")
for a in $(seq 2 21); do install T 1 "act-$a" || fail "install T act-$a"; done
v1=$(ctxsw "$GSP")
expect "twenty records of T: S's idle gateway woke for none" \
	"$([ -n "$v0" ] && [ -n "$v1" ] && [ $((v1 - v0)) -le 2 ] && echo yes || echo "no: $v0 -> $v1")" yes
# a sandbox named ".." (a valid name; only an operator's install can give one) gets no record
# directory: nothing is written outside STATE/gw, and no gateway serves it
install .. 1 act-1 >/dev/null 2>&1
expect "a sandbox named '..': no record written beside STATE/gw" \
	"$([ -e "$W/w/record.json" ] || [ -e "$W/w/gw/../record.json" ] && echo written || echo none)" none
# a web server and a TCP echo inside S
"$SPACED_BUILD/spaced-node/spaced-launch" exec --state "$W/w/exec/S.1" -- sh -c '
	cd /tmp && echo hello-from-S >index.html && setsid python3 -m http.server 8080 --bind 127.0.0.1 >/dev/null 2>&1 &
	setsid python3 -c "
import socket, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((\"127.0.0.1\", 9000)); s.listen(16)
def h(c):
    while True:
        d = c.recv(65536)
        if not d: break
        c.sendall(d)
while True:
    c, _ = s.accept(); threading.Thread(target=h, args=(c,), daemon=True).start()
" >/dev/null 2>&1 &
	sleep 1' >/dev/null 2>&1
# both listen before anything is asked of them (python starts slowly on a busy machine)
i=0
until "$SPACED_BUILD/spaced-node/spaced-launch" exec --state "$W/w/exec/S.1" -- python3 -c '
import socket
for p in (8080, 9000): socket.create_connection(("127.0.0.1", p), 1).close()' >/dev/null 2>&1; do
	i=$((i + 1)); [ $i -lt 50 ] || { fail "the servers inside S did not start"; break; }
	sleep 0.2
done
cap() { # SANDBOX GEN ACT PORT PROTO
	"$SC" cap issue --key "$SK" --sandbox "$1" --generation "$2" --worker wa --activation "$3" \
		--purpose serviceport --port "$4" --protocol "$5"
}
get() { # GWPORT HOSTPORT SANDBOX CAP: status and body
	curl -s -m 5 -o "$W/body" -w '%{http_code}' -H "Host: $2-$3.localhost:$1" -H "Authorization: Bearer $4" \
		"http://127.0.0.1:$1/index.html"
}
C1=$(cap S 1 act-1 8080 http)
expect "R5 ALLOW: the sandbox's port through its gateway" "$(get "$GS" 8080 S "$C1") $(cat "$W/body")" "200 hello-from-S"
expect "no credential: 401" "$(curl -s -m 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$GS/")" 401
expect "wrong port: DENY 403" "$(get "$GS" 9090 S "$C1") $(jq -r .reason "$W/body")" "403 wrong-port"
CT=$(cap S 1 act-1 8080 tcp)
expect "wrong protocol (a tcp capability over http): DENY 403" "$(get "$GS" 8080 S "$CT") $(jq -r .reason "$W/body")" \
	"403 wrong-protocol"
CTT=$(cap T 1 act-1 8080 http)
expect "another sandbox's capability at S's gateway: DENY 403" "$(get "$GS" 8080 S "$CTT") $(jq -r .reason "$W/body")" \
	"403 other-sandbox"
expect "S's capability at T's gateway: DENY 403" "$(get "$GT" 8080 T "$C1") $(jq -r .reason "$W/body")" "403 other-sandbox"
expect "a Host naming another sandbox: DENY 403" "$(get "$GS" 8080 T "$C1") $(jq -r .reason "$W/body")" "403 other-sandbox"
CG=$(cap S 1 act-1 1024 http)
expect "the guest API's own port is never a ServicePort" "$(get "$GS" 1024 S "$CG")" 403
big=$(head -c 20000 /dev/zero | tr '\0' a)
expect "a 20 KB request head: 431, answered before the close (not a reset)" \
	"$(curl -s -m 5 -o /dev/null -w '%{http_code}' -H "Host: 8080-S.localhost:$GS" -H "X-Big: $big" \
		"http://127.0.0.1:$GS/")" 431
CBAD=$(echo "$C1" | sed 's/\(.\)$/A/')
[ "$CBAD" = "$C1" ] && CBAD="${C1}x"
expect "a tampered capability: 401" "$(get "$GS" 8080 S "$CBAD")" 401
"$SC" token keygen --json >"$W/key2.json"
COTHER=$("$SC" cap issue --key "$(jq -r .secret "$W/key2.json")" --sandbox S --generation 1 --worker wa \
	--activation act-1 --purpose serviceport --port 8080 --protocol http)
expect "a capability signed by an unknown key: 401" "$(get "$GS" 8080 S "$COTHER") $(jq -r .reason "$W/body")" \
	"401 unknown-key"
CN=$(cap S 2 act-1 8080 http)
expect "a capability for a generation not installed: REFRESH_ROUTE 409" "$(get "$GS" 8080 S "$CN") $(jq -r .reason "$W/body")" \
	"409 newer-generation"

expect "every DENY at the gateway is in the worker's audit log, with its reason" \
	"$(grep '"component":"spaced-netgtw","event":"deny"' "$W/w/audit.log" | grep -q '"reason":"wrong-port"' && echo yes)" yes
expect "GET /metrics on the gateway's own address: its counters" \
	"$(curl -s -m 5 "http://127.0.0.1:$GS/metrics" | grep -c '^spaced_netgtw_opens_total{outcome="refuse"} [1-9]')" 1

# 20 clients that read none of a 16 MB answer: what waits for each in the kernel is bounded by the
# gateway's socket buffers (256 KiB: the kernel holds up to twice that), not grown to 4 MiB by the
# kernel's tuning (the host's TCP memory, shared by every socket)
"$SPACED_BUILD/spaced-node/spaced-launch" exec --state "$W/w/exec/S.1" -- sh -c 'head -c 16000000 /dev/zero >/tmp/big.bin'
cat >"$W/stall.py" <<'EOF'
import socket, sys, time
port, cap = int(sys.argv[1]), sys.argv[2]
socks = []
for _ in range(20):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(("GET /big.bin HTTP/1.1\r\nHost: 8080-S.localhost:%d\r\nAuthorization: Bearer %s\r\n\r\n"
               % (port, cap)).encode())
    socks.append(s)
time.sleep(6)
print(len(socks))
EOF
python3 "$W/stall.py" "$GS" "$C1" >"$W/stall.out" 2>&1 &
STALL=$!
sleep 4
ss -tnH state established "( sport = :$GS )" | awk '{ print $2 }' >"$W/sendq"
wait $STALL
echo "unread bytes the kernel holds per stalled gateway client: $(sort -n "$W/sendq" | tr '\n' ' ')"
expect "20 stalled clients, each holding under 600 KB in the kernel" \
	"$(cat "$W/stall.out") $(wc -l <"$W/sendq" | tr -d ' ') $(awk '$1 >= 600000' "$W/sendq" | wc -l | tr -d ' ')" "20 20 0"

# a guest that does not answer (its execution frozen) holds only the open that
# waits for it: the gateway's loop goes on (GET /metrics answers meanwhile), and
# the open completes once the guest answers again
"$SPACED_BUILD/spaced-node/spaced-launch" ctl --state "$W/w/exec/S.1" PAUSE >/dev/null || fail "PAUSE S"
curl -s -m 10 -o "$W/body-frozen" -w '%{http_code}' -H "Host: 8080-S.localhost:$GS" -H "Authorization: Bearer $C1" \
	"http://127.0.0.1:$GS/index.html" >"$W/code-frozen" &
FROZEN=$!
sleep 0.5
expect "while an open waits for a frozen guest, the gateway answers others (GET /metrics)" \
	"$(curl -s -m 2 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$GS/metrics")" 200
"$SPACED_BUILD/spaced-node/spaced-launch" ctl --state "$W/w/exec/S.1" THAW >/dev/null || fail "THAW S"
wait $FROZEN
expect "and the waiting open is served once the guest is thawed" "$(cat "$W/code-frozen") $(cat "$W/body-frozen")" \
	"200 hello-from-S"

# an established tunnel (raw TCP) through the gateway, driven from a helper
CE=$(cap S 1 act-1 9000 tcp)
cat >"$W/tunnel.py" <<'EOF'
import socket, ssl, sys, time, os
port, host, cap, ctl = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
s = socket.create_connection(("127.0.0.1", port), timeout=10)
if os.environ.get("TUNNEL_CA"):  # a TLS gateway: its certificate checked for the host's name
    s = ssl.create_default_context(cafile=os.environ["TUNNEL_CA"]).wrap_socket(s, server_hostname=host.split(":")[0])
s.sendall(("GET / HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: spaced-tcp\r\n\r\n" % (host, cap)).encode())
head = b""
while b"\r\n\r\n" not in head:
    c = s.recv(1)
    if not c: break
    head += c
print(head.split(b"\r\n")[0].decode(), flush=True)
n = 0
# each command line in ctl: "ping" -> one round trip; "wait" -> read until the stream ends
seen = 0
deadline = time.time() + 60
while time.time() < deadline:
    lines = open(ctl).read().split("\n")
    for cmd in lines[seen:]:
        if not cmd: continue
        seen += 1
        if cmd == "ping":
            n += 1
            msg = b"ping-%d\n" % n
            try:
                s.sendall(msg); got = s.recv(100)
                print("echo" if got == msg else "bad:%r" % got, flush=True)
            except OSError:
                print("cut", flush=True)
        elif cmd == "wait":
            s.settimeout(5)
            try:
                while True:
                    s.sendall(b"x\n")
                    if not s.recv(100): break
                    time.sleep(0.002)
                print("cut", flush=True)
            except OSError:
                print("cut", flush=True)
            print("cut_at_ns %d" % time.time_ns(), flush=True)
            sys.exit(0)
    seen = len([l for l in lines if l]) if False else seen
    time.sleep(0.02)
EOF
: >"$W/ctl"; : >"$W/tunnel.out"
python3 "$W/tunnel.py" "$GS" "9000-S.localhost:$GS" "$CE" "$W/ctl" >"$W/tunnel.out" 2>&1 &
TUN=$!
echo ping >>"$W/ctl"
i=0; until [ "$(grep -c echo "$W/tunnel.out")" -ge 1 ]; do i=$((i + 1)); [ $i -lt 200 ] || break; sleep 0.05; done
expect "a tcp tunnel opens (101) and carries bytes" "$(head -n 2 "$W/tunnel.out" | tr '\n' ' ')" \
	"HTTP/1.1 101 Switching Protocols echo "
# S4: the same generation, another activation
install S 1 act-2 || echo "FAIL: activation change: $(cat "$W/inst.out")"
echo ping >>"$W/ctl"
i=0; until [ "$(grep -c '^echo\|^cut' "$W/tunnel.out")" -ge 2 ]; do i=$((i + 1)); [ $i -lt 200 ] || break; sleep 0.05; done
expect "S4: the established stream survives an activation-only change" "$(sed -n 3p "$W/tunnel.out")" echo
expect "S4: a new open with the old activation needs the new identity (409)" \
	"$(get "$GS" 8080 S "$C1") $(jq -r .reason "$W/body")" "409 other-activation"
C2=$(cap S 1 act-2 8080 http)
expect "S4: a new open with the new activation is served" "$(get "$GS" 8080 S "$C2") $(cat "$W/body")" "200 hello-from-S"
# S1: a deactivation cuts the stream
echo wait >>"$W/ctl"
sleep 0.3
seq=$((seq + 1))
T0=$(date +%s%N)
"$SC" node deactivate $ADM --sandbox S --generation 1 --worker wa --activation act-2 --keep-paused --seq $seq >/dev/null 2>&1
T1=$(date +%s%N)
wait $TUN
expect "S1: the deactivation cuts the established stream" "$(grep -c '^cut$' "$W/tunnel.out")" 1
CUT=$(sed -n 's/^cut_at_ns //p' "$W/tunnel.out")
echo "S1 cut: $(( (CUT - T0) / 1000000 )) ms after the deactivation was sent, $(( (CUT - T1) / 1000000 )) ms after it was acknowledged (target 100 ms)"
expect "after the deactivation: a new open is refused (409 deactivated)" \
	"$(get "$GS" 8080 S "$C2") $(jq -r .reason "$W/body" 2>/dev/null)" "409 deactivated"
expect "the victim (T's gateway) still answers" "$(curl -s -m 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$GT/")" 401
# a key the worker learns later reaches the confined gateway (read through its helper): a
# capability signed with it is refused before, verified after (then 502: nothing listens inside T)
"$SC" token keygen --json >"$W/key2.json"
C3=$(SK=$(jq -r .secret "$W/key2.json"); "$SC" cap issue --key "$SK" --sandbox T --generation 1 --worker wa \
	--activation act-21 --purpose serviceport --port 8080 --protocol http)
expect "a capability of a key not yet installed: 401" "$(get "$GT" 8080 T "$C3")" 401
printf '{"version":2,"keys":[{"key":"%s","not_before":"2020-01-01T00:00:00Z","not_after":"2099-01-01T00:00:00Z"},{"key":"%s","not_before":"2020-01-01T00:00:00Z","not_after":"2099-01-01T00:00:00Z"}]}\n' \
	"$PK" "$(jq -r .public "$W/key2.json")" >"$W/bundle2.json"
"$SC" node keys $ADM "$W/bundle2.json" >/dev/null || fail "keys: a second bundle"
wait_for "the same capability once the key is installed: verified, the guest reached (502: nothing listens)" \
	sh -c "[ \"\$(curl -s -m 5 -o /dev/null -w '%{http_code}' -H 'Host: 8080-T.localhost:$GT' \
		-H 'Authorization: Bearer $C3' http://127.0.0.1:$GT/)\" = 502 ]"
# its serving process killed (a crash, the OOM killer): the supervisor starts another at once, on
# the same listening socket (the port the control plane knows), which reads the keys anew
GTP=$(gwpid "$GT")
[ -n "$GTP" ] && kill -9 "$GTP" # (never kill -9 0: the test's own process group)
i=0; while { [ -z "$(gwpid "$GT")" ] || [ "$(gwpid "$GT")" = "$GTP" ]; } && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
expect "T's gateway serves again on its port, a new serving process (logged)" \
	"$([ -n "$(gwpid "$GT")" ] && [ "$(gwpid "$GT")" != "$GTP" ] && echo new) $(cat "$W"/w/log/*.log | grep -c 'event=serving-process-ended how="signal 9" restarts=1 ')" "new 1"
expect "... and verifies with the keys installed before (502: nothing listens inside)" "$(get "$GT" 8080 T "$C3")" 502
# a serving process that crashes is started again five times at most: each one is a fork of the
# same supervisor (its layout, its canary), which must not become an oracle for whoever makes it
# crash; then the gateway ends (a kill, as above, is no crash: started again each time)
GTS=$(gwsup "$GT")
for k in 1 2 3 4 5 6; do
	GTP=$(gwpid "$GT")
	[ -n "$GTP" ] || break
	kill -SEGV "$GTP"
	i=0; while [ "$(gwpid "$GT")" = "$GTP" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
	i=0; while [ -z "$(gwpid "$GT")" ] && kill -0 "$GTS" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
done
wait_for "after its sixth crash T's gateway ends (supervisor and serving process), said in its log" sh -c \
	"! kill -0 ${GTS:-0} 2>/dev/null && [ -z \"\$(ss -Hltn 'sport = :$GT')\" ] && cat '$W'/w/log/*.log | grep -q 'ended 6 times (signal 11): not started again'"
expect "spaced-node did not restart its group" "$(grep -c 'starting the group\|restart' "$W/w.log")" 0
seq=$((seq + 1)); "$SC" node destroy $ADM --sandbox T --seq $seq >/dev/null 2>&1
seq=$((seq + 1)); "$SC" node destroy $ADM --sandbox S --seq $seq >/dev/null 2>&1
# the worker's egress outlives spaced-node (executions keep their network
# across its restarts); `spaced-node net-down` takes it down for a decommission
expect "net-down while spaced-node serves the state: refused" \
	"$("$NODE" net-down --state "$W/w" 2>&1 >/dev/null | grep -c 'stop it first')" 1
kill "$NPID" 2>/dev/null; wait "$NPID" 2>/dev/null; NPID=""
if [ -s "$W/w/net/netd.pid" ] && [ -s "$W/w/net/pasta.pid" ]; then
	netd_pid=$(cat "$W/w/net/netd.pid"); pasta_pid=$(cat "$W/w/net/pasta.pid")
	expect "after spaced-node stopped: its resolver and pasta still run, the namespace still mounted" \
		"$(kill -0 "$netd_pid" && kill -0 "$pasta_pid" && grep -c " $W/w/net/ns " /proc/mounts)" 1
	expect "net-down: the resolver and pasta stopped, the namespace unmounted" \
		"$("$NODE" net-down --state "$W/w" 2>&1)" "spaced-node: net-down: resolver stopped, pasta stopped, namespace unmounted"
	expect "and they are gone" "$(kill -0 "$netd_pid" 2>/dev/null || kill -0 "$pasta_pid" 2>/dev/null || grep -c " $W/w/net/ns " /proc/mounts)" 0
	expect "net-down again: nothing left to do" "$("$NODE" net-down --state "$W/w" 2>&1)" \
		"spaced-node: net-down: resolver not running, pasta not running, namespace not mounted"
else
	echo "note: no egress on this worker (pasta or nft missing): net-down not checked"
fi

# ---------------- part 2: a cluster ----------------
if ! "$SC" dev up --workers 2 --dir "$D" >"$W/up.out" 2>"$W/up.err"; then
	cat "$W/up.err"; echo "FAIL: dev up"; exit 1
fi
. "$D/env"
X=$("$SC" create --worker worker-1)
"$SC" exec "$X" -- sh -c 'cd /tmp && echo hello-from-X >index.html && setsid python3 -m http.server 8080 --bind 127.0.0.1 >/dev/null 2>&1 & sleep 1' >/dev/null 2>&1
"$SC" expose "$X" 8080 --json >"$W/exp.json"
URL=$(jq -r .url "$W/exp.json"); XC=$(jq -r .capability "$W/exp.json")
# dev up's cluster speaks TLS: so do its gateways, with the worker's certificate (*.gw.localhost)
expect "expose: the URL names the port and the sandbox on loopback, over TLS" \
	"$(echo "$URL" | grep -c "^https://8080-$X.gw.localhost:[0-9]*/$")" 1
expect "expose: the identity is the serving execution's" "$(jq -r .identity.sandbox "$W/exp.json")" "$X"
CA="--cacert $SPACED_CA_FILE"
# shellcheck disable=SC2086
expect "curl -H 'Authorization: Bearer CAP' URL, as printed (the cluster's CA)" \
	"$(curl -s -m 5 $CA -H "Authorization: Bearer $XC" "${URL}index.html")" hello-from-X
GWX=$(echo "$URL" | sed 's/.*://; s/\///')
expect "a client trusting another CA is refused (60)" \
	"$(curl -s -m 5 -o /dev/null -w '%{exitcode}' -H "Authorization: Bearer $XC" "${URL}index.html")" 60
expect "a plaintext client at the TLS gateway gets no answer" \
	"$(curl -s -m 5 -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $XC" -H "Host: 8080-$X.gw.localhost:$GWX" \
	"http://127.0.0.1:$GWX/index.html")" 000
# paused on purpose (its guest frozen) past the first 3 s of the pause: a new open is refused at
# once (REFRESH_ROUTE paused, V1: the client resolves its route again, which resumes an auto-resume
# sandbox), not held for the guest
"$SC" pause "$X" >/dev/null || fail "pause $X"
sleep 3.5
# shellcheck disable=SC2086
expect "paused: the gateway refuses a new open at once (409 paused)" \
	"$(curl -s -m 10 $CA -o "$W/body" -w '%{http_code}' -H "Authorization: Bearer $XC" "${URL}index.html") $(jq -r .reason "$W/body" 2>/dev/null)" \
	"409 paused"
# a gateway's serving process started again while its sandbox is paused (killed; its supervisor
# starts another on the same listening socket, and the first record it reads says paused): the
# pause began before it started and counts as long ago, so a new open is refused at once, as the
# gate refuses, not held 3 s for a guest that stays frozen (V1, R5)
GWP=$(gwpid "$GWX")
if [ -z "$GWP" ]; then
	fail "the gateway listening on $GWX is not found"
else
	kill -9 "$GWP"
	i=0; while { [ -z "$(gwpid "$GWX")" ] || [ "$(gwpid "$GWX")" = "$GWP" ]; } && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
	expect "the gateway serves again on its port: a new serving process" \
		"$([ -n "$(gwpid "$GWX")" ] && [ "$(gwpid "$GWX")" != "$GWP" ] && echo new)" new
	# shellcheck disable=SC2086
	expect "a gateway started again while paused refuses a new open at once (409 paused, within 2.5 s)" \
		"$(curl -s -m 2.5 $CA -o "$W/body" -w '%{http_code}' -H "Authorization: Bearer $XC" "${URL}index.html") $(jq -r .reason "$W/body" 2>/dev/null)" \
		"409 paused"
fi
"$SC" resume "$X" >/dev/null || fail "resume $X"
# shellcheck disable=SC2086
expect "resumed: the gateway serves it again" "$(curl -s -m 5 $CA -H "Authorization: Bearer $XC" "${URL}index.html")" hello-from-X
# hostile clients at the TLS gateway: half a ClientHello, plaintext, nothing at all, held open
python3 - "$GWX" >"$W/hold.out" 2>&1 <<'PY' &
import socket, sys, time
port, socks = int(sys.argv[1]), []
for i in range(60):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall([b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", b"GET / HTTP/1.1\r\n", b""][i % 3])
    socks.append(s)
print("holding", flush=True)
time.sleep(4)
PY
HOLD=$!
i=0; until grep -q holding "$W/hold.out"; do i=$((i + 1)); [ $i -lt 100 ] || break; sleep 0.05; done
# shellcheck disable=SC2086
expect "60 stalled or garbage TLS clients at the gateway: a client is served meanwhile" \
	"$(curl -s -m 5 $CA -H "Authorization: Bearer $XC" "${URL}index.html")" hello-from-X
wait $HOLD
# a browser: the capability once, then the cookie
# shellcheck disable=SC2086
curl -s -m 5 $CA -c "$W/jar" -o /dev/null -D "$W/h302" "${URL}index.html?spaced_token=$XC"
expect "cookie exchange: 302 to the same page without the token" \
	"$(grep -i '^location:' "$W/h302" | tr -d '\r' | cut -d' ' -f2)" "/index.html"
expect "cookie exchange: a __Host- cookie, HttpOnly and Secure (no other host may set one of its name)" \
	"$(grep -ci '^set-cookie: __Host-spaced_gw=.*; Path=/;.*HttpOnly.*Secure' "$W/h302")" 1
# shellcheck disable=SC2086
expect "the cookie alone opens the page" "$(curl -s -m 5 $CA -b "$W/jar" "${URL}index.html")" hello-from-X
CK=$(awk '$6 == "__Host-spaced_gw" {print $7}' "$W/jar")
# shellcheck disable=SC2086
expect "the cookie is bound to its port" "$(curl -s -m 5 $CA -o /dev/null -w '%{http_code}' -H "Cookie: __Host-spaced_gw=$CK" \
	-H "Host: 9999-$X.gw.localhost:$GWX" "https://127.0.0.1:$GWX/")" 403
# shellcheck disable=SC2086
expect "the cookie opens http only, never a tcp tunnel" "$(curl -s -m 5 $CA -o /dev/null -w '%{http_code}' -H "Cookie: __Host-spaced_gw=$CK" \
	-H "Host: 8080-$X.gw.localhost:$GWX" -H 'Connection: Upgrade' -H 'Upgrade: spaced-tcp' "https://127.0.0.1:$GWX/")" 403
# shellcheck disable=SC2086
expect "a forged cookie: 401" "$(curl -s -m 5 $CA -o /dev/null -w '%{http_code}' -H "Cookie: __Host-spaced_gw=${CK}A" \
	-H "Host: 8080-$X.gw.localhost:$GWX" "https://127.0.0.1:$GWX/")" 401
# cookies another host set for the parent domain come first: the valid one still counts (before: the
# first was read alone, and another sandbox's application locked the browser out with 401)
# shellcheck disable=SC2086
expect "a tossed cookie before the gateway's own: the valid one counts" "$(curl -s -m 5 $CA \
	-H "Cookie: spaced_gw=tossed; __Host-spaced_gw=tossed; __Host-spaced_gw=$CK" "${URL}index.html")" hello-from-X
# the exchange's redirect stays on this host
# shellcheck disable=SC2086
curl -s -m 5 $CA -o /dev/null -D "$W/h302b" -H "Host: 8080-$X.gw.localhost:$GWX" \
	"https://127.0.0.1:$GWX//evil.example/?spaced_token=$XC" --path-as-is
expect "the exchange never redirects to another host (//host/…)" \
	"$(grep -i '^location:' "$W/h302b" | tr -d '\r' | cut -d' ' -f2)" "/"
# ---- the gateway's budgets (it runs outside its sandbox's memory limit) ----
GWN=$(gwpid "$GWX")
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
"$SC" exec "$X" -- sh -c 'head -c 20000000 /dev/zero >/tmp/big' >/dev/null
RSS0=$(rss_kib "$GWN")
# 200 admitted streams that never read a 20 MB answer, from four addresses: 128 fit the relay
# budget (64 MiB), the others get 503 at once (before: a thousand such streams held 571 MiB)
mkfifo "$W/bud.in"
python3 "$SPACED_TOP/tests/netgtw_budget.py" "$GWX" "8080-$X.gw.localhost" "$XC" "$SPACED_CA_FILE" 200 \
	<"$W/bud.in" >"$W/bud.out" 2>&1 &
BUD=$!
exec 7>"$W/bud.in"
i=0; until grep -q admitted "$W/bud.out" || [ $i -ge 600 ]; do i=$((i + 1)); sleep 0.1; done
expect "200 streams that never read: 128 admitted within the budget, 72 refused 503" "$(cat "$W/bud.out")" \
	"admitted=128 busy=72"
RSS1=$(rss_kib "$GWN")
expect "the gateway holds its budget and a little more (${RSS0} -> ${RSS1} KiB; with TLS and sanitizers)" \
	"$([ $((RSS1 - RSS0)) -le $((160 * 1024)) ] && echo yes)" yes
# shellcheck disable=SC2086
expect "meanwhile another client's open: 503 busy at once, never held" \
	"$(curl -s -m 5 $CA --interface 127.0.0.9 -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $XC" "${URL}index.html")" 503
exec 7>&-
wait $BUD
i=0; until [ "$(rss_kib "$GWN")" -le $((RSS0 + 32 * 1024)) ] || [ $i -ge 50 ]; do i=$((i + 1)); sleep 0.1; done
expect "the streams gone, their memory is given back ($(rss_kib "$GWN") KiB, ${RSS0} before)" \
	"$([ "$(rss_kib "$GWN")" -le $((RSS0 + 32 * 1024)) ] && echo yes)" yes
# shellcheck disable=SC2086
expect "and clients are served again" "$(curl -s -m 5 $CA -H "Authorization: Bearer $XC" "${URL}index.html")" hello-from-X
# 300 connections from one address trickling TLS bytes and never a head, then one more client from
# that address: the oldest pending heads are pushed out for it (before: 1,100 such connections
# left 3 of 25 requests served)
python3 - "$GWX" >"$W/slow.out" 2>&1 <<'PY' &
import resource, socket, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
port, socks = int(sys.argv[1]), []
for i in range(300):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"\x16\x03\x01")
    socks.append(s)
print("holding", flush=True)
time.sleep(6)
PY
SLOW=$!
i=0; until grep -q holding "$W/slow.out" || [ $i -ge 200 ]; do i=$((i + 1)); sleep 0.05; done
# shellcheck disable=SC2086
expect "300 trickling connections from one address: a client from it is still served" \
	"$(curl -s -m 5 $CA -H "Authorization: Bearer $XC" "${URL}index.html")" hello-from-X
expect "pushed-out and refused connections are counted" \
	"$(curl -s -m 5 $CA "https://127.0.0.1:$GWX/metrics" | awk '/^spaced_netgtw_budget_refusals_total/ {print ($2 > 72)}')" 1
wait $SLOW
# port-forward
: >"$W/pf.out"
"$SC" port-forward "$X" 8080 0 >"$W/pf.out" 2>"$W/pf.err" &
PF=$!
i=0; until grep -q forwarding "$W/pf.out"; do i=$((i + 1)); [ $i -lt 100 ] || break; sleep 0.05; done
LP=$(sed -n 's/forwarding 127.0.0.1:\([0-9]*\) .*/\1/p' "$W/pf.out")
expect "port-forward: a local port reaches the sandbox's port" "$(curl -s -m 5 "http://127.0.0.1:$LP/index.html")" hello-from-X
# a move cuts the streams of the old execution; the new one is reached through the new gateway
"$SC" exec "$X" -- sh -c 'setsid python3 -c "
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((\"127.0.0.1\", 9000)); s.listen(4)
while True:
    c, _ = s.accept()
    while True:
        d = c.recv(100)
        if not d: break
        c.sendall(d)
" >/dev/null 2>&1 &' >/dev/null 2>&1
# the echo server listens before the tunnel asks for it (python's start can take seconds on a loaded host)
"$SC" exec "$X" -- python3 -c 'import socket, time
for i in range(200):
    try:
        socket.create_connection(("127.0.0.1", 9000), timeout=1).close(); break
    except OSError:
        time.sleep(0.05)' >/dev/null 2>&1
"$SC" expose "$X" 9000 --protocol tcp --json >"$W/exp2.json"
GW2=$(jq -r .url "$W/exp2.json" | sed 's/.*://; s/\///')
: >"$W/ctl2"; : >"$W/tunnel2.out"
TUNNEL_CA=$SPACED_CA_FILE python3 "$W/tunnel.py" "$GW2" "9000-$X.gw.localhost:$GW2" "$(jq -r .capability "$W/exp2.json")" \
	"$W/ctl2" >"$W/tunnel2.out" 2>&1 &
TUN2=$!
echo ping >>"$W/ctl2"
i=0; until grep -q '^echo' "$W/tunnel2.out"; do i=$((i + 1)); [ $i -lt 200 ] || break; sleep 0.05; done
expect "a tunnel through the cluster's gateway" "$(sed -n 2p "$W/tunnel2.out")" echo
echo wait >>"$W/ctl2"
sleep 0.2
T0=$(date +%s%N)
"$SC" move "$X" --to worker-2 >/dev/null 2>&1
wait $TUN2
expect "S1: the move cuts the tunnel" "$(grep -c '^cut$' "$W/tunnel2.out")" 1
[ "$(grep -c '^cut$' "$W/tunnel2.out")" -eq 1 ] || { echo "the tunnel's output:"; cat "$W/tunnel2.out"; }
CUT=$(sed -n 's/^cut_at_ns //p' "$W/tunnel2.out")
[ -n "$CUT" ] && echo "move cut: $(( (CUT - T0) / 1000000 )) ms after the move was asked for"
expect "after the move: the old capability at the new gateway is REFRESH_ROUTE" \
	"$(NEWURL=$("$SC" expose "$X" 8080 --json | jq -r .url); curl -s -m 5 --cacert "$SPACED_CA_FILE" -o "$W/body" \
	-w '%{http_code}' -H "Authorization: Bearer $XC" "${NEWURL}") $(jq -r .reason "$W/body")" "409 older-generation"
kill $PF 2>/dev/null

echo "netgtw: $FAILS failure(s)"
[ "$FAILS" -eq 0 ]
