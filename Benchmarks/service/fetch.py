"""1,000 concurrent `http` tasks (a workflow in a queue allowing all at once), each fetching a
~300-byte JSON body from a local origin: time from submission to all succeeded, best of 3.
Meanwhile another connection keeps asking GET /healthz, and its latency is compared with the
same probe on an idle server: what the transfers add to the loop's answer time."""
import http.client
import json
import sys
import threading
import time

from workflows import run_workflow

host, port, origin = sys.argv[1], int(sys.argv[2]), sys.argv[3]
count = int(sys.argv[4]) if len(sys.argv) > 4 else 1000


def percentile(samples, fraction):
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] * 1000


def probe(stop, samples):
    connection = http.client.HTTPConnection(host, port)
    while not stop.is_set():
        started = time.perf_counter()
        connection.request("GET", "/healthz")
        connection.getresponse().read()
        samples.append(time.perf_counter() - started)


connection = http.client.HTTPConnection(host, port)
connection.request("PATCH", "/queues/http-bench", json.dumps({"max_concurrency": count}), {"Content-Type": "application/json"})
connection.getresponse().read()
tasks = [{"key": f"t{index}", "kind": "http", "queue": "http-bench", "params": {"url": origin}} for index in range(count)]
body = json.dumps({"tasks": tasks}).encode()
run_workflow(connection, body)  # warm-up: connections to the origin, caches

idle, busy = [], []
stop = threading.Event()
prober = threading.Thread(target=probe, args=(stop, idle))
prober.start()
time.sleep(1)
stop.set()
prober.join()

stop = threading.Event()
prober = threading.Thread(target=probe, args=(stop, busy))
prober.start()
best = min(run_workflow(connection, body) for _ in range(3))
stop.set()
prober.join()

print(f"{count} concurrent http tasks (GET ~300 B from a local origin): submitted and all succeeded in "
      f"{best:.3f} s ({count / best:.0f} transfers/s, best of 3)")
print(f"GET /healthz meanwhile: p50 {percentile(busy, 0.5):.2f} ms, p99 {percentile(busy, 0.99):.2f} ms, "
      f"max {max(busy) * 1000:.2f} ms over {len(busy)} probes; idle: p50 {percentile(idle, 0.5):.2f} ms, "
      f"p99 {percentile(idle, 0.99):.2f} ms")
