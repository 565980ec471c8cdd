#!/usr/bin/env bash
# Dashboard benchmark: a release server (`--durability memory`) holding 10,000 tasks (queued in
# a paused queue, so the table holds still), and headless Chromium measuring the page (see
# measure.py: first paint against a one-file reference, first rows, scrolling against a table
# with every row in the document). BENCH_ROUNDS (default 5) loads per figure. Chromium and its
# driver come with `make bench-deps`, as wrk does.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${BENCH_ROUNDS:-5}
source Benchmarks/release-server.sh
VENV=$(scripts/python-tools.sh)
serve_in_background "$binary" --port 0 --durability memory --log-level warning
curl -sf -X PATCH -H 'Content-Type: application/json' -d '{"paused":true}' "$url/queues/default" >/dev/null
python3 - "$url" <<'PY'
import json, sys, urllib.request
url = sys.argv[1]
for batch in range(10):
    tasks = [{"key": f"t{i}", "kind": "sleep", "name": f"render frame {batch * 1000 + i}",
              "params": {"duration_ms": 1000}} for i in range(1000)]
    request = urllib.request.Request(url + "/workflows", data=json.dumps({"name": f"batch {batch}", "tasks": tasks}).encode(),
                                     headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request).read()
PY
"$VENV/bin/python" Benchmarks/ui/measure.py "$url" "$rounds"
