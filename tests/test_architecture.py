"""The dependency rules of ../shared/DESIGN.md, checked on the source: no import circles among our
modules, and the one-way direction gateway -> backends -> engine.

Every import counts, at module level, under ``TYPE_CHECKING`` or inside a function; a package's
implicit import of its parents (``engine.models.llama`` runs ``engine/__init__``) does not.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "backends", "engine")
# What the engine may import besides itself and the standard library (DESIGN.md: "engine/ imports
# only torch, triton, transformers, safetensors, tokenizers"), plus the chat-template renderer, the
# offline progress bar, and GGUF reading (gguf hands tensors over as numpy arrays).
ENGINE_THIRD_PARTY = {"torch", "triton", "transformers", "safetensors", "tokenizers", "jinja2", "tqdm", "gguf", "numpy",
                      "llguidance"}  # grammar-constrained decoding (engine/structured_output)
ENGINE_USERS = ("backends.local", "backends.transformers_generate")  # the only backends that run the engine


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imported_names(path: Path) -> Iterator[str]:
    """Every absolute import of the file, as the dotted names it could refer to."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield from (f"{node.module}.{alias.name}" for alias in node.names)  # a submodule, or a name in one


def _owner(name: str) -> str | None:
    """The module of ours a dotted name lives in (its longest existing prefix), or None."""
    parts = name.split(".")
    while parts:
        if (candidate := ".".join(parts)) in MODULES:
            return candidate
        parts.pop()
    return None


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        targets = {owner for name in _imported_names(path) if (owner := _owner(name)) is not None}
        graph[module] = targets - {module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circles() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_dependencies_point_one_way() -> None:
    wrong = []
    for module, targets in _graph().items():
        layer = module.split(".")[0]
        for target in targets:
            if layer == "engine" and not target.startswith("engine"):
                wrong.append(f"{module} -> {target} (the engine imports nothing of ours above it)")
            if layer == "backends" and target.startswith("gateway"):
                wrong.append(f"{module} -> {target} (backends never import the gateway)")
            if layer == "backends" and target.startswith("engine") and not module.startswith(ENGINE_USERS):
                wrong.append(f"{module} -> {target} (only {', '.join(ENGINE_USERS)} run the engine)")
    assert wrong == []


def test_engine_imports_only_its_allowed_libraries() -> None:
    outside = set()
    for module, path in MODULES.items():
        if module.startswith("engine"):
            for name in _imported_names(path):
                top = name.split(".")[0]
                if top not in PACKAGES and top not in sys.stdlib_module_names and top not in ENGINE_THIRD_PARTY:
                    outside.add(f"{module}: {top}")
    assert outside == set()
