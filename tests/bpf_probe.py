#!/usr/bin/env python3
# Tries what compiles BPF into the host's one JIT pool (net.core.bpf_jit_limit): a classic socket
# filter (SO_ATTACH_FILTER, SO_ATTACH_REUSEPORT_CBPF) and a seccomp filter (prctl, seccomp), also with
# high bits set in int arguments; prints one line "NAME ok|errno N" each (tests/containment.t.sh).
import ctypes, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
class SF(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]
class FP(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SF))]
def res(r):
    return "ok" if r == 0 else "errno %d" % ctypes.get_errno()
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
acc = (SF * 1)(SF(0x06, 0, 0, 0xffffffff)); fa = FP(1, acc)
allow = (SF * 1)(SF(0x06, 0, 0, 0x7fff0000)); fs = FP(1, allow)
out = []
out.append("so_attach_filter " + res(libc.setsockopt(s.fileno(), 1, 26, ctypes.byref(fa), ctypes.sizeof(fa))))
out.append("so_attach_filter_hibits " + res(libc.syscall(54, s.fileno(), ctypes.c_long(0x100000001), ctypes.c_long(0x10000001a), ctypes.byref(fa), ctypes.sizeof(fa))))
t = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
out.append("so_attach_reuseport_cbpf " + res(libc.setsockopt(t.fileno(), 1, 51, ctypes.byref(fa), ctypes.sizeof(fa))))
libc.prctl(38, 1, 0, 0, 0)
out.append("prctl_set_seccomp " + res(libc.prctl(22, 2, ctypes.byref(fs), 0, 0)))
out.append("seccomp_set_mode_filter " + res(libc.syscall(317, 1, 0, ctypes.byref(fs))))
out.append("seccomp_hibits " + res(libc.syscall(317, ctypes.c_long(0x100000001), 0, ctypes.byref(fs))))
out.append("seccomp_get_action_avail " + res(libc.syscall(317, 2, 0, ctypes.byref(ctypes.c_uint(0x7fff0000)))))
print("\n".join(out))
