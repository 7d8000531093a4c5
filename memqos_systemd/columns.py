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

__all__ = ["width", "ljust", "rjust", "fit", "wrap", "as_printed", "ellipsis", "NAME_LIMIT"]

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


def fit(text: str, columns: int, mark: str = "…", *, middle: bool = False) -> str:
    """`text` cut to at most `columns` columns, ending in `mark` when cut (never a wide character
    split in half); `middle`: the mark in the middle, the text's head and tail kept (a pod's
    namespace and the end of its name, where a ReplicaSet's hash tells pods apart)."""
    if width(text) <= columns:
        return text
    if middle:
        room = columns - width(mark)
        head = fit(text, room // 2 + width(mark), mark)[: -len(mark)]
        tail = fit(text[::-1], room - width(head) + width(mark), mark)[: -len(mark)][::-1]
        return head + mark + tail
    out, used = [], 0
    for ch in text:
        w = _char_width(ch)
        if used + w > columns - width(mark):
            break
        out.append(ch)
        used += w
    return "".join(out) + mark


def as_printed(text: str, encoding: str | None) -> str:
    """`text` as a stream of `encoding` that escapes what it cannot hold (cli._tolerant) prints
    it: under LANG=C or a Latin-1 locale a CJK name takes the columns of its escapes, and a
    table measured on the name itself drifts out of line."""
    if not encoding or text.isascii():
        return text
    return text.encode(encoding, "backslashreplace").decode(encoding)


def ellipsis(encoding: str | None) -> str:
    """The mark of a cut name: "…" where the output can print it, else "..."."""
    return "…" if as_printed("…", encoding) == "…" else "..."


def wrap(text: str, columns: int, indent: str = "") -> list[str]:
    """`text` in lines of at most `columns` columns, broken at spaces, every line after the first
    starting with `indent` (the first keeps the blanks `text` starts with). A word longer than a
    line (a URL, a path) is never split: it takes a line of its own, however long."""
    lines: list[str] = []
    body = text.lstrip(" ")
    lead = text[:len(text) - len(body)]
    line, used = "", width(lead)
    for word in body.split(" "):
        w = width(word)
        if line and used + 1 + w > columns:
            lines.append(line)
            line, used = indent + word, width(indent) + w
        elif line:
            line, used = f"{line} {word}", used + 1 + w
        else:
            line, used = word, used + w
    lines.append(line)
    lines[0] = lead + lines[0]
    return lines
