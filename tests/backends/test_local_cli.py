"""``switchyard engine generate`` / ``build-tiny`` through the real typer app."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import openai
import pytest
from typer.testing import CliRunner

from engine.tokenizer import Tokenizer
from gateway.cli import app
from tests.support.servers import ServerThread

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "tiny"
    result = runner.invoke(app, ["engine", "build-tiny", str(path), "--seed", "4"])
    assert result.exit_code == 0, result.output
    return path


def test_generate_from_jsonl(tiny: Path, tmp_path: Path) -> None:
    lines = [
        {"prompt": "The train leaves", "id": "a"},
        {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 5, "ignore_eos": True},
        {"prompt": [0, 44, 316], "n": 2, "temperature": 0.8, "seed": 3, "max_tokens": 4, "ignore_eos": True},
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    out = tmp_path / "out.jsonl"
    args = ["engine", "generate", str(src), "--model", str(tiny), "-o", str(out), "--max-tokens", "6",
            "--max-model-len", "256", "--num-kv-blocks", "64", "--block-size", "8", "--max-num-seqs", "4",
            "--max-num-batched-tokens", "64", "--dtype", "float32", "--no-enable-prefix-caching"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a", 2, 3]
    tok = Tokenizer(tiny)
    assert rows[0]["prompt_tokens"] == len(tok.encode("The train leaves"))
    assert 1 <= rows[0]["completion_tokens"] <= 6
    assert rows[1]["prompt_tokens"] == len(tok.apply_chat_template(lines[1]["messages"]))
    assert rows[1]["completion_tokens"] == 5
    assert len(rows[2]["outputs"]) == 2 and rows[2]["completion_tokens"] == 8
    # the text is the decoded tokens (an incomplete character at the very end a U+FFFD)
    assert rows[0]["outputs"][0]["text"] == tok.decode(rows[0]["outputs"][0]["token_ids"])
    again = runner.invoke(app, args)
    assert again.exit_code == 0
    assert [json.loads(x) for x in out.read_text().splitlines()] == rows  # greedy and seeded: reproducible


@pytest.mark.parametrize("line,message", [
    ("not json", "not JSON"),
    ('{"prompt": "x", "messages": []}', "exactly one of"),
    ('{"prompt": "x", "warp": 1}', "unknown fields \\['warp'\\]"),
    ('{"prompt": "x", "temperature": -1}', "temperature must be >= 0"),
    ('{"prompt": "x", "max_tokens": "8"}', r"in\.jsonl:1: "),  # a wrong type: its line, not a bare TypeError
    ('{"prompt": 5}', r"in\.jsonl:1: "),
])
def test_bad_input_lines_are_clear_errors(tiny: Path, tmp_path: Path, line: str, message: str) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(line + "\n")
    result = runner.invoke(app, ["engine", "generate", str(src), "--model", str(tiny), "--num-kv-blocks", "256"])
    assert result.exit_code == 2
    assert re.search(message, result.output)


def test_missing_model_folder(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"prompt": "x"}\n')
    result = runner.invoke(app, ["engine", "generate", str(src), "--model", str(tmp_path / "none")])
    assert result.exit_code == 2 and "error:" in result.output


def test_engine_serve_passes_enforce_eager_to_the_engine(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``engine serve --enforce-eager`` reaches the EngineConfig as ``engine generate``'s flag does.
    The app ``serve`` hands to uvicorn is kept and served here on loopback instead of blocking."""
    import uvicorn

    served: list[Any] = []
    monkeypatch.setattr(uvicorn, "run", lambda node, **_: served.append(node))
    base = ["engine", "serve", "--model", str(tiny), "--served-model-name", "tiny", "--num-kv-blocks", "64",
            "--max-model-len", "256"]
    for flags, eager in (([], False), (["--enforce-eager"], True)):
        result = runner.invoke(app, [*base, *flags])
        assert result.exit_code == 0, result.output
        backend = served[-1].state["services"].router.groups[0].deployments[0].backend
        assert backend.engine.engine.config.enforce_eager is eager
    with ServerThread(served[-1]) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="any", max_retries=0)
        done = client.completions.create(
            model="tiny", prompt="The train", max_tokens=3, extra_body={"ignore_eos": True}
        )
        assert done.usage is not None and done.usage.completion_tokens == 3


@pytest.mark.parametrize(("impl", "served_as"), [("auto", "transformers"), ("native", None)])
def test_engine_serve_runs_non_native_architectures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, impl: str, served_as: str | None
) -> None:
    """``engine serve --model-impl auto`` serves a GPT-2 folder through the transformers fallback;
    ``native`` refuses it, naming the native architectures."""
    import uvicorn

    from tests.support.fallback_models import build_model

    folder = build_model("gpt2", tmp_path / "gpt2")
    served: list[Any] = []
    monkeypatch.setattr(uvicorn, "run", lambda node, **_: served.append(node))
    result = runner.invoke(
        app,
        [
            "engine",
            "serve",
            "--model",
            str(folder),
            "--served-model-name",
            "g",
            "--kv-cache-bytes",
            str(1 << 20),
            "--max-model-len",
            "128",
            "--model-impl",
            impl,
        ],
    )
    if served_as is None:
        assert result.exit_code == 2 and "LlamaForCausalLM" in result.output
        return
    assert result.exit_code == 0, result.output
    with ServerThread(served[-1]) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="any", max_retries=0)
        assert client.models.retrieve("g").model_extra["metadata"]["model_impl"] == served_as  # type: ignore[index]
        done = client.completions.create(model="g", prompt="hello", max_tokens=3, extra_body={"ignore_eos": True})
        assert done.usage is not None and done.usage.completion_tokens == 3


def test_engine_serve_tensor_parallel_refuses_the_transformers_path(tiny: Path) -> None:
    result = runner.invoke(app, ["engine", "serve", "--model", str(tiny), "-tp", "2", "--model-impl", "transformers"])
    assert result.exit_code == 2 and "native models only" in result.output


def test_an_output_it_cannot_write_fails_before_generating(tiny: Path, tmp_path: Path) -> None:
    """Not after the whole file was generated (hours, on a big one), with a message about a database."""
    src = tmp_path / "in.jsonl"
    src.write_text('{"prompt": "x", "max_tokens": 2}\n')
    for target in (tmp_path, tmp_path / "none" / "out.jsonl"):
        result = runner.invoke(app, ["engine", "generate", str(src), "--model", str(tiny), "-o", str(target),
                                     "--num-kv-blocks", "256"])
        assert result.exit_code == 2 and result.output.startswith(f"error: cannot write {target}: "), result.output
        assert "generate" not in result.output and "database" not in result.output


def test_a_failed_generate_leaves_the_output_file_alone(tiny: Path, tmp_path: Path) -> None:
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text('{"prompt": "x", "temperature": -1}\n')
    out.write_text("yesterday's results\n")
    result = runner.invoke(app, ["engine", "generate", str(src), "--model", str(tiny), "-o", str(out)])
    assert result.exit_code == 2 and out.read_text() == "yesterday's results\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]  # no temporary file left


def test_build_tiny_onto_a_file_names_the_path(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("")
    result = runner.invoke(app, ["engine", "build-tiny", str(tmp_path / "taken")])
    assert result.exit_code == 2, result.output
    assert result.output == f"error: cannot write the model into {tmp_path / 'taken'}: File exists\n"


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_engine_serve_refuses_a_port_out_of_range(port: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """--port 99999 once served on 99999 mod 65536, as ``switchyard serve`` did."""
    monkeypatch.setattr("gateway.engine_node.create_node_app", lambda *a, **k: pytest.fail("went on to load"))
    result = runner.invoke(app, ["engine", "serve", "--model", "unused", "--port", port])
    assert result.exit_code == 2 and "--port" in result.output, result.output


def test_engine_serve_on_a_port_in_use_fails_before_loading_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not after the model's load (minutes on a big one), with uvicorn's own message and status 3."""
    import socket

    monkeypatch.setattr("gateway.engine_node.create_node_app", lambda *a, **k: pytest.fail("went on to load"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = runner.invoke(app, ["engine", "serve", "--model", "unused", "--port", str(port)])
    assert result.exit_code == 1, result.output
    assert result.output == f"error: cannot listen on 127.0.0.1:{port}: Address already in use\n"


def test_engine_serve_refuses_an_empty_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--host "$HOST"`` with HOST unset would bind every interface, opening the engine to the network."""
    monkeypatch.setattr("gateway.engine_node.create_node_app", lambda *a, **k: pytest.fail("went on to load"))
    result = runner.invoke(app, ["engine", "serve", "--model", "unused", "--host", ""])
    assert result.exit_code == 2 and result.output.startswith("error: the host is empty"), result.output
