#!/usr/bin/env bash
# Keeps openapi.yaml true: it must validate as OpenAPI 3.1, openapi-python-client must generate
# a client from all of it that reads a real server's answers, and schemathesis runs every
# operation against a freshly started server (the debug build) with every check it has: server
# errors; status codes, content types, headers and bodies the spec does not document; valid
# requests refused and invalid ones accepted; methods a path does not take; resources that
# vanish after being created. scripts/schemathesis.toml narrows two checks for the operations
# where they are wrong about this API, and says why.
# Then it runs the same again through three replicas sharing a throwaway PostgreSQL
# (scripts/postgres-cluster.sh), behind a round-robin proxy (scripts/round-robin-proxy.py): a
# resource made on one replica is read, changed and deleted through the others.
# SCHEMATHESIS_EXAMPLES (default 40) and SCHEMATHESIS_SEED (default 1) tune both runs.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(scripts/python-tools.sh)
"$VENV/bin/openapi-spec-validator" openapi.yaml

BIN="$(swift build --show-bin-path)/taskloop"
source scripts/serve-in-background.sh
# Without --allow-exec: the fuzzer's made-up programs are never run. http tasks it makes up are
# refused internal addresses, so they cannot poke at services on this machine.
# Webhooks the fuzzer makes up are sent nowhere internal either, and few: at most 20.
# Lease calls wait at most 2 s: the fuzzer may make `default` a workers queue and then ask for
# kinds nobody submits, at wait_s up to 60, a thousand times.
SERVER_FLAGS=(--port 0 --log-level warning --max-unfinished-tasks 1000000 --http-deny-private
    --max-lease-wait-seconds 2 --max-webhooks 20)
run_schemathesis() { # URL REPORT_DIR
    "$VENV/bin/schemathesis" --config-file scripts/schemathesis.toml run openapi.yaml --url "$1" \
        --max-examples "${SCHEMATHESIS_EXAMPLES:-40}" --seed "${SCHEMATHESIS_SEED:-1}" \
        --request-timeout 61 --no-color --report-dir "$2"
}

# A mainstream generator must take every schema (one it cannot merge is silently dropped, and
# its client then raises on that answer), and the client it makes must read a real server.
GENERATED=.build/openapi-client
rm -rf "$GENERATED"
mkdir -p "$GENERATED"
GENERATOR_LOG=$("$VENV/bin/openapi-python-client" generate --path openapi.yaml --meta none --output-path "$GENERATED/client" \
    --config scripts/openapi-python-client.yaml 2>&1)
if grep -qE "WARNING|Unable to|Cannot parse|Could not" <<<"$GENERATOR_LOG" || [ ! -d "$GENERATED/client" ]; then
    printf '%s\n' "$GENERATOR_LOG"
    echo "FAIL: openapi-python-client does not take openapi.yaml whole"
    exit 1
fi

serve_in_background "$BIN" "${SERVER_FLAGS[@]}" --data-dir "$(mktemp -d)"
"$VENV/bin/python" Tests/GeneratedClient/check_generated_client.py "$GENERATED" "$url" generated-client-token
run_schemathesis "$url" .build/schemathesis-report
kill -TERM "$server"
wait "$server"
echo "openapi.yaml: valid, and the running server conforms to it under every check"

# Three replicas on one PostgreSQL, each new connection to the next (see the proxy). The
# cluster lives in a directory the postgres user can reach; it is stopped and removed at exit,
# once the replicas have ended, however the script ends.
tmp=$(mktemp -d)
chmod 755 "$tmp"
at_exit 'for pg in "$tmp"/pg-*; do [ ! -f "$pg/data/postmaster.pid" ] || scripts/postgres-cluster.sh stop "$pg"; done; rm -rf "$tmp"'
pg_port=$("$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
database_url=$(scripts/postgres-cluster.sh start "$tmp/pg-replicas" "$pg_port")
replicas=() replica_urls=()
for name in r0 r1 r2; do
    serve_in_background "$BIN" "${SERVER_FLAGS[@]}" --database-url "$database_url" --replica-name "$name"
    replicas+=("$server") replica_urls+=("$url")
done
serve_in_background "$VENV/bin/python" scripts/round-robin-proxy.py "${replica_urls[@]}"
proxy=$server
run_schemathesis "$url" ".build/schemathesis-report-replicas"
kill -TERM "$proxy" "${replicas[@]}"
for pid in "$proxy" "${replicas[@]}"; do wait "$pid"; done
scripts/postgres-cluster.sh stop "$tmp/pg-replicas"
echo "openapi.yaml: three replicas on one PostgreSQL, behind a round-robin proxy, conform to it too"
