#!/bin/sh
# run-tests: light, about 1 s
# No header of spaced has the name of a header in the C compiler's own
# search path: a file compiled with -Ilibspaced (or another source directory)
# that includes <spawn.h> or <error.h> would get spaced's header instead,
# which broke a clean build once (libspaced/spawn.h, now helper_spawn.h).
#   env: SPACED_TOP (repo root)
set -u
top=${SPACED_TOP:?SPACED_TOP is not set}
cc=${CC:-cc}
command -v "$cc" >/dev/null 2>&1 || { echo "no C compiler ($cc)"; exit 77; }
dirs=$(echo | "$cc" -E -Wp,-v - 2>&1 | sed -n 's/^ \(\/.*\)/\1/p')
[ -n "$dirs" ] || { echo "FAIL: the compiler's include directories are unknown"; exit 1; }
fails=0 n=0
for h in $(cd "$top" && find libspaced spaced-* spacectl tests bench fuzz sdk -name '*.h' 2>/dev/null); do
	n=$((n + 1))
	b=${h##*/}
	for d in $dirs; do
		if [ -e "$d/$b" ]; then
			echo "FAIL: $h has the name of $d/$b"
			fails=$((fails + 1))
		fi
	done
done
[ "$n" -gt 30 ] || { echo "FAIL: only $n headers found under $top"; exit 1; }
echo "ok: none of spaced's $n headers is named as one in $(echo $dirs | wc -w) system include directories"
[ "$fails" -eq 0 ]
