#!/usr/bin/env bash
# Exec benchmark (issue 27's goal): BENCH_EXEC_COUNT (200) concurrent `exec` tasks of `true`,
# time from submission to all succeeded (best of 3), on a fresh server and then on the same
# server once it retains BENCH_EXEC_RETAINED (100000) finished noop tasks. A spawn that copies
# the process (fork) slows with the server's size; the ratio fresh/retained is the figure
# (goal: at least 0.9). Release build, in memory, one server on core 0, the client on core 1.
#   BENCH_EXEC_ISOLATION  --exec-isolation (default auto: a cgroup per attempt where it can)
set -euo pipefail
cd "$(dirname "$0")/../.."

count=${BENCH_EXEC_COUNT:-200}
retained=${BENCH_EXEC_RETAINED:-100000}
source Benchmarks/release-server.sh
serve_in_background taskset -c 0 "$binary" --port 0 --durability memory --allow-exec --log-level warning \
    --exec-isolation "${BENCH_EXEC_ISOLATION:-auto}" \
    --max-body-bytes 16777216 --max-unfinished-tasks 10000000 --max-retained-tasks $((retained * 2))
curl -fsS "$url/healthz" | python3 -c 'import json, sys; print("process isolation:", json.load(sys.stdin).get("process_isolation"))' >&2
host_port=${url#http://}
host=${host_port%:*} port=${host_port##*:}
exec_seconds() {
    local line; line=$(taskset -c 1 python3 Benchmarks/service/exec.py "$host" "$port" "$count")
    echo "$line" >&2
    sed -E 's/.* in ([0-9.]+) s .*/\1/' <<<"$line"
}
fresh=$(exec_seconds)
taskset -c 1 python3 - "$host" "$port" "$retained" <<'PY'
import http.client, json, sys
sys.path.insert(0, "Benchmarks/service")
from workflows import run_workflow
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
connection = http.client.HTTPConnection(host, port)
body = json.dumps({"tasks": [{"key": f"t{i}", "kind": "noop"} for i in range(1000)]}).encode()
for _ in range(count // 1000):
    run_workflow(connection, body)
PY
echo "server RSS with $retained retained tasks: $(awk '/VmRSS/ {print $2}' "/proc/$server/status") KiB"
loaded=$(exec_seconds)
python3 -c "print(f'fresh {$fresh:.3f} s, with $retained retained tasks {$loaded:.3f} s: ratio {$fresh / $loaded:.2f} (goal >= 0.9)')"
