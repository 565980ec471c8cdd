"""The timer figures of Benchmarks/timers/run.sh, against a running server.

  lag URL COUNT SPREAD_S         COUNT noops with run_at spread evenly over SPREAD_S seconds
                                 (starting 3 s after they are all in): each one's start minus
                                 its time, as p50/p99/max in ms; beside it, the same for COUNT
                                 noops submitted to run at once (created -> started), the
                                 reference: what a start costs without a timer.
  far URL COUNT                  COUNT noops due in an hour, for the idle measurement.
  schedules URL COUNT            COUNT schedules firing every second (noop runs, overlap allow).
  fired URL SECONDS              runs fired per second over SECONDS (taskloop_schedule_runs_fired_total).
  rate URL PER_SECOND BURST SECONDS
                                 a queue limited to PER_SECOND (BURST) with more noops than it
                                 can start in SECONDS; the starts counted over SECONDS after a
                                 5 s settling, as a rate and its error against the limit.
"""
import calendar
import http.client
import json
import sys
import time
import urllib.parse


def connect(url):
    parts = urllib.parse.urlparse(url)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)


def call(connection, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    connection.request(method, path, data, {"Content-Type": "application/json"} if data else {})
    answer = connection.getresponse()
    text = answer.read()
    if answer.status >= 300:
        raise SystemExit(f"{method} {path}: {answer.status} {text[:300]!r}")
    return json.loads(text) if text else None


def rfc3339(ms):
    seconds, millis = divmod(int(ms), 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def parse(text):
    """Milliseconds of the API's `2026-11-27T19:55:33.837Z`."""
    return calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")) * 1000 + int(text[20:23])


def submit(connection, queue, times):
    """Workflows of 1,000 independent noops; `times`: each one's run_at in ms, or None."""
    ids = []
    for first in range(0, len(times), 1000):
        tasks = []
        for index, at in enumerate(times[first:first + 1000]):
            task = {"key": f"t{index}", "kind": "noop", "queue": queue}
            if at is not None:
                task["run_at"] = rfc3339(at)
            tasks.append(task)
        ids.append(call(connection, "POST", "/workflows", {"tasks": tasks})["id"])
    return ids


def wait_done(connection, ids, deadline_s):
    deadline = time.time() + deadline_s
    tasks = []
    for workflow in ids:
        while True:
            answer = call(connection, "GET", f"/workflows/{workflow}")
            if answer["state"] in ("succeeded", "failed", "cancelled"):
                tasks.extend(answer["tasks"])
                break
            if time.time() > deadline:
                raise SystemExit(f"workflow {workflow} still {answer['state']}")
            time.sleep(0.05)
    return tasks


def percentiles(values):
    values = sorted(values)
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]
    return pick(0.5), pick(0.99), values[-1]


def lag(url, count, spread_s):
    connection = connect(url)
    now = time.time() * 1000
    # Submission takes a while: the times start 3 s after an estimate of its end.
    start = now + 3000 + count * 0.05
    times = [start + spread_s * 1000 * index / count for index in range(count)]
    ids = submit(connection, "timers", times)
    submitted = time.time() * 1000
    if submitted > start:
        raise SystemExit(f"submitting took until {submitted - start:.0f} ms past the first time: lower the count")
    tasks = wait_done(connection, ids, spread_s + 60)
    lags = [parse(t["started_at"]) - parse(t["scheduled_for"]) for t in tasks]
    reference_ids = submit(connection, "reference", [None] * count)
    reference = [parse(t["started_at"]) - parse(t["created_at"]) for t in wait_done(connection, reference_ids, 60)]
    p50, p99, most = percentiles(lags)
    r50, r99, rmost = percentiles(reference)
    print(f"  {count} run_at over {spread_s} s: start lag p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {most:.0f} ms "
          f"(goals 10, 50); reference, {count} started at once: p50 {r50:.0f} ms, p99 {r99:.0f} ms, max {rmost:.0f} ms")


def far(url, count):
    submit(connect(url), "far", [time.time() * 1000 + 3_600_000] * count)


def schedules(url, count):
    connection = connect(url)
    for index in range(count):
        call(connection, "POST", "/schedules", {"name": f"s{index}", "cron": "* * * * * *", "overlap": "allow",
                                                 "task": {"kind": "noop", "queue": f"ticks{index % 16}"}})


def fired(url, seconds):
    """Runs fired per second over `seconds`, from the metric read at both ends."""
    connection = connect(url)

    def count():
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("taskloop_schedule_runs_fired_total"))

    first, began = count(), time.time()
    time.sleep(seconds)
    last = count()
    print(f"{(last - first) / (time.time() - began):.0f}")


def rate(url, per_second, burst, seconds):
    connection = connect(url)
    call(connection, "PATCH", "/queues/limited", {"rate_limit": {"per_second": per_second, "burst": burst}})
    count = int(per_second * (seconds + 10) * 1.2)
    submit(connection, "limited", [None] * count)
    time.sleep(5)
    first = call(connection, "GET", "/queues/limited")["counts"]
    began = time.time()
    time.sleep(seconds)
    last = call(connection, "GET", "/queues/limited")["counts"]
    elapsed = time.time() - began
    started = last["succeeded"] - first["succeeded"]
    measured = started / elapsed
    print(f"  rate limit {per_second}/s, burst {burst}, over {elapsed:.1f} s: {measured:.2f}/s, "
          f"{100 * (measured - per_second) / per_second:+.2f}% (goal within 2%)")


if __name__ == "__main__":
    command, url, *rest = sys.argv[1:]
    {"lag": lambda: lag(url, int(rest[0]), float(rest[1])), "far": lambda: far(url, int(rest[0])),
     "schedules": lambda: schedules(url, int(rest[0])), "fired": lambda: fired(url, float(rest[0])),
     "rate": lambda: rate(url, float(rest[0]), int(rest[1]), float(rest[2]))}[command]()
