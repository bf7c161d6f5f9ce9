#!/usr/bin/env bash
# Start the services the tests need (PostgreSQL, Redis) when they are not already running.
# On a fresh Debian machine (as root) they are installed with apt first.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

pg_up() { (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; }
redis_up() { (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; }

if ! redis_up; then
  have redis-server || { as_root apt-get update -q && as_root apt-get install -y -q redis-server; }
  mkdir -p /tmp/switchyard-redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /tmp/switchyard-redis --logfile /tmp/switchyard-redis/redis.log
fi

if ! pg_up; then
  if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
    as_root apt-get update -q && as_root apt-get install -y -q postgresql
  fi
  ver=$(ls /etc/postgresql | sort -V | tail -n1)
  as_root pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
fi

# The dashboard tests drive Debian's headless Chromium through Playwright (never `playwright install`).
if ! have chromium; then
  as_root apt-get update -q && as_root apt-get install -y -q chromium
fi

for _ in $(seq 1 50); do
  if pg_up && redis_up; then break; fi
  sleep 0.2
done
redis_up || { echo "Redis did not start on 127.0.0.1:6379" >&2; exit 1; }
pg_up || { echo "PostgreSQL did not start on 127.0.0.1:5432" >&2; exit 1; }

# The tests use database `test` with trust auth for local connections.
if have psql; then
  if ! psql -h 127.0.0.1 -U postgres -tAc "select 1 from pg_database where datname='test'" 2>/dev/null | grep -q 1; then
    as_root su postgres -c "psql -c 'create database test'" >/dev/null 2>&1 || \
      psql -h 127.0.0.1 -U postgres -c 'create database test' >/dev/null 2>&1 || true
  fi
fi
echo "services: redis and postgresql are up"
