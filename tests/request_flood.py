#!/usr/bin/env python3
"""request_flood.py PORT SECONDS THREADS SANDBOX TOKEN — a tenant's request flood at a worker's
node-api: THREADS kept-alive connections each send requests for SANDBOX with TOKEN (a forged one
costs the gate a signature check) eight at a time, for SECONDS (connections closed are opened
again). Prints how many answers came back."""
import socket
import sys
import threading
import time

port, secs, n, sbx, tok = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
req = ("GET /v1/sandboxes/%s/stat?path=/ HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n" % (sbx, tok)).encode()
count = [0] * n
def run(i):
    end = time.time() + secs
    s = None
    while time.time() < end:
        try:
            if s is None:
                s = socket.create_connection(("127.0.0.1", port), timeout=2)
            s.sendall(req * 8)
            got = b""
            while got.count(b"HTTP/1.1 ") < 8:
                d = s.recv(65536)
                if not d:
                    raise OSError("closed")
                got += d
            count[i] += 8
        except OSError:
            if s: s.close()
            s = None
threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
for t in threads: t.start()
for t in threads: t.join()
print(sum(count))
