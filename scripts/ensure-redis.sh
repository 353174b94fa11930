#!/usr/bin/env bash
# Makes sure redis-server and redis-cli are on PATH: the tests start their own
# Redis servers (single node, Cluster, Sentinel) on free loopback ports.
set -euo pipefail
if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "redis-server not found; installing the Debian package redis-server" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq redis-server >/dev/null
  # The package starts a system Redis on 6379; the tests do not use it.
  if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
    exit 0
  fi
  echo "installed the Debian package redis-server, but redis-server or redis-cli is still not on PATH ($PATH)" >&2
  exit 1
fi
echo "redis-server is required by the tests: install the Debian package 'redis-server' (apt-get install redis-server) or put redis-server and redis-cli on PATH" >&2
exit 1
