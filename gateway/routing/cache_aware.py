"""Strategy ``cache_aware``: send requests that share a prompt prefix to the same engine node.

An engine node keeps the KV blocks of recent prompts (its prefix cache); a request whose prompt
starts like an earlier one skips recomputing that part, but only on the node that served the
earlier one. So the key of a request is a hash of the *start* of its prompt, chosen so that it does not
change as a conversation grows: for chat, the messages up to and including the first user
message (the system prompt and the opening question, which every later turn repeats), at most
``PREFIX_CHARS`` characters; for text completions, the first ``PREFIX_CHARS`` characters.

Placement is consistent hashing with bounded loads (Mirrokni et al.): each deployment owns
``VNODES`` points on a hash ring; the request walks clockwise from its key and takes the first
deployment whose outstanding requests stay within ``LOAD_FACTOR`` times the mean (plus one).
Adding or removing a node moves only the keys next to its points. Deployments over the cap are
not dropped but tried last, least loaded first; a request with no text gets a random key. The
load is what this gateway process has outstanding at each deployment (``Backend.stats``), so with
several replicas each caps its own share.

The key's text is part of the call's description (``gateway.calls``: ``routing_key``), built once
where the request enters; the plan hands it to the group's strategy.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
from collections.abc import Sequence
from functools import lru_cache

from backends.openai_wire import ChatCompletionRequest, CompletionRequest
from gateway.routing.deployment import Deployment

PREFIX_CHARS = 1024  # the key covers at most this many leading characters of the prompt
LOAD_FACTOR = 1.25  # a deployment takes a request while load + 1 <= ceil(LOAD_FACTOR * (total + 1) / n)
VNODES = 64  # ring points per deployment


def chat_prefix(body: ChatCompletionRequest) -> str:
    """The conversation's opening, up to and including the first user message (roles included)."""
    parts = []
    for m in body.messages:
        parts.append(f"<{m.role}>{m.text()}\n")
        if m.role == "user":
            break
    return "".join(parts)


def completion_prefix(body: CompletionRequest) -> str:
    prompt = body.prompt
    if isinstance(prompt, str):
        return prompt
    if prompt and isinstance(prompt[0], str):
        return str(prompt[0])
    return " ".join(str(t) for t in prompt[:PREFIX_CHARS])  # token ids: their text form keys the same way


def _hash(data: str) -> int:
    return int.from_bytes(hashlib.blake2b(data.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


def prefix_key(text: str | None) -> int | None:
    """The ring position of a prompt: a hash of its first ``PREFIX_CHARS`` characters; None for no text."""
    return _hash(text[:PREFIX_CHARS]) if text else None


@lru_cache(maxsize=64)
def _ring(ids: tuple[str, ...]) -> tuple[list[int], list[int]]:
    """Sorted ring points and, for each, the index into ``ids`` of the deployment owning it."""
    points = sorted((_hash(f"{d}#{v}"), i) for i, d in enumerate(ids) for v in range(VNODES))
    return [p for p, _ in points], [i for _, i in points]


def ring_order(ids: Sequence[str], key: int) -> list[int]:
    """Indices of ``ids`` in the order met walking the ring clockwise from ``key``."""
    points, owners = _ring(tuple(ids))
    start = bisect.bisect_left(points, key)
    order: list[int] = []
    for k in range(len(points)):
        owner = owners[(start + k) % len(points)]
        if owner not in order:
            order.append(owner)
            if len(order) == len(ids):
                break
    return order


def _load(d: Deployment) -> int:
    return d.backend.stats().in_flight  # queued requests included (BackendStats)


def cache_aware(candidates: Sequence[Deployment], rng: random.Random, key: str | None = None) -> list[Deployment]:
    """Ring order from the request's prefix key, deployments over the load cap moved last."""
    if not candidates:
        return []
    point = prefix_key(key)
    if point is None:
        point = rng.getrandbits(64)
    ordered = [candidates[i] for i in ring_order([d.id for d in candidates], point)]
    loads = {id(d): _load(d) for d in ordered}
    cap = math.ceil(LOAD_FACTOR * (sum(loads.values()) + 1) / len(ordered))
    within = [d for d in ordered if loads[id(d)] + 1 <= cap]
    over = sorted((d for d in ordered if loads[id(d)] + 1 > cap), key=lambda d: loads[id(d)])
    return within + over
