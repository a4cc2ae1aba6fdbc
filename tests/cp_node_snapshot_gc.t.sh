#!/bin/sh
# run-tests: paired, about 10 s
# The control plane's store keeps the snapshots sandboxes need, and no others
# (cp.h cp_snapshots_drop_others, cp_snapshots_sweep): every snapshot is a new
# archive in the store, so a tenant that snapshots, pauses or moves in a loop,
# or creates and deletes, would otherwise fill the control plane's disk. A
# control plane with --snapshot-grace 10 and two real spaced-node workers
# (development mode):
#  - three snapshots of one sandbox are three archives, and each leaves one at
#    once, the one it names, whole (the superseded one does not wait for the
#    grace period: 400 MB snapshotted every 3.4 s filled the store within it);
#  - a delete leaves none, at once;
#  - an archive no sandbox names (an upload never recorded) is swept after the
#    grace period;
#  - another tenant's sandbox keeps its archive all along.
# Exit 77 when spaced-node or spaced-guest is not built.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
. "$SPACED_TOP/tests/cp_node_lib.sh"
cp_node_setup
cp_node_start 8 --snapshot-grace 10

S=$W/cp/store/snapshots
archives() { ls "$S" 2>/dev/null | grep -c '\.tar$'; }
name_of() { basename "$("$SC" inspect "$1" --json | jq -r .snapshot)"; }

# a bystander's archive, named by its sandbox all along
B=$("$SC" create --worker nb)
"$SC" pause "$B" >/dev/null
"$SC" snapshot "$B" >/dev/null
kept=$(name_of "$B")
expect "the bystander's snapshot is in the store" "$([ -f "$S/$kept.tar" ] && echo yes)" yes

X=$("$SC" create --worker na)
printf 'kept across snapshots\n' >"$W/na/sbx/$X/root/data.txt"
"$SC" pause "$X" >/dev/null
names="" held=""
for i in 1 2 3; do
	"$SC" snapshot "$X" >/dev/null
	names="$names $(name_of "$X")"
	held="$held$(ls "$S" | grep -c "^$X-")"
done
last=$(name_of "$X")
expect "three snapshots, three archives" "$(echo $names | tr ' ' '\n' | sort -u | wc -l | tr -d ' ')" 3
expect "each snapshot leaves one archive of X at once (the one it supersedes goes)" "$held" 111
expect "the one left of X is the one it names" "$([ -f "$S/$last.tar" ] && echo yes)" yes
expect "the bystander's is left" "$([ -f "$S/$kept.tar" ] && echo yes)" yes
expect "the archive left is whole: it holds the sandbox's file" \
	"$(python3 -c 'import sys, tarfile; t = tarfile.open(sys.argv[1]); print(t.extractfile(t.getmember("data.txt")).read().decode().strip())' "$S/$last.tar")" \
	"kept across snapshots"
"$SC" resume "$X" >/dev/null
"$SC" exec "$X" -- cat data.txt >"$W/resume.out" 2>&1
expect "the sandbox resumes" "$(cat "$W/resume.out")" "kept across snapshots"

# a deleted sandbox needs none
"$SC" rm "$X" >/dev/null
expect "a deleted sandbox's archives go at once" "$(ls "$S" | grep -c "^$X-")" 0
expect "only the bystander's is left" "$(ls "$S")" "$kept.tar"
expect "dropping them is logged" "$(grep -c "event=snapshots-dropped sandbox=$X" "$CP_LOG" | awk '$1 >= 3 {print "yes"}')" yes
# an archive nobody recorded (an upload whose operation never finished): the grace sweep
orphan=sbx-0000000000000000-1-0123456789abcdef
echo x >"$S/$orphan.tar"
touch -d '1 hour ago' "$S/$orphan.tar"
wait_for "an archive no sandbox names is swept after the grace period" sh -c "[ ! -e '$S/$orphan.tar' ]"
expect "the sweep is logged" "$(grep -c 'event=snapshots-swept' "$CP_LOG" | awk '$1 >= 1 {print "yes"}')" yes
expect "the bystander's is left" "$(ls "$S")" "$kept.tar"
"$SC" resume "$B" >/dev/null
expect "the bystander still runs" "$("$SC" exec "$B" -- echo fine)" fine
"$SC" rm "$B" >/dev/null
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
