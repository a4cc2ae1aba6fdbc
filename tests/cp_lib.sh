# cp_lib.sh — helpers for the spaced-cp integration tests (sourced, not run).
# Real processes and sockets: spaced-cp (+ its signer), cp-fake-worker peers
# speaking the control channel over WebSocket, curl as the HTTP client.
: "${SPACED_BUILD:?}" "${SPACED_TOP:?}"
CP=$SPACED_BUILD/spaced-cp/spaced-cp
FW=$SPACED_BUILD/tests/cp-fake-worker
CAPCHECK=$SPACED_BUILD/tests/cp-capcheck
PIDS=""
FAILS=0

for tool in curl jq; do
	command -v $tool >/dev/null 2>&1 || { echo "$tool is not installed (scripts/setup.sh installs it)"; exit 77; }
done

cleanup() {
	for p in $PIDS; do kill "$p" 2>/dev/null || true; done
	for p in $PIDS; do wait "$p" 2>/dev/null || true; done
}

fail() {
	echo "FAIL: $* [$(($(date +%s) - CP_LIB_T0)) s]"
	FAILS=$((FAILS + 1))
}

# each result line ends with the seconds since the test began (where its time goes)
CP_LIB_T0=$(date +%s)
ok() {
	echo "ok: $* [$(($(date +%s) - CP_LIB_T0)) s]"
}

# expect WHAT ACTUAL EXPECTED
expect() {
	if [ "$2" = "$3" ]; then ok "$1"; else fail "$1: got '$2', expected '$3'"; fi
}

# start_cp NAME [extra args...] — starts a control plane with state $W/NAME; sets CP_PID, CP_URL
start_cp() {
	name=$1; shift
	rm -f "$W/$name/cp.port"
	# plaintext on purpose: the suites speak raw HTTP to it (TLS: tests/tls.t.sh)
	"$CP" --state "$W/$name" --listen 127.0.0.1:0 ${CP_DB:+--db "$CP_DB"} --ack-timeout 5000 --plaintext "$@" \
		>>"$W/$name.log" 2>&1 &
	CP_PID=$!
	CP_LOG="$W/$name.log"
	PIDS="$PIDS $CP_PID"
	i=0
	while [ ! -s "$W/$name/cp.port" ]; do
		i=$((i + 1)); [ $i -lt 300 ] || { echo "spaced-cp did not start"; cat "$W/$name.log"; exit 1; }
		kill -0 "$CP_PID" 2>/dev/null || { echo "spaced-cp exited"; cat "$W/$name.log"; exit 1; }
		sleep 0.05
	done
	CP_URL="http://127.0.0.1:$(cat "$W/$name/cp.port")"
	i=0
	until curl -s -o /dev/null "$CP_URL/v1/healthz"; do
		i=$((i + 1)); [ $i -lt 100 ] || { echo "spaced-cp does not answer"; exit 1; }
		sleep 0.05
	done
}

admin() {
	"$CP" admin --state "$W/cp" ${CP_DB:+--db "$CP_DB"} "$@" 2>/dev/null
}

# api KEY METHOD PATH [BODY] — prints the HTTP status; the body goes to ${OUT:-$W/body}
api() {
	key=$1 method=$2 path=$3
	if [ $# -ge 4 ]; then
		curl -s -o "${OUT:-$W/body}" -w '%{http_code}' -H "Authorization: Bearer $key" -X "$method" \
			-H 'content-type: application/json' --data-binary "$4" "${API_URL:-$CP_URL}$path"
	else
		curl -s -o "${OUT:-$W/body}" -w '%{http_code}' -H "Authorization: Bearer $key" -X "$method" "${API_URL:-$CP_URL}$path"
	fi
}

body() {
	jq -r "$1" "$W/body"
}

# register WORKER [CAPACITY] — the worker joins with a join token bound to it
# (spaced-cp admin create-join-token); its worker key goes to $WK_<worker>
register() {
	jt=$(admin create-join-token "$1")
	st=$(OUT=$W/join-$1 api "$jt" POST /v1/workers/join "{\"id\":\"$1\",\"url\":\"http://127.0.0.1:1/$1\",\"capacity\":${2:-8},\"substrates\":[\"process\"]}")
	expect "register $1" "$st" 200
	eval "WK_$1=$(jq -r .worker_key "$W/join-$1")"
}

# start_worker WORKER [fake-worker options] — sets FW_PID_<worker>; returns
# once the control plane took the worker's hello (it is live: placement may
# choose it) and the worker received something
start_worker() {
	w=$1; shift
	eval "wk=\$WK_$w"
	hellos=$(grep -c "event=channel-hello worker=$w " "$CP_LOG" 2>/dev/null)
	"$FW" --url "ws://${CP_URL#http://}" --worker "$w" --key "$wk" --state "$W/$w.state" --log "$W/$w.log" "$@" \
		2>>"$W/$w.err" &
	eval "FW_PID_$w=$!"
	PIDS="$PIDS $!"
	# connected once the channel delivered anything (the key bundle comes first)
	i=0
	while [ ! -s "$W/$w.log" ] || [ "$(grep -c "event=channel-hello worker=$w " "$CP_LOG" 2>/dev/null)" -le "${hellos:-0}" ]; do
		i=$((i + 1)); [ $i -lt 200 ] || { echo "worker $w got nothing"; cat "$W/$w.err"; break; }
		sleep 0.05
	done
}

stop_worker() {
	eval "p=\$FW_PID_$1"
	kill "$p" 2>/dev/null || true
	wait "$p" 2>/dev/null || true
}

# wait_for DESCRIPTION COMMAND... — polls a condition (at most WAIT_SECONDS, default 30)
wait_for() {
	what=$1; shift
	deadline=$(($(date +%s) + ${WAIT_SECONDS:-30}))
	until "$@"; do
		if [ "$(date +%s)" -ge $deadline ]; then fail "$what never happened"; return 1; fi
		sleep 0.05
	done
	ok "$what"
}

# ---- a spacectl dev up cluster (the process substrate; needs root): set SC, W and D first ----

# need_substrate [TOOL...] — exit 77 unless root, spaced's binaries and the tools are here
need_substrate() {
	[ "$(id -u)" -eq 0 ] || { echo "the process substrate needs root"; exit 77; }
	for b in "$SC" "$SPACED_BUILD/spaced-node/spaced-node" "$SPACED_BUILD/spaced-node/spaced-launch" \
		"$SPACED_BUILD/spaced-host/spaced-host" "$CP"; do
		[ -x "$b" ] || { echo "$b is not built"; exit 77; }
	done
	for b in "$@"; do
		command -v "$b" >/dev/null 2>&1 || { echo "$b is not installed (scripts/setup.sh installs it)"; exit 77; }
	done
}

# rootfs_tarball FILE [BYTES] — a root filesystem tarball: a directory data/ holding data/blob, BYTES
# (300 KiB) of random data (each one its own tree)
rootfs_tarball() {
	python3 - "$1" "${2:-307200}" <<'PY'
import io, os, sys, tarfile
with tarfile.open(sys.argv[1], "w") as t:
    d = tarfile.TarInfo("data"); d.type = tarfile.DIRTYPE; d.mode = 0o755; t.addfile(d)
    data = os.urandom(int(sys.argv[2]))
    f = tarfile.TarInfo("data/blob"); f.size = len(data); f.mode = 0o644; t.addfile(f, io.BytesIO(data))
PY
}

# role_pids NAME [WORKER] — the pids of WORKER's (worker-1's) processes named NAME: descendants of
# its supervisor (from $D/pids), not counting one whose parent has the same name (a child a role
# forks for a moment, before it execs or exits)
role_pids() {
	rsup=$(awk -v w="${2:-worker-1}" '$1 == w {print $2}' "$D/pids")
	for p in $(pgrep -x "$1"); do
		q=$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null || echo 1)
		[ "$(cat "/proc/$q/comm" 2>/dev/null)" = "$1" ] && continue
		while [ "$q" -gt 1 ]; do
			[ "$q" = "$rsup" ] && { echo "$p"; break; }
			q=$(awk '{print $4}' "/proc/$q/stat" 2>/dev/null || echo 1)
		done
	done
}

# role_pid NAME [WORKER] — the first of role_pids, empty when there is none
role_pid() {
	role_pids "$@" | head -n 1
}

# running_on N S — how many executions of sandbox S worker-N of the dev cluster in $D runs (records
# whose execution is live: not ended, deactivated or destroyed, with a process)
running_on() {
	"$SPACED_BUILD/spacectl/spacectl" node status --admin "$D/worker-$1/admin.sock" 2>/dev/null |
		jq -r --arg s "$2" '[.result.records[] | select(.identity.sandbox == $s and (.state // "") != "ended" and (.state // "") != "deactivated" and (.state // "") != "destroyed" and .pid > 0)] | length'
}

# cluster_up [DEV UP OPTIONS...] — a cluster of one worker in $D, its env loaded, a second tenant
# made (as_victim runs spacectl as it); the suite ends when it does not start
cluster_up() {
	dev_up --workers 1 --plaintext "$@"
	VICTIM=$("$CP" admin --state "$D/cp" create-tenant victim 2>/dev/null)
}
# dev_up [DEV UP OPTIONS...] — `spacectl dev up` in $D, its env loaded; the suite ends when it does not start
dev_up() {
	if ! "$SPACED_BUILD/spacectl/spacectl" dev up --dir "$D" "$@" >"$W/up.out" 2>"$W/up.err"; then
		cat "$W/up.err"; tail -n 20 "$D"/*.log 2>/dev/null
		echo "FAIL: dev up $*"; exit 1
	fi
	. "$D/env"
}
as_victim() { SPACED_API_KEY=$VICTIM SPACED_ROUTE_CACHE="$W/victim-routes" "$SC" "$@"; }

# refused_flag FLAG VALUE — spaced-node refuses a malformed value before starting anything
refused_flag() {
	"$SPACED_BUILD/spaced-node/spaced-node" --state "$W/bad" --worker-id w --listen 127.0.0.1:0 --plaintext \
		"$1" "$2" >/dev/null 2>"$W/flag.err"
	expect "spaced-node $1 $2: exit 2 naming the option" "$? $(grep -c -- "$1" "$W/flag.err")" "2 1"
}

# hold_store_lock DB SECONDS OUT — another process takes DB's SQLite write lock (BEGIN IMMEDIATE)
# for SECONDS, as a writer waiting for a slow disk would; returns once it holds it, with its pid in
# HOLDER. OUT gets "held", then the wall-clock time it let go (ns).
hold_store_lock() {
	python3 -c 'import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=5)
c.execute("BEGIN IMMEDIATE")
print("held", flush=True)
time.sleep(float(sys.argv[2]))
c.execute("ROLLBACK")
print(time.time_ns(), flush=True)' "$1" "$2" >"$3" &
	HOLDER=$!
	i=0
	while [ "$(head -n 1 "$3")" != held ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
}

# store_test_setup — for a test that reads the SQLite store itself: a working directory $W
# (removed at the end unless CP_KEEP is set), the tenant alpha ($TA), the store's path ($DB) and
# q SQL, which runs SQL on it (waiting up to 5 s for its lock)
store_test_setup() {
	command -v sqlite3 >/dev/null 2>&1 || { echo "sqlite3 is not installed"; exit 77; }
	W=$(mktemp -d)
	trap 'cleanup; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
	mkdir -p "$W/cp"
	TA=$(admin create-tenant alpha)
	[ -n "$TA" ] || { echo "admin commands failed"; exit 1; }
	DB=$W/cp/cp.db
}
q() { sqlite3 -cmd ".timeout 5000" "$DB" "$1"; }

# ---- a worker of the test's own, driven through its admin socket (no control plane) ----

# own_worker_up DIR ARGS... — spaced-node on the process substrate with its state in DIR (its log
# DIR.log), started with ARGS beside the binaries' paths; waits for its admin socket, installs a
# key bundle of a fresh key ($OWN_SK: the secret, $OWN_PK: the public key, $OWN_BUNDLE: the file)
# and sets NPID and ADM (--admin DIR/admin.sock)
own_worker_up() {
	dir=$1; shift
	"$SPACED_BUILD/spacectl/spacectl" token keygen --json >"$dir.key.json"
	OWN_SK=$(jq -r .secret "$dir.key.json")
	OWN_PK=$(jq -r .public "$dir.key.json")
	OWN_BUNDLE=$dir.bundle.json
	printf '{"version":1,"keys":[{"key":"%s","not_before":"2020-01-01T00:00:00Z","not_after":"2099-01-01T00:00:00Z"}]}\n' \
		"$OWN_PK" >"$OWN_BUNDLE"
	"$SPACED_BUILD/spaced-node/spaced-node" --state "$dir" --listen 127.0.0.1:0 \
		--guest-bin "$SPACED_BUILD/spaced-guest/spaced-guest" --launcher "$SPACED_BUILD/spaced-node/spaced-launch" \
		--host "$SPACED_BUILD/spaced-host/spaced-host" --plaintext "$@" 2>"$dir.log" &
	NPID=$!
	i=0
	until [ -S "$dir/admin.sock" ] && [ -s "$dir/api.port" ]; do
		i=$((i + 1)); [ $i -lt 500 ] || { echo "FAIL: spaced-node did not start"; cat "$dir.log"; exit 1; }
		sleep 0.02
	done
	ADM="--admin $dir/admin.sock"
	"$SPACED_BUILD/spacectl/spacectl" node keys $ADM "$OWN_BUNDLE" >/dev/null || { echo "FAIL: keys"; exit 1; }
}

# own_worker_down DIR — stops NPID, then whatever still names DIR/ on its command line (launchers,
# bridges, gateways, the worker's resolver and pasta), their executions' freezer cgroups thawed
# first (a frozen task takes no signal: a sandbox left paused would stay in D state for good), and
# unmounts the worker's egress namespace; returns once they are gone (up to 10 s: a launcher holds
# its uid range's lock until it has exited, and the next worker on the same range needs it)
own_worker_down() {
	dir=$1
	[ -n "${NPID:-}" ] && kill "$NPID" 2>/dev/null && wait "$NPID" 2>/dev/null
	NPID=""
	killed=""
	for p in $(ls /proc | grep -E '^[0-9]+$'); do
		{ tr '\0' ' ' <"/proc/$p/cmdline"; } 2>/dev/null | grep -q "$dir/" || continue
		for f in /sys/fs/cgroup/freezer/spaced*/spaced-"$p"-*/freezer.state; do
			[ -e "$f" ] && echo THAWED >"$f" 2>/dev/null
		done
		for f in /sys/fs/cgroup/spaced*/spaced-"$p"-*/cgroup.freeze; do
			[ -e "$f" ] && echo 0 >"$f" 2>/dev/null
		done
		kill -9 "$p" 2>/dev/null && killed="$killed $p"
	done
	for i in $(seq 1 200); do
		alive=""
		for p in $killed; do
			grep -qs '^State:[[:space:]]*[^Z]' "/proc/$p/status" && alive="$alive $p"
		done
		killed=$alive
		[ -z "$killed" ] && break
		sleep 0.05
	done
	umount -l "$dir/net/ns" 2>/dev/null
}
