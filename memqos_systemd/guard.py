"""The BestEffort pressure guard: when to lower kubepods-besteffort.slice's MemoryHigh. Pure.

Why it exists (docs/DESIGN.md, "The pressure guard"; measured in docs/BENCHMARKS.md): memory.low
yields before the OOM killer acts, so a BestEffort pod that allocates anonymous memory until the
OOM killer comes takes a Burstable pod's protected page cache first (0 % kept under
TieredReservation), and the kubelet's eviction, on a 10 s housekeeping loop, comes too late. The
guard watches the protected slice's `low` count (memory.events: reclaim below memory.low) and,
while it rises and BestEffort pods hold memory, caps the BestEffort QoS slice's MemoryHigh at what
those pods hold, then lower step by step: the kernel reclaims and throttles them first. Once the
count has been still (and memory.pressure calm) for `releaseAfter`, MemoryHigh is raised step by
step until it is the planner's value again (infinity).

Like plan.py: no I/O, no clock (`Reading.now` is passed in), no globals. `decide` takes the state
and one reading and returns the next state and, when the value in force changes, the `Action` (one
journal line and one metric each, guard_watch.py); its settings are config.GuardSettings. `overlay` puts the value into a plan, so that the
value goes out through the same diff and apply as every other write (D-Bus, systemd): the guard
writes nothing itself, and it never names a unit other than the BestEffort QoS slice.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .config import GuardSettings
from .plan import INFINITY, Plan

__all__ = ["Reading", "GuardState", "Action", "decide", "overlay"]

MIB = 1 << 20


@dataclass(frozen=True)
class Reading:
    now: float  # the daemon's clock (monotonic seconds)
    low: int | None  # the protected slice's memory.events `low` (cumulative); None: unreadable
    stall_us: int | None  # its memory.pressure `some` total (µs, cumulative); None: no PSI
    besteffort: int | None  # the BestEffort QoS slice's memory.current; None: unreadable


@dataclass(frozen=True)
class GuardState:
    high: int | None = None  # the guard's MemoryHigh in force; None: the planner's (infinity)
    low: int | None = None  # the counters at the last reading
    stall_us: int | None = None
    at: float | None = None  # when the last reading was taken
    calm_since: float | None = None  # since when nothing pressed (while engaged)
    changed_at: float = float("-inf")  # when `high` last changed

    @property
    def engaged(self) -> bool:
        return self.high is not None


@dataclass(frozen=True)
class Action:
    kind: str  # "lower" | "raise" | "clear" (back to the planner's value)
    high: int | None  # the new value; None for "clear"
    why: str  # one line for the journal


def decide(state: GuardState, r: Reading, s: GuardSettings, *, holding: bool, capacity: int,
           page_size: int = 4096) -> tuple[GuardState, Action | None]:
    """The next state, and the action when the BestEffort slice's MemoryHigh is to change.

    A first reading, or a counter that went back (its cgroup was made again), only sets the
    baseline. While the daemon holds (suspect pod data) nothing changes. A disabled guard that is
    engaged clears at once."""
    if not s.enabled:
        if state.engaged:
            return GuardState(), Action("clear", None, "the pressure guard was turned off")
        return GuardState(), None
    low_d = r.low - state.low if r.low is not None and state.low is not None and r.low >= state.low else 0
    stall = None
    if r.stall_us is not None and state.stall_us is not None and state.at is not None and r.now > state.at \
            and r.stall_us >= state.stall_us:
        stall = (r.stall_us - state.stall_us) / 1e6 / (r.now - state.at)
    nxt = dataclasses.replace(state, low=r.low, stall_us=r.stall_us, at=r.now)
    if holding:
        return nxt, None
    usage = r.besteffort
    if low_d >= s.low_events and usage is not None and usage >= s.min_besteffort:
        nxt = dataclasses.replace(nxt, calm_since=None)
        if state.high is None:
            target = usage  # stop it growing: what it holds now
        elif r.now - state.changed_at < s.interval:
            return nxt, None  # one step an interval (the kernel may notify every 20 ms)
        else:
            target = min(state.high, usage) - int(s.step * usage)
        target = max(target, s.floor) // page_size * page_size
        current = INFINITY if state.high is None else state.high
        if target >= current:
            return nxt, None  # already there (at the floor)
        why = (f"{low_d} low event(s) in the protected slice in {_secs(None if state.at is None else r.now - state.at)}, BestEffort holds"
               f" {_mib(usage)}")
        return dataclasses.replace(nxt, high=target, changed_at=r.now), Action("lower", target, why)
    if state.high is None:
        return nxt, None
    if low_d or (stall is not None and stall >= s.calm_pressure):
        return dataclasses.replace(nxt, calm_since=None), None
    calm_since = state.calm_since if state.calm_since is not None else r.now
    nxt = dataclasses.replace(nxt, calm_since=calm_since)
    if r.now - calm_since < s.release_after or r.now - state.changed_at < s.release_every:
        return nxt, None
    raised = (state.high + max(int(state.high * s.release_step), page_size)) // page_size * page_size
    if raised >= capacity:
        return (dataclasses.replace(nxt, high=None, changed_at=r.now),
                Action("clear", None, f"calm for {_secs(r.now - calm_since)}: back to the planner's value"))
    return (dataclasses.replace(nxt, high=raised, changed_at=r.now),
            Action("raise", raised, f"calm for {_secs(r.now - calm_since)}, BestEffort holds {_mib(usage)}"))


def overlay(plan: Plan, unit: str, high: int | None) -> Plan:
    """`plan` with the BestEffort QoS slice `unit`'s MemoryHigh at most `high` (the same object
    when the guard is not engaged). Only that unit changes."""
    if high is None:
        return plan
    units = tuple(dataclasses.replace(u, memory_high=min(u.memory_high, high)) if u.unit == unit and u.level == "qos"
                  else u for u in plan.units)
    return dataclasses.replace(plan, units=units)


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / MIB:.0f} MiB"


def _secs(t: float | None) -> str:
    return "?" if t is None else f"{t:.2f} s"
