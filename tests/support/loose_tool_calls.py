"""Tool calls as OpenAI-compatible providers send them off OpenAI's schema, scripted for the fake
upstream (``chat_chunks``, ``chat_answer``): streamed call deltas with no ``index`` (Gemini's
OpenAI-compatible API, older Ollama, mistral.rs, some proxies) or ``index: null``, parallel calls
streamed all under ``index`` 0 each starting with its own id (Ollama), and whole answers whose calls
have no ``id`` or a null one. Each case gives the calls it holds: (the upstream's id, or None where it
gave none; the name; the whole arguments)."""

from __future__ import annotations

from typing import Any

from tests.support.fake_upstream import Fault, chat_answer, chat_chunks

Call = tuple[str | None, str, str]  # the upstream's id (None: none given), the name, the arguments


def _call(arguments: str, **fields: Any) -> dict[str, Any]:
    """A call delta (its ``function`` holding ``arguments`` and what ``fields`` name in it)."""
    function = {k: fields.pop(k) for k in ("name",) if k in fields} | {"arguments": arguments}
    return {"type": "function", "function": function} | fields


# name -> (each chunk's ``tool_calls``, the calls they make)
STREAMED: dict[str, tuple[list[list[dict[str, Any]]], list[Call]]] = {
    # (a) no index: a new id starts a call, a delta with none continues the last
    "no index": ([[_call("", id="call_a", name="f")], [{"function": {"arguments": '{"city":'}}],
                  [{"function": {"arguments": '"Paris"}'}}], [_call('{"city":"Oslo"}', id="call_b", name="g")]],
                 [("call_a", "f", '{"city":"Paris"}'), ("call_b", "g", '{"city":"Oslo"}')]),
    # (a) index null, as Gemini's proxies send it, two calls whole in one chunk
    "null index": ([[_call('{"city":"Paris"}', index=None, id="call_a", name="f"),
                     _call('{"city":"Oslo"}', index=None, id="call_b", name="g")]],
                   [("call_a", "f", '{"city":"Paris"}'), ("call_b", "g", '{"city":"Oslo"}')]),
    # (a) and (b): no index and no id (or an empty one): one call, its arguments in pieces
    "no index, no id": ([[_call('{"city":', name="f")], [{"id": "", "function": {"arguments": '"Rome"}'}}]],
                        [(None, "f", '{"city":"Rome"}')]),
    # (a) and (b): two calls with no index and no id in one chunk: calls apart by their places, and a
    # later chunk's delta with neither continues the second
    "no index, no id, two in one chunk": ([[_call('{"city":"Paris"}', name="f"), _call('{"city":', name="g")],
                                           [{"function": {"arguments": '"Oslo"}'}}]],
                                          [(None, "f", '{"city":"Paris"}'), (None, "g", '{"city":"Oslo"}')]),
    # (c) parallel calls all under index 0, each starting with its own id
    "parallel under index 0": ([[_call('{"city":"Paris"}', index=0, id="call_a", name="f")],
                                [_call('{"city":', index=0, id="call_b", name="g")],
                                [{"index": 0, "function": {"arguments": '"Oslo"}'}}]],
                               [("call_a", "f", '{"city":"Paris"}'), ("call_b", "g", '{"city":"Oslo"}')]),
}

# (b) a whole answer's calls with no id, or a null one
ANSWERED_CALLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "f", "arguments": '{"city":"Paris"}'}},
    {"id": None, "type": "function", "function": {"name": "g", "arguments": '{"city":"Oslo"}'}}]
ANSWERED: list[Call] = [(None, "f", '{"city":"Paris"}'), (None, "g", '{"city":"Oslo"}')]


def streamed(case: str) -> Fault:
    """The upstream's stream for ``case``: each chunk's calls, then the finish."""
    chunks = ({"delta": {"role": "assistant", "tool_calls": calls} if i == 0 else {"tool_calls": calls}}
              for i, calls in enumerate(STREAMED[case][0]))
    return chat_chunks(*chunks, {"delta": {}, "finish_reason": "tool_calls"},
                       usage={"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12})


def answered() -> Fault:
    """A whole answer whose calls have no id (the first) or a null one (the second)."""
    return chat_answer({"role": "assistant", "content": None, "tool_calls": ANSWERED_CALLS}, "tool_calls")


def ids_kept(upstream: list[Call], ids: list[str]) -> bool:
    """Whether ``ids`` (a translated answer's, one per call) are the upstream's where it gave them, and
    all set and distinct."""
    given = [u for u, _, _ in upstream]
    return all(ids) and len(set(ids)) == len(ids) and all(g is None or g == i for g, i in zip(given, ids, strict=True))
