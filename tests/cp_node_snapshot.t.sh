#!/bin/sh
# run-tests: paired, about 9 s
# Snapshots travel checked by their hash (issue 5 item 7; docs/control-messages.md
# "Snapshot hash"): a control plane and two real spaced-node workers
# (development mode, the real spaced-guest), each, each joined to the control plane itself.
#  - the hash a worker reports for a snapshot equals an independent
#    implementation of the documented definition over the snapshot tree;
#  - a move carries the sandbox's files to the destination, through the
#    control plane's store over HTTP (no directory is shared: the snapshot is
#    an archive in the store, issue 13);
#  - a snapshot altered in the store between the snapshot and the install
#    (a file changed, a file added, a mode changed) is refused by the
#    destination with snapshot-mismatch: nothing starts there, the sandbox is
#    in state error, the previous execution stays deactivated and kept on the
#    source (it never serves again: R3), and `rm` removes it there too.
# The window between the snapshot and the install is held open by stopping the
# destination's control channel (SIGSTOP of its link process): the install
# waits queued until it continues.
# Exit 77 when spaced-node or spaced-guest is not built.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
. "$SPACED_TOP/tests/cp_node_lib.sh"
cp_node_setup
cp_node_start 8 --ack-timeout 60000

# The documented definition, written independently of mgr_hash.c: prints
# "HASH BYTES" for the tree at DIR.
refhash() {
	python3 - "$1" <<'PY'
import hashlib, os, stat, struct, sys
h = hashlib.blake2b(digest_size=32)
h.update(b"spaced-snapshot-v2\0")
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
        # every 4096-byte block that is not all zeros: u64 index, its bytes; then u64 max
        with open(full, "rb") as f:
            i = 0
            while True:
                b = f.read(4096)
                if not b:
                    break
                if b.count(0) != len(b):
                    h.update(struct.pack("<Q", i) + b)
                i += 1
        h.update(struct.pack("<Q", 2**64 - 1))
        total += size
    elif t == b"d":
        for n in sorted(os.listdir(full), key=os.fsencode):
            rec(os.path.join(full, n), (rel + "/" + n) if rel else n)
rec(sys.argv[1], "")
print(h.hexdigest(), total)
PY
}

# The store's archive of the snapshot at URL, extracted with Python's own
# tarfile (independently of libarchive) into DIR.
unpack() {
	rm -rf "$2"
	python3 - "$W/cp/store/snapshots/$(basename "$1").tar" "$2" <<'PY'
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    t.extractall(sys.argv[2], numeric_owner=True)
PY
}

# Rewrites the store's archive of the snapshot at URL: HOW is changed (a
# file's content), added (a new file) or mode (a setuid bit).
alter() {
	python3 - "$W/cp/store/snapshots/$(basename "$1").tar" "$2" <<'PY'
import io, os, sys, tarfile
path, how = sys.argv[1], sys.argv[2]
src = tarfile.open(path)
out = io.BytesIO()
dst = tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT)
for m in src.getmembers():
    data = src.extractfile(m).read() if m.isreg() else None
    if how == "changed" and m.name == "data.txt":
        data = b"hello from somewhere else\n"
        m.size = len(data)
    if how == "mode" and m.name == "dir/run.sh":
        m.mode = 0o4755
    if m.isreg():
        m.size = len(data)
        m.sparse = None
        m.type = tarfile.REGTYPE
    dst.addfile(m, io.BytesIO(data) if data is not None else None)
if how == "added":
    m = tarfile.TarInfo("dir/extra")
    m.size = 6
    dst.addfile(m, io.BytesIO(b"extra\n"))
dst.close()
with open(path + ".new", "wb") as f:
    f.write(out.getvalue())
os.rename(path + ".new", path)
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
	# holes and written zeros hash alike; a block past a hole keeps its index
	printf 'x' | dd of="$r/sparse" bs=1 seek=20000 conv=notrunc 2>/dev/null
	truncate -s 100001 "$r/sparse"
	{ head -c 8192 /dev/zero; printf 'tail'; } >"$r/zeros"
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
expect "the snapshot is in the control plane's store" "$(echo "$snap" | grep -c '^http://.*/v1/blobs/snapshots/')" 1
unpack "$snap" "$W/snapx"
expect "the hash and size are the documented definition's over the snapshot tree" \
	"$(jq -r '.snapshot_hash + " " + (.snapshot_bytes|tostring)' "$W/snap.json")" "$(refhash "$W/snapx")"
"$SC" resume "$X" >/dev/null

# 2. a move carries the files, verified
"$SC" move "$X" --to nb >/dev/null
expect "move na -> nb: running on nb" "$("$SC" inspect "$X" --json | jq -r '.state + " " + .worker')" "running nb"
expect "the files arrived on nb, byte for byte" \
	"$(cd "$W/nb/sbx/$X/root" && find . | sort | tr '\n' ' '; cmp dir/sub/blob "$W/snapx/dir/sub/blob" && echo same)" \
	"$(cd "$W/snapx" && find . | sort | tr '\n' ' '; echo same)"
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
	alter "$s" "$how"
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
