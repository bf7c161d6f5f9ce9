"""The real default model, SmolLM2-135M-Instruct from its Q4_1 GGUF file, served by the engine through
the gateway, against transformers' own GGUF loading of the same file (dequantized to the same
float32 weights): greedy tokens equal, logprobs within 1e-4, prompt token counts the chat template's.

The file comes from ``make install`` (``python -m backends.local.default_model``); where it cannot
be had these tests fail saying so, they never pass without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from backends.local.default_model import default_model_path
from tests.support.local_gateway import Env, local_gateway

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
    with local_gateway(tmp_path_factory.mktemp("real"), model=model, dtype="float32", max_model_len=2048,
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
