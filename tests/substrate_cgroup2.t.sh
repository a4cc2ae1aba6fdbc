#!/bin/sh
# run-tests: alone (removes the executions' parent cgroup)
# The process substrate on a unified cgroup2 hierarchy: in a private mount
# namespace where /sys/fs/cgroup is cgroup2, an execution is created, entered,
# frozen (a counter inside stops), thawed (it moves again) and removed with
# its cgroup. On hosts whose memory/pids/cpu controllers live in cgroup v1 the
# v2 hierarchy holds no controllers: there each limit must be refused at
# creation (never accepted and left unenforced); where they are enabled, each
# limit must be in its file. Exit 77 when this cannot run.
set -u
[ "$(id -u)" -eq 0 ] || { echo "needs root"; exit 77; }
build=${SPACED_BUILD:?}
launch=$build/spaced-node/spaced-launch
guest=$build/spaced-guest/spaced-guest
[ -x "$guest" ] || guest=$build/tests/stub-guest
[ -x "$launch" ] || { echo "spaced-launch not built"; exit 77; }
grep -qw cgroup2 /proc/filesystems || { echo "no cgroup2 in this kernel"; exit 77; }
tmp=$(mktemp -d /tmp/spaced-cg2-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/inner.sh" <<'INNER'
set -u
launch=$1 guest=$2 tmp=$3
fail() {
	echo "FAIL: $*"
	"$launch" ctl --state "$tmp/s" STOP >/dev/null 2>&1 && wait
	rmdir /sys/fs/cgroup/spaced 2>/dev/null
	exit 1
}
mount --make-rprivate / || exit 77
mount -t cgroup2 none /sys/fs/cgroup || { echo "cannot mount cgroup2"; exit 77; }
"$launch" --state "$tmp/s" --guest "$guest" \
	--identity 'sandbox=cg2;generation=1;worker=w1;substrate=process;activation=a1;pod_uid=' \
	>"$tmp/out" 2>"$tmp/err" &
lpid=$!
i=0
while [ ! -e "$tmp/s/ready" ]; do
	i=$((i + 1)); [ $i -gt 200 ] && fail "not ready: $(cat "$tmp/err")"
	sleep 0.05
done
cg=$(ls -d /sys/fs/cgroup/spaced/spaced-* 2>/dev/null | head -n 1)
[ -n "$cg" ] && [ -f "$cg/cgroup.freeze" ] || fail "no cgroup2 directory for the execution"
inside=$("$launch" exec --state "$tmp/s" -- sh -c \
	'(i=0; while :; do i=$((i+1)); echo $i > /tmp/c.new; mv /tmp/c.new /tmp/c; sleep 0.01; done) >/dev/null 2>&1 & grep "^0::" /proc/self/cgroup')
[ "$inside" = "0::/" ] || fail "entered process sees cgroup '$inside' (cgroup namespace expected)"
c=$tmp/s/upper/root/tmp/c
i=0; while [ ! -s "$c" ]; do i=$((i + 1)); [ $i -gt 200 ] && fail "counter did not start"; sleep 0.05; done
"$launch" ctl --state "$tmp/s" PAUSE >/dev/null || fail "pause"
grep -q '^frozen 1' "$cg/cgroup.events" || fail "cgroup.events not frozen"
a=$(cat "$c"); sleep 0.5; b=$(cat "$c")
[ -n "$a" ] || fail "no counter value while frozen"
[ "$a" = "$b" ] || fail "counter moved while frozen ($a -> $b)"
"$launch" ctl --state "$tmp/s" THAW >/dev/null || fail "thaw"
i=0; while [ "$(cat "$c")" = "$b" ]; do i=$((i + 1)); [ $i -gt 400 ] && fail "counter did not resume"; sleep 0.05; done
"$launch" ctl --state "$tmp/s" STOP >/dev/null || fail "stop"
wait $lpid
[ -d "$cg" ] && fail "cgroup $cg left behind"
# A limit whose controller this hierarchy lacks is refused at creation, never
# accepted and then left unenforced; where the controllers are enabled, each
# limit must be in its file.
for lim in "--memory 64M memory.max 67108864" "--pids 32 pids.max 32" "--cpus 0.5 cpu.max 50000"; do
	set -- $lim
	if grep -qw "${3%%.*}" /sys/fs/cgroup/cgroup.controllers; then
		"$launch" --state "$tmp/l" --guest "$guest" "$1" "$2" \
			--identity 'sandbox=cg2l;generation=1;worker=w1;substrate=process;activation=a1;pod_uid=' \
			>"$tmp/lout" 2>"$tmp/lerr" &
		lp=$!
		i=0
		while [ ! -e "$tmp/l/ready" ]; do
			i=$((i + 1)); [ $i -gt 200 ] && fail "$1 not ready: $(cat "$tmp/lerr")"
			sleep 0.05
		done
		lcg=$(ls -d /sys/fs/cgroup/spaced/spaced-* | head -n 1)
		grep -q "^$4" "$lcg/$3" || fail "$1 $2: $3 holds $(cat "$lcg/$3")"
		"$launch" ctl --state "$tmp/l" STOP >/dev/null
		wait $lp
		echo "ok: $1 $2 enforced through $3"
	else
		"$launch" --state "$tmp/l" --guest "$guest" "$1" "$2" \
			--identity 'sandbox=cg2l;generation=1;worker=w1;substrate=process;activation=a1;pod_uid=' \
			>"$tmp/lout" 2>"$tmp/lerr"
		[ $? -ne 0 ] && grep -q "$3" "$tmp/lerr" || fail "$1 $2 without the ${3%%.*} controller was not refused: $(cat "$tmp/lerr")"
		echo "ok: $1 $2 refused: this cgroup2 hierarchy has no ${3%%.*} controller"
	fi
done
rmdir /sys/fs/cgroup/spaced 2>/dev/null
echo "ok: cgroup2 create, enter, freeze ($a), thaw, remove"
INNER
unshare -m sh "$tmp/inner.sh" "$launch" "$guest" "$tmp"
