# Taskloop: `make run` serves on 127.0.0.1:8080, `make test` runs every test, `make bench`
# prints the benchmark figures. Each installs the Debian packages it needs when they are absent.

SWIFT ?= swift
HOST ?= 127.0.0.1
PORT ?= 8080
BUILD_PACKAGES := libuv1-dev libhttp-parser-dev libcurl4-openssl-dev libsqlite3-dev libpq-dev pkg-config tzdata
BENCH_PACKAGES := wrk util-linux gcc chromium chromium-driver postgresql
TEST_PACKAGES := curl jq openssl tmux postgresql
FUZZ_SECONDS ?= 20
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test bench build release deps bench-deps fuzz clean

# Installs whichever of the listed Debian packages are missing (apt-get update only if needed).
define ensure_packages
	@missing=""; for p in $(1); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi
endef

deps:
	$(call ensure_packages,$(BUILD_PACKAGES))

bench-deps: deps
	$(call ensure_packages,$(BENCH_PACKAGES))

build: deps
	$(SWIFT) build

release: deps
	$(SWIFT) build -c release --product taskloop

run: release
	$$($(SWIFT) build -c release --show-bin-path)/taskloop --host $(HOST) --port $(PORT)

test: deps
	$(call ensure_packages,$(TEST_PACKAGES))
	$(SWIFT) build --build-tests
	TASKLOOP_FUZZ_SECONDS=$(FUZZ_SECONDS) $(SWIFT) test --skip-build
	# The service's suites keep state durably (`full`, as the binary does); once more in memory.
	TASKLOOP_TEST_DURABILITY=memory $(SWIFT) test --skip-build --filter TaskloopServiceTests
	# And through three replicas sharing a throwaway PostgreSQL, every call to the next one: each
	# serves its own cells and forwards the rest.
	TASKLOOP_TEST_REPLICAS=3 $(SWIFT) test --skip-build --filter TaskloopServiceTests
	bash scripts/check-openapi.sh
	bash scripts/check-ui.sh
	bash scripts/check-container.sh


# Every benchmark, then each figure beside its value in Benchmarks/BASELINE.md
# (BENCH_ONLY="store timers" for some of them).
bench: bench-deps
	bash Benchmarks/run-all.sh

clean:
	rm -rf .build
