"""Where systemd puts a unit's cgroup, and what the kernel shows of the values systemd holds.

Pure: names and numbers in, names and booleans out. The adapter that reads the files
(cgroupfs.py), the plan (which says where its container scopes are) and the drift's verdicts
(drift.py) all ask here, so none of them needs another's module for it.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from .quantity import as_stored

__all__ = ["MEMORY_FILES", "WITH_MAX", "cgroup_path", "cgroup_paths", "files_of", "kernel_shows"]

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
