#!/bin/sh
# run-tests: paired, about 2 s
# A worker whose state directory is on a filesystem of its own (as a separate /var is), not the
# one its binaries are on: spaced-node copies the guest into it for the executions (a copy root
# owns, mode 0511) and must not need both on one filesystem (copy_file_range gives EXDEV across
# filesystems: the worker would not start). Here the cluster's directory is a tmpfs this test
# mounts: the worker joins, a sandbox is created, written, read and run, moved as a snapshot
# (its files copied between two workers' directories on that tmpfs), and deleted.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
SC=$SPACED_BUILD/spacectl/spacectl
[ "$(id -u)" -eq 0 ] || { echo "the process substrate needs root"; exit 77; }
W=$(mktemp -d)
M=$W/state
mkdir -p "$M"
mount -t tmpfs -o size=3g tmpfs "$M" || { echo "cannot mount a tmpfs here"; rm -rf "$W"; exit 77; }
D=$M/cluster
export SPACED_ROUTE_CACHE="$W/routes"
# the cluster's processes and loop devices let go of the tmpfs a moment after dev down returns
unmount() { i=0; until umount "$M" 2>/dev/null || [ $i -ge 100 ]; do i=$((i + 1)); sleep 0.1; done; }
trap '"$SC" dev down --dir "$D" >/dev/null 2>&1; unmount; rmdir "$M" 2>/dev/null && rm -rf "$W"' EXIT
expect "the state directory is on another filesystem than the binaries" \
	"$([ "$(stat -c %d "$M")" != "$(stat -c %d "$SPACED_BUILD/spaced-guest/spaced-guest")" ] && echo yes)" yes

if ! "$SC" dev up --workers 2 --dir "$D" --pool 1 --disk-reserve 64M >"$W/up.out" 2>"$W/up.err"; then
	cat "$W/up.err"; tail -n 5 "$D"/worker-*.log 2>/dev/null
	echo "FAIL: dev up with its directory on a tmpfs"; exit 1
fi
. "$D/env"
G=$D/worker-1/guest/spaced-guest
expect "the executions' copy of the guest: root's, mode 0511, the same bytes" \
	"$(stat -c '%U %a' "$G" 2>/dev/null) $(cmp -s "$G" "$SPACED_BUILD/spaced-guest/spaced-guest" && echo same)" "root 511 same"
X=$("$SC" create --worker worker-1 --disk 64M 2>"$W/create.err")
expect "a sandbox is created" "$([ -n "$X" ] && echo yes)" yes
[ -n "$X" ] || cat "$W/create.err"
echo "kept on the tmpfs" | "$SC" fs write "$X" /workspace/a.txt
expect "its file written and read" "$("$SC" fs read "$X" /workspace/a.txt 2>&1)" "kept on the tmpfs"
expect "a command runs" "$("$SC" exec "$X" -- sh -c 'echo ran' 2>&1)" ran
"$SC" move "$X" --to worker-2 >"$W/move.out" 2>&1
expect "a move to the other worker" "$?" 0
expect "the file came with it" "$("$SC" fs read "$X" /workspace/a.txt 2>&1)" "kept on the tmpfs"
"$SC" rm "$X" >/dev/null 2>&1
expect "and it is deleted" "$?" 0

echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
