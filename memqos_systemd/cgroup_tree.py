"""Where systemd puts a unit's cgroup, what the kernel shows of the values systemd holds, and how
its files read: one number, flat-keyed (memory.events), PSI (memory.pressure), /proc/mounts.

Pure: names, bytes and numbers in, names and numbers out. The adapter that reads the files
(cgroupfs.py), the plan (which says where its container scopes are), the drift's verdicts
(drift.py) and the metrics' signals (signals.py) all ask here, so none of them needs another's
module for it.
"""

from __future__ import annotations

import os
import re
from typing import Iterable, Mapping

from .quantity import UINT64_MAX, as_stored

__all__ = ["MEMORY_FILES", "WITH_MAX", "cgroup_path", "cgroup_paths", "files_of", "kernel_shows", "parse_value",
           "flat_keyed", "parse_flat_keyed", "parse_pressure", "psi_totals", "recursive_protection"]

MEMORY_FILES = {"MemoryMin": "memory.min", "MemoryLow": "memory.low", "MemoryHigh": "memory.high"}
# With MemoryMax where it is ours (a feature's, features.owned: held values that carry it).
WITH_MAX = {**MEMORY_FILES, "MemoryMax": "memory.max"}


def cgroup_path(unit: str, parent_path: str | None = None) -> str:
    """Where systemd puts a unit's cgroup, relative to the cgroup2 mount.

    A slice's place follows from its name (`a-b-c.slice` -> `a.slice/a-b.slice/a-b-c.slice`);
    a scope sits in its parent slice, which the caller passes as `parent_path`.
    """
    if unit.endswith(".slice"):
        parts = unit[: -len(".slice")].split("-")
        return "/".join("-".join(parts[: i + 1]) + ".slice" for i in range(len(parts)))
    return f"{parent_path}/{unit}" if parent_path else unit


def cgroup_paths(units: Iterable[tuple[str, str | None]]) -> dict[str, str]:
    """{unit: cgroup path} of (unit, parent unit or None) pairs, parents first."""
    paths: dict[str, str] = {}
    for unit, parent in units:
        paths[unit] = cgroup_path(unit, paths.get(parent) if parent else None)
    return paths


def kernel_shows(kernel: Mapping[str, int], held: Mapping[str, int], page_size: int) -> bool:
    """Whether the memory files of the properties `held` has (memory.min/low/high, memory.max) as
    the kernel shows them are `held` (as systemd holds them): the kernel stores each rounded down
    to a page, infinity as is. (In companion mode `held` has only the properties that are ours.)"""
    return all(kernel.get(prop) == as_stored(held[prop], page_size) for prop in files_of(held))


def files_of(held: Mapping[str, int]) -> Mapping[str, str]:
    """The property -> file pairs to compare with `held`: those of the properties it has."""
    if held.keys() == MEMORY_FILES.keys():
        return MEMORY_FILES  # the common case, one object (the watch compares its keys)
    return {p: f for p, f in WITH_MAX.items() if p in held}


# ---- how the kernel's files read ---------------------------------------------------------------
def parse_value(raw: bytes) -> int | None:
    """A one-number cgroup file's content ("max" is UINT64_MAX); None when not a number."""
    text = raw.strip()
    if text == b"max":
        return UINT64_MAX
    if text.isdigit() and int(text) <= UINT64_MAX:
        return int(text)
    return None


def flat_keyed(raw: bytes) -> dict[bytes, bytes]:
    """The lines `key value` of a flat-keyed cgroup file (memory.events, memory.stat) -> {key:
    value}, both as the file has them (the value's digits); malformed lines are skipped."""
    fields = raw.split()
    values = fields[1::2]
    if len(fields) % 2 == 0 and b"".join(values).isdigit():  # the kernel's files: every line `key digits`
        return dict(zip(fields[::2], values))
    out = {}
    for line in raw.splitlines():
        key, _, value = line.partition(b" ")
        if value.isdigit():
            out[key] = value
    return out


def parse_flat_keyed(raw: bytes) -> dict[str, int]:
    """flat_keyed as {key: number}."""
    return {key.decode("utf-8", "replace"): int(value) for key, value in flat_keyed(raw).items()}


def parse_pressure(raw: bytes) -> dict[str, dict[str, float]]:
    """The lines of a PSI file such as memory.pressure (`some avg10=0.00 avg60=0.00 avg300=0.00
    total=1234`): {"some": {"avg10": %, "avg60": %, "avg300": %, "total": µs}, "full": {...}};
    malformed fields are skipped, a line without `total=` is left out."""
    out: dict[str, dict[str, float]] = {}
    for line in raw.decode("ascii", "replace").splitlines():
        kind, *fields = line.split() or [""]
        values: dict[str, float] = {}
        for f in fields:
            key, _, value = f.partition("=")
            try:
                values[key] = int(value) if key == "total" else float(value)
            except ValueError:
                continue
        if kind in ("some", "full") and "total" in values:
            out[kind] = values
    return out


def psi_totals(raw: bytes) -> dict[bytes, bytes]:
    """The `total=` of each line of a PSI file (memory.pressure): {b"some": µs, b"full": µs}, the
    digits as the file has them; a line without a numeric total is left out."""
    out = {}
    for line in raw.splitlines():
        kind, _, rest = line.partition(b" ")
        _, found, total = rest.rpartition(b"total=")
        if found and total.isdigit():
            out[kind] = total
    return out


def recursive_protection(mounts: bytes, where: str | os.PathLike) -> bool | None:
    """Whether the cgroup2 mount at `where` has the option memory_recursiveprot, from the text of
    /proc/mounts (the last mount at a place is the one seen); None when no cgroup2 mount is there."""
    target = os.fsencode(os.path.normpath(where))
    found = None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == b"cgroup2" and _unescape_mount(fields[1]) == target:
            found = b"memory_recursiveprot" in fields[3].split(b",")
    return found


def _unescape_mount(field: bytes) -> bytes:
    """A mount point as /proc/mounts writes it: space, tab, newline and backslash as octal escapes."""
    return re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8) & 0xFF]), field)
