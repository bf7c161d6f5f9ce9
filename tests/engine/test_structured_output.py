"""Constrained decoding (engine/structured_output): grammar cache, the sampler's bitmask on a batch
mixing constrained and free rows, matcher state through n > 1, preemption by recompute, chunked
prefill and stop strings; logit_bias; compile errors naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch

from engine import LLM, InvalidRequest, SamplingParams
from engine.sampler import Sampler, SamplingRow
from engine.structured_output import PendingBitmask, StructuredOutput, apply_bitmask, fill_bitmask, words_for
from engine.tiny_model import build_tiny_model

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]},
                                               "maxItems": 4},
                                      "score": {"type": "number", "minimum": -1, "maximum": 1}},
     "required": ["tags", "score"], "additionalProperties": False},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "id": {"type": "integer"}, "ok": {"type": "boolean"}}, "required": ["id", "ok"],
        "additionalProperties": False}},
     "required": ["user"], "additionalProperties": False},
]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="module")
def llm(model_path: Path) -> LLM:
    return LLM(str(model_path), num_kv_blocks=256, max_model_len=512)


def json_params(schema: dict[str, Any], **kw: Any) -> SamplingParams:
    kw.setdefault("max_tokens", 300)
    return SamplingParams(structured=StructuredOutput("json", json.dumps(schema)), **kw)


@pytest.mark.parametrize("schema", SCHEMAS)
def test_every_answer_validates(llm: LLM, schema: dict[str, Any]) -> None:
    outs = llm.generate(["Hello", "Tell me"], json_params(schema, temperature=1.0, n=3, seed=3))
    for out in outs:
        for c in out.outputs:
            assert c.finish_reason == "stop", c.text
            jsonschema.validate(json.loads(c.text), schema)


def test_batch_mixes_constrained_and_free_rows(llm: LLM) -> None:
    free = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    alone = llm.generate(["Hello"], free)[0].outputs[0].token_ids
    engine = llm.engine
    engine.add_request("c", "Hello", json_params(SCHEMAS[0], temperature=0))
    engine.add_request("f", "Hello", free)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    assert done["f"].outputs[0].token_ids == alone  # the free row is untouched by the other's mask
    jsonschema.validate(json.loads(done["c"].outputs[0].text), SCHEMAS[0])


def test_sampler_applies_the_bitmask_per_row() -> None:
    vocab = 70
    logits = torch.randn(3, vocab)
    mask = torch.full((3, words_for(vocab)), -1, dtype=torch.int32)
    mask[1] = 0
    mask[1, 1] = 1 << 3  # row 1 allows token 35 only
    rows = [SamplingRow(SamplingParams(temperature=t), [1], [], None, []) for t in (0.0, 1.0, 0.0)]
    out = Sampler("cpu")(logits, rows, mask)
    assert out.token_ids[0] == int(logits[0].argmax())
    assert out.token_ids[1] == 35
    assert out.token_ids[2] == int(logits[2].argmax())
    masked = apply_bitmask(logits, mask)
    assert torch.isinf(masked[1]).sum() == vocab - 1 and not torch.isinf(masked[0]).any()


def test_fill_bitmask_is_none_without_constraints() -> None:
    assert fill_bitmask([None, None], 4) is None


def test_grammar_cache_compiles_once(llm: LLM) -> None:
    so = StructuredOutput("json", json.dumps({"type": "object", "properties": {"k": {"type": "integer"}}}))
    manager = llm.engine.processor.structured()
    before = manager.compile_count
    manager.compile(so)
    manager.compile(StructuredOutput("json", so.spec))
    assert manager.compile_count == before + 1


def test_preemption_and_chunked_prefill_keep_the_matcher(model_path: Path) -> None:
    # A cache too small for every sequence at once forces preemption by recompute; a small token
    # budget splits the prompts into chunks.
    small = LLM(str(model_path), num_kv_blocks=12, block_size=16, max_model_len=192, max_num_batched_tokens=32,
                enable_chunked_prefill=True)
    prompt = "Hello there, how are you? " * 4
    outs = small.generate([prompt] * 6, json_params(SCHEMAS[1], temperature=1.0, seed=7, max_tokens=120))
    preempted = small.engine.get_metrics().num_preemptions
    for out in outs:
        c = out.outputs[0]
        assert c.finish_reason == "stop", c.text
        jsonschema.validate(json.loads(c.text), SCHEMAS[1])
    assert preempted > 0


def test_choice_regex_and_grammar(llm: LLM) -> None:
    choice = SamplingParams(temperature=1.0, seed=1, max_tokens=20,
                            structured=StructuredOutput("choice", json.dumps(["yes", "no"])))
    assert llm.generate(["Hi"], choice)[0].outputs[0].text in ("yes", "no")
    regex = SamplingParams(temperature=1.0, seed=2, max_tokens=20, structured=StructuredOutput("regex", r"[0-9]{3}-x"))
    text = llm.generate(["Hi"], regex)[0].outputs[0].text
    assert len(text) == 5 and text[:3].isdigit() and text.endswith("-x")
    lark = SamplingParams(temperature=1.0, seed=3, max_tokens=20,
                          structured=StructuredOutput("grammar", 'start: "a" ("b" | "c")'))
    assert llm.generate(["Hi"], lark)[0].outputs[0].text in ("ab", "ac")


def test_stop_string_ends_a_constrained_answer(llm: LLM) -> None:
    p = SamplingParams(temperature=0, max_tokens=30, stop=["-"],
                       structured=StructuredOutput("regex", r"[0-9]{3}-x"))
    c = llm.generate(["Hi"], p)[0].outputs[0]
    assert len(c.text) == 3 and c.text.isdigit()


def test_logit_bias(llm: LLM) -> None:
    base = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))[0].outputs[0]
    top = base.token_ids[0]
    banned = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True,
                                                    logit_bias={top: -100}))[0].outputs[0]
    assert banned.token_ids[0] != top
    forced = llm.generate(["Hello"], SamplingParams(temperature=1.0, seed=0, max_tokens=5, ignore_eos=True,
                                                    logit_bias={77: 100}))[0].outputs[0]
    assert forced.token_ids == [77] * 5


@pytest.mark.parametrize(("so", "fragment"), [
    (StructuredOutput("json", "{not json"), "not valid JSON"),
    (StructuredOutput("json", json.dumps({"type": "string", "pattern": "(?<=a)b"})), "cannot compile"),
    (StructuredOutput("regex", "(", param="structured_outputs.regex"), ""),
    (StructuredOutput("choice", "[]", param="guided_choice"), "non-empty"),
])
def test_bad_grammars_name_the_field(llm: LLM, so: StructuredOutput, fragment: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        llm.engine.processor.process("x", "Hi", SamplingParams(structured=so))
    assert info.value.param == so.param and fragment in info.value.message


def test_logit_bias_is_checked() -> None:
    with pytest.raises(InvalidRequest) as info:
        SamplingParams(logit_bias={3: 101})
    assert info.value.param == "logit_bias"


def test_gbnf_grammar(llm: LLM) -> None:
    p = SamplingParams(temperature=1.0, seed=4, max_tokens=20,
                       structured=StructuredOutput("grammar", 'root ::= "x" ("y" | "z")'))
    assert llm.generate(["Hi"], p)[0].outputs[0].text in ("xy", "xz")


@pytest.mark.parametrize("ban", ["min_tokens", "logit_bias"])
def test_a_finished_grammar_stops_even_when_eos_is_banned(llm: LLM, ban: str) -> None:
    """The grammar is complete (it admits only EOS next) while EOS is banned: the sequence ends
    there with "stop" and never emits a token outside the grammar."""
    eos = sorted(llm.engine.eos_token_ids)
    extra: dict[str, Any] = {"min_tokens": 12} if ban == "min_tokens" else {"logit_bias": {t: -100 for t in eos}}
    for so in (StructuredOutput("regex", r"[0-9]{3}-x"),
               StructuredOutput("json", json.dumps(SCHEMAS[0]))):
        p = SamplingParams(temperature=1.0, seed=5, max_tokens=40, structured=so, **extra)
        c = llm.generate(["Hi"], p)[0].outputs[0]
        assert c.finish_reason == "stop", c.text
        assert not set(c.token_ids) & set(eos)
        if so.kind == "regex":
            assert len(c.text) == 5 and c.text[:3].isdigit() and c.text.endswith("-x")
        else:
            jsonschema.validate(json.loads(c.text), SCHEMAS[0])


def test_apply_bitmask_follows_every_bit() -> None:
    """The byte-table bias equals the bits read one by one; free rows are untouched; a mask
    narrower than the vocabulary forbids the tokens beyond it."""
    gen = torch.Generator().manual_seed(0)
    vocab = 100
    mask = torch.randint(-2**31, 2**31 - 1, (4, words_for(vocab)), dtype=torch.int32, generator=gen)
    mask[2] = -1
    logits = torch.randn(4, vocab, generator=gen)
    allowed = torch.tensor([[(int(mask[r, t // 32]) >> (t % 32)) & 1 for t in range(vocab)] for r in range(4)]).bool()
    assert torch.equal(apply_bitmask(logits.clone(), mask), torch.where(allowed, logits, float("-inf")))
    narrow_mask = torch.tensor([[-1, 0x7FFFFFFF]], dtype=torch.int32)  # tokens 0..62 allowed
    narrow = apply_bitmask(logits[:1].clone(), narrow_mask)
    assert not torch.isinf(narrow[0, :63]).any() and torch.isinf(narrow[0, 63:]).all()


def test_parallel_and_overlapped_fills_equal_the_plain_one(llm: LLM) -> None:
    """The executor's fill (used in the helper thread when the forward runs on an accelerator)
    gives the same bitmask as the row-by-row fill."""
    manager = llm.engine.processor.structured()
    matchers: list[Any] = [manager.matcher(StructuredOutput("json", json.dumps(s))) for s in SCHEMAS] + [None]
    tok = llm.engine.tokenizer
    assert tok is not None
    for t in tok.encode('{"', add_special_tokens=False):
        for m in matchers[:-1]:
            m.consume_token(t)
    words = words_for(manager.vocab_size)
    plain = fill_bitmask(matchers, words)
    assert plain is not None and torch.equal(plain[-1], torch.full((words,), -1, dtype=torch.int32))
    assert torch.equal(fill_bitmask(matchers, words, parallel=True), plain)
    assert torch.equal(PendingBitmask(matchers, words, overlap=True).result(), plain)
    assert torch.equal(PendingBitmask(matchers, words, overlap=False).result(), plain)


_SELF = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}


@pytest.mark.parametrize("schema", [
    _SELF,
    {"$ref": "#"},
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"},
    {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"], **{k: v for k, v in _SELF.items()
                                                                                        if k == "$defs"}},
])
def test_a_schema_looping_on_itself_is_refused_up_front(llm: LLM, schema: dict[str, Any]) -> None:
    # The grammar engine compiles it, then errs at the loop: a request failed mid-answer (after a
    # streamed 200). Refused when the request is made instead.
    so = StructuredOutput("json", json.dumps(schema), param="response_format.json_schema.schema")
    with pytest.raises(InvalidRequest) as info:
        llm.engine.processor.process("x", "Hi", SamplingParams(structured=so))
    assert info.value.param == so.param and "refers to itself" in info.value.message


def test_recursion_through_a_value_is_still_accepted(llm: LLM) -> None:
    tree = {"$defs": {"n": {"type": "object", "properties": {"v": {"type": "integer"}, "c": {
        "type": "array", "items": {"$ref": "#/$defs/n"}, "maxItems": 2}}, "required": ["v"],
        "additionalProperties": False}}, "$ref": "#/$defs/n"}
    either = {"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "integer"}]}}, "$ref": "#/$defs/a"}
    for schema in (tree, either):
        out = llm.generate(["Hello"], json_params(schema, temperature=0, max_tokens=200))[0].outputs[0]
        if out.finish_reason == "stop":
            jsonschema.validate(json.loads(out.text), schema)


def test_boolean_schemas(llm: LLM) -> None:
    # ``true`` (any value) and ``false`` (none) are JSON schemas; llguidance takes objects only
    # and answered "Expecting object schema to apply options" to both.
    out = llm.generate(["Hello"], SamplingParams(structured=StructuredOutput("json", "true"), temperature=0,
                                                 max_tokens=40))[0].outputs[0]
    if out.finish_reason == "stop":
        json.loads(out.text)
    so = StructuredOutput("json", "false", param="structured_outputs.json")
    with pytest.raises(InvalidRequest) as info:
        llm.engine.processor.process("x", "Hi", SamplingParams(structured=so))
    assert info.value.param == so.param and "matches no value" in info.value.message
