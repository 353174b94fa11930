# The two commands of the README: `make run` and `make test`.
GO ?= go
BIN := bin
# pipefail, so that a test failure is not hidden by the progress filter.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c

.PHONY: help build run redis test check lint fuzz bench pgo vet clean

# make alone lists the targets.
.DEFAULT_GOAL := help
help:
	@echo "make run     build bin/ and run the service on the embedded store with examples/ratelimit-config.yaml"
	@echo "make test    every test: unit, Redis- and memcached-backed, the built binary, fuzz seeds"
	@echo "make check   what CI runs: staticcheck, make test's tests under the race detector, then fuzzing"
	@echo "make build   build bin/server, bin/config-check and bin/client"
	@echo "make redis   a throwaway Redis on 127.0.0.1:6379 (REDIS_URL=127.0.0.1:6379 make run beside it)"
	@echo "make bench   the benchmarks of docs/performance.md (long)"
	@echo "make fuzz    longer fuzzing (FUZZTIME=5m)"
	@echo "make vet     go vet and gofmt"
	@echo "make lint    staticcheck (pinned; fetched on first use)"
	@echo "make clean   remove bin/ and .run/"

# One set of build flags for build, run, vet and test, the Dockerfile's: cgo
# off, -trimpath. With the toolchain's defaults for tests (cgo on here) the
# first make test after make run compiled every dependency again. (make
# check's race detector needs cgo: it compiles apart in any case.)
export CGO_ENABLED := 0
export GOFLAGS := $(GOFLAGS) -trimpath -buildvcs=auto

# Compile progress as it happens (scripts/buildprogress): go build -v names
# each package it compiles; a line per 10 of them, every other line
# (downloads, errors) as it comes, and a line when one large package keeps
# the build silent for 15 s. It is compiled first, on its own, a shell
# loop reporting meanwhile (not awk: mawk, Debian's awk, reads a pipe in
# blocks, which held the lines back for 33 s on a cold machine; and not
# `go run`, whose own compile of the standard library left a cold, busy
# machine silent for 34 s).
PROGRESS := $(BIN)/buildprogress
$(PROGRESS): scripts/buildprogress/main.go
	@echo "progress: compiling the progress reporter first (the standard library, with empty caches)"
	@$(GO) build -v -o $@ ./scripts/buildprogress 2>&1 | \
		{ n=0; while IFS= read -r line; do \
			case "$$line" in *" "*|*:*) echo "$$line";; *) n=$$((n+1)); [ $$((n % 10)) -eq 0 ] && echo "  $$n packages compiled";; esac; \
		done; true; }

# The same steps as the Dockerfile's build stage.
build: $(PROGRESS)
	@echo "build: compiling the service, config-check and client (a few minutes with empty caches; a line per 10 packages)"
	@$(GO) build -v -o $(BIN)/server ./cmd/server 2>&1 | $(PROGRESS)
	@$(GO) build -v -o $(BIN)/config-check ./cmd/config-check 2>&1 | $(PROGRESS)
	@$(GO) build -v -o $(BIN)/client ./cmd/client 2>&1 | $(PROGRESS)
	@echo "build: done, in $(BIN)/"

# Runs the service with the example config: on the embedded in-memory store,
# or on Redis with REDIS_URL=127.0.0.1:6379 make run (see make redis), statsd
# off unless USE_STATSD=true (nothing listens on 8125 on a laptop). The
# config directory holds a link to examples/ratelimit-config.yaml, which the
# service follows: editing the example reloads it.
run: build
	mkdir -p .run/ratelimit/config
	ln -sf "$(CURDIR)/examples/ratelimit-config.yaml" .run/ratelimit/config/ratelimit-config.yaml
	RUNTIME_ROOT="$(CURDIR)/.run" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_APPDIRECTORY=config \
	USE_STATSD=$${USE_STATSD:-false} LOG_LEVEL=info $(BIN)/server

# A throwaway Redis on 127.0.0.1:6379 in the foreground (nothing saved), for
# REDIS_URL=127.0.0.1:6379 make run in another terminal.
redis:
	scripts/ensure-servers.sh
	redis-server --bind 127.0.0.1 --port 6379 --save "" --appendonly no

# Every test: unit tests, Redis- and memcached-backed tests and the
# black-box integration tests, each fuzz target's seeds included. Installs
# redis-server and memcached first if missing and they can be installed. The quick command for working on the code.
test: vet
	scripts/ensure-servers.sh
	@echo "make test: every package, listed as it finishes (make check adds the race detector and fuzzing)."
	$(GO) test -count=1 -timeout 20m -json ./... | $(GO) run ./scripts/testreport

# What CI runs (.ci/run): staticcheck, every test under the race detector,
# then 20,000 fuzz inputs per target.
check: vet lint
	scripts/ensure-servers.sh
	@echo "make check: every package with -race, listed as it finishes, then fuzzing."
	CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 20m -json ./... | $(GO) run ./scripts/testreport
	# A count, not a duration: Go 1.26's fuzz coordinator can report a
	# spurious "context deadline exceeded" when a -fuzztime duration ends
	# (golang/go#75804, fixed in Go 1.27). 20000 inputs take 2-6 s a target.
	scripts/fuzz.sh 20000x

# staticcheck, the version pinned here, fetched through the module proxy
# and built on first use (about a minute with empty caches); not a module
# dependency, so make test and builds never download it.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
lint:
	@echo "lint: staticcheck ./... (the first run downloads and builds it)"
	$(GO) run $(STATICCHECK) ./...

# Longer fuzzing, by hand: make fuzz FUZZTIME=5m (or a count: 2000000x). With
# a duration on Go 1.26, a bare "context deadline exceeded" at the very end,
# with no crasher written to testdata/fuzz, is golang/go#75804, not a finding.
FUZZTIME ?= 1m
fuzz:
	scripts/fuzz.sh $(FUZZTIME)

# The benchmarks of docs/performance.md: every algorithm's accuracy (virtual
# time, both stores) and what a decision costs Redis per algorithm (single
# node and Cluster, CPU, script time, commands, bytes per counter) and what
# each part of a fixed-window call costs it, then the
# load benchmark (starts redis-server, the service on both stores and a
# no-op server), what a decision costs Redis with the binary per algorithm
# (single node and Cluster, Redis pinned to its own CPU where there are two),
# the hot-key rows (with and without lease) and the config-scale rows.
# BENCHFLAGS=-load.duration=5s shortens it.
BENCHFLAGS ?=
bench:
	scripts/ensure-servers.sh
	$(GO) test ./src/redis -run '^$$' -bench 'Accuracy|RedisCost|DecisionParts' -benchtime 1x -timeout 30m
	$(GO) test ./integration-test -run '^$$' -bench 'Load|RedisCPU|HotKey|ConfigScale|RapidReset|RLQS|ExpiryJitter' -benchtime 1x -timeout 60m -args $(BENCHFLAGS)

# Regenerates cmd/server/release.pgo (profile-guided optimisation of the
# image's server build) from the load benchmark's CPU profiles.
pgo:
	scripts/pgo.sh $(BENCHFLAGS)

vet: $(PROGRESS)
	@echo "vet: downloading the modules (once) and compiling every package and what the tests use first (a few minutes with empty caches; a line per 10 packages)"
	@# One filter for all three steps, so that its 15 s of quiet spans them
	@# (each alone was quick, but together silent for 20 s on a busy machine).
	@{ $(GO) build -v ./... && \
		pkgs="$$($(GO) list -deps -test -f '{{if and (not .Standard) .GoFiles}}{{.ImportPath}}{{end}}' ./... | grep -v -e '\.test$$' -e ' ')" && \
		$(GO) build -v $$pkgs; } 2>&1 | $(PROGRESS)
	@echo "go vet ./..."
	@$(GO) vet ./... 2>&1 | $(PROGRESS) vetting
	@unformatted="$$(gofmt -l .)"; if [ -n "$$unformatted" ]; then echo "gofmt -w needed on:"; echo "$$unformatted"; exit 1; fi

clean:
	rm -rf $(BIN) .run
