"""Native models against transformers on the same seeded random weights (float32, logits to 1e-4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.attention_metadata import AttentionMetadata
from engine.loader import load_model, model_kv_shape
from engine.models import MODEL_REGISTRY, resolve_architecture
from engine.tiny_model import build_tiny_model

BS = 8
ARCHS = {
    "llama": ("llama", {}),  # with Llama 3.1 rope scaling (the tiny model's default)
    "llama-bias": ("llama", {"attention_bias": True, "mlp_bias": True, "head_dim": 24, "rope_scaling": None}),
    "mistral": ("mistral", {"sliding_window": 12}),  # shorter than the test sequences, so the window matters
    # a stray sliding_window in a Llama config.json (llamafied Mistral/Qwen): transformers' Llama ignores it
    "llama-stray-window": ("llama", {"sliding_window": 12, "num_key_value_heads": 1}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
}


@pytest.fixture(scope="module", params=sorted(ARCHS))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    name = request.param
    arch, sizes = ARCHS[name]
    path = build_tiny_model(tmp_path_factory.mktemp(name), arch=arch, seed=3, **sizes)
    ours, cfg = load_model(path, torch.float32, "cpu")
    ref = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return name, ours, ref, cfg


def make_caches(cfg, num_blocks: int = 32) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    layers, kv_heads, head_dim = model_kv_shape(cfg)
    return [torch.zeros(2, num_blocks, BS, kv_heads, head_dim) for _ in range(layers)]


def step_meta(chunks: list[tuple[int, int]], first_block: list[int], max_blocks: int = 8) -> AttentionMetadata:
    """Metadata for sequences each given as (cached_len, new_len); sequence i owns consecutive
    blocks starting at first_block[i]."""
    slots, tables = [], []
    for (cached, new), b0 in zip(chunks, first_block):
        slots += [(b0 + p // BS) * BS + p % BS for p in range(cached, cached + new)]
        tables.append(list(range(b0, b0 + max_blocks)))
    q_lens = [n for _, n in chunks]
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        block_tables=torch.tensor(tables, dtype=torch.int32),
        context_lens=torch.tensor([c + n for c, n in chunks], dtype=torch.int32),
        query_start_loc=torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32),
        max_query_len=max(q_lens),
        max_context_len=max(c + n for c, n in chunks),
        block_size=BS,
    )


def hf_logits(ref, ids: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    with torch.no_grad():
        return ref(torch.tensor([ids])).logits[0].float()


@torch.no_grad()
def test_single_sequence_forward(pair) -> None:  # type: ignore[no-untyped-def]
    _, ours, ref, cfg = pair
    ids = torch.randint(0, cfg.vocab_size, (29,), generator=torch.Generator().manual_seed(0)).tolist()
    meta = step_meta([(0, len(ids))], [0])
    hidden = ours(torch.tensor(ids), torch.arange(len(ids)), make_caches(cfg), meta)
    logits = ours.compute_logits(hidden)
    assert logits.dtype == torch.float32 and logits.shape == (len(ids), cfg.vocab_size)
    torch.testing.assert_close(logits, hf_logits(ref, ids), atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_batched_chunked_prefill_then_decode(pair) -> None:  # type: ignore[no-untyped-def]
    """Two sequences: prefill in chunks (the second chunk attends to cached blocks), then decode
    steps mixed with the other sequence's prefill; every step's logits match transformers'."""
    _, ours, ref, cfg = pair
    gen = torch.Generator().manual_seed(1)
    a = torch.randint(0, cfg.vocab_size, (23,), generator=gen).tolist()
    b = torch.randint(0, cfg.vocab_size, (17,), generator=gen).tolist()
    ref_a, ref_b = hf_logits(ref, a), hf_logits(ref, b)
    caches = make_caches(cfg)
    # (tokens of a, tokens of b) per step, each as (cached, new)
    steps = [((0, 10), (0, 5)), ((10, 11), (5, 12)), ((21, 1), None), ((22, 1), None)]
    for sa, sb in steps:
        chunks = [sa] + ([sb] if sb else [])
        ids = a[sa[0] : sa[0] + sa[1]] + (b[sb[0] : sb[0] + sb[1]] if sb else [])
        pos = list(range(sa[0], sum(sa))) + (list(range(sb[0], sum(sb))) if sb else [])
        meta = step_meta(chunks, [0, 16])
        logits = ours.compute_logits(ours(torch.tensor(ids), torch.tensor(pos), caches, meta))
        torch.testing.assert_close(logits[: sa[1]], ref_a[sa[0] : sum(sa)], atol=1e-4, rtol=1e-4)
        if sb:
            torch.testing.assert_close(logits[sa[1] :], ref_b[sb[0] : sum(sb)], atol=1e-4, rtol=1e-4)


def _greedy_by_forward(ref: Any, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy continuation by whole forward passes, no cache."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(ref(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def test_greedy_tokens_match_transformers_generate(pair) -> None:  # type: ignore[no-untyped-def]
    name, ours, ref, cfg = pair
    prompt = [5, 77, 300, 12, 9, 41, 600]
    if name == "llama-stray-window":  # generate windows its cache by it even for Llama, whose forward does not
        want = _greedy_by_forward(ref, prompt, 12)
    else:
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                            pad_token_id=0)[0, len(prompt) :].tolist()
    caches, ids = make_caches(cfg), list(prompt)
    got: list[int] = []
    with torch.no_grad():
        step = (0, len(ids))
        while len(got) < 12:
            meta = step_meta([step], [3])
            new = ids[step[0] :]
            hidden = ours(torch.tensor(new), torch.arange(step[0], len(ids)), caches, meta)
            tok = int(ours.compute_logits(hidden[-1:]).argmax(-1))
            got.append(tok)
            ids.append(tok)
            step = (len(ids) - 1, 1)
    assert got == want


def test_tied_embeddings_share_one_tensor(pair) -> None:  # type: ignore[no-untyped-def]
    arch, ours, _, cfg = pair
    tied = ours.lm_head.weight.data_ptr() == ours.model.embed_tokens.weight.data_ptr()
    assert tied == bool(cfg.tie_word_embeddings)
    assert tied == (arch == "qwen2")


def test_registry_and_resolution() -> None:
    assert set(MODEL_REGISTRY) == {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}

    class Cfg:
        architectures = ["GPT2LMHeadModel"]

    assert resolve_architecture(Cfg()) is None
    Cfg.architectures = ["Qwen3ForCausalLM"]
    assert resolve_architecture(Cfg()) is MODEL_REGISTRY["Qwen3ForCausalLM"]


def test_load_weights_reports_missing_tensors(tmp_path: Path) -> None:
    path = build_tiny_model(tmp_path, arch="llama")
    model, _ = load_model(path, torch.float32, "cpu")
    from engine.loader import iter_weights

    weights = [(n, t) for n, t in iter_weights(path) if "layers.1.self_attn.k_proj" not in n]
    with pytest.raises(ValueError, match="missing 1 tensors.*qkv_proj.weight\\[shard 1\\]"):
        model.load_weights(weights)
    with pytest.raises(ValueError, match="has no place"):
        model.load_weights([("model.layers.0.self_attn.bogus.weight", torch.zeros(1))])
