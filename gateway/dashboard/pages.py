"""The dashboard's pages: sign-in (an API key for a session cookie), sign-out, the app shell, and
the static files (the page's script and style, and uPlot, vendored from npm with its licence)."""

from __future__ import annotations

import html
import logging
import secrets
from pathlib import Path
from typing import Any

from litestar import Request, Response, Router, get, post
from litestar.di import Provide
from litestar.enums import RequestEncodingType
from litestar.params import Body
from litestar.response import Redirect
from litestar.static_files import create_static_files_router

from gateway.admin.service import AdminError, TenancyService
from gateway.contracts import Authenticator
from gateway.dashboard.api import DashboardApi
from gateway.dashboard.sessions import LOGIN_CSRF_COOKIE, PATH, SESSION_COOKIE, Sessions
from gateway.db.engine import Database
from gateway.errors import database_exception_handlers

log = logging.getLogger("switchyard.dashboard")
STATIC = Path(__file__).parent / "static"
_LOGIN = (STATIC / "login.html").read_text()
_INDEX = (STATIC / "index.html").read_text()


def _html(body: str, status: int = 200) -> Response[str]:
    return Response(
        body,
        media_type="text/html; charset=utf-8",
        status_code=status,
        headers={
            "cache-control": "no-store",
            "x-frame-options": "DENY",
            "content-security-policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
        },
    )


def _login_page(sessions: Sessions, message: str = "", status: int = 200, *, https: bool = False) -> Response[str]:
    token = secrets.token_urlsafe(24)
    page = _LOGIN.replace("{{csrf}}", token).replace("{{message}}", html.escape(message))
    response = _html(page, status)
    response.set_cookie(LOGIN_CSRF_COOKIE, token, max_age=3600, **sessions.cookie_attrs(https))  # type: ignore[call-overload]
    return response


@get("/login", sync_to_thread=False)
def login_form(request: Request[Any, Any, Any], sessions: Sessions) -> Response[str]:
    return _login_page(sessions, https=request.url.scheme == "https")


@post("/login", status_code=303)
async def login(
    request: Request[Any, Any, Any],
    auth: Any,
    sessions: Sessions,  # auth: an Authenticator (a Protocol,
    data: dict[str, str] = Body(media_type=RequestEncodingType.URL_ENCODED),  # which DI cannot check)
) -> Response[Any]:
    form_token, cookie_token = data.get("csrf", ""), request.cookies.get(LOGIN_CSRF_COOKIE, "")
    if not form_token or not secrets.compare_digest(form_token, cookie_token):
        return _login_page(sessions, "The form expired; please sign in again.", 403,
                           https=request.url.scheme == "https")
    try:
        principal = await auth.authenticate(data.get("api_key", "").strip()) if data.get("api_key") else None
    except Exception:
        log.exception("authenticator failed")
        return _login_page(sessions, "Sign-in is temporarily unavailable; please try again shortly.", 503,
                           https=request.url.scheme == "https")
    if principal is None:
        return _login_page(sessions, "That API key is not valid (or is revoked or expired).", 401,
                           https=request.url.scheme == "https")
    cookie, _ = sessions.issue(principal.key_id, principal.tenant_id, principal.is_admin)
    response: Response[Any] = Redirect(PATH, status_code=303)
    attrs = sessions.cookie_attrs(request.url.scheme == "https")
    response.set_cookie(SESSION_COOKIE, cookie, max_age=int(sessions.lifetime), **attrs)  # type: ignore[call-overload]
    response.delete_cookie(LOGIN_CSRF_COOKIE, path=PATH)
    return response


@post("/logout", status_code=303)
async def logout(
    request: Request[Any, Any, Any],
    sessions: Sessions,
    data: dict[str, str] = Body(media_type=RequestEncodingType.URL_ENCODED),
) -> Response[Any]:
    session = sessions.verify(request.cookies.get(SESSION_COOKIE))
    if session is not None and not sessions.check_csrf(session, data.get("csrf")):
        return _html("<p>Invalid form token. <a href='/dashboard'>Back</a></p>", 403)
    response: Response[Any] = Redirect(PATH + "/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path=PATH)
    return response


@get("/", sync_to_thread=False)
def index(request: Request[Any, Any, Any], sessions: Sessions) -> Response[Any]:
    session = sessions.verify(request.cookies.get(SESSION_COOKIE))
    if session is None:
        return Redirect(PATH + "/login", status_code=303)
    return _html(_INDEX.replace("{{csrf}}", sessions.csrf(session)))


def _error(_: Request[Any, Any, Any], exc: AdminError) -> Response[dict[str, Any]]:
    body = {"error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}}
    return Response(body, status_code=exc.status)


def dashboard_router(svc: TenancyService, db: Database, auth: Authenticator, sessions: Sessions) -> Router:
    static = create_static_files_router(
        path="/static", directories=[STATIC], include_in_schema=False, send_as_attachment=False
    )
    return Router(
        path=PATH,
        route_handlers=[login_form, login, logout, index, DashboardApi, static],
        dependencies={
            "svc": Provide(lambda: svc, sync_to_thread=False),
            "db": Provide(lambda: db, sync_to_thread=False),
            "auth": Provide(lambda: auth, sync_to_thread=False),
            "sessions": Provide(lambda: sessions, sync_to_thread=False),
        },
        exception_handlers={AdminError: _error, **database_exception_handlers},  # type: ignore[dict-item]
        include_in_schema=False,
    )
