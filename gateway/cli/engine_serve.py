"""``switchyard engine serve``: one engine node over OpenAI-compatible HTTP (``gateway.engine_node``).

A gateway routes to many such nodes with ``provider: openai`` deployments whose ``api_base`` is
``http://<node>:<port>/v1``; ``strategy: cache_aware`` keeps conversations on the node holding
their prefix. Engine flags use vLLM's spelling, as ``switchyard engine generate`` does.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any

import typer


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """A warning for a node that anyone reaching it may call: no key, on an address beyond loopback."""
    if api_key is not None:
        return None
    try:
        if host == "localhost" or ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:  # a host name: it may resolve to any interface
        pass
    return (f"warning: serving on {host} without --api-key (or SWITCHYARD_ENGINE_API_KEY): whoever reaches "
            "this port may use the engine and name any tenant; give the node a key")


def serve(
    model: Annotated[str, typer.Option("--model", help="Local Hugging Face model folder.")],
    port: Annotated[int, typer.Option("--port", min=0, max=65535)] = 8100,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    served_model_name: Annotated[
        str | None, typer.Option("--served-model-name", help="Public model name (default: the folder name).")
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key", envvar="SWITCHYARD_ENGINE_API_KEY", help="Bearer key clients must send (default: any)."
        ),
    ] = None,
    builtin_tiny: Annotated[
        bool,
        typer.Option("--builtin-tiny", help="Build the built-in tiny model into --model when the folder is missing."),
    ] = False,
    tensor_parallel_size: Annotated[
        int,
        typer.Option(
            "--tensor-parallel-size",
            "-tp",
            min=1,
            help="Ranks to split the model over (torch.distributed: NCCL on CUDA, one GPU each; gloo on CPU).",
        ),
    ] = 1,
    max_model_len: Annotated[int | None, typer.Option("--max-model-len")] = None,
    gpu_memory_utilization: Annotated[float | None, typer.Option("--gpu-memory-utilization")] = None,
    max_num_seqs: Annotated[int | None, typer.Option("--max-num-seqs")] = None,
    max_num_batched_tokens: Annotated[int | None, typer.Option("--max-num-batched-tokens")] = None,
    block_size: Annotated[int | None, typer.Option("--block-size")] = None,
    dtype: Annotated[str | None, typer.Option("--dtype", help="auto (default), float32, bfloat16 or float16.")] = None,
    enable_prefix_caching: Annotated[bool, typer.Option("--enable-prefix-caching/--no-enable-prefix-caching")] = True,
    device: Annotated[str | None, typer.Option("--device")] = None,
    num_kv_blocks: Annotated[int | None, typer.Option("--num-kv-blocks", help="KV blocks (CPU sizing).")] = None,
    kv_cache_bytes: Annotated[
        int | None, typer.Option("--kv-cache-bytes", help="KV cache size in bytes (CPU sizing).")
    ] = None,
    model_impl: Annotated[
        str,
        typer.Option(
            "--model-impl",
            help="auto, native or transformers (see engine.model_impl); tensor parallelism runs native models only.",
        ),
    ] = "auto",
    seed: Annotated[int | None, typer.Option("--seed")] = None,
    attn_backend: Annotated[str | None, typer.Option("--attn-backend", help="auto, torch, cpu or triton.")] = None,
    enforce_eager: Annotated[bool, typer.Option("--enforce-eager", help="No CUDA graphs for decode steps.")] = False,
    scheduling: Annotated[
        str,
        typer.Option(
            "--scheduling", help="fcfs, or fair: weighted fair across the tenants a gateway forwards (forward_tenant)."
        ),
    ] = "fcfs",
) -> None:
    """Serve one model with the built-in engine: /v1/chat/completions, /v1/completions, /v1/models, /stats."""
    import os
    from pathlib import Path

    import uvicorn

    from gateway.cli.http_protocol import MAX_CONNECTIONS_ENV, HeadDeadlineProtocol
    from gateway.cli.serve import listen
    from gateway.engine_node import create_node_app, node_settings
    from gateway.settings import ConfigError

    if tensor_parallel_size > 1 and model_impl == "transformers":
        typer.echo(
            "error: --tensor-parallel-size > 1 runs the native models only (use --model-impl native or auto)", err=True
        )
        raise typer.Exit(2)
    flags: dict[str, Any] = {
        "max_model_len": max_model_len,
        "gpu_memory_utilization": gpu_memory_utilization,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "block_size": block_size,
        "dtype": dtype,
        "enable_prefix_caching": enable_prefix_caching,
        "device": device,
        "num_kv_blocks": num_kv_blocks,
        "kv_cache_bytes": kv_cache_bytes,
        "seed": seed,
        "attn_backend": attn_backend,
        "enforce_eager": enforce_eager,
        "model_impl": "native" if tensor_parallel_size > 1 else model_impl,
        "scheduling": scheduling,
    }
    options = {k: v for k, v in flags.items() if v is not None}
    if builtin_tiny:
        options["builtin"] = "tiny"
    name = served_model_name or Path(model).name
    listen(host, port).close()  # a port in use fails now, not after the model's load (uvicorn binds it then)
    if warning := exposure_warning(host, api_key):
        typer.echo(warning, err=True)
    try:
        app = create_node_app(
            node_settings(model, name, options), api_key=api_key, tensor_parallel_size=tensor_parallel_size
        )
    except (ConfigError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    # A node's clients are gateways, each holding many connections from one address: no cap on them
    # unless the operator sets one.
    os.environ.setdefault(MAX_CONNECTIONS_ENV, "0")
    uvicorn.run(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http=HeadDeadlineProtocol,  # the gateway's: a client gone before its answer began cancels the request
        lifespan="on",
        timeout_graceful_shutdown=10,
        log_level="warning",
    )


def register(engine_app: typer.Typer) -> None:
    engine_app.command("serve")(serve)
