#!/usr/bin/env bash
# Runs every fuzz target for a bounded budget: a duration (5s) or an input
# count (20000x); default 5s each.
# Seeds and past crashers live in each package's testdata/fuzz and also run
# in every plain `go test`.
set -euo pipefail
time="${1:-5s}"
targets=(
  "./src/config FuzzParse"
  "./src/config FuzzChunks"
  "./src/config FuzzKey"
  "./src/config FuzzMatch"
  "./src/service FuzzShouldRateLimit"
  "./src/server FuzzLenientCodec"
  "./src/escape FuzzString"
)
for t in "${targets[@]}"; do
  read -r pkg name <<<"$t"
  echo "fuzz $name ($pkg) for $time"
  go test -run '^$' -fuzz "^${name}\$" -fuzztime "$time" "$pkg"
done
