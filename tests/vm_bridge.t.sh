#!/bin/sh
# run-tests: paired, about 15 s
# The qemu substrate's bridge verification (B1–B3) against a real microVM:
# spaced-vm boots Debian's kernel with spaced-guest as PID 1 listening on
# AF_VSOCK, spaced-vsockd holds the hybrid socket, and spaced-host is started
# the way spaced-node starts it (spaced-vsockd as the listener process, QEMU as
# the VM whose memory it serves, the guest CID). Then, each time through a new
# bridge and a HELLO:
#   - the right names: the guest answers with its identity, twice (every new
#     connection passes every check again, B3);
#   - a reused PID: QEMU or the back-end named with another start time;
#   - a replaced QEMU: a live qemu-system-x86_64 of the same executable that is
#     not this back-end's front-end; and QEMU named with another executable;
#   - another guest CID than the back-end serves;
#   - a guest answering with another execution's identity (SPACED_EIDENTITY);
#   - the guest's control port refuses identities of another sandbox, or of
#     the same or an older generation;
#   - while the VM is paused (QMP stop) a new connection is refused at once and
#     after the thaw it is served again;
#   - a replaced back-end: a second, genuine spaced-vsockd whose hybrid socket
#     is renamed over the VM's; refused whether the bridge names the real
#     back-end (not the holder of the listener) or the impostor (not QEMU's
#     back-end);
#   - spaced-vm ctl STOP ends QEMU and the back-end and removes the VM's
#     directory; nothing of it is left running.
# With SPACED_VM_FULL=1 (make check-vm) also: a hostile guest (the transport
# test's initramfs, which echoes every byte instead of answering) never
# becomes ready; spaced-vm gives up at its boot timeout and neither it nor
# spaced-vsockd crashes.
# Exit 77 (reason on the last line) when a VM cannot boot here. Every wait is bounded.
set -u
build=${SPACED_BUILD:?}
top=${SPACED_TOP:?}
. "$top/tests/vm_lib.sh"
why=$(vm_prereqs) || { echo "$why"; exit 77; }
vm=$build/spaced-vmm/spaced-vm
vsockd=$build/spaced-vmm/spaced-vsockd
host=$build/spaced-host/spaced-host
client=$build/tests/vsock-client
tmp=$(mktemp -d /tmp/spaced-vmbridge-XXXXXX)
chmod 711 "$tmp"
vmpid=""
others=""
cleanup() {
	for p in $others; do kill "$p" 2>/dev/null; done
	[ -n "$vmpid" ] && kill "$vmpid" 2>/dev/null && wait "$vmpid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
failed=0
T0=$(date +%s)
ok() { printf 'ok: %s [%s s]\n' "$*" $(($(date +%s) - T0)); }
fail() { printf 'FAIL: %s [%s s]\n' "$*" $(($(date +%s) - T0)); failed=1; }

vm_images "$build" "$tmp/img" >"$tmp/img.log" 2>&1 || { cat "$tmp/img.log"; echo "cannot build the VM images"; exit 77; }

# a uid range of its own, under the host-wide locks every launcher takes
mkdir -p /run/spaced/uid-ranges
ID1='sandbox=vmb1;generation=1;worker=wt;substrate=qemu;activation=a1;pod_uid='
ID2='sandbox=vmb2;generation=1;worker=wt;substrate=qemu;activation=a1;pod_uid='
U=""
for k in 3001 3002 3003 3004; do
	u=$((1073741824 + k * 65536))
	t0=$(now_ms)
	"$vm" --state "$tmp/x" --images "$tmp/img" --identity "$ID1" --uid "$u" --cid 9 --memory 192M --disk 256M \
		--pids 32 --run-dir "$tmp/run" --uid-lock /run/spaced/uid-ranges >"$tmp/vm.out" 2>"$tmp/vm.err" &
	vmpid=$!
	sleep 0.3
	if kill -0 "$vmpid" 2>/dev/null || [ -e "$tmp/x/ready" ]; then U=$u; break; fi
	wait "$vmpid" 2>/dev/null
	vmpid=""
done
[ -n "$U" ] || { cat "$tmp/vm.err"; echo "FAIL: no free uid range for the VM"; exit 1; }
i=0
while [ ! -e "$tmp/x/ready" ]; do
	i=$((i + 1))
	if [ $i -gt 1500 ] || ! kill -0 "$vmpid" 2>/dev/null; then
		cat "$tmp/vm.err" "$tmp/x/console.log" "$tmp/x/vm.log" 2>/dev/null
		echo "FAIL: the VM did not become ready within 150 s"; exit 1
	fi
	sleep 0.1
done
ok "VM ready: $(cat "$tmp/vm.out") ms after spaced-vm started (waited $(( $(now_ms) - t0 )) ms)"
read -r _ VP VS <<EOF
$(sed -n 1p "$tmp/x/pids")
EOF
read -r _ QP QS <<EOF
$(sed -n 2p "$tmp/x/pids")
EOF
[ "$(stat -c %u "$tmp/run/guest.sock")" = "$U" ] && ok "the hybrid socket belongs to the execution's uid $U" ||
	fail "guest.sock owner $(stat -c %u "$tmp/run/guest.sock")"
[ "$(awk '/^Uid:/ { print $2 }' "/proc/$QP/status")" = "$U" ] && ok "QEMU runs as uid $U, not root" ||
	fail "QEMU uid $(awk '/^Uid:/ { print $2 }' "/proc/$QP/status")"

# bridge NAME [spaced-host options…]: one bridge, one HELLO through it; prints the client's line
bridge() {
	name=$1
	shift
	sock=$tmp/h-$name.sock
	"$host" --listen "$sock" --guest "$tmp/run/guest.sock" --manager-uid 0 --timeout-ms 10000 \
		--guest-owner "$U" "$@" 2>"$tmp/h-$name.log" &
	hp=$!
	i=0
	while [ ! -S "$sock" ] && [ $i -lt 100 ]; do i=$((i + 1)); sleep 0.05; done
	"$client" hello "$sock" 2>&1
	[ "${TWICE:-0}" = 1 ] && "$client" hello "$sock" 2>&1
	kill "$hp" 2>/dev/null
	wait "$hp" 2>/dev/null
}
good="--launcher-pid $VP --launcher-start $VS --launcher-exe $vsockd"
qemu_ok="--vm-pid $QP --vm-start $QS --vm-exe $(command -v qemu-system-x86_64)"
expect_ok() {
	case "$2" in
	*"ok hello identity=$ID1"*) ok "$1" ;;
	*) fail "$1: $2" ;;
	esac
}
expect_refused() {
	case "$2" in
	*"refused code=$3 reason="*"$4"*) ok "$1: ${2#*reason=}" ;;
	*) fail "$1 (wanted $3 '$4'): $2" ;;
	esac
}

out=$(TWICE=1 bridge good $good $qemu_ok --guest-cid 9 --identity "$ID1")
[ "$(echo "$out" | grep -c "ok hello identity=$ID1")" = 2 ] &&
	ok "the bridge pinned to spaced-vsockd and QEMU reaches the guest, two connections each checked" ||
	fail "right names: $out"
# the guest's control port (spaced-vm's way to give a restored guest its
# generation) takes no identity of another sandbox and none of an older or the
# same generation
ctl() { "$client" line "$tmp/run/guest.sock" 1023 "$1" 2>&1; }
expect_line() {
	case "$2" in
	"answer '$3"*) ok "$1: ${2#answer }" ;;
	*) fail "$1: $2" ;;
	esac
}
expect_line "the control port reports the guest's identity" "$(ctl STATUS)" "READY $ID1"
expect_line "another sandbox's identity is refused" "$(ctl "IDENTITY $ID2")" "ERR only a newer generation of vmb1"
expect_line "the same generation again is refused" "$(ctl "IDENTITY $ID1")" "ERR only a newer generation"
expect_line "a malformed identity is refused" "$(ctl "IDENTITY sandbox=vmb1")" "ERR not a canonical"
# S4: the same execution under another activation is taken (and back again)
ID1B='sandbox=vmb1;generation=1;worker=wt;substrate=qemu;activation=a2;pod_uid='
expect_line "another activation of the same execution is taken" "$(ctl "IDENTITY $ID1B")" "READY"
expect_line "and reported" "$(ctl STATUS)" "READY $ID1B"
expect_line "another worker's identity of that generation is refused" \
	"$(ctl "IDENTITY sandbox=vmb1;generation=1;worker=w9;substrate=qemu;activation=a3;pod_uid=")" "ERR only a newer generation"
expect_line "the first activation again is taken too" "$(ctl "IDENTITY $ID1")" "READY"
expect_line "and the guest still answers as itself" "$(ctl STATUS)" "READY $ID1"
out=$(bridge qstart $good --vm-pid "$QP" --vm-start $((QS + 1)) --guest-cid 9 --identity "$ID1")
expect_refused "QEMU's PID with another start time (reused PID)" "$out" SPACED_EPEER "PID reused"
out=$(bridge vstart --launcher-pid "$VP" --launcher-start $((VS + 1)) --launcher-exe "$vsockd" $qemu_ok --identity "$ID1")
expect_refused "the back-end's PID with another start time (reused PID)" "$out" SPACED_EPEER "PID reused"
"$(command -v qemu-system-x86_64)" -M none -S -display none -nodefaults -no-user-config >/dev/null 2>&1 &
decoy=$!
others="$others $decoy"
sleep 0.5
out=$(bridge decoy $good --vm-pid "$decoy" --vm-exe "$(command -v qemu-system-x86_64)" --identity "$ID1")
expect_refused "a replaced QEMU (same executable, alive, not this back-end's front-end)" "$out" SPACED_EPEER \
	"holds no connection to the back-end"
out=$(bridge qexe $good --vm-pid "$QP" --vm-start "$QS" --vm-exe "$vsockd" --identity "$ID1")
expect_refused "QEMU named with another executable" "$out" SPACED_EPEER "replaced executable"
out=$(bridge cid $good $qemu_ok --guest-cid 10 --identity "$ID1")
expect_refused "another guest CID than the back-end serves" "$out" SPACED_EPEER "serves guest CID 9"
out=$(bridge ident $good $qemu_ok --guest-cid 9 --identity "$ID2")
expect_refused "a guest answering with another execution's identity" "$out" SPACED_EIDENTITY ""

"$vm" ctl --state "$tmp/x" PAUSE >/dev/null || fail "PAUSE"
out=$(bridge paused $good $qemu_ok --identity "$ID1")
case "$out" in
*"refused code="*) ok "a new connection while the VM is paused is refused: ${out#*reason=}" ;;
*) fail "connection while paused: $out" ;;
esac
"$vm" ctl --state "$tmp/x" THAW >/dev/null || fail "THAW"
out=$(bridge thawed $good $qemu_ok --guest-cid 9 --identity "$ID1")
expect_ok "after the thaw the guest answers again" "$out"
# S4 through spaced-vm (the worker's activation change of a running VM): its guest takes another
# activation of its identity, a bridge expecting it is served, a bridge expecting the old one is
# refused; spaced-vm refuses another sandbox's identity and changes nothing while the VM is paused
"$vm" ctl --state "$tmp/x" IDENTITY "$ID1B" >/dev/null || fail "spaced-vm ctl IDENTITY (another activation)"
out=$(bridge activated $good $qemu_ok --guest-cid 9 --identity "$ID1B")
case "$out" in
*"ok hello identity=$ID1B"*) ok "after spaced-vm's IDENTITY a bridge expecting the new activation is served" ;;
*) fail "bridge for the new activation: $out" ;;
esac
out=$(bridge stale $good $qemu_ok --guest-cid 9 --identity "$ID1")
expect_refused "a bridge expecting the old activation is refused" "$out" SPACED_EIDENTITY ""
case "$("$vm" ctl --state "$tmp/x" IDENTITY "$ID2" 2>&1)" in
*"ERR identity: only another activation"*) ok "spaced-vm refuses another sandbox's identity" ;;
*) fail "spaced-vm took another sandbox's identity" ;;
esac
"$vm" ctl --state "$tmp/x" PAUSE >/dev/null || fail "PAUSE"
case "$("$vm" ctl --state "$tmp/x" IDENTITY "$ID1" 2>&1)" in
*"ERR identity: the execution is paused"*) ok "spaced-vm refuses an activation change while paused" ;;
*) fail "activation change while paused" ;;
esac
"$vm" ctl --state "$tmp/x" THAW >/dev/null || fail "THAW"
"$vm" ctl --state "$tmp/x" IDENTITY "$ID1" >/dev/null || fail "spaced-vm ctl IDENTITY (back to the first activation)"
out=$(bridge back $good $qemu_ok --guest-cid 9 --identity "$ID1")
expect_ok "and back under the first activation it is served" "$out"

# a replaced back-end: a genuine spaced-vsockd of its own, its hybrid socket
# renamed over the VM's (the real back-end still runs)
mkdir "$tmp/imp"
"$vsockd" --socket "$tmp/imp/vu.sock" --uds "$tmp/imp/g.sock" --cid 9 2>"$tmp/imp.log" &
imp=$!
others="$others $imp"
i=0
while [ ! -S "$tmp/imp/g.sock" ] && [ $i -lt 100 ]; do i=$((i + 1)); sleep 0.05; done
chown "$U" "$tmp/imp/g.sock"
mv "$tmp/imp/g.sock" "$tmp/run/guest.sock"
out=$(bridge replaced $good $qemu_ok --guest-cid 9 --identity "$ID1")
expect_refused "a replaced back-end, the real one named" "$out" SPACED_EPEER "is not held by process $VP"
IS=$(awk '{ print $22 }' "/proc/$imp/stat")
out=$(bridge impostor --launcher-pid "$imp" --launcher-start "$IS" --launcher-exe "$vsockd" $qemu_ok --guest-cid 9 \
	--identity "$ID1")
expect_refused "a replaced back-end named as the listener (genuine executable)" "$out" SPACED_EPEER \
	"VM process $QP holds no connection to the back-end process $imp"
kill -0 "$VP" 2>/dev/null && kill -0 "$QP" 2>/dev/null && ok "spaced-vsockd and QEMU still run" ||
	fail "the VM's processes died"

"$vm" ctl --state "$tmp/x" STOP >/dev/null || fail "STOP"
i=0
while kill -0 "$vmpid" 2>/dev/null && [ $i -lt 100 ]; do i=$((i + 1)); sleep 0.1; done
if kill -0 "$vmpid" 2>/dev/null; then
	fail "spaced-vm still runs 10 s after STOP"
else
	wait "$vmpid"
	rc=$?
	vmpid=""
	[ "$rc" -eq 0 ] && ok "spaced-vm ended after STOP (exit 0)" || fail "spaced-vm exit status $rc"
	kill -0 "$QP" 2>/dev/null || kill -0 "$VP" 2>/dev/null && fail "QEMU or spaced-vsockd left running" ||
		ok "QEMU and spaced-vsockd are gone"
	[ ! -e "$tmp/run" ] && ok "the VM's directory was removed" || fail "$tmp/run left behind"
fi

if [ "${SPACED_VM_FULL:-0}" = 1 ]; then
	# a hostile guest: an initramfs whose PID 1 echoes every byte back
	# instead of answering HELLO
	mkdir -p "$tmp/evil"
	sh "$top/spaced-vmm/mkinitramfs.sh" "$tmp/evil/build" "$tmp/evil/initrd.img" >"$tmp/evil.log" 2>&1 &&
		cp "$tmp/img/vmlinux" "$tmp/evil/vmlinux" && ln -s "$tmp/img/rootfs" "$tmp/evil/rootfs" ||
		fail "cannot build the hostile guest's image: $(cat "$tmp/evil.log")"
	t0=$(now_ms)
	"$vm" --state "$tmp/e" --images "$tmp/evil" --identity "$ID2" --uid "$U" --cid 9 --memory 128M --disk 64M \
		--run-dir "$tmp/erun" --uid-lock /run/spaced/uid-ranges --boot-timeout-ms 25000 --no-template >"$tmp/e.out" 2>"$tmp/e.err" &
	vmpid=$!
	i=0
	while kill -0 "$vmpid" 2>/dev/null && [ $i -lt 900 ]; do i=$((i + 1)); sleep 0.1; done
	if kill -0 "$vmpid" 2>/dev/null; then
		fail "spaced-vm with a hostile guest still runs after 90 s"
	else
		wait "$vmpid"
		rc=$?
		vmpid=""
		if [ "$rc" -eq 1 ] && grep -q 'execution setup failed: the guest did not answer' "$tmp/e.err" &&
			! grep -qi 'sanitizer\|segv\|abort' "$tmp/e.err" "$tmp/e/vm.log"; then
			ok "a hostile guest (echoes instead of answering) never became ready; spaced-vm gave up cleanly after $(( $(now_ms) - t0 )) ms"
		else
			fail "hostile guest: exit $rc: $(cat "$tmp/e.err"; tail -5 "$tmp/e/vm.log")"
		fi
		grep -q 'vsock-echo: listening' "$tmp/e/console.log" && ok "(the hostile guest did boot and listen)" ||
			fail "the hostile guest did not boot: $(tail -5 "$tmp/e/console.log")"
	fi
fi

if [ "$failed" -ne 0 ]; then
	echo "--- spaced-vm"; cat "$tmp/vm.err"; tail -20 "$tmp/x/vm.log"
	exit 1
fi
echo "ok: all"
exit 0
