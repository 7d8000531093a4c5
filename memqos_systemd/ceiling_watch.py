"""The BestEffort ceiling at work, the first feature (feature.py, one line of features.py): its
steps laid on the plan, its ledger kept, a rival writer heeded.

Its pure plan step (`plan_step`, with `planned_ceiling`, over plan.besteffort_ceiling) plans the
ceiling after plan.plan, in the round, `plan` and `status` alike, and ceiling.py decides, purely,
how far one write may lower it; this is the ceiling's side of a round, so that the round only calls it:
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
from . import columns
from .cgroup_tree import cgroup_path
from .cgroupfs import Cgroupfs, read_memory_events, read_value
from .face import WIDTH, count, human, show_bytes
from .config_schema import Config
from .feature import Context, Family, Given, NoGauges, gauge_value
from .ledger import DEFAULT_PATH, OwnedSlices
from .naming import Naming
from .plan import (INFINITY, MAX_BYTES, Ceiling, Plan, besteffort_ceiling, ceiling_misfits,
                   qos_reserved_writer)
from .quantity import format_bytes
from .reconcile import UNREAD
from .quantity import show_value

__all__ = ["CeilingWatch", "ceiling_units", "CEILINGS_PATH", "CEILING_LEDGER"]

# The slices whose MemoryMax the daemon set (its ledger), beside the reserved slices' (ledger.py).
CEILINGS_PATH = DEFAULT_PATH.with_name("ceiling-slices")
CEILING_LEDGER = "ceiling ledger"  # what the journal calls it

log = logging.getLogger("memqos_systemd")

QOS_RESERVED_FIX = ("turn one of the two off: bestEffortCeiling: {enabled: false} here, or the kubelet's QOSReserved"
                    " (featureGates: {QOSReserved: false}, or no memory in qosReserved, in its config) and restart it")


def ceiling_units(ledger: Collection[str], naming: Naming, config: Config) -> frozenset[str]:
    """The units whose MemoryMax is ours: the slices of the ceiling's ledger (`ledger`), and the
    BestEffort QoS slice while the ceiling is on and not left to the kubelet's QOSReserved by its
    config (in case the ledger could not be written). For the daemon, `apply`, `reset` and `status`
    alike: a MemoryMax that is not ours is never read as ours nor taken back."""
    on = config.best_effort_ceiling.enabled and qos_reserved_writer(config) is None
    return frozenset(set(ledger) | ({naming.qos_slice("BestEffort")} if on else set()))


class CeilingWatch:
    name = "bestEffortCeiling"
    reset_note = f"the BestEffort ceiling's, kept in its ledger, {CEILINGS_PATH}"  # reset --help (features.reset_notes)
    properties = ("MemoryMax",)
    families = (Family("memqos_besteffort_ceiling_bytes",
                       "The BestEffort ceiling: MemoryMax of the BestEffort QoS slice as planned (kind=planned)"
                       " and as systemd holds it (kind=held; above the plan while it steps down with the"
                       " slice's usage); +Inf: none", ("kind",)),)

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
        self.metrics = metrics or NoGauges()
        self.following = False  # the last overlay stopped above the plan for the slice's usage
        self.moved = False  # the last overlay's value differs from the one before
        self._sent: int | None = None  # the last overlay's value (None: none)
        self._target: int | None = None  # the last overlay's aim (the plan's, or infinity to take ours back)
        self._stood_down: Config | None = None  # the config under which a rival writer was found
        self._overlaid: tuple[Plan, int | None, Plan] | None = None  # (plan, value, overlaid plan)
        self._look = Look()  # when to look at the slice's usage again (look_again)
        self._said: tuple[str, int] | None = None  # the planned ceiling of the last overlay (warnings)

    def units(self, naming: Naming, config: Config) -> frozenset[str]:
        """The units whose MemoryMax is ours to read (`ceiling_units`)."""
        return ceiling_units(self.ledger.names, naming, config)

    def on(self, naming: Naming, config: Config, kubelet) -> bool:
        """The config turns the ceiling on (and leaves it to no QOSReserved of the kubelet's)."""
        return bool(ceiling_units((), naming, config))

    def taken_back(self) -> None:
        """A reset put MemoryMax back to infinity: nothing of ours is left on the ledger's slices."""
        for name in sorted(self.ledger.names):
            self.ledger.discard(name)

    def warnings(self) -> list[str]:
        """After a command's round: the ceiling stopped above the plan for the slice's usage."""
        if not self.following or self._said is None:
            return []
        unit, target = self._said
        return [f"{unit} uses more than its planned MemoryMax {target}: stepped down to its usage only (a lower"
                f" write would make systemd reclaim and OOM-kill); the service follows it down, or run apply again"]

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
        self._said = (desired.ceiling.unit, desired.ceiling.memory_max) if desired.ceiling is not None else None
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
        self.metrics.gauge("memqos_besteffort_ceiling_bytes", ("planned",), gauge_value(planned))
        self.metrics.gauge("memqos_besteffort_ceiling_bytes", ("held",), gauge_value(held))

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


    # ---------------------------------------------------------------- its pure plan step
    def plan_step(self, desired: Plan, given: Given) -> Plan:
        """When bestEffortCeiling is on (and not left to the kubelet's QOSReserved): the BestEffort
        QoS slice's MemoryMax, allocatable - the Guaranteed and Burstable requests - headroom
        (planned_ceiling), as Plan.ceiling and on that slice."""
        if not given.config.best_effort_ceiling.enabled:
            return desired
        pods = {p.key: p for p in given.pods}
        requests = sum(pods[u.pod].request for u in desired.units
                       if u.level == "pod" and u.pod in pods and pods[u.pod].qos != "BestEffort")
        unit, warnings = given.naming.qos_slice("BestEffort"), list(desired.warnings)
        ceiling = planned_ceiling(given.config, unit, desired.allocatable, requests, given.node.page_size, warnings)
        units = tuple(dataclasses.replace(u, memory_max=ceiling.memory_max) if ceiling and u.unit == unit
                      and u.level == "qos" else u for u in desired.units)
        return dataclasses.replace(desired, units=units, warnings=tuple(warnings), ceiling=ceiling)

    # ---------------------------------------------------------------- how it shows (plan, status, check)
    def plan_legend(self, p: Plan) -> list[str]:
        return ["        MemoryMax: above it the kernel OOM-kills in the slice (bestEffortCeiling)"] if p.ceiling else []

    def plan_lines(self, p: Plan, cfg: Config, wide: bool) -> list[str]:
        """`plan`'s paragraph: the ceiling planned, and how."""
        c = p.ceiling
        if c is None:
            return []
        return [f"BestEffort ceiling: MemoryMax {show_bytes(c.memory_max)} on {c.unit}",
                *columns.wrap(f"       = allocatable {format_bytes(p.allocatable)} - Guaranteed and Burstable"
                              f" requests {show_bytes(c.requests)} - headroom {show_bytes(c.headroom)}, at least"
                              f" {show_bytes(c.minimum)}", WIDTH, indent="         ")]

    def explains(self, unit: str, differ: list[str], want: Mapping[str, int], held: Mapping[str, int],
                 cgroup_dir: Path) -> str | None:
        """Why `unit` differs from the plan when that is no drift: a MemoryMax above the plan held
        where the service's step puts it (status)."""
        if differ == ["MemoryMax"] and stepping(want["MemoryMax"], held["MemoryMax"],
                                                read_value(cgroup_dir / "memory.current"), self.page_size):
            return "MemoryMax above the plan: it steps down with the slice's usage"
        return None

    def status_doc(self, desired: Plan | None, observed: Mapping, naming: Naming, cfg: Config) -> dict | None:
        """The BestEffort ceiling as planned and as systemd holds it, beside the slice's usage and its
        memory.events (`max`: usage reached MemoryMax; `oom_kill`: the kernel killed in the slice, at
        the ceiling or on a node out of memory). None when the ceiling is off and none of ours is held."""
        unit = naming.qos_slice("BestEffort")
        values = observed.get(unit) or {}
        planned = desired.ceiling if desired is not None else None
        if planned is None and not cfg.best_effort_ceiling.enabled and "MemoryMax" not in values:
            return None
        where = self.cgroupfs.root / cgroup_path(unit)
        events = read_memory_events(where) if where.is_dir() else {}
        headroom = (planned.headroom if planned else
                    cfg.best_effort_ceiling.headroom.resolve(desired.allocatable) if desired else None)
        return {"unit": unit, "enabled": cfg.best_effort_ceiling.enabled,
                "MemoryMax": planned.memory_max if planned else None, "systemd": values.get("MemoryMax"),
                "usageBytes": read_value(where / "memory.current"),
                "lentBytes": planned.lent if planned else None,  # lending on: what the line lends; None: static
                "requestsBytes": planned.requests if planned else None,
                "headroomBytes": headroom, "minimumBytes": cfg.best_effort_ceiling.minimum,
                "events": {k: events.get(k) for k in ("max", "oom", "oom_kill")}}

    def status_lines(self, c: dict, pods: list[dict], wide: bool) -> list[str]:
        """The BestEffort ceiling for people, in two lines of at most WIDTH columns: planned, held, the
        usage; how it was planned, and the slice's max and oom_kill counts."""
        held, planned = c["systemd"], c["MemoryMax"]
        state = (" (steps down with the usage)" if None not in (held, planned)
                 and stepping(planned, held, c["usageBytes"], self.page_size) else "")
        first = (f"BestEffort ceiling ({c['unit']}): plan {human(planned) if planned is not None else 'none'},"
                 f" systemd holds {human(held)}{state}, usage {human(c['usageBytes'])}")
        how = (f"follows usage: lends {human(c['lentBytes'])} above allocatable - requests {human(c['requestsBytes'])}"
               f" - headroom {human(c['headroomBytes'])}" if planned is not None and c.get("lentBytes") is not None
               else f"allocatable - requests {human(c['requestsBytes'])} - headroom {human(c['headroomBytes'])}"
               f" (at least {human(c['minimumBytes'])})" if planned is not None
               else "off" if not c["enabled"] else "left to the kubelet's QOSReserved (plan --output table says why)")
        ev = c["events"]
        # Wrapped, never cut: the usage and the oom_kill count come last and matter most (issue 43).
        return [*columns.wrap(first, WIDTH, indent="  "),
                *columns.wrap(f"  {how}; memory.events max {count(ev['max'])}, oom_kill {count(ev['oom_kill'])}",
                              WIDTH, indent="    ")]

    def findings(self, cfg: Config, naming: Naming, reserved) -> list[tuple[str, str]]:
        """For `check`: the kubelet's QOSReserved (`reserved`, kubelet_gate's verdict) beside the ceiling."""
        besteffort = naming.qos_slice("BestEffort")
        out: list[tuple[str, str]] = []
        if cfg.best_effort_ceiling.enabled:
            if reserved.on:
                out.append(("error", f"kubelet: its QOSReserved is on ({reserved.how}): it sets {besteffort}'s MemoryMax"
                                     f" itself every minute, and bestEffortCeiling is on here; the service leaves the"
                                     f" ceiling to the kubelet rather than fight; {QOS_RESERVED_FIX}"))
            elif reserved.on is None:
                out.append(("warn", f"kubelet: cannot tell whether its QOSReserved caps {besteffort} ({reserved.how});"
                                    f" if it does, the service leaves the BestEffort ceiling to it"))
            else:
                out.append(("ok", f"kubelet: its QOSReserved does not cap {besteffort} ({reserved.how}): the BestEffort"
                                  f" ceiling is the service's alone"))
        elif reserved.on:
            out.append(("ok", f"kubelet: its QOSReserved caps {besteffort} itself ({reserved.how}); bestEffortCeiling is"
                              f" off here: no conflict"))
        return out


def planned_ceiling(config: Config, unit: str, alloc: int, requests: int, page_size: int,
                    warnings: list[str]) -> Ceiling | None:
    """The BestEffort ceiling when bestEffortCeiling is on, and not left to the kubelet: one whose
    config turns on its QOSReserved with a memory reserve writes the same slice's MemoryMax every
    minute (kubelet_gate.py); two writers would fight, so the ceiling is not planned, and says so."""
    s = config.best_effort_ceiling
    if not s.enabled:
        return None
    rival = qos_reserved_writer(config)
    if rival is not None:
        warnings.append(f"bestEffortCeiling: not planned: {rival}, and it sets {unit}'s MemoryMax itself every"
                        f" minute; turn one of the two off")
        return None
    headroom = s.headroom.resolve(alloc)
    said = None if s.headroom.fraction is None else f"{float(s.headroom.fraction * 100):g}%"
    warnings.extend(ceiling_misfits(alloc, headroom, s.minimum, page_size, said))
    value = besteffort_ceiling(alloc, requests, headroom, s.minimum, page_size)
    return Ceiling(unit, min(value, MAX_BYTES), requests, headroom, s.minimum)


def stepping(planned: int, held: int, usage: int | None, page: int) -> bool:
    """Whether a MemoryMax above the plan is the BestEffort ceiling on its way down, held where
    the service's step puts it (ceiling.step: never below the slice's usage), and not a value
    someone else set (infinity by set-property, the kubelet's QOSReserved)."""
    s = step(planned, held, usage, page)
    return s.following and s.value == held


def _size(n: int | None) -> str:
    return "?" if n is None else f"{n} ({format_bytes(n)})"
