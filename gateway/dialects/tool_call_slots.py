"""A chat stream's tool call deltas placed in stable calls, for the dialects that translate chat
answers (``/v1/responses``, ``/v1/messages``), so both tell the calls apart alike.

OpenAI streams each call under its ``index``, its id on the first delta. Providers off that schema
are read as well: a delta with no index (or a null one: Gemini's OpenAI-compatible API, older
Ollama, mistral.rs) continues the last call; parallel calls all under one index (Ollama) are told
apart by their ids. So a delta starts a new call where it carries a non-empty id other than the
upstream's id for the call it would continue (an id given first on a later delta names that same
call), or where there is no call to continue. Within one chunk's list, though, entries are calls
apart by their places: one with no index past the first starts a new call unless it repeats the
upstream's id of the call before it (continuations come in later chunks). A call the
upstream gives no id (or an empty one: NVIDIA NIM, GLM, StepFun) gets one of the gateway's own, the
same in every event. Plain chat relays the deltas as they came and never comes here.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from backends.tools_wire import ToolCallDelta


def new_call_id() -> str:
    """A call id of the gateway's own, in OpenAI's ``call_`` form."""
    return "call_" + uuid.uuid4().hex


def own_call_id(upstream_id: object, mint: Callable[[], str] = new_call_id) -> str:
    """A call's id: the upstream's, else (it sent none, a null or an empty one) a new one of ``mint``'s,
    so that each call has one and a tool result can answer it."""
    return upstream_id if isinstance(upstream_id, str) and upstream_id else mint()


@dataclass(slots=True)
class CallSlot:
    number: int  # the call's place among the answer's calls, from 0
    id: str  # the call's id in every event: the upstream's, else one of the gateway's own
    upstream_id: str  # the upstream's id for the call ("" while it has given none)


class CallSlots:
    """Tool call deltas -> the calls they belong to (``place``), for one stream."""

    def __init__(self, mint: Callable[[], str] = new_call_id) -> None:
        self._mint = mint  # a new call id of the gateway's own
        self._calls: list[CallSlot] = []
        self._by_index: dict[int, CallSlot] = {}  # the upstream's index -> the latest call under it

    def place(self, delta: ToolCallDelta, position: int = 0) -> tuple[CallSlot, bool]:
        """The call ``delta`` belongs to, and whether it starts that call; ``position``: its place in its
        chunk's ``tool_calls`` list (past the first, a delta with no index continues no earlier chunk's call)."""
        upstream_id = delta.id if isinstance(delta.id, str) else ""
        index = delta.index if isinstance(delta.index, int) else None
        call = self._by_index.get(index) if index is not None else (self._calls[-1] if self._calls else None)
        if call is None:
            new = True
        elif index is None and position > 0:  # a second entry of one list: the same call only by its id
            new = upstream_id == "" or call.upstream_id != upstream_id
        else:
            new = upstream_id != "" and call.upstream_id not in ("", upstream_id)
        if call is None or new:
            call = CallSlot(len(self._calls), own_call_id(upstream_id, self._mint), upstream_id)
            self._calls.append(call)
            if index is not None:
                self._by_index[index] = call
        elif upstream_id and not call.upstream_id:  # an id first given on a later delta: the same call
            call.upstream_id = upstream_id
        return call, new
