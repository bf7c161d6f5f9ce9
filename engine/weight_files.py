"""Which ``*.safetensors`` files of a Hugging Face folder hold its checkpoint, as transformers picks
them: the shards ``model.safetensors.index.json`` names, else ``model.safetensors``, else (a folder
with neither) every ``*.safetensors``. Other files beside a checkpoint, such as the
``consolidated.safetensors`` Mistral repositories ship in their own format, or a LoRA adapter's
``adapter_model.safetensors``, are not part of it."""

from __future__ import annotations

import json
from pathlib import Path

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class ModelLoadError(ValueError):
    """The folder is missing, incomplete or holds an architecture we cannot run natively."""


def safetensors_files(model_path: str | Path) -> list[Path]:
    """The checkpoint files (raises ModelLoadError when the index names absent shards or there are none)."""
    path = Path(model_path)
    index = path / INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [path / name for name in sorted(set(weight_map.values()))]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise ModelLoadError(f"{index.name} names missing shards: {absent}")
        return files
    if (path / SINGLE).is_file():
        return [path / SINGLE]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"model folder {str(path)!r} has no *.safetensors weights")
    return files
