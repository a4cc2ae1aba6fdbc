#!/bin/sh
# run-tests: paired, about 1 s
# C2: verify-only components cannot sign. libspaced (what workers and gateways
# link) holds no signing code: a program that calls spaced_paseto_sign links
# against libspaced_signer only, and fails to link against libspaced alone.
# The worker daemons (spaced-node, spaced-host, spaced-netgtw), when built,
# contain no signing symbol at all.
#   env: SPACED_BUILD (absolute build dir), SPACED_TOP (repo root)
set -u
build=${SPACED_BUILD:?SPACED_BUILD is not set}
top=${SPACED_TOP:?SPACED_TOP is not set}
lib="$build/libspaced/libspaced.a"
signer="$build/libspaced/libspaced-signer.a"
fail=0

if ! command -v cc >/dev/null 2>&1 || ! command -v nm >/dev/null 2>&1; then
	echo "cc or nm missing"
	exit 77
fi
[ -f "$lib" ] || { echo "FAIL: $lib not built"; exit 1; }
[ -f "$signer" ] || { echo "FAIL: $signer not built"; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
deps=$(pkg-config --cflags --libs libsodium jansson) || { echo "pkg-config failed"; exit 1; }

# The sanitizer build's objects need the sanitizer runtimes at link time.
san=""
if nm "$lib" 2>/dev/null | grep -q '__asan_'; then
	san="-fsanitize=address,undefined"
fi

cat >"$tmp/sign.c" <<'EOF'
#include "signer.h"
int main(void)
{
	char *token = 0;
	return spaced_paseto_sign(0, (const unsigned char *)"", 0, 0, 0, 0, 0, &token);
}
EOF
cat >"$tmp/verify.c" <<'EOF'
#include "paseto.h"
int main(void)
{
	unsigned char pk[32] = {0}, *msg = 0;
	unsigned long n = 0;
	return spaced_paseto_verify("v4.public.x", 11, pk, 0, 0, 0, 0, &msg, &n);
}
EOF

# 1. Control: a verify-only program links against libspaced alone, so a link
#    failure below is about the missing symbol, not about the command line.
# shellcheck disable=SC2086
if ! cc $san -I"$top/libspaced" "$tmp/verify.c" "$lib" $deps -lpthread -o "$tmp/verify" 2>"$tmp/verify.err"; then
	echo "FAIL: a verify-only program does not link against libspaced.a:"
	cat "$tmp/verify.err"
	exit 1
fi
echo "ok: verify-only program links against libspaced.a alone"

# 2. The signing program must not link against libspaced alone ...
# shellcheck disable=SC2086
if cc $san -I"$top/libspaced" "$tmp/sign.c" "$lib" $deps -lpthread -o "$tmp/sign" 2>"$tmp/sign.err"; then
	echo "FAIL: a program calling spaced_paseto_sign linked against libspaced.a alone"
	fail=1
elif grep -q "undefined reference to .spaced_paseto_sign" "$tmp/sign.err"; then
	echo "ok: link error names spaced_paseto_sign"
else
	echo "FAIL: link failed for another reason:"
	cat "$tmp/sign.err"
	fail=1
fi

# 3. ... and links once libspaced_signer is added (the symbol lives there only).
# shellcheck disable=SC2086
if cc $san -I"$top/libspaced" "$tmp/sign.c" "$signer" "$lib" $deps -lpthread -o "$tmp/sign" 2>"$tmp/sign2.err"; then
	echo "ok: the same program links with libspaced-signer.a"
else
	echo "FAIL: the signing program does not link even with libspaced-signer.a:"
	cat "$tmp/sign2.err"
	fail=1
fi

# 4. No secret-key or signing symbol is defined anywhere in libspaced.a.
defined=$(nm --defined-only "$lib" 2>/dev/null | grep -E ' [TtDdBbRr] (spaced_paseto_sign|spaced_cap_issue|spaced_secret_key_)' || true)
if [ -n "$defined" ]; then
	echo "FAIL: libspaced.a defines signing symbols:"
	echo "$defined"
	fail=1
else
	echo "ok: libspaced.a defines no signing symbol"
fi

# 5. Worker daemons, when they exist, contain no signing symbol.
checked=0
for dir in spaced-node spaced-host spaced-netgtw; do
	for bin in "$build/$dir"/*; do
		[ -f "$bin" ] && [ -x "$bin" ] || continue
		case "$bin" in *.p|*.so|*.a) continue ;; esac
		checked=$((checked + 1))
		nm "$bin" >"$tmp/nm" 2>/dev/null || true
		syms=$(grep -E ' (spaced_paseto_sign|spaced_cap_issue|spaced_secret_key_[a-z_]*)$' "$tmp/nm" || true)
		if ! grep -q ' spaced_' "$tmp/nm"; then
			# without a symbol table the absence of signing code cannot be shown
			echo "FAIL: $bin has no spaced_ symbols to inspect (stripped?)"
			fail=1
		elif [ -n "$syms" ]; then
			echo "FAIL: $bin contains signing symbols:"
			echo "$syms"
			fail=1
		else
			echo "ok: $(basename "$bin") has no signing symbol"
		fi
	done
done
[ "$checked" -eq 0 ] && echo "note: no worker daemon binaries built yet; only the libraries were checked"

exit $fail
