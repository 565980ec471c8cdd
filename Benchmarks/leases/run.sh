#!/usr/bin/env bash
# Lease benchmark: lease + complete round trips per second with 8 concurrent lessees (wrk -t8
# -c8, each connection a worker that leases one task and completes it), against plain
# POST /tasks on the same 8 connections, in `memory` and `full` durability, measured in one
# run: the goal is a lease cycle costing no more than two submissions (ratio >= 0.5).
#   BENCH_DURATION  seconds of wrk per measurement (default 5)
#   BENCH_ROUNDS    rounds of the four measurements (default 3); medians are reported
set -euo pipefail
cd "$(dirname "$0")/../.."

duration=${BENCH_DURATION:-5}
rounds=${BENCH_ROUNDS:-3}
source Benchmarks/release-server.sh

start() { # mode round
    serve_in_background "$binary" --port 0 --durability "$1" --data-dir "$work/$1-$2" \
        --max-unfinished-tasks 10000000 --max-retained-tasks 100000 --log-level warning
}

fill() { fill_workers_queue "$url" "$1"; }

# Prints requests/s and the server's CPU time per request in microseconds (from /proc: wrk
# shares the machine, so the rate alone also counts what the client's Lua costs).
rate() { # script
    local output before after
    before=$(server_cpu_seconds)
    output=$(wrk -t8 -c8 -d"${duration}s" -s "Benchmarks/leases/$1" "$url")
    after=$(server_cpu_seconds)
    if grep -q -e "Non-2xx" -e "unexpected answer" <<<"$output"; then echo "$1: refused requests" >&2; echo "$output" >&2; exit 1; fi
    local requests
    requests=$(awk '/requests in/ {print $1}' <<<"$output")
    echo "$(awk '/Requests\/sec/ {print $2}' <<<"$output") $(python3 -c "print(($after - $before) * 1e6 / $requests)")"
}

echo "lease + complete cycles vs POST /tasks: wrk -t8 -c8 -d${duration}s, $rounds rounds"
lines=""
for round in $(seq 1 "$rounds"); do
    line=""
    for mode in memory full; do
        start "$mode" "$round"
        submits=$(rate submit.lua)
        stop "$server"
        start "$mode" "$round-leases"
        # Cycles the submissions' rate allows in the time, with room: the queue must not run dry.
        fill "$(python3 -c "print(int(min(2_000_000, max(10_000, float('${submits% *}') * $duration * 1.2)) // 1000 * 1000))")"
        requests=$(rate lease.lua)
        queued=$(curl -fsS "$url/queues/bench" | python3 -c 'import json,sys; print(json.load(sys.stdin)["counts"]["queued"])')
        stop "$server"
        [ "$queued" -gt 0 ] || { echo "the queue ran dry in $mode: fill more"; exit 1; }
        line="$line $submits $requests"
        rm -rf "$work/$mode-$round" "$work/$mode-$round-leases"
    done
    lines="$lines$line"$'\n'
done
# Each round: memory submits, CPU, lease requests, CPU; then the same for full.
printf '%s' "$lines" | python3 -c '
import statistics, sys
rounds = [list(map(float, line.split())) for line in sys.stdin if line.strip()]
median = statistics.median
for base, mode in ((0, "memory"), (4, "full")):
    submits = median(r[base] for r in rounds)
    cycles = median(r[base + 2] / 2 for r in rounds)
    ratios = [r[base + 2] / 2 / r[base] for r in rounds]
    cost = [2 * r[base + 3] / r[base + 1] for r in rounds]
    print(f"  {mode:6} POST /tasks {submits:8.0f}/s ({median(r[base + 1] for r in rounds):.1f} us server CPU each); "
          f"lease+complete {cycles:8.0f} cycles/s = {median(ratios):.2f}x submissions "
          f"(rounds: " + ", ".join(f"{x:.2f}" for x in ratios) + f"); server CPU per cycle = {median(cost):.2f} submissions")
'
