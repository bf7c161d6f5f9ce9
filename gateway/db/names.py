"""When two tenant names are the same name: what an operator reads in the dashboard, the CLI and the
logs cannot tell "Acme" from "acme ", "Ａｃｍｅ" or "Ac\u200bme", so those are one name.

``name_key`` is that identity (stored in ``tenants.name_key``, unique); ``hidden_character`` finds
what a new name may not hold. Both read the name in Unicode NFKC.
"""

from __future__ import annotations

import unicodedata

# Default_Ignorable_Code_Point characters (Unicode's DerivedCoreProperties) that str.isprintable()
# takes for visible: combining grapheme joiner, Hangul and Khmer fillers, Mongolian and other
# variation selectors. The rest of that property is in category Cf or unassigned.
_IGNORABLE = frozenset(
    [0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x180B, 0x180C, 0x180D, 0x180F, 0x3164, 0xFFA0]
    + list(range(0xFE00, 0xFE10)) + list(range(0xE0100, 0xE01F0))
)


def invisible(ch: str) -> bool:
    """Whether ``ch`` prints nothing a reader can see (control, format, separator other than the
    space, unassigned, private use, or default-ignorable)."""
    return not (ch.isprintable() or ch == " ") or ord(ch) in _IGNORABLE


def hidden_character(name: str) -> str | None:
    """The first invisible character of ``name``, or None."""
    return next((ch for ch in name if invisible(ch)), None)


def name_key(name: str) -> str:
    """What makes two names one: NFKC, case folded (then NFKC again, as Unicode's caseless match
    asks), invisible characters other than blanks dropped, blanks collapsed to one space."""
    nfkc = unicodedata.normalize("NFKC", name)
    shown = "".join(ch for ch in nfkc if ch.isspace() or not invisible(ch))
    return " ".join(unicodedata.normalize("NFKC", shown.casefold()).split())


def shown(name: str) -> str:
    """``name`` with its invisible characters written as escapes (a name stored before they were refused)."""
    return "".join(ch.encode("unicode_escape").decode("ascii") if invisible(ch) else ch for ch in name)
