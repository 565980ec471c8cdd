# Sourced by the benchmarks that time the built server: builds the release binary ($binary),
# makes a scratch dir ($work, removed at exit with every server started), and gives `stop PID`
# (SIGTERM, then wait) and `server_cpu_seconds` (user + system CPU of $server so far).
# BENCH_BINARY names another build to time instead (an A/B against an older commit's release
# build); then nothing is built.
if [ -n "${BENCH_BINARY:-}" ]; then
    binary=$BENCH_BINARY
else
    swift build -c release --product taskloop >/dev/null
    binary="$(swift build -c release --show-bin-path)/taskloop"
fi
source scripts/serve-in-background.sh
work=$(mktemp -d)
at_exit 'rm -rf "$work"'

stop() { kill -TERM "$1"; wait "$1" 2>/dev/null || true; }

server_cpu_seconds() {
    awk -v ticks="$(getconf CLK_TCK)" '{print ($14 + $15) / ticks}' "/proc/$server/stat"
}

# A paused workers queue `bench` at URL filled with COUNT noops (workflows of 1,000), then
# opened: what the lease benchmarks lease from.
fill_workers_queue() { # url count
    curl -fsS -X PATCH "$1/queues/bench" -H 'Content-Type: application/json' \
        -d '{"dispatch":"workers","max_concurrency":64,"paused":true}' >/dev/null
    python3 - "$1" "$2" <<'PY'
import http.client, json, sys, urllib.parse
url, count = urllib.parse.urlparse(sys.argv[1]), int(sys.argv[2])
connection = http.client.HTTPConnection(url.hostname, url.port)
body = json.dumps({"tasks": [{"key": f"t{i}", "kind": "noop", "queue": "bench"} for i in range(1000)]})
for _ in range(count // 1000):
    connection.request("POST", "/workflows", body, {"Content-Type": "application/json"})
    answer = connection.getresponse()
    answer.read()
    assert answer.status == 201, answer.status
PY
    curl -fsS -X PATCH "$1/queues/bench" -H 'Content-Type: application/json' -d '{"paused":false}' >/dev/null
}
