"""The endpoints beyond chat on the built-in engine: embeddings, tokenize / detokenize, Anthropic's
count_tokens and the model card's context, through the gateway with the official SDKs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from engine.tokenizer import Tokenizer
from tests.support.local_gateway import KEY, Env, local_gateway

TEXTS = ["Trains run on rails.", "Le chat dort sur le canapé.", "火车在铁轨上行驶。"]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    plain = {"name": "plain", "max_retries": 0, "deployments": [
        {"provider": "local", "model": "{folder}", "options": {"num_kv_blocks": 64, "max_model_len": 1024}}]}
    with local_gateway(tmp_path_factory.mktemp("endpoints"), [plain], pooling="mean", max_num_batched_tokens=8) as s:
        yield s


def _reference(env: Env, ids: list[int]) -> torch.Tensor:
    model = AutoModel.from_pretrained(str(env.folder), dtype=torch.float32).eval()
    with torch.no_grad():
        hidden = model(torch.tensor([ids])).last_hidden_state[0]
    return torch.nn.functional.normalize(hidden.mean(dim=0), dim=0)


def _post(env: Env, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(env.server.url + path, json=body, headers={"authorization": f"Bearer {KEY}"}, timeout=30)


def test_embeddings_equal_transformers_mean_pooling(env: Env) -> None:
    tok = Tokenizer(env.folder)
    client = env.client()
    env.usage.records.clear()
    answer = client.embeddings.create(model="tiny", input=TEXTS)  # the SDK asks for base64 and decodes it
    floats = client.embeddings.create(model="tiny", input=TEXTS, encoding_format="float")
    ids = [tok.encode(t) for t in TEXTS]
    assert answer.usage.prompt_tokens == sum(len(i) for i in ids) == floats.usage.prompt_tokens
    for i, item in enumerate(answer.data):
        want = _reference(env, ids[i])
        assert item.index == i and len(item.embedding) == want.numel()
        assert torch.allclose(torch.tensor(item.embedding), want, atol=1e-5)
        assert torch.allclose(torch.tensor(floats.data[i].embedding), want, atol=1e-5)
    by_ids = client.embeddings.create(model="tiny", input=ids[0], encoding_format="float")
    assert torch.allclose(torch.tensor(by_ids.data[0].embedding), torch.tensor(floats.data[0].embedding), atol=1e-6)
    records = env.usage.wait_for(3)
    assert {r.endpoint for r in records} == {"embeddings"}
    assert all(r.exact and r.completion_tokens == 0 for r in records)
    env.wait_idle()


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "tiny", "input": ""}, "input"),
    ({"model": "tiny", "input": []}, "input"),
    ({"model": "tiny", "input": ["a", [1, 2]]}, "input"),
    ({"model": "tiny", "input": "hi", "dimensions": 3}, "dimensions"),
    ({"model": "tiny", "input": [10**9]}, "input"),
    ({"model": "plain", "input": "hi"}, "model"),
    ({"model": "tiny", "input": "hi", "input_type": "query"}, "input_type"),  # not honoured: named, not dropped
    ({"model": "tiny", "input": "x " * 3000}, "input"),
    ({"model": "tiny", "input": ["ok", "x " * 3000]}, "input[1]"),  # the bad one of a batch by its index
    ({"model": "tiny", "input": [[1, 2], [3], [10**9]]}, "input[2]"),
])
def test_bad_embedding_requests_name_their_field(env: Env, body: dict[str, Any], param: str) -> None:
    answer = _post(env, "/v1/embeddings", body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


def test_a_prompt_of_a_batch_the_model_cannot_take_is_named_by_its_index(env: Env) -> None:
    embedding = _post(env, "/v1/embeddings", {"model": "tiny", "input": ["ok", "fine", "x " * 3000]}).json()["error"]
    assert embedding["code"] == "context_length_exceeded" and embedding["message"].startswith("input[2]: ")
    completion = _post(env, "/v1/completions", {"model": "tiny", "prompt": ["x " * 3000, "ok"], "max_tokens": 1})
    assert completion.status_code == 400 and completion.json()["error"]["param"] == "prompt[0]"
    env.wait_idle()


def test_embedding_options_sent_as_null_are_unset(env: Env) -> None:
    """vLLM takes ``dimensions`` and ``user`` as optional: a client that writes null for them is served."""
    answer = _post(env, "/v1/embeddings", {"model": "tiny", "input": "hi", "dimensions": None, "user": None})
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["data"][0]["embedding"]) == env.backend.engine.hidden_size


def test_embedding_fields_the_engine_honours_or_that_change_nothing_are_accepted(env: Env) -> None:
    """``user`` changes nothing, ``encoding_format`` is honoured, and ``dimensions`` is when it is the
    model's own width (any other is a 400 naming it, above)."""
    client = env.client()
    plain = client.embeddings.create(model="tiny", input="hi", encoding_format="float")
    width = env.backend.engine.hidden_size
    same = client.embeddings.create(model="tiny", input="hi", encoding_format="float", user="u", dimensions=width)
    assert same.data[0].embedding == plain.data[0].embedding and len(plain.data[0].embedding) == width


HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/tokenize", {"prompt": "hi", "bogus": 1}, "bogus"),
    ("/tokenize", {"messages": [{"role": "user", "content": "hi", "foo": 1}]}, "messages[0].foo"),
    ("/tokenize", {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "foo": 1}]}]},
     "messages[0].content[0].foo"),
    ("/tokenize", {"messages": HI, "tools": [{"type": "function", "function": {"name": "f", "foo": 1}}]},
     "tools[0].function.foo"),
    ("/detokenize", {"tokens": [1], "bogus": 1}, "bogus"),
    ("/v1/embeddings", {"input": "hi", "bogus": {"a": 1}}, "bogus"),
])
def test_a_field_the_engine_does_not_model_is_a_400_naming_its_path(env: Env, path: str, body: dict[str, Any],
                                                                    param: str) -> None:
    """Refused in OpenAI's error shape, not ignored (an HTTP upstream gets embeddings' fields as sent)."""
    answer = _post(env, path, {"model": "tiny", **body})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and param in error["message"] and error["type"] == "invalid_request_error"


def test_tokenize_takes_the_fields_of_an_answer_sent_back_as_history(env: Env) -> None:
    """As chat completions do: an answer's own fields (``refusal``, ...) ask nothing, and a free-form
    object (``chat_template_kwargs``) is not looked into."""
    answer: dict[str, Any] = {"role": "assistant", "content": "ok", "refusal": None, "annotations": [],
                              "tool_calls": None}
    messages = [*HI, answer, {"role": "user", "content": "and?"}]
    plain = [*HI, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and?"}]
    taken = _post(env, "/tokenize", {"model": "tiny", "messages": messages, "chat_template_kwargs": {"x": {"y": 1}}})
    assert taken.status_code == 200, taken.text
    assert taken.json()["tokens"] == _post(env, "/tokenize", {"model": "tiny", "messages": plain}).json()["tokens"]


def test_tokenize_takes_vllms_chat_fields(env: Env) -> None:
    """``tools``, ``chat_template_kwargs`` and ``continue_final_message`` count as chat renders them."""
    tok = Tokenizer(env.folder)
    messages = [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "It is"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    cont = _post(env, "/tokenize", {"model": "tiny", "messages": messages, "continue_final_message": True,
                                    "add_generation_prompt": False})
    assert cont.status_code == 200, cont.text
    assert cont.json()["tokens"] == tok.apply_chat_template(messages, add_generation_prompt=False,
                                                            continue_final_message=True)
    asked = {"model": "tiny", "messages": messages[:1], "tools": tools, "chat_template_kwargs": {"x": 1}}
    counted = _post(env, "/tokenize", asked)
    assert counted.status_code == 200, counted.text
    chat = _post(env, "/v1/chat/completions", {**asked, "max_tokens": 1}).json()
    assert counted.json()["count"] == chat["usage"]["prompt_tokens"]
    env.wait_idle()


def test_tokenize_messages_honours_add_special_tokens(env: Env) -> None:
    """As vLLM's: for messages the default is false (the chat template writes the BOS); true adds the
    tokenizer's own special tokens to the rendered conversation; a prompt adds them by default."""
    tok = Tokenizer(env.folder)
    messages = [{"role": "user", "content": "Hello"}]
    plain = _post(env, "/tokenize", {"model": "tiny", "messages": messages}).json()["tokens"]
    off = _post(env, "/tokenize", {"model": "tiny", "messages": messages, "add_special_tokens": False}).json()
    on = _post(env, "/tokenize", {"model": "tiny", "messages": messages, "add_special_tokens": True}).json()
    assert plain == off["tokens"] == tok.apply_chat_template(messages)
    assert on["tokens"] == tok.encode(tok.render_chat(messages), add_special_tokens=True)
    assert on["tokens"] == [tok.bos_token_id, *plain] and on["count"] == len(plain) + 1
    prompt = _post(env, "/tokenize", {"model": "tiny", "prompt": "Hello"}).json()["tokens"]
    bare = _post(env, "/tokenize", {"model": "tiny", "prompt": "Hello", "add_special_tokens": False}).json()
    assert prompt == [tok.bos_token_id, *bare["tokens"]]


def test_token_strs_are_the_vocabulary_entries(env: Env) -> None:
    """As vLLM's (transformers' ``convert_ids_to_tokens``): a token holding part of a character is its
    byte-level piece, not a replacement character."""
    answer = _post(env, "/tokenize", {"model": "tiny", "prompt": "火车 hello", "return_token_strs": True}).json()
    want = AutoTokenizer.from_pretrained(str(env.folder)).convert_ids_to_tokens(answer["tokens"])
    assert answer["token_strs"] == want and "\ufffd" not in "".join(answer["token_strs"])


def test_tokenize_takes_return_token_strs_sent_as_null(env: Env) -> None:
    """vLLM's ``return_token_strs`` is optional: null asks for no strings, as leaving it out does."""
    answer = _post(env, "/tokenize", {"model": "tiny", "prompt": "hi", "return_token_strs": None})
    assert answer.status_code == 200, answer.text
    assert "token_strs" not in answer.json() and answer.json()["tokens"] == Tokenizer(env.folder).encode("hi")


def test_tokenize_detokenize_and_the_model_card(env: Env) -> None:
    tok = Tokenizer(env.folder)
    prompt = _post(env, "/tokenize", {"model": "tiny", "prompt": "Trains run on rails.", "return_token_strs": True})
    assert prompt.status_code == 200, prompt.text
    body = prompt.json()
    assert body["tokens"] == tok.encode("Trains run on rails.") and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == 2048 and len(body["token_strs"]) == body["count"]
    messages = [{"role": "user", "content": "Hello"}]
    chat = _post(env, "/tokenize", {"model": "tiny", "messages": messages}).json()
    assert chat["tokens"] == tok.apply_chat_template(messages)
    back = _post(env, "/detokenize", {"model": "tiny", "tokens": body["tokens"]}).json()
    assert back["prompt"] == tok.decode(body["tokens"], skip_special_tokens=False)
    assert _post(env, "/tokenize", {"model": "tiny"}).json()["error"]["param"] == "prompt"
    assert _post(env, "/detokenize", {"model": "tiny", "tokens": [-1]}).json()["error"]["param"] == "tokens"
    assert _post(env, "/tokenize", {"model": "nope", "prompt": "x"}).status_code == 404
    card = env.client().models.retrieve("tiny")
    assert card.max_model_len == 2048 and card.metadata["embeddings"] is True  # type: ignore[attr-defined]


def test_anthropic_count_tokens_is_the_chat_templates_count(env: Env) -> None:
    tok = Tokenizer(env.folder)
    client = anthropic.Anthropic(base_url=env.server.url, api_key=KEY, max_retries=0)
    counted = client.messages.count_tokens(model="tiny", system="Be brief.",
                                           messages=[{"role": "user", "content": "Hello there"}])
    want = tok.apply_chat_template([{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": "Hello there"}])
    assert counted.input_tokens == len(want)
