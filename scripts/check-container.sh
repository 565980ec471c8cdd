#!/usr/bin/env bash
# Checks the container without a Docker engine, as far as this machine allows:
#  1. hadolint passes on the Dockerfile;
#  2. the runtime stage builds with podman (runc) on a local debian:bookworm-slim made with
#     debootstrap (no registry), around the release binary built here (the builder stage's job);
#  3. the image refuses to start without a token (it listens on 0.0.0.0); with a token file
#     mounted as a secret it starts as its non-root user, answers /healthz on the published
#     port, passes its own HEALTHCHECK command, refuses calls without the token, refuses an
#     `http` task into its own network (not an open proxy), and stops cleanly on SIGTERM;
#  4. every shared library the binary needs resolves inside the image.
# Without root (or sudo) to install podman, runc and debootstrap, steps 2-4 are skipped with a
# message rather than failed. CONTAINER_CHECK=skip skips them too.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '== %s\n' "$*"; }

VENV=$(scripts/python-tools.sh)
"$VENV/bin/hadolint" Dockerfile
say "hadolint: Dockerfile passes"

skip() { say "SKIPPED image checks: $*"; exit 0; }
[ "${CONTAINER_CHECK:-}" != skip ] || skip "CONTAINER_CHECK=skip"
[ "$(uname -s)" = Linux ] || skip "not Linux"
if [ "$(id -u)" = 0 ]; then SUDO=""; elif sudo -n true 2>/dev/null; then SUDO=sudo; else skip "needs root or sudo for podman"; fi
missing=""
for tool in podman runc debootstrap; do command -v $tool >/dev/null || missing="$missing $tool"; done
if [ -n "$missing" ]; then
    say "installing$missing"
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq podman runc debootstrap; } \
        >/dev/null 2>&1 || skip "could not install podman, runc and debootstrap"
fi
PODMAN=($SUDO podman --runtime runc)

WORK=.build/container
mkdir -p "$WORK"
BASE=localhost/debian:bookworm-slim
if ! "${PODMAN[@]}" image exists "$BASE"; then
    TARBALL=$WORK/bookworm-minbase.tar
    if [ ! -s "$TARBALL" ]; then
        MIRROR=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
        MIRROR=${MIRROR:-http://deb.debian.org/debian}
        say "debootstrap --variant=minbase bookworm ($MIRROR)"
        ROOTFS=$(mktemp -d)
        $SUDO debootstrap --variant=minbase bookworm "$ROOTFS" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
            || { tail -20 "$WORK/debootstrap.log"; skip "debootstrap failed (no Debian mirror reachable?)"; }
        $SUDO tar -C "$ROOTFS" -cf "$TARBALL" .
        $SUDO rm -rf "$ROOTFS"
    fi
    "${PODMAN[@]}" import -q "$TARBALL" "$BASE" >/dev/null
fi
"${PODMAN[@]}" tag "$BASE" docker.io/library/debian:bookworm-slim

say "release binary (static Swift runtime), as the build stage makes it"
swift build -c release --static-swift-stdlib --product taskloop >/dev/null
install -D -m 0755 "$(swift build -c release --show-bin-path)/taskloop" "$WORK/context/out/taskloop"

IMAGE=localhost/taskloop:check
say "podman build --target runtime (the build stage replaced by the binary above)"
"${PODMAN[@]}" build -q --format docker --pull=never --build-context "build=$WORK/context" --target runtime -t "$IMAGE" -f Dockerfile . >/dev/null

USER_IN_IMAGE=$("${PODMAN[@]}" image inspect --format '{{.Config.User}}' "$IMAGE")
[ -n "$USER_IN_IMAGE" ] && [ "${USER_IN_IMAGE%%:*}" != root ] && [ "${USER_IN_IMAGE%%:*}" != 0 ] \
    || { echo "FAIL: the image runs as '${USER_IN_IMAGE:-root}'"; exit 1; }

say "library closure inside the image"
CLOSURE=$("${PODMAN[@]}" run --rm --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 --entrypoint ldd "$IMAGE" /usr/local/bin/taskloop)
printf '%s\n' "$CLOSURE" | sed 's/^/   /'
if grep -q "not found" <<<"$CLOSURE"; then echo "FAIL: missing shared libraries in the image"; exit 1; fi

say "no open door: without a token the image refuses to start"
set +e
REFUSAL=$("${PODMAN[@]}" run --rm --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 "$IMAGE" 2>&1)
STATUS=$?
set -e
[ "$STATUS" = 64 ] && grep -q -- --auth-token-file <<<"$REFUSAL" \
    || { printf '%s\n' "$REFUSAL"; echo "FAIL: without a token the image started or said something else (exit $STATUS)"; exit 1; }

TOKEN=$(openssl rand -hex 24)
SECRETS=$(mktemp -d)
printf '%s admin\n' "$TOKEN" >"$SECRETS/tokens"
chmod 0644 "$SECRETS/tokens"
AUTH=(-H "Authorization: Bearer $TOKEN")
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
say "run: 127.0.0.1:$PORT -> 8080, the token file mounted as a secret"
CID=$("${PODMAN[@]}" run -d --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 -p "127.0.0.1:$PORT:8080" \
    -v "$SECRETS/tokens:/run/secrets/taskloop-tokens:ro" -e TASKLOOP_AUTH_TOKEN_FILE=/run/secrets/taskloop-tokens "$IMAGE")
trap '"${PODMAN[@]}" rm -f -t 0 "$CID" >/dev/null 2>&1 || true; rm -rf "$SECRETS"' EXIT
for _ in $(seq 1 100); do
    curl -fsS -m 2 "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -fsS -m 2 "http://127.0.0.1:$PORT/healthz" | grep -q '"ok"' \
    || { "${PODMAN[@]}" logs "$CID" | tail -20; echo "FAIL: no /healthz answer on the published port"; exit 1; }
UID_INSIDE=$("${PODMAN[@]}" exec "$CID" sh -c 'id -u')
[ "$UID_INSIDE" != 0 ] || { echo "FAIL: the server runs as root"; exit 1; }
"${PODMAN[@]}" image inspect --format '{{.Config.Healthcheck.Test}}' "$IMAGE" | grep -q -- --health-check \
    || { echo "FAIL: the image has no HEALTHCHECK"; exit 1; }
"${PODMAN[@]}" healthcheck run "$CID" || { echo "FAIL: the image's HEALTHCHECK fails"; exit 1; }
say "without the token: 401 for everything but /healthz"
UNAUTHORIZED=$(curl -sS -m 5 -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -d '{"kind":"noop"}' \
    "http://127.0.0.1:$PORT/tasks")
[ "$UNAUTHORIZED" = 401 ] || { echo "FAIL: a submission without the token answered $UNAUTHORIZED"; exit 1; }
say "an http task inside the container (libcurl in the image): its own network is refused, and the CA bundle for HTTPS"
"${PODMAN[@]}" exec "$CID" test -s /etc/ssl/certs/ca-certificates.crt || { echo "FAIL: no CA certificates in the image"; exit 1; }
TASK=$(curl -fsS -m 5 "${AUTH[@]}" -H 'Content-Type: application/json' \
    -d '{"kind":"http","params":{"url":"http://127.0.0.1:8080/healthz"}}' "http://127.0.0.1:$PORT/tasks" | jq -r .id)
STATE=$(curl -fsS -m 10 "${AUTH[@]}" "http://127.0.0.1:$PORT/tasks/$TASK?wait=5" | jq -r '.state + " " + .error.code')
[ "$STATE" = "failed address_refused" ] || { echo "FAIL: the http task into the container's own network ended '$STATE'"; exit 1; }
"${PODMAN[@]}" logs "$CID" 2>&1 | grep -q "$TOKEN" && { echo "FAIL: the token appears in the log"; exit 1; }
say "stop (SIGTERM)"
"${PODMAN[@]}" stop -t 15 "$CID" >/dev/null
STATUS=$("${PODMAN[@]}" inspect --format '{{.State.ExitCode}}' "$CID")
[ "$STATUS" = 0 ] || { "${PODMAN[@]}" logs "$CID" | tail -20; echo "FAIL: exit status $STATUS after SIGTERM"; exit 1; }
say "PASS: image $IMAGE builds, runs as uid $UID_INSIDE, serves /healthz, stops with 0; $(du -h "$WORK/context/out/taskloop" | cut -f1) binary"
