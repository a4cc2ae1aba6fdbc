#!/bin/sh
# run-tests: light, about 14 s
# A deleted sandbox's rows are kept --retain-deleted seconds, then removed
# (cp.h cp_deleted_sweep): a tenant creating and deleting sandboxes in a loop
# would otherwise grow the control plane's store without bound. A control
# plane with --retain-deleted 600 (and --snapshot-grace 2: a sweep every 2 s)
# and a fake worker:
#  - a sandbox deleted "an hour ago" (its deletion time set back in the
#    store) is removed with its generations;
#  - one deleted just now stays, and so does one alive, which still answers;
#  - the worker's acknowledged messages older than that (their time set back)
#    are removed, a prefix of its outbox; the worker reconnects from its own
#    state, but one that lost it (a hello older than what is kept) is refused
#    with a reason that says what to do;
#  - an acknowledged message's body is compacted within 10 s (cp.h cp_outbox_compact): a create's
#    variable (a secret, 300 bytes) is no longer in the outbox, its install row is {"seq","type",
#    "compacted"}; and a deleted sandbox's row keeps no spec.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
store_test_setup
start_cp cp --retain-deleted 600 --snapshot-grace 2
register wa
start_worker wa
for s in OLD NEW LIVE; do
	expect "create $s" "$(api "$TA" POST /v1/sandboxes '{"worker":"wa"}')" 201
	eval "$s=$(body .id)"
done
expect "delete OLD" "$(api "$TA" DELETE "/v1/sandboxes/$OLD")" 200
expect "delete NEW" "$(api "$TA" DELETE "/v1/sandboxes/$NEW")" 200
q "UPDATE sandboxes SET deleted = deleted - 3600 WHERE id = '$OLD'"
wait_for "the sandbox deleted an hour ago is swept" sh -c "[ \"\$(sqlite3 -cmd '.timeout 5000' '$DB' \"SELECT COUNT(*) FROM sandboxes WHERE id = '$OLD'\")\" = 0 ]"
expect "its generations went with it" "$(q "SELECT COUNT(*) FROM generations WHERE sandbox = '$OLD'")" 0
expect "the one deleted just now stays" "$(q "SELECT state FROM sandboxes WHERE id = '$NEW'")" deleted
expect "the live one stays and answers" "$(api "$TA" GET "/v1/sandboxes/$LIVE"; body .state)" 200running
expect "the sweep is logged" "$(grep -c 'event=deleted-swept sandboxes=1' "$CP_LOG")" 1

# the outbox: the messages of the first two creates are an hour old, acknowledged
last=$(cut -d' ' -f1 "$W/wa.state")
q "UPDATE outbox SET created = created - 3600 WHERE worker = 'wa' AND seq <= 3"
wait_for "the worker's old acknowledged messages are swept" sh -c "[ \"\$(sqlite3 -cmd '.timeout 5000' '$DB' \"SELECT outbox_pruned_to FROM workers WHERE id = 'wa'\")\" = 3 ]"
expect "a prefix of its outbox is gone, the rest kept" "$(q "SELECT MIN(seq) || ' ' || MAX(seq) FROM outbox WHERE worker = 'wa'")" "4 $last"
stop_worker wa
start_worker wa
expect "the worker reconnects from its own state" "$(grep -c "event=channel-hello worker=wa last_seq=$last" "$CP_LOG")" 1
pad=$(head -c 300 /dev/zero | tr '\0' x)
expect "create with a 300-byte variable" "$(api "$TA" POST /v1/sandboxes '{"worker":"wa","env":{"TOKEN":"s3cr3t'"$pad"'"}}')" 201
SEC=$(body .id)
wait_for "its acknowledged install is compacted: the variable is no longer in the outbox" \
	sh -c "[ \"\$(sqlite3 -cmd '.timeout 5000' '$DB' \"SELECT COUNT(*) FROM outbox WHERE worker = 'wa' AND body LIKE '%s3cr3t%'\")\" = 0 ]"
seq=$(q "SELECT seq FROM outbox WHERE worker = 'wa' AND sandbox = '$SEC' AND type = 'install'")
expect "its row keeps its seq and type" "$(q "SELECT body FROM outbox WHERE worker = 'wa' AND seq = $seq")" \
	"{\"seq\":$seq,\"type\":\"install\",\"compacted\":true}"
grep -q "event=outbox-compacted" "$CP_LOG" && ok "the compaction is logged" || fail "no event=outbox-compacted"
expect "delete it" "$(api "$TA" DELETE "/v1/sandboxes/$SEC")" 200
expect "a deleted sandbox's row keeps no spec (its variables)" "$(q "SELECT spec FROM sandboxes WHERE id = '$SEC'")" "{}"
stop_worker wa
cp "$W/wa.state" "$W/wa.state.keep"
echo "0 0" >"$W/wa.state"
"$FW" --url "ws://${CP_URL#http://}" --worker wa --key "$WK_wa" --state "$W/wa.state" --log "$W/wa2.log" 2>/dev/null &
PIDS="$PIDS $!"
wait_for "a worker that lost its records is refused" grep -q "event=channel-refused worker=wa .*older than the messages the control plane keeps" "$CP_LOG"
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
