#!/usr/bin/env bash
# The dashboard in a real browser: Tests/Browser (pytest + selenium) drives the system's headless
# Chromium against fresh servers of the debug build, each test a thing a person sees or does
# (live table, progress, cancel, retry, bulk, filters, queues, task page, workflow graph, schedules,
# 10,000 tasks, the token dialog), with no console errors and no serious axe-core violations.
# Installs Debian's chromium and chromium-driver when missing; never builds: run `swift build`
# first. Arguments go to pytest (e.g. `-k graph`). TASKLOOP_UI_SCREENSHOTS=DIR also saves PNGs
# of the main views there (docs/screenshots/ holds the committed ones).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=""
for package in chromium chromium-driver; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || missing="$missing $package"
done
if [ -n "$missing" ]; then
    SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
    echo "installing:$missing"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

VENV=$(scripts/python-tools.sh)
TASKLOOP_BIN="$(swift build --show-bin-path)/taskloop"
[ -x "$TASKLOOP_BIN" ] || { echo "check-ui: no binary at $TASKLOOP_BIN; run swift build first" >&2; exit 1; }
export TASKLOOP_BIN

export PYTHONDONTWRITEBYTECODE=1
status=0
"$VENV/bin/python" -m pytest Tests/Browser -q -p no:cacheprovider --tb=short -rfExX "$@" || status=$?
if [ "$status" = 0 ]; then
    echo "check-ui: the dashboard behaves in Chromium ($(/usr/bin/chromium --version 2>/dev/null))"
else
    echo "check-ui: FAILED (pytest exit $status)" >&2
fi
exit "$status"
