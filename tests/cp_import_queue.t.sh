#!/bin/sh
# run-tests: light, about 30 s
# Template imports wait their turn, tenants in turn (spaced-cp/blobs.c): at most two imports run
# at once; an upload that is in while two run waits in one queue, first come first served; a
# tenant has one upload or import in progress at most, so the queue takes tenants in turn. A
# control plane alone, tenants alpha, beta and gamma:
#  - alpha and beta import slow archives (150,000 empty files each) at once; while both run,
#    alpha's second import is 503 (one at a time: it cannot queue ahead of other tenants);
#  - gamma's upload sent while both run waits (template-import-queued); its client goes away
#    while it waits: it is dropped, not imported, and gamma may upload again at once;
#  - gamma's next import, sent while both still run, waits and is then imported: 201 and its
#    template listed (before, it was 503 busy until one of the others ended: two tenants' slow
#    imports locked every other tenant out of the store);
#  - a build's FROM naming gamma's template, sent while both run, is answered at once (a lookup:
#    it was queued behind the imports too).
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
W=$(mktemp -d)
trap 'cleanup; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
SC=$SPACED_BUILD/spacectl/spacectl
mkdir -p "$W/cp"
TA=$(admin create-tenant alpha)
[ -n "$TA" ] || { echo "admin commands failed"; exit 1; }
TB=$(admin create-tenant beta)
TG=$(admin create-tenant gamma)
start_cp cp
export SPACED_CP_URL="$CP_URL"
G=$(sqlite3 "$W/cp/cp.db" "SELECT id FROM tenants WHERE name = 'gamma'" 2>/dev/null)
[ -n "$G" ] || G=gamma
# archives written header by header: 150,000 empty files (slow to import), and one small file
python3 - "$W/slow.tar" 150000 "$W/small.tar" <<'PY'
import sys
def hdr(name, typ, mode, size=0):
    h = bytearray(512)
    h[0:len(name)] = name
    h[100:108] = b"%07o\0" % mode
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"00000000000\0"
    h[148:156] = b"        "
    h[156:157] = typ
    h[257:263] = b"ustar\0"
    h[263:265] = b"00"
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)
with open(sys.argv[1], "wb") as f:
    for d in range(int(sys.argv[2]) // 1000):
        f.write(hdr(b"d%d/" % d, b"5", 0o755))
        f.write(b"".join(hdr(b"d%d/f%d" % (d, i), b"0", 0o644) for i in range(1000)))
    f.write(b"\0" * 1024)
with open(sys.argv[3], "wb") as f:
    f.write(hdr(b"hello", b"0", 0o644, 6) + b"hello\n".ljust(512, b"\0") + b"\0" * 1024)
PY
SPACED_API_KEY=$TG "$SC" template import base-g "$W/small.tar" >/dev/null 2>"$W/g0.err" || fail "gamma's first import"
SPACED_API_KEY=$TA "$SC" template import slow-a "$W/slow.tar" >"$W/a.out" 2>"$W/a.err" &
PA=$!
SPACED_API_KEY=$TB "$SC" template import slow-b "$W/slow.tar" >"$W/b.out" 2>"$W/b.err" &
PB=$!
started() { [ "$(grep -c 'event=template-import-started' "$CP_LOG")" -ge "$1" ]; }
ended() { grep -c 'event=template-import template=slow-' "$CP_LOG"; }
WAIT_SECONDS=60 wait_for "alpha's and beta's imports run (after gamma's first)" started 3
SPACED_API_KEY=$TA "$SC" template import again-a "$W/small.tar" >/dev/null 2>"$W/a2.err"
expect "alpha's second import while its first runs: 503, one at a time" \
	"$(grep -c '503 busy.*one at a time' "$W/a2.err")" 1
SPORT=$(cat "$W/cp/store.port")
code=$(curl -s -m 10 -o "$W/from.json" -w '%{http_code}' -H "Authorization: Bearer $TG" -H 'content-type: application/json' \
	--data '{"from":"base-g"}' "http://127.0.0.1:$SPORT/v1/builds/from")
expect "a FROM naming gamma's template while both imports run: answered at once (200, its hash)" \
	"$code $(jq -r '.hash | length' "$W/from.json" 2>/dev/null) $(ended)" "200 64 0"
# gamma's upload, whose client goes away while it waits
python3 - "$SPORT" "$TG" "$W/small.tar" "$CP_LOG" "$G" <<'PY' &
import socket, sys, time
port, key, path, log, g = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
body = open(path, "rb").read()
s = socket.create_connection(("127.0.0.1", port), timeout=10)
s.sendall(("PUT /v1/templates/gone HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
           "Content-Length: %d\r\n\r\n" % (key, len(body))).encode() + body)
end = time.time() + 20
while time.time() < end and ("event=template-import-queued tenant=%s " % g) not in open(log).read():
    time.sleep(0.05)
s.close()
PY
PQ=$!
wait "$PQ"
expect "gamma's upload waited while two imports ran" \
	"$(grep -c "event=template-import-queued tenant=$G " "$CP_LOG")" 1
expect "both slow imports still ran then" "$(ended)" 0
SPACED_API_KEY=$TG "$SC" template import small-g "$W/small.tar" --json >"$W/g.out" 2>"$W/g.err" &
PG=$!
wait_for "gamma's second upload waits too (the first was dropped: gamma may upload again)" \
	sh -c "[ \"\$(grep -c 'event=template-import-queued tenant=$G ' '$CP_LOG')\" -ge 2 ]"
expect "and both slow imports still ran then" "$(ended)" 0
wait "$PG"
expect "gamma's waiting import is imported" "$(jq -r '.name' "$W/g.out" 2>/dev/null)" small-g
expect "gamma's templates: the ones imported, not the one whose client left" \
	"$(SPACED_API_KEY=$TG "$SC" template ls --json | jq -r '[.[].name] | sort | join(" ")')" "base-g small-g"
expect "gamma's import was taken once a slot was free" \
	"$(grep -c "event=template-import-dequeued tenant=$G " "$CP_LOG")" 1
wait "$PA"
wait "$PB"
expect "alpha's slow import: imported" "$(SPACED_API_KEY=$TA "$SC" template ls --json | jq -r '.[].name')" slow-a
expect "beta's slow import: imported" "$(SPACED_API_KEY=$TB "$SC" template ls --json | jq -r '.[].name')" slow-b
grep 'event=template-import' "$CP_LOG" | sed 's/^/  /'
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
