"""C++ attention kernels for the CPU (the "cpu" attention backend), built on first use.

``paged_decode.cpp`` is compiled once per machine with the system C++ compiler against the
installed torch (a few seconds) into ``~/.cache/switchyard/cpu_kernels`` (or
``$SWITCHYARD_KERNEL_CACHE``) and loaded as the torch op ``torch.ops.switchyard_cpu.paged_decode``.
The file name carries a hash of the source, the torch version, the flags and the CPU, so a change
to any of them builds afresh; the build writes to a temporary file and renames it into place, so
concurrent processes never load a half-written library. Without a compiler ``available()`` is False
and says why in ``build_error()``; the engine then keeps the pure-torch attention.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

log = logging.getLogger("switchyard.engine")

SOURCE = Path(__file__).with_name("paged_decode.cpp")
FLAGS = ["-O3", "-march=native", "-fopenmp", "-std=c++17", "-shared", "-fPIC", "-w"]
_state: dict[str, object] = {}


def _cpu_signature() -> str:
    """What -march=native compiles for: the CPU's model and feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine() + platform.processor()
    wanted = [ln for ln in lines if ln.startswith(("model name", "flags", "Features"))]
    return "\n".join(sorted(set(wanted)))


def _cache_dir() -> Path:
    root = os.environ.get("SWITCHYARD_KERNEL_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "switchyard" / "cpu_kernels"


def _compile_command(compiler: str, output: Path) -> list[str]:
    torch_dir = Path(torch.__file__).parent
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    lib = torch_dir / "lib"
    return [compiler, *FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{torch_dir / 'include'}", str(SOURCE),
            f"-L{lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{lib}", "-o", str(output)]


def _library() -> Path:
    """The built library, compiling it first when this machine has none for this source."""
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not compiler:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), torch.__version__.encode(), " ".join(FLAGS).encode(), _cpu_signature().encode()):
        key.update(part)
    folder = _cache_dir()
    target = folder / f"paged_decode-{key.hexdigest()[:20]}.so"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".so.tmp")
    os.close(fd)
    try:
        log.info("building the CPU attention kernel into %s", target)
        done = subprocess.run(_compile_command(compiler, Path(tmp)), capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"compiling {SOURCE.name} failed: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def available() -> bool:
    """Build and load the kernels once per process; False (see ``build_error``) if that fails."""
    if "ok" not in _state:
        try:
            torch.ops.load_library(str(_library()))
            _state["ok"] = True
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            _state["ok"], _state["error"] = False, str(exc)
            log.warning("CPU attention kernels unavailable, using the torch path: %s", exc)
    return bool(_state["ok"])


def build_error() -> str | None:
    return _state.get("error")  # type: ignore[return-value]


def paged_decode(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
                 scale: float, window: int | None) -> torch.Tensor:
    """One query token per sequence (``q [S, Hq, D]``, the last of its context) attended over the
    block cache ``[2, num_blocks, block_size, Hkv, D]``; returns ``[S, Hq, D]``."""
    if not _state.get("ok") and not available():  # e.g. a spawned tensor-parallel rank loads it here
        raise RuntimeError(f"the CPU attention kernels are unavailable: {build_error()}")
    if q.stride(-1) != 1 or q.stride(1) != q.shape[2]:
        q = q.contiguous()
    return torch.ops.switchyard_cpu.paged_decode(q, kv_cache, _int32(block_tables), _int32(context_lens),
                                                 float(scale), int(window or 0))


def _int32(t: torch.Tensor) -> torch.Tensor:
    """As the kernel takes it (the engine's metadata already is: no op then)."""
    if t.dtype != torch.int32:
        t = t.int()
    return t if t.is_contiguous() else t.contiguous()
