#!/usr/bin/env bash
# Batch benchmark, in `memory` and `full` durability, each beside its reference measured in
# the same run on the same server build:
#   POST /tasks/batch of 1,000 noops (wrk -t2 -c2): tasks accepted per second, against single
#   POST /tasks (wrk -t8 -c8, Benchmarks/leases/submit.lua). Goal in `full`: >= 300,000 tasks/s.
#   lease 100 + POST /tasks/reports of 100 (wrk -t8 -c8, each connection a worker): tasks
#   finished per second, against lease + complete of one task (Benchmarks/leases/lease.lua).
#   Goals: >= 100,000 tasks/s in memory, >= 50,000 in full.
#   the reference worker: BENCH_WORKERS (4) `taskloop worker` processes of 100 slots drain
#   BENCH_WORKER_TASKS (100,000) noops: tasks/s from the queue's opening to its last task's
#   end, reporting in batches (the defaults) against one call per report
#   (--report-linger-ms 0 --max-report-batch 1, the worker before batches).
# The figures are printed, not asserted.
#   BENCH_DURATION  seconds of wrk per measurement (default 5)
#   BENCH_ROUNDS    rounds of the measurements (default 3); medians are reported
#   BENCH_ONLY_WORKERS=1  only the reference worker's figures
set -euo pipefail
cd "$(dirname "$0")/../.."

duration=${BENCH_DURATION:-5}
rounds=${BENCH_ROUNDS:-3}
workers=${BENCH_WORKERS:-4}
worker_tasks=${BENCH_WORKER_TASKS:-100000}
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

# Tasks/s of $workers reference workers with FLAGS draining $worker_tasks noops from $url.
drain() { # flags...
    fill_workers_queue "$url" "$worker_tasks"
    curl -fsS -X PATCH "$url/queues/bench" -H 'Content-Type: application/json' \
        -d '{"paused":true,"max_concurrency":1000}' >/dev/null
    local pids=()
    for index in $(seq 1 "$workers"); do
        "$binary" worker --server "$url" --queue bench --concurrency 100 --name "bench-$index" \
            --log-level warning "$@" >>"$work/workers.log" 2>&1 &
        pids+=($!)
    done
    # drain runs in a subshell of its own: workers left by a failure end with it.
    trap 'kill -TERM "${pids[@]}" 2>/dev/null || true' EXIT
    python3 - "$url" "$worker_tasks" <<'PY'
import json, sys, time, urllib.request
url, count = sys.argv[1], int(sys.argv[2])
def call(method, body=None):
    request = urllib.request.Request(url + "/queues/bench", method=method, data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as answer:
        return json.load(answer)
started = time.monotonic()
call("PATCH", b'{"paused":false}')
deadline = started + 600
while call("GET")["counts"]["succeeded"] < count:
    if time.monotonic() > deadline:
        sys.exit("the workers did not drain the queue in 600 s")
    time.sleep(0.02)
print(count / (time.monotonic() - started))
PY
    for pid in "${pids[@]}"; do stop "$pid"; done
}

if [ "${BENCH_ONLY_WORKERS:-}" != 1 ]; then
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
fi

echo "reference workers: $workers x 100 slots, $worker_tasks noops, $rounds rounds"
lines=""
for round in $(seq 1 "$rounds"); do
    line=""
    for mode in memory full; do
        start "$mode" "$round-workers-batched"
        batched=$(drain)
        stop "$server"
        start "$mode" "$round-workers-single"
        single=$(drain --report-linger-ms 0 --max-report-batch 1)
        stop "$server"
        line="$line $batched $single"
        rm -rf "$work/$mode-$round"-*
    done
    lines="$lines$line"$'\n'
done
printf '%s' "$lines" | python3 -c '
import statistics, sys
rounds = [list(map(float, line.split())) for line in sys.stdin if line.strip()]
for base, mode in ((0, "memory"), (2, "full")):
    batched = statistics.median(r[base] for r in rounds)
    single = statistics.median(r[base + 1] for r in rounds)
    print(f"  {mode:6} workers, batched reports {batched:10,.0f} tasks/s vs a call per report {single:8,.0f}/s = {batched / single:.1f}x")
'
