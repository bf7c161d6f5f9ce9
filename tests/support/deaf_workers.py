"""``switchyard serve --workers 2``'s supervisor over workers that cannot hear a SIGTERM while their
app loads, until the file ``$DEAF_UNTIL`` exists (as a worker signalled between its fork and its
exec cannot); each makes the file ``$DEAF_UNTIL.<its pid>`` once it is deaf, and serves a bare ASGI
app.

Run as ``python -m tests.support.deaf_workers PORT``."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from uvicorn.config import Config

from gateway.cli.workers import Supervisor


def create_app() -> Callable[..., Awaitable[None]]:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(f"{os.environ['DEAF_UNTIL']}.{os.getpid()}", "w").close()
    while not os.path.exists(os.environ["DEAF_UNTIL"]):
        time.sleep(0.05)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return _app


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def main(port: int) -> None:
    config = Config(f"{__name__}:create_app", factory=True, port=port, workers=2, lifespan="on")
    Supervisor(config, [config.bind_socket()]).run()


if __name__ == "__main__":
    main(int(sys.argv[1]))
