#!/bin/sh
# run-tests: light, about 15 s
# A snapshot waits for its worker up to --snapshot-timeout, not --ack-timeout: the worker copies,
# hashes, packs and uploads the sandbox's files (a minute for 200,000 small ones), and a sandbox
# within its limits must still snapshot and move; other lifecycle calls keep the short bound.
# cp-fake-worker peers that answer snapshots 2.5 s late, a control plane with --ack-timeout 1000:
# a snapshot and a move succeed (both answered 504 worker-timeout before); with
# --snapshot-timeout 1000 a snapshot times out as before; a pause answered late still times out
# at --ack-timeout. The operation's lease is renewed while it waits (no other call takes it). The
# store takes a snapshot's upload only while it is awaited (that worker, sandbox and generation). A
# route asked while a delete waits for its worker says the sandbox is being deleted: no capability
# is issued for an execution being destroyed (C1). An install that has its worker fetch a snapshot
# or a template waits past --ack-timeout while the worker stays live.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
W=$(mktemp -d)
trap 'cleanup; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
CP_DB=""
mkdir -p "$W/cp"
TA=$(admin create-tenant alpha)
[ -n "$TA" ] || { echo "admin commands failed"; exit 1; }
start_cp cp --ack-timeout 1000 --snapshot-timeout 8000
register wa
register wb
start_worker wa --delay-ms 2500 --delay-type snapshot
start_worker wb --delay-ms 2500 --delay-type snapshot

expect "create" "$(api "$TA" POST /v1/sandboxes '{"worker":"wa"}')" 201
S=$(body .id)
expect "pause" "$(api "$TA" POST "/v1/sandboxes/$S/pause")" 200
t0=$(date +%s%N)
expect "a snapshot its worker answers in 2.5 s, past --ack-timeout (1 s): 200" \
	"$(api "$TA" POST "/v1/sandboxes/$S/snapshot")" 200
ms=$((($(date +%s%N) - t0) / 1000000))
expect "it waited for the answer (${ms} ms)" "$([ "$ms" -ge 2400 ] && echo yes)" yes
expect "the sandbox holds its snapshot" "$(api "$TA" GET "/v1/sandboxes/$S"; body '.snapshot != null')" 200true
# meanwhile the sandbox's operation is its: another call on it is busy
api "$TA" POST "/v1/sandboxes/$S/snapshot" >"$W/s2" &
S2=$!
sleep 1
expect "while a snapshot waits, another operation on the sandbox: 409" "$(api "$TA" POST "/v1/sandboxes/$S/resume")" 409
# the store takes a snapshot's upload only while it is awaited: from the worker that takes it, for that
# sandbox and generation, while an operation holds it (a snapshot given up on, or of a sandbox removed
# meanwhile, was kept until the grace sweep: a gigabyte each)
URL=$(grep '"type":"snapshot"' "$W/wa.log" | tail -n 1 | jq -r .url)
put() { # URL KEY: the status of a small upload
	curl -s -o "$W/put.body" -w '%{http_code}' -X PUT -H "Authorization: Bearer $2" --data-binary "snapshot" "$1"
}
eval "KA=\$WK_wa KB=\$WK_wb"
expect "an upload from another worker, while awaited: 409" "$(put "$URL" "$KB")" 409
expect "the awaited upload, from its worker: 201" "$(put "$URL" "$KA")" 201
wait "$S2"
expect "once the snapshot is over, another upload under its sandbox and generation: 409 not-awaited" \
	"$(put "${URL%-*}-0123456789abcdef" "$KA"; jq -r .error "$W/put.body")" "409not-awaited"
expect "a name that is no sandbox's: 409" "$(put "${URL%/*}/sbx-0000000000000000-1-0123456789abcdef" "$KA")" 409
expect "move to wb (its snapshot answered 2.5 s late)" \
	"$(api "$TA" POST "/v1/sandboxes/$S/move" '{"to":"wb"}'; body '.state + " " + .worker')" "200running wb"

# the short bound for what is not a snapshot, and a snapshot's own bound
stop_worker wa
start_worker wa --delay-ms 2500 --delay-type pause
expect "create" "$(api "$TA" POST /v1/sandboxes '{"worker":"wa"}')" 201
P=$(body .id)
expect "a pause answered 2.5 s late: 504 at --ack-timeout" "$(api "$TA" POST "/v1/sandboxes/$P/pause"; body .error)" \
	"504worker-timeout"
api "$TA" DELETE "/v1/sandboxes/$P" >/dev/null
kill "$CP_PID"
wait "$CP_PID" 2>/dev/null
start_cp cp --ack-timeout 1000 --snapshot-timeout 1000
for w in wa wb; do stop_worker $w; start_worker $w --delay-ms 2500 --delay-type snapshot; done
expect "create" "$(api "$TA" POST /v1/sandboxes '{"worker":"wb"}')" 201
Q=$(body .id)
expect "pause" "$(api "$TA" POST "/v1/sandboxes/$Q/pause")" 200
expect "with --snapshot-timeout 1000, the late snapshot: 504" "$(api "$TA" POST "/v1/sandboxes/$Q/snapshot"; body .error)" \
	"504worker-timeout"
# a route asked while the sandbox's delete is on its way: 404 "being deleted" (a watch cut by the delete
# said "409 not-running: the sandbox is paused")
stop_worker wa
start_worker wa --delay-ms 800 --delay-type destroy
expect "create" "$(api "$TA" POST /v1/sandboxes '{"worker":"wa"}')" 201
R=$(body .id)
OUT=$W/del.body api "$TA" DELETE "/v1/sandboxes/$R" >"$W/del.status" &
DEL=$!
sleep 0.4
expect "its route while its delete waits for the worker: 404, being deleted" \
	"$(api "$TA" POST "/v1/sandboxes/$R/route" '{}'; body .message)" "404the sandbox is being deleted"
wait "$DEL"
expect "the delete ends" "$(cat "$W/del.status")" 200

# an install that has its worker fetch a snapshot (a move's, a resume's) or a template first may
# take longer than --ack-timeout (a Debian template is hundreds of megabytes to fetch, check and
# unpack on a busy worker): the wait goes on past it while the worker stays live, up to
# --snapshot-timeout; an install with nothing to fetch keeps the short bound; a worker that goes
# away ends the wait once the control plane sees it gone (5 s), not at --snapshot-timeout
kill "$CP_PID"
wait "$CP_PID" 2>/dev/null
start_cp cp --ack-timeout 1000 --snapshot-timeout 60000
for w in wa wb; do stop_worker $w; done
start_worker wa
start_worker wb --delay-ms 2500 --delay-type install
expect "create" "$(api "$TA" POST /v1/sandboxes '{"worker":"wa"}')" 201
M=$(body .id)
expect "pause" "$(api "$TA" POST "/v1/sandboxes/$M/pause")" 200
expect "a move whose install (from the snapshot) its destination answers in 2.5 s, past --ack-timeout: 200" \
	"$(api "$TA" POST "/v1/sandboxes/$M/move" '{"to":"wb"}'; body '.state + " " + .worker')" "200running wb"
grep -q "event=install-waits worker=wb " "$CP_LOG" || fail "the control plane said why it waited on"
# a create from a template (named, or by its hash as a build's steps create): the same
mkdir -p "$W/tiny"
echo hello >"$W/tiny/hello"
tar -C "$W/tiny" -cf "$W/tiny.tar" .
SPACED_API_KEY=$TA SPACED_CP_URL=$CP_URL "$SPACED_BUILD/spacectl/spacectl" template import tiny "$W/tiny.tar" \
	>/dev/null 2>"$W/import.err" || fail "import a template: $(cat "$W/import.err")"
TH=$(api "$TA" GET /v1/templates/tiny >/dev/null; body .hash)
expect "a create from a template by its name, whose install is answered in 2.5 s: 201" \
	"$(api "$TA" POST /v1/sandboxes '{"worker":"wb","template":"tiny"}')" 201
expect "... and by its hash: 201" "$(api "$TA" POST /v1/sandboxes "{\"worker\":\"wb\",\"template_hash\":\"$TH\"}")" 201
expect "a create with nothing to fetch, answered 2.5 s late: 504 at --ack-timeout" \
	"$(api "$TA" POST /v1/sandboxes '{"worker":"wb"}'; body .error)" "504worker-timeout"
stop_worker wb
start_worker wb --silent install
expect "create" "$(api "$TA" POST /v1/sandboxes '{"worker":"wa"}')" 201
M2=$(body .id)
expect "pause" "$(api "$TA" POST "/v1/sandboxes/$M2/pause")" 200
t0=$(date +%s%N)
OUT=$W/mv.body api "$TA" POST "/v1/sandboxes/$M2/move" '{"to":"wb"}' >"$W/mv.status" &
MV=$!
sleep 2
stop_worker wb
wait "$MV"
ms=$((($(date +%s%N) - t0) / 1000000))
expect "its destination gone (at 2 s) while the move waits for its install: 504 after ${ms} ms, past --ack-timeout, long before --snapshot-timeout (60 s)" \
	"$(cat "$W/mv.status") $([ "$ms" -ge 1900 ] && [ "$ms" -le 30000 ] && echo "when it went")" "504 when it went"
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
