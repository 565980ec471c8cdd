#!/usr/bin/env bash
# Restart benchmark (issue 27): a paused queue filled with BENCH_RESTART_TASKS (1000000) queued
# noops (workflows of 10,000), the server stopped, and the start that restores them timed from
# exec to `listening on` (and the CPU time it took: the wall time on a loaded machine says
# little); then the restored server's RSS, for what a queued task costs it.
#   BENCH_RESTART_TASKS       tasks to restore (default 1000000)
#   BENCH_RESTART_DURABILITY  --durability of both starts (default full)
set -euo pipefail
cd "$(dirname "$0")/../.."

tasks=${BENCH_RESTART_TASKS:-1000000}
durability=${BENCH_RESTART_DURABILITY:-full}
source Benchmarks/release-server.sh
# A million tasks take seconds to restore, more on a loaded machine.
serve_in_background_wait_seconds=300

serve_in_background "$binary" --port 0 --durability "$durability" --data-dir "$work/restart" \
    --max-unfinished-tasks 10000000 --max-body-bytes 16777216 --log-level warning
curl -sf -X PATCH "$url/queues/held" -H 'Content-Type: application/json' -d '{"paused":true}' >/dev/null
python3 - "$url" "$tasks" <<'PY'
import http.client, json, sys
url, count = sys.argv[1], int(sys.argv[2])
host, port = url[len("http://"):].split(":")
connection = http.client.HTTPConnection(host, int(port))
task = {"kind": "noop", "queue": "held", "name": "restored", "metadata": {"owner": "bench"}}
for start in range(0, count, 10000):
    tasks = [dict(task, key=f"t{index}") for index in range(start, min(count, start + 10000))]
    connection.request("POST", "/workflows", json.dumps({"tasks": tasks}), {"Content-Type": "application/json"})
    answer = connection.getresponse()
    answer.read()
    assert answer.status == 201, answer.status
PY
stop "$server"
started=$(date +%s.%N)
serve_in_background "$binary" --port 0 --durability "$durability" --data-dir "$work/restart" \
    --max-unfinished-tasks 10000000 --log-level warning
elapsed=$(awk "BEGIN {print $(date +%s.%N) - $started}")
cpu=$(server_cpu_seconds)
rss=$(awk '/VmRSS/ {print $2}' "/proc/$server/status")
queued=$(curl -sf "$url/queues/held" | python3 -c 'import json, sys; print(json.load(sys.stdin)["counts"]["queued"])')
stop "$server"
printf 'restart with %d queued tasks: listening after %.2f s (%.2f s per million, %s; %.2f s of CPU); RSS then %d KiB, %.0f bytes per task\n' \
    "$queued" "$elapsed" "$(awk "BEGIN {print $elapsed * 1000000 / $queued}")" "$durability" "$cpu" "$rss" \
    "$(awk "BEGIN {print $rss * 1024 / $queued}")"
