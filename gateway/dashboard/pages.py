"""The dashboard's pages: sign-in (an API key for a session cookie), sign-out, the app shell, and
the static files (the page's script and style, and uPlot, vendored from npm with its licence).

Sign-in goes through the ``AuthGuard`` like every key (throttled per client address and key prefix,
audited); sign-out revokes the session on the server. The security headers (CSP, frame denial,
no-store) come from ``gateway.security_headers`` for every dashboard response."""

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

from gateway.admin.params import refuse_nul
from gateway.admin.service import AdminError, TenancyService
from gateway.auth.authenticator import ADMIN_KEY_ID
from gateway.auth.guard import AuthGuard, client_address
from gateway.contracts import Authenticator, Principal
from gateway.dashboard.api import DashboardApi, NotSignedIn, session_of
from gateway.dashboard.revocations import Revocations
from gateway.dashboard.sessions import LOGIN_CSRF_COOKIE, PATH, SESSION_COOKIE, Sessions, same_text
from gateway.db.engine import Database
from gateway.errors import ApiError, database_exception_handlers

log = logging.getLogger("switchyard.dashboard")
STATIC = Path(__file__).parent / "static"
_LOGIN = (STATIC / "login.html").read_text()
_INDEX = (STATIC / "index.html").read_text()


def _html(body: str, status: int = 200, headers: dict[str, str] | None = None) -> Response[str]:
    return Response(body, media_type="text/html", status_code=status, headers=headers)  # Litestar adds the charset


def _login_page(sessions: Sessions, message: str = "", status: int = 200, *, https: bool = False,
                headers: dict[str, str] | None = None) -> Response[str]:
    token = secrets.token_urlsafe(24)
    page = _LOGIN.replace("{{csrf}}", token).replace("{{message}}", html.escape(message))
    response = _html(page, status, headers)
    response.set_cookie(LOGIN_CSRF_COOKIE, token, max_age=3600, **sessions.cookie_attrs(https))  # type: ignore[call-overload]
    return response


@get("/login", sync_to_thread=False)
def login_form(request: Request[Any, Any, Any], sessions: Sessions) -> Response[str]:
    return _login_page(sessions, https=request.url.scheme == "https")


@post("/login", status_code=303)
async def login(
    request: Request[Any, Any, Any],
    auth: Any,  # an Authenticator (a Protocol, which DI cannot check)
    sessions: Sessions,
    guard: AuthGuard,
    data: dict[str, str] = Body(media_type=RequestEncodingType.URL_ENCODED),
) -> Response[Any]:
    https = request.url.scheme == "https"
    form_token, cookie_token = data.get("csrf", ""), request.cookies.get(LOGIN_CSRF_COOKIE, "")
    if not form_token or not same_text(form_token, cookie_token):
        return _login_page(sessions, "The form expired; please sign in again.", 403, https=https)
    client, key = client_address(request), data.get("api_key", "").strip()
    try:
        await guard.check(client)
    except ApiError as exc:
        return _login_page(sessions, exc.message, exc.status, https=https, headers=exc.headers)
    try:
        principal = await auth.authenticate(key) if key else None
    except Exception:
        log.exception("authenticator failed")
        return _login_page(sessions, "Sign-in is temporarily unavailable; please try again shortly.", 503,
                           https=https)
    if principal is None:
        try:
            await guard.failed(client, key, "dashboard", "login_failed")
        except ApiError as exc:
            return _login_page(sessions, exc.message, exc.status, https=https, headers=exc.headers)
        return _login_page(sessions, "That API key is not valid (or is revoked or expired).", 401, https=https)
    guard.audit.record("login", client=client, surface="dashboard", principal=principal)
    fingerprint = (sessions.admin_fingerprint or "") if principal.key_id == ADMIN_KEY_ID else ""
    cookie, _ = sessions.issue(principal.key_id, principal.tenant_id, principal.is_admin, fingerprint)
    response: Response[Any] = Redirect(PATH, status_code=303)
    attrs = sessions.cookie_attrs(request.url.scheme == "https")
    response.set_cookie(SESSION_COOKIE, cookie, max_age=int(sessions.lifetime), **attrs)  # type: ignore[call-overload]
    response.delete_cookie(LOGIN_CSRF_COOKIE, path=PATH)
    return response


@post("/logout", status_code=303)
async def logout(
    request: Request[Any, Any, Any],
    sessions: Sessions,
    revocations: Revocations,
    guard: AuthGuard,
    data: dict[str, str] = Body(media_type=RequestEncodingType.URL_ENCODED),
) -> Response[Any]:
    """Ends the session on the server (every replica refuses its cookie from now on) and clears it."""
    session = sessions.verify(request.cookies.get(SESSION_COOKIE))
    if session is not None:
        if not sessions.check_csrf(session, data.get("csrf")):
            return _html("<p>Invalid form token. <a href='/dashboard'>Back</a></p>", 403)
        await revocations.revoke(session)
        guard.audit.record("logout", client=client_address(request), surface="dashboard",
                           principal=Principal(key_id=session.key_id, tenant_id=session.tenant_id,
                                               is_admin=session.is_admin))
    response: Response[Any] = Redirect(PATH + "/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path=PATH)
    return response


@get("/")
async def index(request: Request[Any, Any, Any], sessions: Sessions, svc: TenancyService,
                revocations: Revocations) -> Response[Any]:
    try:
        session = await session_of(request, sessions, svc, revocations)
    except NotSignedIn:
        return Redirect(PATH + "/login", status_code=303)
    return _html(_INDEX.replace("{{csrf}}", sessions.csrf(session)))


def _error(_: Request[Any, Any, Any], exc: AdminError) -> Response[dict[str, Any]]:
    body = {"error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}}
    return Response(body, status_code=exc.status)


def dashboard_router(svc: TenancyService, db: Database, auth: Authenticator, sessions: Sessions,
                     guard: AuthGuard) -> Router:
    revocations = Revocations(db)
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
            "guard": Provide(lambda: guard, sync_to_thread=False),
            "revocations": Provide(lambda: revocations, sync_to_thread=False),
        },
        before_request=refuse_nul,  # a NUL in a path or query parameter: 400 naming it
        exception_handlers={AdminError: _error, **database_exception_handlers},  # type: ignore[dict-item]
        include_in_schema=False,
    )
