"""Token estimates for providers that do not report usage (marked ``Meter.exact = False``).

A character heuristic (about four characters per token for English text, never less than one
token per word-ish piece) keeps the gateway free of per-provider tokenizers; it is used only for
metering when the upstream gives no usage. Quota reservations use ``bound_*`` instead: an upper
bound that no byte-level or byte-fallback tokenizer exceeds (one token per UTF-8 byte, plus what a
chat template adds), so Chinese text or emoji (three or four bytes a character) are never
reserved below their cost.
"""

from __future__ import annotations

import re

import msgspec

from backends.embeddings_wire import EmbeddingRequest
from backends.openai_wire import AssistantMessage, ChatCompletionRequest, ChatDelta, CompletionRequest
from backends.tools_wire import CustomCall, FunctionCall, ToolCall, ToolCallDelta

_PER_MESSAGE_OVERHEAD = 4  # role and separators, as chat templates add them
# Bounds: a chat template's tokens around one message (role, start and end markers, a name), and
# around the whole conversation (a default system prompt, the generation prompt).
BOUND_PER_MESSAGE = 16
BOUND_PER_CONVERSATION = 64
# ``str.split()``'s whitespace beyond ASCII, as UTF-8: U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028,
# U+2029, U+202F, U+205F, U+3000 (whole sequences, so a match is always at a character's start).
_UNICODE_SPACE = re.compile(rb"\xc2[\x85\xa0]|\xe1\x9a\x80|\xe2\x80[\x80-\x8a\xa8\xa9\xaf]|\xe2\x81\x9f|\xe3\x80\x80")
# Each byte as a space (ASCII whitespace, as str.split() has it) or a word byte (any other byte).
SPLIT_CHARS = 4096  # a shorter text is counted by splitting it
_WORD_OR_SPACE = bytes(32 if i < 128 and chr(i).isspace() else 120 for i in range(256))


def estimate_text(text: str) -> int:
    if not text:
        return 0
    return max(count_words(text), (len(text) + 3) // 4)


def count_words(text: str) -> int:
    """``len(text.split())`` without making the words (a 4 MB prompt made 1.5 million strings): its
    UTF-8 bytes become spaces and word bytes, and a word is where a word byte follows a space. A
    short text is split: cheaper there."""
    if len(text) < SPLIT_CHARS:
        return len(text.split())
    data = text.encode("utf-8", "surrogatepass")
    if not data.isascii():
        found = _UNICODE_SPACE.search(data)
        while found is not None:  # each pass replaces one kind of space throughout: at most 17
            data = data.replace(found.group(), b" ")
            found = _UNICODE_SPACE.search(data, found.start())
    marks = data.translate(_WORD_OR_SPACE)
    return marks.count(b" x") + marks.startswith(b"x")


def generated_text(message: AssistantMessage | ChatDelta) -> str:
    """The text a message (or a chunk's delta) generated: its content, reasoning, refusal, and its
    tool calls' names and arguments."""
    reasoning = message.reasoning_content or message.reasoning
    parts = [t for t in (message.content, reasoning, message.refusal) if isinstance(t, str)]
    for call in message.tool_calls or ():
        parts += (t for t in _call_parts(call) if isinstance(t, str))
    return " ".join(parts)


def _call_parts(call: ToolCall | ToolCallDelta) -> tuple[object, ...]:
    """A tool call's (or a call delta's) name and its arguments (a function's) or input (a custom tool's)."""
    for body in (call.function, call.custom):
        if isinstance(body, FunctionCall):
            return body.name, body.arguments
        if isinstance(body, CustomCall):
            return body.name, body.input
        if isinstance(body, dict):
            return body.get("name"), body.get("arguments"), body.get("input")
    return ()


def estimate_chat_prompt(request: ChatCompletionRequest) -> int:
    return sum(_PER_MESSAGE_OVERHEAD + estimate_text(m.text()) for m in request.messages)


def estimate_completion_prompt(request: CompletionRequest) -> int:
    try:
        prompts = request.prompts()
    except ValueError:
        return 0
    total = 0
    for prompt in prompts:
        total += estimate_text(prompt) if isinstance(prompt, str) else len(prompt)
    return total


def estimate_embedding_input(request: EmbeddingRequest) -> int:
    try:
        inputs = request.inputs()
    except ValueError:
        return 0
    return sum(estimate_text(i) if isinstance(i, str) else len(i) for i in inputs)


def bound_text(text: str) -> int:
    """At most one token per UTF-8 byte (a tokenizer's merges only lower it), plus a leading marker."""
    return len(text.encode("utf-8", "surrogatepass")) + 1 if text else 0


def bound_chat_prompt(request: ChatCompletionRequest) -> int:
    """An upper bound on the prompt tokens of a chat request: messages (text, names, tool calls) and
    tool definitions as the template renders them, counted by their bytes."""
    total = BOUND_PER_CONVERSATION
    for m in request.messages:
        total += BOUND_PER_MESSAGE + bound_text(m.text())
        if m.name:
            total += bound_text(str(m.name))
        if m.tool_calls:
            total += len(msgspec.json.encode(m.tool_calls))
    if request.tools:
        total += len(msgspec.json.encode(request.tools))
    return total


def bound_completion_prompt(request: CompletionRequest) -> int:
    try:
        prompts = request.prompts()
    except ValueError:
        return 0
    return sum(bound_text(p) + 1 if isinstance(p, str) else len(p) for p in prompts)


def bound_embedding_input(request: EmbeddingRequest) -> int:
    try:
        inputs = request.inputs()
    except ValueError:
        return 0
    return sum(bound_text(i) + 1 if isinstance(i, str) else len(i) for i in inputs)
