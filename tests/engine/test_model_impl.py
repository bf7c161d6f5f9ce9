"""Transformers inside the engine, and the model_impl resolution.

Greedy output of the HF modules running with our paged KV cache, scheduler (chunked prefill,
continuous batching, preemption), prefix cache and sampler must equal transformers' own
``generate`` on the same weights.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers

from engine import LLM, SamplingParams
from engine.model_impl import ModelImplError, inspect_model, native_architectures, resolve_model_impl
from engine.model_impl.hf_model import ATTN_IMPLEMENTATION, TransformersForCausalLM
from engine.tiny_model import build_tiny_model
from tests.support.fallback_models import build_model

IN_ENGINE = ["gpt2", "gpt_neox", "phi3", "gemma"]
PROMPTS = [
    "Hello world, the quick brown fox",
    "Paged attention keeps key and value blocks in a cache; continuous batching",
    "fox",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    made: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in made:
            out = tmp_path_factory.mktemp(f"fb-{arch}")
            made[arch] = build_tiny_model(out, arch="llama") if arch == "llama" else build_model(arch, out)
        return made[arch]

    return get


def reference(path: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    outs = []
    for ids in prompts:
        x = torch.tensor([ids])
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=None)
        outs.append(out[0, len(ids):].tolist())
    return outs


def encode(path: Path, texts: list[str]) -> list[list[int]]:
    tok = transformers.AutoTokenizer.from_pretrained(path)
    return [tok.encode(t) for t in texts]


GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.mark.parametrize("arch", IN_ENGINE)
def test_in_engine_greedy_equals_transformers_generate(arch: str, folder) -> None:
    path = folder(arch)
    prompts = encode(path, PROMPTS)
    want = reference(path, prompts, 24)
    # A small token budget: prefills are chunked and run batched with other sequences' decodes.
    llm = LLM(str(path), num_kv_blocks=64, max_num_batched_tokens=8, max_model_len=128)
    assert llm.engine.model_impl == "transformers"
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    assert got == want


def test_in_engine_prefix_cache_and_preemption(folder) -> None:
    path = folder("phi3")
    shared = encode(path, [PROMPTS[1] + " and more words after it"])[0]
    prompts = [shared + [100 + i] for i in range(3)]
    want = reference(path, prompts, 24)
    llm = LLM(str(path), num_kv_blocks=40, block_size=4, max_model_len=64)
    first = llm.generate(prompts[0], GREEDY)[0]
    again = llm.generate(prompts[1], GREEDY)[0]
    assert again.num_cached_tokens >= 4 * (len(shared) // 4) - 4
    assert [first.outputs[0].token_ids, again.outputs[0].token_ids] == want[:2]
    # Too few blocks for all three at once: the scheduler preempts and recomputes; output is unchanged.
    tight = LLM(str(path), num_kv_blocks=24, block_size=4, max_model_len=64, enable_prefix_caching=False)
    assert [o.outputs[0].token_ids for o in tight.generate(prompts, GREEDY)] == want
    assert tight.engine.get_metrics().num_preemptions > 0


def test_transformers_impl_on_a_native_architecture_matches_native(folder) -> None:
    path = folder("llama")
    prompts = encode(path, PROMPTS[:2])
    native = LLM(str(path), num_kv_blocks=64, max_model_len=128)
    via_hf = LLM(str(path), num_kv_blocks=64, max_model_len=128, model_impl="transformers")
    assert (native.engine.model_impl, via_hf.engine.model_impl) == ("native", "transformers")
    assert [o.outputs[0].token_ids for o in via_hf.generate(prompts, GREEDY)] == \
        [o.outputs[0].token_ids for o in native.generate(prompts, GREEDY)]


def test_resolution_rules(folder) -> None:
    assert resolve_model_impl(inspect_model(folder("llama"))).impl == "native"
    gpt2 = inspect_model(folder("gpt2"))
    assert (gpt2.architecture, resolve_model_impl(gpt2).impl) == ("GPT2LMHeadModel", "transformers")
    bloom = inspect_model(folder("bloom"))
    assert resolve_model_impl(bloom).impl == "generate"
    forced = resolve_model_impl(bloom, "transformers")
    assert forced.impl == "generate" and "AttentionInterface" in forced.reason
    with pytest.raises(ModelImplError, match="model_impl must be one of"):
        resolve_model_impl(gpt2, "fast")


def test_native_on_an_unsupported_architecture_is_a_clear_error(folder) -> None:
    with pytest.raises(ModelImplError) as info:
        LLM(str(folder("gpt2")), num_kv_blocks=64, model_impl="native")
    message = str(info.value)
    assert "GPT2LMHeadModel" in message and "no native implementation" in message
    assert all(name in message for name in native_architectures())


def test_a_generate_only_model_is_refused_by_the_engine_with_the_way_out(folder) -> None:
    with pytest.raises(ModelImplError, match="'transformers' provider"):
        LLM(str(folder("bloom")), num_kv_blocks=64)


def gpt_oss_config() -> transformers.PretrainedConfig:
    """A tiny GPT-OSS: its attention layers pass learned attention sinks (``s_aux``) to the attention function."""
    config = transformers.GptOssConfig(
        vocab_size=384, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
    )
    config.architectures = ["GptOssForCausalLM"]
    return config


def test_attention_sinks_send_the_model_to_plain_generate(tmp_path: Path) -> None:
    gpt_oss_config().save_pretrained(tmp_path)  # the resolution reads config.json only
    info = inspect_model(tmp_path)
    assert info.in_engine_blocker is not None and "s_aux" in info.in_engine_blocker
    assert "attention sinks" in info.in_engine_blocker
    assert resolve_model_impl(info).impl == "generate"
    assert resolve_model_impl(info, "transformers").impl == "generate"
    with pytest.raises(ModelImplError, match="'transformers' provider"):
        LLM(str(tmp_path), num_kv_blocks=64)


def test_paged_attention_refuses_extras_it_does_not_implement() -> None:
    """Loaded anyway, a model with sinks fails at its first (probe) forward instead of giving wrong output."""
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(
        gpt_oss_config(), dtype=torch.float32, attn_implementation=ATTN_IMPLEMENTATION
    )
    with pytest.raises(NotImplementedError, match="'s_aux'.*attention sinks"):
        TransformersForCausalLM(hf.eval())


def test_engine_cli_model_impl_flag(folder, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gateway.cli import app

    jobs = tmp_path / "in.jsonl"
    jobs.write_text('{"prompt": "Hello world", "max_tokens": 4, "ignore_eos": true}\n')
    base = ["engine", "generate", str(jobs), "--model", str(folder("gpt2")), "--num-kv-blocks", "64"]
    refused = CliRunner().invoke(app, [*base, "--model-impl", "native"])
    assert refused.exit_code == 2 and "no native implementation" in refused.output
    ran = CliRunner().invoke(app, [*base, "--model-impl", "transformers"])
    assert ran.exit_code == 0 and '"completion_tokens": 4' in ran.output
