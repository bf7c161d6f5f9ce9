"""Qwen2: the Llama decoder with biases on q/k/v (none on o_proj)."""

from __future__ import annotations

from typing import Any

from engine.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM


class Qwen2Attention(LlamaAttention):
    sliding_window = True

    @staticmethod
    def biases(cfg: Any) -> tuple[bool, bool]:
        return True, False


class Qwen2DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen2Attention


class Qwen2ForCausalLM(LlamaForCausalLM):
    layer_cls = Qwen2DecoderLayer
