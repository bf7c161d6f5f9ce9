"""A request that offers to switch protocols the server does not speak (``Upgrade: h2c``, which
java.net.http.HttpClient, and so many JVM clients, sends by default over plain http://): the offer
is declined and the request answered in HTTP/1.1, as RFC 9110 §7.8 allows.

httptools takes any request with ``Upgrade`` (and ``Connection: upgrade``) to have no body, the
connection's next bytes being the new protocol's: it ends the request at its head and stops. So such
a request's head is rebuilt without its ``Upgrade`` headers and parsed again, followed by the bytes
the parser left, by a fresh parser, which reads the body by its length or chunks and the requests
after it as any others. The head has been parsed once already, and its values hold no CR or LF
(llhttp refuses folded lines): rebuilding changes only its header names' case and the spaces around
values. The request's other headers, ``Connection: Upgrade, HTTP2-Settings`` and ``HTTP2-Settings``
among them, stay in its scope, harmless.
"""

from __future__ import annotations

import httptools


def head_without_upgrade(method: bytes, target: bytes, version: str, headers: list[tuple[bytes, bytes]]) -> bytes:
    """The request head of ``headers`` (uvicorn's: names in lower case) without its ``Upgrade``."""
    lines = [b"%s %s HTTP/%s" % (method, target, version.encode())]
    lines += [name + b": " + value for name, value in headers if name != b"upgrade"]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def fresh_parser(protocol: object) -> httptools.HttpRequestParser:
    """A request parser calling back ``protocol``, set up as uvicorn sets up its own."""
    parser = httptools.HttpRequestParser(protocol)
    parser.set_dangerous_leniencies(lenient_data_after_close=True)
    return parser
