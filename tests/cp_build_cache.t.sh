#!/bin/sh
# run-tests: light, about 3 s
# The build cache is bounded (cp.h cp_build_cache_sweep): every step of a
# Spacefile build leaves a tree in the control plane's store, so a tenant
# building in a loop would otherwise fill its disk. A control plane with
# --build-cache 100K and --snapshot-grace 3, and a store holding four cached
# steps' trees of 60 KiB each (written here, with their build_steps rows, as
# a build leaves them), one of them also a named template:
#  - the least recently used unnamed trees go until the rest fit (two of the
#    three unnamed: 180 KiB -> 60 KiB, under 100 KiB), with their rows: a lookup of an
#    evicted step is 404 (a later build runs it again), of a kept one 200;
#  - the named template's tree stays whatever its age;
#  - a step used (looked up) recently is not evicted before an older one;
#  - fair to tenants: a step of tenant beta, older than all of alpha's, stays
#    while alpha holds more of the cache than beta (least recently used across
#    tenants would have taken it first: one tenant's builds in a loop would
#    evict everyone's cache).
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
store_test_setup
TB=$(admin create-tenant beta)
T=$(sqlite3 "$DB" "SELECT id FROM tenants WHERE name = 'alpha'")
U=$(sqlite3 "$DB" "SELECT id FROM tenants WHERE name = 'beta'")
h() { printf '%064d' "$1"; } # a tree's hash
old=$(($(date +%s) - 3600))
mkdir -p "$W/cp/store/templates"
for i in 1 2 3 4; do
	head -c 61440 /dev/urandom >"$W/cp/store/templates/$(h $i).tar"
	# step i built an hour ago, i seconds apart: 1 is the least recently used
	q "INSERT INTO build_steps (tenant, parent, step, hash, config, created)
		VALUES ('$T', 'p', 'RUN step $i', '$(h $i)', '{}', $((old + i)))"
done
# 5 is beta's, used before any of alpha's
head -c 61440 /dev/urandom >"$W/cp/store/templates/$(h 5).tar"
q "INSERT INTO build_steps (tenant, parent, step, hash, config, created)
	VALUES ('$U', 'p', 'RUN step 5', '$(h 5)', '{}', $((old - 10)))"
# 2 is also a named template
q "INSERT INTO templates (tenant, name, hash, bytes, entries, config, source, created)
	VALUES ('$T', 'named', '$(h 2)', 61440, 1, '{}', 'tar', $old)"
start_cp cp --build-cache 130K --snapshot-grace 3
# step 1 is used now: from here on 3 is the least recently used unnamed one
expect "a lookup of step 1 is a hit" "$(api "$TA" POST /v1/builds/lookup '{"parent":"p","step":"RUN step 1"}')" 200

kept() { for i in 1 2 3 4 5; do [ -f "$W/cp/store/templates/$(h $i).tar" ] && printf '%s ' $i; done; }
wait_for "the cache is swept down to its bound" sh -c "[ \"\$(ls '$W/cp/store/templates' | wc -l)\" -le 3 ]"
expect "kept: alpha's recently used step, the named template and beta's step" "$(kept)" "1 2 5 "
expect "the evicted steps' rows are gone" \
	"$(q "SELECT step FROM build_steps ORDER BY step" | tr '\n' ',')" \
	"RUN step 1,RUN step 2,RUN step 5,"
expect "beta's step is still a hit" "$(api "$TB" POST /v1/builds/lookup '{"parent":"p","step":"RUN step 5"}')" 200
expect "a lookup of an evicted step: 404 (a later build runs it again)" \
	"$(api "$TA" POST /v1/builds/lookup '{"parent":"p","step":"RUN step 3"}')" 404
expect "a lookup of a kept step: 200" "$(api "$TA" POST /v1/builds/lookup '{"parent":"p","step":"RUN step 1"}')" 200
expect "the sweep is logged" "$(grep -c 'event=build-cache-swept removed=2 bytes=122880' "$CP_LOG")" 1
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
