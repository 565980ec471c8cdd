#!/usr/bin/env bash
# Keeps openapi.yaml true: it must validate as OpenAPI 3.1, and schemathesis runs every
# operation against a freshly started server (the debug build) with every check it has: server
# errors; status codes, content types, headers and bodies the spec does not document; valid
# requests refused and invalid ones accepted; methods a path does not take; resources that
# vanish after being created. scripts/schemathesis.toml narrows two checks for the operations
# where they are wrong about this API, and says why.
# SCHEMATHESIS_EXAMPLES (default 40) and SCHEMATHESIS_SEED (default 1) tune the run.
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
serve_in_background "$BIN" --port 0 --log-level warning --max-unfinished-tasks 1000000 --http-deny-private \
    --max-lease-wait-seconds 2 --max-webhooks 20 --data-dir "$(mktemp -d)"

"$VENV/bin/schemathesis" --config-file scripts/schemathesis.toml run openapi.yaml --url "$url" \
    --max-examples "${SCHEMATHESIS_EXAMPLES:-40}" --seed "${SCHEMATHESIS_SEED:-1}" \
    --request-timeout 61 --no-color --report-dir .build/schemathesis-report

kill -TERM "$server"
wait "$server"
echo "openapi.yaml: valid, and the running server conforms to it under every check"
