"""Cache-aware vs round-robin routing over 2 engine nodes: prefix-cache hit rate and mean TTFT.

Two ``switchyard engine serve`` processes (a seeded random Llama-shaped model, CPU, one thread
each) sit behind one in-process gateway. A multi-turn chat workload runs twice, once per strategy,
on fresh nodes: ``--conversations`` conversations, each with its own long system prompt, played
``--concurrency`` at a time, ``--turns`` turns each (every turn resends the whole history, as chat
clients do). Hit rate = prompt tokens served from the nodes' prefix caches / prompt tokens looked
up (the nodes' /stats); TTFT is measured by the client on streamed answers. Prints a table.

    .venv/bin/python -m bench.cache_routing [--conversations 12] [--turns 6] [--concurrency 4]

Round-robin is the bench's own strategy (the gateway has none by that name): it is installed on
the model group in place of the configured one.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import openai

from backends.factory import build_backend
from engine.tiny_model import build_tiny_model
from gateway.app import create_app
from gateway.contracts import Principal
from gateway.routing.deployment import Deployment
from gateway.routing.router import Router
from gateway.services import Services
from gateway.settings import parse_settings
from tests.support.doubles import RecordingSink, ScriptedAdmission, StaticKeys
from tests.support.engine_nodes import EngineNode
from tests.support.servers import ServerThread

KEY = "sk-bench"
SIZES = {"hidden_size": 384, "intermediate_size": 1024, "num_hidden_layers": 6, "num_attention_heads": 6,
         "num_key_value_heads": 2, "max_position_embeddings": 4096}
WORDS = ("bicycle repair order refund parcel invoice warranty delivery account password store opening hours "
         "spare part brake chain tyre wheel saddle frame helmet light battery charger customer support").split()


def _system_prompt(i: int, rng: random.Random) -> str:
    return f"You are assistant number {i} of the help desk. " + " ".join(rng.choices(WORDS, k=220)) + "."


def round_robin_strategy() -> Any:
    counter = itertools.count()

    def round_robin(candidates: Sequence[Deployment], rng: random.Random) -> list[Deployment]:
        start = next(counter) % max(len(candidates), 1)
        return list(candidates[start:]) + list(candidates[:start])

    return round_robin


async def _conversation(client: openai.AsyncOpenAI, i: int, turns: int, max_tokens: int, ttfts: list[float]) -> None:
    rng = random.Random(i)
    messages: list[dict[str, Any]] = [{"role": "system", "content": _system_prompt(i, rng)}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn}: " + " ".join(rng.choices(WORDS, k=12)) + "?"})
        t0 = time.perf_counter()
        first: float | None = None
        text = []
        stream = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=max_tokens,  # type: ignore[arg-type]
                                                      stream=True, temperature=0)
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                if first is None:
                    first = time.perf_counter() - t0
                text.append(chunk.choices[0].delta.content)
        ttfts.append(first if first is not None else time.perf_counter() - t0)
        messages.append({"role": "assistant", "content": "".join(text)})


async def _workload(url: str, args: argparse.Namespace) -> list[float]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=600)
    ttfts: list[float] = []
    gate = asyncio.Semaphore(args.concurrency)

    async def one(i: int) -> None:
        async with gate:
            await _conversation(client, i, args.turns, args.max_tokens, ttfts)

    await asyncio.gather(*(one(i) for i in range(args.conversations)))
    await client.close()
    return ttfts


def run(strategy: str, model: Path, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    nodes = [EngineNode(model, workdir, f"{strategy}-node{i}", "--num-kv-blocks", str(args.kv_blocks),
                        "--max-model-len", "4096") for i in range(2)]
    try:
        for node in nodes:
            node.launch()
        for node in nodes:
            node.wait_ready()
        deployments = [
            {
                "provider": "openai",
                "name": n.name,
                "model": "tiny",
                "api_base": n.url + "/v1",
                "api_key": "sk-node",
                "timeouts": {"first_byte": 600, "total": 600},
            }
            for n in nodes
        ]
        configured = "cache_aware" if strategy == "cache_aware" else "weighted"
        settings = parse_settings(
            {"models": [{"name": "tiny", "strategy": configured, "max_retries": 0, "deployments": deployments}]}, env={}
        )
        router = Router.from_settings(settings, build_backend)
        if strategy == "round_robin":
            router.groups[0]._strategy = round_robin_strategy()
        services = Services(
            authenticator=StaticKeys({KEY: Principal(key_id="k", tenant_id="t")}),
            admission=ScriptedAdmission(),
            usage=RecordingSink(),
            router=router,
        )
        with ServerThread(create_app(settings, services)) as server:
            t0 = time.perf_counter()
            ttfts = asyncio.run(_workload(server.url, args))
            wall = time.perf_counter() - t0
        stats = [n.stats()["prefix_cache"] for n in nodes]
        queries, hits = sum(s["queries"] for s in stats), sum(s["hits"] for s in stats)
        per_node = [n.stats()["prompt_tokens"] for n in nodes]
    finally:
        for node in nodes:
            node.stop()
    return {
        "strategy": strategy,
        "hit_rate": hits / queries if queries else 0.0,
        "mean_ttft": statistics.mean(ttfts),
        "p50_ttft": statistics.median(ttfts),
        "requests": len(ttfts),
        "wall": wall,
        "prompt_tokens": per_node,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=12)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--kv-blocks", type=int, default=400, help="KV blocks per node (16 tokens each)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        model = build_tiny_model(workdir / "model", seed=1, **SIZES)
        rows = [run(s, model, workdir, args) for s in ("round_robin", "cache_aware")]
    print(
        f"\n{args.conversations} conversations x {args.turns} turns, {args.concurrency} at a time, "
        f"max_tokens {args.max_tokens}, {args.kv_blocks} KV blocks per node, 2 nodes\n"
    )
    print(
        f"| {'strategy':<12} | {'requests':>8} | {'prefix hit rate':>15} | {'mean TTFT (ms)':>14} | "
        f"{'p50 TTFT (ms)':>13} | {'prompt tokens per node':>22} | {'wall (s)':>8} |"
    )
    print(f"|{'-' * 14}|{'-' * 10}|{'-' * 17}|{'-' * 16}|{'-' * 15}|{'-' * 24}|{'-' * 10}|")
    for r in rows:
        split = " / ".join(str(t) for t in r["prompt_tokens"])
        print(
            f"| {r['strategy']:<12} | {r['requests']:>8} | {r['hit_rate']:>15.1%} | {r['mean_ttft'] * 1e3:>14.1f} | "
            f"{r['p50_ttft'] * 1e3:>13.1f} | {split:>22} | {r['wall']:>8.1f} |"
        )


if __name__ == "__main__":
    main()
