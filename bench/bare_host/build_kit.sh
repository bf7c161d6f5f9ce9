#!/usr/bin/env bash
# Packs what the gateway benchmarks need on a bare x86-64 Linux host that has a Python 3.12 and no
# network (a lent machine with more cores than this one): the gateway's Python packages as wheels,
# and PostgreSQL 15 and Redis as this Debian host's own binaries with the libraries they load.
#
#     bash bench/bare_host/build_kit.sh [KIT_DIR]        # default .devkit (git ignores it)
#
# Then copy the repository with KIT_DIR to the host and run bench/bare_host/run.sh there. Wheels of
# packages the host's Python already has (SKIP below: a CUDA image's torch environment) are left
# out; set SKIP="" for a bare Python. About 18 MB of wheels and 22 MB of native.tar.xz.
set -euo pipefail
cd "$(dirname "$0")/../.."
KIT=${1:-.devkit}
PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
SKIP=${SKIP-"anyio certifi charset_normalizer click h11 httpcore httpx idna markdown_it_py markupsafe mdurl multidict
numpy pygments pyyaml requests rich tqdm typing_extensions urllib3"}
PG=/usr/lib/postgresql/15
mkdir -p "$KIT/whl"

platforms=()
for n in 2_17 2_24 2_27 2_28 2_31 2_34 2_35; do platforms+=(--platform "manylinux_${n}_x86_64"); done
$PY -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$KIT/whl" \
  "llguidance>=1.9,<1.10" "litestar>=2.12,<3" "msgspec>=0.18" "uvicorn>=0.30" "httptools>=0.6,<1" "hiredis>=3" \
  "sqlalchemy[asyncio]>=2.0.30" "alembic>=1.13" "aiosqlite>=0.20" "asyncpg>=0.29" "opentelemetry-sdk>=1.25" \
  "opentelemetry-exporter-otlp-proto-http>=1.25" "gguf>=0.10" "redis>=5"
for name in $SKIP; do rm -f "$KIT/whl/$name"-*.whl; done

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
chmod 755 "$root"
mkdir -p "$root$PG/bin" "$root$PG/lib" "$root/usr/share/postgresql" "$root/usr/bin" "$root/kitlib" "$root/zoneinfo/Etc"
cp "$PG"/bin/{postgres,initdb,pg_ctl} "$root$PG/bin/"
find "$PG/lib" -maxdepth 1 -name '*.so' ! -name 'llvmjit*' -exec cp {} "$root$PG/lib/" \;
cp -r /usr/share/postgresql/15 "$root/usr/share/postgresql/15"
cp "$(command -v redis-server)" "$root/usr/bin/"
# Every library they load but the C library's own (those the host's loader must provide).
for bin in "$root$PG"/bin/* "$root$PG"/lib/*.so "$root/usr/bin/redis-server"; do
  ldd "$bin" | awk '/=>/ {print $3}'
done | sort -u | grep -vE '/(libc|libm|libresolv|libpthread|libdl|librt)\.so|ld-linux' | xargs -I{} cp -L {} "$root/kitlib/"
cp -L /usr/share/zoneinfo/UTC "$root/zoneinfo/" && cp -L /usr/share/zoneinfo/Etc/UTC "$root/zoneinfo/Etc/"
tar -C "$root" -cJf "$KIT/native.tar.xz" .
du -sh "$KIT/whl" "$KIT/native.tar.xz"
