# Sourced by the benchmark and check scripts: `serve_in_background COMMAND...` starts a
# taskloop-style server that prints `listening on http://HOST:PORT`, waits for that line and
# sets $server (its pid) and $url. Every server started this way is stopped (SIGTERM) when the
# calling script exits; if one dies first, the script exits with its output.
serve_in_background_pids=()
serve_in_background_logs=()
serve_in_background() {
    server_log=$(mktemp)
    "$@" >"$server_log" 2>&1 &
    server=$!
    serve_in_background_pids+=("$server")
    serve_in_background_logs+=("$server_log")
    trap 'kill -TERM "${serve_in_background_pids[@]}" 2>/dev/null || true; rm -f "${serve_in_background_logs[@]}"' EXIT
    for _ in $(seq 1 200); do
        grep -q 'listening on' "$server_log" && break
        kill -0 "$server" 2>/dev/null || { cat "$server_log"; exit 1; }
        sleep 0.05
    done
    url=$(grep -o 'http://[^ ]*' "$server_log" | head -1)
    [ -n "$url" ] || { echo "server did not start"; cat "$server_log"; exit 1; }
}
