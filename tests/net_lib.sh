# net_lib.sh — an outside host for the network tests and benchmarks (sourced).
# It lives in a network namespace this script makes, on a random /29 of
# 198.18.0.0/15 (which a worker's default policy treats as outside, DESIGN §6);
# nothing is ever sent anywhere else. net_host_up sets:
#   NH_NS, NH_IF   the namespace and the host's end of its veth
#   NH_GW          the host's address on that link (a worker's own address from then on)
#   NH_A, NH_B     the outside host's addresses, and NH_C a third (for a range an operator closes)
#   NH_PID         its server (tests/net_host.py: HTTP :8080, echo :9000, DNS :53)
# DNS records: allowed.test and www.allowed.test -> NH_A, other.test -> NH_B,
# denied.test -> NH_B, evil.test -> 127.0.0.1, private.test -> 10.1.2.3, own.test -> NH_GW,
# closed.test -> NH_C.

net_host_up() {
	command -v ip >/dev/null 2>&1 || return 1
	rnd=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
	third=$((rnd % 256)); fourth=$(( (rnd / 256) % 32 * 8 ))
	NH_NET=198.19.$third
	NH_GW=$NH_NET.$((fourth + 1)); NH_A=$NH_NET.$((fourth + 2)); NH_B=$NH_NET.$((fourth + 3)); NH_C=$NH_NET.$((fourth + 5))
	NH_NS=spxt$$; NH_IF=spxt$$
	ip netns add "$NH_NS" || return 1
	ip link add "$NH_IF" type veth peer name eth0 netns "$NH_NS" || return 1
	# a /29 another such host (a test beside this one) took already: another one
	tries=0
	until ip addr add "$NH_GW/29" dev "$NH_IF" 2>/dev/null && ! ip -4 -o addr show to "$NH_NET.$fourth/29" | grep -v " $NH_IF " | grep -q .; do
		ip addr del "$NH_GW/29" dev "$NH_IF" 2>/dev/null
		tries=$((tries + 1)); [ $tries -lt 20 ] || return 1
		rnd=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
		third=$((rnd % 256)); fourth=$(( (rnd / 256) % 32 * 8 ))
		NH_NET=198.19.$third
		NH_GW=$NH_NET.$((fourth + 1)); NH_A=$NH_NET.$((fourth + 2)); NH_B=$NH_NET.$((fourth + 3)); NH_C=$NH_NET.$((fourth + 5))
	done
	ip link set "$NH_IF" up || return 1
	ip -n "$NH_NS" addr add "$NH_A/29" dev eth0 && ip -n "$NH_NS" addr add "$NH_B/29" dev eth0 &&
		ip -n "$NH_NS" addr add "$NH_C/29" dev eth0 &&
		ip -n "$NH_NS" link set eth0 up && ip -n "$NH_NS" link set lo up &&
		ip -n "$NH_NS" route add default via "$NH_GW" || return 1
	ip netns exec "$NH_NS" python3 "$SPACED_TOP/tests/net_host.py" --lifetime "${NH_LIFETIME:-900}" \
		--record "allowed.test=$NH_A" --record "www.allowed.test=$NH_A" --record "other.test=$NH_B" \
		--record "denied.test=$NH_B" --record "evil.test=127.0.0.1" --record "private.test=10.1.2.3" \
		--record "own.test=$NH_GW" --record "closed.test=$NH_C" >"${NH_LOG:-/dev/null}" 2>&1 &
	NH_PID=$!
	i=0
	until curl -s -m 1 -o /dev/null "http://$NH_A:8080/"; do
		i=$((i + 1)); [ $i -lt 100 ] || return 1
		sleep 0.05
	done
	return 0
}

net_host_down() {
	[ -n "${NH_PID:-}" ] && kill "$NH_PID" 2>/dev/null
	[ -n "${NH_IF:-}" ] && ip link del "$NH_IF" 2>/dev/null
	[ -n "${NH_NS:-}" ] && ip netns del "$NH_NS" 2>/dev/null
	return 0
}

# netns_of SANDBOX ADDR [WORKER]: a process of sandbox SANDBOX's execution on WORKER (worker-1) of
# the dev cluster in $D whose network namespace's eth0 has ADDR: a child of the execution's
# launcher (its record's pid), so never another cluster's sandbox with the same address
netns_of() {
	lpid=$("$SPACED_BUILD/spacectl/spacectl" node status --admin "$D/${3:-worker-1}/admin.sock" |
		jq -r --arg s "$1" '.result.records[] | select(.identity.sandbox == $s and .pid > 0) | .pid' | tail -n 1)
	[ -n "$lpid" ] || return 0
	for p in $(pgrep -P "$lpid"); do
		nsenter --net="/proc/$p/ns/net" ip -4 -o addr show dev eth0 2>/dev/null | grep -q " $2/" && { echo "$p"; return; }
	done
}
