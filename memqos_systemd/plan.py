"""The planner: (pods, node facts, config) -> the unit properties to hold. Pure.

No I/O, no clock, no globals: everything here is a function of its arguments,
so every number can be table-tested. Where the numbers come from:

* `allocatable`   Node Allocatable: capacity - kubeReserved - systemReserved - evictionHard.
* `memory_high`   KEP-2570 (v1.27+): floor((req + factor*(limit or allocatable - req))/page)*page,
                  `infinity` when that is not above the request; exact. `kubelet_memory_high`: the
                  same in the kubelet's float64 arithmetic (hierarchy kubelet, kubelet-1.36).
* `_protection`   memoryReservationPolicy (KEP-2570 v1.36): which of MemoryMin / MemoryLow a
                  pod and its containers get.
* hierarchy       `effective` backs every protection with the same kind on every ancestor (the
                  kernel honours nothing more). `kubelet` is what the kubelet of v1.37 writes with its
                  MemoryQoS gate on (kubernetes/kubernetes master after #140267, read 2026-11;
                  docs/DESIGN.md "hierarchy: kubelet is the kubelet of v1.37"): kubepods.slice
                  MemoryMin = ΣG + ΣB requests and, with TieredReservation, MemoryLow = ΣB; the
                  Burstable QoS slice MemoryLow = ΣB; pod and container slices by policy; reserved
                  slices' MemoryMin = the reservation whatever the policy. `kubelet-1.36`: the same
                  with kubepods.slice MemoryLow 0 (before #140267). tests/unit/test_kubelet_upstream.py
                  holds the kubelet's own test cases.
* `_capacity_guard` total hard protection never exceeds capacity minus the headroom.
* `besteffort_ceiling` bestEffortCeiling: MemoryMax of the BestEffort QoS slice, from the requests
                  of the Guaranteed and Burstable pods (the one MemoryMax we plan).
* `burstable_high` burstableHigh (the Burstable lever): MemoryHigh of a Burstable pod slice =
                  allocatable - every other Guaranteed and Burstable pod's request - headroom, down
                  to a page, never below its own request + a page; the pod's MemoryHigh is the
                  lower of that and the KEP's. Only on pods no limit already caps below it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Mapping

from .config_schema import BurstableHighSettings, CeilingSettings, Config
from .cgroup_tree import cgroup_paths
from .kubelet_gate import Writes
from .naming import Naming, NamingError, container_scope, reserved_slice
from .pods import Pod, containers_peak, one_line
from .quantity import MAX_BYTES, UINT64_MAX, format_bytes, page_up

__all__ = ["INFINITY", "NodeFacts", "UnitPlan", "Plan", "PlanError", "Ceiling", "Lever", "Owner", "allocatable", "memory_high",
           "kubelet_memory_high", "besteffort_ceiling", "ceiling_misfits", "burstable_high", "qos_reserved_writer",
           "plan", "HAND_BACK_LEVELS", "BRIDGE_LEVELS"]

# systemd's `infinity` for MemoryHigh.
INFINITY = UINT64_MAX
MAX_PAGE_SIZE = 1 << 30  # the largest page any kernel uses (1 GiB huge pages)
LEVELS = ("node", "reserved", "qos", "pod", "container")


class PlanError(ValueError):
    """Inputs that no plan can be made from (the message names the values)."""


@dataclass(frozen=True)
class NodeFacts:
    capacity: int  # bytes of memory the node has (MemTotal)
    page_size: int = 4096
    # What the running kubelet writes as its own, as its own configuration makes it (companion mode,
    # kubelet_gate.writes): those properties are planned with its values (its policy, its factor,
    # its layout), shown and never sent; every other is ours, planned by our config. Empty: all ours.
    kubelet: Writes = field(default_factory=Writes)
    # Hand over to the kubelet (companion.Companion.hand_back): its values are sent once where it
    # writes them only at a unit's creation or its own start (HAND_BACK_LEVELS), so that nothing of
    # ours stays there that it would not write.
    hand_back: bool = False
    # Bridge the kubelet's start (companion.Companion.bridge): its start sets the node and QoS
    # slices' protection to 0 under TieredReservation too, and it counts the running pods only at
    # its next round (up to a minute; docs/DESIGN.md, "Handing over"): until then its own values
    # are sent there (BRIDGE_LEVELS), so that the pods are never left unprotected meanwhile.
    bridge: bool = False


HAND_BACK_LEVELS = frozenset({"reserved", "pod", "container"})
BRIDGE_LEVELS = frozenset({"node", "qos"})


@dataclass(frozen=True)
class UnitPlan:
    unit: str
    level: str  # node | reserved | qos | pod | container
    parent: str | None  # the unit above it that we also plan (None: top of what we manage)
    memory_min: int = 0
    memory_low: int = 0
    memory_high: int = INFINITY
    pod: str | None = None  # "namespace/name" for pod and container levels
    container: str | None = None  # the container's name (spec.containers[].name), container level only
    # The BestEffort QoS slice's ceiling (besteffort_ceiling); None on every other unit, and there
    # when it is off: MemoryMax is then not ours and never sent.
    memory_max: int | None = None
    # In companion mode, the properties the kubelet writes on this unit (kubelet_gate.Writes.of):
    # their values are what it writes, shown, never sent.
    kubelet: frozenset[str] = frozenset()

    def properties(self) -> dict[str, int]:
        """What we hold this unit to: every planned property but those the kubelet writes."""
        props = {"MemoryMin": self.memory_min, "MemoryLow": self.memory_low, "MemoryHigh": self.memory_high}
        if self.memory_max is not None:
            props["MemoryMax"] = self.memory_max
        return {k: v for k, v in props.items() if k not in self.kubelet} if self.kubelet else props


@dataclass(frozen=True)
class Ceiling:
    """How the BestEffort ceiling was planned, for people (`plan`, `status`, the journal)."""

    unit: str  # the BestEffort QoS slice
    memory_max: int
    requests: int  # the Guaranteed and Burstable pods' requests, summed
    headroom: int
    minimum: int
    lent: int | None = None  # a line that follows usage: what it lends (lending.Lent); None: the static line
    # How far above the slice's usage a step down stops (ceiling.step): 0 for the static line,
    # lending.GUARD for a line that follows usage.
    guard: int = 0


@dataclass(frozen=True)
class Owner:
    """A pod with a memory request (Guaranteed or Burstable): what a line that follows usage
    reserves for it (lending.py)."""

    unit: str  # its pod slice
    pod: str  # "namespace/name"
    qos: str
    request: int  # overhead included (PodRequests)


@dataclass(frozen=True)
class Lever:
    """How the Burstable lever (burstableHigh) was planned on one pod slice, for people (`plan`,
    `status`): MemoryHigh = allocatable - others - headroom, or the floor (request + a page)."""

    unit: str  # the pod slice
    pod: str  # "namespace/name"
    memory_high: int
    others: int  # every other Guaranteed and Burstable pod's request, summed
    headroom: int
    request: int  # the pod's own request (overhead included)
    floored: bool  # the room was not above the request: held at request + a page
    kep: int = INFINITY  # the MemoryHigh the pod had before the lever (the KEP's; infinity without a pod limit)
    lent: int | None = None  # a line that follows usage: what it lends above this static line; None: static

    def formula(self, alloc: int) -> tuple[str, ...]:
        """The value and where it comes from, as lines that are true arithmetic: "MemoryHigh X =
        allocatable A - others' requests Y - headroom H" (bytes in IEC units; the headroom only when
        set); when that room is not above the pod's request, "MemoryHigh X = its request R + a page"
        and the room that was less; on a line that follows usage (lending.py), what it lends above
        that room."""
        room = f"allocatable {format_bytes(alloc)} - others' requests {format_bytes(self.others)}"
        room += f" - headroom {format_bytes(self.headroom)}" if self.headroom else ""
        if self.lent is not None:
            return (f"MemoryHigh {format_bytes(self.memory_high)} follows usage: lends {format_bytes(self.lent)}"
                    f" above {room}",)
        if not self.floored:
            return (f"MemoryHigh {format_bytes(self.memory_high)} = {room}",)
        return (f"MemoryHigh {format_bytes(self.memory_high)} = its request {format_bytes(self.request)} + a page,",
                f"held there: {room} leaves less")

    def describe(self, alloc: int) -> str:
        """The formula on one line."""
        return " ".join(self.formula(alloc))


@dataclass(frozen=True)
class Plan:
    capacity: int
    allocatable: int
    units: tuple[UnitPlan, ...]  # parents always before their children
    warnings: tuple[str, ...] = ()
    ceiling: Ceiling | None = None  # bestEffortCeiling, when planned
    kubelet: Writes = field(default_factory=Writes)  # what the kubelet writes as its own (NodeFacts.kubelet)
    levers: tuple[Lever, ...] = ()  # burstableHigh: every pod slice it lowers the MemoryHigh of
    owners: tuple[Owner, ...] = ()  # every planned pod with a memory request, in the units' order

    @property
    def companion(self) -> bool:
        """Beside the kubelet's own Memory QoS: it writes some of the values planned here."""
        return bool(self.kubelet)

    def protected(self) -> tuple[int, int, int, int]:
        """What the pods are protected by, each byte once: (MemoryMin, MemoryLow) summed over the
        pod slices, and of those what the kubelet writes (min, low). The node and QoS slices back
        the same bytes, so they are not counted again."""
        mins = lows = kmin = klow = 0
        for u in self.units:
            if u.level == "pod":
                mins += u.memory_min
                lows += u.memory_low
                kmin += u.memory_min if "MemoryMin" in u.kubelet else 0
                klow += u.memory_low if "MemoryLow" in u.kubelet else 0
        return mins, lows, kmin, klow

    def lever_of(self, unit: str) -> Lever | None:
        return next((lv for lv in self.levers if lv.unit == unit), None)

    def by_unit(self) -> dict[str, UnitPlan]:
        return {u.unit: u for u in self.units}

    @functools.cached_property
    def cgroup_paths(self) -> Mapping[str, str]:
        """{unit: its cgroup's path below the mount} (a container scope's is in its pod slice), made
        once per plan; what an adapter needs to read the units (Cgroupfs.place). Read-only."""
        return cgroup_paths((u.unit, u.parent) for u in self.units)

    @functools.cached_property
    def targets(self) -> tuple[tuple[str, str, dict[str, int]], ...]:
        """(unit, level, properties) of every unit, in order; made once per plan (the diff of a
        burst's rounds asks for it every time). Read-only by convention."""
        return tuple((u.unit, u.level, u.properties()) for u in self.units)

    @functools.cached_property
    def unit_names(self) -> frozenset[str]:
        return frozenset(u.unit for u in self.units)

    def node_unit(self) -> UnitPlan:
        """The kubepods slice (the last node-level unit: any cgroupRoot slices come first)."""
        return [u for u in self.units if u.level == "node"][-1]


def allocatable(config: Config, capacity: int) -> int:
    """Node Allocatable for memory; PlanError when the reservations exceed the node."""
    eviction = config.eviction_hard_memory.resolve(capacity)
    value = capacity - config.kube_reserved - config.system_reserved - eviction
    if value < 0:
        raise PlanError(
            f"allocatable memory is negative: capacity {format_bytes(capacity)} - kubeReserved"
            f" {format_bytes(config.kube_reserved)} - systemReserved {format_bytes(config.system_reserved)}"
            f" - evictionHard {format_bytes(eviction)} = {format_bytes(value)}")
    return value


def memory_high(request: int, limit: int | None, alloc: int, factor: float | None, page_size: int) -> int:
    """KEP-2570's memory.high for one cgroup, or INFINITY (no throttling)."""
    if factor is None:
        return INFINITY
    return _memory_high(request, alloc if limit is None else limit, _exact(factor), page_size)


@functools.lru_cache(maxsize=64)
def _exact(factor: float) -> Fraction:
    return Fraction(repr(factor))  # 0.9 means 9/10 exactly, not the nearest binary float


def kubelet_memory_high(request: int, limit: int | None, alloc: int, factor: float | None, page_size: int) -> int:
    """memory.high as the kubelet computes it (kuberuntime's container config, and the pod's with a
    pod-level limit): the same formula in float64 arithmetic, floor((req + (ceiling - req) * factor)
    / page) * page, so a value the exact sum would put on a page boundary may land a page lower, as
    the kubelet's does. INFINITY when not above the request, as `memory_high`."""
    if factor is None:
        return INFINITY
    ceiling = alloc if limit is None else limit
    raw = float(request) + (float(ceiling) - float(request)) * factor
    if not raw < INFINITY:  # past what a uint64 holds: throttles nothing
        return INFINITY
    value = math.floor(raw) // page_size * page_size
    return value if request < value < INFINITY else INFINITY


def _memory_high(request: int, ceiling: int, factor: Fraction, page_size: int) -> int:
    # Integer arithmetic: floor((req + n/d * (ceiling - req)) / page) * page.
    n, d = factor.numerator, factor.denominator
    value = (request * d + n * (ceiling - request)) // (d * page_size) * page_size
    # At or past 2**64-1 (a ceiling above any real node's memory) it throttles nothing: infinity.
    return value if request < value < INFINITY else INFINITY


def besteffort_ceiling(alloc: int, requests: int, headroom: int, minimum: int, page_size: int) -> int:
    """MemoryMax of the BestEffort QoS slice: what allocatable leaves after the Guaranteed and
    Burstable pods' `requests` and the `headroom`, down to a page; never below `minimum` (up to a
    page: the kernel keeps memory.max in whole pages, rounded down)."""
    floor = page_up(minimum, page_size)
    return max(floor, (alloc - requests - headroom) // page_size * page_size)


def burstable_high(alloc: int, others: int, headroom: int, request: int, page_size: int) -> int:
    """MemoryHigh of a Burstable pod slice (the Burstable lever): what allocatable leaves after every
    other Guaranteed and Burstable pod's request (`others`) and the `headroom`, down to a page; never
    below the pod's own `request` + a page (down to a page), so it never throttles within its request."""
    floor = (request // page_size + 1) * page_size
    return max(floor, (alloc - others - headroom) // page_size * page_size)


def capped_at(pod: Pod) -> int | None:
    """What a limit already caps the pod's memory at (overhead included), None when nothing does:
    its pod-level limit, else its containers' limits when every container has one (summed as its
    request is: app containers and sidecars, or an init container with the sidecars before it)."""
    if pod.pod_limit is not None:
        return pod.pod_limit + pod.overhead
    if not pod.containers or any(c.limit is None for c in pod.containers):
        return None
    return containers_peak(pod, lambda c: c.limit) + pod.overhead


def _protection(policy: str, qos: str) -> str | None:
    """Which property protects a pod of this QoS class: 'min', 'low' or None."""
    if policy == "TieredReservation":
        return {"Guaranteed": "min", "Burstable": "low"}.get(qos)
    if policy == "HardReservation":
        return {"Guaranteed": "min", "Burstable": "min"}.get(qos)
    return None


def _amounts(kind: str | None, amount: int) -> tuple[int, int]:
    if kind == "min":
        return amount, 0
    if kind == "low":
        return 0, amount
    return 0, 0


def _claim(name_of: Callable[[], str], seen: set[str], who: str, warnings: list[str]) -> str | None:
    """A unit's name (`name_of`), claimed once; None, said in `warnings` and not planned, when it
    cannot be named or is claimed twice (two pods with one UID: parse_pods drops such copies;
    callers may not)."""
    try:
        unit = name_of()
    except NamingError as e:
        warnings.append(f"{who}: {e}; not planned")
        return None
    if unit in seen:
        warnings.append(f"{who}: {unit} is claimed twice; not planned")
        return None
    seen.add(unit)
    return unit


def plan(pods: list[Pod], node: NodeFacts, config: Config) -> Plan:
    """The desired MemoryMin/MemoryLow/MemoryHigh of every unit we manage."""
    if node.capacity <= 0:
        raise PlanError(f"node memory capacity {node.capacity} must be positive")
    if node.page_size <= 0 or node.page_size & (node.page_size - 1) or node.page_size > MAX_PAGE_SIZE:
        raise PlanError(f"page size {node.page_size} must be a power of two up to {MAX_PAGE_SIZE}")
    alloc = allocatable(config, node.capacity)
    policy = config.memory_reservation_policy
    factor = config.memory_throttling_factor
    effective = config.hierarchy == "effective"
    # `kubelet`: what the kubelet of today writes with its MemoryQoS gate on; `kubelet-1.36`: the
    # same before kubernetes/kubernetes#140267 (no memory.low on the node slice). DESIGN.md,
    # "hierarchy: kubelet is the kubelet of v1.37".
    kubelet_today = config.hierarchy == "kubelet"
    high_of = memory_high if effective else kubelet_memory_high
    warnings: list[str] = []

    try:
        naming = Naming.for_config(config)
    except NamingError as e:
        raise PlanError(str(e)) from None

    node_slice = naming.node_slice()
    pod_units: list[UnitPlan] = []
    container_units: list[UnitPlan] = []
    # Per QoS parent: the sums of what its pod slices hold, and the raw request sums.
    held = {"Guaranteed": [0, 0], "Burstable": [0, 0], "BestEffort": [0, 0]}
    requested = {"Guaranteed": 0, "Burstable": 0, "BestEffort": 0}
    seen_units: set[str] = set()
    pods_requests: list[tuple[str, int]] = []  # (pod, its request) of every planned pod
    owners: list[Owner] = []

    for pod in sorted(pods, key=lambda p: (p.namespace, p.name, p.uid)):
        pod_unit = _claim(lambda: naming.pod_slice(pod.qos, pod.uid), seen_units, f"pod {pod.display}", warnings)
        if pod_unit is None:
            continue
        kind = _protection(policy, pod.qos)
        request = pod.request
        children: list[UnitPlan] = []
        for c in pod.containers:
            if c.kind != "init" and c.limit is not None and c.request > c.limit:
                warnings.append(f"pod {pod.display} container {one_line(c.name)!r}: request {format_bytes(c.request)}"
                                f" is above its limit {format_bytes(c.limit)}; planned from the request, not throttled")
            # Only running app containers and sidecars get a scope; an init container never does.
            if c.container_id is None or c.kind == "init":
                continue
            scope = _claim(lambda: container_scope(c.container_id), seen_units,
                           f"pod {pod.display} container {one_line(c.name)!r}", warnings)
            if scope is None:
                continue
            cmin, clow = _amounts(kind, c.request)
            high = INFINITY if pod.qos == "Guaranteed" else high_of(c.request, c.limit, alloc, factor, node.page_size)
            children.append(UnitPlan(scope, "container", pod_unit, cmin, clow, high, pod.key, c.name))
        pmin, plow = _amounts(kind, request)
        if effective:
            # A pod slice must hold at least what its containers hold, or theirs is worth less.
            need_min = sum(c.memory_min for c in children)
            need_low = sum(c.memory_low for c in children)
            if need_min > pmin or need_low > plow:
                warnings.append(f"pod {pod.display}: containers request more than the pod ({request} bytes);"
                                f" pod slice raised to cover them")
                pmin, plow = max(pmin, need_min), max(plow, need_low)
        phigh = INFINITY
        if pod.pod_limit is not None and request > pod.pod_limit + pod.overhead:
            warnings.append(f"pod {pod.display}: request {format_bytes(request)} is above its pod-level limit"
                            f" {format_bytes(pod.pod_limit + pod.overhead)}; planned from the request")
        if pod.qos != "Guaranteed" and pod.pod_limit is not None:
            phigh = high_of(request, pod.pod_limit + pod.overhead, alloc, factor, node.page_size)
        pod_units.append(UnitPlan(pod_unit, "pod", naming.qos_slice(pod.qos), pmin, plow, phigh, pod.key))
        container_units.extend(children)
        held[pod.qos][0] += pmin
        held[pod.qos][1] += plow
        requested[pod.qos] += request
        pods_requests.append((pod.display, request))
        if request > 0 and pod.qos != "BestEffort":
            owners.append(Owner(pod_unit, pod.key, pod.qos, request))

    total = sum(requested.values())
    if total > alloc:
        biggest = max(pods_requests, key=lambda kv: kv[1])
        warnings.append(f"pods request {format_bytes(total)} in total, more than the node's allocatable"
                        f" {format_bytes(alloc)} (capacity {format_bytes(node.capacity)}); the largest: pod"
                        f" {biggest[0]} with {format_bytes(biggest[1])}")

    qos_units = [
        UnitPlan(naming.qos_slice("Burstable"), "qos", node_slice, *held["Burstable"]),
        UnitPlan(naming.qos_slice("BestEffort"), "qos", node_slice, *held["BestEffort"]),
    ]
    if effective or policy == "None":
        node_min = sum(u.memory_min for u in qos_units) + held["Guaranteed"][0]
        node_low = sum(u.memory_low for u in qos_units) + held["Guaranteed"][1]
    else:
        # The kubelet's QoS manager (setMemoryQoS): every Guaranteed and Burstable request as
        # memory.min at the top and, since kubernetes/kubernetes#140267, the Burstable requests as
        # its memory.low too (a child's memory.low is worth no more than its ancestors' is).
        node_min = requested["Guaranteed"] + requested["Burstable"]
        node_low = requested["Burstable"] if kubelet_today and policy == "TieredReservation" else 0

    reserved_units = []
    for _, cgroup, amount in config.enforced_reservations():
        name = reserved_slice(cgroup)
        # The kubelet (enforceExistingCgroup) writes the reservation as memory.min whenever its
        # MemoryQoS gate is on, whatever the policy; `effective` only with a policy that protects.
        rmin = amount if policy != "None" or not effective else 0
        reserved_units.append(UnitPlan(name, "reserved", None, rmin, 0, INFINITY))
        if effective and rmin and cgroup.strip("/").count("/"):
            warnings.append(f"{name}: {cgroup} is nested; its MemoryMin only protects if every slice above it"
                            f" holds as much (set those yourself)")

    node_min = _capacity_guard(node, config, node_slice, node_min, reserved_units, warnings)
    root_units = []
    parent = None
    if effective:
        for name in naming.root_slices():
            root_units.append(UnitPlan(name, "node", parent, node_min, node_low, INFINITY))
            parent = name
    node_unit = UnitPlan(node_slice, "node", parent, node_min, node_low, INFINITY)
    units = _fit((*root_units, node_unit, *reserved_units, *qos_units, *pod_units, *container_units))
    if node.kubelet:
        units = _theirs(units, pods, node, config, warnings)
    return Plan(node.capacity, alloc, units, tuple(warnings), None, node.kubelet, (), tuple(owners))


def _theirs(units: tuple[UnitPlan, ...], pods: list[Pod], node: NodeFacts, config: Config,
            warnings: list[str]) -> tuple[UnitPlan, ...]:
    """`units` with the properties the kubelet writes as its own (NodeFacts.kubelet) set to its
    values, as its own configuration makes them: its layout, its policy, its factor (never ours),
    and marked as its own (UnitPlan.kubelet). A unit it does not plan itself (a slice above a
    nested cgroupRoot's kubepods) stays ours."""
    writes = node.kubelet
    kconfig = dataclasses.replace(config, memory_reservation_policy=writes.policy,
                                  memory_throttling_factor=writes.factor, hierarchy=writes.layout,
                                  best_effort_ceiling=CeilingSettings(), burstable_high=BurstableHighSettings())
    theirs = plan(pods, dataclasses.replace(node, kubelet=Writes(), hand_back=False, bridge=False), kconfig).by_unit()
    out = []
    for u in units:
        mine = writes.of(u.unit, u.level)
        k = theirs.get(u.unit)
        if not mine or k is None:
            out.append(u)
            continue
        values = {"MemoryMin": k.memory_min, "MemoryLow": k.memory_low, "MemoryHigh": k.memory_high}
        sent = (node.hand_back and u.level in HAND_BACK_LEVELS) or (node.bridge and u.level in BRIDGE_LEVELS)
        shown = frozenset() if sent else mine  # handed back (sent once) or bridged (sent until it counts)
        out.append(dataclasses.replace(u, kubelet=shown, **{_FIELD[p]: values[p] for p in mine if p in values}))
    return tuple(out)


_FIELD = {"MemoryMin": "memory_min", "MemoryLow": "memory_low", "MemoryHigh": "memory_high"}


def qos_reserved_writer(config: Config) -> str | None:
    """What says that the kubelet caps the BestEffort QoS slice itself (its QOSReserved gate on and
    qosReserved.memory set in the kubelet config we read); None when its config does not say so."""
    if config.kubelet_qos_reserved_gate and config.kubelet_qos_reserved_memory is not None:
        return (f"the kubelet's QOSReserved is on with qosReserved.memory {config.kubelet_qos_reserved_memory}"
                f" ({config.kubelet_config_file})")
    return None


def ceiling_misfits(alloc: int, headroom: int, minimum: int, page_size: int, said: str | None = None) -> list[str]:
    """What makes bestEffortCeiling's values no sense for this node, whatever its pods request
    (issue 33): a minimum at or above allocatable, which caps nothing; or a headroom that leaves
    less than the minimum even with no request at all, which pins the ceiling to its minimum.
    `said`: the headroom as the config gave it, when a percentage."""
    floor = page_up(minimum, page_size)
    if floor >= alloc:
        return [f"bestEffortCeiling.minimum: {format_bytes(minimum)} is at or above allocatable {format_bytes(alloc)}:"
                f" the ceiling never caps BestEffort pods below what the node has, so it does nothing"]
    if alloc - headroom < floor:
        shown = f"{said} ({format_bytes(headroom)})" if said else format_bytes(headroom)
        return [f"bestEffortCeiling.headroom: {shown} leaves less than bestEffortCeiling.minimum"
                f" {format_bytes(minimum)} of allocatable {format_bytes(alloc)} even with no requests: every"
                f" BestEffort pod together gets the minimum, whatever the others request"]
    return []


def _fit(units: tuple[UnitPlan, ...]) -> tuple[UnitPlan, ...]:
    """Every value a uint64 systemd accepts: absurd requests summed past 2**63-1 are held there."""
    if all(u.memory_min <= MAX_BYTES and u.memory_low <= MAX_BYTES for u in units):
        return units
    return tuple(dataclasses.replace(u, memory_min=min(u.memory_min, MAX_BYTES), memory_low=min(u.memory_low, MAX_BYTES))
                 for u in units)


def _capacity_guard(node: NodeFacts, config: Config, node_slice: str, node_min: int,
                    reserved_units: list[UnitPlan], warnings: list[str]) -> int:
    """Cap the node slice's MemoryMin so top-level hard protection leaves the headroom free."""
    limit = node.capacity - config.protection_headroom.resolve(node.capacity)
    reserved = sum(u.memory_min for u in reserved_units)
    if reserved > limit:
        warnings.append(f"reserved slices hold {format_bytes(reserved)} of MemoryMin, more than capacity minus"
                        f" headroom ({format_bytes(max(limit, 0))}); check kubeReserved/systemReserved")
    capped = max(0, limit - reserved)
    if node_min <= capped:
        return node_min
    warnings.append(f"{node_slice}: MemoryMin capped from {node_min} to {capped} bytes (by {node_min - capped},"
                    f" {format_bytes(node_min - capped)}): hard protection would exceed capacity"
                    f" {format_bytes(node.capacity)} minus protectionHeadroom")
    return capped
