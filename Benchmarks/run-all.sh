#!/usr/bin/env bash
# `make bench`: every benchmark in turn, what each prints kept in BENCH_OUTPUT
# (.build/bench-output.txt), then each figure of Benchmarks/BASELINE.md beside its baseline.
# BENCH_ONLY="store timers" runs only the named benchmarks.
set -euo pipefail
cd "$(dirname "$0")/.."
output=${BENCH_OUTPUT:-.build/bench-output.txt}
benchmarks=${BENCH_ONLY:-engine http service store leases events ui replicas timers exec batches}
mkdir -p "$(dirname "$output")"
: >"$output"
for benchmark in $benchmarks; do
    echo "== Benchmarks/$benchmark" | tee -a "$output"
    bash "Benchmarks/$benchmark/run.sh" 2>&1 | tee -a "$output"
done
echo "== against Benchmarks/BASELINE.md"
python3 Benchmarks/compare.py Benchmarks/BASELINE.md "$output"
