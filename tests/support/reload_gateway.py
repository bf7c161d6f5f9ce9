"""A gateway served in a thread from a config file it can reload (SIGHUP or ``/admin/v1/reload``),
with the admin key and the user key ``USER_KEY`` (tenant ``t``); admission is scripted and usage
recorded."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from backends.factory import build_backend
from gateway.app import create_app
from gateway.contracts import Principal
from gateway.routing.router import Router
from gateway.services import Services
from gateway.settings import load_settings
from tests.conftest import ADMIN_KEY
from tests.support.doubles import RecordingSink, ScriptedAdmission, StaticKeys
from tests.support.servers import ServerThread

USER_KEY = "sk-user"


@contextmanager
def reloadable_gateway(path: Path, usage: RecordingSink | None = None) -> Iterator[ServerThread]:
    settings = load_settings(path, env={})
    keys = StaticKeys({ADMIN_KEY: Principal(key_id="admin", tenant_id=None, is_admin=True),
                       USER_KEY: Principal(key_id="user", tenant_id="t")})
    services = Services(authenticator=keys, admission=ScriptedAdmission(), usage=usage or RecordingSink(),
                        router=Router.from_settings(settings, build_backend))
    with ServerThread(create_app(settings, services, config_path=path)) as server:
        yield server
