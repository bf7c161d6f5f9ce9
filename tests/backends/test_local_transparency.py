"""Issue 19 on the built-in engine, through the gateway with the openai SDK: a parameter it does
not support is a 400 naming it, those that do not change the output are accepted, vLLM's spellings
of what it supports work, ``message.refusal`` is always present, a stream with ``n > 1`` has one
finish chunk per choice, and logprob ``bytes`` are each token's own bytes."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from backends.local.wire import LogprobFormatter
from engine.tokenizer import Tokenizer
from tests.support.local_gateway import KEY, Env, local_gateway

MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with local_gateway(tmp_path_factory.mktemp("transparent")) as s:
        yield s


@pytest.mark.parametrize("name, value", [("reasoning_effort", "low"), ("verbosity", "low"),
                                         ("web_search_options", {}),
                                         ("prediction", {"type": "content", "content": "x"})])
def test_unsupported_parameter_is_a_400_naming_it(env: Env, name: str, value: object) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        env.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2,  # type: ignore[arg-type]
                                             extra_body={name: value})
    assert caught.value.body["param"] == name  # type: ignore[index]


def test_unsupported_parameter_on_completions(env: Env) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        env.client().completions.create(model="tiny", prompt="hi", max_tokens=2, extra_body={"verbosity": "low"})
    assert caught.value.body["param"] == "verbosity"  # type: ignore[index]


def test_parameters_without_effect_are_accepted(env: Env) -> None:
    reply = env.client().chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=2, metadata={"a": "b"}, store=True, user="u",  # type: ignore[arg-type]
        service_tier="auto", extra_body={"prompt_cache_key": "k", "safety_identifier": "s"})
    assert reply.choices[0].message.refusal is None


def test_vllm_spellings_work(env: Env) -> None:
    client = env.client()
    base = dict(model="tiny", messages=MESSAGES, temperature=0.0, max_tokens=6)
    plain = client.chat.completions.create(**base)  # type: ignore[call-overload]
    assert plain.usage.completion_tokens == 6
    same = client.chat.completions.create(**base, extra_body={  # type: ignore[call-overload]
        "top_k": 1, "min_p": 0.0, "repetition_penalty": 1.0, "ignore_eos": True, "min_tokens": 6,
        "skip_special_tokens": True, "include_stop_str_in_output": False,
        "chat_template_kwargs": {"enable_thinking": False}})
    assert same.choices[0].message.content == plain.choices[0].message.content
    first = env.backend.tokenizer.encode(plain.choices[0].message.content, add_special_tokens=False)[0]
    stopped = client.chat.completions.create(**base, extra_body={"stop_token_ids": [first]})  # type: ignore[call-overload]
    assert stopped.usage.completion_tokens == 1 and stopped.choices[0].finish_reason == "stop"


def test_refusal_null_in_every_chat_answer(env: Env) -> None:
    headers = {"authorization": f"Bearer {KEY}"}
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 2}
    raw = httpx.post(env.server.url + "/v1/chat/completions", json=body, headers=headers, timeout=30).json()
    assert raw["choices"][0]["message"]["refusal"] is None and "refusal" in raw["choices"][0]["message"]


@pytest.mark.parametrize("chat", [True, False])
def test_stream_with_n_has_one_finish_chunk_per_choice(env: Env, chat: bool) -> None:
    client = env.client()
    if chat:
        stream = client.chat.completions.create(model="tiny", messages=MESSAGES, n=3, max_tokens=5,
                                                temperature=1.0, seed=1, stream=True)
    else:
        stream = client.completions.create(model="tiny", prompt="hello", n=3, max_tokens=5, seed=1,  # type: ignore[assignment]
                                           stream=True)
    finishes = [(c.index, c.finish_reason) for chunk in stream for c in chunk.choices if c.finish_reason]
    assert sorted(i for i, _ in finishes) == [0, 1, 2]


def test_logprob_bytes_are_each_tokens_own(env: Env) -> None:
    tok = Tokenizer(env.folder)
    text = "火车在铁轨上行驶。"
    ids = tok.encode(text, add_special_tokens=False)
    formatter = LogprobFormatter(tok)
    assert any("\ufffd" in formatter.token(i) for i in ids)  # some tokens split a character
    assert b"".join(bytes(formatter.token_bytes(i)) for i in ids) == text.encode()
    reply = env.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, logprobs=True,
                                                 top_logprobs=2, temperature=0.0)
    for item in reply.choices[0].logprobs.content:  # type: ignore[union-attr]
        token_id = tok.encode(item.token, add_special_tokens=False) if "\ufffd" not in item.token else None
        if token_id is not None and len(token_id) == 1:
            assert item.bytes == list(item.token.encode())


def test_messages_stop_sequence_and_input_tokens_on_the_engine(env: Env) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=env.server.url, api_key=KEY, max_retries=0)
    kw = dict(model="tiny", max_tokens=12, extra_body={"temperature": 0.0},
              messages=[{"role": "user", "content": "hello"}])
    free = client.messages.create(**kw)  # type: ignore[call-overload]
    text = free.content[0].text
    stop = next(c for c in text if c != "\ufffd" and not c.isspace())  # a whole character it generates

    message = client.messages.create(**kw, stop_sequences=[stop])  # type: ignore[call-overload]
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    with client.messages.stream(**kw, stop_sequences=[stop]) as stream:  # type: ignore[call-overload]
        events = list(stream)
        final = stream.get_final_message()
    start = next(e for e in events if e.type == "message_start")
    assert start.message.usage.input_tokens == free.usage.input_tokens > 0
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop


@pytest.mark.parametrize("include_usage", [False, True])
def test_continuous_usage_stats_puts_the_usage_so_far_in_every_chunk(env: Env, include_usage: bool) -> None:
    """vLLM's ``stream_options.continuous_usage_stats`` is honoured, not dropped: with ``include_usage``
    (as vLLM needs it) every chunk with choices carries the usage so far (as the gateway relays it
    from an upstream), then the closing usage chunk; the last count is the metered one. Without
    ``include_usage``, as vLLM, no chunk carries usage."""
    options = {"continuous_usage_stats": True} | ({"include_usage": True} if include_usage else {})
    env.usage.records.clear()
    chat = env.client().chat.completions.create(  # type: ignore[call-overload]
        model="tiny", messages=MESSAGES, max_tokens=4, temperature=0, stream=True, stream_options=options,
        extra_body={"ignore_eos": True})
    chunks = [c for c in chat]
    with_choices = [c for c in chunks if c.choices]
    if not include_usage:
        assert len(chunks) == len(with_choices) and all(c.usage is None for c in chunks)
        assert env.usage.wait_for(1)[0].completion_tokens == 4  # metered all the same
        text = env.client().completions.create(  # type: ignore[call-overload]
            model="tiny", prompt="hi", max_tokens=3, temperature=0, stream=True, stream_options=options,
            extra_body={"ignore_eos": True})
        assert all(c.usage is None for c in text)
        return
    assert all(c.usage is not None for c in with_choices)
    counts = [c.usage.completion_tokens for c in with_choices]
    assert counts[0] == 0 and counts[-1] == 4 and counts == sorted(counts)
    record = env.usage.wait_for(1)[0]
    assert {c.usage.prompt_tokens for c in with_choices} == {record.prompt_tokens}
    assert record.completion_tokens == 4
    assert len(chunks) == len(with_choices) + include_usage
    text = env.client().completions.create(  # type: ignore[call-overload]
        model="tiny", prompt="hi", max_tokens=3, temperature=0, stream=True, stream_options=options,
        extra_body={"ignore_eos": True})
    usages = [c.usage for c in text if c.choices]
    assert all(u is not None for u in usages) and usages[-1].completion_tokens == 3


@pytest.mark.parametrize("body, param", [
    ({"stream": True, "stream_options": {"include_usage": True, "bogus": 1}}, "stream_options.bogus"),
    ({"messages": [{"role": "user", "content": "hello", "foo": 1}]}, "messages[0].foo"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"},
                                                 {"type": "text", "text": "there", "foo": 1}]}]},
     "messages[0].content[1].foo"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "foo": 1}}]},
     "tools[0].function.foo"),
    ({"tools": [{"type": "function", "foo": 1, "function": {"name": "f"}}]}, "tools[0].foo"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {}, "foo": 1}}},
     "response_format.json_schema.foo"),
    ({"messages": [{"role": "user", "content": "hi"},
                   {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                         "function": {"name": "f", "arguments": "{}", "foo": 1}}]},
                   {"role": "tool", "tool_call_id": "c", "content": "1"}]},
     "messages[1].tool_calls[0].function.foo"),
])
def test_unknown_nested_field_is_a_400_naming_its_path(env: Env, body: dict[str, object], param: str) -> None:
    """A field below the top level that the engine does not model is refused, not ignored: the 400
    names its path (an HTTP upstream gets it as sent)."""
    headers = {"authorization": f"Bearer {KEY}"}
    sent = {"model": "tiny", "messages": MESSAGES, "max_tokens": 2} | body
    answer = httpx.post(env.server.url + "/v1/chat/completions", json=sent, headers=headers, timeout=30)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


@pytest.mark.parametrize("body, param", [
    ({"stream": True, "stream_options": {"include_usage": True, "bogus": 1}}, "stream_options.bogus"),
    ({"response_format": {"type": "json_object", "foo": 1}}, "response_format.foo"),
])
def test_unknown_nested_field_on_completions(env: Env, body: dict[str, object], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        env.client().completions.create(model="tiny", prompt="hi", max_tokens=2, extra_body=body)
    assert caught.value.body["param"] == param  # type: ignore[index]


def test_modelled_nested_fields_still_work(env: Env) -> None:
    """The nested fields the wire types model are taken: a message's ``name``, a text part's
    ``cache_control``, a tool's ``strict`` and a schema (free-form inside), ``stream_options``' own."""
    client = env.client()
    messages = [{"role": "system", "content": [{"type": "text", "text": "be brief",
                                                "cache_control": {"type": "ephemeral"}}]},
                {"role": "user", "name": "ann", "content": "hello"}]
    tools = [{"type": "function", "function": {"name": "f", "description": "d", "strict": True,
                                               "parameters": {"type": "object", "x-anything": 1}}}]
    reply = client.chat.completions.create(model="tiny", messages=messages, tools=tools,  # type: ignore[call-overload]
                                           max_tokens=2, tool_choice="none")
    assert reply.choices[0].message.refusal is None
    options = {"include_usage": True, "continuous_usage_stats": True}
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2,  # type: ignore[call-overload]
                                            stream=True, stream_options=options)
    assert [c for c in stream][-1].usage.completion_tokens == 2


def test_a_strict_sent_as_null_asks_for_nothing(env: Env) -> None:
    """A function's and a JSON schema format's ``strict`` may be null in OpenAI's schema: taken as unset."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": None}}]
    fmt = {"type": "json_schema", "json_schema": {"name": "o", "schema": {"type": "object"}, "strict": None}}
    reply = env.client().chat.completions.create(model="tiny", messages=MESSAGES, tools=tools,  # type: ignore[arg-type]
                                                 tool_choice="none", response_format=fmt, max_tokens=2)  # type: ignore[arg-type]
    assert reply.choices[0].finish_reason in ("length", "stop")


def test_an_answer_sent_back_as_history_is_taken(env: Env) -> None:
    """The usual multi-turn loop: the previous answer's message object appended as it came, with the
    fields only an answer has (``refusal``, ``annotations``, ``audio``, ``reasoning_content``,
    ``thinking_blocks``; null or empty ones too). They say nothing about the next answer: taken, not a 400."""
    client = env.client()
    first = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3)
    history = [*MESSAGES, first.choices[0].message,
               {"role": "assistant", "content": "ok", "refusal": None, "annotations": [], "audio": None,
                "function_call": None, "tool_calls": None, "reasoning_content": "thought",
                "thinking_blocks": [{"type": "thinking", "thinking": "thought", "signature": "sig"}]},
               {"role": "user", "content": "and then?"}]
    again = client.chat.completions.create(model="tiny", messages=history, max_tokens=3)  # type: ignore[arg-type]
    assert again.choices[0].message.role == "assistant"
