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

Either way a `Drift` record comes back, and the daemon counts it, logs it and keeps its fights;
the next round puts ours back.

**Fights.** `ForeignWrites` says when to tell the journal (once an hour per unit and kind of writer,
`foreign_write_line`) and when a unit is fought over (more than FIGHT_WRITES writes within
FIGHT_WINDOW, `fight_line`): ours is still put back every time, and `status` and the journal say so
(fights.py keeps them in /run for `status` and `check`). Who most likely wrote it is
kubelet_gate.likely_writer's to say.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .cgroup_tree import kernel_shows
from .kubelet_gate import likely_writer, written_how
from .naming import Naming
from .quantity import show_value
from .reconcile import UNREAD, kernel_lost

__all__ = ["Drift", "judge", "left_alone", "kernel_agrees", "WRITERS", "FOREIGN_LOG_EVERY", "FIGHT_WRITES",
           "FIGHT_WINDOW", "Fight", "ForeignWrites", "foreign_write_line", "fight_line"]

WRITERS = ("systemd", "cgroupfs")  # the kinds of writer (memqos_foreign_writes_total's `writer`)
# A unit someone else keeps writing is logged at most this often; the metric counts every time.
FOREIGN_LOG_EVERY = 3600.0
# More than FIGHT_WRITES writes behind our back on one unit within FIGHT_WINDOW seconds is a fight:
# a writer that comes back on a period, not a one-off. The writers known are periodic: the kubelet's
# QoS manager (its Memory QoS gate, QOSReserved) every minute, an agent such as koordlet every few
# seconds to a minute; a person's set-property or echo, or the kubelet's zeros at its start, is one
# or two writes. So a once-a-minute writer is named after its 4th write (3 minutes), one every 10 s
# after 30 s, and a person fixing a value by hand twice is not. A fight lasts until FIGHT_WINDOW
# passes without a write.
FIGHT_WRITES = 3
FIGHT_WINDOW = 600.0


@dataclass(frozen=True)
class Drift:
    """A write found behind our back on `unit`: what it held (`before`), what it holds (`now`), and
    who wrote it (`writer`: one of WRITERS)."""

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


# ---- fights -----------------------------------------------------------------------------------
@dataclass
class Fight:
    """A unit someone keeps writing behind our back (times are the caller's clock)."""

    unit: str
    level: str
    writers: set[str]  # of WRITERS
    writes: int  # behind our back since `since`
    since: float  # the first of the writes that made it a fight
    last: float
    changed: tuple[str, ...] = ()  # the properties the last write changed


@dataclass
class ForeignWrites:
    """Writes found behind our back, per unit: whether to log one (once an hour per unit and kind of
    writer: a writer through systemd and then the file shows both) and which units are fought over
    (`fights`). Times are the caller's clock (monotonic seconds)."""

    fights: dict[str, Fight] = field(default_factory=dict)
    _recent: dict[str, list[float]] = field(default_factory=dict)  # unit -> its last writes, within the window
    _logged: dict[tuple[str, str], float] = field(default_factory=dict)  # (unit, writer) -> when last logged

    def seen(self, unit: str, level: str, writer: str, before: Mapping[str, int], now_values: Mapping[str, int],
             now: float) -> tuple[bool, Fight | None]:
        """A write behind our back on `unit` found at `now`: (log its line now, the fight it began or None).
        Fights with no write for FIGHT_WINDOW are over."""
        self.fights = {u: f for u, f in self.fights.items() if f.last > now - FIGHT_WINDOW}
        self._recent = {u: ts for u, ts in self._recent.items() if ts[-1] > now - FIGHT_WINDOW}
        self._logged = {u: t for u, t in self._logged.items() if t > now - FOREIGN_LOG_EVERY}
        recent = [t for t in self._recent.get(unit, []) if t > now - FIGHT_WINDOW][-FIGHT_WRITES:] + [now]
        self._recent[unit] = recent
        changed = tuple(_changed(before, now_values))
        began = None
        fight = self.fights.get(unit)
        if fight is not None:
            fight.writes += 1
            fight.last = now
            fight.writers.add(writer)
            fight.changed = changed
        elif len(recent) > FIGHT_WRITES:
            began = self.fights[unit] = Fight(unit, level, {writer}, len(recent), recent[0], now, changed)
        log = (unit, writer) not in self._logged
        if log:
            self._logged[(unit, writer)] = now
        return log, began


def _changed(before: Mapping[str, int], now: Mapping[str, int]) -> list[str]:
    return [p for p in now if now[p] != before.get(p)]


def foreign_write_line(unit: str, before: Mapping[str, int], now: Mapping[str, int], writer: str,
                       naming: Naming) -> str:
    """The journal's line for a write found behind our back: the unit, what changed, where (through
    systemd, or in the cgroup file with systemd still holding ours), the likely writer."""
    changed = _changed(before, now)
    values = ", ".join(f"{p} {show_value(before[p])} -> {show_value(now[p])}" for p in changed if p in before)
    where = "in its cgroup file, around systemd" if writer == "cgroupfs" else "through systemd"
    return (f"{unit}: {values} changed without us {where}: {likely_writer(unit, changed, writer, naming)};"
            f" putting ours back through systemd (logged once an hour per unit and kind; memqos_foreign_writes_total"
            f" counts each time)")


def fight_line(fight: Fight, naming: Naming) -> str:
    """The journal's line when a unit becomes fought over."""
    kinds = written_how(fight.writers)
    writer = likely_writer(fight.unit, fight.changed, "cgroupfs" if "cgroupfs" in fight.writers else "systemd",
                           naming)
    return (f"{fight.unit}: written behind our back {fight.writes} times in {fight.last - fight.since:.0f} s"
            f" ({kinds}): {writer}; two writers are fighting: memqos-systemd keeps putting its values back"
            f" every time, for as long as it lasts (`memqos-systemd status` shows it; over once"
            f" {FIGHT_WINDOW / 60:.0f} min pass without a write)")
