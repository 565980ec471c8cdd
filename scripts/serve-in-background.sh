# Sourced by the benchmark and check scripts: `serve_in_background COMMAND...` starts a
# taskloop-style server that prints `listening on http://HOST:PORT`, waits for that line and
# sets $server (its pid) and $url. Every server started this way is stopped (SIGTERM) when the
# calling script exits; if one dies first, the script exits with its output. It waits
# $serve_in_background_wait_seconds (10) for the line.
# `at_exit COMMAND` (a string, evaluated) runs COMMAND at that exit too, once those servers have
# ended, so it may stop what they use (a database); the last registered runs first, as a
# defer does. Put a sourcing script's own exit cleanup there: an EXIT trap of its own would be
# replaced by the next serve_in_background.
serve_in_background_pids=()
serve_in_background_logs=()
serve_in_background_at_exit=()
serve_in_background_exit() {
    if [ ${#serve_in_background_pids[@]} -gt 0 ]; then
        kill -TERM "${serve_in_background_pids[@]}" 2>/dev/null || true
        if [ ${#serve_in_background_at_exit[@]} -gt 0 ]; then
            wait "${serve_in_background_pids[@]}" 2>/dev/null || true
        fi
    fi
    local index
    for ((index = ${#serve_in_background_at_exit[@]} - 1; index >= 0; index--)); do
        eval "${serve_in_background_at_exit[index]}" || true
    done
    rm -f "${serve_in_background_logs[@]}"
}
at_exit() {
    serve_in_background_at_exit+=("$1")
    trap serve_in_background_exit EXIT
}
serve_in_background() {
    server_log=$(mktemp)
    "$@" >"$server_log" 2>&1 &
    server=$!
    serve_in_background_pids+=("$server")
    serve_in_background_logs+=("$server_log")
    trap serve_in_background_exit EXIT
    for _ in $(seq 1 $((${serve_in_background_wait_seconds:-10} * 20))); do
        grep -q 'listening on' "$server_log" && break
        kill -0 "$server" 2>/dev/null || { cat "$server_log"; exit 1; }
        sleep 0.05
    done
    url=$(grep -o 'http://[^ ]*' "$server_log" | head -1)
    [ -n "$url" ] || { echo "server did not start"; cat "$server_log"; exit 1; }
}
