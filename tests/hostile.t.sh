#!/bin/sh
# run-tests: paired, about 90 s
# run-tests: sanitized (hostile clients and guests against node-api, the gate and the guest)
# A hostile client against a real worker (`spacectl dev up`, process substrate; issue 12): slow
# readers of large files, big JSON answers left unread, exec bodies left unfinished, slowloris from
# other addresses, malformed HTTP and WebSocket input, a guest that stops answering, and a flood of
# forged capabilities (whose audit lines are held to the caller's rate: ratelimit.h). While each attack runs a victim tenant's sandbox on the same worker
# is read from and executed in; every victim operation must succeed, no process of the worker may
# die or be restarted, and node-api and the gate must stay within bounded memory. A slow reader
# slows only its own stream and is cut after the stall timeout (here 5 s); a command that is only
# quiet that long is not.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
SC=$SPACED_BUILD/spacectl/spacectl
HC="python3 $SPACED_TOP/tests/hostile_client.py"
need_substrate
command -v python3 >/dev/null 2>&1 || { echo "python3 is not installed"; exit 77; }
# under AddressSanitizer every freed buffer waits in a quarantine (256 MiB by default), which
# would hide what node-api and the gate really hold; without it their RSS shows their buffers
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=0"
W=$(mktemp -d)
D=$W/cluster
export SPACED_ROUTE_CACHE="$W/routes"
VLOOP=""
trap '[ -n "$VLOOP" ] && kill $VLOOP 2>/dev/null; "$SC" dev down --dir "$D" >/dev/null 2>&1; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT

# plaintext on purpose: the attackers are raw sockets (the TLS variant of the key attacks: tls.t.sh)
if ! "$SC" dev up --workers 1 --dir "$D" --stall-timeout 5 --plaintext >"$W/up.out" 2>"$W/up.err"; then
	cat "$W/up.err"; tail -n 20 "$D"/*.log 2>/dev/null
	echo "FAIL: dev up"; exit 1
fi
. "$D/env"
VICTIM=$("$CP" admin --state "$D/cp" create-tenant victim 2>/dev/null)
as_victim() { SPACED_API_KEY=$VICTIM SPACED_ROUTE_CACHE="$W/victim-routes" "$SC" "$@"; }
VX=$(as_victim create --worker worker-1)
printf 'victim data\n' | as_victim fs write "$VX" /workspace/v.txt
A=$("$SC" create --worker worker-1)
"$SC" exec "$A" -- sh -c 'head -c 104857600 /dev/urandom >/workspace/big' || { echo "FAIL: the attacker's file"; exit 1; }
"$SC" route "$A" --purpose fs.read --purpose exec --json >"$W/route.json"
CAP=$(jq -r .capability "$W/route.json")
PORT=$(jq -r .worker_url "$W/route.json" | sed 's/.*://')

# ---- a quiet command is no stalled client: the victim's exec that prints nothing (streamed, over a
# WebSocket) or a little (a JSON answer) for twice the stall timeout ends whole (both were cut after
# the stall timeout: the few bytes node-api had taken itself, a STARTED or the output collected for
# the answer, were never credited to the gate) ----
as_victim route "$VX" --purpose exec --json >"$W/qroute.json"
( as_victim exec "$VX" -- sh -c 'sleep 12; echo done' >"$W/quiet-ws.out" 2>&1; echo "$?" >"$W/quiet-ws.rc" ) &
QUIET_WS=$!
( curl -s -m 60 -H "Authorization: Bearer $(jq -r .capability "$W/qroute.json")" -H 'Content-Type: application/json' \
	--data '{"argv":["sh","-c","echo begun; sleep 12; echo done"]}' \
	"$(jq -r .worker_url "$W/qroute.json")/v1/sandboxes/$VX/exec" >"$W/quiet-json.out" 2>&1 ) &
QUIET_JSON=$!

# the worker's processes: none may die or be started again (role_pids, tests/cp_lib.sh: a child a
# role forks for a moment, the executor's jobs before they exec, is not counted)
sup=$(awk '$1 == "worker-1" {print $2}' "$D/pids")
roles() {
	for r in spaced-gate spaced-api spaced-executor spaced-link; do
		for p in $(role_pids $r); do
			printf '%s:%s ' $r "$p"
		done
	done
}
ROLES0=$(roles)
echo "worker-1: supervisor $sup, $ROLES0"
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$(echo "$ROLES0" | tr ' ' '\n' | sed -n "s/^$1://p")/status"; }

# victim_during WHAT COMMAND...: the victim reads and executes in a loop while COMMAND runs
victim_during() {
	what=$1; shift
	: >"$W/victim.err"
	(
		n=0
		while [ ! -e "$W/victim.stop" ]; do
			got=$(as_victim fs read "$VX" /workspace/v.txt 2>&1)
			[ "$got" = "victim data" ] || echo "read: $got" >>"$W/victim.err"
			got=$(as_victim exec "$VX" -- echo alive 2>&1)
			[ "$got" = "alive" ] || echo "exec: $got" >>"$W/victim.err"
			n=$((n + 1))
		done
		echo "$n" >"$W/victim.n"
	) &
	VLOOP=$!
	"$@"
	touch "$W/victim.stop"
	wait "$VLOOP"
	VLOOP=""
	rm -f "$W/victim.stop"
	expect "during $what: the victim's operations all succeeded ($(cat "$W/victim.n") rounds)" \
		"$(wc -l <"$W/victim.err" | tr -d ' ')" 0
	[ -s "$W/victim.err" ] && head -n 3 "$W/victim.err"
	expect "during $what: no process of the worker died" "$(roles)" "$ROLES0"
}

# ---- slow readers: 120 downloads of 100 MB that read nothing, one of 7.5 MB read steadily ----
# Each stalled stream stops at its window (1 MiB; 64 KiB once all windows hold 64 MiB: node.h) and
# is cut once its client has taken none of its output for the stall timeout; a victim's download read
# slowly but steadily for 2.5 times the stall timeout keeps its stream. (60 streams from each of
# two of the attacker's sandboxes and addresses: one guest alone answers some of them late.)
A2=$("$SC" create --worker worker-1)
"$SC" exec "$A2" -- sh -c 'head -c 104857600 /dev/urandom >/workspace/big' || { echo "FAIL: the attacker's file"; exit 1; }
CAP2=$("$SC" route "$A2" --purpose fs.read --json | jq -r .capability)
as_victim exec "$VX" -- sh -c 'head -c 7500000 /dev/urandom >/workspace/mid'
VRCAP=$(as_victim route "$VX" --purpose fs.read --json | jq -r .capability)
api_rss0=$(rss_kb spaced-api)
gate_rss0=$(rss_kb spaced-gate)
# the kernel's memory for the TCP sockets of node-api's port, both ends (pages of 4 KiB: what each
# has queued to send or received, and its forward allocation, as /proc/net/sockstat counts them for
# the whole host): output a client does not read that the kernel holds for it is outside node-api's
# budget and windows, so node-api caps its sockets' send buffers (--socket-buffer, 256 KiB: the
# kernel holds twice that at most)
tcp_pages() {
	ss -tmnOH "( sport = :$PORT or dport = :$PORT )" | grep -o 'skmem:([^)]*)' |
		awk -F'[(,)]' '{ for (i = 2; i <= NF; i++) if ($i ~ /^[rwf][0-9]/) t += substr($i, 2) } END { printf "%d\n", t / 4096 }'
}
tcp0=$(tcp_pages)
slow_readers() {
	$HC slowread "$PORT" "$CAP" "$A/files?path=/workspace/big" 60 90 127.0.0.6 >"$W/slow1.json" &
	sr1=$!
	$HC slowread "$PORT" "$CAP2" "$A2/files?path=/workspace/big" 60 90 127.0.0.7 >"$W/slow2.json" &
	sr2=$!
	$HC steadyread "$PORT" "$VRCAP" "$VX/files?path=/workspace/mid" 600000 >"$W/steady.json" &
	st=$!
	api_peak=0
	gate_peak=0
	tcp_peak=0
	while kill -0 $sr1 2>/dev/null || kill -0 $sr2 2>/dev/null; do
		r=$(rss_kb spaced-api)
		[ "${r:-0}" -gt "$api_peak" ] && api_peak=$r
		r=$(rss_kb spaced-gate)
		[ "${r:-0}" -gt "$gate_peak" ] && gate_peak=$r
		r=$(tcp_pages)
		[ "${r:-0}" -gt "$tcp_peak" ] && tcp_peak=$r
		sleep 0.3
	done
	echo "$api_peak" >"$W/api.rss"
	echo "$gate_peak" >"$W/gate.rss"
	echo "$tcp_peak" >"$W/tcp.pages"
	wait $sr1 $sr2 $st
	jq -s '{conns: (map(.conns) | add), cut: (map(.cut) | add), streaming: (map(.streaming) | add),
		held_for: (map(.held_for) | max), bytes: (map(.bytes) | add)}' "$W/slow1.json" "$W/slow2.json" >"$W/slow.json"
}
victim_during "120 stalled 100 MB downloads and a steady slow one" slow_readers
echo "slow readers: $(jq -c '{conns, cut, streaming, held_for, refused: ([.bytes[] | select(. < 4096)] | length)}' "$W/slow.json"); steady: $(cat "$W/steady.json"); node-api RSS ${api_rss0} -> peak $(cat "$W/api.rss") KiB, gate ${gate_rss0} -> peak $(cat "$W/gate.rss") KiB, the kernel's TCP memory ${tcp0} -> peak $(cat "$W/tcp.pages") pages"
expect "no stalled download completed or still streams (each was cut, or refused by its own busy guest)" \
	"$(jq -r '"\(.streaming) \([.bytes[] | select(. >= 104857600)] | length)"' "$W/slow.json")" "0 0"
expect "what each stalled reader got is bounded by its window (< 8 MiB each)" \
	"$(jq '[.bytes[] | select(. > 8388608)] | length' "$W/slow.json")" 0
expect "the victim's steady reader (600 KB/s, 2.5 times the stall timeout) got its whole download" \
	"$(jq -r '"\(.status) \(.complete) \(.bytes)"' "$W/steady.json")" "200 true 7500000"
expect "node-api stayed under 96 MiB more than at rest while 120 readers stalled (64 MiB of windows; 105 MiB on the old code)" \
	"$([ $(($(cat "$W/api.rss") - api_rss0)) -lt 98304 ] && echo yes)" yes
expect "the gate stayed under 64 MiB more than at rest" "$([ $(($(cat "$W/gate.rss") - gate_rss0)) -lt 65536 ] && echo yes)" yes
expect "the kernel held under 120 MiB more for node-api's TCP sockets and their clients' while 120 readers stalled (1 MiB each at most; 450 MiB on the old code: 4 MiB each)" \
	"$([ $(($(cat "$W/tcp.pages") - tcp0)) -lt 30720 ] && echo yes)" yes
expect "a fresh download of the same file is whole" "$("$SC" fs read "$A" /workspace/big | wc -c | tr -d ' ')" 104857600

# ---- big JSON answers: 40 execs of 16 MB of output at once whose clients read nothing ----
# node-api holds what it buffers for requests (exec bodies, JSON answers being collected) and the
# answers its clients have not taken to --answer-memory (256 MiB): past it a big answer is refused
# 503 and a small one still goes through; an answer nobody takes is dropped after the stall timeout
as_victim route "$VX" --purpose exec --json >"$W/vroute.json"
VCAP=$(jq -r .capability "$W/vroute.json")
api_rss1=$(rss_kb spaced-api)
MP=$(cat "$D/worker-1/metrics.port")
# the victim's own big answers (8 MB of output: 10.7 MB of base64), asked one after the other while
# bigjson ($1) runs, each noted with what node-api held just before (MiB)
victim_big() {
	: >"$W/big.vbig"
	while kill -0 "$1" 2>/dev/null; do
		h=$(curl -s "http://127.0.0.1:$MP/metrics" | awk '/^spaced_node_api_held_bytes /{printf "%d", $2 / 1048576}')
		v=$(curl -s -H "Authorization: Bearer $VCAP" -H 'Content-Type: application/json' \
			--data '{"argv":["head","-c","8000000","/dev/zero"]}' "http://127.0.0.1:$PORT/v1/sandboxes/$VX/exec" |
			jq -r 'if .exit_code == 0 and (.stdout_b64url | length) == 10666667 then "ok" else (.code // "bad") end' \
				2>/dev/null || echo bad)
		echo "$v@$h" >>"$W/big.vbig"
	done
}
big_answers() {
	$HC bigjson "$PORT" 127.0.0.5 "$CAP" "$A" 40 12 'head -c 16000000 /dev/zero' >"$W/bigjson.json" &
	bj=$!
	victim_big $bj &
	vb=$!
	peak=0
	small=""
	while kill -0 $bj 2>/dev/null; do
		r=$(rss_kb spaced-api)
		[ "${r:-0}" -gt "$peak" ] && peak=$r
		small="$small$(curl -s -o /dev/null -w '%{http_code} ' -H "Authorization: Bearer $VCAP" \
			-H 'Content-Type: application/json' --data '{"argv":["echo","small"]}' \
			"http://127.0.0.1:$PORT/v1/sandboxes/$VX/exec")"
		sleep 0.3
	done
	wait $bj $vb
	echo "$peak" >"$W/big.peak"
	echo "$small" >"$W/big.small"
}
victim_during "40 unread 16 MB JSON exec answers" big_answers
echo "big answers: $(cat "$W/bigjson.json"); node-api RSS ${api_rss1} -> peak $(cat "$W/big.peak") KiB; victim's JSON execs: $(cat "$W/big.small"); victim's big ones (outcome@MiB node-api held before): $(tr '\n' ' ' <"$W/big.vbig")"
expect "some big answers were given (200) and others refused (503) while the budget was full" \
	"$(jq -r '(.answers["200"] // 0) > 0 and (.answers["503"] // 0) > 0' "$W/bigjson.json")" true
expect "node-api stayed under 384 MiB more than at rest (the budget, 256 MiB, and one answer being made)" \
	"$([ $(($(cat "$W/big.peak") - api_rss1)) -lt 393216 ] && echo yes)" yes
expect "the victim's small JSON execs were all answered 200 meanwhile" \
	"$(tr ' ' '\n' <"$W/big.small" | grep -c . | tr -d ' ') $(tr ' ' '\n' <"$W/big.small" | grep -vc '^200$\|^$' | tr -d ' ')" \
	"$(tr ' ' '\n' <"$W/big.small" | grep -c . | tr -d ' ') 0"
expect "the victim's own big JSON answers (8 MB, one after the other) were all given meanwhile: the attacker's unread answers hold its share, not the whole budget (on the old code those asked while it was full were 503)" \
	"$(grep -c . "$W/big.vbig") $(grep -vc '^ok@' "$W/big.vbig")" "$(grep -c . "$W/big.vbig") 0"

# ---- exec bodies held unfinished: 250 requests whose 1 MiB body never ends ----
# node-api reads an exec body before the gate checks its capability: such bodies hold a quarter of
# --answer-memory at most (past it one is refused 503), shared fairly between client addresses, so
# nobody can fill the budget without a capability, and two addresses cannot take that quarter
# from a third (on the old code the 250 held 250 MiB of 256 and the victim's big answers were 503)
python3 -c 'import json; print(json.dumps({"argv": ["wc", "-c"], "stdin": "a" * 900000}))' >"$W/bigbody.json"
victim_body() { # an exec of the victim's own with a 900 KB body, from another address, while $1 runs
	: >"$W/vbody"
	sleep 3
	while kill -0 "$1" 2>/dev/null; do
		curl -s -H "Authorization: Bearer $VCAP" -H 'Content-Type: application/json' --data-binary @"$W/bigbody.json" \
			"http://127.0.0.1:$PORT/v1/sandboxes/$VX/exec" |
			jq -r 'if .exit_code == 0 and (.stdout | rtrimstr("\n")) == "900000" then "ok" else (.code // "bad") end' \
				2>/dev/null >>"$W/vbody" || echo bad >>"$W/vbody"
		sleep 0.5
	done
}
held_bodies() {
	$HC bodyhold "$PORT" 127.0.0.8 "$CAP" "$A" 125 12 >"$W/bodyhold8.json" &
	bh=$!
	$HC bodyhold "$PORT" 127.0.0.9 "$CAP" "$A" 125 12 >"$W/bodyhold9.json" &
	bh9=$!
	victim_big $bh &
	vb=$!
	victim_body $bh &
	vy=$!
	wait $bh $bh9 $vb $vy
	jq -cs '{conns: (map(.conns) | add), held: (map(.answers.held // 0) | add),
		refused503: (map(.answers["503"] // 0) | add)}' "$W/bodyhold8.json" "$W/bodyhold9.json" >"$W/bodyhold.json"
}
victim_during "250 exec bodies of 1 MiB from two addresses held unfinished" held_bodies
echo "held bodies: $(cat "$W/bodyhold.json"); victim's big ones (outcome@MiB node-api held before): $(tr '\n' ' ' <"$W/big.vbig"); victim's 900 KB exec bodies: $(tr '\n' ' ' <"$W/vbody")"
expect "bodies not yet checked held a quarter of the budget at most (64 MiB), two addresses half of it: the rest were refused 503" \
	"$(jq -r '.conns == 250 and .held <= 40 and .refused503 >= 200' "$W/bodyhold.json")" true
expect "the victim's 900 KB exec bodies from a third address were all taken meanwhile (503 when two addresses could hold the whole quarter)" \
	"$(grep -c . "$W/vbody") $(grep -vc '^ok$' "$W/vbody")" "$(grep -c . "$W/vbody") 0"
expect "the victim's big JSON answers were all given meanwhile" \
	"$(grep -c . "$W/big.vbig") $(grep -vc '^ok@' "$W/big.vbig")" "$(grep -c . "$W/big.vbig") 0"

# ---- slowloris: 300 connections from other addresses trickling their heads ----
slowloris() {
	$HC slowloris "$PORT" 127.0.0.2 150 14 >"$W/loris2.json" &
	l2=$!
	$HC slowloris "$PORT" 127.0.0.3 150 14 >"$W/loris3.json" &
	l3=$!
	wait $l2 $l3
}
victim_during "slowloris (300 connections from 127.0.0.2 and .3)" slowloris
echo "slowloris: $(cat "$W/loris2.json") $(cat "$W/loris3.json")"
expect "each address is held to 128 connections: 128 of its 150 got 408, the rest were closed at once" \
	"$(jq -rs '[.[] | .answers["408"] // 0] | join(" ")' "$W/loris2.json" "$W/loris3.json")" "128 128"
expect "trickled heads are ended by the head deadline (408 or closed)" \
	"$(jq -s '[.[] | .closed_by_server] | add' "$W/loris2.json" "$W/loris3.json")" 300

# ---- malformed input: clean errors, the worker keeps serving ----
$HC malformed "$PORT" "$CAP" "$A" >"$W/malformed"
cat "$W/malformed"
m() { awk -v n="$1" '$1 == n {print $2}' "$W/malformed"; }
expect "64 KiB header -> 431" "$(m header-64k)" 431
expect "NUL in a header -> 400" "$(m nul-in-header)" 400
expect "Content-Length 2^64 -> 400" "$(m content-length-2^64)" 400
expect "two Content-Length -> 400" "$(m two-content-lengths)" 400
expect "bad chunk size -> 400" "$(m bad-chunk-size)" 400
expect "chunked and Content-Length -> 400" "$(m chunked-and-length)" 400
expect "bare LF -> 400" "$(m bare-lf)" 400
expect "obsolete line folding -> 400" "$(m obs-fold)" 400
expect "space before the colon -> 400" "$(m space-before-colon)" 400
expect "an h2c upgrade is not taken (answered as HTTP/1.1)" "$(m h2c-upgrade)" 200
expect "HTTP/0.9 -> 400" "$(m http-0.9)" 400
expect "10 KiB request target -> 414" "$(m target-10k)" 414
expect "an unmasked client WebSocket frame -> close 1002" "$($HC ws "$PORT" "$CAP" "$A" unmasked)" 1002
expect "reserved bits -> close 1002" "$($HC ws "$PORT" "$CAP" "$A" reserved-bits)" 1002
expect "a 2^62-byte frame -> close 1009" "$($HC ws "$PORT" "$CAP" "$A" huge-length)" 1009
expect "invalid UTF-8 in a text frame -> close 1007" "$($HC ws "$PORT" "$CAP" "$A" bad-utf8-text)" 1007
expect "input after the end of input -> close 1008" "$($HC ws "$PORT" "$CAP" "$A" input-after-end)" 1008
expect "after all that, no process of the worker died" "$(roles)" "$ROLES0"

# ---- a flood of forged capabilities: every one refused, their audit lines held to the caller's rate ----
# (DESIGN §5 "every DENY is written to an audit log": past the rate a DENY is counted, by caller and
# reason, in a deny-summary line within a few seconds; its identity is not written, the metrics count
# each by reason)
AUDIT=$D/worker-1/audit.log
a0=$(grep -c '"event":"deny"' "$AUDIT")
deny_flood() { $HC denyflood "$PORT" 127.0.0.4 "$CAP" "$A" 3000 >"$W/flood.json"; }
victim_during "3000 requests with a forged capability from 127.0.0.4" deny_flood
echo "deny flood: $(cat "$W/flood.json")"
expect "every forged request was refused 401" "$(jq -r '.answers["401"]' "$W/flood.json")" 3000
added=$(($(grep -c '"event":"deny"' "$AUDIT") - a0))
secs=$(jq -r '.seconds | ceil' "$W/flood.json")
expect "the flood added its caller's burst and no more than its rate after ($added lines in ${secs} s)" \
	"$([ "$added" -ge 200 ] && [ "$added" -le $((200 + 20 * (secs + 1))) ] && echo yes)" yes
counted() {
	[ "$(grep '"caller":"127.0.0.4"' "$AUDIT" |
		jq -s '([.[] | select(.event == "deny")] | length) + ([.[] | select(.event == "deny-summary") | .total] | add // 0)')" = 3000 ]
}
wait_for "every forged request is a deny line of its own or counted in its caller's deny-summary" counted
expect "the summaries name the reason the caller's own deny lines give" \
	"$(grep '"caller":"127.0.0.4"' "$AUDIT" | jq -r 'select(.event == "deny-summary") | .held_back | keys[]' | sort -u | tr '\n' ' ')" \
	"$(grep '"caller":"127.0.0.4"' "$AUDIT" | jq -r 'select(.event == "deny") | .reason' | sort -u | tr '\n' ' ')"

wait "$QUIET_WS" "$QUIET_JSON"
expect "a streamed exec quiet for twice the stall timeout ends whole" \
	"$(cat "$W/quiet-ws.rc") $(tr '\n' ' ' <"$W/quiet-ws.out")" "0 done "
expect "a JSON exec quiet for twice the stall timeout ends whole" \
	"$(jq -j '.stdout' "$W/quiet-json.out" 2>/dev/null | tr '\n' ' ')" "begun done "

# ---- a flood of usage requests on one sandbox: they share measurements, so the executor's queue,
# which every tenant's create, pause and snapshot go through, holds one usage job of the tenant's at
# most (each request was a job of its own: 120 a second took a victim's create from 0.1-0.3 s to
# 1.4-8.7 s) ----
UCAP=$("$SC" route "$A" --purpose lifecycle --json | jq -r .capability)
mval() { curl -s "http://127.0.0.1:$MP/metrics" | awk -v k="spaced_node_usage_requests_total{answer=\"$1\"}" '$1 == k {print $2}'; }
m0=$(mval measured)
s0=$(mval shared)
usage_flood() {
	seq 400 | xargs -P 40 -I{} curl -s -m 30 -o /dev/null -w '%{http_code}\n' -H "Authorization: Bearer $UCAP" \
		"http://127.0.0.1:$PORT/v1/sandboxes/$A/usage" >"$W/usage.codes" &
	uf=$!
	VC=$(as_victim create --worker worker-1 2>"$W/vc.err") && as_victim rm "$VC" >/dev/null 2>>"$W/vc.err"
	echo "$?" >"$W/vc.rc"
	wait "$uf"
}
victim_during "a flood of 400 usage requests, 40 at once" usage_flood
expect "the victim's create and rm during the flood succeeded" "$(cat "$W/vc.rc")" 0
expect "every usage request was answered (200)" "$(grep -c '^200$' "$W/usage.codes")" 400
m1=$(mval measured)
s1=$(mval shared)
echo "  usage: $((m1 - m0)) measurements for $((m1 - m0 + s1 - s0)) requests"
expect "400 requests shared their measurements (at most 60 made)" \
	"$([ $((m1 - m0)) -ge 1 ] && [ $((m1 - m0)) -le 60 ] && [ $((m1 - m0 + s1 - s0)) -eq 400 ] && echo yes)" yes

# ---- a guest that stops answering: its own requests fail, nobody else's wait ----
G=$("$SC" create --worker worker-1)
"$SC" exec "$G" -- true
lpid=$("$SC" node status --admin "$D/worker-1/admin.sock" | jq -r ".result.records[] | select(.identity.sandbox == \"$G\") | .pid")
gpid=$(pgrep -P "$lpid" | head -n 1)
stalled_guest() {
	kill -STOP "$gpid"
	jobs_=""
	for i in 1 2 3; do timeout 8 "$SC" exec "$G" --no-retry -- true >/dev/null 2>&1 & jobs_="$jobs_ $!"; done
	timeout 8 "$SC" fs read "$G" /etc/hostname --no-retry >"$W/stalled.out" 2>&1
	echo "$?" >"$W/stalled.rc"
	kill -CONT "$gpid"
	for j in $jobs_; do wait "$j"; done
}
victim_during "a guest stopped (SIGSTOP) under requests" stalled_guest
expect "the stopped guest's own read did not complete" "$([ "$(cat "$W/stalled.rc")" != 0 ] && echo failed)" failed
wait_for "the guest answers again once it runs" sh -c "'$SC' exec '$G' -- echo back 2>/dev/null | grep -q back"

grep -q "starting them again\|starting it again" "$D/worker-1.log" && fail "the worker restarted a process" ||
	ok "no restart in the worker's log"
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
