"""A real gateway on loopback over test doubles: static keys, scripted admission, usage recorded in memory."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from backends.factory import build_backend
from gateway.contracts import Principal
from gateway.routing.router import BackendBuilder, Router
from gateway.services import Services
from gateway.settings import Settings
from tests.conftest import ADMIN_KEY
from tests.support.doubles import RecordingSink, ScriptedAdmission, StaticKeys
from tests.support.servers import ServerThread


@contextmanager
def scripted_gateway(settings: Settings, keys: dict[str, Principal] | None = None, *,
                     admission: ScriptedAdmission | None = None, usage: RecordingSink | None = None,
                     build: BackendBuilder = build_backend,
                     responses_db: str | None = None) -> Iterator[ServerThread]:
    """``settings`` served to ``keys`` (default: the admin key alone), with ``admission`` and ``usage``
    (fresh ones unless given) in place of Redis quotas and SQL metering, backends from ``build``, and
    Responses API answers kept in the (migrated) database at URL ``responses_db`` (None: none kept)."""
    from gateway.app import create_app  # imported when a gateway is made, not when tests are collected
    from gateway.db import Database
    from gateway.stored_responses import ResponseStore

    keys = keys if keys is not None else {ADMIN_KEY: Principal(key_id="admin", tenant_id=None, is_admin=True)}
    services = Services(authenticator=StaticKeys(keys),
                        admission=admission if admission is not None else ScriptedAdmission(),
                        usage=usage if usage is not None else RecordingSink(),
                        router=Router.from_settings(settings, build))
    if responses_db is not None:
        db = Database.from_url(responses_db)
        services.responses = ResponseStore(db)
        services.closers.append(db.dispose)
    with ServerThread(create_app(settings, services)) as server:
        yield server
