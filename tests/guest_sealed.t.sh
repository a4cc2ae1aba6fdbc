#!/bin/sh
# run-tests: paired, about 2 s
# The guest (PID 1 of every process-substrate sandbox) is out of its tenant's reach: spaced-node
# runs a copy of it that executions can execute but not read (root's, mode 0511), so the kernel
# makes it undumpable with its memory owned by the host's user namespace. The sandbox's root
# (root of its user namespace) can then neither ptrace it, nor read its memory or environment,
# nor take its descriptors (pidfd_getfd: the launcher's control socket), nor read the binary;
# nor, through a file operation the guest itself serves, its /proc entry; its own processes stay
# debuggable, and the sandbox works as before.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
SC=$SPACED_BUILD/spacectl/spacectl
[ "$(id -u)" -eq 0 ] || { echo "the process substrate needs root"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "python3 is not installed"; exit 77; }
W=$(mktemp -d)
D=$W/cluster
export SPACED_ROUTE_CACHE="$W/routes"
trap '"$SC" dev down --dir "$D" >/dev/null 2>&1; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
if ! "$SC" dev up --workers 1 --dir "$D" --plaintext >"$W/up.out" 2>"$W/up.err"; then
	cat "$W/up.err"; echo "FAIL: dev up"; exit 1
fi
. "$D/env"
X=$("$SC" create)
[ -n "$X" ] || { echo "FAIL: create"; exit 1; }
"$SC" exec "$X" -- python3 -c '
import ctypes, os, signal, subprocess, time
libc = ctypes.CDLL(None, use_errno=True)
def err(r):
    return "ok" if r >= 0 else os.strerror(ctypes.get_errno())
print("seize", err(libc.ptrace(0x4206, 1, 0, 0)))
print("attach", err(libc.ptrace(16, 1, 0, 0)))
fd = libc.syscall(434, 1, 0)
print("getfd", err(libc.syscall(438, fd, 3, 0)) if fd >= 0 else "no-pidfd")
for f in ("/proc/1/mem", "/proc/1/environ", "/.spaced/spaced-guest"):
    try:
        open(f, "rb").read(1)
        print(f, "ok")
    except OSError as e:
        print(f, os.strerror(e.errno))
# the tenant'"'"'s own processes stay debuggable
child = subprocess.Popen(["sleep", "30"])
time.sleep(0.2)
print("own", err(libc.ptrace(0x4206, child.pid, 0, 0)))
child.kill()
' >"$W/probe" 2>&1
cat "$W/probe"
p() { awk -v k="$1" '$1 == k {$1 = ""; sub(/^ /, ""); print}' "$W/probe"; }
expect "ptrace(PTRACE_SEIZE) of the guest is refused" "$(p seize)" "Operation not permitted"
expect "ptrace(PTRACE_ATTACH) of the guest is refused" "$(p attach)" "Operation not permitted"
expect "pidfd_getfd of the guest's descriptor 3 is refused" "$(p getfd)" "Operation not permitted"
expect "the guest's memory is not readable" "$(p /proc/1/mem)" "Permission denied"
expect "the guest's environment is not readable" "$(p /proc/1/environ)" "Permission denied"
expect "the guest's binary is not readable" "$(p /.spaced/spaced-guest)" "Permission denied"
expect "the tenant's own processes can still be traced" "$(p own)" "ok"
expect "the guest still serves: exec" "$("$SC" exec "$X" -- echo alive)" alive
printf 'data\n' | "$SC" fs write "$X" /workspace/f
expect "the guest still serves: files" "$("$SC" fs read "$X" /workspace/f)" data
# the guest opens what a file operation names: its own /proc entry is refused there too (its memory
# map through fs read was the one part of the seal a tenant could still read)
for f in /proc/self/maps /proc/1/maps /proc/thread-self/status /proc/self/fdinfo/3 /proc/1/cmdline; do
	"$SC" fs read "$X" "$f" >"$W/pr.out" 2>"$W/pr.err"
	expect "fs read $f is refused" "$?:$(wc -c <"$W/pr.out" | tr -d ' '):$(grep -c 'EACCES\|ermission' "$W/pr.err")" "1:0:1"
done
"$SC" fs ls "$X" /proc/1/fd >/dev/null 2>"$W/pr.err"
expect "fs ls /proc/1/fd is refused" "$?" 1
expect "the rest of /proc is the tenant's to read" "$("$SC" fs read "$X" /proc/loadavg | wc -w | tr -d ' ')" 5
expect "the executions' copy of the guest is root's, mode 0511" \
	"$(stat -c '%U %a' "$D/worker-1/guest/spaced-guest")" "root 511"
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
