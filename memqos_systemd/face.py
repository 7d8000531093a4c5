"""The face's common parts: how a size and a count read in a line for people, and a table of
columns that fits WIDTH (status and what each feature says there, status_view.py)."""

from __future__ import annotations

from . import columns
from .plan import INFINITY
from .quantity import format_bytes

__all__ = ["WIDTH", "human", "show_bytes", "count", "table"]

WIDTH = 100  # a status line for people fits this many columns


def human(n: int | None) -> str:
    return "-" if n is None else "inf" if n == INFINITY else "0" if n == 0 else format_bytes(n)


def table(rows: list[list[str]], *, words_last: bool = False, wide: bool = False,
          ellipsis: str = "…") -> tuple[list[str], bool]:
    """A drift mark (one character), then columns two spaces apart: the first two (a name, a kind)
    left-aligned and the numbers right-aligned (a last column of words left-aligned too); the name
    is cut so that every line fits WIDTH, unless `wide`. Columns are measured as a terminal draws
    them (columns.py). Returns the lines, and whether a name was cut."""
    widths = [max(columns.width(r[i]) for r in rows) for i in range(1, len(rows[0]))]
    rest = sum(widths[1:]) + 2 * (len(widths) - 1) + 2
    longest = widths[0]
    if not wide:
        widths[0] = max(12, min(widths[0], WIDTH - rest))
    out = []
    for mark, *cells in rows:
        parts = [columns.ljust(columns.fit(c, w, ellipsis), w) if i < 2 or (words_last and i == len(cells) - 1)
                 else columns.rjust(c, w) for i, (c, w) in enumerate(zip(cells, widths))]
        out.append(f"{mark} " + "  ".join(parts).rstrip())
    return out, widths[0] < longest


def show_bytes(n: int) -> str:
    """A planned size as `plan` shows it (infinity spelled out)."""
    return "infinity" if n == INFINITY else ("0" if n == 0 else format_bytes(n))


def count(n: int | None) -> str:
    return "-" if n is None else str(n)
