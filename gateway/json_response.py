"""The response a whole JSON answer goes out in: Litestar's ``Response``, cheaper to turn into ASGI.

Litestar's ``ASGIResponse`` puts its headers one by one into a ``MutableScopeHeaders`` and then sets
``content-type`` and ``content-length`` where absent with two case-insensitive scans that decode
every header again, on a completion's dozen headers (the request id, six rate-limit headers). Here
the body is bytes already, so the start message's header list is made in one pass, with the same
headers in the same order (``bench.gateway_ab``: 4-8 % less CPU per request). A route or app that
adds headers or cookies of its own gets Litestar's conversion unchanged. ``gateway.event_stream``
makes a stream's header list the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from litestar import Response
from litestar.datastructures import MutableScopeHeaders
from litestar.response.base import ASGIResponse
from litestar.types import Receive, Scope, Send

if TYPE_CHECKING:
    from litestar import Litestar, Request
    from litestar.background_tasks import BackgroundTask, BackgroundTasks

JSON = b"application/json"


class JSONResponse(Response[bytes]):
    """``application/json`` with a body already encoded."""

    def __init__(self, body: bytes, *, status_code: int | None = None, headers: dict[str, str] | None = None,
                 background: BackgroundTask | BackgroundTasks | None = None) -> None:
        # what Response.__init__ sets, without its isinstance checks against typing.Mapping (1-2 % of
        # a request's CPU in py-spy): the arguments here are never cookies or header objects
        self.content = body
        self.background = background
        self.cookies = []
        self.encoding = "utf-8"
        self.headers = dict(headers) if headers else {}
        self.media_type = "application/json"
        self.status_code = status_code
        self.response_type_encoders = dict(self.type_encoders or {})

    def sends_itself(self) -> bool:
        """Whether ``send_to`` sends what ``to_asgi_response`` would make of this response on a route
        that adds nothing (``gateway.fast_routes``): no cookies and no background task."""
        return not self.cookies and self.background is None

    async def send_to(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send this response as an ASGI app: the start (its status, 200 by default) and the body."""
        await send({"type": "http.response.start", "status": self.status_code or 200,
                    "headers": encode_headers(self.headers, JSON, len(self.content))})
        await send({"type": "http.response.body", "body": self.content, "more_body": False})

    def to_asgi_response(self, app: Litestar | None, request: Request[Any, Any, Any], **kwargs: Any) -> ASGIResponse:
        if litestar_adds(app, kwargs) or self.cookies:
            return super().to_asgi_response(app, request, **kwargs)
        return _EncodedResponse(self.status_code or kwargs.get("status_code") or 200,
                                encode_headers(self.headers, JSON, len(self.content)), self.content,
                                self.background or kwargs.get("background"))


def litestar_adds(app: Litestar | None, route: dict[str, Any]) -> bool:
    """Whether Litestar's ``to_asgi_response``, given ``route``'s keywords (what the route and app
    add), has more to put in the response than its own content, status and headers."""
    return bool(app is not None or route.get("cookies") or route.get("encoded_headers") is not None
                or route.get("headers") or route.get("is_head_response"))


def encode_headers(
    headers: dict[str, Any], content_type: bytes, content_length: int | None
) -> list[tuple[bytes, bytes]]:
    """The header list ``ASGIResponse`` makes of ``headers``: names lowercased, in order, then the
    content type and (when given) length unless ``headers`` has them."""
    raw = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
    names = {name for name, _ in raw}
    if b"content-type" not in names:
        raw.append((b"content-type", content_type))
    if content_length is not None and b"content-length" not in names:
        raw.append((b"content-length", b"%d" % content_length))
    return raw


class _EncodedResponse(ASGIResponse):
    """An ``ASGIResponse`` made from headers already encoded; sending is Litestar's."""

    __slots__ = ()

    def __init__(self, status_code: int, headers: list[tuple[bytes, bytes]], body: bytes,
                 background: BackgroundTask | BackgroundTasks | None) -> None:
        # every slot ASGIResponse.__init__ sets, without its per-header work
        self.headers = MutableScopeHeaders({"headers": headers})
        self.status_code = status_code
        self.body = body
        self.content_length = len(body)
        self.background = background
        self.encoding = "utf-8"
        self.is_head_response = False
        self._encoded_cookies = ()
