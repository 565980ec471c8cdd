"""1,000 concurrent `http` tasks (a workflow in a queue allowing all at once), each fetching a
~300-byte JSON body from a local origin: time from submission to all succeeded, best of 3.

Meanwhile a separate probe process asks GET /healthz every 2 ms on its own connection; its
latency is compared with the same probe against the idle server: what the transfers add to
the loop's answer time. Completion is watched through the queue's counts, which stay small,
so the watching itself costs the loop little."""
import http.client
import json
import select
import subprocess
import sys
import time

host, port = sys.argv[1], int(sys.argv[2])

if sys.argv[3] == "--probe":
    connection = http.client.HTTPConnection(host, port)
    samples = []
    while not select.select([sys.stdin], [], [], 0)[0]:
        started = time.perf_counter()
        connection.request("GET", "/healthz")
        connection.getresponse().read()
        samples.append(time.perf_counter() - started)
        time.sleep(0.002)
    print(json.dumps(samples))
    sys.exit(0)

origin = sys.argv[3]
count = int(sys.argv[4]) if len(sys.argv) > 4 else 1000
connection = http.client.HTTPConnection(host, port)


def call(method, path, body=None):
    connection.request(method, path, json.dumps(body) if body is not None else None, {"Content-Type": "application/json"})
    response = connection.getresponse()
    payload = response.read()
    assert response.status in (200, 201), (response.status, payload[:300])
    return json.loads(payload)


def finished():
    counts = call("GET", "/queues/http-bench")["counts"]
    return counts["succeeded"], counts["failed"] + counts["cancelled"]


def run():
    """Seconds from sending the workflow until all its tasks succeeded."""
    before, _ = finished()
    started = time.perf_counter()
    call("POST", "/workflows", {"tasks": tasks})
    while True:
        succeeded, failed = finished()
        assert failed == 0, f"{failed} http tasks failed"
        if succeeded - before == count:
            return time.perf_counter() - started
        time.sleep(0.001)


def probe(during):
    process = subprocess.Popen([sys.executable, __file__, host, str(port), "--probe"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    time.sleep(0.2)
    result = during()
    process.stdin.close()
    samples = json.loads(process.stdout.read())
    process.wait()
    return result, sorted(samples)


def percentile(samples, fraction):
    return samples[min(len(samples) - 1, int(fraction * len(samples)))] * 1000


call("PATCH", "/queues/http-bench", {"max_concurrency": count})
tasks = [{"key": f"t{index}", "kind": "http", "queue": "http-bench", "params": {"url": origin}} for index in range(count)]
run()  # warm-up
_, idle = probe(lambda: time.sleep(1))
best, busy = probe(lambda: min(run() for _ in range(3)))

print(f"{count} concurrent http tasks (GET ~300 B from a local origin): submitted and all succeeded in "
      f"{best:.3f} s ({count / best:.0f} transfers/s, best of 3)")
print(f"GET /healthz meanwhile: p50 {percentile(busy, 0.5):.2f} ms, p99 {percentile(busy, 0.99):.2f} ms, "
      f"max {busy[-1] * 1000:.2f} ms over {len(busy)} probes; idle: p50 {percentile(idle, 0.5):.2f} ms, "
      f"p99 {percentile(idle, 0.99):.2f} ms")
