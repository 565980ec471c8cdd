#!/usr/bin/env bash
# Builds the C reference server (server.c) against the system's libuv and http_parser and
# prints the binary's path. Rebuilt only when server.c changed.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.build/bench-reference
mkdir -p "$out"
if [ ! -x "$out/server" ] || [ Benchmarks/reference/server.c -nt "$out/server" ]; then
    # shellcheck disable=SC2046
    ${CC:-cc} -O2 -o "$out/server" Benchmarks/reference/server.c $(pkg-config --cflags --libs libuv) -lhttp_parser
fi
echo "$out/server"
