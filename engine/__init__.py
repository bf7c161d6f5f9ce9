"""Switchyard's inference engine: paged KV cache, continuous batching, native models.

``from engine import LLM, SamplingParams`` for offline generation; ``AsyncEngine`` for serving.
"""

from engine.async_engine import AsyncEngine, RequestStream
from engine.config import EngineConfig
from engine.errors import EngineClosed, EngineError, InvalidRequest, RequestFailed, RequestRejected
from engine.llm_engine import LLM, LLMEngine
from engine.metrics import MetricsSnapshot
from engine.outputs import CompletionOutput, RequestOutput
from engine.pooling_params import PoolingParams
from engine.sampling_params import SamplingParams

__all__ = [
    "AsyncEngine",
    "CompletionOutput",
    "EngineClosed",
    "EngineConfig",
    "EngineError",
    "InvalidRequest",
    "LLM",
    "LLMEngine",
    "MetricsSnapshot",
    "PoolingParams",
    "RequestFailed",
    "RequestOutput",
    "RequestRejected",
    "RequestStream",
    "SamplingParams",
]
