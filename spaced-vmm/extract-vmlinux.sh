#!/bin/sh
# Writes the uncompressed ELF kernel (vmlinux) held in a compressed bzImage.
#   extract-vmlinux.sh BZIMAGE OUT
# A QEMU microvm boots an ELF kernel through its PVH entry point (Debian's
# kernels have CONFIG_PVH=y), which skips the kernel's own decompressor: under
# TCG, unpacking Debian's XZ-compressed 8 MB image takes ≈ 5 s of a ≈ 8 s boot.
# Looks for each compression format's magic in the image and keeps the first
# payload that decompresses to an ELF file. Needs xz (or gzip, zstd, lz4 for
# kernels built with those).
set -eu
[ $# -eq 2 ] || { echo "usage: $0 BZIMAGE OUT" >&2; exit 2; }
img=$1
out=$2
tmp=$out.tmp.$$
trap 'rm -f "$tmp"' EXIT

try() { # magic (as grep -P bytes), decompressor command
	for off in $(LC_ALL=C grep -obUaP "$1" "$img" 2>/dev/null | cut -d: -f1 | head -n 8); do
		tail -c +"$((off + 1))" "$img" | $2 >"$tmp" 2>/dev/null || true
		if [ "$(head -c 4 "$tmp" 2>/dev/null | od -An -c | tr -d ' \n')" = '177ELF' ]; then
			mv "$tmp" "$out"
			return 0
		fi
	done
	return 1
}

try '\xfd\x37\x7a\x58\x5a\x00' 'xz -dc' ||
	try '\x1f\x8b\x08' 'gzip -dc' ||
	try '\x28\xb5\x2f\xfd' 'zstd -dcq' ||
	try '\x02\x21\x4c\x18' 'lz4 -dc' ||
	{ echo "extract-vmlinux: no ELF kernel found in $img" >&2; exit 1; }
