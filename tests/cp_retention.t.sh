#!/bin/sh
# A deleted sandbox's rows are kept --retain-deleted seconds, then removed
# (cp.h cp_deleted_sweep): a tenant creating and deleting sandboxes in a loop
# would otherwise grow the control plane's store without bound. A control
# plane with --retain-deleted 600 (and --snapshot-grace 2: a sweep every 2 s)
# and a fake worker:
#  - a sandbox deleted "an hour ago" (its deletion time set back in the
#    store) is removed with its generations;
#  - one deleted just now stays, and so does one alive, which still answers.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
command -v sqlite3 >/dev/null 2>&1 || { echo "sqlite3 is not installed"; exit 77; }
W=$(mktemp -d)
trap 'cleanup; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT

mkdir -p "$W/cp"
TA=$(admin create-tenant alpha)
[ -n "$TA" ] || { echo "admin commands failed"; exit 1; }
DB=$W/cp/cp.db
q() { sqlite3 -cmd ".timeout 5000" "$DB" "$1"; }
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
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
