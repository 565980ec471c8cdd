#!/usr/bin/env bash
# Event stream benchmark (`--durability memory`, so the figures are the stream's, not the disk's):
# - fan-out: wrk -t1 -c8 submits noop tasks (POST /tasks) for BENCH_DURATION seconds while 1,
#   100 and 1,000 streams (GET /events?types=task.state, read by reader.c) are attached:
#   task.state events delivered per second, in all and per stream;
# - cost: the POST /tasks rate and the server's CPU per request with no stream attached and
#   with 100, measured alternately in the same run (BENCH_ROUNDS rounds, medians).
# Every measurement with streams checks that each stream got every event of every task exactly
# once, in order, and was never disconnected; if one was not, the script says which round and
# fails without printing a figure: a stream disconnected for falling behind is one the server no
# longer writes to, and a figure measured so understates the cost.
set -euo pipefail
cd "$(dirname "$0")/../.."
duration=${BENCH_DURATION:-5}
rounds=${BENCH_ROUNDS:-3}
source Benchmarks/release-server.sh
reader=.build/bench-events/reader
if [ ! -x "$reader" ] || [ Benchmarks/events/reader.c -nt "$reader" ]; then
    mkdir -p "$(dirname "$reader")"
    ${CC:-cc} -O2 -o "$reader" Benchmarks/events/reader.c
fi

# How many noop tasks the server at $url has been given.
submitted() {
    curl -fsS "$url/metrics" | awk '/^taskloop_tasks_submitted_total\{kind="noop"\}/ {print $2}'
}

# Waits (at most 30 s) until no task at $url is pending, queued or running: tasks only move on,
# so once each list was empty in turn, every task has ended and published its events.
wait_for_tasks_to_end() {
    local state
    for state in pending queued running; do
        for attempt in $(seq 1 300); do
            curl -fsS "$url/tasks?state=$state&limit=1" | grep -q '"tasks":\[\]' && continue 2
            sleep 0.1
        done
        echo "tasks still $state 30 s after the load ended" >&2
        exit 1
    done
}

# Prints: requests/s, server CPU microseconds per request, events delivered (all, slowest,
# fastest). With streams, fails unless each got all 3 task.state events of every task.
measure() { # streams
    serve_in_background "$binary" --port 0 --durability memory --max-unfinished-tasks 10000000 --log-level warning
    # Not under $work: each measure runs in a subshell, whose exit removes $work.
    local reader_pid="" scratch to_reader
    scratch=$(mktemp -d)
    local reader_out=$scratch/reader.out fifo=$scratch/to-reader
    if [ "$1" -gt 0 ]; then
        mkfifo "$fifo"
        local port=${url##*:}
        "$reader" 127.0.0.1 "$port" "/events?types=task.state" "$1" <"$fifo" >"$reader_out" &
        reader_pid=$!
        exec {to_reader}>"$fifo"
        for _ in $(seq 1 600); do grep -qs ready "$reader_out" && break; sleep 0.05; done
        grep -qs ready "$reader_out" || { echo "the $1 streams did not all start" >&2; exit 1; }
    fi
    local before after output
    before=$(server_cpu_seconds)
    output=$(wrk -t1 -c8 -d"${duration}s" -s Benchmarks/service/noop.lua "$url/tasks")
    after=$(server_cpu_seconds)
    local delivered="0 0 0"
    if [ -n "$reader_pid" ]; then
        wait_for_tasks_to_end
        local tasks total slowest fastest cut disordered differing
        tasks=$(submitted)
        echo "$((3 * tasks))" >&"$to_reader"
        exec {to_reader}>&-
        wait "$reader_pid"
        read -r total slowest fastest cut disordered differing < <(tail -1 "$reader_out")
        if [ "$slowest" != "$((3 * tasks))" ] || [ "$fastest" != "$((3 * tasks))" ] || [ "$cut" != 0 ] \
            || [ "$disordered" != 0 ] || [ "$differing" != 0 ]; then
            echo "FAILED: $1 streams, $tasks tasks: each stream should have got $((3 * tasks)) events; the slowest got" \
                "$slowest, the fastest $fastest; $cut streams were disconnected, $disordered got ids out of order," \
                "$differing got other events than the first stream" >&2
            exit 1
        fi
        delivered="$total $slowest $fastest"
    fi
    rm -rf "$scratch"
    stop "$server"
    local requests
    requests=$(awk '/requests in/ {print $1}' <<<"$output")
    echo "$(awk '/Requests\/sec/ {print $2}' <<<"$output") $(python3 -c "print(($after - $before) * 1e6 / $requests)") $delivered"
}

echo "fan-out: noop submissions (wrk -t1 -c8, ${duration}s) with streams of task.state attached"
for streams in 1 100 1000; do
    line=$(measure "$streams")
    read -r rate _ all slowest fastest <<<"$line"
    python3 -c "
d, n = $duration, $streams
print(f'  {n:5} streams: {$all / d:10.0f} events/s delivered, {$all / d / n:8.0f}/s per stream '
      f'(slowest {$slowest / d:.0f}/s, fastest {$fastest / d:.0f}/s); {$rate:.0f} POST /tasks/s')"
done

echo "cost: POST /tasks with no stream vs 100 streams attached, $rounds rounds"
lines=""
for _ in $(seq 1 "$rounds"); do
    line0=$(measure 0)
    line100=$(measure 100)
    read -r rate0 cpu0 _ <<<"$line0"
    read -r rate100 cpu100 _ <<<"$line100"
    lines="$lines$rate0 $cpu0 $rate100 $cpu100"$'\n'
done
printf '%s' "$lines" | python3 -c '
import statistics, sys
rounds = [list(map(float, line.split())) for line in sys.stdin if line.strip()]
m = lambda i: statistics.median(r[i] for r in rounds)
print(f"  no stream: {m(0):8.0f} req/s, {m(1):.1f} us server CPU each")
print(f"  100 streams: {m(2):8.0f} req/s, {m(3):.1f} us server CPU each: +{m(3) - m(1):.1f} us per request "
      f"({statistics.median(r[3] / r[1] for r in rounds):.2f}x), {statistics.median(r[2] / r[0] for r in rounds):.2f}x the rate")
'

# The bytes of one task.progress event (an external task's report with a message) on a stream
# with the whole task, the default, and on one with ?progress_body=brief.
echo "task.progress event size: whole task against ?progress_body=brief"
(
    serve_in_background "$binary" --port 0 --durability memory --log-level warning
    python3 - "$url" <<'PY'
import http.client, json, socket, sys, urllib.parse
url = urllib.parse.urlparse(sys.argv[1])
def open_stream(query):
    sock = socket.create_connection((url.hostname, url.port))
    sock.sendall(f"GET /events?types=task.progress{query} HTTP/1.0\r\n\r\n".encode())
    return sock
def data_line(sock):
    buffer = b""
    while b"\ndata: " not in buffer or not buffer.split(b"\ndata: ", 1)[1].count(b"\n"):
        chunk = sock.recv(65536)
        assert chunk, "the stream ended"
        buffer += chunk
    return buffer.split(b"\ndata: ", 1)[1].split(b"\n", 1)[0]
whole, brief = open_stream(""), open_stream("&progress_body=brief")
api = http.client.HTTPConnection(url.hostname, url.port)
def call(method, path, body):
    api.request(method, path, json.dumps(body), {"Content-Type": "application/json"})
    answer = api.getresponse()
    text = answer.read()
    assert answer.status in (200, 201), (answer.status, text)
    return json.loads(text)
task = call("POST", "/tasks", {"kind": "external", "name": "resize photos", "metadata": {"album": "summer"}})
call("POST", f"/tasks/{task['id']}/progress", {"fraction": 0.5, "message": "50 of 100 photos"})
full, short = len(data_line(whole)), len(data_line(brief))
print(f"  task.progress data: {full} B whole, {short} B brief ({short / full:.2f}x)")
PY
)
