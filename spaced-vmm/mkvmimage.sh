#!/bin/sh
# Builds what a worker needs to run `qemu` substrate executions (docs/substrate.md
# "The qemu substrate"):
#   mkvmimage.sh GUEST OUTDIR
# GUEST: the spaced-guest binary (static, or dynamic: then its libraries and
# loader travel with it). OUTDIR receives
#   vmlinux     the ELF kernel (through QEMU's PVH entry; Debian's vmlinuz when
#               it cannot be extracted)
#   initrd.img  the initramfs: static busybox, the kernel modules a Debian kernel
#               needs on a microvm (virtio-mmio, virtio-blk, ext4, vsock), spaced-guest
#               under /.spaced, and /init (below)
#   rootfs/     the default root filesystem tree (a static busybox with its
#               applets, /etc/passwd and group, the usual empty directories);
#               spaced-vm makes the execution's disk from it
#   kver        the kernel version
# and removes OUTDIR/cache (base images and templates spaced-vm made from the
# previous files).
# Environment: SPACED_VM_KERNEL (a bzImage or vmlinux; default the newest
# /boot/vmlinuz-* whose modules hold the virtio vsock transport), SPACED_VM_KVER.
#
# /init, as PID 1 of the initramfs: mounts /proc, /sys, /dev, loads the modules,
# mounts /dev/vda (ext4) as the new root, copies /.spaced into a tmpfs at the new
# root's /.spaced (read-only once filled), mounts /proc, /sys, /dev, /dev/pts,
# /dev/shm and cgroup2 there, brings up lo (the VM has no other network device),
# puts itself into a cgroup2 group "sandbox" with pids.max from the kernel
# command line (spaced.pids=N; the guest and all it starts count),
# and switch_root's into `spaced-guest --root / [--identity ID] --vsock-port PORT
# --vsock-control-port CTLPORT --vsock-forward-port FWDPORT`: spaced-guest stays
# PID 1. spaced.identity=, spaced.port= (1024), spaced.ctlport= (1023) and
# spaced.fwdport= (1025, ServicePorts) come from the kernel command line
# that spaced-vm builds; without an identity (a template) the guest waits for one
# on its control port. A failure at any step powers the VM off (the
# host sees QEMU exit).
set -eu
[ $# -eq 2 ] || { echo "usage: $0 GUEST OUTDIR" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
guest=$1
out=$2
[ -x "$guest" ] || { echo "mkvmimage: $guest is not an executable" >&2; exit 1; }
command -v cpio >/dev/null || { echo "mkvmimage: cpio not installed" >&2; exit 1; }
busybox=/bin/busybox
[ -x "$busybox" ] || busybox=$(command -v busybox 2>/dev/null || true)
[ -n "$busybox" ] && ldd "$busybox" 2>&1 | grep -q 'not a dynamic executable' ||
	{ echo "mkvmimage: a static busybox is needed (busybox-static)" >&2; exit 1; }

kernel=${SPACED_VM_KERNEL:-}
kver=${SPACED_VM_KVER:-}
if [ -z "$kernel" ]; then
	for k in $(ls /boot/vmlinuz-* 2>/dev/null | sort -V -r); do
		v=${k#/boot/vmlinuz-}
		if [ -n "$(find "/lib/modules/$v" -name 'vmw_vsock_virtio_transport.ko*' 2>/dev/null | head -n 1)" ]; then
			kernel=$k; kver=$v; break
		fi
	done
fi
[ -n "$kernel" ] && [ -r "$kernel" ] || { echo "mkvmimage: no readable kernel with virtio vsock modules in /boot" >&2; exit 1; }
[ -n "$kver" ] || kver=$(basename "$kernel" | sed 's/^vmlinu[xz]-//')
[ -d "/lib/modules/$kver" ] || { echo "mkvmimage: no modules for kernel $kver" >&2; exit 1; }

mkdir -p "$out"
tmp=$(mktemp -d "$out/.build-XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# the kernel: ELF through PVH when it can be had (≈ 5 s less under TCG)
if ! sh "$here/extract-vmlinux.sh" "$kernel" "$tmp/vmlinux" 2>/dev/null; then
	cp "$kernel" "$tmp/vmlinux"
fi

# ---- the initramfs ----
ir=$tmp/initramfs
mkdir -p "$ir/bin" "$ir/lib/modules" "$ir/proc" "$ir/sys" "$ir/dev" "$ir/newroot" "$ir/.spaced/lib"
cp "$busybox" "$ir/bin/busybox"
order=""
for top in virtio_mmio virtio_pci virtio_blk virtio_net crc32c_generic ext4 vmw_vsock_virtio_transport; do
	for f in $(modprobe -S "$kver" --show-depends "$top" 2>/dev/null | awk '$1 == "insmod" { print $2 }'); do
		m=$(basename "$f"); m=${m%%.ko*}
		case " $order " in *" $m "*) continue ;; esac
		case "$f" in
		*.ko) cp "$f" "$ir/lib/modules/$m.ko" ;;
		*.ko.xz) xz -dc "$f" >"$ir/lib/modules/$m.ko" ;;
		*.ko.zst) zstd -qdc "$f" >"$ir/lib/modules/$m.ko" ;;
		*.ko.gz) gzip -dc "$f" >"$ir/lib/modules/$m.ko" ;;
		*) echo "mkvmimage: unknown module format $f" >&2; exit 1 ;;
		esac
		order="$order $m"
	done
done
case " $order " in *" vmw_vsock_virtio_transport "*) ;; *) echo "mkvmimage: vsock modules missing for $kver" >&2; exit 1 ;; esac
case " $order " in *" virtio_blk "*) ;; *) echo "mkvmimage: virtio_blk missing for $kver" >&2; exit 1 ;; esac
echo "$order" >"$ir/lib/modules/order"
# busybox's modprobe loads them all in one process, in this order (no
# dependencies listed: the order is theirs)
ln -s . "$ir/lib/modules/$kver"
for m in $order; do echo "$m.ko:"; done >"$ir/lib/modules/modules.dep"

# spaced-guest, with its loader and libraries when it is not static
cp "$guest" "$ir/.spaced/spaced-guest"
launch="/.spaced/spaced-guest"
if ! ldd "$guest" 2>&1 | grep -q 'not a dynamic executable'; then
	for lib in $(ldd "$guest" | awk '/=> \// { print $3 } /^\t\// { print $1 }'); do
		cp -L "$lib" "$ir/.spaced/lib/"
	done
	loader=$(ldd "$guest" | awk '/^\t\// { print $1 }' | head -n 1)
	[ -n "$loader" ] || { echo "mkvmimage: no loader for $guest" >&2; exit 1; }
	launch="/.spaced/lib/$(basename "$loader") --library-path /.spaced/lib /.spaced/spaced-guest"
fi

cat >"$ir/init" <<INIT
#!/bin/busybox sh
# PID 1 of the initramfs (spaced-vmm/mkvmimage.sh): prepares the root, then
# becomes spaced-guest through switch_root.
export PATH=/bin
bb=/bin/busybox
fail() { echo "spaced-init: \$*"; \$bb poweroff -f; \$bb sleep 5; exit 1; }
\$bb mount -t proc proc /proc || fail "mount /proc"
\$bb mount -t sysfs sys /sys || fail "mount /sys"
\$bb mount -t devtmpfs dev /dev || fail "mount /dev"
# each insmod costs tens of milliseconds under TCG: what this VM cannot use is
# not tried (virtio-mmio on a PCI machine, crc32c-intel on a CPU without
# SSE4.2, TCG's); what is really missing shows when the disk or vsock fails
skip=""
[ -d /sys/bus/pci/devices ] && [ -n "\$(\$bb ls /sys/bus/pci/devices)" ] && skip="\$skip virtio_mmio"
\$bb grep -q ' sse4_2' /proc/cpuinfo || skip="\$skip crc32c-intel"
load=""
for m in \$(\$bb cat /lib/modules/order); do
	case " \$skip " in *" \$m "*) continue ;; esac
	load="\$load \$m"
done
if ! \$bb modprobe -a \$load 2>/dev/null; then
	for m in \$load; do
		[ -d /sys/module/\$(echo \$m | \$bb tr - _) ] || \$bb insmod /lib/modules/\$m.ko 2>/dev/null ||
			echo "spaced-init: module \$m not loaded"
	done
fi
id=""; port=1024; ctlport=1023; fwdport=1025; pids=0; net=""
for a in \$(\$bb cat /proc/cmdline); do
	case "\$a" in
	spaced.identity=*) id=\${a#spaced.identity=} ;;
	spaced.port=*) port=\${a#spaced.port=} ;;
	spaced.ctlport=*) ctlport=\${a#spaced.ctlport=} ;;
	spaced.fwdport=*) fwdport=\${a#spaced.fwdport=} ;;
	spaced.pids=*) pids=\${a#spaced.pids=} ;;
	spaced.net=*) net=\${a#spaced.net=} ;;
	esac
done
i=0
while [ ! -b /dev/vda ]; do
	i=\$((i + 1)); [ \$i -gt 500 ] && fail "no /dev/vda"
	\$bb usleep 10000
done
\$bb mount -t ext4 -o rw,noatime,discard,noinit_itable /dev/vda /newroot || fail "mount /dev/vda"
r=/newroot
for d in proc sys dev tmp .spaced; do \$bb mkdir -p \$r/\$d; done
\$bb mount -t tmpfs -o mode=0755,size=64m spaced \$r/.spaced || fail "mount /.spaced"
\$bb cp -a /.spaced/. \$r/.spaced/ || fail "copy spaced-guest"
\$bb mount -o remount,ro \$r/.spaced
\$bb mount --move /proc \$r/proc
\$bb mount --move /sys \$r/sys
\$bb mount --move /dev \$r/dev
\$bb mkdir -p \$r/dev/pts \$r/dev/shm
\$bb mount -t devpts -o gid=5,mode=0620,ptmxmode=0666 devpts \$r/dev/pts
\$bb mount -t tmpfs -o mode=1777,size=64m shm \$r/dev/shm
\$bb mount -t cgroup2 cgroup2 \$r/sys/fs/cgroup || fail "mount cgroup2"
# the guest and everything it starts live in the cgroup "sandbox", whose
# pids.max is the sandbox's tasks limit (set again on the control port for a
# VM made from a template)
c=\$r/sys/fs/cgroup
echo +pids >\$c/cgroup.subtree_control || fail "pids controller"
\$bb mkdir \$c/sandbox
if [ "\$pids" -gt 0 ]; then
	echo "\$pids" >\$c/sandbox/pids.max || fail "pids.max"
fi
echo 1 >\$c/sandbox/cgroup.procs || fail "join the sandbox cgroup"
\$bb hostname sandbox
\$bb ip link set lo up 2>/dev/null || echo "spaced-init: lo not up"
# the egress link (spaced.net=ADDRESS/PREFIX,GATEWAY; the gateway is the
# sandbox's resolver); without it eth0 stays down: no network
if [ -n "\$net" ]; then
	\$bb ip link set eth0 mtu 65520 && \$bb ip addr add "\${net%,*}" dev eth0 && \$bb ip link set eth0 up &&
		\$bb ip route add default via "\${net#*,}" || echo "spaced-init: eth0 not configured"
	\$bb rm -f \$r/etc/resolv.conf
	printf '# the resolver of this sandbox (spaced)\nnameserver %s\noptions edns0\n' "\${net#*,}" >\$r/etc/resolv.conf
fi
echo "spaced-init: root ready, starting spaced-guest"
# without an identity (a VM booted to become a template) the guest waits for
# one on its control port
if [ -n "\$id" ]; then
	exec \$bb switch_root \$r $launch --root / --identity "\$id" --vsock-port "\$port" --vsock-control-port "\$ctlport" \\
		--vsock-forward-port "\$fwdport"
fi
exec \$bb switch_root \$r $launch --root / --vsock-port "\$port" --vsock-control-port "\$ctlport" \\
	--vsock-forward-port "\$fwdport"
INIT
chmod 0755 "$ir/init"
# not compressed: QEMU hands the kernel the file as it is, and unpacking gzip
# in the guest cost ≈ 0.2 s of a boot under TCG
(cd "$ir" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) >"$tmp/initrd.img"

# ---- the default root filesystem tree ----
rf=$tmp/rootfs
mkdir -p "$rf/bin" "$rf/sbin" "$rf/usr/bin" "$rf/usr/sbin" "$rf/etc" "$rf/root" "$rf/home" "$rf/workspace" \
	"$rf/tmp" "$rf/var/tmp" "$rf/run" "$rf/proc" "$rf/sys" "$rf/dev" "$rf/.spaced" "$rf/mnt"
chmod 1777 "$rf/tmp" "$rf/var/tmp"
chmod 0700 "$rf/root"
cp "$busybox" "$rf/bin/busybox"
for a in $("$busybox" --list-full); do
	[ -e "$rf/$a" ] || ln -s /bin/busybox "$rf/$a"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$rf/etc/passwd"
printf 'root:x:0:\ntty:x:5:\nnogroup:x:65534:\n' >"$rf/etc/group"
echo sandbox >"$rf/etc/hostname"
printf '127.0.0.1 localhost sandbox\n::1 localhost\n' >"$rf/etc/hosts"

echo "$kver" >"$tmp/kver"
# replace what was there only once everything is built; base images and
# templates made from the previous files are stale
rm -rf "$out/rootfs" "$out/cache"
mv "$tmp/rootfs" "$out/rootfs"
mv "$tmp/vmlinux" "$out/vmlinux"
mv "$tmp/initrd.img" "$out/initrd.img"
mv "$tmp/kver" "$out/kver"
echo "mkvmimage: $out (kernel $kver$([ "$launch" = /.spaced/spaced-guest ] || echo ', dynamic guest with its libraries'))"
