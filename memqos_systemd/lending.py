"""Lines that follow usage: what the BestEffort ceiling and the Burstable lever lend, and when they
take it back. Pure.

The static lines (plan.py) are drawn from requests: the ceiling at allocatable − every request −
headroom, a Burstable pod's MemoryHigh at allocatable − the others' requests − headroom. Requested
memory that nobody uses is then kept idle. With `lending: {enabled: true}` each line is drawn
from what the owners of requests *use* instead, plus a slack for their growth:

    reserve(p)  = its request                      if p's usage is unknown or p is pressed
                = min(request, usage + slack(p))   otherwise
    borrowed(p) = max(0, usage - request)          (a Burstable pod beyond its request)
    slack(p)    = max(SLACK_MIN(request), growth rate since the last look x HORIZON)
    pressed(p)  = p, under its request, stalled on memory (PSI `some`) for PRESS_STALL of the time
                  since the last look, or was reclaimed below its memory.low (a `low` event), within
                  PRESS_HOLD: then its whole request is taken back for it

    BestEffort ceiling  = max(minimum, allocatable − headroom − Σ over every pod with a request of
                          (reserve + borrowed))
    lever of Burstable P = min(its KEP MemoryHigh, max(its static line, allocatable − headroom −
                          Σ over every other pod with a request of (reserve + borrowed)))

So BestEffort gets what the owners neither use nor are about to use, after the Burstable pods'
borrowing (BestEffort yields first); a Burstable pod without a limit may grow into it too, never
below its static line. What a line lends is what it gives above the same formula with every
request reserved whole.

A line moves on a grid of QUANTUM bytes with hysteresis: it is lowered as soon as what the owners
claim passes it (to the grid point below), and raised only once they leave two grid steps more.
Usage that jitters by less than a step never writes anything.

Getting to a line is ceiling.step's: the BestEffort slice's MemoryMax and a lever pod's MemoryHigh
step down with the borrower's usage, never below it (GUARD above it); when to look
again is the feature's (lending_watch.py, over agenda.follow).
Every number here is chosen from measurements: docs/DESIGN.md, "Lines that follow usage".
No I/O, no clock (`now` is passed in), no globals; tests/unit/test_lending.py is its table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from .quantity import page_up

__all__ = ["Owner", "Seen", "Lent", "Lines", "State", "draw", "quantum", "slack_min", "reserve",
           "SLACK_FLOOR", "SLACK_SHARE", "HORIZON", "PRESS_STALL", "PRESS_HOLD", "GUARD", "LOOK_FIRST", "LOOK_MOST",
           "LOOK_IDLE", "look_most"]

MIB = 1 << 20
# Each owner's slack is at least a sixteenth of its request (4 MiB at least): what it may grow by
# between two looks before the line must move. (docs/DESIGN.md, "Lines that follow usage")
SLACK_FLOOR = 4 * MIB
SLACK_SHARE = 16
# A growing owner's slack is what it would grow by over HORIZON at the rate seen since the last
# look: the next look (LOOK_FIRST after a look that saw growth) plus the write and the kernel's
# reaction.
HORIZON = 2.0
# An owner stalled on memory for this share of the time since the last look is pressed.
PRESS_STALL = 0.01
# A pressed owner keeps its whole request reserved for this long after its last press.
PRESS_HOLD = 60.0
# A line below a borrower's usage is stepped down with the usage, never below it, and stops this
# far above it (ceiling.step's `guard`). 0, as the static ceiling's step: measured (e2e 25-ceiling
# C3), 4 MiB let an idle borrower's few charges fit under its MemoryMax, so it lived on while an
# owner's growth left the node short, until the kernel's global OOM killer came 57 s later with PID
# 1 stalled 17.7 s on its own page faults; at the usage, its next charge OOM-kills it in its own
# context within moments. The price: a page charged between our read and the write turns the write
# into one below the usage (docs/DESIGN.md, "Lines that follow usage").
GUARD = 0
# Looks: LOOK_FIRST after a look that moved something, twice as long each time nothing moved, up
# to LOOK_MOST while a line lends, LOOK_IDLE while none does (look_most; agenda.follow); a stall in
# kubepods.slice wakes a look at once, so an owner growing into what was lent is found when its
# tasks first stall, not by the backed-off look. (docs/DESIGN.md, "Lines that follow usage")
LOOK_FIRST = 1.0
LOOK_MOST = 30.0
LOOK_IDLE = 60.0


def quantum(alloc: int, page_size: int) -> int:
    """The grid the lines move on: 1/256 of allocatable, at least 16 MiB, whole pages."""
    return page_up(max(16 * MIB, alloc // 256), page_size)


def slack_min(request: int) -> int:
    return max(SLACK_FLOOR, request // SLACK_SHARE)


@dataclass(frozen=True)
class Owner:
    """A pod with a memory request (Guaranteed or Burstable), as the plan has it."""

    unit: str  # its pod slice
    request: int  # bytes, overhead included (PodRequests)
    lever: int | None = None  # a Burstable pod the lever covers: its static line (plan.Lever.memory_high)
    kep: int | None = None  # ... and the MemoryHigh the KEP gives it (infinity without a pod-level limit)


@dataclass(frozen=True)
class Seen:
    """What the read stage saw of one pod slice (None: could not be read)."""

    usage: int | None  # memory.current
    low: int | None = None  # memory.events `low`, cumulative
    stall: int | None = None  # memory.pressure `some` total, µs, cumulative


@dataclass(frozen=True)
class Look:
    """What `draw` keeps of one owner from one look to the next."""

    at: float
    usage: int
    low: int | None
    stall: int | None
    pressed_until: float = float("-inf")


@dataclass(frozen=True)
class State:
    """What `draw` keeps between looks: each owner's last look, and the lines it drew."""

    owners: Mapping[str, Look] = field(default_factory=lambda: MappingProxyType({}))
    ceiling: int | None = None
    levers: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class Lent:
    """One line as drawn: its value, the line with every request reserved whole, and what it lends."""

    unit: str
    value: int
    static: int

    @property
    def lent(self) -> int:
        return max(0, self.value - self.static)


@dataclass(frozen=True)
class Lines:
    ceiling: Lent | None  # the BestEffort ceiling (None: not asked for)
    levers: tuple[Lent, ...]  # one per lever pod, in the owners' order
    reserved: int  # Σ reserve + borrowed over the owners
    pressed: frozenset[str]  # the owners pressed now
    moved: bool  # a line moved, an owner grew or shrank by a grid step, or one was pressed: look again soon

    def lever(self, unit: str) -> Lent | None:
        return next((lv for lv in self.levers if lv.unit == unit), None)


def look_most(lines: Lines | None) -> float:
    """How far the looks may back off: LOOK_MOST while a line lends (the owners may want it back),
    LOOK_IDLE while none does (nothing to take back: a look can only find more to lend)."""
    if lines is None:
        return LOOK_MOST
    lends = (lines.ceiling is not None and lines.ceiling.lent > 0) or any(lv.lent > 0 for lv in lines.levers)
    return LOOK_MOST if lends or lines.pressed else LOOK_IDLE


def reserve(owner: Owner, seen: Seen | None, pressed: bool, rate: float) -> tuple[int, int]:
    """(reserve, borrowed) of one owner (see the module)."""
    if seen is None or seen.usage is None:
        return owner.request, 0
    usage = seen.usage
    borrowed = max(0, usage - owner.request)
    if pressed:
        return owner.request, borrowed
    slack = max(slack_min(owner.request), int(rate * HORIZON))
    return min(owner.request, usage + slack), borrowed


def _hold(raw: int, held: int | None, q: int) -> int:
    """A line on the grid: lowered at once when `raw` passes below what is `held`, raised only
    once `raw` leaves two grid steps more (no write for jitter under a step)."""
    point = raw // q * q
    if held is None or raw < held or raw >= held + 2 * q:
        return point
    return held


def _pressed(owner: Owner, seen: Seen | None, before: Look | None, now: float) -> tuple[bool, float]:
    """Whether `owner` is pressed now, and until when it stays so."""
    until = before.pressed_until if before is not None else float("-inf")
    if seen is None or seen.usage is None or before is None or seen.usage >= owner.request:
        return now < until, until
    hit = seen.low is not None and before.low is not None and seen.low > before.low
    dt = now - before.at
    if not hit and dt > 0 and seen.stall is not None and before.stall is not None:
        hit = (seen.stall - before.stall) / 1e6 >= PRESS_STALL * dt
    if hit:
        until = now + PRESS_HOLD
    return now < until, until


def draw(owners: tuple[Owner, ...], seen: Mapping[str, Seen], *, alloc: int, headroom: int,
         ceiling: tuple[str, int] | None, page_size: int, state: State, now: float) -> tuple[Lines, State]:
    """The lines for this look, and the state for the next. `ceiling`: the BestEffort QoS slice
    and the ceiling's minimum (None: no ceiling asked for); `seen`: unit -> what was read (a unit
    left out is taken as unreadable: its whole request reserved)."""
    q = quantum(alloc, page_size)
    parts: dict[str, int] = {}
    looks: dict[str, Look] = {}
    pressed: set[str] = set()
    moved = False
    for o in owners:
        s = seen.get(o.unit)
        before = state.owners.get(o.unit)
        is_pressed, until = _pressed(o, s, before, now)
        rate = 0.0
        if s is not None and s.usage is not None and before is not None and now > before.at:
            rate = max(0.0, (s.usage - before.usage) / (now - before.at))
            moved |= abs(s.usage - before.usage) >= q
        if is_pressed:
            pressed.add(o.unit)
            moved |= not (before is not None and now < before.pressed_until)
        r, b = reserve(o, s, is_pressed, rate)
        parts[o.unit] = r + b
        if s is not None and s.usage is not None:
            looks[o.unit] = Look(now, s.usage, s.low, s.stall, until)
    total = sum(parts.values())
    requests = sum(o.request for o in owners)
    drawn = None
    if ceiling is not None:
        unit, minimum = ceiling
        floor = page_up(minimum, page_size)
        value = max(floor, _hold(alloc - headroom - total, state.ceiling, q))
        static = max(floor, (alloc - headroom - requests) // page_size * page_size)
        drawn = Lent(unit, value, static)
        moved |= value != state.ceiling
    levers = []
    held_levers = {}
    for o in owners:
        if o.lever is None:
            continue
        others = total - parts[o.unit]
        # Never below its static line; never above what the KEP gives it (the plan lowered it from that).
        value = max(o.lever, _hold(alloc - headroom - others, state.levers.get(o.unit), q))
        value = min(value, o.kep) if o.kep is not None else value
        levers.append(Lent(o.unit, value, o.lever))
        held_levers[o.unit] = value
        moved |= value != state.levers.get(o.unit)
    lines = Lines(drawn, tuple(levers), total, frozenset(pressed), moved)
    return lines, State(MappingProxyType(looks), drawn.value if drawn else None, MappingProxyType(held_levers))
