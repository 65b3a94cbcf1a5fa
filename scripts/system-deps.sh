#!/usr/bin/env bash
# System packages the test suite needs (docker-compose validates compose files offline, Chromium drives the
# Carbon page's browser tests), the local PostgreSQL the production-backend tests use and Redis (the Celery broker).
# Installs what is missing with apt when run as root; otherwise says exactly what to install and fails.
set -euo pipefail
PACKAGES=(docker-compose chromium chromium-driver)
missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing system packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "error: the tests need these system packages: ${missing[*]}" >&2
    echo "install them with: sudo apt-get install ${missing[*]}   (then rerun make test)" >&2
    exit 1
  fi
fi
# PostgreSQL backs the production-backend tests; start the machine's cluster if it is stopped.
if command -v pg_ctlcluster >/dev/null && ! pg_isready -h 127.0.0.1 -q 2>/dev/null; then
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start || true
fi
# Redis is the Celery broker of `make e2e-distributed`; start a local one if none answers.
if command -v redis-cli >/dev/null && ! redis-cli -h 127.0.0.1 ping >/dev/null 2>&1; then
  if command -v redis-server >/dev/null; then
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 >/dev/null
  else
    echo "error: make e2e-distributed needs Redis at 127.0.0.1:6379 (sudo apt-get install redis-server)" >&2
    exit 1
  fi
fi
