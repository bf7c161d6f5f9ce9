"""Tokenizer of a local Hugging Face model folder, with chat templates rendered as transformers does.

Encoding/decoding goes through ``tokenizers`` (``tokenizer.json``), or transformers'
``AutoTokenizer`` for folders without one; the chat template comes from
``chat_template.jinja`` or ``tokenizer_config.json`` and is rendered in a sandboxed Jinja
environment configured like transformers' ``apply_chat_template`` (trim/lstrip blocks, loop
controls, ``{% generation %}`` blocks, ``raise_exception``, ``tojson``, ``strftime_now``, the
special tokens as variables), then tokenised without adding special tokens. Incremental
detokenisation and stop strings live in ``engine.detok`` and are re-exported here.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from engine.detok import IncrementalDetokenizer, StopMatcher
from engine.errors import ChatTemplateError

__all__ = ["ChatTemplateError", "IncrementalDetokenizer", "StopMatcher", "Tokenizer"]

# A text longer than this is encoded with ``encode_batch``, which lets go of the GIL while it works:
# ``encode`` holds it throughout (about a second a megabyte), so an event loop on another thread
# waited for a huge prompt's tokens; a shorter text keeps ``encode``, the cheaper call.
GIL_FREE_CHARS = 16 * 1024
_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


class _GenerationBlocks(jinja2.ext.Extension):
    """transformers' ``{% generation %}...{% endgeneration %}`` (its ``AssistantTracker``): the block
    marks the assistant's text for training masks (TRL's templates have it) and renders as its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: Any) -> str:
        return str(caller())


def compile_chat_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, _GenerationBlocks])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


class _FastCodec:
    """``tokenizers`` over tokenizer.json (the usual case)."""

    def __init__(self, path: Path) -> None:
        self._tok = HFTokenizer.from_file(str(path / "tokenizer.json"))

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if len(text) > GIL_FREE_CHARS:
            return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=skip_special_tokens))

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def piece(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)


class _TransformersCodec:
    """transformers' AutoTokenizer, for folders with only a slow tokenizer (e.g. tokenizer.model)."""

    def __init__(self, path: Path) -> None:
        from transformers import AutoTokenizer

        try:
            self._tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise FileNotFoundError(f"{str(path)!r} has no usable tokenizer: {exc}") from None
        self._vocab = self._tok.get_vocab()

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=skip_special_tokens))

    def token_id(self, token: str) -> int | None:
        return self._vocab.get(token)

    def piece(self, token_id: int) -> str | None:
        piece = self._tok.convert_ids_to_tokens(token_id)
        return piece if isinstance(piece, str) else None

    def size(self) -> int:
        return len(self._tok)


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: the printable character standing for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_LEVEL = _byte_level_alphabet()
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def piece_bytes(piece: str) -> bytes | None:
    """The bytes a vocabulary piece stands for: a byte-level BPE one (``Ġhe``) or a ``<0xXX>`` byte
    fallback; None for another kind of piece."""
    if match := _BYTE_FALLBACK.fullmatch(piece):
        return bytes([int(match.group(1), 16)])
    if all(c in _BYTE_LEVEL for c in piece):
        return bytes(_BYTE_LEVEL[c] for c in piece)
    return None


class Tokenizer:
    """``encode``, ``decode``, ``apply_chat_template``, ``eos_token_ids``, ``vocab_size``."""

    def __init__(self, model_path: str | Path) -> None:
        path = Path(model_path)
        if not path.is_dir():
            raise FileNotFoundError(f"tokenizer folder {str(path)!r} does not exist")
        self.path = path
        self._codec = _FastCodec(path) if (path / "tokenizer.json").is_file() else _TransformersCodec(path)
        self.config = _read_json(path / "tokenizer_config.json")
        self.special_tokens = {k: t for k in _SPECIAL_KEYS if (t := _token_text(self.config.get(k))) is not None}
        self.chat_templates = self._find_chat_templates()
        self.chat_template = self.chat_templates.get("default")
        self._compiled: dict[str, jinja2.Template] = {}

    def _find_chat_templates(self) -> dict[str, str]:
        """The chat templates by name, as transformers reads them: ``default``, and the named ones of
        a list in tokenizer_config.json or of ``additional_chat_templates/*.jinja`` (``tool_use``,
        ``rag``, ...)."""
        extra = self.path / "additional_chat_templates"
        templates = {f.stem: f.read_text(encoding="utf-8") for f in sorted(extra.glob("*.jinja"))}
        jinja_file = self.path / "chat_template.jinja"
        template = jinja_file.read_text(encoding="utf-8") if jinja_file.is_file() else (
            self.config.get("chat_template") or _read_json(self.path / "chat_template.json").get("chat_template"))
        if isinstance(template, list):
            templates.update({t["name"]: t["template"] for t in template})
        elif template:
            templates["default"] = template
        return templates

    @property
    def tool_chat_template(self) -> str | None:
        """The template a request with tools renders: ``tool_use`` where there is one, as transformers picks."""
        return self.chat_templates.get("tool_use", self.chat_template)

    # ------------------------------------------------------------ basics

    @property
    def vocab_size(self) -> int:
        return self._codec.size()

    def token_id(self, token: str) -> int | None:
        return self._codec.token_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._codec.encode(text, add_special_tokens)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._codec.decode(ids, skip_special_tokens)

    def piece(self, token_id: int) -> str:
        """The token's vocabulary entry (``Ġhe``, ``<0xE7>``), as transformers' ``convert_ids_to_tokens``."""
        return self._codec.piece(token_id) or ""

    def token_bytes(self, token_id: int) -> bytes:
        """The token's own bytes: its text's UTF-8, or, for a token holding part of a character (its
        text decodes to U+FFFD), the bytes of its piece (byte-level BPE, or ``<0xXX>`` byte fallback)."""
        text = self._codec.decode([token_id], False)
        if "\ufffd" not in text:
            return text.encode()
        piece = self._codec.piece(token_id)
        data = piece_bytes(piece) if piece is not None else None
        return data if data is not None else text.encode()

    @property
    def bos_token_id(self) -> int | None:
        bos = self.special_tokens.get("bos_token")
        return self.token_id(bos) if bos else None

    @cached_property
    def eos_token_ids(self) -> set[int]:
        """EOS ids from the tokenizer config, generation_config.json and config.json together."""
        ids: set[int] = set()
        eos = self.special_tokens.get("eos_token")
        if eos is not None and (tid := self.token_id(eos)) is not None:
            ids.add(tid)
        for name in ("generation_config.json", "config.json"):
            value = _read_json(self.path / name).get("eos_token_id")
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list):
                ids.update(v for v in value if isinstance(v, int))
        return ids

    # ------------------------------------------------------------ chat

    def _template(self, with_tools: bool) -> jinja2.Template:
        name = "tool_use" if with_tools and "tool_use" in self.chat_templates else "default"
        if name not in self._compiled:
            if name not in self.chat_templates:
                raise ChatTemplateError(f"the model at {str(self.path)!r} has no chat template")
            self._compiled[name] = compile_chat_template(self.chat_templates[name])
        return self._compiled[name]

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    continue_final_message: bool = False, **kwargs: Any) -> str:
        """The chat template's text for ``messages`` (extra kwargs reach the template, e.g. tools);
        ``continue_final_message``: cut after the final message's text (``continued``). A value the
        template cannot work with (a number where it iterates) is a ChatTemplateError with no param:
        the caller knows whether its variables or its messages brought it."""
        final = None
        if continue_final_message:
            messages, final = _tagged(messages)
        try:
            variables = {"tools": None, "documents": None, **self.special_tokens, **kwargs}
            template = self._template(with_tools=kwargs.get("tools") is not None)
            text = template.render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(f"chat template error: {e}") from e
        except (TypeError, ValueError, ArithmeticError, LookupError) as e:  # a variable the template cannot use
            raise ChatTemplateError(f"chat template error: {e}", param=None) from e
        return continued(text, final) if final is not None else text

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            continue_final_message: bool = False, *, add_special_tokens: bool = False,
                            **kwargs: Any) -> list[int]:
        """The template's text as token ids; ``add_special_tokens`` adds the tokenizer's own (a BOS)
        to what the template wrote, as vLLM's /tokenize does when asked."""
        text = self.render_chat(messages, add_generation_prompt, continue_final_message, **kwargs)
        return self.encode(text, add_special_tokens=add_special_tokens)


_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "  # transformers' marker, so the cut is made where it makes it


def _tagged(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """A copy of ``messages`` whose final message's text (its last text part) ends in the marker that
    ``continued`` cuts at, and that text."""
    final = dict(messages[-1])
    content = final.get("content")
    if isinstance(content, str):
        final["content"] = content + _CONTINUE_TAG
        return [*messages[:-1], final], content
    parts = content if isinstance(content, list) else []
    for at in reversed(range(len(parts))):
        if isinstance(parts[at], dict) and "text" in parts[at]:
            text = str(parts[at]["text"])
            final["content"] = [*parts[:at], {**parts[at], "text": text + _CONTINUE_TAG}, *parts[at + 1:]]
            return [*messages[:-1], final], text
    raise ChatTemplateError("continue_final_message: the final message has no text to continue")


def continued(rendered: str, final: str) -> str:
    """``rendered`` (made with ``_tagged`` messages) cut right before the marker, as transformers'
    ``continue_final_message`` does: what the template closes the final message with (an end-of-turn
    token) is dropped, so the model goes on writing it; where the template trimmed the marker's space,
    the message's trailing whitespace goes too."""
    at = rendered.rfind(_CONTINUE_TAG.strip())
    if at < 0 or final.strip() not in rendered:
        raise ChatTemplateError("continue_final_message: the final message's text is not in the prompt the chat "
                                "template made of the conversation")
    return rendered[:at] if rendered.startswith(_CONTINUE_TAG, at) else rendered[:at].rstrip()
