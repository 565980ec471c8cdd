# Taskloop in a container: built with the official Swift image on Debian bookworm, run on
# bookworm-slim with only the C libraries the binary links (the Swift runtime is static) and the
# CA certificates that `http` tasks verify HTTPS servers against, and tzdata for schedules' time zones.
#   docker build -t taskloop . && docker run --rm -p 8080:8080 taskloop

FROM swift:6.3-bookworm AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends libuv1-dev libhttp-parser-dev libcurl4-openssl-dev libsqlite3-dev libpq-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Manifest first: the dependency fetch stays cached while only sources change.
COPY Package.swift openapi.yaml ./
COPY Sources ./Sources
COPY Tests ./Tests
COPY Benchmarks ./Benchmarks
RUN swift build -c release --static-swift-stdlib --product taskloop \
    && install -D -m 0755 "$(swift build -c release --show-bin-path)/taskloop" /out/taskloop

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends libuv1 libhttp-parser2.9 libcurl4 libsqlite3-0 libpq5 ca-certificates tzdata \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin taskloop \
    && install -d -o taskloop -g taskloop -m 0700 /var/lib/taskloop
COPY --from=build /out/taskloop /usr/local/bin/taskloop
USER taskloop:taskloop
# Listening beyond loopback, the server refuses to start without a token: mount a token file as
# a secret and set TASKLOOP_AUTH_TOKEN_FILE (or TASKLOOP_AUTH_TOKEN) when running the image.
ENV TASKLOOP_HOST=0.0.0.0 \
    TASKLOOP_PORT=8080 \
    TASKLOOP_DATA_DIR=/var/lib/taskloop
# The database and its lock: keep them on a volume, and the tasks outlive the container.
VOLUME /var/lib/taskloop
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=5s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/taskloop", "--health-check"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/taskloop"]
