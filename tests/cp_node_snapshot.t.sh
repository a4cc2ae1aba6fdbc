#!/bin/sh
# Snapshots travel checked by their hash (issue 5 item 7; docs/control-messages.md
# "Snapshot hash"): a control plane and two real spaced-node workers
# (development mode, the real spaced-guest), each behind spaced-cp-link.
#  - the hash a worker reports for a snapshot equals an independent
#    implementation of the documented definition over the snapshot tree;
#  - a move carries the sandbox's files to the destination;
#  - a snapshot altered in the store between the snapshot and the install
#    (a file changed, a file added, a mode changed) is refused by the
#    destination with snapshot-mismatch: nothing starts there, the sandbox is
#    in state error, the previous execution stays deactivated and kept on the
#    source (it never serves again: R3), and `rm` removes it there too.
# The window between the snapshot and the install is held open by stopping the
# destination's control channel (SIGSTOP of its spaced-cp-link): the install
# waits queued until it continues.
# Exit 77 when spaced-node or spaced-guest is not built.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
NODE=$SPACED_BUILD/spaced-node/spaced-node
GUEST=$SPACED_BUILD/spaced-guest/spaced-guest
LINK=$SPACED_BUILD/spaced-cp/spaced-cp-link
SC=$SPACED_BUILD/spacectl/spacectl
for b in "$NODE" "$GUEST" "$LINK" "$SC"; do
	[ -x "$b" ] || { echo "$b is not built"; exit 77; }
done
command -v python3 >/dev/null 2>&1 || { echo "python3 is not installed"; exit 77; }
W=$(mktemp -d)
chmod 755 "$W"
trap 'cleanup; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
CP_DB=""
mkdir -p "$W/cp"
TA=$(admin create-tenant alpha)
EK=$(admin create-enrollment-key)
# a long ack timeout: the install waits while the destination's channel is stopped
start_cp cp --ack-timeout 60000
for w in na nb; do
	mkdir -p "$W/$w"
	"$NODE" --state "$W/$w" --worker-id $w --listen 127.0.0.1:0 --guest-bin "$GUEST" >"$W/$w.log" 2>&1 &
	PIDS="$PIDS $!"
done
for w in na nb; do
	i=0
	while [ ! -S "$W/$w/admin.sock" ] || [ ! -s "$W/$w/api.port" ]; do
		i=$((i + 1))
		if [ $i -ge 200 ]; then tail -n 5 "$W/$w.log"; echo "spaced-node $w did not start"; exit 77; fi
		sleep 0.05
	done
	st=$(api "$EK" POST /v1/workers "{\"id\":\"$w\",\"url\":\"http://127.0.0.1:$(cat "$W/$w/api.port")\",\"capacity\":8,\"substrates\":[\"process\"]}")
	expect "register $w" "$st" 200
	"$LINK" --cp "ws://${CP_URL#http://}" --worker $w --key "$EK" --admin "$W/$w/admin.sock" >"$W/link-$w.log" 2>&1 &
	PIDS="$PIDS $!"
	eval "LINK_$w=$!"
done
export SPACED_CP_URL="$CP_URL" SPACED_API_KEY="$TA"
wait_for "both workers connected" sh -c "'$SC' workers --json | jq -e '[.[] | select(.connected)] | length == 2' >/dev/null"

node_status() { # WORKER SANDBOX -> the worker's own record: "generation state" (empty: none)
	python3 - "$W/$1/admin.sock" "$2" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b'{"type":"status"}\n')
buf = b""
while not buf.endswith(b"\n"):
    d = s.recv(65536)
    if not d:
        break
    buf += d
for r in json.loads(buf)["result"]["records"]:
    if r["identity"]["sandbox"] == sys.argv[2] and r["state"] != "destroyed":
        print(r["identity"]["generation"], r["state"])
PY
}

# The documented definition, written independently of mgr_hash.c: prints
# "HASH BYTES" for the tree at DIR.
refhash() {
	python3 - "$1" <<'PY'
import hashlib, os, stat, struct, sys
h = hashlib.blake2b(digest_size=32)
h.update(b"spaced-snapshot-v1\0")
total = 0
def rec(full, rel):
    global total
    st = os.lstat(full)
    m = st.st_mode
    t = {stat.S_IFDIR: b"d", stat.S_IFREG: b"f", stat.S_IFLNK: b"l", stat.S_IFIFO: b"p",
         stat.S_IFSOCK: b"s", stat.S_IFCHR: b"c", stat.S_IFBLK: b"b"}[stat.S_IFMT(m)]
    p = rel.encode() if rel else b"."
    target = os.readlink(full).encode() if t == b"l" else b""
    size = st.st_size if t == b"f" else len(target) if t == b"l" else 0
    rdev = st.st_rdev if t in (b"c", b"b") else 0
    h.update(struct.pack("<I", len(p)) + p + t + struct.pack("<IIIQQ", m & 0o7777, st.st_uid, st.st_gid, size, rdev))
    if t == b"l":
        h.update(target)
    elif t == b"f":
        with open(full, "rb") as f:
            h.update(f.read())
        total += size
    elif t == b"d":
        for n in sorted(os.listdir(full), key=os.fsencode):
            rec(os.path.join(full, n), (rel + "/" + n) if rel else n)
rec(sys.argv[1], "")
print(h.hexdigest(), total)
PY
}

fill() { # SANDBOX on na: some files of every kind in its root
	r="$W/na/sbx/$1/root"
	mkdir -p "$r/dir/sub"
	printf 'hello from %s\n' "$1" >"$r/data.txt"
	printf '#!/bin/sh\necho run\n' >"$r/dir/run.sh"
	chmod 755 "$r/dir/run.sh"
	ln -s ../data.txt "$r/dir/link"
	head -c 70000 /dev/urandom >"$r/dir/sub/blob"
	mkfifo "$r/fifo"
}

# 1. the reported hash is the documented one
X=$("$SC" create --worker na)
fill "$X"
"$SC" pause "$X" >/dev/null
"$SC" snapshot "$X" >/dev/null
"$SC" inspect "$X" --json >"$W/snap.json"
snap=$(jq -r .snapshot "$W/snap.json")
expect "snapshot: a hash and a size recorded with it" \
	"$(jq -r '(.snapshot_hash | test("^[0-9a-f]{64}$")) and .snapshot_bytes > 70000' "$W/snap.json")" true
expect "the hash and size are the documented definition's over the snapshot tree" \
	"$(jq -r '.snapshot_hash + " " + (.snapshot_bytes|tostring)' "$W/snap.json")" "$(refhash "$snap")"
"$SC" resume "$X" >/dev/null

# 2. a move carries the files, verified
"$SC" move "$X" --to nb >/dev/null
expect "move na -> nb: running on nb" "$("$SC" inspect "$X" --json | jq -r '.state + " " + .worker')" "running nb"
expect "the files arrived on nb, byte for byte" \
	"$(cd "$W/nb/sbx/$X/root" && find . | sort | tr '\n' ' '; cmp dir/sub/blob "$snap/dir/sub/blob" && echo same)" \
	"$(cd "$snap" && find . | sort | tr '\n' ' '; echo same)"
expect "the private staging copy is gone" "$(ls -A "$W/nb/stage" 2>/dev/null)" ""

# 3. altered in the store between snapshot and install: refused
for how in changed added mode; do
	Y=$("$SC" create --worker na)
	fill "$Y"
	gen=$("$SC" inspect "$Y" --json | jq -r .generation)
	kill -STOP "$LINK_nb"
	"$SC" move "$Y" --to nb >"$W/move.out" 2>"$W/move.err" &
	MV=$!
	wait_for "$how: the install is queued for nb" sh -c \
		"'$SC' inspect '$Y' --json | jq -e '.state == \"starting\" and .worker == \"nb\"' >/dev/null"
	s=$("$SC" inspect "$Y" --json | jq -r .snapshot)
	case $how in
	changed) printf 'hello from somewhere else\n' >"$s/data.txt" ;;
	added) printf 'extra\n' >"$s/dir/extra" ;;
	mode) chmod 4755 "$s/dir/run.sh" ;;
	esac
	kill -CONT "$LINK_nb"
	wait $MV
	rc=$?
	expect "$how: the move fails" "$([ $rc -ne 0 ] && echo failed)" failed
	"$SC" inspect "$Y" --json >"$W/y.json"
	expect "$how: the sandbox is in error, naming snapshot-mismatch" \
		"$(jq -r '.state + " " + (.last_error | test("snapshot-mismatch") | tostring)' "$W/y.json")" "error true"
	expect "$how: nothing started on nb" "$(node_status nb "$Y")" ""
	expect "$how: nb kept no copy" "$(ls -A "$W/nb/stage" 2>/dev/null; ls "$W/nb/sbx/$Y" 2>/dev/null)" ""
	expect "$how: the previous execution is deactivated and kept on na" "$(node_status na "$Y")" "$gen kept"
	"$SC" rm "$Y" >/dev/null
	wait_for "$how: rm removes the kept execution on na" sh -c "[ -z \"\$(ls '$W/na/sbx/$Y' 2>/dev/null)\" ]"
	expect "$how: na has no live record left" "$(node_status na "$Y")" ""
done

# 4. the untouched sandbox still moves back
"$SC" move "$X" --to na >/dev/null
expect "move nb -> na after the refusals" "$("$SC" inspect "$X" --json | jq -r '.state + " " + .worker')" "running na"
"$SC" rm "$X" >/dev/null
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
