#!/bin/sh
# bench-vm: the qemu substrate's lifecycle against the process substrate's, in
# the same run (issue 15). Each round, directly on the supervisors (spaced-vm
# for a microVM, spaced-launch for a process execution), both with 256 MiB:
#   - cold boot: from nothing to the guest answering HELLO (spaced-vm's and
#     spaced-launch's own "READY <ms>": disk, back-end, QEMU, kernel, init,
#     spaced-guest on AF_VSOCK; for the process substrate its namespaces);
#   - idle host memory of the VM 3 s after it was ready: what its cgroup is
#     charged (the pages of its RAM file on tmpfs, QEMU, spaced-vsockd);
#   - pause (guest sync + QMP stop; the freezer) and resume (QMP cont; thaw);
#   - create from the booted template of this shape (built once, by the
#     first create, before the rounds): memory loaded, vsock plugged, identity
#     given on the guest's control port, HELLO answered;
#   - snapshot save while paused (memory and disk for the VM: vsock unplugged,
#     QEMU's state saved, plugged back; the upper layer for a process);
#   - a new generation from that snapshot (the VM's memory restored: its
#     processes go on; the process substrate restores files only);
# Medians over ROUNDS rounds. Needs root.
#   vm_bench.sh BUILD [ROUNDS]
# Last line: {"boot_p50_ms":…, "snapshot_create_p50_ms":…, "pause_ms":…, "resume_ms":…, "idle_rss_mb":…, …}
set -u
BUILD=$(cd "${1:?usage: vm_bench.sh BUILD [ROUNDS]}" && pwd)
ROUNDS=${2:-5}
TOP=$(cd "$(dirname "$0")/.." && pwd)
export SPACED_BUILD=$BUILD SPACED_TOP=$TOP
. "$TOP/tests/vm_lib.sh"
why=$(vm_prereqs) || { echo "bench-vm: $why"; exit 1; }
VM=$BUILD/spaced-vmm/spaced-vm
LAUNCH=$BUILD/spaced-node/spaced-launch
GUEST=$BUILD/spaced-guest/spaced-guest
W=$(mktemp -d /tmp/spaced-vmbench-XXXXXX)
chmod 711 "$W"
PIDS=""
trap 'for p in $PIDS; do kill $p 2>/dev/null; done; rm -rf "$W"' EXIT
vm_images "$BUILD" "$W/img" >"$W/img.log" 2>&1 || { cat "$W/img.log"; exit 1; }
mkdir -p /run/spaced/uid-ranges
U=$((1073741824 + 3100 * 65536))
ms() { echo $(( $(date +%s%N) / 1000000 )); }
median() { sort -n | awk '{ a[NR] = $1 } END { if (NR == 0) print "null"; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
# waits for "READY <ms>" in the supervisor's output FILE (at most 180 s)
# while PID lives; prints the figure (whole milliseconds)
ready_ms() {
	i=0
	while ! grep -q '^READY ' "$1" 2>/dev/null; do
		i=$((i + 1))
		{ [ $i -gt 1800 ] || ! kill -0 "$2" 2>/dev/null; } && return 1
		sleep 0.1
	done
	awk '/^READY / { printf "%d\n", $2; exit }' "$1"
}
# runs a ctl command of a supervisor; prints its wall time in ms
timed() { t=$(ms); "$@" >/dev/null || return 1; echo $(( $(ms) - t )); }
stop_wait() { # PID: waits (at most 20 s) for a supervisor told to stop
	i=0
	while kill -0 "$1" 2>/dev/null && [ $i -lt 200 ]; do i=$((i + 1)); sleep 0.1; done
	kill "$1" 2>/dev/null
	wait "$1" 2>/dev/null
}

: >"$W/boot"; : >"$W/restore"; : >"$W/tmpl"; : >"$W/pause"; : >"$W/resume"; : >"$W/save"; : >"$W/rss"; : >"$W/rss_cold"
: >"$W/p_boot"; : >"$W/p_restore"; : >"$W/p_pause"; : >"$W/p_resume"; : >"$W/p_save"
# start_vm NAME ID [spaced-vm options…]: a VM in $W/NAME; sets vp (its
# spaced-vm) and b (its READY figure)
start_vm() {
	name=$1 id=$2
	shift 2
	"$VM" --state "$W/$name" --images "$W/img" --identity "$id" --uid "$U" --cid 11 --memory 256M --disk 1G \
		--pids 256 --run-dir "$W/run" --uid-lock /run/spaced/uid-ranges "$@" >"$W/$name.out" 2>"$W/$name.err" &
	vp=$!
	PIDS="$PIDS $vp"
	b=$(ready_ms "$W/$name.out" "$vp")
}
mem_of() { # STATE: KiB of host memory charged to the VM's cgroup (its RAM file's
	# pages, QEMU, the back-end), from spaced-vm's USAGE
	"$VM" ctl --state "$1" USAGE | sed -n 's/.* memory=\([0-9]*\) .*/\1/p' | awk '{ printf "%d\n", $1 / 1024 }'
}
# the template of this shape (256 MiB, 1 vCPU, 1 GiB): built by the first create
t=$(ms)
start_vm t0 "sandbox=benchtmpl;generation=1;worker=wb;substrate=qemu;activation=a;pod_uid=" ||
	{ cat "$W/t0.err"; echo "bench-vm: the first VM (and its template) did not start"; exit 1; }
tmpl_build=$(( $(ms) - t ))
"$VM" ctl --state "$W/t0" STOP >/dev/null
stop_wait "$vp"
rm -rf "$W/t0"
echo "template of this shape built by the first create: $tmpl_build ms"
for r in $(seq 1 "$ROUNDS"); do
	# ---- qemu: a cold boot ----
	start_vm c$r "sandbox=cold$r;generation=1;worker=wb;substrate=qemu;activation=a;pod_uid=" --no-template ||
		{ cat "$W/c$r.err"; echo "bench-vm: the VM did not boot"; exit 1; }
	echo "$b" >>"$W/boot"
	sleep 3
	mem_of "$W/c$r" >>"$W/rss_cold"
	"$VM" ctl --state "$W/c$r" STOP >/dev/null
	stop_wait "$vp"
	# ---- qemu: from the template, then pause, snapshot, resume ----
	start_vm v$r "sandbox=bench$r;generation=1;worker=wb;substrate=qemu;activation=a;pod_uid=" ||
		{ cat "$W/v$r.err"; echo "bench-vm: the VM did not start from the template"; exit 1; }
	echo "$b" >>"$W/tmpl"
	sleep 3
	mem_of "$W/v$r" >>"$W/rss"
	timed "$VM" ctl --state "$W/v$r" PAUSE >>"$W/pause"
	t=$(ms)
	"$VM" ctl --state "$W/v$r" SNAPSHOT "$W/snap$r" >/dev/null && echo $(( $(ms) - t )) >>"$W/save"
	timed "$VM" ctl --state "$W/v$r" THAW >>"$W/resume"
	"$VM" ctl --state "$W/v$r" STOP >/dev/null
	stop_wait "$vp"
	# ---- qemu: a new generation from that (memory) snapshot ----
	start_vm r$r "sandbox=bench$r;generation=2;worker=wb;substrate=qemu;activation=a;pod_uid=" \
		--restore "$W/snap$r" || { cat "$W/r$r.err"; echo "bench-vm: the VM did not start from its snapshot"; exit 1; }
	echo "$b" >>"$W/restore"
	"$VM" ctl --state "$W/r$r" STOP >/dev/null
	stop_wait "$vp"
	rm -rf "$W/c$r" "$W/v$r" "$W/r$r" "$W/snap$r"

	# ---- process (the same figures, the same run) ----
	PID_="sandbox=pbench$r;generation=1;worker=wb;substrate=process;activation=a;pod_uid="
	"$LAUNCH" --state "$W/p$r" --guest "$GUEST" --identity "$PID_" --memory 256M --pids 256 --disk 1G \
		--uid-base "$U" --uid-lock /run/spaced/uid-ranges >"$W/p$r.out" 2>"$W/p$r.err" &
	lp=$!
	PIDS="$PIDS $lp"
	b=$(ready_ms "$W/p$r.out" "$lp") || { cat "$W/p$r.err"; echo "bench-vm: the process execution did not start"; exit 1; }
	echo "$b" >>"$W/p_boot"
	timed "$LAUNCH" ctl --state "$W/p$r" PAUSE >>"$W/p_pause"
	t=$(ms)
	"$LAUNCH" ctl --state "$W/p$r" SNAPSHOT "$W/psnap$r" >/dev/null && echo $(( $(ms) - t )) >>"$W/p_save"
	timed "$LAUNCH" ctl --state "$W/p$r" THAW >>"$W/p_resume"
	"$LAUNCH" ctl --state "$W/p$r" STOP >/dev/null
	stop_wait "$lp"
	PID2="sandbox=pbench$r;generation=2;worker=wb;substrate=process;activation=a;pod_uid="
	"$LAUNCH" --state "$W/q$r" --guest "$GUEST" --identity "$PID2" --memory 256M --pids 256 --disk 1G \
		--uid-base "$U" --uid-lock /run/spaced/uid-ranges --restore "$W/psnap$r" >"$W/q$r.out" 2>"$W/q$r.err" &
	lp=$!
	PIDS="$PIDS $lp"
	b=$(ready_ms "$W/q$r.out" "$lp") || { cat "$W/q$r.err"; echo "bench-vm: the process execution did not restore"; exit 1; }
	echo "$b" >>"$W/p_restore"
	"$LAUNCH" ctl --state "$W/q$r" STOP >/dev/null
	stop_wait "$lp"
	rm -rf "$W/p$r" "$W/q$r" "$W/psnap$r"
	printf 'round %s: qemu cold boot %s ms (idle %s KiB), from the template %s ms (idle %s KiB), pause %s ms, snapshot save %s ms, resume %s ms, from the snapshot %s ms | process create %s ms, from snapshot %s ms, pause %s ms, resume %s ms, save %s ms (load %s)\n' \
		"$r" "$(tail -n 1 "$W/boot")" "$(tail -n 1 "$W/rss_cold")" "$(tail -n 1 "$W/tmpl")" "$(tail -n 1 "$W/rss")" \
		"$(tail -n 1 "$W/pause")" "$(tail -n 1 "$W/save")" "$(tail -n 1 "$W/resume")" "$(tail -n 1 "$W/restore")" \
		"$(tail -n 1 "$W/p_boot")" "$(tail -n 1 "$W/p_restore")" "$(tail -n 1 "$W/p_pause")" "$(tail -n 1 "$W/p_resume")" \
		"$(tail -n 1 "$W/p_save")" "$(cut -d' ' -f1 /proc/loadavg)"
done

boot=$(median <"$W/boot")
restore=$(median <"$W/restore")
tmpl=$(median <"$W/tmpl")
rss_cold=$(median <"$W/rss_cold")
rss_cold_mb=$(awk -v k="$rss_cold" 'BEGIN { printf "%.1f", k / 1024 }')
pause=$(median <"$W/pause")
resume=$(median <"$W/resume")
save=$(median <"$W/save")
rss=$(median <"$W/rss")
rss_mb=$(awk -v k="$rss" 'BEGIN { printf "%.1f", k / 1024 }')
pb=$(median <"$W/p_boot")
pr=$(median <"$W/p_restore")
pp=$(median <"$W/p_pause")
pu=$(median <"$W/p_resume")
ps=$(median <"$W/p_save")
echo "qemu (pc, TCG, 256 MiB, 1 vCPU): cold boot p50 $boot ms (target <= 2500), create from the booted template p50 $tmpl ms" \
	"(target <= 500), pause $pause ms, snapshot save (memory and disk) $save ms, resume $resume ms," \
	"a new generation from that snapshot $restore ms, idle host memory $rss_mb MiB from the template," \
	"$rss_cold_mb MiB after a cold boot (charged to the VM's cgroup: RAM file pages, QEMU, spaced-vsockd); the template took $tmpl_build ms to make"
echo "process (same run): create p50 $pb ms, from snapshot $pr ms, pause $pp ms, resume $pu ms, snapshot save $ps ms"
printf '{"boot_p50_ms":%s,"snapshot_create_p50_ms":%s,"pause_ms":%s,"resume_ms":%s,"idle_rss_mb":%s,"idle_rss_cold_boot_mb":%s,"snapshot_save_ms":%s,"restore_from_snapshot_ms":%s,"template_build_ms":%s,"memory_snapshot":true,"process_boot_p50_ms":%s,"process_snapshot_create_p50_ms":%s,"process_pause_ms":%s,"process_resume_ms":%s,"process_snapshot_save_ms":%s,"rounds":%s}\n' \
	"$boot" "$tmpl" "$pause" "$resume" "$rss_mb" "$rss_cold_mb" "$save" "$restore" "$tmpl_build" "$pb" "$pr" "$pp" "$pu" "$ps" "$ROUNDS"
