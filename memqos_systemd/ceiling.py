"""The BestEffort ceiling's way down: how far its MemoryMax may go in one write. Pure.

plan.py says where the ceiling should be (`besteffort_ceiling`). Getting there is another matter
when the BestEffort QoS slice already uses more than that: writing a memory.max below a cgroup's
usage makes the *writer* reclaim the difference, and OOM-kill in the cgroup when reclaim cannot,
before the write returns (mm/memcontrol.c, `memory_max_write`). Through D-Bus the writer is
systemd, PID 1: while it reclaims, every unit's start and stop on the node waits.

So MemoryMax is never lowered below the slice's usage in one write. `step` sends the plan when the
slice's usage (memory.current, rounded up to a page) is at or below it; otherwise it steps down to
the usage and follows it (the caller looks again: FOLLOW_FIRST, FOLLOW_MAX below). At the step,
the slice cannot grow: a BestEffort process that allocates then reclaims its own cache and, with
none left, is OOM-killed by the kernel in its own context, inside the slice; every page it frees
lets the next step go lower, until the plan is reached. This is what the kubelet's QOSReserved
does on its minute timer (`retrySetMemoryReserve`: the limit at the usage "to put pressure on the
cgroup and prevent further growth"), except that the kubelet first writes the target itself, which
on cgroup v2 is the very write that makes the writer reclaim.

A raise, or a lowering to a value at or above the usage, is sent at once. No usage known (the
slice's cgroup cannot be read): nothing is lowered until it can be.

`take`: how far one write may go below the usage (0: never; the MemoryMax of the ceiling, static or
following usage, always 0). Only a MemoryHigh goes below the usage: writing memory.high below a
cgroup's usage also makes the writer reclaim, but the kernel gives up after a few tries without
progress and never OOM-kills (mm/memcontrol.c, `memory_high_write`, Linux 5.9+), so a bounded step
bounds what PID 1 reclaims in its write. A MemoryMax below the usage is the write that OOM-kills in
the writer's context: PID 1 stalled 5.0 s and 16.5 s in it (docs/DESIGN.md, "Lines that follow
usage").

`take_back`: how a line that follows usage (lending.py) takes back what BestEffort borrowed when
the owners of requests grow into it. The BestEffort slice's MemoryMax steps as above (never below
its usage) while its MemoryHigh goes down to the line, at most `take` below the usage in one write:
the borrower then reclaims its own page cache, throttled, in its own context whenever it charges
memory, the kernel's global reclaim takes its unprotected memory first when an owner needs it, and
each page that goes lets the MemoryMax follow it down. Once the usage is at the line, the MemoryMax
holds it there and the MemoryHigh goes back to infinity.

Like plan.py: no I/O, no clock, no globals; tests/unit/test_ceiling.py is its table.
"""

from __future__ import annotations

from dataclasses import dataclass

from .quantity import UINT64_MAX as INFINITY, page_up

__all__ = ["Step", "step", "take_back", "FOLLOW_FIRST", "FOLLOW_MAX"]

# The step follows the slice's usage, never below it: the usage is looked at again FOLLOW_FIRST
# after a step that moved, then twice as long each time nothing moved, up to FOLLOW_MAX
# (agenda.follow). An allocating BestEffort process at the step is OOM-killed in its own context
# within moments, and the next step follows within a second; a BestEffort pod that holds what it
# has and does nothing costs a round every 30 s, not every second (a round with nothing to send is
# most of an idle hour's CPU, bench/idle_profile.py). The kubelet's QOSReserved looks every minute.
FOLLOW_FIRST = 1.0
FOLLOW_MAX = 30.0


@dataclass(frozen=True)
class Step:
    value: int  # the MemoryMax to hold now (what systemd holds already: nothing to send)
    following: bool  # the usage keeps it above the plan: look at the usage again soon


def step(target: int, held: int | None, usage: int | None, page_size: int, take: int = 0) -> Step:
    """The MemoryMax (or MemoryHigh) to send towards `target` (the plan's), given what systemd
    `held` (None: not known, taken as infinity, the default) and the cgroup's `usage`
    (memory.current; None: not readable); at most `take` below the usage (see the module)."""
    held = INFINITY if held is None else held
    if target >= held:
        return Step(target, False)  # a raise (or nothing): the kernel reclaims nothing
    if usage is None:
        return Step(held, True)
    floor = max(0, page_up(usage, page_size) - take // page_size * page_size)  # the usage, up to a page; less `take`
    if floor <= target:
        return Step(target, False)
    return Step(min(floor, held), True)


def take_back(line: int, held: int | None, usage: int | None, page_size: int, take: int) -> Step:
    """The MemoryHigh to hold on the BestEffort slice while its MemoryMax steps down to `line` (a
    line that follows usage; see the module). `held`: the MemoryHigh systemd holds (None: infinity);
    `usage`: the slice's memory.current (None: not readable). Infinity once the usage is at or below
    the line; above it, at most `take` below the usage, never below the line, and lower than what
    is held only once the usage is within `take` of it (a MemoryHigh the borrower could not be
    reclaimed to is not written lower: PID 1 would only retry the reclaim)."""
    held = INFINITY if held is None else held
    if usage is None:
        return Step(max(held, line), True)  # nothing lowered; a raise to the line goes at once
    at = page_up(usage, page_size)
    if at <= line:
        return Step(INFINITY, False)
    floor = max(0, at - take // page_size * page_size)
    return Step(max(line, min(held, floor)), True)
