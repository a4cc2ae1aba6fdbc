#!/bin/sh
# run-tests: paired, about 22 s
# Templates on a real cluster (`spacectl dev up`, two workers of the process substrate, issue 13):
#  - a root filesystem tarball and an OCI image archive, both built here (tests/mk_rootfs.py),
#    are imported; a sandbox made from each sees exactly its template's files — not the host's
#    /usr — with the OCI layers' whiteouts applied, and root inside owns them;
#  - an archive that tries to write outside its tree is refused at import, and so is an image (or a
#    Spacefile) whose configuration is larger than a worker takes;
#  - a Spacefile of two steps built on the imported template: its sandboxes see both steps;
#    building it again takes every step from the cache;
#  - a template tampered with in a worker's cache is refused there and fetched again: the next
#    sandbox sees the template's files, not the tampering;
#  - a move between the two workers (they share no directory: snapshots travel through the
#    control plane's store over HTTP) carries the sandbox's files and its template.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
SC=$SPACED_BUILD/spacectl/spacectl
GUEST=$SPACED_BUILD/spaced-guest/spaced-guest
MK=$SPACED_TOP/tests/mk_rootfs.py
[ "$(id -u)" -eq 0 ] || { echo "the process substrate needs root"; exit 77; }
for b in "$SC" "$SPACED_BUILD/spaced-node/spaced-node" "$SPACED_BUILD/spaced-node/spaced-launch" \
	"$SPACED_BUILD/spaced-host/spaced-host" "$CP" "$GUEST"; do
	[ -x "$b" ] || { echo "$b is not built"; exit 77; }
done
command -v python3 >/dev/null 2>&1 || { echo "python3 is not installed"; exit 77; }
command -v sqlite3 >/dev/null 2>&1 || { echo "sqlite3 is not installed"; exit 77; }
W=$(mktemp -d)
D=$W/cluster
export SPACED_ROUTE_CACHE="$W/routes"
trap '"$SC" dev down --dir "$D" >/dev/null 2>&1; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT

if ! "$SC" dev up --workers 2 --dir "$D" >"$W/up.out" 2>"$W/up.err"; then
	cat "$W/up.err"; tail -n 20 "$D"/*.log 2>/dev/null
	echo "FAIL: dev up"; exit 1
fi
. "$D/env"

# ---- the archives ----
# a small merged-/usr root: a shell, a few tools, the libraries they and the guest need
python3 "$MK" tarball "$W/root.tar.gz" --gz --bin /bin/dash --bin /usr/bin/cat --bin /usr/bin/ls \
	--bin /usr/bin/stat --bin /usr/bin/chmod --link usr/bin/sh=dash --libs-of "$GUEST" \
	--file etc/marker=from-tarball --file etc/gone=lower --file opt/app/old=old \
	--file home/app/notes=notes --own home/app/notes=1000 --own home/app=1000 || { echo "FAIL: mk tarball"; exit 1; }
# an OCI image: that root as its first layer, a second that removes, replaces and adds
python3 "$MK" layer "$W/l2.tar.gz" --whiteout etc/gone --opaque opt/app --file opt/app/new=new \
	--file etc/marker=from-oci || { echo "FAIL: mk layer"; exit 1; }
python3 "$MK" oci "$W/image.tar" "$W/root.tar.gz" "$W/l2.tar.gz" --env APP_MODE=oci --workdir /opt/app \
	|| { echo "FAIL: mk oci"; exit 1; }
# hostile: an entry that climbs out of the tree
python3 - "$W/evil.tar" <<'PY'
import io, sys, tarfile
with tarfile.open(sys.argv[1], "w") as t:
    ti = tarfile.TarInfo("../../etc/spaced-escape"); ti.size = 3
    t.addfile(ti, io.BytesIO(b"bad"))
PY

# ---- import ----
"$SC" template import plain "$W/root.tar.gz" --json >"$W/plain.json" 2>"$W/e" || { cat "$W/e"; echo "FAIL: import tarball"; exit 1; }
expect "tarball: imported, named by a 64-hex tree hash" "$(jq -r '.source + " " + (.hash | test("^[0-9a-f]{64}$") | tostring)' "$W/plain.json")" "tarball true"
"$SC" template import image "$W/image.tar" --json >"$W/image.json" 2>"$W/e" || { cat "$W/e"; echo "FAIL: import OCI"; exit 1; }
expect "OCI archive: imported, its configuration kept" "$(jq -r '.source + " " + .config.workdir + " " + (.config.env | join(","))' "$W/image.json")" \
	"oci /opt/app APP_MODE=oci"
"$SC" template import evil "$W/evil.tar" >/dev/null 2>"$W/e"
expect "an archive with '..' is refused (422)" "$(grep -c "422 template-refused.*'\.\.'" "$W/e")" 1
expect "nothing was written outside" "$(ls /etc/spaced-escape "$D"/cp/spaced-escape 2>/dev/null | wc -l)" 0
# hostile: an image whose configuration no worker could take (its Env past 8 KiB: at ~1 MB the
# install made from it was larger than a worker's link reads, and the channel closed at every replay
# for good, every tenant's lifecycle calls on that worker failing)
big=$(head -c 4000 /dev/zero | tr '\0' x)
python3 "$MK" oci "$W/bigenv.tar" "$W/root.tar.gz" --env "A=$big" --env "B=$big" --env "C=$big" \
	|| { echo "FAIL: mk oci"; exit 1; }
"$SC" template import bigenv "$W/bigenv.tar" >/dev/null 2>"$W/e"
expect "an image whose configuration is past 8 KiB is refused (413) ($(head -c 200 "$W/e"))" \
	"$(grep -c "413 template-too-large.*configuration" "$W/e")" 1
# an install queued before messages were bounded, larger than a worker's link reads (1 MiB): it is
# acknowledged as refused and never sent, and what follows it reaches the worker (it closed the
# channel at every replay, for good)
python3 -c 'import json,sys; print(json.dumps({"seq": 0, "type": "install", "pad": "x" * 1200000}))' >"$W/large.json"
sqlite3 -cmd ".timeout 5000" "$D/cp/cp.db" "BEGIN IMMEDIATE; UPDATE workers SET next_seq = next_seq + 1 WHERE id = 'worker-1';
INSERT INTO outbox (worker, seq, type, body, created) SELECT 'worker-1', next_seq, 'install', readfile('$W/large.json'), 0
FROM workers WHERE id = 'worker-1'; COMMIT;" || fail "queue a large message"
LS=$(sqlite3 -cmd ".timeout 5000" "$D/cp/cp.db" "SELECT MAX(seq) FROM outbox WHERE worker = 'worker-1' AND length(body) > 1000000")
A=$("$SC" create --worker worker-1 2>"$W/after.err")
expect "a create after a message too large for the link runs ($(head -c 200 "$W/after.err"))" "$("$SC" exec "$A" -- cat /etc/hostname 2>&1)" "$A"
expect "the large message was acknowledged as refused, never sent" \
	"$(sqlite3 -cmd ".timeout 5000" "$D/cp/cp.db" "SELECT ok || ' ' || json_extract(result, '$.code') FROM outbox WHERE worker = 'worker-1' AND seq = $LS")" "0 too-large"
"$SC" rm "$A" >/dev/null 2>&1
expect "template ls: the two templates" "$("$SC" template ls --json | jq -r '[.[].name] | join(" ")')" "image plain"

# ---- sandboxes see exactly their template ----
P=$("$SC" create --template plain --worker worker-1) || { echo "FAIL: create from the tarball"; exit 1; }
expect "inspect names the template" "$("$SC" inspect "$P" --json | jq -r .template)" plain
expect "tarball sandbox: /usr/bin is the template's" "$("$SC" exec "$P" -- ls /usr/bin | tr '\n' ' ')" "cat chmod dash ls sh stat "
expect "tarball sandbox: the template's file" "$("$SC" exec "$P" -- cat /etc/marker)" "from-tarball"
"$SC" exec "$P" -- stat /usr/bin/python3 >/dev/null 2>&1
expect "tarball sandbox: the host's /usr is not there" "$?" 1
expect "root inside owns the template's files; uid 1000 its own" \
	"$("$SC" exec "$P" -- stat -c '%u %n' /etc/marker /home/app/notes | tr '\n' ' ')" "0 /etc/marker 1000 /home/app/notes "
"$SC" exec "$P" -- sh -c 'echo changed >/etc/marker' || fail "root inside writes a template file"
Q=$("$SC" create --template plain --worker worker-1)
expect "a change in one sandbox stays in it" "$("$SC" exec "$Q" -- cat /etc/marker)" "from-tarball"

O=$("$SC" create --template image --worker worker-2) || { echo "FAIL: create from the OCI image"; exit 1; }
expect "OCI sandbox: the upper layer replaced the file" "$("$SC" exec "$O" -- cat /etc/marker)" "from-oci"
# (/etc/resolv.conf: the sandbox's resolver, written by the worker when it gives egress)
expect "OCI sandbox: whiteout and opaque directory applied" \
	"$("$SC" exec "$O" -- ls /etc /opt/app | grep -vx resolv.conf | tr '\n' ' ')" \
	"$(printf '/etc:\nhostname\nhosts\nmarker\n\n/opt/app:\nnew\n' | tr '\n' ' ')"

# ---- a template's links where the worker mounts: never followed on the host ----
# /.spaced a link to the host's directory of the guest, the template holding its own "guest" at
# that path (it marks /pwned and runs the real one); /dev, /proc, /tmp and /etc links to host
# directories (etc: mode 0712, owner 1234). The worker's guest runs as PID 1, the mounts are the
# sandbox's own, the host directories stay as they were and their mode is not shown inside.
mkdir -p "$W/host/dev" "$W/host/proc" "$W/host/tmp" "$W/host/etc"
chmod 0712 "$W/host/etc" && chown 1234:1234 "$W/host/etc"
# KIND: swap (/.spaced and the template's guest) or mounts (/dev, /proc, /tmp, /etc)
mk_links() {
	python3 - "$W/root.tar.gz" "$W/$1.tar" "$GUEST" "$W/host" "$1" <<'PY'
import io, os, sys, tarfile
src, out, guest, host, kind = sys.argv[1:6]
gdir = os.path.dirname(os.path.abspath(guest)).lstrip("/")
def member(t, name, data=None, mode=0o755, kind=tarfile.REGTYPE, link=""):
    ti = tarfile.TarInfo(name); ti.type = kind; ti.mode = mode; ti.linkname = link
    if data is not None:
        ti.size = len(data)
    t.addfile(ti, io.BytesIO(data) if data is not None else None)
linked = ("etc", "dev", "proc", "tmp") if kind == "mounts" else ()
with tarfile.open(src) as r, tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as t:
    for m in r.getmembers():
        if m.name.split("/")[0] not in linked:
            t.addfile(m, r.extractfile(m) if m.isfile() else None)
    if kind == "swap":
        member(t, ".spaced", kind=tarfile.SYMTYPE, link="/" + gdir)
        parts = gdir.split("/")
        for i in range(1, len(parts) + 1):
            member(t, "/".join(parts[:i]), kind=tarfile.DIRTYPE)
        member(t, gdir + "/spaced-guest", b'#!/bin/sh\necho pwned >/pwned\nexec /realguest "$@"\n')
        member(t, "realguest", open(guest, "rb").read())
    for d in linked:
        member(t, d, kind=tarfile.SYMTYPE, link=host + "/" + d)
PY
	"$SC" template import "$1" "$W/$1.tar" >/dev/null 2>"$W/e" || { cat "$W/e"; fail "import of the template $1"; }
}
mk_links swap
mk_links mounts
if L=$("$SC" create --template swap --worker worker-1 2>"$W/e"); then
	expect "/.spaced a link: PID 1 is the worker's guest" \
		"$("$SC" exec "$L" -- cat /proc/1/cmdline | tr '\0' ' ' | cut -d' ' -f1)" spaced-guest
	expect "/.spaced a link: the template's own guest did not run" \
		"$("$SC" exec "$L" -- sh -c 'cat /pwned 2>/dev/null || echo none')" none
else
	fail "create from the template whose /.spaced is a link: $(cat "$W/e")"
fi
if L=$("$SC" create --template mounts --worker worker-1 2>"$W/e"); then
	expect "/dev a link: /dev is the sandbox's" \
		"$("$SC" exec "$L" -- sh -c 'echo x >/dev/null && ls /dev/pts >/dev/null && ls /proc/self/fd >/dev/null && echo own')" own
	expect "/etc a link: nothing of the host's directory shows" \
		"$("$SC" exec "$L" -- sh -c 'stat -L -c %a /etc 2>/dev/null || echo none')" none
else
	fail "create from the template whose /dev, /proc, /tmp and /etc are links: $(cat "$W/e")"
fi
expect "the host's directories are as they were" \
	"$(find "$W/host" -mindepth 2 | wc -l) $(stat -c '%a %u' "$W/host/etc")" "0 712 1234"

# ---- a Spacefile of two steps on the imported template ----
mkdir -p "$W/ctx/conf"
printf 'copied\n' >"$W/ctx/conf/app.conf"
cat >"$W/Spacefile" <<'EOF'
FROM plain
ENV GREETING=hello
RUN echo "$GREETING from step one" >/etc/step1
COPY conf /etc/app
EOF
if "$SC" template build built -f "$W/Spacefile" --context "$W/ctx" --json >"$W/build.json" 2>"$W/build.err"; then
	B=$("$SC" create --template built --worker worker-1)
	expect "built sandbox: step one's file" "$("$SC" exec "$B" -- cat /etc/step1)" "hello from step one"
	expect "built sandbox: the copied file" "$("$SC" exec "$B" -- cat /etc/app/app.conf)" "copied"
	expect "built sandbox: the base template's file" "$("$SC" exec "$B" -- cat /etc/marker)" "from-tarball"
	"$SC" template build built2 -f "$W/Spacefile" --context "$W/ctx" --json >"$W/build2.json" 2>"$W/build2.err"
	expect "built again: every step from the cache, the same tree" \
		"$(jq -r '.cached' "$W/build2.json") $(jq -r .hash "$W/build2.json")" "2 $(jq -r .hash "$W/build.json")"
else
	cat "$W/build.err"
	fail "template build of a two-step Spacefile"
fi

# ---- a Spacefile's configuration is bounded as an image's ----
{ echo "FROM plain"; for k in A B C; do echo "ENV $k=$big"; done; } >"$W/Bigenv"
"$SC" template build bigenvbuild -f "$W/Bigenv" >"$W/bigenv.out" 2>&1
expect "a build whose ENV lines are past 8 KiB fails" "$?" 1
expect "with template-too-large ($(tail -c 200 "$W/bigenv.out"))" "$(grep -c 'template-too-large' "$W/bigenv.out")" 1
expect "and its build sandbox is gone" "$("$SC" ls --json | jq '[.[] | select(.spec.template.name == "(build)")] | length')" 0
# past the control plane's 64 KiB request body: its 413 is what spacectl says (it said "Broken pipe")
{ echo "FROM plain"; for k in $(seq 1 250); do echo "ENV K$k=$big"; done; } >"$W/Hugeenv"
"$SC" template build hugeenv -f "$W/Hugeenv" >"$W/hugeenv.out" 2>&1
expect "a request body past 64 KiB: the control plane's 413 is shown ($(tail -c 120 "$W/hugeenv.out"))" \
	"$(grep -c 'HTTP 413' "$W/hugeenv.out")" 1

# ---- a RUN step cannot leave the build sandbox ----
printf 'FROM plain\nRUN mkdir -p /mnt/x && mount -t tmpfs none /mnt/x\n' >"$W/Evilfile"
"$SC" template build evilbuild -f "$W/Evilfile" >"$W/evil.out" 2>&1
expect "a RUN that mounts fails the build (the build sandbox is a sandbox)" "$?" 1
expect "a failed build names no template" "$("$SC" template ls --json | jq -r '[.[].name] | index("evilbuild")')" null
expect "its build sandbox is gone" "$("$SC" ls --json | jq '[.[] | select(.spec.template.name == "(build)")] | length')" 0
# a build whose client dies mid-step leaves its build sandbox to a bounded life (reaped at 24 h)
printf 'FROM plain\nRUN cat /dev/zero >/dev/null\n' >"$W/Longfile"
timeout 4 "$SC" template build longbuild -f "$W/Longfile" >/dev/null 2>&1
L=$("$SC" ls --json | jq -r '[.[] | select(.spec.template.name == "(build)")][0].id')
expect "the build sandbox of a build whose client died has a lifetime of 24 h" \
	"$("$SC" inspect "$L" --json 2>/dev/null | jq -r .max_lifetime)" 86400
"$SC" rm "$L" >/dev/null 2>&1
printf 'FROM plain\nRUN cat /usr/bin/cat >/usr/bin/setid && chmod 4755 /usr/bin/setid\n' >"$W/Setid"
"$SC" template build setid -f "$W/Setid" >"$W/setid.out" 2>&1 || fail "build with a setuid file"
S=$("$SC" create --template setid)
expect "a setuid bit made by RUN is cleared in the tree" "$("$SC" exec "$S" -- stat -c %a /usr/bin/setid)" 755

# ---- a build step's tree counts in the templates quota ----
used=$("$SC" quota --json | jq -r '.used.templates_bytes')
steps() { sqlite3 -cmd ".timeout 5000" "$D/cp/cp.db" "SELECT COUNT(*) FROM build_steps"; }
trees() { ls "$D/cp/store/templates" | grep -c '\.tar$'; }
steps0=$(steps)
trees0=$(trees)
"$CP" admin --state "$D/cp" set-quota dev templates=$((used + 200000)) >/dev/null
# (the plain template has cat and sh: thirty copies of its /usr/bin, a few MB)
printf 'FROM plain\nRUN i=0; while [ $i -lt 30 ]; do cat /usr/bin/*; i=$((i + 1)); done >/big\n' >"$W/Bigfile"
"$SC" template build big -f "$W/Bigfile" >"$W/big.out" 2>&1
expect "a build step past the templates quota fails the build" "$?" 1
expect "with quota-exceeded" "$(grep -q 'quota-exceeded' "$W/big.out" && echo yes)" yes
expect "and names no template" "$("$SC" template ls --json | jq -r '[.[].name] | index("big")')" null
expect "the step past the quota is not recorded (no sandbox can be made on it by its hash)" "$(steps)" "$steps0"
expect "and its tree left the store" "$(trees)" "$trees0"
# four build steps committed at once, each fitting the quota alone and no two together: a tenant's
# commits take turns (one runs, one more waits, the others are told to come back), so no two trees
# are written into the store at once (all four were, then three refused: six of them took a tenant
# to twice its quota on disk)
PH=$(jq -r .hash "$W/plain.json")
pbytes=$(stat -c %s "$D/cp/store/templates/$PH.tar")
"$CP" admin --state "$D/cp" set-quota dev templates=$((used + pbytes + 300000)) >/dev/null
cids=""
for i in 1 2 3 4; do
	c=$("$SC" create --template plain) || fail "build sandbox $i"
	head -c 150000 /dev/urandom | "$SC" fs write "$c" /big
	cids="$cids $c"
done
i=0
for c in $cids; do
	i=$((i + 1))
	curl -s --cacert "$SPACED_CA_FILE" -H "Authorization: Bearer $SPACED_API_KEY" -H 'content-type: application/json' \
		-X POST --data "{\"sandbox\":\"$c\",\"parent\":\"$PH\",\"step\":\"RUN race $i\",\"config\":{}}" \
		-o "$W/commit$i.json" -w '%{http_code}\n' "$SPACED_CP_URL/v1/builds/commit" >"$W/commit$i.code" &
done
wait
expect "four commits at once: one recorded, one waited its turn and was refused (quota), two told to come back" \
	"$(cat "$W"/commit?.code | sort | tr '\n' ' ')" "200 429 503 503 "
expect "one tree more in the store" "$(trees)" "$((trees0 + 1))"
# a step that makes a tree the tenant holds already costs no room: it is taken with no room left
# (its tree is read within the room left beside its parent's, not within the room alone)
noop() { # noop N: a build sandbox that changes nothing, committed as step N
	c=$("$SC" create --template plain)
	curl -s --cacert "$SPACED_CA_FILE" -H "Authorization: Bearer $SPACED_API_KEY" -H 'content-type: application/json' \
		-X POST --data "{\"sandbox\":\"$c\",\"parent\":\"$PH\",\"step\":\"RUN true $1\",\"config\":{}}" \
		-o "$W/noop$1.json" -w '%{http_code}' "$SPACED_CP_URL/v1/builds/commit" >"$W/noop$1.code"
	"$SC" rm "$c" >/dev/null 2>&1
}
"$CP" admin --state "$D/cp" set-quota dev templates=50G >/dev/null
noop 1
"$CP" admin --state "$D/cp" set-quota dev templates=$("$SC" quota --json | jq -r '.used.templates_bytes') >/dev/null
noop 2
expect "the same tree again with no room left: 200, the tree it holds" \
	"$(cat "$W/noop2.code") $(jq -r '.hash' "$W/noop2.json")" "200 $(jq -r '.hash' "$W/noop1.json")"
for c in $cids; do "$SC" rm "$c" >/dev/null 2>&1; done
"$CP" admin --state "$D/cp" set-quota dev templates=50G >/dev/null

# ---- tampered in a worker's cache: refused, fetched again ----
H=$(jq -r .hash "$W/plain.json")
C=$D/worker-1/templates/$H/root
[ -f "$C/etc/marker" ] || fail "worker-1 caches the template at $C"
printf 'tampered\n' >"$C/etc/marker"
T=$("$SC" create --template plain --worker worker-1)
expect "after tampering: the next sandbox sees the template, not the tampering" "$("$SC" exec "$T" -- cat /etc/marker)" "from-tarball"
expect "the worker said it refused the tampered tree and fetched it again" \
	"$(grep -c "event=template-tampered hash=$H" "$D/worker-1.log")" 1
expect "the cache holds the template again" "$(cat "$C/etc/marker")" "from-tarball"

# ---- a move between workers that share no directory ----
printf 'moved data\n' | "$SC" fs write "$P" /workspace/data.txt
"$SC" move "$P" --to worker-2 >/dev/null 2>"$W/e" || { cat "$W/e"; fail "move to worker-2"; }
expect "moved: running on worker-2" "$("$SC" inspect "$P" --json | jq -r '.state + " " + .worker')" "running worker-2"
expect "moved: the snapshot went through the store over HTTPS (the cluster's TLS)" \
	"$("$SC" inspect "$P" --json | jq -r '.snapshot | test("^https://.*/v1/blobs/snapshots/")')" true
expect "moved: the sandbox's files and its change to the template" \
	"$("$SC" exec "$P" -- cat /workspace/data.txt /etc/marker | tr '\n' ' ')" "moved data changed "
expect "moved: still exactly its template" "$("$SC" exec "$P" -- ls /usr/bin | tr '\n' ' ')" "cat chmod dash ls sh stat "

# ---- a restored sandbox's own symlinks are not followed on the worker ----
# The launcher makes /var/tmp and writes /etc/hostname and /etc/hosts into a restored sandbox's
# files as root, before it leaves the host's view: through a sandbox's /var or /etc made symlinks
# to host directories, a move had it make a world-writable tmp and root's hostname and hosts
# there (DESIGN §5: a sandbox reaches nothing of the host's; T2).
python3 "$MK" tarball "$W/esc.tar.gz" --gz --bin /bin/dash --bin /usr/bin/ln --bin /usr/bin/rm \
	--link usr/bin/sh=dash --libs-of "$GUEST" --file etc/marker=esc || fail "mk the esc tarball"
"$SC" template import esc "$W/esc.tar.gz" >/dev/null 2>"$W/e" || { cat "$W/e"; fail "import esc"; }
mkdir -p "$W/host-var" "$W/host-etc"
X=$("$SC" create --template esc --worker worker-1)
"$SC" exec "$X" -- sh -c "rm -rf /var /etc && ln -s '$W/host-var' /var && ln -s '$W/host-etc' /etc" ||
	fail "the sandbox's /var and /etc made symlinks"
"$SC" move "$X" --to worker-2 >/dev/null 2>"$W/e" || { cat "$W/e"; fail "move the sandbox with the symlinks"; }
expect "moved: running on worker-2" "$("$SC" inspect "$X" --json | jq -r '.state + " " + .worker')" "running worker-2"
expect "nothing was made in the host directories its /var and /etc name" \
	"$(find "$W/host-var" "$W/host-etc" -mindepth 1 | wc -l)" 0
expect "its /var and /etc are still its own symlinks" "$("$SC" exec "$X" -- sh -c '[ -L /var ] && [ -L /etc ] && echo symlinks')" symlinks

echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
