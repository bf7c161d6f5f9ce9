#!/usr/bin/env bash
# The gateway benchmarks on a bare x86-64 Linux host with a Python 3.12 and no network, from the
# kit bench/bare_host/build_kit.sh packed: PostgreSQL 15 and Redis started from native.tar.xz (as
# user pgkit, made if missing, else nobody), the wheels installed for the host's python3, then each of STEPS.
# Run as root, in the repository's root, on a host with nothing on ports 5432 and 6379:
#
#     [STEPS="scaling gateway nocredit"] [OUT=/tmp/kitout] bash bench/bare_host/run.sh [KIT_DIR]
#
# Steps: scaling, nocredit (bench.gateway_scaling with and without credit), gateway (bench.gateway),
# streams2, streams4 (its (c) with 2 or 4 workers), smoke (one worker, 1 s: a check of the kit).
# Each step's output goes to $OUT/<step>.txt, the progress to $OUT/steps.log.
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd)
KIT=$(cd "${1:-$REPO/.devkit}" && pwd)
OUT=${OUT:-/tmp/kitout}
PY=${PY:-python3}
STEPS=${STEPS:-scaling gateway nocredit}
mkdir -p "$OUT"
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/steps.log"; }

log "host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $($PY --version)"
mkdir -p /tmp/kitroot && tar -C /tmp/kitroot -xJf "$KIT/native.tar.xz" && chmod -R a+rX /tmp/kitroot || exit 1
if [ ! -e /usr/share/zoneinfo/UTC ]; then
  mkdir -p /usr/share/zoneinfo/Etc && cp /tmp/kitroot/zoneinfo/UTC /usr/share/zoneinfo/ \
    && cp /tmp/kitroot/zoneinfo/Etc/UTC /usr/share/zoneinfo/Etc/
fi
export TZ=UTC
LIBS=/tmp/kitroot/kitlib
PGBIN=/tmp/kitroot/usr/lib/postgresql/15/bin
PGUSER=pgkit  # PostgreSQL refuses to run as root
id $PGUSER >/dev/null 2>&1 || useradd -M -s /bin/sh $PGUSER 2>/dev/null || PGUSER=nobody
rm -rf /tmp/pgdata && mkdir -p /tmp/pgdata && chown $PGUSER /tmp/pgdata
asuser() {
  if command -v runuser >/dev/null; then runuser -u $PGUSER -- env LD_LIBRARY_PATH=$LIBS TZ=UTC "$@"
  else setpriv --reuid=$PGUSER --regid="$(id -g $PGUSER)" --clear-groups env LD_LIBRARY_PATH=$LIBS TZ=UTC "$@"; fi
}
asuser "$PGBIN/initdb" -D /tmp/pgdata -U postgres --auth=trust --locale=C --encoding=UTF8 >"$OUT/initdb.log" 2>&1 \
  || { log "initdb failed"; tail -20 "$OUT/initdb.log"; exit 1; }
cat >>/tmp/pgdata/postgresql.conf <<EOF
listen_addresses = '127.0.0.1'
port = 5432
unix_socket_directories = '/tmp'
max_connections = 300
autovacuum = off
EOF
asuser "$PGBIN/pg_ctl" -D /tmp/pgdata -l /tmp/pgdata/server.log -w start >/dev/null \
  || { log "postgres failed"; cat /tmp/pgdata/server.log; exit 1; }
env LD_LIBRARY_PATH=$LIBS /tmp/kitroot/usr/bin/redis-server --port 6379 --bind 127.0.0.1 --save '' \
  --appendonly no --daemonize yes --logfile /tmp/redis.log || { log "redis failed"; exit 1; }

SITE=/tmp/site
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE "$KIT"/whl/*.whl \
  >"$OUT/pip.log" 2>&1 || { log "pip failed"; tail -20 "$OUT/pip.log"; exit 1; }
export PYTHONPATH=$SITE:$REPO PYTHONUNBUFFERED=1
# The benchmarks start the gateway as the ``switchyard`` script beside sys.executable.
launcher() {
  local exe; exe=$($PY -c 'import sys; print(sys.executable)')
  printf '#!%s\nfrom gateway.cli import app\napp()\n' "$exe" >"$(dirname "$exe")/switchyard" \
    && chmod +x "$(dirname "$exe")/switchyard"
}
if ! launcher 2>/dev/null || [ -n "${FORCE_VENV:-}" ]; then  # a read-only interpreter: a venv that sees its packages
  IMAGE_SITE=$($PY -c 'import site; print("\n".join(site.getsitepackages()))')
  $PY -m venv --without-pip /tmp/v || { log "no venv"; exit 1; }
  echo "$IMAGE_SITE" >"$(/tmp/v/bin/python -c 'import site; print(site.getsitepackages()[0])')/image.pth"
  PY=/tmp/v/bin/python
  launcher || { log "no launcher"; exit 1; }
fi
log "python: $($PY -c 'import sys; print(sys.executable, sys.version)')"
lscpu -e >"$OUT/lscpu.txt" 2>&1
$PY - <<'EOF' || { log "no test database"; exit 1; }
import asyncio, asyncpg
async def main():
    conn = await asyncpg.connect(host="127.0.0.1", port=5432, user="postgres", database="postgres")
    await conn.execute("CREATE DATABASE test")
    await conn.close()
asyncio.run(main())
EOF
log "services up: $(pgrep -c postgres) postgres processes, redis $(pgrep -c redis-server)"
cd "$REPO" || exit 1

for step in $STEPS; do
  log "step $step"
  case $step in
    scaling) timeout 200 $PY -m bench.gateway_scaling --workers 1,2,4,8 --seconds 6 --loaders 4 --upstreams 3 ;;
    nocredit) timeout 200 $PY -m bench.gateway_scaling --workers 1,2,4,8 --seconds 6 --loaders 4 --upstreams 3 \
                --no-credit ;;
    gateway) timeout 260 $PY -m bench.gateway --seconds 6 --slices 3 ;;
    streams2 | streams4) timeout 200 $PY -m bench.gateway --workers "${step#streams}" --phases c --seconds 6 \
                           --slices 3 ;;  # (c) with more workers: the streams goal names no core count
    smoke) timeout 120 $PY -m bench.gateway_scaling --workers 1 --seconds 1 --loaders 2 --upstreams 1 ;;
  esac >"$OUT/$step.txt" 2>&1
  log "step $step: exit $? ($(tail -1 "$OUT/$step.txt"))"
done
log done
