"""The pressure guard at work: its counters read, its state kept, its value laid on the plan.

guard.py decides, purely; this is the guard's side of the daemon, so that the daemon only wires
it to its loop, its journal and its metrics:
* `tick` reads the counters (`Cgroupfs.guard_counters`) and lets `guard.decide` say whether the
  BestEffort QoS slice's MemoryHigh changes;
* `watch` keeps the kernel's notification that the protected (Burstable QoS) slice's memory.events
  changed (`Cgroupfs.guard_notifier`) registered with the event loop, while the guard is on;
* `overlay` lays the guard's value on a plan, so it goes out through the same diff and apply as
  every other write (D-Bus, systemd); the guard writes nothing itself;
* `release` is the one change a stopping daemon sends to lift the guard's throttle.
"""

from __future__ import annotations

import asyncio
from typing import Callable

from .cgroupfs import Cgroupfs
from .guard import Action, GuardSettings, GuardState, Reading, decide, overlay
from .naming import Naming
from .plan import INFINITY, Plan
from .reconcile import Change

__all__ = ["GuardWatch"]


class GuardWatch:
    def __init__(self, cgroupfs: Cgroupfs):
        self.cgroupfs = cgroupfs
        self.state = GuardState()
        self._overlaid: tuple[Plan, int, Plan] | None = None  # (plan, guard's value, overlaid plan)
        self._notifier = None  # cgroupfs.guard_notifier's epoll set, while registered with the loop
        self._notifier_fd = -1

    @property
    def high(self) -> int | None:
        """The guard's MemoryHigh for the BestEffort QoS slice; None: the planner's (infinity)."""
        return self.state.high

    @property
    def notified(self) -> bool:
        """The kernel's notification is registered: the timer need not poll (agenda.guard_interval)."""
        return self._notifier is not None

    def tick(self, s: GuardSettings, naming: Naming, now: float, *, holding: bool, capacity: int,
             page_size: int) -> Action | None:
        """Read the counters and decide; the action when the BestEffort slice's MemoryHigh changes."""
        if not s.enabled and not self.state.engaged:
            self.state = GuardState()
            self.cgroupfs.close_kept()  # (nothing open: nothing to do)
            return None
        low = stall = usage = None
        if s.enabled:
            low, stall, usage = self.cgroupfs.guard_counters(naming.qos_slice("Burstable"),
                                                             naming.qos_slice("BestEffort"))
        self.state, action = decide(self.state, Reading(now, low, stall, usage), s, holding=holding,
                                    capacity=capacity, page_size=page_size)
        return action

    def watch(self, enabled: bool, naming: Naming, on_event: Callable[[], None]) -> None:
        """Keep the notifier of the protected slice's memory.events registered with the running
        loop while the guard is on (made again when its file was opened again), none while off."""
        notifier = self.cgroupfs.guard_notifier(naming.qos_slice("Burstable")) if enabled else None
        if notifier is self._notifier:
            return
        self.unwatch()
        self._notifier = notifier
        if notifier is not None:
            self._notifier_fd = notifier.fileno()
            asyncio.get_running_loop().add_reader(self._notifier_fd, on_event)

    def unwatch(self) -> None:
        if self._notifier is not None:
            asyncio.get_running_loop().remove_reader(self._notifier_fd)
            self._notifier = None

    def overlay(self, desired: Plan, naming: Naming) -> Plan:
        """The plan with the guard's MemoryHigh on the BestEffort QoS slice (the same object while
        it is not engaged; the same overlaid one while neither changes)."""
        high = self.state.high
        if high is None:
            return desired
        if self._overlaid is None or self._overlaid[0] is not desired or self._overlaid[1] != high:
            self._overlaid = (desired, high, overlay(desired, naming.qos_slice("BestEffort"), high))
        return self._overlaid[2]

    def release(self, naming: Naming) -> Change | None:
        """The change that lifts an engaged guard's throttle (the planner's infinity); None if not engaged."""
        if not self.state.engaged:
            return None
        return Change(naming.qos_slice("BestEffort"), "qos", {"MemoryHigh": INFINITY}, "grow")

    def released(self) -> None:
        self.state = GuardState()
