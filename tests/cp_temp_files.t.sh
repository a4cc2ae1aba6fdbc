#!/bin/sh
# run-tests: light, about 1 s
# A create's transaction writes nothing but the store's own files (spaced-cp/store_sqlite.c:
# temp_store=MEMORY). Each create of a group runs under a savepoint, whose journal SQLite keeps in
# a temporary file unless told otherwise: every create then made, wrote and unlinked a file under
# SQLite's temporary directory (/var/tmp) in its commit's path. A control plane with its temporary
# directory pointed at a directory of the test's own (SQLITE_TMPDIR) and a fake worker:
#  - an inotify watch on that directory sees a file the test makes there (the watch works);
#  - 16 creates, one after the other and then 8 at once (grouped in one transaction), all 201;
#  - the watch saw no other file made there meanwhile.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
store_test_setup
TMPD=$W/sqltmp
mkdir -p "$TMPD"
SQLITE_TMPDIR=$TMPD
export SQLITE_TMPDIR
start_cp cp --quota sandboxes=100
register wa 100
start_worker wa --capacity 100
# the watch: every name made in $TMPD, one per line in $W/made, until a file "stop" is made
python3 - "$TMPD" "$W/made" <<'PY' &
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
if fd < 0 or libc.inotify_add_watch(fd, sys.argv[1].encode(), 0x100) < 0:  # IN_CREATE
    sys.exit("inotify: %s" % os.strerror(ctypes.get_errno()))
open(sys.argv[2] + ".ready", "w").close()
with open(sys.argv[2], "w") as out:
    while True:
        buf = os.read(fd, 65536)
        i = 0
        while i < len(buf):
            _, _, _, n = struct.unpack_from("iIII", buf, i)
            name = buf[i + 16:i + 16 + n].rstrip(b"\0").decode(errors="replace")
            i += 16 + n
            out.write(name + "\n")
            out.flush()
            if name == "stop":
                sys.exit(0)
PY
WATCH=$!
i=0
while [ ! -e "$W/made.ready" ]; do
	i=$((i + 1)); [ $i -lt 100 ] || { echo "FAIL: the inotify watch did not start"; exit 1; }
	sleep 0.05
done
: >"$TMPD/marker"
mk() {
	curl -s -o /dev/null -w '%{http_code}\n' -H "Authorization: Bearer $TA" -H 'content-type: application/json' \
		-X POST --data-binary '{"worker":"wa"}' "$CP_URL/v1/sandboxes"
}
for i in 1 2 3 4 5 6 7 8; do mk; done >"$W/codes"
for i in 1 2 3 4 5 6 7 8; do mk >"$W/codes.$i" & done
wait_for_codes() {
	for i in 1 2 3 4 5 6 7 8; do
		j=0
		while [ ! -s "$W/codes.$i" ]; do
			j=$((j + 1)); [ $j -lt 200 ] || return
			sleep 0.05
		done
		cat "$W/codes.$i" >>"$W/codes"
	done
}
wait_for_codes
: >"$TMPD/stop"
j=0
while kill -0 "$WATCH" 2>/dev/null; do
	j=$((j + 1)); [ $j -lt 100 ] || { kill "$WATCH"; break; }
	sleep 0.05
done
expect "16 creates, 8 of them at once, answered 201" "$(grep -c '^201$' "$W/codes")" 16
expect "the watch on SQLite's temporary directory saw the test's own file" "$(grep -c '^marker$' "$W/made")" 1
expect "a create made no file in SQLite's temporary directory" \
	"$(grep -v -e '^marker$' -e '^stop$' "$W/made" | tr '\n' ' ')" ""
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
