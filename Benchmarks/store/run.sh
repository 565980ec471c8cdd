#!/usr/bin/env bash
# Durability benchmark: what keeping state costs, measured in one run on one machine.
# - POST /tasks under wrk (server on core 0 with its store writer thread, wrk on core 1) with
#   --durability memory, normal and full, as ratios to memory;
# - the 100 x 100 lattice workflow end to end in `full`;
# - restart with BENCH_RESTART_TASKS (200000) queued tasks: from exec to `listening on`
#   (Benchmarks/store/restart.sh; run alone it restores a million, in `full`);
# - the database's size under churn (retention at 10,000 tasks while 10x that many pass);
# - the disk's fsync rate (a small probe: 4 KiB write + fdatasync, in the data dir's filesystem),
#   so the figures can be read against the physical limit.
#   BENCH_DURATION  seconds of wrk per mode and round (default 5)
#   BENCH_ROUNDS    rounds of the three modes (default 3)
set -euo pipefail
cd "$(dirname "$0")/../.."

duration=${BENCH_DURATION:-5}
rounds=${BENCH_ROUNDS:-3}
restart_tasks=${BENCH_RESTART_TASKS:-200000}
source Benchmarks/release-server.sh

# Rounds alternate the modes so that drift of the machine hits all three alike; ratios are
# taken within a round and the median is reported. Two layouts: `pinned` gives the server (loop,
# store writer and log flusher) core 0 and wrk core 1; `shared` lets the kernel place everything
# on both cores, as a deployment would.
post_rate() { # layout mode round
    local server_cpus="" wrk_cpus=""
    if [ "$1" = pinned ]; then server_cpus="taskset -c 0"; wrk_cpus="taskset -c 1"; fi
    serve_in_background $server_cpus "$binary" --port 0 --durability "$2" --data-dir "$work/$1-$2-$3" \
        --max-unfinished-tasks 10000000 --log-level warning
    $wrk_cpus wrk -t1 -c64 -d"${duration}s" -s Benchmarks/service/noop.lua "$url/tasks" | awk '/Requests\/sec/ {print $2}'
    stop "$server"
    rm -rf "$work/$1-$2-$3"
}
echo "POST /tasks (noop): wrk -t1 -c64 -d${duration}s, $rounds rounds of memory, normal, full"
for layout in pinned shared; do
    lines=""
    for round in $(seq 1 "$rounds"); do
        memory=$(post_rate "$layout" memory "$round")
        normal=$(post_rate "$layout" normal "$round")
        full=$(post_rate "$layout" full "$round")
        lines="$lines$memory $normal $full"$'\n'
    done
    printf '%s' "$lines" | python3 -c '
import statistics, sys
layout = sys.argv[1]
rounds = [list(map(float, line.split())) for line in sys.stdin if line.strip()]
median = lambda values: statistics.median(values)
memory = median([r[0] for r in rounds])
for index, mode in ((1, "normal"), (2, "full")):
    ratios = [r[index] / r[0] for r in rounds]
    each = ", ".join("%.2f" % ratio for ratio in ratios)
    print(f"  {layout:6} {mode:6} {median([r[index] for r in rounds]):9.0f} req/s  {median(ratios):.2f}x memory (rounds: {each})")
print(f"  {layout:6} memory {memory:9.0f} req/s")
' "$layout"
done

serve_in_background taskset -c 0 "$binary" --port 0 --durability full --data-dir "$work/lattice" --log-level warning
host_port=${url#http://}
taskset -c 1 python3 Benchmarks/service/lattice.py "${host_port%:*}" "${host_port##*:}" 100 | sed 's/^/  full: /'
stop "$server"

# Restart: a paused queue of BENCH_RESTART_TASKS queued tasks restored (Benchmarks/store/restart.sh,
# whose default is the million of issue 27's goal).
BENCH_BINARY=$binary BENCH_RESTART_TASKS=$restart_tasks BENCH_RESTART_DURABILITY=normal bash Benchmarks/store/restart.sh

# Churn: retention keeps 10,000 finished tasks while ten times that many pass through.
serve_in_background taskset -c 0 "$binary" --port 0 --durability normal --data-dir "$work/churn" \
    --max-retained-tasks 10000 --log-level warning
sizes=""
for round in 1 2 3 4 5; do
    taskset -c 1 wrk -t1 -c16 -d2s -s Benchmarks/service/noop.lua "$url/tasks" >/dev/null
    sizes="$sizes $(du -sk "$work/churn" | cut -f1)"
done
submitted=$(curl -sf "$url/metrics" | awk '/^taskloop_tasks_submitted_total/ {sum += $2} END {print sum}')
stop "$server"
echo "churn: $submitted tasks through a 10,000-task retention; data dir KiB after each 2 s round:$sizes"

python3 - "$work" <<'PY'
import os, sys, time
path = os.path.join(sys.argv[1], "fsync-probe")
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
block = b"x" * 4096
count, started = 0, time.perf_counter()
while time.perf_counter() - started < 2:
    os.pwrite(fd, block, 0)
    os.fdatasync(fd)
    count += 1
os.close(fd)
print(f"disk: {count / (time.perf_counter() - started):.0f} fdatasync/s (4 KiB write each)")
PY
