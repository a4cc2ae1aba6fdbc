#!/bin/sh
# Installs the Debian packages spaced needs to build, test and run, when any is missing.
# Idempotent and quiet when everything is present. Needs root (or sudo) only when it installs.
# The qemu substrate (spaced-vmm/, tests/vm_*.t.sh) needs the last line: QEMU and qemu-img, a stock
# Debian kernel with its modules (vsock and virtio are modules there), a static busybox and
# cpio for the guest's initramfs.
set -eu

PKGS="build-essential pkg-config meson ninja-build clang libclang-rt-14-dev
libsodium-dev libjansson-dev libcriterion-dev libuv1-dev libwebsockets-dev
libseccomp-dev libsqlite3-dev sqlite3 libpq-dev postgresql bubblewrap libssl-dev e2fsprogs
iproute2 util-linux procps python3 jq curl libcurl4-openssl-dev prometheus
qemu-system-x86 qemu-utils linux-image-amd64 busybox-static cpio
passt nftables libnftables-dev conntrack libnetfilter-conntrack-dev nginx socat
libarchive-dev mmdebstrap"
# the TypeScript SDK (sdk/typescript) builds with Node 18+ and npm; a node already
# installed (Debian's, or another distribution of it) is used as it is
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || PKGS="$PKGS nodejs npm"

missing=""
for p in $PKGS; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		missing="$missing $p"
	fi
done
[ -z "$missing" ] && exit 0

echo "setup: installing:$missing"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
echo "setup: done"
