#!/usr/bin/env bash
# Replicas benchmark: POST /tasks and lease+complete cycles per second with 1, 2 and 3
# replicas of the release build (on cells) sharing one PostgreSQL
# (fsync on, synchronous_commit on), against one server on its embedded SQLite store
# (--durability full), all measured in one run on this machine. The load is the same in total: 12 connections, split evenly over the replicas
# (one wrk per replica, their rates summed). The work goes to 64 queues in turn, so it
# spreads over the cells; a replica forwards what another owns. Also printed: where the
# CPU went (replicas, PostgreSQL, everything else: wrk and the rest of the machine), and the
# CPU seconds per thousand tasks of the replicas and of PostgreSQL.
#   BENCH_DURATION  seconds of wrk per measurement (default 5)
#   BENCH_ROUNDS    rounds (default 3); medians are reported
#   BENCH_BASELINE  another build of the server (a copy of an earlier release binary): each setup
#                   is measured with it too, right before this checkout's, in every round, and
#                   reported beside it as "(baseline)": a comparison in the same conditions
#   BENCH_STATEMENTS=1  also prints (to stderr), after each measurement, PostgreSQL's statements
#                   that took the most time in it (pg_stat_statements, nested ones included)
set -euo pipefail
cd "$(dirname "$0")/../.."

duration=${BENCH_DURATION:-5}
rounds=${BENCH_ROUNDS:-3}
connections=12
source Benchmarks/release-server.sh
pg_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
chmod 755 "$work"
statements=${BENCH_STATEMENTS:-0}
database=$(POSTGRES_FSYNC=on POSTGRES_STATEMENTS=$([ "$statements" = 1 ] && echo on || echo off) bash scripts/postgres-cluster.sh start "$work/pg" "$pg_port")
# Stopped before the scratch dir it lives in goes (at_exit runs the last registered first).
at_exit 'bash scripts/postgres-cluster.sh stop "$work/pg" 2>/dev/null'
if [ "$statements" = 1 ]; then psql -q "$database" -c "CREATE EXTENSION pg_stat_statements"; fi
# A baseline built before cells were the only replication takes them from this (later builds
# have no other and ignore it).
export TASKLOOP_REPLICATION=cells
common=(--port 0 --max-unfinished-tasks 10000000 --max-retained-tasks 100000 --log-level warning)

urls=()
pids=()
start() { # BINARY sqlite | cells N, each on a database of its own
    local binary=$1
    shift
    urls=()
    pids=()
    if [ "$1" = sqlite ]; then
        serve_in_background "$binary" "${common[@]}" --durability full --data-dir "$work/sqlite-$RANDOM"
        urls+=("$url"); pids+=("$server")
        return
    fi
    local name="bench_$RANDOM$RANDOM"
    psql -q "$database" -c "CREATE DATABASE $name"
    for index in $(seq 1 "$2"); do
        serve_in_background "$binary" "${common[@]}" --database-url "${database%/*}/$name" --replica-name "r$index"
        urls+=("$url"); pids+=("$server")
    done
    wait_for_cells "$2"
}

# Until every cell is served (each replica's taskloop_cells_served adds up to the count).
wait_for_cells() { # replicas
    for _ in $(seq 1 300); do
        local total=0 each
        for target in "${urls[@]}"; do
            each=$(curl -fsS "$target/metrics" | awk '/^taskloop_cells_served / {print $2}')
            total=$((total + ${each%.*}))
        done
        [ "$total" -eq 256 ] && return
        sleep 0.1
    done
    echo "the cells were not all served" >&2
    exit 1
}

# Queues bench0 ... bench63 filled with COUNT noops in all, then opened (cells: a workflow's
# tasks share a cell, so each queue gets workflows of its own).
fill_spread() { # url count
    python3 - "$1" "$2" <<'PY'
import http.client, json, sys, urllib.parse
url, count = urllib.parse.urlparse(sys.argv[1]), int(sys.argv[2])
connection = http.client.HTTPConnection(url.hostname, url.port)
def call(method, path, body):
    connection.request(method, path, json.dumps(body), {"Content-Type": "application/json"})
    answer = connection.getresponse()
    answer.read()
    assert answer.status in (200, 201), (path, answer.status)
each = max(1, count // 64 // 250)
for queue in range(64):
    call("PATCH", f"/queues/bench{queue}", {"dispatch": "workers", "max_concurrency": 64, "paused": True})
    for _ in range(each):
        call("POST", "/workflows", {"tasks": [{"key": f"t{i}", "kind": "noop", "queue": f"bench{queue}"} for i in range(250)]})
for queue in range(64):
    call("PATCH", f"/queues/bench{queue}", {"paused": False})
PY
}

stop_all() { for pid in "${pids[@]}"; do stop "$pid"; done; }

cpu_of() { # pids...: user + system seconds
    local total=0
    for pid in "$@"; do
        [ -r "/proc/$pid/stat" ] || continue
        total=$(awk -v t="$total" -v ticks="$(getconf CLK_TCK)" '{print t + ($14 + $15) / ticks}' "/proc/$pid/stat")
    done
    echo "$total"
}
postgres_pids() { pgrep -u postgres -f "postgres" || true; }
machine_cpu() { awk '/^cpu / {print ($2 + $3 + $4 + $7 + $8) / '"$(getconf CLK_TCK)"'}' /proc/stat; }

# Runs wrk with `script` on every replica at once (connections split evenly); prints the
# summed requests/s and the CPU shares: replicas, PostgreSQL, the rest.
measure() { # script
    local each=$((connections / ${#urls[@]})) index=0 files=() wrks=()
    local before_replicas before_pg before_all
    if [ "$statements" = 1 ]; then psql -qAt "$database" -c "SELECT pg_stat_statements_reset()" >/dev/null; fi
    before_replicas=$(cpu_of "${pids[@]}"); before_pg=$(cpu_of $(postgres_pids)); before_all=$(machine_cpu)
    for target in "${urls[@]}"; do
        files+=("$work/wrk-$index")
        wrk -t1 -c"$each" -d"${duration}s" -s "$1" "$target" >"$work/wrk-$index" &
        wrks+=($!)
        index=$((index + 1))
    done
    wait "${wrks[@]}"
    local replicas pg all
    replicas=$(python3 -c "print($(cpu_of "${pids[@]}") - $before_replicas)")
    pg=$(python3 -c "print($(cpu_of $(postgres_pids)) - $before_pg)")
    all=$(python3 -c "print($(machine_cpu) - $before_all)")
    for file in "${files[@]}"; do
        if grep -q -e "Non-2xx" -e "unexpected answer" "$file"; then echo "$1: refused requests" >&2; cat "$file" >&2; exit 1; fi
    done
    if [ "$statements" = 1 ]; then
        {
            echo "$1, ${#urls[@]} replica(s): calls, ms, rows, statement"
            psql -qAt -F ' | ' "$database" -c "SELECT calls, round(total_exec_time), rows,
                left(regexp_replace(query, '\s+', ' ', 'g'), 140) FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 15"
        } >&2
    fi
    local rate
    rate=$(cat "${files[@]}" | awk '/Requests\/sec/ {sum += $2} END {print sum}')
    echo "$rate $replicas $pg $all"
}

echo "replicas on PostgreSQL vs one server on SQLite: $connections connections in all, wrk -d${duration}s, $rounds rounds"
setups=${BENCH_SETUPS:-"sqlite 1,cells 1,cells 2,cells 3"}
lines=""
for round in $(seq 1 "$rounds"); do
    IFS=, read -ra chosen <<<"$setups"
    runs=()
    for setup in "${chosen[@]}"; do
        if [ -n "${BENCH_BASELINE:-}" ]; then runs+=("baseline $setup"); fi
        runs+=("current $setup")
    done
    for run in "${runs[@]}"; do
        set -- $run
        variant=$1
        shift
        if [ "$variant" = baseline ]; then start "$BENCH_BASELINE" "$1" "$2"; else start "$binary" "$1" "$2"; fi
        count() { python3 -c "print(int(min(400_000, max(16_000, float('${1%% *}') * $duration * 1.5)) // 16_000 * 16_000))"; }
        if [ "$1" = cells ]; then
            submits=$(measure Benchmarks/replicas/submit-spread.lua)
            fill_spread "${urls[0]}" "$(count "$submits")"
            cycles=$(measure Benchmarks/replicas/lease-spread.lua)
        else
            submits=$(measure Benchmarks/leases/submit.lua)
            fill_workers_queue "${urls[0]}" "$(count "$submits")"
            cycles=$(measure Benchmarks/leases/lease.lua)
        fi
        stop_all
        lines="$lines$round $1 $2 $variant $submits $cycles"$'\n'
    done
done
printf '%s' "$lines" | python3 -c '
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in sys.stdin:
    f = line.split()
    if f: rows[(f[1], int(f[2]), f[3])].append(list(map(float, f[4:])))
median = statistics.median
reference = None
blank = ""
singles = {}
duration = float(sys.argv[1])
for key in sorted(rows, key=lambda k: (k[0] != "sqlite", k[1], k[2] != "baseline")):
    r = rows[key]
    submits, cycles = median(x[0] for x in r), median(x[4] / 2 for x in r)
    def shares(base):
        total = median(x[base + 3] for x in r) or 1
        return f"replicas {median(x[base + 1] for x in r) / total:4.0%}, PostgreSQL {median(x[base + 2] for x in r) / total:4.0%}"
    def per_thousand(base, rate):
        tasks = rate * duration / 1000 or 1
        return f"{median(x[base + 1] for x in r) / tasks:.3f} + {median(x[base + 2] for x in r) / tasks:.3f} s"
    if reference is None: reference = (submits, cycles)
    singles.setdefault((key[0], key[2]), (submits, cycles))
    single = singles[(key[0], key[2])]
    name = "SQLite, one server" if key[0] == "sqlite" else f"{key[0]}, {key[1]} replica" + ("s" if key[1] > 1 else "")
    name += " (baseline)" if key[2] == "baseline" else ""
    print(f"  {name:29} POST /tasks {submits:7.0f}/s ({submits / reference[0]:.2f}x SQLite, {submits / single[0]:.2f}x one; "
          f"CPU {shares(0)}; per 1k tasks replicas + PostgreSQL {per_thousand(0, submits)})")
    print(f"  {blank:29} lease+complete {cycles:7.0f}/s ({cycles / reference[1]:.2f}x SQLite, {cycles / single[1]:.2f}x one; "
          f"CPU {shares(4)}; per 1k cycles {per_thousand(4, cycles)})")
' "$duration"
