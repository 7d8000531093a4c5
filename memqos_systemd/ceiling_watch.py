"""The BestEffort ceiling at work, the first feature (feature.py, one line of features.py): its
steps laid on the plan, its ledger kept, a rival writer heeded.

plan.py plans the ceiling (`besteffort_ceiling`) and ceiling.py decides, purely, how far one write
may lower it; this is the ceiling's side of a round, so that the round only calls it:
* `units` are the units whose MemoryMax is ours, which the observer reads with the other three
  (`Observer.max_units`, through features.owned): the BestEffort QoS slice while the ceiling is
  on, and every slice of the ledger until it holds infinity again;
* `overlay` lays on the plan the MemoryMax to send now: the plan's, or a step towards it that never
  goes below the slice's usage (read through cgroupfs.py only then), or infinity where the ceiling
  is off and a MemoryMax of ours is left (a reload turned it off, or the service was stopped
  meanwhile). Before the first value other than infinity goes out, the slice enters the ledger
  (CEILINGS_PATH, a ledger.OwnedSlices, in /run like systemd's runtime properties), so `reset`, `apt remove` and the
  DaemonSet's uninstall know to put infinity back, and leave a MemoryMax someone else set alone;
* `settle`, after the apply, drops from the ledger what holds infinity again, says in the journal
  when a step-down starts and ends, and sets the ceiling's metric;
* `look_again`: while a step stopped above the plan for the usage, a round again soon after a
  step that moved, later each time nothing moved (ceiling.FOLLOW_FIRST, agenda.follow);
* `stand_down` (`on_drift`): someone else changed that MemoryMax (the kubelet's QOSReserved rewrites it every
  minute, kubelet_gate.py): the ceiling is left to them, said once, until the config is reloaded
  or the service restarted. Two writers are never left to fight.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Collection, Mapping

from .agenda import Look, follow
from .ceiling import FOLLOW_FIRST, FOLLOW_MAX, step
from .cgroupfs import Cgroupfs
from .config_schema import Config
from .feature import Context
from .ledger import DEFAULT_PATH, OwnedSlices
from .metrics import NoMetrics
from .naming import Naming
from .plan import INFINITY, Plan, qos_reserved_writer
from .quantity import format_bytes
from .reconcile import UNREAD
from .quantity import show_value

__all__ = ["CeilingWatch", "ceiling_units", "CEILINGS_PATH", "CEILING_LEDGER"]

# The slices whose MemoryMax the daemon set (its ledger), beside the reserved slices' (ledger.py).
CEILINGS_PATH = DEFAULT_PATH.with_name("ceiling-slices")
CEILING_LEDGER = "ceiling ledger"  # what the journal calls it

log = logging.getLogger("memqos_systemd")


def ceiling_units(ledger: Collection[str], naming: Naming, config: Config) -> frozenset[str]:
    """The units whose MemoryMax is ours: the slices of the ceiling's ledger (`ledger`), and the
    BestEffort QoS slice while the ceiling is on and not left to the kubelet's QOSReserved by its
    config (in case the ledger could not be written). For the daemon, `apply`, `reset` and `status`
    alike: a MemoryMax that is not ours is never read as ours nor taken back."""
    on = config.best_effort_ceiling.enabled and qos_reserved_writer(config) is None
    return frozenset(set(ledger) | ({naming.qos_slice("BestEffort")} if on else set()))


class CeilingWatch:
    name = "bestEffortCeiling"
    properties = ("MemoryMax",)

    @classmethod
    def made(cls, context: Context) -> CeilingWatch:
        """The ceiling of the feature table (features.py): its ledger in `context.state_dir`."""
        path = context.state_dir / CEILINGS_PATH.name if context.state_dir is not None else None
        return cls(context.cgroupfs, path, context.page_size, context.metrics, write_ledger=context.write)

    def __init__(self, cgroupfs: Cgroupfs, ledger_path: Path | None, page_size: int, metrics=None, *,
                 write_ledger: bool = True):
        self.cgroupfs = cgroupfs
        self.ledger = OwnedSlices(ledger_path, CEILING_LEDGER, write=write_ledger)  # read-only: a dry run
        self.page_size = page_size
        self.metrics = metrics or NoMetrics()
        self.following = False  # the last overlay stopped above the plan for the slice's usage
        self.moved = False  # the last overlay's value differs from the one before
        self._sent: int | None = None  # the last overlay's value (None: none)
        self._target: int | None = None  # the last overlay's aim (the plan's, or infinity to take ours back)
        self._stood_down: Config | None = None  # the config under which a rival writer was found
        self._overlaid: tuple[Plan, int | None, Plan] | None = None  # (plan, value, overlaid plan)
        self._look = Look()  # when to look at the slice's usage again (look_again)

    def units(self, naming: Naming, config: Config) -> frozenset[str]:
        """The units whose MemoryMax is ours to read (`ceiling_units`)."""
        return ceiling_units(self.ledger.names, naming, config)

    def overlay(self, desired: Plan, observed: Mapping[str, Mapping[str, int] | None], config: Config,
                naming: Naming) -> Plan:
        """The plan with the MemoryMax to send now on the BestEffort QoS slice (see the module)."""
        unit = naming.qos_slice("BestEffort")
        held_values = observed.get(unit)
        held = None if held_values is None or held_values is UNREAD else held_values.get("MemoryMax")
        stood_down = self._stood_down is config
        target = None if desired.ceiling is None or stood_down else desired.ceiling.memory_max
        if target is None and unit in self.ledger.names and not stood_down and held not in (None, INFINITY):
            target = INFINITY  # ours, and no longer planned: take it back
        value = usage = None
        self.following = False
        if target is not None:
            usage = self.cgroupfs.usage(unit) if target < (INFINITY if held is None else held) else None
            guard = desired.ceiling.guard if desired.ceiling is not None and target == desired.ceiling.memory_max else 0
            s = step(target, held, usage, self.page_size, guard)
            value, self.following = s.value, s.following
            if value != INFINITY:
                self.ledger.add(unit)  # before the write: reset must know, whatever happens next
        self.moved = value != self._sent
        self._log_step(unit, target, value, usage)
        self._sent, self._target = value, target
        return self._with(desired, unit, value)

    def _log_step(self, unit: str, target: int | None, value: int | None, usage: int | None) -> None:
        if target is None or target == INFINITY or value is None:
            return
        was_following = self._sent is not None and self._target is not None and self._sent > self._target
        if self.following and not was_following:
            log.info("BestEffort ceiling: %s uses %s, more than its planned MemoryMax %s: stepping MemoryMax down"
                     " with its usage, never below it in one write (a lower write would make systemd reclaim and"
                     " OOM-kill for us)", unit, _size(usage), _size(target))
        elif was_following and value == target:
            log.info("BestEffort ceiling: %s at its planned MemoryMax %s", unit, _size(target))

    def _with(self, desired: Plan, unit: str, value: int | None) -> Plan:
        """`desired` with `unit`'s MemoryMax `value` (None: none of ours); the same object when it
        has that already, the same overlaid one while neither changes."""
        current = next((u for u in desired.units if u.unit == unit and u.level == "qos"), None)
        if current is None or current.memory_max == value:
            return desired
        if self._overlaid is None or self._overlaid[0] is not desired or self._overlaid[1] != value:
            units = tuple(dataclasses.replace(u, memory_max=value) if u is current else u for u in desired.units)
            self._overlaid = (desired, value, dataclasses.replace(desired, units=units))
        return self._overlaid[2]

    def settle(self, observed: Mapping[str, Mapping[str, int] | None], desired: Plan) -> None:
        """After a round's apply: a slice of the ledger that holds infinity again, or is gone (its
        runtime properties with it), leaves the ledger; the ceiling's metric."""
        for name in sorted(self.ledger.names):
            values = observed.get(name)
            if values is None or (values is not UNREAD and values.get("MemoryMax") == INFINITY
                                  and self._sent in (None, INFINITY)):
                self.ledger.discard(name)
        planned = desired.ceiling.memory_max if desired.ceiling is not None else None
        held = None
        if desired.ceiling is not None:
            values = observed.get(desired.ceiling.unit)
            held = None if values is None or values is UNREAD else values.get("MemoryMax")
        self.metrics.besteffort_ceiling(planned, held)

    @property
    def pending(self) -> bool:
        """The last overlay stopped above the plan for the slice's usage: look again (feature.py)."""
        return self.following

    def look_again(self, now: float, planned: bool = True) -> float:
        """When to look at the slice's usage again (infinity: not following; `planned` False: the
        round could not plan, and a past look would spin)."""
        self._look = follow(self._look, now, planned and self.following, self.moved, FOLLOW_FIRST, FOLLOW_MAX)
        return self._look.at

    notifier = None  # nothing to watch (feature.py)

    def woken(self, now: float) -> float:
        return float("inf")

    def on_drift(self, unit: str, before: Mapping[str, int], now: Mapping[str, int], config: Config) -> frozenset[str]:
        """The feature's side of a change made without us (feature.py): MemoryMax, when `stand_down` takes it."""
        return frozenset(self.properties) if self.stand_down(unit, before, now, config) else frozenset()

    def stand_down(self, unit: str, before: Mapping[str, int], now: Mapping[str, int], config: Config) -> bool:
        """A read found `unit`'s MemoryMax changed without us. True when that is the ceiling's
        (then said here, once until the config is reloaded); the ceiling leaves it alone from now on."""
        if "MemoryMax" not in before or "MemoryMax" not in now or before["MemoryMax"] == now["MemoryMax"]:
            return False
        if self._stood_down is config:
            return True
        self._stood_down = config
        log.warning("%s: MemoryMax %s -> %s changed without us, likely the kubelet's QOSReserved (with its QOSReserved"
                    " feature gate on and qosReserved.memory set it writes this slice's MemoryMax every minute):"
                    " the BestEffort ceiling stands down and leaves MemoryMax to it until the service is reloaded or"
                    " restarted; fix: turn one of the two off (memqos-systemd check names the kubelet's settings)",
                    unit, show_value(before["MemoryMax"]), show_value(now["MemoryMax"]))
        return True


def _size(n: int | None) -> str:
    return "?" if n is None else f"{n} ({format_bytes(n)})"
