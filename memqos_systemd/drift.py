"""Writes made behind our back, judged from what a read found. Pure.

A read of one of our units (observe.py) brings what systemd holds for it (`value`, one GetAll) and,
read just before, what its cgroup shows (`kernel`, Cgroupfs.kernel_values). Held against what the
cache had from our last read or write of it (`held`), that says which of two writers was about
(`WRITERS`):

* **through systemd**: systemd holds other values than the cache had (another agent, `systemctl
  set-property`, the kubelet's own Memory QoS). Needs values of systemd's own in the cache: a unit
  cached from its cgroup alone (unconfirmed) or not read (UNREAD), or not cached, is compared with
  its cgroup only.
* **to the cgroup file alone**: its cgroup shows less than systemd holds (reconcile.kernel_lost:
  koordlet, libcontainer's file write after its D-Bus call, a person's `echo`). What it lost is
  returned too (`lost`): the next diff sets it again through systemd.

A cgroup showing other values than systemd holds, none of them lost (more MemoryMin or MemoryLow: a
file write that raised it, a parent's DefaultMemoryLow=; a MemoryMax written to the file) is left
alone (`left_alone`): what the cgroup is expected to show from then on, so the kernel watch and a
timer resync compare the cgroup with that and do not report it at every look.

Either way a `Drift` record comes back, and the daemon counts it, logs it and keeps its fights
(kubelet_gate.ForeignWrites); the next round puts ours back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .cgroupfs import kernel_shows
from .reconcile import UNREAD, kernel_lost

__all__ = ["Drift", "judge", "left_alone", "kernel_agrees"]


@dataclass(frozen=True)
class Drift:
    """A write found behind our back on `unit`: what it held (`before`), what it holds (`now`), and
    who wrote it (`writer`: "systemd" or "cgroupfs", kubelet_gate.WRITERS)."""

    unit: str
    before: Mapping[str, int]
    now: Mapping[str, int]
    writer: str


def judge(unit: str, value: Mapping[str, int] | None, held: Mapping[str, int] | None,
          kernel: Mapping[str, int] | None, *, mine: Mapping[str, int], confirmed: bool,
          page_size: int) -> tuple[Drift | None, dict[str, int] | None]:
    """What the read `value` of `unit` (None: not loaded) says of someone else's writes: the
    record, if any, and what its cgroup lost (for the next diff; None when nothing). `held`: the
    cache's values for it; `kernel`: its cgroup, read just before; `mine`: `value` without what
    the kubelet owns in companion mode; `confirmed`: `held` is systemd's own (not from the cgroup)."""
    if value is None:
        return None, None
    if (held is not None and held is not UNREAD and confirmed
            and any(mine[k] != held[k] for k in mine.keys() & held.keys())):
        # (Only what both hold: MemoryMax is read only while it is ours, Observer.max_units.)
        return Drift(unit, dict(held), dict(value), "systemd"), None
    lost = kernel_lost(mine, kernel, page_size) if kernel is not None else {}
    if lost:
        return Drift(unit, dict(value), {**value, **lost}, "cgroupfs"), lost
    return None, None


def left_alone(value: Mapping[str, int] | None, kernel: Mapping[str, int] | None, mine: Mapping[str, int],
               page_size: int) -> dict[str, int] | None:
    """What a cgroup that shows other values than systemd holds (`value`, `mine` of them ours) is
    expected to show from now on: systemd's values with the kernel's in their place. None when it
    shows systemd's (or either is unknown)."""
    if value is None or kernel is None or kernel_shows(kernel, mine, page_size):
        return None
    return {**value, **{p: v for p, v in kernel.items() if p in value}}


def kernel_agrees(held: Mapping[str, int] | None, kernel: Mapping[str, int] | None, expected: Mapping[str, int],
                  *, confirmed: bool, page_size: int) -> bool:
    """Whether a cgroup showed (`kernel`) what it is `expected` to, for values of systemd's own in
    the cache (`held`, `confirmed`): then a timer resync need not read the unit over D-Bus."""
    return (kernel is not None and held is not None and held is not UNREAD and confirmed
            and kernel_shows(kernel, expected, page_size))
