#!/bin/sh
# run-tests: paired, about 9 s
# The qemu substrate's guest transport, end to end: a QEMU microvm (TCG unless
# SPACED_VM_ACCEL says otherwise) with a vhost-user-vsock-device served by
# spaced-vsockd, a stock Debian kernel and the test initramfs (static busybox,
# the vsock modules, vsock-echo on port 1024). Through the hybrid Unix socket,
# exactly as spaced-host speaks to Firecracker:
#   - "CONNECT 1024\n" is answered "OK <n>\n" with n counting up from 2^30,
#     and 1 MiB comes back byte for byte (figures printed);
#   - a malformed CONNECT line, a CONNECT to a port nobody listens on (the
#     guest's RST) and a client that says nothing are each closed without a
#     byte of answer, and the daemon goes on serving;
#   - 50 connections opened, used and closed in a row all work;
#   - spaced-host, unchanged, passes its transport checks against this socket
#     (B1/B2: the listener is held by the expected spaced-vsockd, its
#     executable, the peer credentials; then CONNECT/OK): its refusal comes
#     only from the answer to its HELLO (the test guest echoes instead of
#     answering as spaced-guest would); with the wrong process named as the
#     VMM it refuses at the transport (SPACED_EPEER);
#   - the guest's own connection to the host's port 5000 (vsock-dial in /init)
#     reaches the Unix socket "<hybrid path>_5000", as with Firecracker;
#   - spaced-vsockd's loop runs under its seccomp allow-list throughout;
#   - when QEMU goes, spaced-vsockd ends on its own and removes its sockets.
# Exit 77 (reason on the last line) when QEMU, a kernel with the virtio vsock
# modules, a static busybox or cpio is missing. Every wait is bounded.
set -u
build=${SPACED_BUILD:?}
top=${SPACED_TOP:?}
vsockd=$build/spaced-vmm/spaced-vsockd
client=$build/tests/vsock-client
qemu=$(command -v qemu-system-x86_64 || true)
[ -n "$qemu" ] || { echo "qemu-system-x86_64 not installed (scripts/setup.sh)"; exit 77; }
[ -x "$vsockd" ] && [ -x "$client" ] || { echo "spaced-vsockd or vsock-client not built"; exit 77; }
"$qemu" -device help 2>/dev/null | grep -q '"vhost-user-vsock-device"' ||
	{ echo "this QEMU has no vhost-user-vsock-device"; exit 77; }
kernel=${SPACED_VM_KERNEL:-}
if [ -z "$kernel" ]; then
	for k in $(ls /boot/vmlinuz-* 2>/dev/null | sort -V -r); do
		v=${k#/boot/vmlinuz-}
		if [ -n "$(find "/lib/modules/$v" -name 'vmw_vsock_virtio_transport.ko*' 2>/dev/null | head -n 1)" ]; then
			kernel=$k; export SPACED_VM_KVER=$v; break
		fi
	done
fi
[ -n "$kernel" ] && [ -r "$kernel" ] || { echo "no readable kernel with virtio vsock modules in /boot (linux-image-amd64)"; exit 77; }
command -v cpio >/dev/null || { echo "cpio not installed"; exit 77; }
[ -x /bin/busybox ] || { echo "busybox-static not installed"; exit 77; }

tmp=$(mktemp -d /tmp/spaced-vmvsock-XXXXXX)
vpid=""
qpid=""
spid=""
cleanup() {
	[ -n "$spid" ] && kill "$spid" 2>/dev/null
	[ -n "$qpid" ] && kill "$qpid" 2>/dev/null
	[ -n "$vpid" ] && kill "$vpid" 2>/dev/null
	[ -n "$qpid" ] && wait "$qpid" 2>/dev/null
	[ -n "$vpid" ] && wait "$vpid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
failed=0
T0=$(date +%s)
ok() { printf 'ok: %s [%s s]\n' "$*" $(($(date +%s) - T0)); }
fail() { printf 'FAIL: %s [%s s]\n' "$*" $(($(date +%s) - T0)); failed=1; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
export SPACED_VSOCK_CLIENT_TIMEOUT_MS=20000

sh "$top/spaced-vmm/mkinitramfs.sh" "$tmp/build" "$tmp/initrd.gz" >"$tmp/mkinitramfs.log" 2>&1 || {
	cat "$tmp/mkinitramfs.log"; echo "cannot build the test initramfs"; exit 77; }

# boot the uncompressed ELF kernel through PVH when it can be had: it spares
# the ≈ 5 s that Debian's XZ-compressed image takes to unpack itself under TCG
boot=$kernel
sh "$top/spaced-vmm/extract-vmlinux.sh" "$kernel" "$tmp/vmlinux" 2>/dev/null && boot=$tmp/vmlinux

vu=$tmp/vu.sock
uds=$tmp/v.sock
"$vsockd" --socket "$vu" --uds "$uds" --cid 3 --timeout-ms 2000 2>"$tmp/vsockd.log" &
vpid=$!
i=0
while [ ! -S "$vu" ]; do
	i=$((i + 1)); [ $i -gt 100 ] && { cat "$tmp/vsockd.log"; echo "FAIL: spaced-vsockd did not listen"; exit 1; }
	sleep 0.05
done

# the host side of the guest's own connection (to port 5000)
"$client" serve "${uds}_5000" >"$tmp/serve.out" 2>&1 &
spid=$!

# tsc_early_khz spares the guest its TSC calibration, slow under TCG
khz=$(awk -F: '/^cpu MHz/ { printf "%d", $2 * 1000; exit }' /proc/cpuinfo)
tsc=""
[ -n "$khz" ] && [ "$khz" -gt 0 ] && tsc="tsc_early_khz=$khz"
t0=$(now_ms)
"$qemu" -accel "${SPACED_VM_ACCEL:-tcg}" \
	-M microvm,pit=on,pic=on,rtc=on,acpi=on,memory-backend=mem -m 256 -smp 1 \
	-object memory-backend-memfd,id=mem,size=256M,share=on \
	-nodefaults -no-user-config -display none -serial "file:$tmp/console.log" \
	-chardev "socket,id=vu,path=$vu" -device vhost-user-vsock-device,chardev=vu \
	-kernel "$boot" -initrd "$tmp/initrd.gz" \
	-append "console=ttyS0 quiet panic=-1 $tsc" -no-reboot 2>"$tmp/qemu.log" &
qpid=$!
i=0
while ! grep -q 'vsock-echo: listening' "$tmp/console.log" 2>/dev/null; do
	i=$((i + 1))
	if [ $i -gt 450 ] || ! kill -0 "$qpid" 2>/dev/null; then
		cat "$tmp/console.log" "$tmp/qemu.log" "$tmp/vsockd.log" 2>/dev/null
		echo "FAIL: the guest did not come up within 45 s"; exit 1
	fi
	sleep 0.1
done
ok "guest up, QEMU start to listener $(( $(now_ms) - t0 )) ms ($(basename "$kernel")$([ "$boot" = "$kernel" ] || echo ' as ELF through PVH'), ${SPACED_VM_ACCEL:-tcg})"

if out=$("$client" echo "$uds" 1024 1048576 2>&1); then
	case "$out" in
	*"local_port=1073741824 "*) ok "CONNECT 1024 answered OK 1073741824 (2^30), 1 MiB echoed byte for byte: $out" ;;
	*) fail "first local port is not 2^30: $out" ;;
	esac
else
	fail "1 MiB echo: $out"
fi

for line in 'CONNECT x\n' 'CONNECT 01024\n' 'CONNECT  1024\n' 'connect 1024\n' 'CONNECT 99999999999\n' \
	'CONNECT 1024' 'CONNECT 1024 \n' 'HELLO\n' 'CONNECT 102400000000000000000000000000000000\n'; do
	if out=$("$client" refused "$uds" "$line" 2>&1); then
		ok "'$line' refused: $out"
	else
		fail "'$line' not refused: $out"
	fi
done

if out=$("$client" refused "$uds" 'CONNECT 4242\n' 2>&1); then
	ok "CONNECT to port 4242 (no listener: the guest's RST) closed: $out"
else
	fail "CONNECT to a port nobody listens on: $out"
fi

if out=$(SPACED_VSOCK_CLIENT_TIMEOUT_MS=6000 "$client" refused "$uds" '' 2>&1); then
	ok "a client that sends nothing is closed after the 2 s timeout: $out"
else
	fail "silent client: $out"
fi

if out=$("$client" loop "$uds" 1024 50 2>&1); then
	ok "50 connections in a row: $out"
else
	fail "50 connections in a row: $out"
fi

if out=$("$client" echo "$uds" 1024 4194304 2>&1); then
	ok "4 MiB echo after all that: $out"
else
	fail "4 MiB echo after the refusals: $out"
fi

# the bridge in front of this transport, as spaced-node would start it
host=$build/spaced-host/spaced-host
if [ -x "$host" ]; then
	for who in vsockd qemu; do
		pid=$vpid exe=$vsockd
		[ "$who" = qemu ] && pid=$qpid exe=$qemu
		"$host" --listen "$tmp/host-$who.sock" --guest "$uds" --guest-port 1024 \
			--identity 'sandbox=vm1;generation=1;worker=w1;substrate=qemu;activation=a1;pod_uid=' \
			--launcher-pid "$pid" --launcher-exe "$exe" --manager-uid "$(id -u)" --timeout-ms 3000 \
			2>"$tmp/host-$who.log" &
		hpid=$!
		i=0
		while [ ! -S "$tmp/host-$who.sock" ] && [ $i -lt 50 ]; do i=$((i + 1)); sleep 0.1; done
		out=$("$client" read "$tmp/host-$who.sock" 2>&1)
		kill "$hpid" 2>/dev/null; wait "$hpid" 2>/dev/null
		refusal=$(grep 'event=guest-refused' "$tmp/host-$who.log")
		case "$who:$refusal" in
		vsockd:*'code=SPACED_EPROTO reason="malformed HELLO answer from the guest"'*)
			ok "spaced-host passes its B1/B2 and CONNECT checks against spaced-vsockd (refused only at the echoed HELLO: $out)" ;;
		qemu:*'code=SPACED_EPEER'*)
			ok "spaced-host naming QEMU instead of spaced-vsockd as the VMM refuses at the transport: ${refusal#*code=}" ;;
		*) fail "spaced-host ($who named as the VMM): $out / $(cat "$tmp/host-$who.log")" ;;
		esac
	done
fi

i=0
while kill -0 "$spid" 2>/dev/null; do
	i=$((i + 1)); [ $i -gt 100 ] && break
	sleep 0.1
done
if wait "$spid" && grep -q "got='hello from the guest'" "$tmp/serve.out" &&
	grep -q 'vsock-dial: reply: host got: hello from the guest' "$tmp/console.log"; then
	ok "the guest's connection to host port 5000 reached ${uds##*/}_5000 and got its answer"
else
	fail "guest-initiated connection: $(cat "$tmp/serve.out"; grep vsock-dial "$tmp/console.log")"
fi
spid=""

kill -0 "$vpid" 2>/dev/null && ok "spaced-vsockd still running" || fail "spaced-vsockd died"
# it parses what the guest puts in its rings: its loop runs under its system-call allow-list
# (a call outside it kills the daemon; everything above ran under it)
st=$(awk '/^Seccomp:/ {s = $2} /^NoNewPrivs:/ {n = $2} END {print s " " n}' "/proc/$vpid/status" 2>/dev/null)
[ "$st" = "2 1" ] && ok "spaced-vsockd runs confined (Seccomp filter, NoNewPrivs)" || fail "spaced-vsockd's confinement: '$st'"

# shut the VM down: spaced-vsockd sees its front-end go and ends by itself
kill "$qpid"
wait "$qpid" 2>/dev/null
qpid=""
i=0
while kill -0 "$vpid" 2>/dev/null; do
	i=$((i + 1)); [ $i -gt 50 ] && break
	sleep 0.1
done
if kill -0 "$vpid" 2>/dev/null; then
	fail "spaced-vsockd still running 5 s after QEMU ended"
else
	wait "$vpid"; rc=$?
	vpid=""
	[ "$rc" -eq 0 ] && ok "spaced-vsockd ended with QEMU (exit 0)" || fail "spaced-vsockd exit status $rc"
	[ ! -e "$vu" ] && [ ! -e "$uds" ] && ok "sockets removed" || fail "socket files left behind"
fi
if [ "$failed" -ne 0 ]; then
	echo "--- spaced-vsockd log"; cat "$tmp/vsockd.log"
	echo "--- console"; cat "$tmp/console.log"
	exit 1
fi
grep -q 'level=error' "$tmp/vsockd.log" && { echo "FAIL: errors in the daemon's log:"; cat "$tmp/vsockd.log"; exit 1; }
echo "ok: all"
exit 0
