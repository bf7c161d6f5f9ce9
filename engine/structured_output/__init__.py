"""Constrained decoding with llguidance: grammars compiled once per spec (cached), one matcher per
sequence advanced on each accepted token, and a batch token bitmask filled each step for the
sampler (``engine.sampler`` applies it before sampling).

Preemption by recompute keeps a sequence's output tokens (they are re-fed as prompt), so the
matcher, which has consumed exactly those tokens, stays valid; chunked prefill and prefix caching
never sample, so they never touch it. A request with ``n > 1`` gives each sequence its own matcher.
A matcher that errs while generating (a grammar past the parser's limits) fails its request
(``LLMEngine``): it never reads as a complete answer.
"""

from __future__ import annotations

import json
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import llguidance
import torch
from llguidance.gbnf_to_lark import gbnf_to_lark

from engine.errors import InvalidRequest
from engine.structured_output.schema_cycles import find_cycle

Kind = Literal["json", "json_object", "regex", "choice", "grammar"]


@dataclass(frozen=True)
class StructuredOutput:
    """What the output must match. ``spec`` is the JSON schema (text) for ``json``, the regex for
    ``regex``, a JSON list of strings for ``choice``, a Lark (or GBNF) grammar for ``grammar``;
    unused for ``json_object`` (any JSON object). ``param`` names the wire field for errors."""

    kind: Kind
    spec: str = ""
    param: str = "response_format"


_JSON_OPTIONS = {"whitespace_flexible": False}


_REGEX_META = frozenset("\\.+*?()|[]{}^$#&-~")  # what regex_syntax::escape escapes


def _regex_literal(text: str) -> str:
    """A regex matching exactly ``text``."""
    return "".join("\\" + c if c in _REGEX_META else c for c in text)


@lru_cache(maxsize=512)
def _grammar_text(kind: Kind, spec: str) -> str:
    """The llguidance grammar for a spec (cached by the spec); ValueError when it is not valid."""
    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=_JSON_OPTIONS)  # type: ignore[arg-type]
    if kind == "json":
        try:
            schema = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise ValueError(f"the JSON schema is not valid JSON: {exc}") from None
        if not isinstance(schema, (dict, bool)):
            raise ValueError("the JSON schema must be an object")
        if schema is False:
            raise ValueError("the JSON schema false matches no value")
        if schema is True:  # any JSON value; llguidance takes only an object
            spec = "{}"
        # llguidance's own options in the schema override ours (free whitespace, "=" after keys)
        if isinstance(schema, dict) and "x-guidance" in schema:
            raise ValueError("x-guidance (the grammar engine's own options) is not taken: the answer must stay JSON")
        loop = find_cycle(schema)
        if loop is not None:
            raise ValueError(f"the JSON schema refers to itself with nothing in between ({loop} comes back to "
                             "where it started without a value), so no value can match it")
        return llguidance.LLMatcher.grammar_from_json_schema(spec, defaults=_JSON_OPTIONS)  # type: ignore[arg-type]
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec)
    if kind == "choice":
        choices = json.loads(spec)
        if not choices or not all(isinstance(c, str) for c in choices):
            raise ValueError("choice must be a non-empty list of strings")
        # One regex, which the lexer matches whole: as a Lark alternation of literals each choice
        # would be a parser item, and a parser row holds at most 2000 (the matcher then errs mid-answer).
        return llguidance.LLMatcher.grammar_from_regex("|".join(_regex_literal(c) for c in choices))
    if kind == "grammar":
        try:
            lark = spec if "::=" not in spec else gbnf_to_lark(spec)
        except Exception as exc:  # the converter (pure text parsing) raises GbnfToLarkError, a bare
            # Exception ("Rule 'x' not found") or IndexError on the client's malformed GBNF
            raise ValueError(f"the GBNF grammar cannot be read: {exc}") from None
        return llguidance.LLMatcher.grammar_from_lark(lark)
    raise ValueError(f"unknown structured output kind {kind!r}")


class StructuredOutputManager:
    """Compiles and caches grammars for one tokenizer; makes matchers; fills the batch bitmask."""

    def __init__(self, tokenizer_path: str | Path, vocab_size: int, eos_token_ids: list[int]) -> None:
        path = Path(tokenizer_path) / "tokenizer.json"
        self.vocab_size = vocab_size
        self.tokenizer = llguidance.LLTokenizer(str(path), n_vocab=vocab_size, eos_token=sorted(eos_token_ids))
        self._validated: dict[tuple[str, str], str] = {}
        self.compile_count = 0  # grammars compiled (cache misses)

    def compile(self, so: StructuredOutput) -> str:
        """The validated grammar for ``so``; InvalidRequest naming ``so.param`` when it cannot be built."""
        key = (so.kind, so.spec)
        grammar = self._validated.get(key)
        if grammar is not None:
            return grammar
        try:
            grammar = _grammar_text(so.kind, so.spec)
        except (ValueError, TypeError) as exc:
            raise InvalidRequest(f"{so.param}: {exc}", param=so.param) from None
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        if is_error:
            raise InvalidRequest(f"{so.param}: the grammar engine cannot compile it: {messages[0]}",
                                 param=so.param)
        self.compile_count += 1
        if len(self._validated) >= 512:
            self._validated.pop(next(iter(self._validated)))
        self._validated[key] = grammar
        return grammar

    def matcher(self, so: StructuredOutput) -> llguidance.LLMatcher:
        matcher = llguidance.LLMatcher(self.tokenizer, self.compile(so), log_level=0)
        if matcher.is_error():
            raise InvalidRequest(f"{so.param}: {matcher.get_error()}", param=so.param)
        return matcher


_EXECUTOR: llguidance.LLExecutor | None = None
_BIAS: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}  # byte value -> 0 / -inf per bit


def fill_bitmask(matchers: list[llguidance.LLMatcher | None], words: int,
                 parallel: bool = False) -> torch.Tensor | None:
    """An int32 ``(len(matchers), words)`` bitmask: all ones for a free row (``None``), the
    matcher's allowed tokens otherwise; None when no row is constrained. ``parallel``: the rows
    are filled by llguidance's executor in one call (its own threads, without the GIL)."""
    global _EXECUTOR
    constrained = [(m, i) for i, m in enumerate(matchers) if m is not None]
    if not constrained:
        return None
    mask = torch.full((len(matchers), words), -1, dtype=torch.int32)
    if not parallel:
        for m, i in constrained:
            _fill_row(m, mask[i])
        return mask
    import llguidance.torch  # only here: it compiles a kernel at import (torch._dynamo, ~200 MB of RSS)

    if _EXECUTOR is None:
        _EXECUTOR = llguidance.LLExecutor()
    llguidance.torch.fill_next_token_bitmask_par(_EXECUTOR, constrained, mask)
    return mask


def _fill_row(matcher: llguidance.LLMatcher, row: torch.Tensor) -> None:
    """``llguidance.torch.fill_next_token_bitmask`` without importing that module (it compiles a
    kernel with ``torch.compile`` at import, pulling in torch._dynamo: about 200 MB of RSS)."""
    matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())


class PendingBitmask:
    """The step's bitmask. With ``overlap`` (the forward runs on an accelerator, the host waits)
    it is filled by llguidance's executor in a helper thread while the forward pass runs (the
    matchers only change when a sampled token is consumed, after this step). On the CPU the
    forward needs the cores itself and a hand-over costs more than it saves (measured with
    bench/structured_output.py): it is filled in ``result``."""

    _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-bitmask")

    def __init__(self, matchers: list[llguidance.LLMatcher | None], words: int, overlap: bool) -> None:
        self._matchers, self._words = matchers, words
        self._future: Future[torch.Tensor | None] | None = None
        if overlap and any(m is not None for m in matchers):
            self._future = self._pool.submit(fill_bitmask, matchers, words, True)

    def result(self) -> torch.Tensor | None:
        if self._future is not None:
            return self._future.result()
        return fill_bitmask(self._matchers, self._words)


def _bias(packed: torch.Tensor, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """``(rows, vocab)``: 0 where the packed int32 bitmask allows the token, -inf where it forbids
    it. Each byte is looked up in a 256 x 8 table (little-endian: byte ``b`` of word ``w`` holds
    tokens ``32w + 8b .. 32w + 8b + 7``); tokens beyond the mask are forbidden."""
    key = (packed.device, dtype)
    table = _BIAS.get(key)
    if table is None:
        bits = (torch.arange(256, device=packed.device)[:, None] >> torch.arange(8, device=packed.device)) & 1
        table = torch.zeros(256, 8, dtype=dtype, device=packed.device).masked_fill_(bits == 0, float("-inf"))
        _BIAS[key] = table
    flat = packed.contiguous().view(torch.uint8).reshape(-1).long()
    bias = table.index_select(0, flat).reshape(packed.shape[0], -1)
    if bias.shape[1] < vocab:
        bias = torch.nn.functional.pad(bias, (0, vocab - bias.shape[1]), value=float("-inf"))
    return bias[:, :vocab]


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """``logits``, changed in place: the tokens the bitmask forbids set to -inf. Free rows (all
    ones) are left alone; the constrained rows get an additive 0 / -inf bias (one table lookup and
    one add: far cheaper on the CPU than unpacking bits and a masked fill)."""
    constrained = (bitmask != -1).any(dim=1)
    if not bool(constrained.any()):
        return logits
    vocab = logits.shape[-1]
    if bool(constrained.all()):
        return logits.add_(_bias(bitmask.to(logits.device, non_blocking=True), vocab, logits.dtype))
    rows = constrained.nonzero().squeeze(1)
    bias = _bias(bitmask[rows].to(logits.device, non_blocking=True), vocab, logits.dtype)
    return logits.index_add_(0, rows.to(logits.device), bias)


def words_for(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


__all__ = ["PendingBitmask", "StructuredOutput", "StructuredOutputManager", "apply_bitmask", "fill_bitmask",
           "words_for"]
