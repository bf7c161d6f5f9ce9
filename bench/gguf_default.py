"""The embedded default on this machine: SmolLM2-135M-Instruct (Q4_1 GGUF) through the gateway, beside
transformers ``generate`` on the same weights (its own GGUF loading, float32), in the same run.

(a) cold start: ``switchyard bootstrap`` + ``switchyard serve`` on config/default.yaml (a fresh
    SQLite database) until the first chat answer arrives; (b) the gateway's peak RSS (VmHWM) after
    everything below; (c) one request alone: ms per output token after the first; (d) 16 requests
    at once: output tokens per second. transformers: the same 16 prompts as one padded batch.

    .venv/bin/python -m bench.gguf_default [--tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import yaml

from backends.local.default_model import default_model_path
from bench.harness import free_port, print_table, stop

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-switchyard-local"  # the default config's admin key
QUESTIONS = [f"Tell me one fact about the number {i}." for i in range(16)]


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _chat(url: str, question: str, tokens: int, stream: bool = False) -> tuple[float, float, int]:
    """(seconds to the first token, seconds in all, output tokens) for one chat request."""
    body = {"model": "smollm2", "messages": [{"role": "user", "content": question}], "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True, "stream": stream, "stream_options": {"include_usage": True}}
    if not stream:
        body.pop("stream_options")
    t0 = time.perf_counter()
    first = None
    count = 0
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600,
                      headers={"authorization": f"Bearer {KEY}"}) as answer:
        answer.raise_for_status()
        if not stream:
            data = answer.read()
            return 0.0, time.perf_counter() - t0, int(json.loads(data)["usage"]["completion_tokens"])
        for line in answer.iter_lines():
            if line.startswith("data: {") and '"content":"' in line and first is None:
                first = time.perf_counter() - t0
            if '"usage":{' in line:
                count = int(json.loads(line[6:])["usage"]["completion_tokens"])
    return first or 0.0, time.perf_counter() - t0, count


def gateway(tokens: int, workdir: Path) -> dict[str, float]:
    config = yaml.safe_load((ROOT / "config/default.yaml").read_text())
    config["database"] = {"url": f"sqlite+aiosqlite:///{workdir}/bench.db"}
    config["usage"] = {"journal_dir": str(workdir / "journal")}
    path = workdir / "default.yaml"
    path.write_text(yaml.safe_dump(config))
    exe = str(Path(sys.executable).parent / "switchyard")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD__")}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    subprocess.run([exe, "bootstrap", "--config", str(path)], cwd=ROOT, env=env, check=True, capture_output=True)
    log = (workdir / "serve.log").open("wb")
    proc = subprocess.Popen([exe, "serve", "--config", str(path), "--port", str(port), "--workers", "1"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError((workdir / "serve.log").read_text()[-2000:])
            try:
                _chat(url, "Hello!", 8)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        cold = time.perf_counter() - t0
        first, total, count = _chat(url, QUESTIONS[0], tokens, stream=True)
        per_token = (total - first) / max(1, count - 1) * 1000
        t1 = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            counts = list(pool.map(lambda q: _chat(url, q, tokens)[2], QUESTIONS))
        throughput = sum(counts) / (time.perf_counter() - t1)
        return {"cold": cold, "rss": _peak_rss_mib(proc.pid), "ms_token": per_token, "tok_s": throughput}
    finally:
        stop(proc)


def transformers_generate(tokens: int) -> dict[str, float]:
    """The same measurements with transformers in this process (its load is the 'cold start')."""
    import resource

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = default_model_path()
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()

    def prompt(q: str) -> list[int]:
        return list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False))

    ids = torch.tensor([prompt("Hello!")])
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    cold = time.perf_counter() - t0
    ids = torch.tensor([prompt(QUESTIONS[0])])
    t1 = time.perf_counter()
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False)
    prefill = time.perf_counter() - t1
    t1 = time.perf_counter()
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, min_new_tokens=tokens,
                   do_sample=False)
    per_token = (time.perf_counter() - t1 - prefill) / (tokens - 1) * 1000
    tok.padding_side = "left"
    batch = tok([tok.decode(prompt(q)) for q in QUESTIONS], return_tensors="pt", padding=True,
                add_special_tokens=False)
    t1 = time.perf_counter()
    model.generate(**batch, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                   pad_token_id=tok.pad_token_id)
    throughput = len(QUESTIONS) * tokens / (time.perf_counter() - t1)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"cold": cold, "rss": rss, "ms_token": per_token, "tok_s": throughput}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64, help="Output tokens per request.")
    args = parser.parse_args()
    if not default_model_path().is_file():
        sys.exit(f"{default_model_path()} is missing: run make install")
    with tempfile.TemporaryDirectory() as tmp:
        ours = gateway(args.tokens, Path(tmp))
    theirs = transformers_generate(args.tokens)
    rows = [
        ["cold start to first answer (s)", f"{ours['cold']:.1f}", f"{theirs['cold']:.1f}",
         "gateway: bootstrap + serve + engine load; transformers: load + one generate"],
        ["peak RSS (MiB)", f"{ours['rss']:.0f}", f"{theirs['rss']:.0f}", "goal for the gateway: <= 1229 (1.2 GB)"],
        ["one request: ms per output token", f"{ours['ms_token']:.1f}", f"{theirs['ms_token']:.1f}",
         f"{args.tokens} tokens, after the first"],
        ["16 at once: output tokens/s", f"{ours['tok_s']:.0f}", f"{theirs['tok_s']:.0f}",
         "transformers: one padded batch of 16"],
    ]
    print_table(rows, ["measurement", "switchyard (gateway)", "transformers generate", "notes"])


if __name__ == "__main__":
    main()
