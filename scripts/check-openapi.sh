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
source scripts/serve-in-background.sh
serve_in_background "$BIN" --port 0 --log-level warning --max-unfinished-tasks 1000000

"$VENV/bin/schemathesis" run openapi.yaml --url "$url" \
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance \
    --max-examples "${SCHEMATHESIS_EXAMPLES:-40}" --seed "${SCHEMATHESIS_SEED:-1}" \
    --request-timeout 10 --no-color --report-dir .build/schemathesis-report

kill -TERM "$server"
wait "$server"
echo "openapi.yaml: valid, and the running server conforms to it"
