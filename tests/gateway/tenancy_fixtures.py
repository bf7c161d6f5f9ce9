"""Fixtures for the tenants/keys/quotas/usage tests: real PostgreSQL, Redis and SQLite.

PostgreSQL: a fresh database per test module, created from the server at 127.0.0.1:5432 (via the
database ``test``, trust auth, user root or postgres) and dropped afterwards.
Redis: a unique key prefix per test.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from redis.asyncio import Redis

from gateway.db import Database, migrate
from tests.conftest import ADMIN_KEY, gateway_settings
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import ServerThread

PG_HOST = os.environ.get("SWITCHYARD_TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("SWITCHYARD_TEST_PG_PORT", "5432"))
PG_DB = os.environ.get("SWITCHYARD_TEST_PG_DB", "test")
REDIS_URL = os.environ.get("SWITCHYARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


async def _pg_user() -> str:
    for user in (os.environ.get("SWITCHYARD_TEST_PG_USER"), "postgres", "root"):
        if not user:
            continue
        try:
            conn = await asyncpg.connect(host=PG_HOST, port=PG_PORT, user=user, database=PG_DB)
        except Exception:
            continue
        await conn.close()
        return user
    raise RuntimeError(f"cannot connect to PostgreSQL {PG_HOST}:{PG_PORT}/{PG_DB} as postgres or root")


async def pg_admin() -> asyncpg.Connection:
    return await asyncpg.connect(host=PG_HOST, port=PG_PORT, user=await _pg_user(), database=PG_DB)


async def new_pg_database() -> tuple[str, str]:
    """Create a fresh, empty database; return (name, async SQLAlchemy URL)."""
    name = f"sytest_{uuid.uuid4().hex[:12]}"
    user = await _pg_user()
    conn = await pg_admin()
    try:
        await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    finally:
        await conn.close()
    return name, f"postgresql+asyncpg://{user}@{PG_HOST}:{PG_PORT}/{name}"


async def drop_pg_database(name: str) -> None:
    conn = await pg_admin()
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest.fixture(scope="module")
async def pg_url() -> AsyncIterator[str]:
    """An empty PostgreSQL database for this module (not migrated)."""
    name, url = await new_pg_database()
    yield url
    await drop_pg_database(name)


@pytest.fixture(scope="module")
async def migrated_pg_url() -> AsyncIterator[str]:
    """A PostgreSQL database for this module, migrated to the head."""
    name, url = await new_pg_database()
    await asyncio.to_thread(migrate.upgrade, url)
    yield url
    await drop_pg_database(name)


@pytest.fixture(scope="module")
async def database(pg_url: str) -> AsyncIterator[Database]:
    """This module's PostgreSQL database (``pg_url``), migrated to the head, for reading what gateway
    processes wrote to it."""
    await asyncio.to_thread(migrate.upgrade, pg_url)
    db = Database.from_url(pg_url)
    yield db
    await db.dispose()


@pytest.fixture(scope="module")
def pg_admin_api(migrated_pg_url: str, fake_upstream_server: FakeUpstream,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """The real app on this module's migrated PostgreSQL, and a client holding the admin key."""
    from gateway.app import create_app

    work = tmp_path_factory.mktemp("admin-api")
    settings = gateway_settings(fake_upstream_server.url, database={"url": migrated_pg_url},
                                usage={"journal_dir": str(work / "journal")})
    with ServerThread(create_app(settings)) as server, httpx.Client(
        base_url=server.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=30
    ) as client:
        yield client


@pytest.fixture(scope="module")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('db') / 'switchyard.db'}"


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
async def db(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Database]:
    """A migrated database, on SQLite and on PostgreSQL."""
    pg_name = None
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('db') / 'switchyard.db'}"
    else:
        pg_name, url = await new_pg_database()
    await asyncio.to_thread(migrate.upgrade, url)
    database = Database.from_url(url)
    yield database
    await database.dispose()
    if pg_name:
        await drop_pg_database(pg_name)


@pytest.fixture
async def redis() -> AsyncIterator[Redis]:
    """redis-py, to look into Redis independently of the gateway's own client (``gateway.quotas.redis_client``)."""
    client = Redis.from_url(REDIS_URL)
    yield client
    await client.aclose()


@pytest.fixture
async def redis_prefix(redis: Redis) -> AsyncIterator[str]:
    """A unique key prefix; its keys are deleted afterwards."""
    prefix = f"sytest:{uuid.uuid4().hex[:10]}"
    yield prefix
    keys = [k async for k in redis.scan_iter(match=prefix + ":*", count=500)]
    if keys:
        await redis.delete(*keys)


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


class LoopbackServer:
    """A Litestar app served by uvicorn on a free loopback port, inside this process."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> str:
        self.task = asyncio.get_running_loop().create_task(self.server.serve())
        while not self.server.started:
            if self.task.done():
                self.task.result()
            await asyncio.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        self.server.should_exit = True
        if self.task is not None:
            await self.task


def plain_url(db: Database) -> str:
    """The full URL of a Database (for configs handed to gateways)."""
    return db.engine.url.render_as_string(hide_password=False)


class GatewayProcess:
    """``uvicorn --factory gateway.app:create_app_from_env`` as a separate process on a free port."""

    def __init__(self, config: dict[str, Any], workdir: Path, name: str = "gw") -> None:
        import socket

        import yaml

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.config_path = workdir / f"{name}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / f"{name}.log"
        self.journal_dir = workdir / f"{name}-journal"
        self.proc: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> GatewayProcess:
        import subprocess
        import sys
        import time

        import httpx

        env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD")}
        env |= {"SWITCHYARD_CONFIG": str(self.config_path), "SWITCHYARD__USAGE__JOURNAL_DIR": str(self.journal_dir)}
        cmd = [sys.executable, "-m", "tests.support.stack_dump",  # uvicorn, able to show its stacks (stop)
               "uvicorn", "--factory", "gateway.app:create_app_from_env",
               "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"]  # fmt: skip
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(cmd, env=env, cwd=repo_root(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited during start-up:\n{self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("gateway did not start in time")

    def stop(self) -> int | None:
        """SIGTERM and wait (the usage buffer is flushed on the way out); returns the exit code. A
        gateway still running 30 s later is made to dump its tasks' and threads' stacks, and the
        error raised shows them with the end of its log."""
        import signal
        import subprocess
        import time

        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR2)  # every asyncio task's stack (tests.support.stack_dump)
            time.sleep(1)
            self.proc.send_signal(signal.SIGABRT)  # every thread's (faulthandler), and the end
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            lines = [line for line in self.log_path.read_text().splitlines() if "switchyard.access" not in line]
            raise AssertionError("the gateway did not exit within 30 s of SIGTERM; its log, less the access lines:\n"
                                 + "\n".join(lines)[-20000:]) from None


@contextmanager
def gateway_processes(config: dict[str, Any], workdir: Path, names: list[str]) -> Iterator[list[GatewayProcess]]:
    """A ``GatewayProcess`` on ``config`` for each of ``names``, started in turn; all stopped afterwards."""
    procs = [GatewayProcess(config, workdir, name) for name in names]
    try:
        for p in procs:
            p.start()
        yield procs
    finally:
        for p in procs:
            p.stop()
