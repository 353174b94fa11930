#!/usr/bin/env bash
# Runs every fuzz target for a bounded budget: a duration (5s) or an input
# count (20000x); default 5s each.
# The targets are found, not listed: every func FuzzXxx(f *testing.F) in a
# _test.go file of the module, so a new target runs without an edit here.
# Seeds and past crashers live in each package's testdata/fuzz and also run
# in every plain `go test`.
set -euo pipefail
cd "$(dirname "$0")/.."
time="${1:-5s}"
found=0
while IFS= read -r file; do
  dir="./$(dirname "$file")"
  for name in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(f \*testing\.F).*/\1/p' "$file"); do
    found=$((found + 1))
    echo "fuzz $name ($dir) for $time"
    go test -run '^$' -fuzz "^${name}\$" -fuzztime "$time" "$dir"
  done
done < <(grep -rl --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*(f \*testing\.F)' cmd src integration-test examples 2>/dev/null | sort)
if [ "$found" -eq 0 ]; then
  echo "fuzz.sh: no fuzz targets found" >&2
  exit 1
fi
echo "fuzz.sh: $found targets"
