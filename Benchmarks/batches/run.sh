#!/usr/bin/env bash
# Batch benchmark, in `memory` and `full` durability, each beside its reference measured in
# the same run on the same server build:
#   POST /tasks/batch of 1,000 noops (wrk -t2 -c2): tasks accepted per second, against single
#   POST /tasks (wrk -t8 -c8, Benchmarks/leases/submit.lua). Goal in `full`: >= 300,000 tasks/s.
#   lease 100 + POST /tasks/reports of 100 (wrk -t8 -c8, each connection a worker): tasks
#   finished per second, against lease + complete of one task (Benchmarks/leases/lease.lua).
#   Goals: >= 100,000 tasks/s in memory, >= 50,000 in full.
# The figures are printed, not asserted.
#   BENCH_DURATION  seconds of wrk per measurement (default 5)
#   BENCH_ROUNDS    rounds of the measurements (default 3); medians are reported
set -euo pipefail
cd "$(dirname "$0")/../.."

duration=${BENCH_DURATION:-5}
rounds=${BENCH_ROUNDS:-3}
source Benchmarks/release-server.sh

start() { # mode name
    serve_in_background "$binary" --port 0 --durability "$1" --data-dir "$work/$1-$2" \
        --max-unfinished-tasks 10000000 --max-retained-tasks 100000 --log-level warning
}

# Prints wrk's requests/s for SCRIPT with THREADS threads and connections; fails on a refusal.
rate() { # script threads
    local output
    output=$(wrk -t"$2" -c"$2" -d"${duration}s" -s "$1" "$url")
    if grep -q -e "Non-2xx" -e "unexpected answer" -e "short lease" <<<"$output"; then
        echo "$1: refused requests or a queue run dry" >&2; echo "$output" | head -20 >&2; exit 1
    fi
    awk '/Requests\/sec/ {print $2}' <<<"$output"
}

echo "batches: wrk -d${duration}s, $rounds rounds"
lines=""
for round in $(seq 1 "$rounds"); do
    line=""
    for mode in memory full; do
        start "$mode" "$round-single"
        single=$(rate Benchmarks/leases/submit.lua 8)
        stop "$server"
        start "$mode" "$round-batch"
        batches=$(rate Benchmarks/batches/batch.lua 2)
        stop "$server"
        # One lease+complete cycle per 2 requests; one lease+reports cycle finishes 100 tasks.
        start "$mode" "$round-lease"
        fill_workers_queue "$url" "$(python3 -c "print(int(min(1_000_000, max(20_000, float('$single') * $duration)) // 1000 * 1000))")"
        cycles=$(rate Benchmarks/leases/lease.lua 8)
        stop "$server"
        start "$mode" "$round-reports"
        fill_workers_queue "$url" "$(( duration * 120000 ))"
        # 8 workers holding 100 each: the queue lets that many run (fill_workers_queue sets 64).
        curl -fsS -X PATCH "$url/queues/bench" -H 'Content-Type: application/json' -d '{"max_concurrency":1000}' >/dev/null
        reports=$(rate Benchmarks/batches/reports.lua 8)
        stop "$server"
        line="$line $single $batches $cycles $reports"
        rm -rf "$work/$mode-$round"-*
    done
    lines="$lines$line"$'\n'
done
printf '%s' "$lines" | python3 -c '
import statistics, sys
rounds = [list(map(float, line.split())) for line in sys.stdin if line.strip()]
median = statistics.median
for base, mode, goals in ((0, "memory", (None, 100_000)), (4, "full", (300_000, 50_000))):
    single = median(r[base] for r in rounds)
    batched = median(r[base + 1] * 1000 for r in rounds)
    cycles = median(r[base + 2] / 2 for r in rounds)
    reported = median(r[base + 3] / 2 * 100 for r in rounds)
    goal = lambda g: f" (goal {g:,})" if g else ""
    print(f"  {mode:6} POST /tasks/batch {batched:10,.0f} tasks/s{goal(goals[0])} vs POST /tasks {single:8,.0f}/s = {batched / single:.1f}x")
    print(f"  {mode:6} lease 100 + reports {reported:10,.0f} tasks/s{goal(goals[1])} vs lease + complete {cycles:8,.0f}/s = {reported / cycles:.1f}x")
'
