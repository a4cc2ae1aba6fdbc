#!/bin/sh
# pg-test.sh — a throwaway PostgreSQL server for tests.
#   pg-test.sh start DIR   initdb + start a server in DIR (Unix socket in DIR, no TCP), print its URL
#   pg-test.sh url DIR     print the URL of the server in DIR
#   pg-test.sh stop DIR    stop it (DIR stays; remove it yourself)
# As root, the server runs as the unprivileged user PG_TEST_USER (default: nobody).
# Exit 77 with the reason on the last line when PostgreSQL cannot be started here.
set -eu
cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: pg-test.sh start|url|stop DIR" >&2; exit 2; }
PGBIN=${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
user=${PG_TEST_USER:-nobody}

as_pg() {
	if [ "$(id -u)" -eq 0 ]; then
		runuser -u "$user" -- "$@"
	else
		"$@"
	fi
}

url() {
	echo "postgresql:///spaced?host=$(cd "$dir" && pwd)&user=spaced"
}

case "$cmd" in
start)
	if [ -z "$PGBIN" ] || [ ! -x "$PGBIN/initdb" ]; then
		echo "PostgreSQL server binaries not found (apt-get install postgresql)"
		exit 77
	fi
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	if [ "$(id -u)" -eq 0 ]; then
		chown "$user" "$dir"
		# every parent must be traversable by the server's user
		p=$dir
		while [ "$p" != "/" ]; do
			p=$(dirname "$p")
			[ -x "$p" ] || chmod o+x "$p"
		done
	fi
	as_pg "$PGBIN/initdb" -D "$dir/data" -U spaced --auth=trust -E UTF8 >"$dir/initdb.log" 2>&1 ||
		{ tail -n 5 "$dir/initdb.log"; echo "initdb failed"; exit 77; }
	as_pg "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 \
		-o "-k $dir -c listen_addresses= -c fsync=off -c max_connections=200" start >/dev/null 2>&1 ||
		{ tail -n 5 "$dir/server.log"; echo "pg_ctl start failed"; exit 77; }
	as_pg "$PGBIN/createdb" -h "$dir" -U spaced spaced >/dev/null 2>&1 || true
	url
	;;
url)
	url
	;;
stop)
	[ -d "$dir/data" ] || exit 0
	as_pg "$PGBIN/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
	;;
*)
	echo "usage: pg-test.sh start|url|stop DIR" >&2
	exit 2
	;;
esac
