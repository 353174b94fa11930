#!/usr/bin/env bash
# Regenerates cmd/server/release.pgo, the CPU profile the image's build
# (Dockerfile) uses for profile-guided optimisation of the server: runs the
# load benchmark with a CPU profile of the service per target and scenario,
# and merges them.
# Extra arguments go to the benchmark (e.g. -load.duration=5s).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
# The load benchmark as `make bench` runs it, one turn per target and
# scenario, each profiled whole.
make bench BENCHFLAGS="-load.rounds=1 -load.pprof $dir $*" >"$dir/bench.log" || { cat "$dir/bench.log"; exit 1; }
shopt -s nullglob
profiles=("$dir"/*.prof)
if [ "${#profiles[@]}" -eq 0 ]; then
  echo "the benchmark wrote no profiles" >&2; exit 1
fi
go tool pprof -proto "${profiles[@]}" >"$dir/merged.pgo"
# The profiles name the binary's temporary path; the repository gets none.
go run ./scripts/pgoscrub <"$dir/merged.pgo" >"$dir/scrubbed.pgo"
mv "$dir/scrubbed.pgo" cmd/server/release.pgo
echo "cmd/server/release.pgo: merged ${#profiles[@]} profiles"
