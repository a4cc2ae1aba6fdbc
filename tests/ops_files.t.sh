#!/bin/sh
# run-tests: paired, about 2 s
# What an operator installs besides the binaries (issue 16 item 5): man pages that render without a
# warning, systemd units that `systemd-analyze verify` accepts (pointed at this build), the example
# configuration file taken by spaced-node --config (a bad one refused with its line), and a bash
# completion that offers spacectl's commands, subcommands and options.
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
B=$SPACED_BUILD

for m in "$SPACED_TOP"/man/*.[18]; do
	man -l --warnings "$m" >/dev/null 2>"$W/warn"
	expect "$(basename "$m") renders without a warning" "$(wc -l <"$W/warn" | tr -d ' ')" 0
done

if command -v systemd-analyze >/dev/null 2>&1; then
	for u in "$SPACED_TOP"/dist/systemd/*.service; do
		sed -e "s|/usr/local/bin/spaced-node|$B/spaced-node/spaced-node|; s|/usr/local/bin/spaced-cp|$B/spaced-cp/spaced-cp|" \
			"$u" >"$W/$(basename "$u")"
		systemd-analyze verify "$W/$(basename "$u")" >"$W/verify.out" 2>&1
		expect "systemd-analyze verify $(basename "$u")" "$?:$(grep -c . "$W/verify.out")" "0:0"
		[ -s "$W/verify.out" ] && cat "$W/verify.out"
	done
else
	echo "systemd-analyze is not installed: units not verified"
fi

# the example configuration: every option it names is one spaced-node takes (its TLS files made
# by spacectl dev certs; without a control plane, the link's TLS lines go too)
"$B/spacectl/spacectl" dev certs --dir "$W/certs" --workers 1 >/dev/null
T=$W/certs/tls
sed -e "s|^state .*|state $W/node|; s|^cp .*||; s|^join-token-file .*||; s|^launcher .*||; s|^host .*||" \
	-e "s|^listen .*|listen 127.0.0.1:0|; s|^metrics-listen .*|metrics-listen 127.0.0.1:0|; s|^advertise .*||" \
	-e "s|^tls-cert .*|tls-cert $T/worker-1.pem|; s|^tls-key .*|tls-key $T/worker-1.key|" \
	-e "s|^tls-ca .*||; s|^tls-client-cert .*||; s|^tls-client-key .*||" \
	"$SPACED_TOP/dist/spaced-node.conf" >"$W/node.conf"
"$B/spaced-node/spaced-node" --config "$W/node.conf" --uid-lock-dir "$W/locks" >"$W/node.log" 2>&1 &
NP=$!
i=0
while [ ! -s "$W/node/api.port" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
expect "spaced-node starts from dist/spaced-node.conf" "$([ -s "$W/node/api.port" ] && [ -s "$W/node/metrics.port" ] && echo yes)" yes
kill "$NP" 2>/dev/null; wait "$NP" 2>/dev/null
sed -e "s|^state .*|state $W/cp|; s|^db .*||; s|^listen .*|listen 127.0.0.1:0|; s|^metrics-listen .*|metrics-listen 127.0.0.1:0|" \
	-e "s|^tls-cert .*|tls-cert $T/cp.pem|; s|^tls-key .*|tls-key $T/cp.key|; s|^tls-client-ca .*|tls-client-ca $T/ca.pem|" \
	"$SPACED_TOP/dist/spaced-cp.conf" >"$W/cp.conf"
"$B/spaced-cp/spaced-cp" --config "$W/cp.conf" >"$W/cp.log" 2>&1 &
CPP=$!
i=0
while [ ! -s "$W/cp/cp.port" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
expect "spaced-cp starts from dist/spaced-cp.conf (JSON logs, a metrics listener)" \
	"$([ -s "$W/cp/metrics.port" ] && head -n 1 "$W/cp.log" | jq -r .event)" listening
kill "$CPP" 2>/dev/null; wait "$CPP" 2>/dev/null
printf 'listen 127.0.0.1:0\n--state /tmp/x\n' >"$W/bad.conf"
"$B/spaced-node/spaced-node" --config "$W/bad.conf" >"$W/bad.out" 2>&1
expect "a bad configuration line is refused with its line number" "$?:$(grep -c 'line 2' "$W/bad.out")" "2:1"

# completion
out=$(PATH="$B/spacectl:$PATH" bash -c '
source <(spacectl completion bash)
c() { COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _spacectl; echo "${COMPREPLY[*]}"; }
c spacectl f; c spacectl fs ""; c spacectl exec --t; c spacectl dev ""')
expect "completion: commands, subcommands and options" "$out" "fs
ls mkdir mv read rm stat write
--timeout
certs down status up"
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
