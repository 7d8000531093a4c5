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

`guard`: how far above the usage a step stops (0 for both lines today: lending.GUARD says why). A
line that follows usage (lending.py) takes back what it lent by the same steps, never below the
usage. No MemoryHigh goes below the usage either: a memory.high write reclaims in the writer too,
for as long as reclaim makes progress (`memory_high_write`). Measured (e2e 25-ceiling C3): one
SetUnitProperties that lowered MemoryHigh 32 MiB below the usage and set MemoryMax at the usage
read found the slice a page above it by the write; PID 1 invoked the OOM killer in
`memory_max_write` and answered no one for 4.0 s.

Like plan.py: no I/O, no clock, no globals; tests/unit/test_ceiling.py is its table.
"""

from __future__ import annotations

from dataclasses import dataclass

from .quantity import UINT64_MAX as INFINITY, page_up

__all__ = ["Step", "step", "FOLLOW_FIRST", "FOLLOW_MAX"]

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


def step(target: int, held: int | None, usage: int | None, page_size: int, guard: int = 0) -> Step:
    """The MemoryMax (or MemoryHigh) to send towards `target` (the plan's), given what systemd
    `held` (None: not known, taken as infinity, the default) and the cgroup's `usage`
    (memory.current; None: not readable); a step stops `guard` above the usage (see the module)."""
    held = INFINITY if held is None else held
    if target >= held:
        return Step(target, False)  # a raise (or nothing): the kernel reclaims nothing
    if usage is None:
        return Step(held, True)
    at = page_up(usage, page_size)  # the usage, up to a page
    if at <= target:
        return Step(target, False)
    return Step(min(at + page_up(guard, page_size), held), True)
