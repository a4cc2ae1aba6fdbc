#!/bin/sh
# run-tests: alone (reads the blkio rules of every loop device)
# Disk I/O of a sandbox is bounded (DESIGN §5 Resources: a limit holds everything the execution makes
# the host do; spaced-node --disk-io). A hostile tenant on a worker started with
# `--disk-io bps=8M,iops=300` writes directly, writes through the page cache (the kernel's flusher
# writes it back, outside the sandbox's cgroup on cgroup v1), reads directly and issues small
# writes: each stays at the bound (a sandbox wrote 1.1-1.6 GB/s into the host's disk before, and a
# host's synchronous 4 KiB writes waited up to a second behind it). The rules are where they
# must be (the sandbox's own blkio cgroup for its disk and the lower layer's device; the blkio
# root for its disk's writeback; the disk's dirty-page bound) and go with the sandbox; a victim
# tenant's sandbox on the same worker keeps working throughout; `dev down` leaves no rule behind.
# Durations are checked from below only: a busy host makes them longer, never shorter.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
SC=$SPACED_BUILD/spacectl/spacectl
need_substrate
BLKIO=/sys/fs/cgroup/blkio
[ -f $BLKIO/blkio.throttle.write_bps_device ] || { echo "no cgroup v1 blkio hierarchy (cgroup2: io.max, not checked here)"; exit 77; }
W=$(mktemp -d)
D=$W/cluster
export SPACED_ROUTE_CACHE="$W/routes"
trap '"$SC" dev down --dir "$D" >/dev/null 2>&1; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
MiB=1048576

# ---- a malformed --disk-io is refused before anything starts ----
for bad in "bps=8X" "iops=-1" "speed=1" "bps=8M,iops=1e3"; do
	refused_flag --disk-io "$bad"
done

cluster_up --disk-io bps=8M,iops=300
VX=$(as_victim create)
printf 'victim data\n' | as_victim fs write "$VX" /workspace/v.txt
victim_ok() {
	got=$(as_victim exec "$VX" -- sh -c 'echo alive; cat /workspace/v.txt' 2>&1 | tr '\n' ' ')
	expect "victim still served $1" "$got" "alive victim data "
}

A=$("$SC" create --disk 1G)
[ -n "$A" ] || { echo "FAIL: the attacker's sandbox"; exit 1; }
# its disk: the loop device whose image is in the execution's state directory
loop=""
for f in /sys/block/loop*/loop/backing_file; do
	case "$(cat "$f" 2>/dev/null)" in */exec/"$A".*/disk.img) loop=$(basename "$(dirname "$(dirname "$f")")") ;; esac
done
[ -n "$loop" ] || { echo "FAIL: no loop device holds $A's disk"; exit 1; }
dev=$(cat /sys/block/$loop/dev)
lower=$(stat -c '%Hd:%Ld' /usr)
cg=$(grep -l "" $BLKIO/spaced/spaced-*/blkio.throttle.read_bps_device 2>/dev/null |
	while read -r f; do grep -q "^$dev " "$f" && dirname "$f"; done)
expect "the sandbox has a blkio cgroup of its own naming its disk" "$([ -n "$cg" ] && echo yes)" yes
for k in read_bps write_bps; do
	expect "its $k rule on its disk: 8 MiB/s" "$(grep "^$dev " "$cg/blkio.throttle.${k}_device" | cut -d' ' -f2)" $((8 * MiB))
done
for k in read_iops write_iops; do
	expect "its $k rule on its disk: 300" "$(grep "^$dev " "$cg/blkio.throttle.${k}_device" | cut -d' ' -f2)" 300
done
if [ -e "/sys/dev/block/$lower" ] && [ ! -e "/sys/dev/block/$lower/partition" ]; then
	expect "its read rule on the lower layer's disk ($lower)" "$(grep "^$lower " "$cg/blkio.throttle.read_bps_device" | cut -d' ' -f2)" $((8 * MiB))
fi
expect "the blkio root bounds its disk's writeback" "$(grep "^$dev " $BLKIO/blkio.throttle.write_bps_device | cut -d' ' -f2)" $((8 * MiB))
if [ -f "/sys/class/bdi/$dev/max_bytes" ]; then
	mb=$(cat /sys/class/bdi/$dev/max_bytes) # kept as a fraction of the host's dirty limit: about 8 MiB
	expect "its disk holds at most a second of writeback dirty (strict)" \
		"$(cat /sys/class/bdi/$dev/strict_limit) $([ "$mb" -ge $((15 * MiB / 2)) ] && [ "$mb" -le $((17 * MiB / 2)) ] && echo about-8MiB)" \
		"1 about-8MiB"
fi

# ---- the hostile tenant's I/O, each path at the bound ----
# held WHAT MIN COMMAND: COMMAND inside the sandbox takes MIN seconds or more (its own clock)
held() {
	t=$("$SC" exec "$A" -- sh -c 's=$(cut -d" " -f1 /proc/uptime); '"$3"' >/dev/null 2>&1; e=$(cut -d" " -f1 /proc/uptime); echo "$s $e" | awk "{print \$2 - \$1}"')
	echo "$1: $t s"
	expect "$1 held to the bound ($2 s or more)" \
		"$(python3 -c 'import sys; print("yes" if float(sys.argv[1]) >= float(sys.argv[2]) else "no")' "$t" "$2")" yes
}
held "24 MiB written directly" 2.4 'dd if=/dev/zero of=/tmp/d bs=1M count=24 oflag=direct'
held "24 MiB read directly" 2.4 'dd if=/tmp/d of=/dev/null bs=1M iflag=direct'
held "900 writes of 4 KiB (300 a second)" 2.4 'dd if=/dev/zero of=/tmp/s bs=4k count=900 oflag=direct'
# through the page cache: the writer waits for the writeback, which the root's rule holds
[ -f "/sys/class/bdi/$dev/max_bytes" ] && held "48 MiB written through the page cache" 3.5 'dd if=/dev/zero of=/tmp/b bs=1M count=48'
held "16 MiB written and fsync'ed" 1.6 'dd if=/dev/zero of=/tmp/f bs=1M count=16 conv=fsync'
victim_ok "during and after the disk I/O"

# ---- the rules go with the sandbox ----
"$SC" rm "$A" >/dev/null
# (the execution is torn down after the answer: wait until its disk is released)
for i in $(seq 100); do [ -e "/sys/block/$loop/loop/backing_file" ] || break; sleep 0.1; done
expect "after rm, the blkio root has no rule for its disk" "$(grep -c "^$dev " $BLKIO/blkio.throttle.write_bps_device)" 0
if [ -f "/sys/class/bdi/$dev/strict_limit" ]; then
	expect "after rm, its disk's dirty bound is off" "$(cat /sys/class/bdi/$dev/strict_limit)" 0
fi
victim_ok "after the attacker's sandbox went"

# ---- dev down (launchers killed): no rule left on a loop device holding no image ----
"$SC" dev down --dir "$D" >/dev/null
left=0
for f in $BLKIO/blkio.throttle.write_bps_device $BLKIO/blkio.throttle.write_iops_device; do
	while read -r mm _; do
		# (loop devices: major 7; loop/ is there only while one holds an image)
		[ "${mm%%:*}" = 7 ] && [ ! -e "/sys/dev/block/$mm/loop/backing_file" ] && left=$((left + 1))
	done <"$f"
done
expect "after dev down, no writeback rule left on a released loop device" "$left" 0

echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
