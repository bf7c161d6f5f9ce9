"""``switchyard engine ...``: offline batch generation and the built-in tiny model.

Engine flags use vLLM's spelling (``--model``, ``--max-model-len``, ``--gpu-memory-utilization``,
``--max-num-seqs``, ``--max-num-batched-tokens``, ``--block-size``, ``--dtype``,
``--enable-prefix-caching``). torch loads only when a command runs.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import IO, Annotated, Any

import typer

from backends.local.capacity_cli import capacity

engine_app = typer.Typer(no_args_is_help=True, help="Run the built-in inference engine offline.")


@dataclass
class Job:
    """One JSONL input line: a prompt (text or ids) or chat messages, with its sampling fields."""

    line: int
    id: Any
    prompt: str | list[int] | None
    messages: list[dict[str, Any]] | None
    sampling: dict[str, Any]


def read_jobs(path: Path, defaults: dict[str, Any]) -> list[Job]:
    """Parse the input file; a bad line is reported with its number."""
    from engine import SamplingParams

    allowed = {f.name for f in fields(SamplingParams)}
    jobs = []
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(item, dict) or ("prompt" in item) == ("messages" in item):
            raise ValueError(f"{path}:{number}: give an object with exactly one of 'prompt' or 'messages'")
        sampling = {k: v for k, v in item.items() if k not in ("prompt", "messages", "id")}
        unknown = sorted(set(sampling) - allowed)
        if unknown:
            raise ValueError(f"{path}:{number}: unknown fields {unknown}")
        jobs.append(Job(number, item.get("id", number), item.get("prompt"), item.get("messages"),
                        {**defaults, **sampling}))
    return jobs


def _engine_config(model: str, **flags: Any) -> Any:
    from engine import EngineConfig

    return EngineConfig(model=model, **{k: v for k, v in flags.items() if v is not None})


class _Output:
    """``--output``: written to a temporary file beside it, which replaces it once all is written (a
    failed run leaves what it held); stdout without one."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.file: IO[str] = sys.stdout
        if path is not None:
            if path.is_dir():
                raise OSError(f"cannot write {path}: Is a directory")
            try:
                self.file = tempfile.NamedTemporaryFile(  # closed by __exit__ or discard
                    "w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.", delete=False)
            except OSError as exc:
                raise OSError(f"cannot write {path}: {exc.strerror or exc}") from None

    def discard(self) -> None:
        if self.path is not None:
            self.file.close()
            Path(self.file.name).unlink(missing_ok=True)

    def __enter__(self) -> IO[str]:
        return self.file

    def __exit__(self, kind: object, *_: object) -> None:
        if self.path is None:
            return
        if kind is not None:
            self.discard()
            return
        self.file.close()
        os.replace(self.file.name, self.path)


@engine_app.command("generate")
def generate(
    input_file: Annotated[
        Path,
        typer.Argument(
            help="JSONL: one {'prompt': ...} or {'messages': [...]} per line, "
            "optionally with sampling fields (max_tokens, temperature, ...)"
        ),
    ],
    model: Annotated[str, typer.Option("--model", help="Local Hugging Face model folder.")],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write results here (default stdout).")] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Default max_tokens per line.")] = 64,
    temperature: Annotated[float, typer.Option("--temperature", help="Default temperature (0 = greedy).")] = 0.0,
    max_model_len: Annotated[int | None, typer.Option("--max-model-len")] = None,
    gpu_memory_utilization: Annotated[float, typer.Option("--gpu-memory-utilization")] = 0.9,
    max_num_seqs: Annotated[int, typer.Option("--max-num-seqs", help="0: 256, or the token budget if lower")] = 0,
    max_num_batched_tokens: Annotated[int, typer.Option("--max-num-batched-tokens")] = 2048,
    block_size: Annotated[int, typer.Option("--block-size")] = 16,
    dtype: Annotated[str, typer.Option(
        "--dtype", help="auto (float32 on a CPU, the checkpoint's half dtype on a GPU), float32, bfloat16 or float16.",
    )] = "auto",
    enable_prefix_caching: Annotated[bool, typer.Option("--enable-prefix-caching/--no-enable-prefix-caching")] = True,
    device: Annotated[str, typer.Option("--device")] = "cpu",
    num_kv_blocks: Annotated[int | None, typer.Option("--num-kv-blocks", help="KV blocks (CPU sizing).")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    model_impl: Annotated[
        str, typer.Option("--model-impl", help="auto, native or transformers (see engine.model_impl).")
    ] = "auto",
    attn_backend: Annotated[
        str,
        typer.Option(
            "--attn-backend", help="auto (C++ decode kernels on CPU when they build), torch (reference), cpu or triton."
        ),
    ] = "auto",
    enforce_eager: Annotated[bool, typer.Option("--enforce-eager", help="No CUDA graphs for decode steps.")] = False,
    tensor_parallel_size: Annotated[
        int,
        typer.Option(
            "--tensor-parallel-size", "-tp", min=1, help="Ranks to split the model over (engine.tensor_parallel)."
        ),
    ] = 1,
) -> None:
    """Generate for every line of a JSONL file, with a progress bar; results go out as JSONL."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from engine import LLMEngine, SamplingParams

    sink: _Output | None = None
    try:
        jobs = read_jobs(input_file, {"max_tokens": max_tokens, "temperature": temperature})
        sink = _Output(output)  # before the work: a path it cannot write fails now, not after hours
        config = _engine_config(
            model,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            block_size=block_size,
            dtype=dtype,
            enable_prefix_caching=enable_prefix_caching,
            device=device,
            num_kv_blocks=num_kv_blocks,
            seed=seed,
            model_impl=model_impl,
            attn_backend=attn_backend,
            enforce_eager=enforce_eager,
        )
        group = None
        if tensor_parallel_size > 1:
            from engine.tensor_parallel import start_tensor_parallel

            group = start_tensor_parallel(config, tensor_parallel_size)
        engine = group.engine if group is not None else LLMEngine(config)
        for job in jobs:
            try:
                prompt: str | list[int] | None = job.prompt
                if job.messages is not None:
                    if engine.tokenizer is None:
                        raise ValueError("'messages' needs a model with a tokenizer")
                    prompt = engine.tokenizer.apply_chat_template(job.messages)
                assert prompt is not None  # a job has exactly one of prompt and messages (checked on reading)
                engine.add_request(str(job.line), prompt, SamplingParams(**job.sampling), stream=False)
            except (ValueError, TypeError) as exc:  # a field of the wrong type too: the line it is on
                raise ValueError(f"{input_file}:{job.line}: {exc}") from None
    except BaseException as exc:
        if sink is not None:
            sink.discard()
        if not isinstance(exc, OSError | ValueError | TypeError):
            raise
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None

    results: dict[str, Any] = {}
    columns = (TextColumn("generate"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, transient=output is None) as bar:
            task = bar.add_task("generate", total=len(jobs))
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished:
                        results[out.request_id] = out
                        bar.advance(task)
    except BaseException:
        sink.discard()
        raise
    finally:
        if group is not None:
            group.shutdown()
    with sink as out_file:
        for job in jobs:
            out = results[str(job.line)]
            completions = [
                {"text": o.text, "token_ids": o.token_ids, "finish_reason": o.finish_reason} for o in out.outputs
            ]
            row = {
                "id": job.id,
                "prompt_tokens": len(out.prompt_token_ids),
                "completion_tokens": sum(len(o.token_ids) for o in out.outputs),
                "outputs": completions,
            }
            out_file.write(json.dumps(row, ensure_ascii=False) + "\n")
    m = engine.get_metrics()
    typer.echo(
        f"{len(jobs)} requests, {m.generation_tokens} tokens generated, "
        f"prefix-cache hit rate {m.prefix_cache_hit_rate:.0%}",
        err=True,
    )


@engine_app.command("build-tiny")
def build_tiny(
    path: Annotated[Path, typer.Argument(help="Folder to write the model into.")],
    arch: Annotated[str, typer.Option("--arch", help="llama, mistral, qwen2 or qwen3.")] = "llama",
    seed: Annotated[int, typer.Option("--seed")] = 0,
) -> None:
    """Write the built-in tiny model (seeded random weights + the shipped tokenizer) as a HF folder."""
    from engine.tiny_model import build_tiny_model

    try:
        typer.echo(str(build_tiny_model(path, arch=arch, seed=seed)))
    except OSError as exc:  # a file in the way, a folder it may not write: the path, not a database
        typer.echo(f"error: cannot write the model into {path}: {exc.strerror or exc}", err=True)
        raise typer.Exit(2) from None
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


engine_app.command("capacity")(capacity)


def register(app: typer.Typer) -> None:
    app.add_typer(engine_app, name="engine")
