"""The real default model, SmolLM2-135M-Instruct from its Q4_1 GGUF file, served by the engine through
the gateway, against transformers' own GGUF loading of the same file (dequantized to the same
float32 weights): greedy tokens equal, logprobs within 1e-4, prompt token counts the chat template's;
and with real weights, JSON-schema output and tool calls that validate, and embeddings equal to
transformers' mean-pooled hidden states.

The file comes from ``make install`` (``python -m backends.local.default_model``); where it cannot
be had these tests fail saying so, they never pass without it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
import torch

from backends.local.default_model import default_model_path
from tests.support.local_gateway import KEY, Env, local_gateway

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that returns the square of a number.",
    "Describe a sunny day using three emoji 🌞.",
    "用一句话介绍长城。",
    "Как дела? Ответь одним предложением.",
]
NEW_TOKENS = 24


def _model_file() -> Path:
    path = default_model_path()
    if not path.is_file():
        pytest.fail(f"the default model {path} is missing: run `make install` (or "
                    "`.venv/bin/python -m backends.local.default_model`) with access to PyPI")
    return path


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    model = str(_model_file())
    embed = {"name": "smol-embed", "max_retries": 0, "deployments": [{
        "provider": "local", "model": "{folder}",
        "options": {"dtype": "float32", "max_model_len": 512, "num_kv_blocks": 64, "pooling": "mean"}}]}
    with local_gateway(tmp_path_factory.mktemp("real"), [embed], model=model, dtype="float32", max_model_len=2048,
                       num_kv_blocks=256) as served:
        yield served


@pytest.fixture(scope="module")
def reference() -> Any:
    from transformers import AutoModelForCausalLM

    path = _model_file()
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


def _greedy(model: Any, ids: list[int]) -> tuple[list[int], list[float]]:
    """transformers' greedy continuation and the logprob of each chosen token."""
    tokens = torch.tensor([ids])
    out = model.generate(tokens, attention_mask=torch.ones_like(tokens), max_new_tokens=NEW_TOKENS,
                         do_sample=False, output_scores=True, return_dict_in_generate=True, pad_token_id=2)
    new = out.sequences[0, len(ids):].tolist()
    with torch.no_grad():
        logits = model(out.sequences).logits[0].float().log_softmax(dim=-1)
    return new, [logits[len(ids) - 1 + i, t].item() for i, t in enumerate(new)]


def test_the_engine_reads_the_gguf_natively(env: Env) -> None:
    assert env.backend.metadata["model_impl"] == "native"
    card = env.client().models.retrieve("tiny")
    assert card.max_model_len == 2048


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_chat_equals_transformers_gguf(env: Env, reference: Any, prompt: str) -> None:
    messages = [{"role": "user", "content": prompt}]
    ids = env.backend.tokenizer.apply_chat_template(messages)
    want, want_logprobs = _greedy(reference, ids)
    answer = env.client().chat.completions.create(model="tiny", messages=messages,  # type: ignore[arg-type]
                                                  max_tokens=NEW_TOKENS, temperature=0, logprobs=True)
    content = answer.choices[0].logprobs.content  # type: ignore[union-attr]
    text = answer.choices[0].message.content
    assert text == env.backend.tokenizer.decode([t for t in want if t != 2])
    assert answer.usage is not None and answer.usage.prompt_tokens == len(ids)
    assert answer.usage.completion_tokens == len(want)
    assert [c.logprob for c in content] == pytest.approx(want_logprobs, abs=1e-4)
    env.wait_idle()


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "city": {"enum": ["Paris", "Rome", "Oslo"]}},
          "required": ["name", "age", "city"], "additionalProperties": False}


def test_json_schema_output_validates_with_real_weights(env: Env) -> None:
    client = env.client()
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for temperature in (0.0, 1.0):
        answer = client.chat.completions.create(
            model="tiny", max_tokens=120, temperature=temperature, response_format=fmt,
            messages=[{"role": "user", "content": "Invent a person who lives in Rome. Answer in JSON."}])
        assert answer.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(answer.choices[0].message.content or ""), PERSON)
    env.wait_idle()


def test_a_named_tool_call_validates_with_real_weights(env: Env) -> None:
    weather = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                                "unit": {"enum": ["celsius", "fahrenheit"]}},
               "required": ["city", "unit"], "additionalProperties": False}
    tools: Any = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
                                                     "parameters": weather}}]
    answer = env.client().chat.completions.create(
        model="tiny", max_tokens=80, temperature=0, tools=tools,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    choice = answer.choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls  # a named call ends so (OpenAI, vLLM)
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    jsonschema.validate(json.loads(call.function.arguments), weather)  # type: ignore[union-attr]
    env.wait_idle()


def test_embeddings_equal_transformers_with_real_weights(env: Env, reference: Any) -> None:
    texts = ["Trains run on rails.", "火车在铁轨上行驶。"]
    answer = env.client().embeddings.create(model="smol-embed", input=texts, encoding_format="float")
    for item, text in zip(answer.data, texts, strict=True):
        ids = env.backend.tokenizer.encode(text)
        with torch.no_grad():
            hidden = reference.model(torch.tensor([ids])).last_hidden_state[0]
        want = torch.nn.functional.normalize(hidden.mean(dim=0), dim=0)
        assert torch.allclose(torch.tensor(item.embedding), want, atol=1e-4)
    assert answer.usage.prompt_tokens == sum(len(env.backend.tokenizer.encode(t)) for t in texts)


def test_responses_api_on_the_engine(env: Env) -> None:
    """``client.responses.create`` served by the engine (translated via chat): text, the event stream,
    and a function-call round trip with the call forced by the grammar."""
    client = env.client()
    answer = client.responses.create(model="tiny", input="What is the capital of France?", max_output_tokens=16,
                                     temperature=0)
    chat = client.chat.completions.create(model="tiny", max_tokens=16, temperature=0,
                                          messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert answer.output_text == chat.choices[0].message.content
    assert answer.usage is not None and answer.usage.input_tokens == chat.usage.prompt_tokens  # type: ignore[union-attr]
    events = list(client.responses.create(model="tiny", input="What is the capital of France?",
                                          max_output_tokens=16, temperature=0, stream=True))
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == answer.output_text
    tools: Any = [{"type": "function", "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"],
        "additionalProperties": False}}]
    first = client.responses.create(model="tiny", input="Weather in Paris?", tools=tools, temperature=0,
                                    tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=60)
    call = next(item for item in first.output if item.type == "function_call")
    assert call.name == "get_weather" and "city" in json.loads(call.arguments)  # type: ignore[union-attr]
    second = client.responses.create(model="tiny", tools=tools, temperature=0, max_output_tokens=24, input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name,  # type: ignore[union-attr]
         "arguments": call.arguments},  # type: ignore[union-attr]
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}])  # type: ignore[union-attr]
    assert second.status in ("completed", "incomplete") and second.output_text
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="tiny", input="x", reasoning={"effort": "high"})
    assert err.value.body["param"] == "reasoning.effort"  # type: ignore[index]  # as the request names it
    env.wait_idle()


PREFILL = [{"role": "user", "content": "Count from one to ten in words."},
           {"role": "assistant", "content": "One, two, three, four,"}]


def test_continue_final_message_is_transformers_prompt_and_greedy_answer(env: Env, reference: Any) -> None:
    """vLLM's ``continue_final_message``: the prompt ends inside the assistant's message, as
    transformers' ``apply_chat_template(continue_final_message=True)`` makes it, and the answer goes on
    with it; an Anthropic prefill on /v1/messages (translated to chat) is answered the same way."""
    from transformers import AutoTokenizer

    path = _model_file()
    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ids = hf.apply_chat_template(PREFILL, add_generation_prompt=False, continue_final_message=True, tokenize=False)
    ids = hf.encode(ids, add_special_tokens=False)
    want, _ = _greedy(reference, ids)
    answer = env.client().chat.completions.create(
        model="tiny", messages=PREFILL, max_tokens=NEW_TOKENS, temperature=0,  # type: ignore[arg-type]
        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert answer.usage is not None and answer.usage.prompt_tokens == len(ids)
    text = env.backend.tokenizer.decode([t for t in want if t != 2])
    assert answer.choices[0].message.content == text

    import anthropic

    messages = anthropic.Anthropic(base_url=env.server.url, api_key=KEY, max_retries=0).messages.create(
        model="tiny", max_tokens=NEW_TOKENS, messages=PREFILL,  # type: ignore[arg-type]
        extra_body={"temperature": 0})  # this SDK version takes no temperature argument
    assert messages.content[0].text == text  # type: ignore[union-attr]
    assert messages.usage.input_tokens == len(ids)
    env.wait_idle()


@pytest.mark.parametrize(("extra", "param"), [
    ({"continue_final_message": True}, "continue_final_message"),  # add_generation_prompt defaults to true
    ({"continue_final_message": True, "add_generation_prompt": False, "messages_end_with_user": True}, "messages"),
    ({"continue_final_message": "yes", "add_generation_prompt": False}, "continue_final_message"),
    ({"add_generation_prompt": 1}, "add_generation_prompt"),
])
def test_bad_chat_prompt_options_are_a_400_naming_them(env: Env, extra: dict[str, Any], param: str) -> None:
    messages = PREFILL[:1] if extra.pop("messages_end_with_user", False) else PREFILL
    with pytest.raises(openai.BadRequestError) as err:
        env.client().chat.completions.create(model="tiny", messages=messages, max_tokens=4,  # type: ignore[arg-type]
                                             extra_body=extra)
    assert err.value.body["param"] == param  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as err:  # a chat field: text completions refuse it
        env.client().completions.create(model="tiny", prompt="Hi", max_tokens=4,
                                        extra_body={"continue_final_message": True})
    assert err.value.body["param"] == "continue_final_message"  # type: ignore[index]


@pytest.mark.parametrize("final", ["<", "end", ""])
def test_a_prefill_found_in_the_end_of_turn_is_continued_where_transformers_cuts(env: Env, final: str) -> None:
    """A final assistant message whose text also occurs in what the template closes it with ("<" and
    "end" in "<|im_end|>"), or that is empty: the prompt is transformers' own, never one cut inside
    the end-of-turn token; ``/tokenize`` counts what the generation was given."""
    from transformers import AutoTokenizer

    path = _model_file()
    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    messages = [PREFILL[0], {"role": "assistant", "content": final}]
    text = hf.apply_chat_template(messages, add_generation_prompt=False, continue_final_message=True, tokenize=False)
    ids = hf.encode(text, add_special_tokens=False)
    options = {"continue_final_message": True, "add_generation_prompt": False}
    answer = env.client().chat.completions.create(model="tiny", messages=messages,  # type: ignore[arg-type]
                                                  max_tokens=2, temperature=0, extra_body=options)
    assert answer.usage is not None and answer.usage.prompt_tokens == len(ids)
    counted = httpx.post(env.server.url + "/tokenize", headers={"Authorization": f"Bearer {KEY}"},
                         json={"model": "tiny", "messages": messages, **options})
    assert counted.json()["tokens"] == ids
    env.wait_idle()


def test_an_answer_cut_inside_an_emoji_ends_in_u_fffd(env: Env) -> None:
    """Greedy SmolLM2 answers with emoji, each several byte-level tokens: cut by max_tokens inside
    the third, the answer shows its bytes as U+FFFD (as decoding the tokens does), streamed and not,
    and every generated token is counted."""
    messages: Any = [{"role": "user", "content": "Reply with only three emoji about the sun."}]
    client = env.client()
    done = client.chat.completions.create(model="tiny", messages=messages, max_tokens=7, temperature=0,
                                          logprobs=True)
    text = done.choices[0].message.content or ""
    data = b"".join(bytes(t.bytes or []) for t in done.choices[0].logprobs.content or [])  # type: ignore[union-attr]
    assert text == data.decode("utf-8", errors="replace") and text.endswith("\ufffd")
    assert done.choices[0].finish_reason == "length" and done.usage is not None and done.usage.completion_tokens == 7
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=7, temperature=0,
                                                 stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    env.wait_idle()
