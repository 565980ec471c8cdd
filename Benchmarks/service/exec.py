"""200 concurrent `exec` tasks of `true` (a workflow in a queue allowing all 200 at once):
time from submission to all succeeded, best of 3."""
import http.client
import json
import sys

from workflows import run_workflow

host, port = sys.argv[1], int(sys.argv[2])
count = int(sys.argv[3]) if len(sys.argv) > 3 else 200
connection = http.client.HTTPConnection(host, port)
connection.request("PATCH", "/queues/exec-bench", json.dumps({"max_concurrency": count}), {"Content-Type": "application/json"})
connection.getresponse().read()
tasks = [{"key": f"t{index}", "kind": "exec", "queue": "exec-bench", "params": {"argv": ["true"]}} for index in range(count)]
body = json.dumps({"tasks": tasks}).encode()
best = min(run_workflow(connection, body) for _ in range(3))
print(f"{count} concurrent exec tasks of `true`: submitted and all succeeded in {best:.3f} s "
      f"({count / best:.0f} runs/s, best of 3)")
