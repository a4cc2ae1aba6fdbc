#!/bin/sh
# run-tests: paired, about 46 s
# FROM debian:bookworm (issue 13): a Spacefile on a minimal Debian that the control plane builds
# with Debian's own mmdebstrap from the package archive, once for every tenant; a RUN step on it;
# a sandbox from it is Debian (dpkg, apt, /etc/debian_version) and not the host's /usr.
# Skipped, with the reason, when the archive (deb.debian.org) cannot be reached or mmdebstrap is
# not installed. RUN steps use what the base holds (they need no network).
set -u
. "$SPACED_TOP/tests/cp_lib.sh"
SC=$SPACED_BUILD/spacectl/spacectl
[ "$(id -u)" -eq 0 ] || { echo "the process substrate needs root"; exit 77; }
command -v mmdebstrap >/dev/null 2>&1 || { echo "mmdebstrap is not installed (scripts/setup.sh installs it)"; exit 77; }
curl -s -o /dev/null --max-time 10 http://deb.debian.org/debian/dists/bookworm/Release ||
	{ echo "the Debian package archive (deb.debian.org) cannot be reached: FROM debian:bookworm skipped"; exit 77; }
for b in "$SC" "$SPACED_BUILD/spaced-node/spaced-node" "$SPACED_BUILD/spaced-node/spaced-launch" "$CP"; do
	[ -x "$b" ] || { echo "$b is not built"; exit 77; }
done
# the guest runs as PID 1 on the template's own files: a dynamically linked guest (the sanitizer
# build's) needs libraries a minimal Debian does not have, in the build sandboxes too
if readelf -l "$SPACED_BUILD/spaced-guest/spaced-guest" 2>/dev/null | grep -q 'program interpreter'; then
	echo "this build's spaced-guest is dynamically linked (sanitizers): a minimal Debian cannot run it; FROM debian:bookworm skipped"
	exit 77
fi
W=$(mktemp -d)
D=$W/cluster
export SPACED_ROUTE_CACHE="$W/routes"
trap '"$SC" dev down --dir "$D" >/dev/null 2>&1; [ -n "${CP_KEEP:-}" ] || rm -rf "$W"' EXIT
"$SC" dev up --workers 1 --dir "$D" >"$W/up.out" 2>"$W/up.err" || { cat "$W/up.err"; echo "FAIL: dev up"; exit 1; }
. "$D/env"
printf 'FROM debian:bookworm\nRUN dpkg-query -W -f="${Package}\\n" | wc -l > /etc/package-count\n' >"$W/Spacefile"
if "$SC" template build deb -f "$W/Spacefile" --json >"$W/b.json" 2>"$W/b.err"; then
	S=$("$SC" create --template deb)
	expect "a Debian bookworm sandbox" "$("$SC" exec "$S" -- cat /etc/debian_version | cut -c1-3)" "12."
	expect "its dpkg knows its packages (the RUN step counted them)" \
		"$("$SC" exec "$S" -- sh -c 'test "$(cat /etc/package-count)" -gt 50 && echo many')" many
	expect "apt is there" "$("$SC" exec "$S" -- sh -c 'command -v apt-get')" /usr/bin/apt-get
	"$SC" exec "$S" -- test -e /usr/bin/mmdebstrap
	expect "not the host's /usr" "$?" 1
	"$SC" template build deb2 -f "$W/Spacefile" --json >"$W/b2.json" 2>/dev/null
	expect "built again: the base and the step from the cache" "$(jq -r '.cached' "$W/b2.json")" 1
else
	cat "$W/b.err" | tail -n 20
	fail "template build FROM debian:bookworm"
fi
echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
