#!/usr/bin/env bash
# Keeps openapi.yaml true: it must validate as OpenAPI 3.1, and schemathesis runs every
# operation against a freshly started server (the debug build), checking for server errors and
# for status codes, content types, headers and bodies that the spec does not document.
# SCHEMATHESIS_EXAMPLES (default 40) and SCHEMATHESIS_SEED (default 1) tune the run.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(scripts/python-tools.sh)
"$VENV/bin/openapi-spec-validator" openapi.yaml

BIN="$(swift build --show-bin-path)/taskloop"
LOG=$(mktemp)
"$BIN" --port 0 --log-level warning --max-unfinished-tasks 1000000 >"$LOG" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; rm -f "$LOG"' EXIT
for _ in $(seq 1 100); do
    grep -q "listening on" "$LOG" && break
    kill -0 $SERVER 2>/dev/null || { cat "$LOG"; exit 1; }
    sleep 0.1
done
URL=$(grep -o 'http://[^ ]*' "$LOG" | head -1)
[ -n "$URL" ] || { echo "server did not start"; cat "$LOG"; exit 1; }

"$VENV/bin/schemathesis" run openapi.yaml --url "$URL" \
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance \
    --max-examples "${SCHEMATHESIS_EXAMPLES:-40}" --seed "${SCHEMATHESIS_SEED:-1}" \
    --request-timeout 10 --no-color --report-dir .build/schemathesis-report

kill -TERM $SERVER
wait $SERVER
echo "openapi.yaml: valid, and the running server conforms to it"
