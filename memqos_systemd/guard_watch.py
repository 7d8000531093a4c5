"""The pressure guard at work: its counters read, its state kept, its value laid on the plan.

guard.py decides, purely; this is the guard's side of the daemon, so that the daemon only wires
it to its loop, its journal and its metrics:
* `tick` reads the counters (`Cgroupfs.guard_counters`) and lets `guard.decide` say whether the
  BestEffort QoS slice's MemoryHigh changes;
* `watch` keeps the kernel's notification that the protected (Burstable QoS) slice's memory.events
  changed (`Cgroupfs.guard_notifier`) registered with the event loop, while the guard is on;
* its value (`high`) is laid on the plan by the round (round.Inputs.guard_high), so it goes out
  through the same diff and apply as every other write (D-Bus, systemd); the guard writes nothing
  itself;
* `release` is the one change a stopping daemon sends to lift the guard's throttle.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from .cgroupfs import Cgroupfs
from .config import GuardSettings
from .guard import GuardState, Reading, decide
from .naming import Naming
from .plan import INFINITY
from .reconcile import Change
from .systemd import SystemdError

__all__ = ["GuardWatch"]

log = logging.getLogger("memqos_systemd")


class GuardWatch:
    def __init__(self, cgroupfs: Cgroupfs):
        self.cgroupfs = cgroupfs
        self.state = GuardState()
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
             page_size: int, metrics=None) -> bool:
        """Read the counters and decide; True when the BestEffort slice's MemoryHigh changes (one
        journal line and a metric: it goes out with the next round, which the plan carries)."""
        if not s.enabled and not self.state.engaged:
            self.state = GuardState()
            self.cgroupfs.close_kept()  # (nothing open: nothing to do)
            return False
        low = stall = usage = None
        if s.enabled:
            low, stall, usage = self.cgroupfs.guard_counters(naming.qos_slice("Burstable"),
                                                             naming.qos_slice("BestEffort"))
        self.state, action = decide(self.state, Reading(now, low, stall, usage), s, holding=holding,
                                    capacity=capacity, page_size=page_size)
        if action is None:
            return False
        value = "infinity (the planner's value)" if action.high is None else f"{action.high} ({action.high >> 20} MiB)"
        log.info("pressure guard: %s MemoryHigh of %s to %s: %s", action.kind, naming.qos_slice("BestEffort"),
                 value, action.why)
        if metrics is not None:
            metrics.guard_action(action.kind, action.high)
        return True

    def schedule(self, s: GuardSettings) -> tuple[bool, float, bool, bool]:
        """What the agenda schedules the guard's next tick by (Agenda.guard_interval)."""
        return s.enabled, s.interval, self.state.engaged, self.notified

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

    def release(self, naming: Naming) -> Change | None:
        """The change that lifts an engaged guard's throttle (the planner's infinity); None if not engaged."""
        if not self.state.engaged:
            return None
        return Change(naming.qos_slice("BestEffort"), "qos", {"MemoryHigh": INFINITY}, "grow")

    def released(self) -> None:
        self.state = GuardState()

    async def release_on_stop(self, applier, systemd, naming: Naming, metrics) -> None:
        """A stopping daemon leaves protections in place, but not a throttle of the guard's: nobody
        would lift it. One write puts the BestEffort QoS slice's MemoryHigh back to the planner's."""
        release = self.release(naming)
        if release is None or applier is None or systemd is None or not systemd.connected:
            return
        unit = release.unit
        try:
            result = await asyncio.wait_for(applier.apply([release]), timeout=10)
        except (SystemdError, asyncio.TimeoutError) as e:
            log.warning("pressure guard: could not put MemoryHigh of %s back to infinity on stop: %s", unit, e)
            return
        if result.ok:
            self.released()
            metrics.guard_action("clear", None)
            log.info("pressure guard: clear MemoryHigh of %s to infinity (the planner's value): the service stops", unit)
        else:
            log.warning("pressure guard: could not put MemoryHigh of %s back to infinity on stop: %s", unit, result.error)
