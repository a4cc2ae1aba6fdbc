# gwbudget.py PORT HOSTNAME CAP CAFILE N — N TLS streams admitted at the gateway from 127.0.0.2..,
# 64 per source address, each asking for a big answer it never reads; prints how many were admitted
# (anything but 503) and how many got 503 busy, then holds them until stdin closes.
import socket, ssl, sys, resource
port, host, cap, ca, n = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
ctx = ssl.create_default_context(cafile=ca)
ctx.check_hostname = False
held, admitted, busy = [], 0, 0
for i in range(n):
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.bind(("127.0.0.%d" % (2 + i // 64), 0))
    raw.settimeout(5)
    raw.connect(("127.0.0.1", port))
    s = ctx.wrap_socket(raw, server_hostname=host)
    s.sendall(("GET /big HTTP/1.1\r\nHost: %s:%d\r\nAuthorization: Bearer %s\r\n\r\n" % (host, port, cap)).encode())
    try:
        first = s.recv(12)
    except socket.timeout:
        first = b""
    if first.startswith(b"HTTP/1.1 503") or first.startswith(b"HTTP/1.0 503"):
        busy += 1
        s.close()
    else:
        admitted += 1
        held.append(s)
print("admitted=%d busy=%d" % (admitted, busy), flush=True)
sys.stdin.read()
