"""What a served request leaves behind once it has ended."""

from __future__ import annotations

import gc

import httpx

from tests.conftest import ADMIN_KEY
from tests.gateway.conftest import GatewayEnv

AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
CHAT = [{"role": "user", "content": "hi"}]


def test_served_requests_leave_no_reference_cycle_behind(env: GatewayEnv) -> None:
    """Each request's objects go by reference counting as it ends: none of the server's request
    cycles (which hold the scope) is left for the garbage collector, whose passes over such
    leftovers cost every request (gateway.app.GatewayApp drops its scope key when done)."""
    from uvicorn.protocols.http.h11_impl import RequestResponseCycle as H11Cycle
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle as HttpToolsCycle

    gc.collect()
    gc.disable()
    try:
        for stream in (False, True) * 5:
            body = {"model": "echo", "messages": CHAT, "stream": stream}
            with httpx.stream("POST", env.server.url + "/v1/chat/completions", json=body, headers=AUTH,
                              timeout=10) as r:
                assert r.status_code == 200
                r.read()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        cycles = [o for o in gc.garbage if isinstance(o, (H11Cycle, HttpToolsCycle))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert cycles == []
