#!/bin/sh
# run-tests: paired, about 12 s
# T1, I2 — tentative installs (docs/control-messages.md "Tentative installs"): a batch of creates commits
# without waiting for the control plane's disk and its installs go out marked tentative while the
# log is synced; the worker notes each it applied until told {"type":"durable"}. With the control
# plane and two real spaced-node workers (na, nb; development mode):
#  - a create runs, and its worker is told that its install is durable (its status lists none);
#  - the control plane stops after a batch's installs went out and before its log was synced
#    (SPACED_CP_TEST_CRASH_BEFORE_SYNC): started again, the commit is there (the kernel kept it),
#    the worker's hello lists the install, the control plane confirms it, and the sandbox runs;
#  - the same, with the commit then taken out of the store and the store made to look as if the
#    machine had started again (what a crash of the machine before the sync leaves): the worker's
#    hello lists an install the control plane never knew; the control plane has the worker destroy
#    that sandbox, skips seqs so that none the worker applied is sent again as another message, and
#    the worker's other sandbox and new creates work;
#  - a store that lost a commit it had made durable (restored from a copy) refuses the worker's
#    hello: its last seq is past what the store had and not a tentative install (fail closed).
# T1: no seq a worker applied is ever sent again as another message, and what a crash lost is
# settled before the replay; I2: a generation is answered to no client before its transaction is
# durable, and one a crash lost never runs on (its execution is destroyed).
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
. "$SPACED_TOP/tests/cp_node_lib.sh"
command -v sqlite3 >/dev/null 2>&1 || { echo "sqlite3 is not installed (scripts/setup.sh installs it)"; exit 77; }
cp_node_setup
# development-mode guests outlive their worker: none of this test's is left behind
trap 'cleanup; pkill -f -- "--root $W/" 2>/dev/null; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
cp_node_start 4
DB=$W/cp/cp.db

status_of() { # WORKER -> the worker's status (JSON)
	"$SC" node status --admin "$W/$1/admin.sock" 2>/dev/null
}
tentative_of() { # WORKER -> its tentative installs, one "seq sandbox" per line
	status_of "$1" | jq -r '.result.tentative // [] | .[] | "\(.seq) \(.sandbox)"'
}
restart_cp() { # [WORKER] at the same address (the workers reconnect to it); waits for WORKER's hello
	n=$( [ $# -gt 0 ] && hellos "$1")
	start_cp cp --listen "127.0.0.1:${CP_URL##*:}" --metrics-listen 127.0.0.1:0
	[ $# -eq 0 ] ||
		wait_for "$1 said hello to the control plane" sh -c "[ \$(grep -c 'event=channel-hello worker=$1 ' '$CP_LOG') -gt $n ]"
}
stop_cp() {
	kill "$CP_PID" 2>/dev/null
	wait "$CP_PID" 2>/dev/null
}
create_on() { # WORKER -> the HTTP status of a create placed there (its answer in $W/body)
	api "$TA" POST /v1/sandboxes "{\"worker\":\"$1\"}"
}
hellos() { grep -c "event=channel-hello worker=$1 " "$CP_LOG"; }
metric() { # NAME{LABELS} -> its value on the running control plane's /metrics
	curl -s "http://127.0.0.1:$(cat "$W/cp/metrics.port")/metrics" | awk -v n="$1" '$1 == n {print $2}'
}

# ---- a create, said durable ----
S1=$("$SC" create --worker na) || fail "create on na"
expect "the sandbox runs" "$("$SC" inspect "$S1" --json | jq -r .state)" running
expect "exec in it" "$("$SC" exec "$S1" -- echo hi)" hi
wait_for "na was told its install is durable (its status lists no tentative install)" \
	sh -c "[ -z \"\$('$SC' node status --admin '$W/na/admin.sock' | jq -r '.result.tentative // [] | .[]')\" ]"

# ---- the control plane stops before its log is synced; the kernel kept the commit ----
stop_cp
export SPACED_CP_TEST_CRASH_BEFORE_SYNC=1
restart_cp nb
unset SPACED_CP_TEST_CRASH_BEFORE_SYNC
st=$(create_on nb)
wait "$CP_PID"
expect "the control plane ended after the installs went out, before the sync (no answer; exit 70)" "$st $?" "000 70"
S2=$(tentative_of nb | awk 'END {print $2}')
[ -n "$S2" ] && ok "nb applied the install and notes it tentative ($S2)" || fail "nb notes no tentative install"
restart_cp nb
WAIT_SECONDS=60 wait_for "the create finishes: the sandbox runs" \
	sh -c "[ \"\$('$SC' inspect '$S2' --json 2>/dev/null | jq -r .state)\" = running ]"
expect "exec in it" "$("$SC" exec "$S2" -- echo there)" there
expect "no install called lost" "$(grep -c "event=tentative-lost worker=nb .*sandbox=$S2" "$CP_LOG")" 0
wait_for "nb was told it is durable" sh -c "[ -z \"\$('$SC' node status --admin '$W/nb/admin.sock' | jq -r '.result.tentative // [] | .[]')\" ]"

# ---- the machine's crash lost the commit: the worker destroys what the control plane never knew ----
stop_cp
sqlite3 "$DB" ".backup '$W/before.db'"
export SPACED_CP_TEST_CRASH_BEFORE_SYNC=1
restart_cp na
unset SPACED_CP_TEST_CRASH_BEFORE_SYNC
st=$(create_on na)
wait "$CP_PID"
expect "the control plane ended before the sync" "$st $?" "000 70"
line=$(tentative_of na | tail -n 1)
S3=${line#* } seq3=${line%% *}
[ -n "$line" ] && ok "na applied the install of $S3 (seq $seq3), noted tentative" || fail "na notes no tentative install"
expect "it runs on na" "$(node_status na "$S3" | cut -d' ' -f2)" running
# what a crash of the machine leaves: the store without the commit, opened under another boot
rm -f "$DB" "$DB-wal" "$DB-shm"
cp "$W/before.db" "$DB"
sqlite3 "$DB" "UPDATE meta SET v = 'another-boot' WHERE k = 'boot_id'"
restart_cp na
expect "the control plane skips seqs after the machine started again" "$(grep -c 'event=seqs-skipped count=64' "$CP_LOG")" 1
expect "the hello was not refused" "$(grep -c 'event=channel-refused worker=na' "$CP_LOG")" 0
wait_for "the control plane calls the install lost and queues its destroy" \
	grep -q "event=tentative-lost worker=na seq=$seq3 sandbox=$S3" "$CP_LOG"
i=0
while [ -n "$(node_status na "$S3")" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
expect "na destroyed the sandbox the control plane never knew" "$(node_status na "$S3")" ""
expect "the store records the lost seq as settled (a later hello naming it as its last seq is taken)" \
	"$(sqlite3 -cmd ".timeout 5000" "$DB" "SELECT seq_settled FROM workers WHERE id = 'na'")" "$seq3"
wait_for "na was told its notes are settled" sh -c "[ -z \"\$('$SC' node status --admin '$W/na/admin.sock' | jq -r '.result.tentative // [] | .[]')\" ]"
expect "na's other sandbox still answers" "$("$SC" exec "$S1" -- echo still)" still
S4=$("$SC" create --worker na) || fail "a new create on na"
expect "a new create on na runs" "$("$SC" exec "$S4" -- echo new)" new
seq4=$(sqlite3 -cmd ".timeout 5000" "$DB" "SELECT install_seq FROM sandboxes WHERE id = '$S4'")
[ "$seq4" -gt $((seq3 + 1)) ] && ok "its install's seq ($seq4) is past the lost one's ($seq3): no seq is sent twice" ||
	fail "the new install's seq $seq4 is not past the lost $seq3"
expect "/metrics: one install reported lost, one sent tentative, the log synced at the start and after the batch" \
	"$(metric 'spaced_cp_tentative_installs_total{outcome="lost"}') $(metric 'spaced_cp_tentative_installs_total{outcome="sent"}') $(metric spaced_cp_log_syncs_total)" "1 1 2"
if command -v promtool >/dev/null 2>&1; then
	curl -s "http://127.0.0.1:$(cat "$W/cp/metrics.port")/metrics" >"$W/metrics"
	promtool check metrics <"$W/metrics" >"$W/promtool.out" 2>&1 && ok "promtool takes the control plane's metrics" ||
		fail "promtool: $(head -n 3 "$W/promtool.out")"
fi
expect "na runs it as generation 1" "$(node_status na "$S4")" "1 running"
stop_cp
restart_cp na
expect "started again on the same boot: no seqs skipped this time, the hello taken" \
	"$(grep -c 'event=seqs-skipped' "$CP_LOG") $(grep -c 'event=channel-refused worker=na' "$CP_LOG")" "1 0"

# ---- a store that lost a durable commit refuses the worker (fail closed) ----
stop_cp
sqlite3 "$DB" ".backup '$W/before2.db'"
restart_cp nb
S5=$("$SC" create --worker nb) || fail "create on nb"
wait_for "nb was told S5's install is durable" sh -c "[ -z \"\$('$SC' node status --admin '$W/nb/admin.sock' | jq -r '.result.tentative // [] | .[]')\" ]"
stop_cp
rm -f "$DB" "$DB-wal" "$DB-shm"
cp "$W/before2.db" "$DB"
sqlite3 "$DB" "UPDATE meta SET v = 'yet-another-boot' WHERE k = 'boot_id'"
restart_cp
wait_for "the control plane refuses nb's hello: ahead of what it had made durable, and no tentative install" \
	grep -q "event=channel-refused worker=nb reason=\"hello last_seq=[0-9]* is ahead of what the control plane had made durable" "$CP_LOG"
expect "nb's sandbox keeps running on nb meanwhile (nothing is destroyed on a refused hello)" \
	"$(node_status nb "$S5")" "1 running"

kill -0 "$CP_PID" 2>/dev/null && ok "the control plane runs" || fail "the control plane died"
[ "$FAILS" -eq 0 ] || exit 1
