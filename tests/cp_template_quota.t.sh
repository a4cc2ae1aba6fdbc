#!/bin/sh
# run-tests: light, about 13 s
# A tenant's templates are held to its templates quota (`--quota …,templates=SIZE`, `spaced-cp
# admin set-quota NAME templates=SIZE`): every import and every naming of a built tree adds a
# tree to the control plane's store, so a tenant importing in a loop would otherwise fill its
# disk. A control plane alone (the store needs no worker), tarballs made here:
#  - an import within the quota: 201; one past it: 429 quota-exceeded (templates_bytes), and
#    its tree does not stay in the store;
#  - the same tree under another name counts once: 201;
#  - a tenant past its quota is refused before its archive is read (429 for a body that is no
#    archive at all);
#  - GET /v1/quota shows the quota and what the templates hold;
#  - after a template is removed, the import that did not fit does;
#  - a tenant has one upload in progress at a time (its second 503), another tenant's goes on;
#  - a tenant has at most 1000 template names;
#  - a tree counts as the store's archive of it when that is more than its files' content (20,000
#    empty files past a 2 MB quota); another tenant's import of the same tree with other times
#    leaves the store's archive as it was; "." and ".." are no template names;
#  - eight imports at once, each fitting alone and no two together: one is
#    named, seven are refused (or told to come back: a tenant imports one at
#    a time), one tree stays (and the check and the naming are one
#    transaction under the tenant's lock: unlocked, several passed).
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
command -v sqlite3 >/dev/null 2>&1 || { echo "sqlite3 is not installed"; exit 77; }
W=$(mktemp -d)
trap 'cleanup; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
SC=$SPACED_BUILD/spacectl/spacectl

mkdir -p "$W/cp"
TA=$(admin create-tenant alpha)
[ -n "$TA" ] || { echo "admin commands failed"; exit 1; }
admin set-quota alpha templates=500K
TD=$(admin create-tenant delta)
TE=$(admin create-tenant epsilon)
admin set-quota delta templates=2M
start_cp cp
export SPACED_CP_URL="$CP_URL" SPACED_API_KEY="$TA"
for t in a b c1 c2 c3 c4 c5 c6 c7 c8; do
	rootfs_tarball "$W/$t.tar" || { echo "FAIL: mk tarball"; exit 1; }
done
trees() { ls "$W/cp/store/templates" | grep -c '\.tar$'; }

"$SC" template import a "$W/a.tar" --json >"$W/a.json" 2>"$W/e"
expect "an import within the quota" "$(jq -r '.name' "$W/a.json")" a
"$SC" template import b "$W/b.tar" >/dev/null 2>"$W/e"
expect "an import past the quota: 429 quota-exceeded templates_bytes" \
	"$(grep -c '429 quota-exceeded.*templates_bytes' "$W/e")" 1
expect "its tree did not stay in the store" "$(trees)" 1
"$SC" template import a-again "$W/a.tar" >/dev/null 2>"$W/e"
expect "the same tree under another name counts once" "$("$SC" template ls --json | jq -r '[.[].name] | sort | join(" ")')" "a a-again"
# a tenant with no room left is refused before its archive is read: a body that is no archive at
# all gets 429, not the 422 of reading it (reading and writing an archive that declares gigabytes
# took a control plane up to a minute before the quota was checked)
admin set-quota alpha templates=100K
head -c 4096 /dev/urandom >"$W/junk.tar"
"$SC" template import junk "$W/junk.tar" >/dev/null 2>"$W/e"
expect "a tenant past its quota is refused before its archive is read (not an archive: 429, not 422)" \
	"$(grep -c '429 quota-exceeded' "$W/e")" 1
admin set-quota alpha templates=500K
curl -s -H "Authorization: Bearer $TA" "$CP_URL/v1/quota" >"$W/q.json"
expect "GET /v1/quota: the templates quota, and one tree held" \
	"$(jq -r '"\(.quota.templates_bytes) \(.used.templates_bytes > 300000 and .used.templates_bytes < 400000)"' "$W/q.json")" \
	"512000 true"
"$SC" template rm a >/dev/null
"$SC" template rm a-again >/dev/null
"$SC" template import b "$W/b.tar" >/dev/null 2>"$W/e"
expect "after the removals the other import fits" "$("$SC" template ls --json | jq -r '[.[].name] | join(" ")')" b
expect "one tree in the store" "$(trees)" 1
"$SC" template rm b >/dev/null
pids=
for i in 1 2 3 4 5 6 7 8; do
	"$SC" template import "c$i" "$W/c$i.tar" >/dev/null 2>"$W/c$i.e" &
	pids="$pids $!"
done
for p in $pids; do wait "$p"; done
expect "eight imports at once: one named" "$("$SC" template ls --json | jq 'length')" 1
expect "eight imports at once: seven refused (quota-exceeded, or busy past the imports running at once)" \
	"$(cat "$W"/c*.e | grep -c '429 quota-exceeded\|503 busy')" 7
expect "eight imports at once: one tree in the store" "$(trees)" 1
# a tenant's uploads in progress: one at a time, its second told to come back (one tenant cannot
# fill the store's spool or hold every import); another tenant's upload is taken meanwhile
SPORT=$(cat "$W/cp/store.port")
TB=$(admin create-tenant beta)
got=$(python3 - "$SPORT" "$TA" "$TB" <<'PY'
import socket, sys
port, ka, kb = int(sys.argv[1]), sys.argv[2], sys.argv[3]
def put(key, name, length, send):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(("PUT /v1/templates/%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
               "Content-Length: %d\r\n\r\n" % (name, key, length)).encode() + b"\0" * send)
    return s
def status(s):
    data = b""
    while b"\r\n" not in data:
        d = s.recv(4096)
        if not d:
            return "closed"
        data += d
    return data.split(b" ")[1].decode()
held = [put(ka, "slow%d" % i, 10000000, 1000) for i in range(1)]
third = put(ka, "slow2", 10000000, 1000)
other = put(kb, "other", 10000000, 1000)
other.settimeout(1)
try:
    o = status(other)
except socket.timeout:
    o = "taken"  # still reading its body: not refused
print(status(third), o)
PY
)
expect "a tenant's second upload at once is 503 busy; another tenant's is taken" "$got" "503 taken"

# a tenant's template names are bounded (1000: each a row and its settings, at no bytes of the
# quota when they name a tree already counted): 999 more rows, then two namings of its one tree
DB=$W/cp/cp.db
T=$(sqlite3 "$DB" "SELECT id FROM tenants WHERE name = 'alpha'")
HB=$("$SC" template ls --json | jq -r '.[0].hash')
n=$(sqlite3 "$DB" "SELECT COUNT(*) FROM templates WHERE tenant = '$T'")
sqlite3 -cmd ".timeout 5000" "$DB" "WITH RECURSIVE k(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM k WHERE i < $((999 - n)))
	INSERT INTO templates (tenant, name, hash, bytes, entries, config, source, created)
	SELECT '$T', 'filler' || i, '$HB', 1, 1, '{}', 'tar', 0 FROM k"
name() { curl -s -o "$W/name.json" -w '%{http_code}' -H "Authorization: Bearer $TA" -X POST \
	-d "{\"hash\":\"$HB\"}" "$CP_URL/v1/templates/$1"; }
expect "the tenant's 1000th template name is taken" "$(name last)" 201
expect "its 1001st is 429 quota-exceeded (templates)" "$(name one-too-many) $(jq -r .quota "$W/name.json")" "429 templates"

# ---- what the store holds counts, not only the files' content ----
# 20,000 empty files: a few hundred KiB of gzip, no content at all, and megabytes of the store's
# archive (a header each): they count as the archive does, past a quota of 2 MB (they counted 0)
python3 - "$W/empty.tar.gz" <<'PY' || fail "mk the tarball of empty files"
import sys, tarfile
with tarfile.open(sys.argv[1], "w:gz") as t:
    for i in range(20):
        d = tarfile.TarInfo("d%d" % i); d.type = tarfile.DIRTYPE; d.mode = 0o755; t.addfile(d)
        for j in range(1000):
            f = tarfile.TarInfo("d%d/f%d" % (i, j)); f.mode = 0o644; t.addfile(f)
PY
SPACED_API_KEY=$TD "$SC" template import empty "$W/empty.tar.gz" >/dev/null 2>"$W/e"
expect "20,000 empty files past a 2 MB quota: 429 quota-exceeded (templates_bytes)" \
	"$(grep -c '429 quota-exceeded.*templates_bytes' "$W/e")" 1
# the same tree imported by two tenants, its times differing (they are not in the tree's hash):
# the store keeps the first archive, the one the first tenant's sandboxes are made from
for v in 1 2; do
	python3 - "$W/same$v.tar" "$v" <<'PY' || fail "mk the tarball same$v"
import io, sys, tarfile
with tarfile.open(sys.argv[1], "w") as t:
    f = tarfile.TarInfo("f"); f.size = 4; f.mode = 0o644
    f.mtime = 1000000000 if sys.argv[2] == "1" else 2000000000
    t.addfile(f, io.BytesIO(b"same"))
PY
done
H1=$(SPACED_API_KEY=$TD "$SC" template import same "$W/same1.tar" --json | jq -r .hash)
S1=$(sha256sum "$W/cp/store/templates/$H1.tar" | cut -d' ' -f1)
H2=$(SPACED_API_KEY=$TE "$SC" template import same "$W/same2.tar" --json | jq -r .hash)
expect "another tenant's import of the same tree names the same hash" "$H2" "$H1"
expect "and leaves the store's archive of it as the first import made it" \
	"$(sha256sum "$W/cp/store/templates/$H1.tar" | cut -d' ' -f1)" "$S1"

# "." and ".." are no template names: a URL's path cannot carry them (clients remove them as dot
# segments), so such a template could be neither shown nor removed by name
for n in . ..; do
	expect "an import named '$n' is 400" "$(curl -s --path-as-is -o /dev/null -w '%{http_code}' -X PUT \
		-H "Authorization: Bearer $TD" --data-binary @"$W/same1.tar" "http://127.0.0.1:$SPORT/v1/templates/$n")" 400
	expect "a naming of '$n' is refused" "$(curl -s --path-as-is -o /dev/null -w '%{http_code}' -X POST \
		-H "Authorization: Bearer $TD" -d "{\"hash\":\"$H1\"}" "$CP_URL/v1/templates/$n" | grep -c '^4')" 1
done
expect "and none is named so" "$(SPACED_API_KEY=$TD "$SC" template ls --json | jq -r '[.[].name | select(. == "." or . == "..")] | length')" 0

echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
