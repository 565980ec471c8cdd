# Sourced by the benchmarks that time the built server: builds the release binary ($binary),
# makes a scratch dir ($work, removed at exit with every server started), and gives `stop PID`
# (SIGTERM, then wait) and `server_cpu_seconds` (user + system CPU of $server so far).
swift build -c release --product taskloop >/dev/null
binary="$(swift build -c release --show-bin-path)/taskloop"
source scripts/serve-in-background.sh
work=$(mktemp -d)
at_exit 'rm -rf "$work"'

stop() { kill -TERM "$1"; wait "$1" 2>/dev/null || true; }

server_cpu_seconds() {
    awk -v ticks="$(getconf CLK_TCK)" '{print ($14 + $15) / ticks}' "/proc/$server/stat"
}
