"""Keeping the runtime's settings around our writes.

A write of ours makes systemd re-apply every cgroup setting of the unit from its own state, and a
runtime that wrote one of them to the cgroup's file alone loses it (cgroupfs.py, "Why that file").
For a unit of the kubepods tree, `RuntimeKeep`, which the Applier holds (`Applier.keep`):
- reads the unit's memory.swap.max and memory.oom.group just before the write
  (`Cgroupfs.runtime_settings`);
- sends the runtime's memory.swap.max as `MemorySwapMax` beside our properties
  (systemd.CARRIED_PROPERTIES), so systemd holds it and writes it back itself ("max" is the default
  systemd would write anyway, so it is not sent);
- notes a memory.oom.group=1, which no property can carry on a scope that exists, and puts it back
  in the file where systemd's re-apply made it 0 (`Cgroupfs.restore_oom_group`): after each
  write, and after each full re-read (a daemon-reload resets it too).

`OomGroupJournal` is the service's `on_restore`: each memory.oom.group put back counted, the first
one said in the journal.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable

from .cgroupfs import Cgroupfs
from .notify import WarnOnce
from .quantity import UINT64_MAX
from .reconcile import Change

__all__ = ["RuntimeKeep", "OomGroupJournal"]

log = logging.getLogger("memqos_systemd")


class RuntimeKeep:
    """The runtime's file-only settings of our units, kept through our writes (see the module)."""

    def __init__(self, cgroupfs: Cgroupfs | None, on_restore: Callable[[str, str | None], None] | None = None):
        self.cgroupfs = cgroupfs  # None: nothing read or kept (tests of the order alone)
        # Units whose runtime set memory.oom.group=1 (seen in the file before a write of ours):
        # put back after each write, and after each full re-read (a daemon-reload resets it too).
        # Kept through Observer.forget(): a daemon-reload announces every unit removed, then new
        # again; only a full re-read that no longer finds the unit drops it.
        self.oom_group_kill: set[str] = set()
        # on_restore(unit, None) after memory.oom.group was put back, (unit, why) when it could not be.
        self._on_restore = on_restore or (lambda unit, error: None)

    def props_to_send(self, change: Change) -> dict[str, int]:
        """The change's properties, and for a unit of the kubepods tree the runtime's file-only
        memory.swap.max as MemorySwapMax beside them, so systemd keeps it when our write makes it
        re-apply the unit's settings (cgroupfs.py, "Why that file"). Notes a memory.oom.group=1
        to put back after the write. Read from the cgroup just before the write; "max" is the
        default systemd would write anyway, so it is not sent."""
        props = dict(change.props)
        if not change.must_exist or self.cgroupfs is None:
            return props
        held = self.cgroupfs.runtime_settings(change.unit)
        if held is None:
            return props
        if held.swap_max is not None and held.swap_max != UINT64_MAX:
            props["MemorySwapMax"] = held.swap_max
        if held.oom_group == 1:
            self.oom_group_kill.add(change.unit)
        return props

    def after_write(self, unit: str) -> None:
        """memory.oom.group back to the runtime's 1 where a re-apply by systemd made it 0."""
        if self.cgroupfs is None or unit not in self.oom_group_kill or self.cgroupfs.oom_group(unit) != 0:
            return
        self._on_restore(unit, self.cgroupfs.restore_oom_group(unit))

    def after_full_read(self, loaded: Iterable[str]) -> None:
        """After a re-read of every unit, `loaded` the units found loaded: forget the others, and
        put memory.oom.group back where the re-apply of a daemon-reload made it 0."""
        self.oom_group_kill &= set(loaded)
        for name in sorted(self.oom_group_kill):
            self.after_write(name)


class OomGroupJournal:
    """The service's `on_restore`: each memory.oom.group put back counted (`count(ok)`), the first
    one said in the journal with why, a failure said once while it lasts."""

    def __init__(self, count: Callable[[bool], None]):
        self._count = count
        self._noted = False
        self._warn_once = WarnOnce(log)

    def __call__(self, unit: str, error: str | None) -> None:
        self._count(error is None)
        if error is not None:
            self._warn_once("oom-group", [f"cannot put memory.oom.group of {unit} back to the runtime's 1: {error};"
                                          f" systemd reset it when it re-applied the unit's settings"])
        elif not self._noted:
            self._noted = True
            log.info("memory.oom.group of %s put back to 1: systemd resets it to 0 whenever it re-applies a scope's"
                     " settings (a write, a daemon-reload), and the runtime set it only in the file; done for every"
                     " such container from now on (memqos_oom_group_restores_total)", unit)
