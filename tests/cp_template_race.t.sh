#!/bin/sh
# run-tests: light, about 13 s
# One archive per tree in the control plane's store (templates/HASH.tar), shared by every tenant
# whose template names that tree: a tenant's template delete must never take the archive another
# tenant's template has just come to name (I2's spirit for templates: what a tenant holds is not
# another's to take). The store's archives are published and removed under one lock
# (spaced-cp/templates.c, archive_lock). Before, alpha's delete found the tree unnamed, beta's
# import of the same tree named it and dropped its own copy (the archive was there), and alpha's
# delete then unlinked the archive: beta's template named nothing, and sandboxes made from it
# could not be made. The window (microseconds) is held open here by the control plane's test
# knob SPACED_CP_TEST_REMOVE_DELAY_MS (a remover waits that long between its check and its
# unlink):
#  - alpha imports a tree and deletes it; while the delete waits in its window, beta imports the
#    same tree: beta's import is answered 201 and the archive of its tree is in the store after
#    both ended, holding beta's file;
#  - the other way round, nothing left named: alpha's delete of a tree nobody else names removes
#    its archive.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
W=$(mktemp -d)
trap 'cleanup; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
SC=$SPACED_BUILD/spacectl/spacectl

mkdir -p "$W/cp"
TA=$(admin create-tenant alpha)
TB=$(admin create-tenant beta)
[ -n "$TA" ] && [ -n "$TB" ] || { echo "admin commands failed"; exit 1; }
export SPACED_CP_TEST_REMOVE_DELAY_MS=4000
start_cp cp
unset SPACED_CP_TEST_REMOVE_DELAY_MS
export SPACED_CP_URL="$CP_URL"
for t in shared alone; do
	rootfs_tarball "$W/$t.tar" 204800 || { echo "FAIL: mk tarball"; exit 1; }
done
archive() { echo "$W/cp/store/templates/$1.tar"; }

# ---- a delete in its window, another tenant's import of the same tree meanwhile ----
SPACED_API_KEY=$TA "$SC" template import a "$W/shared.tar" --json >"$W/a.json" 2>"$W/e" || fail "alpha's import: $(cat "$W/e")"
H=$(jq -r .hash "$W/a.json")
[ -f "$(archive "$H")" ] && ok "alpha's import put the tree's archive in the store" || fail "no archive of $H after alpha's import"
SPACED_API_KEY=$TA "$SC" template rm a >"$W/rm.out" 2>&1 &
RM=$!
# alpha's delete found the tree named by nothing and waits in its window (4 s): it says so
WAIT_SECONDS=10 wait_for "alpha's delete is in its window" grep -q "event=test-remove-delay hash=$H" "$CP_LOG"
t0=$(date +%s%N)
SPACED_API_KEY=$TB "$SC" template import b "$W/shared.tar" --json >"$W/b.json" 2>"$W/e"
rc=$?
t1=$(date +%s%N)
wait "$RM"
expect "alpha's delete succeeded" "$?" 0
expect "beta's import of the same tree meanwhile succeeded" "$rc $(jq -r .hash "$W/b.json" 2>/dev/null)" "0 $H"
ms=$(((t1 - t0) / 1000000))
expect "beta's import was in the window: it waited for alpha's delete to end (about 4 s after it began)" \
	"$([ "$ms" -ge 800 ] && echo waited || echo "answered after $ms ms")" waited
expect "the archive of beta's tree is in the store once both ended" "$([ -f "$(archive "$H")" ] && echo there || echo gone)" there
expect "and it holds the tree: the file beta imported, byte for byte" "$(python3 - "$(archive "$H")" "$W/shared.tar" <<'PY'
import sys, tarfile
def blob(p):
    with tarfile.open(p) as t:
        for m in t.getmembers():
            if m.name.lstrip("./") == "data/blob":
                return t.extractfile(m).read()
print("same" if blob(sys.argv[1]) == blob(sys.argv[2]) else "differs")
PY
)" same
expect "beta's template is listed" "$(SPACED_API_KEY=$TB "$SC" template ls --json | jq -r '[.[].name] | join(" ")')" b

# ---- nothing else names it: the delete removes the archive ----
SPACED_API_KEY=$TA "$SC" template import c "$W/alone.tar" --json >"$W/c.json" 2>"$W/e" || fail "alpha's import of c: $(cat "$W/e")"
HC=$(jq -r .hash "$W/c.json")
SPACED_API_KEY=$TA "$SC" template rm c >/dev/null 2>&1 || fail "rm c"
expect "a delete of a tree nobody else names removes its archive" "$([ -f "$(archive "$HC")" ] && echo there || echo gone)" gone
expect "beta's archive stays" "$([ -f "$(archive "$H")" ] && echo there || echo gone)" there

echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
