# The two commands of the README: `make run` and `make test`.
GO ?= go
BIN := bin

.PHONY: build run test fuzz bench vet clean

# The same steps as the Dockerfile's build stage.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/server ./cmd/server
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/config-check ./cmd/config-check
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/client ./cmd/client

# Runs the service on the embedded in-memory store with the example config.
# The config directory holds a link to examples/ratelimit-config.yaml, so
# edits to the example are what the service reads.
run: build
	mkdir -p .run/ratelimit/config
	ln -sf "$(CURDIR)/examples/ratelimit-config.yaml" .run/ratelimit/config/ratelimit-config.yaml
	RUNTIME_ROOT="$(CURDIR)/.run" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_APPDIRECTORY=config \
	LOG_LEVEL=info BACKEND_TYPE=memory $(BIN)/server

# Every test: unit tests, Redis-backed tests and the black-box integration
# tests. Installs redis-server first if it is missing and can be installed.
test: vet
	scripts/ensure-redis.sh
	$(GO) test -race -count=1 -timeout 20m ./...
	scripts/fuzz.sh 5s

# Longer fuzzing, by hand: make fuzz FUZZTIME=5m
FUZZTIME ?= 1m
fuzz:
	scripts/fuzz.sh $(FUZZTIME)

# The load benchmark: starts redis-server, the service (embedded and Redis
# stores) and a no-op server, and prints the table of docs/performance.md.
# BENCHFLAGS=-load.duration=5s shortens it.
BENCHFLAGS ?=
bench:
	scripts/ensure-redis.sh
	$(GO) test ./integration-test -run '^$$' -bench Load -benchtime 1x -timeout 60m -args $(BENCHFLAGS)

vet:
	$(GO) vet ./...

clean:
	rm -rf $(BIN) .run
