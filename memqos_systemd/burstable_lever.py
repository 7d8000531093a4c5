"""The Burstable lever (burstableHigh) as a feature (feature.py, one line of features.py): a
MemoryHigh on each Burstable pod slice, so that none grows into the others' requests.

Its pure plan step (`plan_step`, after plan.plan, in the round, `plan` and `status` alike) lowers
the pod slices' MemoryHigh (plan.burstable_high, each a plan.Lever in `Plan.levers`); it needs
nothing between rounds, so its overlay is the plan itself. It says whether it is on and how it
shows itself in `plan` and `status` (its paragraph and each pod's formula).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Mapping

from . import columns
from .config_schema import Config
from .face import WIDTH, count
from .feature import Context, Given
from .kubelet_gate import Writes
from .naming import Naming
from .plan import MAX_BYTES, Lever, Plan, burstable_high, capped_at
from .quantity import format_bytes
from .pods import one_line

__all__ = ["BurstableLever"]


class BurstableLever:
    name = "burstableHigh"
    properties: tuple[str, ...] = ()  # MemoryHigh is one of the plan's three: nothing beyond them
    pending = False
    notifier = None

    @classmethod
    def made(cls, context: Context) -> BurstableLever:
        return cls()

    def units(self, naming: Naming, config: Config) -> frozenset[str]:
        return frozenset()

    def on(self, naming: Naming, config: Config, kubelet: Writes) -> bool:
        """On when the config says so, unless the kubelet writes the pod slices' MemoryHigh itself."""
        return config.burstable_high.enabled and "MemoryHigh" not in kubelet.at("pod")

    def overlay(self, desired: Plan, observed, config: Config, naming: Naming) -> Plan:
        return desired

    def settle(self, observed, desired: Plan) -> None:
        pass

    def look_again(self, now: float, planned: bool = True) -> float:
        return float("inf")

    def woken(self, now: float) -> float:
        return float("inf")

    def on_drift(self, unit: str, before: Mapping[str, int], now: Mapping[str, int], config: Config) -> frozenset[str]:
        return frozenset()

    # ---------------------------------------------------------------- its pure plan step
    def plan_step(self, desired: Plan, given: Given) -> Plan:
        """When burstableHigh is on: the MemoryHigh of each Burstable pod slice that no limit
        already caps at or below it, lowered to what the others' requests leave (burstable_high);
        one Lever a pod slice lowered (Plan.levers)."""
        s = given.config.burstable_high
        pods = {p.key: p for p in given.pods}
        slices = [(i, u, pods[u.pod]) for i, u in enumerate(desired.units) if u.level == "pod" and u.pod in pods]
        burstable = [(i, u, pod) for i, u, pod in slices if pod.qos == "Burstable"]
        if not s.enabled or not burstable:
            return desired
        node, alloc, warnings = given.node, desired.allocatable, list(desired.warnings)
        if "MemoryHigh" in node.kubelet.at("pod"):
            # A pod slice's MemoryHigh is the kubelet's when it has a throttling factor
            # (kubelet_gate.writes; docs/DESIGN.md, "The Burstable lever").
            warnings.append(f"burstableHigh: not planned: the kubelet writes the pod slices' MemoryHigh itself (its"
                            f" memoryThrottlingFactor {node.kubelet.factor:g}); remove that from its config, or set"
                            f" companion: off, to use it")
            return dataclasses.replace(desired, warnings=tuple(warnings))
        requests = sum(pod.request for _, _, pod in slices if pod.qos != "BestEffort")  # Guaranteed and Burstable
        headroom = s.headroom.resolve(alloc)
        if requests + headroom >= alloc:
            warnings.append(f"burstableHigh: the Guaranteed and Burstable pods request {format_bytes(requests)}"
                            f"{f' (+ headroom {format_bytes(headroom)})' if headroom else ''}, not less than"
                            f" allocatable {format_bytes(alloc)}: every Burstable pod without a limit is held at"
                            f" its request + a page")
        units, levers = list(desired.units), []
        for i, u, pod in burstable:
            others = requests - pod.request
            value = min(burstable_high(alloc, others, headroom, pod.request, node.page_size), MAX_BYTES)
            capped = capped_at(pod)
            if (capped is not None and capped <= value) or u.memory_high <= value:
                continue  # a limit (or the KEP's MemoryHigh from it) already holds the pod there
            units[i] = dataclasses.replace(u, memory_high=value)
            floored = alloc - others - headroom < value
            levers.append(Lever(u.unit, pod.key, value, others, headroom, pod.request, floored, u.memory_high))
        return dataclasses.replace(desired, units=tuple(units), warnings=tuple(warnings), levers=tuple(levers))

    # ---------------------------------------------------------------- how it shows (plan, status)
    def plan_entry(self, p: Plan, u) -> dict | None:
        """`plan --output json`: how it lowered pod slice `u`'s MemoryHigh; None: it did not."""
        lever = p.lever_of(u.unit) if p.levers and u.level == "pod" else None
        if lever is None:
            return None
        return {"othersRequestsBytes": lever.others, "headroomBytes": lever.headroom,
                "requestBytes": lever.request, "heldAtRequest": lever.floored}

    def plan_legend(self, p: Plan) -> list[str]:
        return ["        a Burstable pod's MemoryHigh may be burstableHigh's: what the others' requests leave"] if p.levers \
            else []

    def plan_lines(self, p: Plan, cfg: Config, wide: bool) -> list[str]:
        """`plan`'s paragraph: the pod slices it lowers, each with its formula."""
        if not p.levers:
            return []
        lines = [f"Burstable lever (burstableHigh) on {len(p.levers)} pod slice(s): none may grow into the"
                 f" others' requests"]
        for lever in p.levers:
            name = f"  {one_line(lever.pod, sys.maxsize)}"
            lines += [name if wide else columns.fit(name, 100), *(f"      {f}" for f in lever.formula(p.allocatable))]
        return lines

    def status_doc(self, desired: Plan | None, observed: Mapping, naming: Naming, cfg: Config) -> dict | None:
        """Whether it is on and on how many pod slices the plan lowers MemoryHigh (each pod's row
        says how); None when it is off and nothing of it is planned."""
        if not cfg.burstable_high.enabled and not (desired and desired.levers):
            return None
        headroom = cfg.burstable_high.headroom
        return {"enabled": cfg.burstable_high.enabled,
                "headroomBytes": headroom.resolve(desired.allocatable) if desired else None,
                "companion": bool(desired and "MemoryHigh" in desired.kubelet.at("pod")),
                "pods": None if desired is None else len(desired.levers)}

    def pod_doc(self, desired: Plan, unit: str) -> dict | None:
        """How the plan lowered pod slice `unit`'s MemoryHigh; None: it did not."""
        lever = desired.lever_of(unit) if desired.levers else None
        if lever is None:
            return None
        return {"MemoryHigh": lever.memory_high, "othersRequestsBytes": lever.others, "headroomBytes": lever.headroom,
                "heldAtRequest": lever.floored, "lentBytes": lever.lent,
                "formula": lever.describe(desired.allocatable)}

    def status_lines(self, lever: dict, pods: list[dict], wide: bool) -> list[str]:
        """A line saying what it does, then per pod it lowers how its MemoryHigh was planned; each
        line at most WIDTH columns unless `wide`."""
        if not lever["enabled"]:
            head = "Burstable lever (burstableHigh): off"
        elif lever["companion"]:
            head = "Burstable lever (burstableHigh): not planned: the kubelet writes the pods' MemoryHigh (its factor)"
        else:
            head = (f"Burstable lever (burstableHigh): MemoryHigh on {count(lever['pods'])} pod slice(s),"
                    f" none grows into others' requests")
        lines = [head]
        for p in pods:
            if p.get(self.name):
                formula, name = p[self.name]["formula"], one_line(f"{p['namespace']}/{p['pod']}")
                # a long name is cut, not the formula
                name = name if wide else columns.fit(name, max(12, WIDTH - 4 - columns.width(formula)))
                lines.append(f"  {name}: {formula}")
        if len(lines) > 1:
            lines.append("  above it the kernel reclaims from that pod alone, then throttles it (never kills)")
        return lines if wide else [columns.fit(line, WIDTH) for line in lines]
