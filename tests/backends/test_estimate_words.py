"""``estimate_text`` counts words without building them (a 4 MB prompt made 1.5 million strings on
the event loop), with exactly ``str.split()``'s count: every character it treats as whitespace,
ASCII or not, at either end, in runs, and beside surrogates and other non-ASCII text."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.estimate import SPLIT_CHARS, count_words, estimate_text

WHITESPACE = [c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace()]  # str.split()'s separators
# Characters next to whitespace in UTF-8 (a shared lead byte), or whitespace elsewhere (str.isspace is not it)
NEAR = ["\u200b", "\u2027", "\u202e", "\u2060", "\u3001", "\u1681", "\xa1", "\x84", "\x1b", "\ud800", "é", "中", "😀"]


def same_as_split(text: str) -> bool:
    """Counted as split, short and (padded with trailing blanks, which add no word) long."""
    estimate = max(len(text.split()), (len(text) + 3) // 4) if text else 0
    long = text + " " * SPLIT_CHARS  # past SPLIT_CHARS: counted on the bytes
    return (count_words(text) == count_words(long) == len(text.split())) and estimate_text(text) == estimate


@pytest.mark.parametrize("space", WHITESPACE, ids=lambda c: f"U+{ord(c):04X}")
def test_each_whitespace_separates_words_as_split_does(space: str) -> None:
    for text in (f"a{space}b", f"{space}a{space}{space}b{space}", space * 9, f"é{space}中{space}x" * 5,
                 f"\ud800{space}a{space}" * 3,
                 f"internationalization{space}localization"):
        assert same_as_split(text), repr(text)


@given(st.lists(st.sampled_from(WHITESPACE + NEAR + ["a", "b"]), max_size=60).map("".join))
def test_any_text_counts_as_split_does(text: str) -> None:
    assert same_as_split(text)


@given(st.text(max_size=200))
def test_arbitrary_text_counts_as_split_does(text: str) -> None:
    assert same_as_split(text)


def test_words_dominate_only_for_short_words() -> None:
    assert estimate_text("a b c d e f g h") == 8  # 15 characters: 4 by the character rule
    assert estimate_text("internationalization") == 5
    assert estimate_text("") == 0
