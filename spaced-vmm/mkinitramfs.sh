#!/bin/sh
# Builds the test guest's initramfs for the qemu substrate.
#   mkinitramfs.sh BUILD OUT
# BUILD: a scratch directory (created); OUT: the initramfs to write (gzip'ed newc cpio).
# Environment: SPACED_VM_KVER (kernel version whose modules to take; default: the
# newest /lib/modules/* holding the virtio vsock transport), CC (default cc).
#
# The image holds a static busybox, the static guest listener vsock-echo and
# vsock-dial (built here from guest/*.c with -static) and the kernel modules a Debian
# kernel needs on a QEMU microvm before AF_VSOCK works: on Debian 6.1 virtio,
# virtio_ring, virtio_mmio and the whole vsock stack are modules (CONFIG_VIRTIO=m,
# CONFIG_VIRTIO_MMIO=m, CONFIG_VSOCKETS=m, CONFIG_VIRTIO_VSOCKETS=m) and
# CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES is off, so the virtio-mmio devices are found
# through the ACPI tables of the microvm (acpi=on). /init loads them in dependency
# order, starts vsock-echo on port 1024 and, in the background, vsock-dial, which
# connects once to the host's port 5000 and prints the answer on the console.
set -eu
[ $# -eq 2 ] || { echo "usage: $0 BUILD OUT" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
build=$1
out=$2
CC=${CC:-cc}
MODS="virtio_ring virtio virtio_mmio vsock vmw_vsock_virtio_transport_common vmw_vsock_virtio_transport"

kver=${SPACED_VM_KVER:-}
if [ -z "$kver" ]; then
	for d in $(ls -d /lib/modules/* 2>/dev/null | sort -V -r); do
		if [ -n "$(find "$d" -name 'vmw_vsock_virtio_transport.ko*' 2>/dev/null | head -n 1)" ]; then
			kver=$(basename "$d"); break
		fi
	done
fi
[ -n "$kver" ] || { echo "mkinitramfs: no kernel modules with the virtio vsock transport under /lib/modules" >&2; exit 1; }
busybox=$(command -v busybox 2>/dev/null || true)
[ -x /bin/busybox ] && busybox=/bin/busybox
[ -n "$busybox" ] || { echo "mkinitramfs: busybox (static) not installed" >&2; exit 1; }
file -L "$busybox" 2>/dev/null | grep -q 'statically linked' || \
	ldd "$busybox" 2>&1 | grep -q 'not a dynamic executable' || \
	{ echo "mkinitramfs: $busybox is not static (install busybox-static)" >&2; exit 1; }
command -v cpio >/dev/null || { echo "mkinitramfs: cpio not installed" >&2; exit 1; }

root=$build/initramfs
rm -rf "$root"
mkdir -p "$root/bin" "$root/lib/modules" "$root/proc" "$root/sys" "$root/dev" "$root/tmp"
cp "$busybox" "$root/bin/busybox"
"$CC" -static -O2 -Wall -Wextra -o "$root/bin/vsock-echo" "$here/guest/vsock_echo.c"
"$CC" -static -O2 -Wall -Wextra -o "$root/bin/vsock-dial" "$here/guest/vsock_dial.c"

for m in $MODS; do
	f=$(find "/lib/modules/$kver" -name "$m.ko*" | head -n 1)
	[ -n "$f" ] || { echo "mkinitramfs: module $m missing for $kver" >&2; exit 1; }
	case "$f" in
	*.ko) cp "$f" "$root/lib/modules/$m.ko" ;;
	*.ko.xz) xz -dc "$f" >"$root/lib/modules/$m.ko" ;;
	*.ko.zst) zstd -qdc "$f" >"$root/lib/modules/$m.ko" ;;
	*.ko.gz) gzip -dc "$f" >"$root/lib/modules/$m.ko" ;;
	*) echo "mkinitramfs: unknown module format $f" >&2; exit 1 ;;
	esac
done

cat >"$root/init" <<INIT
#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sys /sys
/bin/busybox mount -t devtmpfs dev /dev
for m in $MODS; do
	/bin/busybox insmod /lib/modules/\$m.ko || echo "init: insmod \$m failed"
done
echo "init: modules loaded"
# a guest-initiated connection: host port 5000 (the hybrid socket's <path>_5000)
/bin/vsock-dial 5000 "hello from the guest" &
/bin/vsock-echo 1024
echo "init: vsock-echo ended (\$?)"
/bin/busybox poweroff -f
INIT
chmod 0755 "$root/init"
mkdir -p "$(dirname "$out")"
(cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) | gzip -1 >"$out.tmp"
mv "$out.tmp" "$out"
echo "mkinitramfs: $out (kernel $kver)"
