"""``CallSlots``: chat tool call deltas placed in stable calls, as OpenAI streams them and as
providers off its schema do (no index, a null one, parallel calls under one index, no ids)."""

from __future__ import annotations

from typing import Any

import msgspec

from backends.tools_wire import ToolCallDelta
from gateway.dialects.tool_call_slots import CallSlots, own_call_id


def _placed(*deltas: dict[str, Any]) -> list[tuple[int, str, bool]]:
    """(the call's number, its id, whether the delta starts it) for each delta, each in a chunk of its own."""
    return _chunks(*([d] for d in deltas))


def _chunks(*chunks: list[dict[str, Any]]) -> list[tuple[int, str, bool]]:
    """As ``_placed``, for the deltas of each chunk's ``delta.tool_calls`` list in turn."""
    numbered = iter(range(100))
    slots = CallSlots(lambda: f"own_{next(numbered)}")
    placed = (slots.place(msgspec.convert(d, ToolCallDelta), position)
              for chunk in chunks for position, d in enumerate(chunk))
    return [(slot.number, slot.id, new) for slot, new in placed]


def test_openais_own_deltas_follow_their_index() -> None:
    assert _placed({"index": 0, "id": "a"}, {"index": 1, "id": "b"}, {"index": 0}, {"index": 1, "id": None},
                   {"index": 0, "id": "a"}) == [(0, "a", True), (1, "b", True), (0, "a", False), (1, "b", False),
                                                (0, "a", False)]


def test_a_new_id_under_a_known_index_is_a_new_call() -> None:
    """Ollama streams parallel calls all under index 0; an empty id (DashScope's GLM) continues."""
    assert _placed({"index": 0, "id": "a"}, {"index": 0, "id": "b"}, {"index": 0, "id": ""}, {"index": 0}) == [
        (0, "a", True), (1, "b", True), (1, "b", False), (1, "b", False)]


def test_a_delta_with_no_index_continues_the_last_call_unless_it_names_a_new_id() -> None:
    assert _placed({"id": "a"}, {}, {"index": None, "id": "a"}, {"id": "b"}, {"id": ""}) == [
        (0, "a", True), (0, "a", False), (0, "a", False), (1, "b", True), (1, "b", False)]
    assert _placed({"index": None}, {"index": 3}, {}) == [(0, "own_0", True), (1, "own_1", True), (1, "own_1", False)]


def test_a_call_with_no_id_gets_one_of_the_gateways_own_kept_in_every_event() -> None:
    assert _placed({"index": 0}, {"index": 1, "id": ""}, {"index": 0}, {"index": 1}) == [
        (0, "own_0", True), (1, "own_1", True), (0, "own_0", False), (1, "own_1", False)]
    # an id given first on a later delta names the same call (its events already carry the gateway's)
    assert _placed({"index": 0}, {"index": 0, "id": "a"}, {"index": 0, "id": "a"}, {"index": 0, "id": "b"}) == [
        (0, "own_0", True), (0, "own_0", False), (0, "own_0", False), (1, "b", True)]


def test_a_whole_answers_call_keeps_its_id_or_gets_one() -> None:
    assert own_call_id("call_1") == "call_1"
    assert all(own_call_id(given).startswith("call_") and own_call_id(given) != "call_" for given in ("", None))
    assert own_call_id(None, lambda: "toolu_1") == "toolu_1"


def test_deltas_with_no_index_nor_id_in_one_chunk_are_calls_apart() -> None:
    """Two entries of one chunk's list are two calls by their places, though neither has an index or
    an id; a delta of a later chunk with neither (arguments only) still continues the last call."""
    one = {"function": {"name": "a", "arguments": "{"}}
    two = {"function": {"name": "b", "arguments": "{}"}}
    more = {"function": {"arguments": "}"}}
    assert _chunks([one, two], [more]) == [(0, "own_0", True), (1, "own_1", True), (1, "own_1", False)]
    assert _chunks([one], [more], [more, two], [more]) == [
        (0, "own_0", True), (0, "own_0", False), (0, "own_0", False), (1, "own_1", True), (1, "own_1", False)]
    # the same upstream id twice in one chunk is still one call; indexed deltas still go by their index
    assert _chunks([{"id": "a"}, {"id": "a"}, {"id": "b"}], [{}]) == [
        (0, "a", True), (0, "a", False), (1, "b", True), (1, "b", False)]
    assert _chunks([{"index": 0}, {"index": 1}], [{"index": 0}, {"index": 1}]) == [
        (0, "own_0", True), (1, "own_1", True), (0, "own_0", False), (1, "own_1", False)]
