#!/bin/sh
# cp_scale_bench.sh BUILD [LIVE] [CREATES] — what a create costs the control plane when the fleet is
# large: spaced-cp with two cp-fake-worker peers, on SQLite and on a throwaway PostgreSQL server
# (scripts/pg-test.sh; skipped where none starts), first with one live sandbox, then with LIVE more
# (default 20,000, one tenant's, on both workers; written straight into the store, then ANALYZE),
# CREATES sequential creates (default 40) through one kept-alive connection each time. The figure is
# the create's p50 with LIVE sandboxes against the same store's with one, in the same run: placement
# and the quotas read per-worker and per-tenant counts (docs/control-plane.md), so the ratio is
# about 1; summing the rows made it grow with the fleet.
# Last line: {"sqlite_p50_ms_small":…, "sqlite_p50_ms_large":…, "sqlite_ratio":…,
#             "pg_p50_ms_small":…, "pg_p50_ms_large":…, "pg_ratio":…, "live":…}
set -u
build=$(cd "$1" && pwd)
LIVE=${2:-20000}
CREATES=${3:-40}
SPACED_TOP=$(cd "$(dirname "$0")/.." && pwd)
export SPACED_BUILD=$build SPACED_TOP
. "$SPACED_TOP/tests/cp_lib.sh"
ROOT=$(mktemp -d)
chmod 755 "$ROOT"
trap 'cleanup; [ -d "$ROOT/pg" ] && sh "$SPACED_TOP/scripts/pg-test.sh" stop "$ROOT/pg" >/dev/null 2>&1; rm -rf "$ROOT"' EXIT

# creates_p50 KEY N: N sequential creates on one connection; their p50 in ms (any other answer: fails)
creates_p50() {
	python3 - "$CP_URL" "$1" "$2" <<'PY'
import http.client, sys, time
host, port = sys.argv[1][7:].split(':')
c = http.client.HTTPConnection(host, int(port), timeout=30)
h = {'Authorization': 'Bearer ' + sys.argv[2], 'Content-Type': 'application/json'}
ts = []
for i in range(int(sys.argv[3])):
    t0 = time.monotonic()
    c.request('POST', '/v1/sandboxes', body='{"memory_bytes":16777216,"pids":8}', headers=h)
    r = c.getresponse(); b = r.read()
    if r.status != 201:
        sys.exit("create answered %d: %s" % (r.status, b[:200]))
    ts.append((time.monotonic() - t0) * 1000)
ts.sort()
print("%.2f" % ts[len(ts) // 2])
PY
}

# run STORE SQL-COMMAND: prints "small large" (p50 ms) for that store
run() {
	store=$1
	W=$ROOT/$store
	mkdir -p "$W/cp"
	chmod 755 "$W"
	TA=$(admin create-tenant alpha)
	admin set-quota alpha sandboxes=0,memory=0,disk=0,pids=0 >/dev/null
	start_cp cp >/dev/null
	register wa 100000 >/dev/null
	register wb 100000 >/dev/null
	start_worker wa --capacity 100000
	start_worker wb --capacity 100000
	small=$(creates_p50 "$TA" "$CREATES") || return 1
	S=$(sql "SELECT id FROM sandboxes WHERE deleted = 0 ORDER BY created LIMIT 1")
	COLS=$(sql "SELECT group_concat(name, ',') FROM pragma_table_info('sandboxes') WHERE name <> 'id'" 2>/dev/null ||
		sql "SELECT string_agg(column_name, ',' ORDER BY ordinal_position) FROM information_schema.columns WHERE table_name = 'sandboxes' AND column_name <> 'id'")
	sql "INSERT INTO sandboxes (id, $COLS) SELECT 'sbx-scale' || g.n, $COLS FROM ($SERIES) g, sandboxes s WHERE s.id = '$S'" >/dev/null
	sql "UPDATE sandboxes SET worker = 'wb' WHERE id LIKE 'sbx-scale%' AND substr(id, length(id)) IN ('1','3','5','7','9')" >/dev/null
	sql "ANALYZE" >/dev/null
	echo "$store: $(sql "SELECT COUNT(*) FROM sandboxes WHERE deleted = 0") live sandboxes" >&2
	sleep 2 # the control plane's reaper has added the counts' changes in (PostgreSQL)
	large=$(creates_p50 "$TA" "$CREATES") || return 1
	cleanup
	PIDS=""
	echo "$small $large"
}

SERIES="WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < $LIVE) SELECT n FROM c"
sql() { sqlite3 -cmd ".timeout 5000" "$W/cp/cp.db" "$1"; }
CP_DB=""
lite=$(run sqlite) || { echo "cp_scale_bench: the SQLite run failed"; exit 1; }
pg="null null"
if out=$(sh "$SPACED_TOP/scripts/pg-test.sh" start "$ROOT/pg"); then
	CP_DB=$out
	SERIES="SELECT generate_series(1, $LIVE) AS n"
	sql() { psql "$CP_DB" -q -At -c "$1"; }
	pg=$(run postgresql) || { echo "cp_scale_bench: the PostgreSQL run failed"; exit 1; }
else
	echo "PostgreSQL does not start here: $out" >&2
fi
set -- $lite $pg
ratio() { [ "$1" = null ] && echo null || awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b / a }'; }
printf 'create p50 through the control plane, %s sequential creates (ms): one live sandbox, then %s\n' "$CREATES" "$LIVE"
printf '  SQLite      %8s  %8s  (x%s)\n' "$1" "$2" "$(ratio "$1" "$2")"
printf '  PostgreSQL  %8s  %8s  (x%s)\n' "$3" "$4" "$(ratio "$3" "$4")"
printf '{"sqlite_p50_ms_small":%s,"sqlite_p50_ms_large":%s,"sqlite_ratio":%s,"pg_p50_ms_small":%s,"pg_p50_ms_large":%s,"pg_ratio":%s,"live":%s}\n' \
	"$1" "$2" "$(ratio "$1" "$2")" "$3" "$4" "$(ratio "$3" "$4")" "$LIVE"
