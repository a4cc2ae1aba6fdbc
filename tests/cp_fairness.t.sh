#!/bin/sh
# run-tests: light, about 6 s
# The control plane serves API keys in turn (spaced-cp/server.c): a tenant whose
# lifecycle calls all wait for a worker that never answers (each holds a
# request thread up to --ack-timeout, 5 s here) does not hold every thread.
# A control plane with 8 lifecycle threads, a worker that never acknowledges
# an install (wa) and one that does (wb):
#  - 16 creates of the hostile tenant on wa at once, then one create of the
#    victim tenant on wb: the victim's is answered (201) while the hostile
#    ones still wait — it did not queue behind them (it would take 5 s and
#    more: all 8 threads held until their ack timeouts);
#  - every hostile create is answered too (504 or 503), none lost.
# The victim's time is printed; the assertion is only that it is answered
# before the hostile creates' ack timeout.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
W=$(mktemp -d)
trap 'cleanup; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT

mkdir -p "$W/cp"
TH=$(admin create-tenant hostile)
TV=$(admin create-tenant victim)
[ -n "$TH" ] && [ -n "$TV" ] || { echo "admin commands failed"; exit 1; }
start_cp cp --threads 8
register wa 64
register wb 64
start_worker wa --silent install
start_worker wb

HP=""
for i in $(seq 16); do
	OUT=$W/h$i.body api "$TH" POST /v1/sandboxes '{"worker":"wa"}' >"$W/h$i.status" &
	HP="$HP $!"
done
sleep 0.5
t0=$(date +%s%N)
st=$(OUT=$W/v.body api "$TV" POST /v1/sandboxes '{"worker":"wb"}')
ms=$((($(date +%s%N) - t0) / 1000000))
echo "the victim's create took $ms ms with 16 hostile creates waiting on a silent worker"
expect "the victim's create is answered" "$st" 201
expect "it did not wait for the hostile creates' ack timeout (5 s)" "$([ "$ms" -lt 4000 ] && echo yes)" yes
wait $HP
# (504 worker-timeout, or 503 worker-unavailable once the control plane gave
# up on the silent worker's channel)
expect "every hostile create is answered: 504 worker-timeout or 503 worker-unavailable" \
	"$(for i in $(seq 16); do cat "$W/h$i.status"; echo; done | grep -c '^50[34]$')" 16
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
