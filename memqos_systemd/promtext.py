"""The Prometheus text exposition format (0.0.4), read as Prometheus reads it. Pure.

What the kubelet says of itself on `/metrics` decides who writes a pod's protection
(kubelet_gate.py), so a line is read the way Prometheus's own parser reads it, not by a
pattern that happens to match the common case:

* a sample is `name`, optional `{label="value",...}` (a trailing comma allowed, blanks and tabs
  between the tokens), a value and an optional timestamp (an integer of milliseconds);
* a label value's escapes are `\\\\`, `\\"` and `\\n`;
* the value is what Go's strconv.ParseFloat takes: decimal and hexadecimal numbers, `NaN`,
  `+Inf`, `-Inf`, `Inf` and `Infinity` in any case;
* `#` lines are comments (HELP and TYPE among them); empty lines are skipped.

`samples(text, names)` gives the samples of the families named, and a problem (with its line
number) for every line of those families that is not valid: a line of ours that Prometheus would
refuse is not taken at its word. Lines of other families are not judged (the kubelet's exposition
is large, and its other families are not ours to read).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Collection, Mapping

__all__ = ["Sample", "Parsed", "samples", "parse_value", "parse_line", "BadLine"]

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_BLANK = " \t"
# What strconv.ParseFloat takes (bitSize 64): decimal, hexadecimal with a binary exponent, and the
# special values in any case. Go allows underscores only after a base prefix.
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_HEX = re.compile(r"([+-]?)0[xX]((?:_?[0-9a-fA-F])*)(?:\.((?:[0-9a-fA-F]_?)*))?[pP]([+-]?[0-9]+)")
_SPECIAL = {"nan": math.nan, "inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "infinity": math.inf,
            "+infinity": math.inf, "-infinity": -math.inf}
_TIMESTAMP = re.compile(r"-?[0-9]+")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


class BadLine(ValueError):
    """A line that is not valid in the text format; the message says why."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float
    timestamp: int | None = None
    line: int = 0  # its line number, from 1


@dataclass(frozen=True)
class Parsed:
    samples: tuple[Sample, ...] = ()
    bad: tuple[tuple[int, str, str], ...] = ()  # (line number, the line, why) of each line asked that is not valid

    @property
    def problems(self) -> tuple[str, ...]:
        """"line N: why" for each line of the families asked that is not valid."""
        return tuple(f"line {n}: {why}" for n, _, why in self.bad)


def parse_value(text: str) -> float:
    """A sample's value as Go's strconv.ParseFloat reads it; BadLine when it does not."""
    special = _SPECIAL.get(text.lower())
    if special is not None:
        return special
    if _DECIMAL.fullmatch(text):
        value = float(text)
        if math.isinf(value):  # ParseFloat's range error: Prometheus refuses the line
            raise BadLine(f"{text!r} is out of a float64's range")
        return value
    m = _HEX.fullmatch(text)
    if m and (m.group(2).strip("_") or m.group(3)):
        sign, whole, frac, exp = m.group(1), m.group(2).replace("_", ""), (m.group(3) or "").replace("_", ""), m.group(4)
        return float.fromhex(f"{sign}0x{whole or '0'}.{frac or '0'}p{exp}")
    raise BadLine(f"{text!r} is not a number")


def _label_value(line: str, i: int) -> tuple[str, int]:
    """The quoted label value starting at line[i] (a '"'), unescaped, and the index after it."""
    out = []
    i += 1
    while i < len(line):
        c = line[i]
        if c == '"':
            return "".join(out), i + 1
        if c == "\\":
            if i + 1 >= len(line) or line[i + 1] not in _ESCAPES:
                raise BadLine(f"invalid escape in a label value at column {i + 1}")
            out.append(_ESCAPES[line[i + 1]])
            i += 2
            continue
        out.append(c)
        i += 1
    raise BadLine("a label value has no closing quote")


def _skip(line: str, i: int) -> int:
    while i < len(line) and line[i] in _BLANK:
        i += 1
    return i


def parse_line(line: str, number: int = 0) -> Sample:
    """One sample line; BadLine naming what is wrong."""
    m = _NAME.match(line)
    if not m:
        raise BadLine("no metric name")
    name, i = m.group(), m.end()
    labels: dict[str, str] = {}
    i = _skip(line, i)
    if i < len(line) and line[i] == "{":
        i = _skip(line, i + 1)
        while True:
            if i < len(line) and line[i] == "}":
                i += 1
                break
            lm = _LABEL_NAME.match(line, i)
            if not lm:
                raise BadLine(f"expected a label name or '}}' at column {i + 1}")
            key = lm.group()
            i = _skip(line, lm.end())
            if i >= len(line) or line[i] != "=":
                raise BadLine(f"expected '=' after the label {key!r}")
            i = _skip(line, i + 1)
            if i >= len(line) or line[i] != '"':
                raise BadLine(f"the label {key!r} has no quoted value")
            value, i = _label_value(line, i)
            if key in labels:
                raise BadLine(f"the label {key!r} is given twice")
            labels[key] = value
            i = _skip(line, i)
            if i < len(line) and line[i] == ",":
                i = _skip(line, i + 1)
            elif i >= len(line) or line[i] != "}":
                raise BadLine(f"expected ',' or '}}' at column {i + 1}")
        if i < len(line) and line[i] not in _BLANK:
            raise BadLine(f"expected a blank after '}}' at column {i + 1}")
    elif i == m.end() and i < len(line):
        raise BadLine(f"unexpected {line[i]!r} after the metric name")
    rest = line[i:].strip(_BLANK).split()
    if not rest:
        raise BadLine("no value")
    if len(rest) > 2:
        raise BadLine(f"more than a value and a timestamp: {' '.join(rest[2:])!r}")
    value = parse_value(rest[0])
    timestamp = None
    if len(rest) == 2:
        if not _TIMESTAMP.fullmatch(rest[1]):
            raise BadLine(f"the timestamp {rest[1]!r} is not an integer of milliseconds")
        timestamp = int(rest[1])
    return Sample(name, labels, value, timestamp, number)


def _family_of(line: str) -> str | None:
    m = _NAME.match(line)
    return m.group() if m else None


def samples(text: str, names: Collection[str]) -> Parsed:
    """The samples of the families `names` in `text`, and a problem for each of their lines that is
    not valid (see the module's docstring)."""
    found: list[Sample] = []
    bad: list[tuple[int, str, str]] = []
    wanted = frozenset(names)
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.rstrip("\r")
        stripped = line.lstrip(_BLANK)
        if not stripped or stripped.startswith("#"):
            continue
        if _family_of(stripped) not in wanted:
            continue
        try:
            found.append(parse_line(stripped, number))
        except BadLine as e:
            bad.append((number, stripped, str(e)))
    return Parsed(tuple(found), tuple(bad))
