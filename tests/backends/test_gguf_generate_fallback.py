"""A GGUF file of an architecture whose attention cannot take the engine's paged attention (a seeded
tiny Bloom, written here with the gguf package's writer) goes, as a ``local`` deployment, to plain
transformers ``generate`` on the same file, as a folder would: its greedy completions equal
transformers' own generate on the file, with the tokenizer built from the file's metadata."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch
import transformers

from backends.factory import build_backend
from backends.openai_wire import CompletionRequest
from backends.transformers_generate import HFGenerateBackend
from gateway.settings import DeploymentConfig
from tests.support.gguf_models import write_gguf

PROMPTS = ["Hello world, the quick", "Paged attention keeps key and value blocks", "fox"]


@pytest.fixture(scope="module")
def bloom(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf("bloom", tmp_path_factory.mktemp("gguf-bloom") / "tiny-bloom.F32.gguf")


@pytest.fixture
async def backend(bloom: Path) -> AsyncIterator[HFGenerateBackend]:
    built = build_backend(DeploymentConfig(provider="local", model=str(bloom), options={"max_model_len": 128}))
    assert isinstance(built, HFGenerateBackend)
    yield built
    await built.aclose()


async def test_a_bloom_gguf_runs_on_plain_generate_as_transformers_does(
    bloom: Path, backend: HFGenerateBackend
) -> None:
    assert backend.metadata["model_impl"] == "generate" and backend.metadata["architecture"] == "BloomForCausalLM"
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(bloom.parent), gguf_file=bloom.name,
                                                                  dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(bloom.parent), gguf_file=bloom.name)
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        assert backend.tokenizer.encode(prompt) == ids
        x = torch.tensor([ids])
        out = reference.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=16, do_sample=False)
        want = out[0, len(ids):].tolist()
        assert want
        result = await backend.complete(CompletionRequest(model="m", prompt=prompt, max_tokens=16, temperature=0.0))
        assert result.response.choices[0].text == tokenizer.decode(want, skip_special_tokens=True)
        assert result.meter.prompt_tokens == len(ids) and result.meter.completion_tokens == len(want)


async def test_the_end_of_turn_token_of_the_file_stops_generation(tmp_path: Path) -> None:
    """llama.cpp's ``tokenizer.ggml.eot_token_id`` ends an answer on this path too (as the engine's)."""
    eot = 5
    path = write_gguf("bloom", tmp_path / "tiny-bloom.F32.gguf", edit=lambda writer: writer.add_eot_token_id(eot))
    built = build_backend(DeploymentConfig(provider="local", model=str(path), options={"max_model_len": 128}))
    assert isinstance(built, HFGenerateBackend)
    try:
        result = await built.complete(CompletionRequest(model="m", prompt="fox", max_tokens=8, temperature=0.0,
                                                        logit_bias={str(eot): 100}))
        assert result.response.choices[0].finish_reason == "stop" and result.meter.completion_tokens == 1
    finally:
        await built.aclose()
