#!/bin/sh
# make bench-netgtw (issue 14): the same upstream in a sandbox, reached through spaced-netgtw and
# through Debian's nginx as a reverse proxy (and socat for raw TCP), with the same load generator
# (bench/netload.c), in the same run, alternately; and the sandbox's egress against the host's own.
#   HTTP: small answers (nginx `return 200` inside the sandbox), CONNS keep-alive connections for
#         SECS seconds: requests/s and p99, netgtw vs nginx (proxy_pass with upstream keepalive,
#         one worker process, like netgtw's one process).
#   TCP:  a bulk transfer of BYTES from a source inside the sandbox: netgtw's tunnel vs socat.
#   egress: BYTES from an outside host (its own namespace, 198.18.0.0/15) read inside the sandbox
#         (veth, nftables, pasta) vs read by the host itself.
# Ratios are medians over ROUNDS rounds. Last line: JSON.
#   usage: sh bench/netgtw_bench.sh BUILD [ROUNDS] [SECS] [CONNS] [BYTES]
set -u
B=$(cd "${1:?build dir}" && pwd)
ROUNDS=${2:-3}; SECS=${3:-4}; CONNS=${4:-16}; BYTES=${5:-1000000000}
TOP=$(cd "$(dirname "$0")/.." && pwd)
export SPACED_BUILD=$B SPACED_TOP=$TOP
SC=$B/spacectl/spacectl
NL=$B/bench/netload
[ "$(id -u)" -eq 0 ] || { echo "bench-netgtw needs root"; exit 1; }
for t in nginx socat pasta nft jq; do command -v $t >/dev/null || { echo "$t is missing (scripts/setup.sh)"; exit 1; }; done
. "$TOP/tests/net_lib.sh"
W=$(mktemp -d)
D=$W/c
PIDS=""
cleanup() {
	for p in $PIDS; do kill "$p" 2>/dev/null; done
	[ -f "$W/proxy.pid" ] && kill "$(cat "$W/proxy.pid" 2>/dev/null)" 2>/dev/null
	"$SC" dev down --dir "$D" >/dev/null 2>&1
	net_host_down
	rm -rf "$W"
}
trap cleanup EXIT
NH_LIFETIME=1800 net_host_up || { echo "cannot make the outside host"; exit 1; }
ip netns exec "$NH_NS" "$NL" source 9100 & PIDS="$PIDS $!"
# plaintext, as the nginx and socat baselines are: the relay is what is measured
# (a TLS cluster's gateways speak TLS, docs/network.md); the egress path too, not the operator's
# bound (spaced-node's default --net-rate holds a sandbox at 500 Mbit/s each way)
"$SC" dev up --workers 1 --dir "$D" --plaintext --net-rate "${BENCH_NET_RATE:-0}" >/dev/null 2>"$W/up.err" ||
	{ cat "$W/up.err"; exit 1; }
. "$D/env"
export SPACED_ROUTE_CACHE=$W/routes
S=$("$SC" create --cpus 2 --memory 1G) || exit 1
"$SC" fs write "$S" /tmp/netload <"$NL" && "$SC" exec "$S" -- chmod 755 /tmp/netload
cat >"$W/up.conf" <<'EOF'
daemon off; master_process off; worker_processes 1; pid /tmp/up.pid; error_log /tmp/up.err;
events { worker_connections 1024; }
http { access_log off; client_body_temp_path /tmp/nb; proxy_temp_path /tmp/np; fastcgi_temp_path /tmp/nf;
       uwsgi_temp_path /tmp/nu; scgi_temp_path /tmp/ns;
       server { listen 127.0.0.1:8080; keepalive_requests 1000000; location / { return 200 "hello\n"; } } }
EOF
"$SC" fs write "$S" /tmp/up.conf <"$W/up.conf"
"$SC" exec "$S" -- sh -c 'setsid nginx -c /tmp/up.conf >/dev/null 2>&1 & setsid /tmp/netload source 9000 >/dev/null 2>&1 & sleep 1'
INIT=$(sed -n 's/.*init=\([0-9]*\).*/\1/p' "$D/worker-1/exec/$S.1/launcher")
NS=/proc/$INIT/ns/net
# the reverse proxy: Debian's nginx in the sandbox's network namespace (its loopback reaches the upstream)
cat >"$W/proxy.conf" <<EOF
daemon off; master_process off; worker_processes 1; pid $W/proxy.pid; error_log $W/proxy.err;
events { worker_connections 4096; }
http { access_log off; client_body_temp_path $W/nb; proxy_temp_path $W/np; fastcgi_temp_path $W/nf;
       uwsgi_temp_path $W/nu; scgi_temp_path $W/ns;
       upstream up { server 127.0.0.1:8080; keepalive 64; }
       server { listen 127.0.0.1:8081; keepalive_requests 1000000;
                location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; } } }
EOF
nsenter --net="$NS" nginx -c "$W/proxy.conf" >/dev/null 2>&1 & PIDS="$PIDS $!"
nsenter --net="$NS" socat TCP-LISTEN:9001,bind=127.0.0.1,reuseaddr,fork TCP:127.0.0.1:9000 & PIDS="$PIDS $!"
sleep 1
"$SC" expose "$S" 8080 --json >"$W/e1.json"; "$SC" expose "$S" 9000 --protocol tcp --json >"$W/e2.json"
GW=$(jq -r .url "$W/e1.json" | sed 's/.*://; s/\///')
CH=$(jq -r .capability "$W/e1.json"); CT=$(jq -r .capability "$W/e2.json")
med() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
val() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }
: >"$W/r"
for r in $(seq 1 "$ROUNDS"); do
	# capabilities live 120 s: a fresh one each round
	"$SC" expose "$S" 8080 --json >"$W/e1.json"; CH=$(jq -r .capability "$W/e1.json")
	"$SC" expose "$S" 9000 --protocol tcp --json >"$W/e2.json"; CT=$(jq -r .capability "$W/e2.json")
	g=$("$NL" http 127.0.0.1 "$GW" "8080-$S.localhost:$GW" "$CH" "$CONNS" "$SECS")
	n=$(nsenter --net="$NS" "$NL" http 127.0.0.1 8081 "localhost" - "$CONNS" "$SECS")
	gt=$("$NL" tcp 127.0.0.1 "$GW" "9000-$S.localhost:$GW" "$CT" "$BYTES")
	st=$(nsenter --net="$NS" "$NL" tcp 127.0.0.1 9001 - - "$BYTES")
	eg=$("$SC" exec "$S" -- /tmp/netload tcp "$NH_A" 9100 - - "$BYTES")
	ho=$("$NL" tcp "$NH_A" 9100 - - "$BYTES")
	echo "round $r: netgtw $g | nginx $n | tcp netgtw $gt | socat $st | egress $eg | host $ho"
	echo "$(echo "$g" | val rps) $(echo "$n" | val rps) $(echo "$g" | val p99_us) $(echo "$n" | val p99_us) $(echo "$gt" | val mbps) $(echo "$st" | val mbps) $(echo "$eg" | val mbps) $(echo "$ho" | val mbps)" >>"$W/r"
done
ratio() { awk -v a="$1" -v b="$2" '{print $a / $b}' "$W/r" | med; }
col() { awk -v a="$1" '{print $a}' "$W/r" | med; }
RPS=$(ratio 1 2); P99=$(ratio 3 4); TCP=$(ratio 5 6); EGR=$(ratio 7 8)
echo "medians over $ROUNDS rounds ($CONNS connections, ${SECS}s each; $BYTES bytes per transfer):"
echo "  HTTP req/s   netgtw $(col 1)  nginx $(col 2)   ratio $RPS (target >= 1.0)"
echo "  HTTP p99 us  netgtw $(col 3)  nginx $(col 4)   ratio $P99 (target <= 1.0)"
echo "  TCP MB/s     netgtw $(col 5)  socat $(col 6)   ratio $TCP (target >= 0.9)"
echo "  egress MB/s  sandbox $(col 7)  host $(col 8)   ratio $EGR"
printf '{"http_rps_ratio_vs_nginx":%s,"http_p99_ratio_vs_nginx":%s,"tcp_mbps_ratio_vs_socat":%s,"egress_mbps_ratio_vs_host":%s}\n' \
	"$RPS" "$P99" "$TCP" "$EGR"
