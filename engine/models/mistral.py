"""Mistral: the Llama decoder with the config's sliding window applied in every layer."""

from __future__ import annotations

from engine.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM


class MistralAttention(LlamaAttention):
    sliding_window = True


class MistralDecoderLayer(LlamaDecoderLayer):
    attention_cls = MistralAttention


class MistralForCausalLM(LlamaForCausalLM):
    layer_cls = MistralDecoderLayer
