#!/bin/sh
# The tour of spaced on the embedded default. Today it shows the security core
# end to end through spacectl: keys, capabilities bound to one execution, and
# what a receiver answers when the execution it runs is not the one named.
set -eu
build=${1:-build}
S="$build/spacectl/spacectl"
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
# Prints a command the way a person would type it (keys and tokens shortened), then runs it.
show() {
	line="$"
	for a in "$@"; do
		case "$a" in
		"$S") a=spacectl ;;
		k4.public.*) a="k4.public.$(printf %s "${a#k4.public.}" | cut -c1-6)…" ;;
		v4.public.*) a='$TOKEN' ;;
		*\;*) a="'$a'" ;;
		esac
		line="$line $a"
	done
	printf '%s\n' "$line"
}
run() { show "$@"; "$@"; }

step "1. The control plane's signer makes an Ed25519 key pair (PASERK k4)"
keys=$("$S" token keygen)
echo "$keys" | sed 's/^secret: k4\.secret\..*/secret: k4.secret.… (never leaves the signer)/'
SK=$(echo "$keys" | sed -n 's/^secret: //p')
PK=$(echo "$keys" | sed -n 's/^public: //p')

step "2. Plain PASETO v4.public: sign any payload, verify it, refuse a forgery"
T=$("$S" token sign --key "$SK" '{"hello":"spaced"}')
echo "token: $T"
run "$S" token verify --key "$PK" "$T"
forged=$(echo "$T" | sed 's/.$/A/')
[ "$forged" = "$T" ] && forged=$(echo "$T" | sed 's/.$/B/')
echo "\$ spacectl token verify --key k4.public.… <token with its last character changed>"
"$S" token verify --key "$PK" "$forged" || echo "(refused, exit $?)"

step "3. A capability for sandbox sbx-demo, execution (generation) 7 on worker-a"
CAP=$("$S" cap issue --key "$SK" --sandbox sbx-demo --generation 7 --worker worker-a \
	--activation act-1 --purpose fs.read --purpose exec)
run "$S" cap inspect "$CAP"
echo
show "$S" cap inspect --key "$PK" "$CAP"
"$S" cap inspect --key "$PK" "$CAP" | head -n 1

step "4. worker-a still runs execution 7: the receiver allows the request (R1)"
ID7="sandbox=sbx-demo;generation=7;worker=worker-a;substrate=process;activation=act-1;pod_uid="
run "$S" cap check --key "$PK" --installed "$ID7" --purpose exec "$CAP"

step "5. The sandbox was resumed as execution 8: the same unexpired capability is refused (R3, C4)"
ID8="sandbox=sbx-demo;generation=8;worker=worker-b;substrate=process;activation=act-1;pod_uid="
run "$S" cap check --key "$PK" --installed "$ID8" --purpose exec "$CAP" || echo "(refused, exit $?: the client resolves the route again)"

step "6. A capability for execution 8 that reaches a worker still serving 7 is refused there too (R2)"
CAP8=$("$S" cap issue --key "$SK" --sandbox sbx-demo --generation 8 --worker worker-b \
	--activation act-1 --purpose exec)
run "$S" cap check --key "$PK" --installed "$ID7" --purpose exec "$CAP8" || echo "(refused, exit $?)"

step "7. Once worker-a installs the deactivation of 7, capabilities for 7 are refused before they expire (R3)"
run "$S" cap check --key "$PK" --installed "$ID7" --tombstone --purpose exec "$CAP" || echo "(refused, exit $?)"

step "8. Invalid access is denied, never refreshed (C5)"
run "$S" cap check --key "$PK" --installed "$ID7" --purpose fs.write "$CAP" || echo "(refused, exit $?)"
OTHER="sandbox=sbx-other;generation=7;worker=worker-a;substrate=process;activation=act-1;pod_uid="
run "$S" cap check --key "$PK" --installed "$OTHER" --purpose exec "$CAP" || echo "(refused, exit $?)"
other_keys=$("$S" token keygen)
OPK=$(echo "$other_keys" | sed -n 's/^public: //p')
run "$S" cap check --key "$OPK" --installed "$ID7" --purpose exec "$CAP" || echo "(refused, exit $?)"

printf '\n\033[1mdone.\033[0m Sandboxes, workers and the control plane join this tour as they land (see README).\n'
