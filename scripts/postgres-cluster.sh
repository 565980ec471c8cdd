#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the tests and benchmarks (Debian's postgresql package).
#   postgres-cluster.sh start DIR PORT   initdb in DIR (made empty), serve on 127.0.0.1:PORT and
#                                        a socket in DIR; prints the database URL
#   postgres-cluster.sh stop DIR         fast shutdown
#   postgres-cluster.sh kill DIR         immediate shutdown (as a crash), for restart tests
#   postgres-cluster.sh restart DIR      start again what stop or kill stopped
#   postgres-cluster.sh stop-after PID DIR   in the background: once process PID has ended,
#                                        stop the cluster and remove DIR (a test process that
#                                        crashes or is killed leaves nothing running)
# Trust authentication on loopback only; fsync off (a throwaway cluster never outlives its
# machine; POSTGRES_FSYNC=on keeps it, for benchmarks), synchronous_commit on. Run as root,
# the server runs as the postgres user. POSTGRES_STATEMENTS=on loads pg_stat_statements (nested
# statements too, those of functions), for benchmarks that show where the database's time goes.
set -euo pipefail
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -x "$bin/initdb" ] || { echo "PostgreSQL is not installed (apt-get install postgresql)" >&2; exit 1; }
as_owner() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
command=$1 dir=${2:-}
case "$command" in
start)
    port=$3
    rm -rf "$dir"
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres "$dir"
    as_owner "$bin/initdb" -D "$dir/data" -U postgres -A trust --no-sync -E UTF8 >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
    cat >>"$dir/data/postgresql.conf" <<CONF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
fsync = ${POSTGRES_FSYNC:-off}
full_page_writes = ${POSTGRES_FSYNC:-off}
max_connections = 200
CONF
    if [ "${POSTGRES_STATEMENTS:-off}" = on ]; then
        printf '%s\n' "shared_preload_libraries = 'pg_stat_statements'" "pg_stat_statements.track = all" >>"$dir/data/postgresql.conf"
    fi
    "$0" restart "$dir"
    echo "postgres://postgres@127.0.0.1:$port/postgres"
    ;;
restart)
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null \
        || { tail -20 "$dir/server.log" >&2; exit 1; }
    ;;
stop)
    as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
    ;;
kill)
    as_owner "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null
    ;;
stop-after)
    pid=$2 dir=$3
    setsid bash -c "tail --pid=$pid -f /dev/null; '$0' stop '$dir' 2>/dev/null; rm -rf '$dir'" \
        </dev/null >/dev/null 2>&1 &
    ;;
*)
    echo "usage: $0 start DIR PORT | stop DIR | kill DIR | restart DIR" >&2
    exit 64
    ;;
esac
