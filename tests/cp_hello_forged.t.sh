#!/bin/sh
# run-tests: light, about 4 s
# T1, T2 — a hostile worker's hello (docs/control-messages.md "Tentative installs"): a worker with its own
# worker key lists "tentative installs" the control plane never sent it. With a control plane and
# fake workers (cp-fake-worker --tentative: a real WebSocket):
#  - 256 made-up installs at seqs the control plane never used: left alone (event=tentative-unknown),
#    no destroy queued anywhere, nothing settled — only seqs skipped after a restart of the
#    control plane's machine can have been lost;
#  - after such a restart (the store opened under another boot: every worker's seqs skip 64), a
#    list naming all 64 skipped seqs, the first with another worker's running sandbox: that
#    sandbox runs on and no destroy names it (a name the store knows is never destroyed); the 63
#    others' destroys go to the forging worker only (at most 64 per hello), settled: the same
#    hello again queues nothing more;
#  - a list naming a seq the store holds as another message is refused (fail closed);
#  - the control plane stays up and answers throughout.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
store_test_setup
start_cp cp --metrics-listen 127.0.0.1:0
register wa
register wb
start_worker wb
SC=$SPACED_BUILD/spacectl/spacectl
export SPACED_CP_URL="$CP_URL" SPACED_API_KEY="$TA"
S=$("$SC" create --worker wb) || fail "create on wb"
expect "wb's sandbox runs" "$("$SC" inspect "$S" --json | jq -r .state)" running
destroys() { q "SELECT COUNT(*) FROM outbox WHERE worker = '$1' AND type = 'destroy'"; }
hellos() { grep -c "event=channel-hello worker=$1 " "$CP_LOG"; }
# forged FIRST COUNT FILE: a list of COUNT installs from seq FIRST, the first naming wb's sandbox
forged() {
	python3 - "$S" "$1" "$2" >"$3" <<'PY'
import json, sys
s, first, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
l = [{"seq": first, "sandbox": s, "activation": "act-forged"}]
l += [{"seq": first + 1 + i, "sandbox": "sbx-made-up-%03d" % i, "activation": "act-x"} for i in range(n - 1)]
print(json.dumps(l))
PY
}

# ---- seqs the control plane never used ----
forged 1000 256 "$W/far.json"
start_worker wa --tentative "$W/far.json"
expect "no destroy queued" "$(destroys wa) $(destroys wb)" "0 0"
expect "each made-up install logged, left alone" "$(grep -c 'event=tentative-unknown worker=wa ' "$CP_LOG")" 256
expect "nothing settled" "$(q "SELECT seq_settled FROM workers WHERE id = 'wa'")" 0
stop_worker wa

# ---- after a restart of the machine: the skipped seqs ----
kill "$CP_PID"
wait "$CP_PID" 2>/dev/null
q "UPDATE meta SET v = 'another-boot' WHERE k = 'boot_id'"
start_cp cp --listen "127.0.0.1:${CP_URL##*:}" --metrics-listen 127.0.0.1:0
expect "the control plane skipped 64 seqs of each worker" "$(grep -c 'event=seqs-skipped count=64' "$CP_LOG")" 1
jumped=$(q "SELECT seq_jumped FROM workers WHERE id = 'wa'")
forged $((jumped + 1)) 64 "$W/window.json"
h=$(hellos wa)
start_worker wa --tentative "$W/window.json"
wait_for "the hello was taken" sh -c "[ \$(grep -c 'event=channel-hello worker=wa ' '$CP_LOG') -gt $h ]"
expect "63 destroys queued, all to wa" "$(destroys wa) $(destroys wb)" "63 0"
expect "none of them names wb's sandbox" "$(q "SELECT COUNT(*) FROM outbox WHERE type = 'destroy' AND sandbox = '$S'")" 0
expect "the name the store knows is kept (logged)" \
	"$(grep -c "event=tentative-lost-kept worker=wa seq=$((jumped + 1)) sandbox=$S" "$CP_LOG")" 1
expect "settled up to the last skipped seq" "$(q "SELECT seq_settled FROM workers WHERE id = 'wa'")" $((jumped + 64))
MP=$(cat "$W/cp/metrics.port")
expect "/metrics counts 63 lost" \
	"$(curl -s "http://127.0.0.1:$MP/metrics" | awk '$1 == "spaced_cp_tentative_installs_total{outcome=\"lost\"}" {print $2}')" 63
expect "wb's sandbox still runs, the control plane answers" "$("$SC" inspect "$S" --json | jq -r .state)" running
stop_worker wa
h=$(hellos wa)
start_worker wa --tentative "$W/window.json"
wait_for "the same hello again was taken" sh -c "[ \$(grep -c 'event=channel-hello worker=wa ' '$CP_LOG') -gt $h ]"
expect "no destroy queued twice" "$(destroys wa)" 63
stop_worker wa

# ---- a seq the store holds as another message (wa's first, its key bundle) ----
printf '[{"seq": 1, "sandbox": "sbx-other", "activation": "act-x"}]\n' >"$W/clash.json"
start_worker wa --tentative "$W/clash.json"
wait_for "the hello naming another message's seq is refused" \
	grep -q 'event=channel-refused worker=wa reason="seq 1 it applied tentative (sandbox sbx-other) is another message here"' "$CP_LOG"
kill -0 "$CP_PID" 2>/dev/null && ok "the control plane runs" || fail "the control plane died"
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
