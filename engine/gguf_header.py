"""The header of a GGUF file: its metadata and where each tensor lies, read without its weights.

``gguf.GGUFReader`` builds a numpy view for every element of every metadata array (the vocabulary
and merges of a tokenizer: about 100k of them), which takes seconds and holds over 100 MB for as
long as the reader lives. Loading a model needs the scalars and the tensor table only, so this
reads the header with ``struct`` (string arrays become tuples of str, number arrays numpy arrays;
a few MB) and leaves the tensor data in the file, read tensor by tensor at load.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

_SCALARS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i", GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}


class GGUFFormatError(ValueError):
    """Not a GGUF file this reader understands (bad magic, version, truncated header)."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order (rows first): the reverse of GGUF's dimension list
    type_id: int  # a GGMLQuantizationType value (kept raw: a newer file may use one this gguf lacks)
    offset: int  # absolute position of the data in the file

    @property
    def type_name(self) -> str:
        try:
            return GGMLQuantizationType(self.type_id).name
        except ValueError:
            return f"type {self.type_id}"

    def row_bytes(self) -> int:
        """Bytes of one row (the last dimension) in the file."""
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(self.type_id)]
        return self.shape[-1] // block * size


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)


class _Cursor:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos = buf, 0

    def unpack(self, fmt: str) -> Any:
        try:
            (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        except struct.error:
            raise GGUFFormatError("the header is truncated") from None
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        size = self.unpack("<Q")
        if self.pos + size > len(self.buf):
            raise GGUFFormatError("the header is truncated")
        text = self.buf[self.pos:self.pos + size].decode("utf-8", errors="replace")
        self.pos += size
        return text

    def value(self, kind: int) -> Any:
        if kind == GGUFValueType.STRING:
            return self.string()
        if kind == GGUFValueType.ARRAY:
            item, count = self.unpack("<I"), self.unpack("<Q")
            if item == GGUFValueType.STRING:
                return tuple(self.string() for _ in range(count))
            if item in _SCALARS:
                dtype = np.dtype(_SCALARS[GGUFValueType(item)])
                array = np.frombuffer(self.buf, dtype, count, self.pos).copy()
                self.pos += dtype.itemsize * count
                return array
            return [self.value(item) for _ in range(count)]  # arrays of arrays
        if kind in _SCALARS:
            return self.unpack(_SCALARS[GGUFValueType(kind)])
        raise GGUFFormatError(f"unknown metadata value type {kind}")


def read_header(path: str | Path) -> GGUFHeader:
    """The metadata and tensor table of a little-endian GGUF file (versions 2 and 3)."""
    file = Path(path)
    with file.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = _Cursor(buf)
        if cur.unpack("<I") != GGUF_MAGIC:
            raise GGUFFormatError("no GGUF magic at the start")
        version = cur.unpack("<I")
        if version not in (2, 3):
            raise GGUFFormatError(f"GGUF version {version} is not supported (2 and 3 are; big-endian files are not)")
        n_tensors, n_fields = cur.unpack("<Q"), cur.unpack("<Q")
        metadata: dict[str, Any] = {}
        for _ in range(n_fields):
            key = cur.string()
            metadata[key] = cur.value(cur.unpack("<I"))
        raw = []
        for _ in range(n_tensors):
            name = cur.string()
            dims = [cur.unpack("<Q") for _ in range(cur.unpack("<I"))]
            raw.append((name, tuple(reversed(dims)), cur.unpack("<I"), cur.unpack("<Q")))
        alignment = int(metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT))
        start = -(-cur.pos // alignment) * alignment
        tensors = tuple(TensorInfo(name, shape, kind, start + offset) for name, shape, kind, offset in raw)
    return GGUFHeader(file, metadata, tensors)
