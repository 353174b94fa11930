#!/usr/bin/env bash
# Makes sure redis-server, redis-cli and memcached are on PATH: the tests
# start their own servers (Redis single node, Cluster, Sentinel; memcached)
# on free loopback ports. Installs the Debian packages redis-server and
# memcached when one is missing and this runs as root with apt-get.
set -euo pipefail
have() { command -v redis-server >/dev/null && command -v redis-cli >/dev/null && command -v memcached >/dev/null; }
if have; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "redis-server or memcached not found; installing the Debian packages redis-server and memcached" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq redis-server memcached >/dev/null
  # The packages start a system Redis on 6379 and memcached on 11211 where
  # an init system runs; the tests use neither.
  if have; then
    exit 0
  fi
  echo "installed the Debian packages redis-server and memcached, but redis-server, redis-cli or memcached is still not on PATH ($PATH)" >&2
  exit 1
fi
echo "the tests need redis-server, redis-cli and memcached: install the Debian packages 'redis-server' and 'memcached' (apt-get install redis-server memcached) or put them on PATH" >&2
exit 1
