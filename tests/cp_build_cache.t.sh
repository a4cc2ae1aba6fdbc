#!/bin/sh
# run-tests: light, about 8 s
# The build cache is bounded (cp.h cp_build_cache_sweep): every step of a
# Spacefile build leaves a tree in the control plane's store, so a tenant
# building in a loop would otherwise fill its disk. A control plane with
# --snapshot-grace 3, and a store holding cached steps' trees of 60 KiB each
# (written here, with their build_steps rows, as a build leaves them):
# alpha's steps 1 (looked up just now), 2 (also a named template), 3 and 4;
# beta's step 5, used before any of alpha's; a base (6, recorded for every
# tenant, as FROM debian:… is) older still; a tree both alpha and beta
# recorded (7). With --build-cache 250K:
#  - the trees go from the tenant holding the most of the cache first, its
#    least recently used first, with their rows, until the rest fit: alpha's 3
#    and 4 (a plain least-recently-used order took the base, the shared tree
#    and beta's step first: one tenant's builds in a loop evicted everyone's
#    cache); a lookup of an evicted step is 404 (a later build runs it again),
#    of a kept one 200;
#  - the named template's tree stays whatever its age, and so does a step
#    used recently;
# then with --build-cache 130K (alpha has nothing left that may go):
#  - beta's own step goes, then the base; the shared tree goes last (taking
#    one holder's step of it frees nothing).
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
store_test_setup
TB=$(admin create-tenant beta)
T=$(sqlite3 "$DB" "SELECT id FROM tenants WHERE name = 'alpha'")
U=$(sqlite3 "$DB" "SELECT id FROM tenants WHERE name = 'beta'")
h() { printf '%064d' "$1"; } # a tree's hash
old=$(($(date +%s) - 3600))
mkdir -p "$W/cp/store/templates"
step() { # step TENANT N CREATED
	q "INSERT INTO build_steps (tenant, parent, step, hash, config, created)
		VALUES ('$1', 'p', 'RUN step $2', '$(h "$2")', '{}', $3)"
}
for i in 1 2 3 4 5 6 7; do head -c 61440 /dev/urandom >"$W/cp/store/templates/$(h $i).tar"; done
# alpha's steps i built an hour ago, i seconds apart: 1 is the least recently used of them
for i in 1 2 3 4; do step "$T" $i $((old + i)); done
step "$U" 5 $((old - 10))
step "" 6 $((old - 20))
step "$T" 7 $((old - 15))
step "$U" 7 $((old - 15))
# 2 is also a named template
q "INSERT INTO templates (tenant, name, hash, bytes, entries, config, source, created)
	VALUES ('$T', 'named', '$(h 2)', 61440, 1, '{}', 'tar', $old)"
start_cp cp --build-cache 250K --snapshot-grace 3
# step 1 is used now: from here on 3 is alpha's least recently used unnamed one
expect "a lookup of step 1 is a hit" "$(api "$TA" POST /v1/builds/lookup '{"parent":"p","step":"RUN step 1"}')" 200

kept() { for i in 1 2 3 4 5 6 7; do [ -f "$W/cp/store/templates/$(h $i).tar" ] && printf '%s ' $i; done; }
wait_for "the cache is swept down to its bound" sh -c "[ \"\$(ls '$W/cp/store/templates' | wc -l)\" -le 5 ]"
expect "kept: the recently used step, the named template, beta's step, the base and the shared tree" \
	"$(kept)" "1 2 5 6 7 "
expect "the evicted steps' rows are gone" \
	"$(q "SELECT DISTINCT step FROM build_steps ORDER BY step" | tr '\n' ',')" \
	"RUN step 1,RUN step 2,RUN step 5,RUN step 6,RUN step 7,"
expect "a lookup of an evicted step: 404 (a later build runs it again)" \
	"$(api "$TA" POST /v1/builds/lookup '{"parent":"p","step":"RUN step 3"}')" 404
expect "a lookup of a kept step: 200" "$(api "$TA" POST /v1/builds/lookup '{"parent":"p","step":"RUN step 1"}')" 200
expect "beta's step is still a hit" "$(api "$TB" POST /v1/builds/lookup '{"parent":"p","step":"RUN step 5"}')" 200
expect "the sweep is logged" "$(grep -c 'event=build-cache-swept removed=2 bytes=122880' "$CP_LOG")" 1

# a tighter bound: beta's own step, then the base; the shared tree stays (step 1 stays in use,
# beta's step 5 is old again: its lookup above used it)
kill "$CP_PID"
wait "$CP_PID" 2>/dev/null
q "UPDATE build_steps SET created = $(($(date +%s) + 86400)) WHERE step = 'RUN step 1'"
q "UPDATE build_steps SET created = $((old - 10)) WHERE step = 'RUN step 5'"
start_cp cp --build-cache 130K --snapshot-grace 3
wait_for "the cache is swept down to its tighter bound" sh -c "[ \"\$(ls '$W/cp/store/templates' | wc -l)\" -le 3 ]"
expect "kept: the recently used step, the named template and the shared tree" "$(kept)" "1 2 7 "
expect "both holders' steps of the shared tree are still hits" \
	"$(api "$TA" POST /v1/builds/lookup '{"parent":"p","step":"RUN step 7"}') $(api "$TB" POST /v1/builds/lookup '{"parent":"p","step":"RUN step 7"}')" \
	"200 200"
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
