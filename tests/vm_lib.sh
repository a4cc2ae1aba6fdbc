# Shared by the qemu substrate's tests (tests/vm_*.t.sh): what must be here
# for a microVM to boot, and the VM images built once per build directory.
#   vm_prereqs            prints the reason and returns 1 when a VM cannot boot here
#   vm_images BUILD OUT   builds kernel, initramfs and root tree into OUT
# (sourced; needs SPACED_BUILD and SPACED_TOP)

vm_prereqs() {
	[ "$(id -u)" -eq 0 ] || { echo "the qemu substrate needs root (uid ranges, cgroups)"; return 1; }
	qemu=$(command -v qemu-system-x86_64 || true)
	[ -n "$qemu" ] || { echo "qemu-system-x86_64 not installed (scripts/setup.sh)"; return 1; }
	command -v qemu-img >/dev/null || { echo "qemu-img not installed (qemu-utils)"; return 1; }
	"$qemu" -device help 2>/dev/null | grep -q '"vhost-user-vsock-device"' ||
		{ echo "this QEMU has no vhost-user-vsock-device"; return 1; }
	command -v cpio >/dev/null || { echo "cpio not installed"; return 1; }
	command -v mke2fs >/dev/null || { echo "mke2fs not installed (e2fsprogs)"; return 1; }
	[ -x /bin/busybox ] || { echo "busybox-static not installed"; return 1; }
	found=""
	for k in $(ls /boot/vmlinuz-* 2>/dev/null); do
		v=${k#/boot/vmlinuz-}
		[ -r "$k" ] && [ -n "$(find "/lib/modules/$v" -name 'vmw_vsock_virtio_transport.ko*' 2>/dev/null | head -n 1)" ] &&
			found=$k
	done
	[ -n "$found" ] || { echo "no readable kernel with virtio vsock modules in /boot (linux-image-amd64)"; return 1; }
	for b in spaced-vmm/spaced-vm spaced-vmm/spaced-vsockd spaced-host/spaced-host spaced-guest/spaced-guest; do
		[ -x "$SPACED_BUILD/$b" ] || { echo "$b not built"; return 1; }
	done
	return 0
}

vm_images() {
	sh "$SPACED_TOP/spaced-vmm/mkvmimage.sh" "$1/spaced-guest/spaced-guest" "$2"
}

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
