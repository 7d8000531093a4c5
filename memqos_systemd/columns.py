"""Text in columns for people, measured as a terminal draws it. Pure.

A pod's or container's name may hold characters a terminal draws two columns wide (CJK,
fullwidth forms: `unicodedata.east_asian_width` W or F) or none at all (combining marks,
zero-width format characters). `len()` counts each as one, and the columns of `plan`'s and
`status`'s tables drifted out of line (issue 26). Names reach here made printable by
`pods.one_line`.
"""

from __future__ import annotations

import functools
import unicodedata

__all__ = ["width", "ljust", "rjust", "fit", "NAME_LIMIT"]

# The characters of a name (pods.one_line) a table for people keeps; a wide table keeps them all.
# A pod's namespace/name is at most 317.
NAME_LIMIT = 160


@functools.lru_cache(maxsize=4096)
def _char_width(ch: str) -> int:
    if unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def width(text: str) -> int:
    """The columns `text` takes on a terminal."""
    if text.isascii():
        return len(text)
    return sum(_char_width(ch) for ch in text)


def ljust(text: str, columns: int) -> str:
    return text + " " * max(0, columns - width(text))


def rjust(text: str, columns: int) -> str:
    return " " * max(0, columns - width(text)) + text


def fit(text: str, columns: int) -> str:
    """`text` cut to at most `columns` columns, ending in "…" when cut (never a wide character
    split in half)."""
    if width(text) <= columns:
        return text
    out, used = [], 0
    for ch in text:
        w = _char_width(ch)
        if used + w > columns - 1:
            break
        out.append(ch)
        used += w
    return "".join(out) + "…"
