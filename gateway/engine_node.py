"""One engine node: the gateway's OpenAI surface over a single ``local`` deployment, no tenancy.

``switchyard engine serve`` runs this app. Requests go through the same controllers, wire types,
pipeline and ``LocalEngineBackend`` as in the gateway; only the tenancy seams are replaced: an
optional shared bearer key instead of SQL keys, no quotas, no usage rows (the gateway in front
meters). With ``tensor_parallel_size`` > 1 the engine is split over that many ranks
(``engine.tensor_parallel``). ``GET /stats`` reports what a router needs to place requests:
queue depth, KV usage and a summary of the prefix cache (hit counters and short digests of the
cached chains' first blocks).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from typing import Any

import msgspec
from litestar import Litestar, Request, get

from backends.base import Backend, EngineBacked
from backends.config import DeploymentConfig
from backends.factory import build_backend
from gateway.app import create_app
from gateway.contracts import Principal, Ticket, UsageRecord, completed
from gateway.pipeline import Pipeline
from gateway.routing.router import Router
from gateway.services import Services
from gateway.settings import Settings, parse_settings
from gateway.usage.pricing import HostedTools

ROOT_HASHES_SHOWN = 64  # at most this many first-block digests in /stats


class NodeKey:
    """Authenticator: any bearer token, or none, when no key is set (as vLLM without ``--api-key``),
    else exactly the configured one."""

    def __init__(self, api_key: str | None) -> None:
        self.api_key = api_key
        self.needs_key = api_key is not None  # read by ``Pipeline.authenticate``

    async def authenticate(self, token: str) -> Principal | None:
        if self.api_key is not None and not hmac.compare_digest(token.encode(), self.api_key.encode()):
            return None
        return Principal(key_id="engine-node", tenant_id=None)


class Unmetered:
    """Admission that admits everything (quotas belong to the gateway in front of the node)."""

    async def admit(self, principal: Principal, model: str, reserve_tokens: int,
                    output_field: str | None = "max_tokens", tools: HostedTools | None = None) -> Ticket:
        return Ticket(principal=principal, model=model, reserved_tokens=reserve_tokens)

    async def admit_poll(self, principal: Principal) -> Ticket:
        return Ticket(principal=principal, model="", reserved_tokens=0)

    def settle(self, ticket: Ticket, actual_tokens: int, cost: float) -> asyncio.Future[None]:
        return completed()

    async def charge(self, principal: Principal, tokens: int, cost: float, *, once: str | None = None) -> None:
        return None


class NoUsage:
    def record(self, record: UsageRecord) -> None:
        return None

    def begin(self, record: UsageRecord) -> None:
        return None

    async def sync(self) -> None:
        return None


class PrefixCacheStats(msgspec.Struct):
    queries: int  # prompt tokens looked up
    hits: int  # of which served from cache
    hit_rate: float
    cached_blocks: int
    cached_chains: int  # cached first blocks = distinct cached prefixes
    root_hashes: list[str]  # short digests of cached first blocks (most recently used last)


class NodeTenant(msgspec.Struct):
    """A tenant the gateway forwarded (``forward_tenant``), as the node's fair scheduler sees it."""

    tenant_id: str
    weight: float
    waiting: int
    running: int
    tokens_scheduled: int


class NodeStats(msgspec.Struct):
    model: str
    num_running: int
    queue_depth: int
    kv_usage: float
    num_kv_blocks: int
    num_free_blocks: int
    prompt_tokens: int
    generation_tokens: int
    num_preemptions: int
    prefix_cache: PrefixCacheStats
    tenants: list[NodeTenant]  # empty unless a gateway forwards tenants to this node


def node_settings(model: str, served_model_name: str, options: dict[str, Any]) -> Settings:
    """Settings with one model group served by one in-process engine deployment."""
    raw = {
        "models": [{"name": served_model_name, "max_retries": 0,
                    "deployments": [{"name": "engine", "provider": "local", "model": model, "options": options}]}],
        "dashboard": {"enabled": False},
    }
    return parse_settings(raw, env={})


def _digest(h: int) -> str:
    return hashlib.blake2b(h.to_bytes(16, "little", signed=True), digest_size=6).hexdigest()


def node_stats(backend: EngineBacked, model: str) -> NodeStats:
    """Stats of the node's engine backend: load, KV usage, and what its prefix cache holds."""
    m = backend.engine_metrics()
    cache = backend.prefix_cache_summary(ROOT_HASHES_SHOWN)
    prefix = PrefixCacheStats(
        queries=m.prefix_cache_queries, hits=m.prefix_cache_hits, hit_rate=m.prefix_cache_hit_rate,
        cached_blocks=cache.cached_blocks, cached_chains=cache.cached_chains,
        root_hashes=[_digest(h) for h in cache.root_hashes],
    )
    return NodeStats(
        model=model, num_running=m.num_running, queue_depth=m.num_waiting, kv_usage=m.kv_usage,
        num_kv_blocks=cache.num_blocks, num_free_blocks=cache.num_free_blocks,
        prompt_tokens=m.prompt_tokens, generation_tokens=m.generation_tokens, num_preemptions=m.num_preemptions,
        prefix_cache=prefix,
        tenants=[NodeTenant(t, f.weight, f.num_waiting, f.num_running, f.tokens_scheduled)
                 for t, f in m.tenants.items() if t],
    )


def create_node_app(settings: Settings, api_key: str | None = None, tensor_parallel_size: int = 1) -> Litestar:
    """The node's app: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``, health, ``/stats``."""

    def build(config: DeploymentConfig) -> Backend:
        if tensor_parallel_size > 1:
            from backends.local.tensor_parallel import TensorParallelBackend

            return TensorParallelBackend(config, tensor_parallel_size)
        return build_backend(config)

    router = Router.from_settings(settings, build)
    group = router.groups[0]
    backend = group.deployments[0].backend
    if not isinstance(backend, EngineBacked):
        raise ValueError(f"{group.deployments[0].config.model}: engine serve needs a model the engine runs (natively "
                         "or through transformers inside it); serve others with provider: transformers")

    @get("/stats", summary="Queue depth, KV usage and prefix-cache summary", tags=["Engine"])
    async def stats(request: Request[Any, Any, Any], pipeline: Pipeline) -> NodeStats:
        if api_key is not None:
            await pipeline.authenticate(request.headers)
        return node_stats(backend, group.name)

    services = Services(authenticator=NodeKey(api_key), admission=Unmetered(), usage=NoUsage(), router=router,
                        routes=[stats], tenant_from_headers=True)
    return create_app(settings, services)

