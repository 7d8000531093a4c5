"""Kubernetes resource quantities -> exact numbers.

The grammar is the API machinery's (`resource.Quantity`):

    <quantity> ::= <sign>? <number> <suffix>
    <number>   ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
    <suffix>   ::= Ki | Mi | Gi | Ti | Pi | Ei | m | "" | k | M | G | T | P | E | (e|E)<sign>?<digits>

Values are kept as `fractions.Fraction` so `1.5Gi` and `500m` are exact;
`to_bytes` rounds fractional bytes up, as the API server does for memory.
"""

from __future__ import annotations

import functools
import math
import re
from fractions import Fraction

__all__ = ["QuantityError", "parse_quantity", "to_bytes", "parse_bytes", "format_bytes", "MAX_BYTES", "UINT64_MAX",
           "show_value", "NOT_A_QUANTITY", "NEGATIVE", "TOO_LARGE", "FRACTION", "parse_whole_bytes"]

# The largest memory property systemd takes (D-Bus type `t`): its `infinity`, the kernel's "max".
UINT64_MAX = 2**64 - 1
# Memory values end up as systemd `t` (uint64) properties; anything past int64 is
# not a memory size any real node has, and Kubernetes itself caps quantities there.
MAX_BYTES = 2**63 - 1

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"m": Fraction(1, 1000), "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
            "P": 10**15, "E": 10**18}
_RE = re.compile(
    r"(?P<sign>[+-]?)(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?)"
)
# Bounds that keep a hostile quantity from costing real time (10**10**6 is a
# valid-looking exponent); far beyond anything a node can hold.
_MAX_DIGITS = 40
_MAX_EXPONENT = 30


class QuantityError(ValueError):
    """A value refused as a quantity (the message says why). `problem` is the words that follow
    the value in a message: NOT_A_QUANTITY, or what is wrong with a quantity that parses (negative,
    too large), which a caller must not call "not a quantity"."""

    def __init__(self, message: str, problem: str | None = None):
        super().__init__(message)
        self.problem = problem or NOT_A_QUANTITY


NOT_A_QUANTITY = "is not a quantity"
NEGATIVE = "is negative"
# 8Ei itself (2**63) is one byte too many: the largest is 8Ei - 1.
TOO_LARGE = "is larger than the largest memory quantity, 9223372036854775807 bytes (8Ei - 1)"
FRACTION = "is not a whole number of bytes"


def shown(value: object, limit: int = 60) -> str:
    """`value` as a message names it: its repr, cut to `limit` characters (a hostile one can be
    100,000 digits long; the message stays one readable line)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def parse_quantity(value: object) -> Fraction:
    """Parse a quantity given as a string, or as an int/float read from YAML/JSON."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise QuantityError(f"{shown(value)} is not a quantity")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"{shown(value)} is not a quantity")
        return Fraction(repr(value))  # the decimal the YAML/JSON said, not the binary float
    return _parse_text(value)


@functools.lru_cache(maxsize=4096)
def _parse_text(value: str) -> Fraction:
    # Cached: a node's pods repeat the same few dozen quantities ("100m", "512Mi") thousands of times.
    # No space around it: resource.ParseQuantity refuses "1Gi\t" and " 1Gi" (issue 33).
    text = value
    m = _RE.fullmatch(text)
    if not m:
        raise QuantityError(f"{shown(value)} is not a quantity (examples: 128974848, 129e6, 129M, 123Mi, 1.5Gi)")
    num = m.group("num")
    if len(num.replace(".", "")) > _MAX_DIGITS:
        # Refused before any arithmetic. A whole part that long is more than any node has.
        nonzero = bool(num.strip("0."))
        shrinks = (m.group("exp") or "e")[1:].startswith("-")  # a negative exponent: not known to be large
        raise QuantityError(f"{shown(value)} has too many digits",
                            NEGATIVE if nonzero and m.group("sign") == "-" else
                            TOO_LARGE if len(num.split(".")[0].lstrip("0")) > 19 and not shrinks else
                            "has too many digits")
    result = Fraction(num if not num.endswith(".") else num[:-1])
    if m.group("exp"):
        exp = int(m.group("exp")[1:])
        if abs(exp) > _MAX_EXPONENT:
            nonzero = bool(num.strip("0."))
            raise QuantityError(f"{shown(value)} has an exponent out of range",
                                NEGATIVE if nonzero and m.group("sign") == "-" else
                                TOO_LARGE if nonzero and exp > 0 else "has an exponent out of range (at most 30)")
        result *= Fraction(10) ** exp
    else:
        suffix = m.group("suffix") or ""
        result *= _BINARY.get(suffix) or _DECIMAL[suffix]
    return -result if m.group("sign") == "-" else result


def page_up(n: int, page_size: int) -> int:
    """`n` rounded up to a whole page."""
    return -(-n // page_size) * page_size


def as_stored(value: int, page_size: int) -> int:
    """A memory.min/low/high/max as the kernel stores it: down to a page, infinity as is."""
    return value if value == UINT64_MAX else value // page_size * page_size


def to_bytes(q: Fraction, what: str = "quantity") -> int:
    """Whole bytes, fractional bytes rounded up; negative and absurd sizes refused."""
    if q < 0:
        raise QuantityError(f"{what} {NEGATIVE}", NEGATIVE)
    n = math.ceil(q)
    if n > MAX_BYTES:
        raise QuantityError(f"{what} {TOO_LARGE}", TOO_LARGE)
    return n


def parse_bytes(value: object) -> int:
    """A memory quantity as whole bytes (e.g. '1.5Gi' -> 1610612736), a fraction of a byte
    rounded up as the kubelet rounds a pod's request or limit."""
    try:
        return to_bytes(parse_quantity(value), shown(value))
    except QuantityError as e:
        if str(e).startswith(shown(value)):
            raise
        raise QuantityError(f"{shown(value)}: {e}", e.problem) from None


def parse_whole_bytes(value: object) -> int:
    """A memory quantity an operator gives (the config, --node-memory), which must be whole
    bytes: a fraction of a byte ('500m', '0.1Ki') is refused, not rounded up. It is a slip
    (500m is half a byte, not 500Mi) that Kubernetes would round up to 1 without a word."""
    n = parse_bytes(value)
    if parse_quantity(value) != n:
        why = f"{FRACTION} (Kubernetes would round it up to {n}; did you mean {_meant(value)}?)"
        raise QuantityError(f"{shown(value)} {why}", why)
    return n


def _meant(value: object) -> str:
    """What a fraction of a byte probably meant: '500m' -> 500Mi."""
    text = str(value)
    return text[:-1] + "Mi" if text.endswith("m") else "a whole number of bytes, or a unit such as Mi or Gi"


def format_bytes(n: int) -> str:
    """Short human form for tables: 512Mi, 1.5Gi, 972.8Mi, 4Ki, 100 (two decimals at most).
    From 1Pi up, a value two decimals cannot hold is given in bytes: those are the limits
    (2**63 - 1 would read "8Ei", the value just past the largest)."""
    if n < 0:
        return "-" + format_bytes(-n)
    if n >= 2**50 and n % 2**40:
        return str(n)
    for unit, size in (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n >= size:
            value = n / size
            if value == int(value):
                return f"{int(value)}{unit}"
            return f"{value:.2f}".rstrip("0").rstrip(".") + unit
    return str(n)


def show_value(value: int) -> str:
    """A memory property's value as systemctl takes it: bytes, or "infinity" for UINT64_MAX."""
    return "infinity" if value == UINT64_MAX else str(value)
