"""Tokenizer, chat templates, incremental detokenisation and stop strings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from engine.tiny_model import build_tiny_model
from engine.tokenizer import GIL_FREE_CHARS, ChatTemplateError, IncrementalDetokenizer, StopMatcher, Tokenizer

CONVERSATIONS = [
    [{"role": "user", "content": "Hello! How are you?"}],
    [
        {"role": "system", "content": "You are a helpful assistant.  "},
        {"role": "user", "content": "Tell me about the train 🚂 in 日本."},
        {"role": "assistant", "content": "It leaves at 18:50."},
        {"role": "user", "content": [{"type": "text", "text": "And "}, {"type": "text", "text": "then?"}]},
    ],
]

LLAMA31_LIKE = (
    "{{- bos_token }}{%- if not tools is defined %}{%- set tools = none %}{%- endif %}"
    "{%- if tools is not none %}TOOLS:{{ tools | tojson }}{%- endif %}"
    "{%- for m in messages %}{%- if loop.index0 > 5 %}{%- break %}{%- endif %}"
    "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{%- endif %}"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tok"), num_hidden_layers=1)


@pytest.fixture(scope="module")
def tok(model_dir: Path) -> Tokenizer:
    return Tokenizer(model_dir)


@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("gen_prompt", [True, False])
def test_chat_template_equals_transformers(model_dir: Path, tok: Tokenizer, conv: int, gen_prompt: bool) -> None:
    hf = AutoTokenizer.from_pretrained(str(model_dir))
    messages = CONVERSATIONS[conv]
    want = hf.apply_chat_template(messages, add_generation_prompt=gen_prompt, tokenize=True, return_dict=False)
    assert tok.apply_chat_template(messages, add_generation_prompt=gen_prompt) == list(want)
    assert tok.render_chat(messages, gen_prompt) == hf.apply_chat_template(
        messages, add_generation_prompt=gen_prompt, tokenize=False)


def test_template_from_chat_template_jinja_with_tools(model_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(model_dir, folder)
    (folder / "chat_template.jinja").write_text(LLAMA31_LIKE)
    hf = AutoTokenizer.from_pretrained(str(folder))
    ours = Tokenizer(folder)
    msgs = CONVERSATIONS[1]
    assert ours.render_chat(msgs) == hf.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    assert ours.render_chat(msgs, tools=tools) == hf.apply_chat_template(
        msgs, tools=tools, add_generation_prompt=True, tokenize=False)


def test_a_template_with_generation_blocks_renders_as_transformers(model_dir: Path, tmp_path: Path) -> None:
    """TRL's training templates wrap the assistant's text in ``{% generation %}`` (transformers' tag
    for assistant masks): rendered as its body, not a syntax error."""
    folder = tmp_path / "m"
    shutil.copytree(model_dir, folder)
    (folder / "chat_template.jinja").write_text(LLAMA31_LIKE.replace(
        "{{ m['content'] | trim }}",
        "{%- if m['role'] == 'assistant' %}{% generation %}{{ m['content'] | trim }}{% endgeneration %}"
        "{%- else %}{{ m['content'] | trim }}{%- endif %}"))
    hf = AutoTokenizer.from_pretrained(str(folder))
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": " Hello! "},
                                  {"role": "user", "content": "And then?"}]
    assert Tokenizer(folder).render_chat(msgs) == hf.apply_chat_template(msgs, add_generation_prompt=True,
                                                                         tokenize=False)


def test_named_templates_render_tool_use_when_tools_are_given_as_transformers(model_dir: Path,
                                                                            tmp_path: Path) -> None:
    """Hermes' and Command-R's tokenizer_config.json list a ``default`` and a ``tool_use`` template
    (transformers saves that as ``additional_chat_templates/``): a request with tools renders ``tool_use``."""
    folder = tmp_path / "m"
    shutil.copytree(model_dir, folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    tool_use = "TOOL USE {{ tools | tojson }}" + LLAMA31_LIKE
    cfg["chat_template"] = [{"name": "default", "template": LLAMA31_LIKE}, {"name": "tool_use", "template": tool_use}]
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    hf, ours = AutoTokenizer.from_pretrained(str(folder)), Tokenizer(folder)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "Hello!"}]
    tools: list[Any] = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]
    for given in (None, tools):
        assert ours.render_chat(msgs, tools=given) == hf.apply_chat_template(msgs, tools=given, tokenize=False,
                                                                             add_generation_prompt=True)
    assert ours.render_chat(msgs, tools=tools).startswith("TOOL USE") and ours.tool_chat_template == tool_use
    resaved = tmp_path / "resaved"
    hf.save_pretrained(str(resaved))
    assert Tokenizer(resaved).render_chat(msgs, tools=tools) == ours.render_chat(msgs, tools=tools)


def test_missing_template_and_template_errors(model_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(model_dir, folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg.pop("chat_template")
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        Tokenizer(folder).apply_chat_template([{"role": "user", "content": "hi"}])
    (folder / "chat_template.jinja").write_text("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        Tokenizer(folder).apply_chat_template([{"role": "user", "content": "hi"}])


def test_basics(tok: Tokenizer, model_dir: Path) -> None:
    hf = AutoTokenizer.from_pretrained(str(model_dir))
    text = "Hello world, ça va? 日本語 🚂"
    assert tok.encode(text) == hf.encode(text)
    assert tok.encode(text)[0] == tok.bos_token_id
    assert tok.decode(tok.encode(text)) == text
    assert tok.vocab_size == len(hf)
    assert tok.eos_token_ids == {tok.token_id("<|eot_id|>"), tok.token_id("<|end_of_text|>")}
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Tokenizer(model_dir / "nowhere")


def test_a_text_past_the_gil_free_length_encodes_as_transformers(tok: Tokenizer, model_dir: Path) -> None:
    """Past ``GIL_FREE_CHARS`` another call of ``tokenizers`` encodes (one that lets other threads
    run): the same ids, special tokens or not."""
    hf = AutoTokenizer.from_pretrained(str(model_dir))
    text = "Hello world, ça va? 日本語 🚂 " * (GIL_FREE_CHARS // 20)
    assert len(text) > GIL_FREE_CHARS
    assert tok.encode(text) == hf.encode(text)
    assert tok.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)


def test_incremental_detok_never_emits_broken_utf8(tok: Tokenizer) -> None:
    text = "Größe 日本語の電車 🚂🎉 naïve → done"
    ids = tok.encode(text, add_special_tokens=False)
    # the tiny tokenizer splits these characters' bytes over several tokens
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.push(i) for i in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text == detok.text
    assert "" in pieces  # some tokens were held back until their character was complete


def test_incremental_detok_after_prompt_and_special_tokens(tok: Tokenizer) -> None:
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    answer = tok.encode(" The train leaves at 8.", add_special_tokens=False)
    eot = tok.token_id("<|eot_id|>")
    detok = IncrementalDetokenizer(tok, prompt_ids=prompt)
    out = "".join(detok.push(i) for i in [*answer, eot])
    assert out == " The train leaves at 8."


def test_stop_matcher_across_token_boundaries() -> None:
    m = StopMatcher(["STOP", "\n\n"])
    emitted = []
    for piece in ["Hello S", "T", "ill going. S", "TO", "P and more"]:
        out, stopped = m.feed(piece)
        emitted.append(out)
        if stopped:
            break
    assert "".join(emitted) == "Hello STill going. "
    assert stopped and m.feed("more")[1] is True
    assert emitted[0] == "Hello "  # "S" held back: it could start "STOP"


def test_stop_matcher_earliest_stop_wins_and_flush() -> None:
    m = StopMatcher(["xyz", "yz!"])
    assert m.feed("ab xy") == ("ab ", False)
    assert m.feed("z!") == ("", True)  # "xyz" starts before "yz!"
    m = StopMatcher(["xyz", "b"])
    assert m.feed("aaxyzb") == ("aa", True)
    m = StopMatcher(["</end>"])
    assert m.feed("partial </e") == ("partial ", False)
    assert m.flush() == "</e"
    assert StopMatcher([]).feed("anything") == ("anything", False)


def test_folder_without_tokenizer_json_uses_transformers(tok: Tokenizer, tmp_path: Path) -> None:
    """A folder with only vocab.json + merges.txt (a slow GPT-2 style tokenizer) still works."""
    from tokenizers import Tokenizer as Fast

    from engine.tiny_model import CHAT_TEMPLATE, SPECIAL_TOKENS, TOKENIZER_JSON

    fast = Fast.from_file(str(TOKENIZER_JSON))
    fast.model.save(str(tmp_path))
    special = {str(fast.token_to_id(t)): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                                          "normalized": False, "single_word": False} for t in SPECIAL_TOKENS}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
        "add_bos_token": False, "chat_template": CHAT_TEMPLATE, "added_tokens_decoder": special}))
    slow = Tokenizer(tmp_path)
    text = "Hello world, ça va? 日本語 🚂"
    assert slow.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    assert slow.decode(slow.encode(text)) == text
    msgs = CONVERSATIONS[1]
    assert slow.apply_chat_template(msgs) == tok.apply_chat_template(msgs)
    assert slow.eos_token_ids == {tok.token_id("<|eot_id|>")}


def test_stop_matcher_without_matching_holds_back_but_never_stops() -> None:
    m = StopMatcher(["STOP"])
    assert m.feed("a STOP b ST", match=False) == ("a STOP b ", False)  # "ST" could begin one
    assert m.feed("OP c") == ("", True)  # a stop string ending in matched text: cut there


def test_stop_matcher_including_the_stop_string_holds_nothing_back() -> None:
    """vLLM's include_stop_str_in_output: cut right after the stop string, found also across
    pieces though nothing is held back; text after it in the same piece is dropped."""
    m = StopMatcher(["STOP", "\n\n"], include=True)
    assert m.feed("Hello S") == ("Hello S", False)
    assert m.feed("T") == ("T", False)
    assert m.feed("ill going. S") == ("ill going. S", False)
    assert m.feed("TO") == ("TO", False)
    assert m.feed("P and more") == ("P", True) and m.matched == "STOP"
    assert m.feed("more") == ("", True) and m.flush() == ""
    m = StopMatcher(["xyz", "yz!"], include=True)
    assert m.feed("ab xyz!") == ("ab xyz", True)  # the earliest stop string wins
    m = StopMatcher(["</end>"], include=True)
    assert m.feed("partial </e") == ("partial </e", False) and m.flush() == ""


def test_stop_matcher_including_the_stop_string_finds_it_fed_one_character_at_a_time() -> None:
    """A stop string longer than the text seen so far, fed a character per token (emoji, CJK):
    the kept tail grows to the stop string's length instead of shrinking to the newest character."""
    for stop in ("\U0001f31e\U0001f31e\U0001f31e\U0001f31e", "abcd"):
        m = StopMatcher([stop], include=True)
        out = [m.feed(ch) for ch in "x" + stop + "y"]
        assert "".join(text for text, _ in out) == "x" + stop and out[len(stop)] == (stop[-1], True)
        assert m.matched == stop


def test_stop_matcher_looks_only_where_a_stop_string_ends_in_new_text() -> None:
    """As vLLM (its search starts where a match would end in the new text): a stop string lying
    wholly in text fed before ``min_tokens`` ends nothing later."""
    for include in (False, True):
        m = StopMatcher(["ab", "ababc"], include=include)
        assert m.feed("xabab", match=False)[1] is False
        out, stopped = m.feed("c")
        assert stopped and m.matched == "ababc"


# Final assistant messages to continue: plain, with spaces the template trims, none at all, and text
# that also occurs in what the template closes the message with ("id" and ">" in "<|eot_id|>").
PREFILLS = ["Hello there ", "  spaced  ", "", "   ", "id", ">", "d\n", [{"type": "text", "text": "in <|eot"}]]


@pytest.mark.parametrize("final", PREFILLS)
@pytest.mark.parametrize("template", [None, LLAMA31_LIKE])
def test_continue_final_message_equals_transformers(model_dir: Path, tmp_path: Path, final: Any,
                                                    template: str | None) -> None:
    """The prompt ends right after the final message's text, as transformers cuts it (wherever
    else that text occurs in the prompt), and the tokens are the same."""
    folder = tmp_path / "m"
    shutil.copytree(model_dir, folder)
    if template is not None:
        (folder / "chat_template.jinja").write_text(template)
    hf, ours = AutoTokenizer.from_pretrained(str(folder)), Tokenizer(folder)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": final}]
    want = hf.apply_chat_template(messages, add_generation_prompt=False, continue_final_message=True, tokenize=False)
    assert ours.render_chat(messages, add_generation_prompt=False, continue_final_message=True) == want
    assert ours.apply_chat_template(messages, add_generation_prompt=False, continue_final_message=True) == \
        hf.encode(want, add_special_tokens=False)
    assert messages[-1]["content"] == final  # the caller's messages are left as they were


def test_continue_final_message_refuses_a_final_message_the_template_drops(model_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(model_dir, folder)
    (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m['role'] }}{% endfor %}")
    with pytest.raises(ChatTemplateError, match="continue_final_message"):
        Tokenizer(folder).render_chat([{"role": "assistant", "content": "Hi"}], add_generation_prompt=False,
                                      continue_final_message=True)
