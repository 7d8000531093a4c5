"""Lines that follow usage at work (feature.py, one line of features.py): the BestEffort ceiling's
and the Burstable lever's lines drawn from what the pods with requests use (lending.py), laid on
the plan, stepped, and looked at again.

plan.py draws the static lines from requests; with `lending: {enabled: true}` this feature
replaces them at each look:
* `overlay` reads, when a look is due, each owner's memory.current, `low` count and PSI `some`
  total (Cgroupfs.owners_seen: a pread each), draws the lines (lending.draw, pure), and lays them
  on the plan: the ceiling's MemoryMax (which CeilingWatch, after it in the table, then steps
  towards, never below the BestEffort slice's usage, lending.GUARD above it), and each lever pod's
  MemoryHigh, stepped the same way (ceiling.step with GUARD). No write of ours goes below a
  borrower's usage: such a write makes PID 1 reclaim, and for a MemoryMax OOM-kill, inside it
  (docs/DESIGN.md, "Lines that follow usage"). Between
  looks (a poll's round, a new pod) it lays the lines of the last look, read again at once only
  when the plan changed.
* `pending` while a look is due and not taken: the lines move with usage, which no input of the
  round shows, so a round is not taken as settled then; between looks an idle round is settled
  (and skipped) as any other.
* `look_again`: LOOK_FIRST after a look that moved something (a line, an owner's usage by a grid
  step, a press, a step written), twice as long each time nothing moved, up to LOOK_MOST while a
  line lends and LOOK_IDLE while none does (lending.look_most; agenda.follow);
  `notifier` is a PSI trigger on kubepods.slice (Cgroupfs.pressure_wake: PRESS_TRIGGER of stall in
  PRESS_WINDOW), and `woken` makes a look due at once: the owners' growth is found when their
  tasks first stall on memory, not at the next tick.
* `settle` shows each line and what it lends (metrics `memqos_lending_line_bytes`,
  `memqos_lending_lent_bytes`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Mapping

from . import lending
from .agenda import Look, follow
from .ceiling import step
from .cgroupfs import Cgroupfs
from .config_schema import Config
from .feature import Context, Family, NoGauges
from .naming import Naming
from .plan import INFINITY, Plan
from .reconcile import UNREAD

__all__ = ["LendingWatch", "PRESS_TRIGGER", "PRESS_WINDOW", "lines_now"]

log = logging.getLogger("memqos_systemd")

# The PSI trigger on kubepods.slice: its tasks stalled on memory 10 ms within a second (at most
# one wake a second under pressure; none on a calm node).
PRESS_TRIGGER = 10_000
PRESS_WINDOW = 1_000_000


class LendingWatch:
    name = "lending"
    properties: tuple[str, ...] = ()
    families = (Family("memqos_lending_line_bytes",
                       "A line that follows usage (lending: {enabled: true}): the BestEffort ceiling's MemoryMax"
                       " (lever=bestEffortCeiling, pod empty) or a Burstable pod slice's MemoryHigh"
                       " (lever=burstableHigh) as last drawn, which the writes step towards", ("lever", "pod")),
                Family("memqos_lending_lent_bytes",
                       "What that line lends: the memory the pods with requests requested and do not use"
                       " (nor are about to) that it gives above the line with every request reserved",
                       ("lever", "pod")))

    @classmethod
    def made(cls, context: Context) -> LendingWatch:
        return cls(context.cgroupfs, context.page_size, context.metrics, context.clock)

    def __init__(self, cgroupfs: Cgroupfs, page_size: int, metrics=None, clock=None):
        self.cgroupfs = cgroupfs
        self.page_size = page_size
        self.metrics = metrics or NoGauges()
        self._lent_shown: set[tuple[str, str]] = set()  # the series shown (show_lines)
        self.clock = clock
        self.state = lending.State()
        self.lines: lending.Lines | None = None
        self.active = False  # lending is on and has a line to draw
        self.moved = False  # the last look moved something
        self.stepping = False  # a lever pod's MemoryHigh is held above its line for its usage
        self._seen: dict[str, lending.Seen] = {}
        self._headroom = 0  # lending.headroom, as the last look resolved it
        self._drawn_for: Plan | None = None  # the plan the lines were last drawn for
        self._overlaid: tuple | None = None  # (desired, key, overlaid plan)
        self._look = Look()
        self._due = True  # a look is due at the next overlay
        self._drawn_at = float("-inf")  # when the lines were last drawn

    def units(self, naming: Naming, config: Config) -> frozenset[str]:
        return frozenset()

    @property
    def notifier(self):
        return self.cgroupfs.pressure_wake()

    def woken(self, now: float) -> float:
        """The trigger fired: a look now (infinity when lending is off)."""
        if not self.cgroupfs.pressure_wake().drain() or not self.active:
            return float("inf")
        self._due = True
        self._look = Look(now, lending.LOOK_FIRST)
        return now

    def overlay(self, desired: Plan, observed: Mapping[str, Mapping[str, int] | None], config: Config,
                naming: Naming) -> Plan:
        settings = config.lending
        if not settings.enabled or (desired.ceiling is None and not desired.levers):
            if self.active:
                self.cgroupfs.pressure_wake().disarm()
            self.active, self.lines, self.state, self.stepping, self.moved = False, None, lending.State(), False, False
            self._drawn_for = None
            return desired
        self.active = True
        self.cgroupfs.pressure_wake().arm(naming.node_slice(), PRESS_TRIGGER, PRESS_WINDOW)
        now = self.clock()
        if self._due or now >= self._look.at or self._drawn_for is None or self._drawn_for.owners != desired.owners \
                or self._drawn_for.levers != desired.levers or self._drawn_for.ceiling != desired.ceiling:
            self._draw(desired, settings.headroom.resolve(desired.allocatable), now)
        return self._lay(desired, observed)

    def _draw(self, desired: Plan, headroom: int, now: float) -> None:
        levers = {lv.unit: lv for lv in desired.levers}
        owners = tuple(lending.Owner(o.unit, o.request, levers[o.unit].memory_high if o.unit in levers else None,
                                     levers[o.unit].kep if o.unit in levers else None) for o in desired.owners)
        self._seen = {u: lending.Seen(*v) for u, v in self.cgroupfs.owners_seen(o.unit for o in owners).items()}
        ceiling = (desired.ceiling.unit, desired.ceiling.minimum) if desired.ceiling is not None else None
        before = self.lines
        self.lines, self.state = lending.draw(owners, self._seen, alloc=desired.allocatable, headroom=headroom,
                                              ceiling=ceiling, page_size=self.page_size, state=self.state, now=now)
        self.moved = self.lines.moved
        self._drawn_for, self._due, self._headroom, self._drawn_at = desired, False, headroom, now
        self._say(before, self.lines)

    def _lay(self, desired: Plan, observed: Mapping[str, Mapping[str, int] | None]) -> Plan:
        """`desired` with the lines of the last look on it (the same object while nothing changes)."""
        lines = self.lines
        steps = {}
        self.stepping = False
        for lent in lines.levers:
            held = _held(observed, lent.unit, "MemoryHigh")
            seen = self._seen.get(lent.unit)
            s = step(lent.value, held, seen.usage if seen is not None else None, self.page_size, lending.GUARD)
            steps[lent.unit] = s.value
            self.stepping |= s.following
            self.moved |= s.value != (INFINITY if held is None else held)  # a write: look again soon
        key = (lines.ceiling, lines.levers, tuple(sorted(steps.items())))
        if self._overlaid is not None and self._overlaid[0] is desired and self._overlaid[1] == key:
            return self._overlaid[2]
        ceiling, units = desired.ceiling, desired.units
        if lines.ceiling is not None and ceiling is not None:
            # its headroom lending's: what it lends is above allocatable - requests - that headroom
            ceiling = dataclasses.replace(ceiling, memory_max=lines.ceiling.value, lent=lines.ceiling.lent,
                                          headroom=self._headroom, guard=lending.GUARD)
        levers = tuple(dataclasses.replace(lv, memory_high=lines.lever(lv.unit).value, lent=lines.lever(lv.unit).lent)
                       if lines.lever(lv.unit) is not None else lv for lv in desired.levers)
        units = tuple(dataclasses.replace(u, memory_max=ceiling.memory_max)
                      if ceiling is not None and u.unit == ceiling.unit and u.level == "qos" and u.memory_max is not None
                      else dataclasses.replace(u, memory_high=steps[u.unit]) if u.level == "pod" and u.unit in steps
                      else u for u in units)
        overlaid = dataclasses.replace(desired, units=units, ceiling=ceiling, levers=levers)
        self._overlaid = (desired, key, overlaid)
        return overlaid

    def _say(self, before: lending.Lines | None, now: lending.Lines) -> None:
        """The journal: when an owner is pressed (its whole request taken back for it)."""
        was = before.pressed if before is not None else frozenset()
        for unit in sorted(now.pressed - was):
            log.info("lending: %s stalls on memory or was reclaimed below its MemoryLow: its whole request is"
                     " taken back for it for %.0f s", unit, lending.PRESS_HOLD)

    @property
    def pending(self) -> bool:
        """A look is due and not taken yet: the lines follow usage, which the round's inputs do not
        show, so a round must not be taken as settled then (round.py asks before and after a round).
        Between looks, a round with nothing to send is settled as any other."""
        return self.active and (self._due or self._drawn_at < self._look.at <= self.clock())

    def settle(self, observed: Mapping[str, Mapping[str, int] | None], desired: Plan) -> None:
        self.show_lines(desired if self.active else None)

    def show_lines(self, plan: Plan | None) -> None:
        """The lines that follow usage after a round (plan.Ceiling.lent, plan.Lever.lent), as gauges;
        None: lending off. A series goes with its line, not between scrapes."""
        lines = {}
        if plan is not None and plan.ceiling is not None and plan.ceiling.lent is not None:
            lines[("bestEffortCeiling", "")] = (plan.ceiling.memory_max, plan.ceiling.lent)
        for lever in plan.levers if plan is not None else ():
            if lever.lent is not None:
                lines[("burstableHigh", lever.pod)] = (lever.memory_high, lever.lent)
        for gone in sorted(self._lent_shown - lines.keys()):
            self.metrics.gauge("memqos_lending_line_bytes", gone, None)
            self.metrics.gauge("memqos_lending_lent_bytes", gone, None)
        for labels, (line, lent) in lines.items():
            self.metrics.gauge("memqos_lending_line_bytes", labels, line)
            self.metrics.gauge("memqos_lending_lent_bytes", labels, lent)
        self._lent_shown = set(lines)

    def look_again(self, now: float, planned: bool = True) -> float:
        self._look = follow(self._look, now, planned and self.active, self.moved, lending.LOOK_FIRST,
                            lending.look_most(self.lines))
        self.moved = False
        return self._look.at

    def on_drift(self, unit: str, before: Mapping[str, int], now: Mapping[str, int], config: Config) -> frozenset[str]:
        return frozenset()

    def plan_notes(self, p: Plan, config: Config) -> list[str]:
        """`plan`'s note under the lines it draws: a plan has no usage to draw them from."""
        if not (config.lending.enabled and (p.ceiling is not None or p.levers)):
            return []
        return ["lending on: the service draws these lines from what the pods with requests use, not from",
                "       their requests, and lends what they neither use nor are about to (the lines now:",
                "       memqos-systemd status, metrics memqos_lending_line_bytes and memqos_lending_lent_bytes)"]

    def shown(self, desired: Plan, config: Config) -> Plan:
        """What `status` shows as planned: the lines a first look draws now (`lines_now`)."""
        return lines_now(desired, self.cgroupfs, config, self.page_size, (self.clock or time.monotonic)())


def _held(observed: Mapping[str, Mapping[str, int] | None], unit: str, prop: str) -> int | None:
    values = observed.get(unit)
    return None if values is None or values is UNREAD else values.get(prop)


def lines_now(desired: Plan, cgroupfs: Cgroupfs, config: Config, page_size: int, now: float) -> Plan:
    """`desired` with the lines a first look draws now (for `status`): the owners read once, no
    trigger armed, nothing stepped. A first look knows no growth rate and no press held, so the
    service's own lines may stand lower by a growing owner's slack or a pressed owner's request
    (its metrics show its own). `desired` itself when lending is off or has no line to draw."""
    if not config.lending.enabled or (desired.ceiling is None and not desired.levers):
        return desired
    watch = LendingWatch(cgroupfs, page_size)
    watch._draw(desired, config.lending.headroom.resolve(desired.allocatable), now)
    # each line taken as held: laid as drawn, not stepped from what systemd holds
    return watch._lay(desired, {lent.unit: {"MemoryHigh": lent.value} for lent in watch.lines.levers})
