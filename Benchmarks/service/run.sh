#!/usr/bin/env bash
# Service benchmark: the whole `taskloop` (HTTP, routing, JSON, engine) under wrk, the server
# pinned to core 0 and wrk to core 1; then a 10,000-task workflow from submission to success,
# 200 concurrent `exec` tasks of `true`, and 1,000 concurrent `http` tasks against a local
# origin (http-bench-server on core 1) with /healthz latency measured meanwhile.
#   BENCH_DURATION     seconds per wrk scenario (default 10)
#   BENCH_CONNECTIONS  concurrent connections (default 64)
set -euo pipefail
cd "$(dirname "$0")/../.."

duration=${BENCH_DURATION:-10}
connections=${BENCH_CONNECTIONS:-64}
swift build -c release --product taskloop >/dev/null
swift build -c release --product http-bench-server >/dev/null
binary="$(swift build -c release --show-bin-path)/taskloop"
source scripts/serve-in-background.sh
serve_in_background taskset -c 1 "$(swift build -c release --show-bin-path)/http-bench-server"
origin=$url
# Finished noop tasks are kept up to 100,000 (the default), so memory stays bounded under load.
serve_in_background taskset -c 0 "$binary" --port 0 --log-level warning --max-body-bytes 16777216 \
    --max-unfinished-tasks 1000000 --allow-exec

task=$(curl -sf -X POST "$url/tasks" -H 'Content-Type: application/json' \
    -d '{"kind":"sleep","params":{"duration_ms":1000},"name":"resize-images","metadata":{"owner":"bench"}}' \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])')

run() {
    local name=$1 path=$2; shift 2
    taskset -c 1 wrk -t1 -c"$connections" -d2s "$@" "$url$path" >/dev/null
    local out; out=$(taskset -c 1 wrk -t1 -c"$connections" -d"${duration}s" --latency "$@" "$url$path")
    local rps p50 p99 errors
    rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
    p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
    p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
    errors=$(grep -E 'Non-2xx|Socket errors' <<<"$out" | tr -s ' ' | paste -sd';' - || true)
    printf '%-34s %12s %10s %10s   %s\n' "$name" "$rps" "$p50" "$p99" "$errors"
}

echo "taskloop, wrk -t1 -c$connections -d${duration}s, server on core 0, wrk on core 1"
printf '%-34s %12s %10s %10s\n' scenario "requests/s" p50 p99
run "GET /tasks/{id} (~700 B JSON)" "/tasks/$task"
run "POST /tasks (noop, 201)" /tasks -s Benchmarks/service/noop.lua
echo "server RSS after both: $(awk '/VmRSS/ {print $2}' "/proc/$server/status") KiB"
host_port=${url#http://}
taskset -c 1 python3 Benchmarks/service/workflow.py "${host_port%:*}" "${host_port##*:}" 10000
taskset -c 1 python3 Benchmarks/service/exec.py "${host_port%:*}" "${host_port##*:}" 200
taskset -c 1 python3 Benchmarks/service/fetch.py "${host_port%:*}" "${host_port##*:}" "$origin/task" 1000
