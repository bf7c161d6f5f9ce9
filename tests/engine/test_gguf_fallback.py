"""A GGUF file of an architecture the engine does not implement natively (a seeded tiny GPT-2,
written here with the gguf package's writer) goes to the transformers fallback, as a folder would:
transformers modules with the engine's paged attention, loaded from the same file, generating the
same greedy tokens as transformers' own GGUF loading."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from engine import LLM, SamplingParams
from engine.model_impl import inspect_model, resolve_model_impl
from tests.support.gguf_models import write_gguf

PROMPTS = ["Hello world, the quick brown fox", "Paged attention keeps key and value blocks in a cache", "fox"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf("gpt2", tmp_path_factory.mktemp("gguf-gpt2") / "tiny-gpt2.F32.gguf")


def test_a_gpt2_gguf_resolves_to_the_transformers_path(gpt2: Path) -> None:
    info = inspect_model(gpt2)
    assert (info.architecture, info.native) == ("GPT2LMHeadModel", False)
    assert resolve_model_impl(info).impl == "transformers"


def test_a_gpt2_gguf_generates_what_transformers_generates_from_the_file(gpt2: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gpt2.parent), gguf_file=gpt2.name)
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(gpt2.parent), gguf_file=gpt2.name,
                                                                  dtype=torch.float32).eval()
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    want = []
    for ids in prompts:
        x = torch.tensor([ids])
        out = reference.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=GREEDY.max_tokens,
                                 do_sample=False, eos_token_id=None)
        want.append(out[0, len(ids):].tolist())
    llm = LLM(str(gpt2), num_kv_blocks=64, max_num_batched_tokens=8, max_model_len=128)
    assert llm.engine.model_impl == "transformers"
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)] == want
    # the tokenizer the engine built from the file's metadata encodes as transformers' does
    assert llm.tokenizer is not None and [llm.tokenizer.encode(p) for p in PROMPTS] == prompts
