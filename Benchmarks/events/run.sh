#!/usr/bin/env bash
# Event stream benchmark (`--durability memory`, so the figures are the stream's, not the disk's):
# - fan-out: wrk -t1 -c8 submits noop tasks (POST /tasks) for BENCH_DURATION seconds while 1,
#   100 and 1,000 streams (GET /events?types=task.state, one Python selector reading them all)
#   are attached: task.state events delivered per second, in all and per stream;
# - cost: the POST /tasks rate and the server's CPU per request with no stream attached and
#   with 100, measured alternately in the same run (BENCH_ROUNDS rounds, medians).
set -euo pipefail
cd "$(dirname "$0")/../.."
duration=${BENCH_DURATION:-5}
rounds=${BENCH_ROUNDS:-3}
source Benchmarks/release-server.sh

# Prints: requests/s, server CPU microseconds per request, events delivered (all, slowest, fastest).
measure() { # subscribers
    serve_in_background "$binary" --port 0 --durability memory --max-unfinished-tasks 10000000 --log-level warning
    local events_pid="" events_out
    events_out=$(mktemp)
    if [ "$1" -gt 0 ]; then
        python3 Benchmarks/events/subscribers.py "$url" "$1" >"$events_out" &
        events_pid=$!
        for _ in $(seq 1 200); do grep -q ready "$events_out" && break; sleep 0.05; done
    fi
    local before after output
    before=$(server_cpu_seconds)
    output=$(wrk -t1 -c8 -d"${duration}s" -s Benchmarks/service/noop.lua "$url/tasks")
    after=$(server_cpu_seconds)
    local delivered="0 0 0"
    if [ -n "$events_pid" ]; then
        sleep 1 # what is in flight arrives
        kill -TERM "$events_pid"
        wait "$events_pid" || true
        delivered=$(tail -1 "$events_out")
    fi
    rm -f "$events_out"
    stop "$server"
    local requests
    requests=$(awk '/requests in/ {print $1}' <<<"$output")
    echo "$(awk '/Requests\/sec/ {print $2}' <<<"$output") $(python3 -c "print(($after - $before) * 1e6 / $requests)") $delivered"
}

echo "fan-out: noop submissions (wrk -t1 -c8, ${duration}s) with streams of task.state attached"
for subscribers in 1 100 1000; do
    read -r rate _ all slowest fastest <<<"$(measure "$subscribers")"
    python3 -c "
d, n = $duration, $subscribers
print(f'  {n:5} streams: {$all / d:10.0f} events/s delivered, {$all / d / n:8.0f}/s per stream '
      f'(slowest {$slowest / d:.0f}/s, fastest {$fastest / d:.0f}/s); {$rate:.0f} POST /tasks/s')"
done

echo "cost: POST /tasks with no stream vs 100 streams attached, $rounds rounds"
lines=""
cut=0
for _ in $(seq 1 "$rounds"); do
    read -r rate0 cpu0 _ <<<"$(measure 0)"
    read -r rate100 cpu100 _ slowest fastest <<<"$(measure 100)"
    lines="$lines$rate0 $cpu0 $rate100 $cpu100"$'\n'
    # A reader that fell behind was disconnected (--event-client-buffer-bytes): from then on
    # the server wrote to fewer streams, and the round understates the cost.
    if [ "$slowest" != "$fastest" ]; then cut=$((cut + 1)); fi
done
[ "$cut" -eq 0 ] || echo "  warning: in $cut of $rounds rounds the reader fell behind and streams were disconnected (slowest stream got fewer events than the fastest): those rounds understate the cost"
printf '%s' "$lines" | python3 -c '
import statistics, sys
rounds = [list(map(float, line.split())) for line in sys.stdin if line.strip()]
m = lambda i: statistics.median(r[i] for r in rounds)
print(f"  no stream: {m(0):8.0f} req/s, {m(1):.1f} us server CPU each")
print(f"  100 streams: {m(2):8.0f} req/s, {m(3):.1f} us server CPU each: +{m(3) - m(1):.1f} us per request "
      f"({statistics.median(r[3] / r[1] for r in rounds):.2f}x), {statistics.median(r[2] / r[0] for r in rounds):.2f}x the rate")
'
