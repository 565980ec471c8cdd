#!/usr/bin/env bash
# Engine benchmark (see main.swift). Pass --quick for a 1/10-size smoke run.
set -euo pipefail
cd "$(dirname "$0")/../.."
swift build -c release --product engine-bench >/dev/null
"$(swift build -c release --show-bin-path)/engine-bench" "$@"
