#!/bin/sh
# run-tests: light, about 18 s
# Worker liveness on the control plane (issue 12, item 5): a worker is live
# while its control channel is open. A channel whose TCP connection closes
# (the worker killed) makes the worker not live at once; a channel that goes
# silent with its connection open (the worker stopped: SIGSTOP) is pinged
# every second and closed after 4 s without a word or pong. Either way
# `spacectl workers --json` shows it down within a bounded number of polls
# (every 0.5 s, giving up after 15 s: the measured time is printed, never
# asserted), and no create, move or resume is placed on it; once it
# reconnects it is live and placed on again. A channel open on this replica
# counts even when the store's channel_until has lapsed; another writer
# holding the store's write lock never holds up the loop.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
W=$(mktemp -d)
trap 'cleanup; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
SC=$SPACED_BUILD/spacectl/spacectl

mkdir -p "$W/cp"
TA=$(admin create-tenant alpha)
[ -n "$TA" ] || { echo "admin commands failed"; exit 1; }
start_cp cp --metrics-listen 127.0.0.1:0
export SPACED_CP_URL="$CP_URL" SPACED_API_KEY="$TA"
for w in wa wb wc; do register $w; start_worker $w; done
state_of() { # WORKER -> "live true" / "down false" / …
	"$SC" workers --json | jq -r --arg w "$1" '.[] | select(.id == $w) | .state + " " + (.connected|tostring)'
}
wait_for "three workers live" sh -c "[ \"\$('$SC' workers --json | jq '[.[] | select(.state == \"live\" and .connected)] | length')\" = 3 ]"

# poll_down WORKER — polls every 0.5 s, at most 30 times; sets DOWN_MS (or "never")
poll_down() {
	t0=$(date +%s%N)
	i=0
	DOWN_MS=never
	while [ $i -lt 30 ]; do
		if [ "$(state_of "$1")" = "down false" ]; then
			DOWN_MS=$((($(date +%s%N) - t0) / 1000000))
			return 0
		fi
		sleep 0.5
		i=$((i + 1))
	done
	return 1
}

# creates N sandboxes without naming a worker; prints where each went
place_n() {
	n=0
	while [ $n -lt "$1" ]; do
		st=$(api "$TA" POST /v1/sandboxes '{}')
		printf '%s:%s ' "$st" "$(body '.worker // .error')"
		n=$((n + 1))
	done
}

expect "a sandbox on wa to move and resume later" "$(api "$TA" POST /v1/sandboxes '{"worker":"wa"}')" 201
SA=$(body .id)
expect "a paused one on wa" "$(api "$TA" POST /v1/sandboxes '{"worker":"wa"}')" 201
SP=$(body .id)
expect "pause it" "$(api "$TA" POST "/v1/sandboxes/$SP/pause"; body .state)" "200paused"

# ---- 1. the worker is killed: its connection closes ----
eval "kill -9 \$FW_PID_wb"
if poll_down wb; then ok "wb killed: not live after ${DOWN_MS} ms (polled every 0.5 s)"; else fail "wb still live 15 s after it was killed: $(state_of wb)"; fi
KILL_MS=$DOWN_MS
placed=$(place_n 4)
expect "four creates after wb died: all placed, none on wb" "$(echo "$placed" | tr ' ' '\n' | grep -c '^201:w[ac]$')" 4
expect "create on wb by name -> 503 worker-unavailable" "$(api "$TA" POST /v1/sandboxes '{"worker":"wb"}'; body .error)" "503worker-unavailable"
expect "move to wb -> 503 worker-unavailable" "$(api "$TA" POST "/v1/sandboxes/$SA/move" '{"to":"wb"}'; body .error)" "503worker-unavailable"
expect "resume on wb -> 503 worker-unavailable" "$(api "$TA" POST "/v1/sandboxes/$SP/resume" '{"worker":"wb"}'; body .error)" "503worker-unavailable"
expect "the refused move left the sandbox where it ran" "$(api "$TA" GET "/v1/sandboxes/$SA"; body '.state + " " + .worker')" "200running wa"

# ---- 2. the worker stops answering, its connection stays open ----
eval "WC=\$FW_PID_wc"
kill -STOP "$WC"
if poll_down wc; then ok "wc stopped (SIGSTOP): not live after ${DOWN_MS} ms (polled every 0.5 s)"; else fail "wc still live 15 s after it stopped: $(state_of wc)"; fi
STOP_MS=$DOWN_MS
grep -q "event=channel-silent worker=wc " "$W/cp.log" && ok "the control plane closed wc's silent channel" || fail "no silence logged for wc"
placed=$(place_n 3)
expect "three creates while wc is stopped: all on wa" "$placed" "201:wa 201:wa 201:wa "
expect "create on wc by name -> 503 worker-unavailable" "$(api "$TA" POST /v1/sandboxes '{"worker":"wc"}'; body .error)" "503worker-unavailable"
kill -CONT "$WC"
wait_for "wc reconnects and is live again" sh -c "[ \"\$('$SC' workers --json | jq -r '.[] | select(.id == \"wc\") | .state')\" = live ]"
expect "create on wc once it is back" "$(api "$TA" POST /v1/sandboxes '{"worker":"wc"}'; body .worker)" "201wc"

# ---- 3. a quiet worker that answers pings stays live ----
sleep 6
expect "wa, quiet for 6 s but answering pings, is still live" "$(state_of wa)" "live true"
expect "wa's channel was never closed" "$(grep -c 'event=channel-closed worker=wa$' "$W/cp.log")" 0

# ---- 3b. the store's channel_until lapses while wa's channel is open (what a
# control-plane loop held up by a slow disk for more than 4 s leaves behind):
# this replica's own open channel still counts, for placement and listing ----
DB=$W/cp/cp.db
if [ -z "${CP_DB:-}" ] && [ -f "$DB" ] && command -v sqlite3 >/dev/null; then
	sqlite3 "$DB" "PRAGMA busy_timeout = 5000; UPDATE workers SET channel_until = 0 WHERE id = 'wa'" >/dev/null &&
		expect "channel_until lapsed, wa's channel open here: a create on wa is placed" \
			"$(api "$TA" POST /v1/sandboxes '{"worker":"wa"}'; body .worker)" "201wa"
	sqlite3 "$DB" "PRAGMA busy_timeout = 5000; UPDATE workers SET channel_until = 0 WHERE id = 'wa'" >/dev/null &&
		expect "and wa is listed live" "$(state_of wa)" "live true"
	sqlite3 "$DB" "PRAGMA busy_timeout = 5000; UPDATE workers SET channel_until = 0 WHERE id = 'wa'" >/dev/null &&
		expect "and its metric says connected (the same question as placement and listing)" \
			"$(curl -s "http://127.0.0.1:$(cat "$W/cp/metrics.port")/metrics" | awk '$1 == "spaced_cp_worker_connected{worker=\"wa\"}" {print $2}')" 1
fi

# ---- 3c. another writer holds the store's write lock for 4 s (what a batch
# of creates does while the disk syncs, for tens of ms): the loop, whose
# channels renew their liveness every second, never waits for it — every
# answer goes out in the meantime (each request timed; the old loop waited
# for the lock in its renewal and answered nothing for seconds) ----
if [ -z "${CP_DB:-}" ] && [ -f "$DB" ]; then
	hold_store_lock "$DB" 4 "$W/held"
	slowest=0
	n=0
	while [ $n -lt 12 ]; do
		t=$(curl -s -o /dev/null -w '%{time_total}' -H "Authorization: Bearer $TA" "$CP_URL/v1/sandboxes")
		slowest=$(echo "$t $slowest" | awk '{print ($1 > $2) ? $1 : $2}')
		sleep 0.25
		n=$((n + 1))
	done
	wait "$HOLDER"
	expect "the write lock held 4 s: twelve listings over 3 s each answered within 1 s (slowest ${slowest} s)" \
		"$(echo "$slowest" | awk '{print ($1 < 1.0) ? "yes" : "no"}')" yes
	expect "and wa is still live once the lock is let go" "$(state_of wa)" "live true"
fi

# ---- 4. the worker comes back after being killed ----
start_worker wb
wait_for "wb live again after it restarted" sh -c "[ \"\$('$SC' workers --json | jq -r '.[] | select(.id == \"wb\") | .state')\" = live ]"
expect "move to wb once it is back" "$(api "$TA" POST "/v1/sandboxes/$SA/move" '{"to":"wb"}'; body '.state + " " + .worker')" "200running wb"
echo "liveness: killed worker seen down after $KILL_MS ms, stopped worker after $STOP_MS ms (polled every 0.5 s)"
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
