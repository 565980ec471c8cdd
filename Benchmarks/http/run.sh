#!/usr/bin/env bash
# HTTP benchmark: wrk against TaskloopHTTP, the server pinned to core 0 and wrk to core 1.
#   BENCH_DURATION   seconds per scenario (default 10; 600 for the memory-flatness run)
#   BENCH_CONNECTIONS  concurrent connections (default 64)
set -euo pipefail
cd "$(dirname "$0")/../.."

duration=${BENCH_DURATION:-10}
connections=${BENCH_CONNECTIONS:-64}
swift build -c release --product http-bench-server >/dev/null
binary="$(swift build -c release --show-bin-path)/http-bench-server"
source scripts/serve-in-background.sh
serve_in_background taskset -c 0 "$binary"

rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$server/status"; }

run() {
    local name=$1 path=$2; shift 2
    taskset -c 1 wrk -t1 -c"$connections" -d2s "$@" "$url$path" >/dev/null   # warm-up
    local samples; samples=$(mktemp)
    # RSS ten times across the run: flat means no growth under sustained load.
    ( for _ in $(seq 1 10); do rss_kib >>"$samples"; sleep "$(awk "BEGIN {print $duration / 10}")"; done ) &
    local sampler=$!
    local out; out=$(taskset -c 1 wrk -t1 -c"$connections" -d"${duration}s" --latency "$@" "$url$path")
    wait $sampler
    rss_kib >>"$samples"
    local rps p50 p99 errors rss
    rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
    p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
    p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
    errors=$(grep -E 'Non-2xx|Socket errors' <<<"$out" | tr -s ' ' | paste -sd';' - || true)
    rss=$(awk 'NR == 1 {first = $1} {if ($1 > max) max = $1} END {printf "%d -> %d (max %d)", first, $1, max}' "$samples")
    rm -f "$samples"
    printf '%-34s %12s %10s %10s   %s KiB %s\n' "$name" "$rps" "$p50" "$p99" "$rss" "$errors"
}

echo "TaskloopHTTP, wrk -t1 -c$connections -d${duration}s, server on core 0, wrk on core 1"
printf '%-34s %12s %10s %10s   %s\n' scenario "requests/s" p50 p99 "server RSS first -> last (max)"
run "GET /task (~300 B JSON)" /task
run "POST /tasks (150 B JSON in, 201)" /tasks -s Benchmarks/http/post.lua
