#!/bin/sh
# run-tests: paired, about 3 s
# spaced-netd on its own (docs/network.md): the resolver of a worker's executions runs as root and
# parses every execution's DNS, so its loop runs under its seccomp allow-list (libspaced/confine.c,
# a call outside the list kills it), and reads files only beneath its --dir, writing, making and
# removing none (Landlock, where the kernel has it; libspaced/confine.c spaced_confine_files,
# tests/test_confine.c). Its rarest path — taking an idle egress namespace down (flock, umount2,
# unlink) — runs in a helper it forked before (Landlock forbids unmounts), itself under a filter
# of its own: with no execution link in its namespace for --idle seconds the namespace is
# unmounted and netd ends with status 0, not killed, its helper with it.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
NETD=$SPACED_BUILD/spaced-node/spaced-netd
[ "$(id -u)" -eq 0 ] || { echo "spaced-netd needs root"; exit 77; }
[ -x "$NETD" ] || { echo "spaced-netd is not built"; exit 77; }
command -v unshare >/dev/null || { echo "unshare is not installed"; exit 77; }
W=$(mktemp -d)
trap '[ -n "${NP:-}" ] && kill -9 "$NP" 2>/dev/null; umount "$W/net/ns" 2>/dev/null; rm -rf "$W"' EXIT
mkdir -p "$W/net/slot"
touch "$W/net/ns"
unshare --net="$W/net/ns" true || { echo "cannot make a network namespace"; exit 77; }
expect "the egress namespace is mounted" "$(grep -c " $W/net/ns " /proc/mounts)" 1
# an upstream on the host's loopback that is never asked (nothing resolves here)
"$NETD" --dir "$W/net" --upstream 127.0.0.1:9 --idle 1 2>"$W/netd.log" &
NP=$!
wait_for "spaced-netd is ready" grep -q "event=ready" "$W/netd.log"
expect "it runs confined (Seccomp filter, NoNewPrivs)" \
	"$(awk '/^Seccomp:/ {s = $2} /^NoNewPrivs:/ {n = $2} END {print s " " n}' "/proc/$NP/status" 2>/dev/null)" "2 1"
# Landlock's ABI version here (0: none), from landlock_create_ruleset(NULL, 0, VERSION)
abi=$(python3 -c 'import ctypes; print(max(0, ctypes.CDLL(None, use_errno=True).syscall(444, None, 0, 1)))' 2>/dev/null || echo 0)
expect "it reads files only beneath its directory (Landlock ABI $abi here)" \
	"$(sed -n 's/.*event=ready .*files=\([^ ]*\).*/\1/p' "$W/netd.log")" "$([ "${abi:-0}" -ge 1 ] && echo beneath-dir || echo "any(no-landlock)")"
TD=$(pgrep -P "$NP" -x spaced-netd-td)
expect "its teardown helper runs, confined (Seccomp filter, NoNewPrivs)" \
	"$(awk '/^Seccomp:/ {s = $2} /^NoNewPrivs:/ {n = $2} END {print s " " n}' "/proc/${TD:-0}/status" 2>/dev/null)" "2 1"
# a malformed packet from inside the namespace is dropped, the daemon lives on
nsenter --net="$W/net/ns" sh -c 'ip link set lo up; printf "\001\002garbage" | timeout 2 socat - UDP:127.0.0.1:53' \
	>/dev/null 2>&1 || true
expect "a malformed packet leaves it running" "$(kill -0 "$NP" 2>/dev/null && echo yes)" yes
i=0
while kill -0 "$NP" 2>/dev/null && [ $i -lt 150 ]; do i=$((i + 1)); sleep 0.1; done
wait "$NP"
rc=$?
NP=
expect "idle for its --idle time, it took the namespace down and ended by itself (exit 0, not killed)" "$rc" 0
grep -q "event=exit reason=\"no execution for 1 s" "$W/netd.log" && ok "it logged why" || fail "no exit line: $(tail -n 3 "$W/netd.log")"
expect "the namespace is unmounted and its file removed" "$(grep -c " $W/net/ns " /proc/mounts; [ -e "$W/net/ns" ] && echo left)" 0
# (gone, or a zombie until whoever adopted it reaps it)
expect "its teardown helper ended with it" \
	"$([ -n "$TD" ] && [ "$(awk '{print $3}' "/proc/$TD/stat" 2>/dev/null || echo Z)" != Z ] && echo running || echo ended)" ended
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
