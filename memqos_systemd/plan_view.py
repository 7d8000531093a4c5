"""`plan` for its reader: the JSON document (a contract) and the table for a person. Each feature of
the table says its own part (its legend line, paragraph, notes and a unit's JSON entry); none is
named here."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from . import columns, features
from .config_schema import Config
from .face import show_bytes
from .feature import Feature
from .kubelet_gate import Mode, properties_where
from .plan import INFINITY, Plan, UnitPlan
from .pods import one_line
from .quantity import format_bytes

__all__ = ["plan_to_json", "plan_to_table", "TableContext", "TABLE_WIDTH", "LEGEND", "NEXT"]


def plan_to_json(p: Plan, pending: Mapping[str, str] | None = None, mode: Mode | None = None,
                 shown_by: Sequence[Feature] | None = None) -> dict:
    """The `plan --output json` document (a contract: see `issues show 2`). `pending`: pod key ->
    the reason of a resize the kubelet has not allocated (`resizePending` on the pod's unit).
    A container's unit also names the container (`container`, issue 20). Beside the kubelet's own
    Memory QoS each unit says which of its values are the kubelet's (`kubelet`), and `kubelet` says
    what it writes as its own and why (`mode`)."""
    units = []
    made = features.offline() if shown_by is None else shown_by
    for u in p.units:
        entry: dict[str, Any] = {"unit": u.unit, "level": u.level}
        if u.pod is not None:
            entry["pod"] = u.pod
        if u.container is not None:
            entry["container"] = u.container
        if u.level == "pod" and pending and u.pod in pending:
            entry["resizePending"] = pending[u.pod]
        entry["MemoryMin"] = u.memory_min
        entry["MemoryLow"] = u.memory_low
        entry["MemoryHigh"] = "infinity" if u.memory_high == INFINITY else u.memory_high
        if u.memory_max is not None:  # the BestEffort ceiling (bestEffortCeiling), on that slice only
            entry["MemoryMax"] = "infinity" if u.memory_max == INFINITY else u.memory_max
        if p.companion:  # who writes each value: the kubelet's are shown, never sent
            entry["kubelet"] = sorted(u.kubelet)
        for feature in made:  # what a feature says of the unit (burstableHigh: how it lowered MemoryHigh)
            said = feature.plan_entry(p, u) if hasattr(feature, "plan_entry") else None
            if said is not None:
                entry[feature.name] = said
        units.append(entry)
    mins, lows, kmin, klow = p.protected()
    doc = {"node": {"capacityBytes": p.capacity, "allocatableBytes": p.allocatable},
           "units": units, "warnings": list(p.warnings),
           # each byte once: the pod slices' (the node and QoS slices back the same bytes)
           "protected": {"MemoryMin": mins, "MemoryLow": lows, "kubeletMemoryMin": kmin, "kubeletMemoryLow": klow}}
    if p.companion:  # beside the kubelet's own Memory QoS (each unit's `kubelet`: what it writes there)
        doc["companion"] = True
    if mode is not None:
        doc["kubelet"] = {"mode": mode.name, "why": mode.why,
                          "writes": {lv: sorted(props) for lv, props in p.kubelet.levels.items() if props},
                          "memoryReservationPolicy": mode.facts.policy if mode.facts else None,
                          "memoryThrottlingFactor": mode.facts.factor if mode.facts else None}
    return doc




def _tree_order(p: Plan) -> list[tuple[int, UnitPlan]]:
    """Units depth-first (each parent followed by its children), with their depth."""
    children: dict[str | None, list] = {}
    names = {u.unit for u in p.units}
    for u in p.units:
        children.setdefault(u.parent if u.parent in names else None, []).append(u)
    out: list = []

    def walk(parent: str | None, depth: int) -> None:
        for u in children.get(parent, []):
            out.append((depth, u))
            walk(u.unit, depth + 1)
    walk(None, 0)
    return out


PENDING_MARK = " (resize pending: "


def _pod_cell(u: UnitPlan, pending: Mapping[str, str] | None, limit: int) -> str:
    """A pod's name; its own row says when a resize of it is pending (planned from what the
    kubelet allocated, not from the spec)."""
    name = one_line(u.pod or "", limit)
    if u.level == "pod" and pending and u.pod in pending:
        return f"{name}{PENDING_MARK}{pending[u.pod]})"
    return name


def _name_cell(u: UnitPlan, pending: Mapping[str, str] | None, limit: int) -> str:
    """What a person looks for on a row: the slice's name for the slices of the node, the
    pod's name for a pod slice, the container's name for a container scope, cut at `limit`
    characters. The unit names of pods and containers (up to 72 characters) are never cut:
    `--output wide` and JSON give them."""
    if u.level == "pod":
        return _pod_cell(u, pending, limit)
    if u.level == "container":
        return one_line(u.container, limit) if u.container is not None else u.unit
    return u.unit


@dataclass(frozen=True)
class TableContext:
    """Where a plan's inputs came from, for the table's header and footer."""
    config: str = "built-in defaults"
    capacity_from: str = "MemTotal of /proc/meminfo"
    finished_pods: int = 0
    mode: Mode | None = None  # beside the kubelet's own Memory QoS or not, and what it writes


LEGEND = "legend: MemoryMin is never reclaimed, MemoryLow is reclaimed last, MemoryHigh throttles above it"
NEXT = "next, on a node: memqos-systemd check; then memqos-systemd apply --once --dry-run"


TABLE_WIDTH = 100



def _fit_name(cell: str, room: int, mark: str) -> str:
    """A row's name cut to `room` columns in the middle, its tree indent and a pending resize's
    mark (_pod_cell) kept whole."""
    name = cell.lstrip(" ")
    indent = cell[: len(cell) - len(name)]
    head, sep, reason = name.rpartition(PENDING_MARK)
    name, suffix = (head, sep + reason) if sep else (name, "")
    return indent + columns.fit(name, max(8, room - len(indent) - columns.width(suffix)), mark, middle=True) + suffix


def _head_lines(p: Plan, cfg: Config, context: TableContext) -> list[str]:
    """The table's head: the node, the config, and the kubelet beside it (what it writes itself)."""
    factor = "off" if cfg.memory_throttling_factor is None else f"{cfg.memory_throttling_factor:g}"
    lines = [
        f"node: capacity {format_bytes(p.capacity)} ({context.capacity_from}), allocatable {format_bytes(p.allocatable)}",
        f"config: {context.config}",
        f"  memqos-systemd: policy {cfg.memory_reservation_policy}, hierarchy {cfg.hierarchy}, throttling factor {factor}",
    ]
    mode = context.mode
    if mode is not None and not cfg.kubelet_file and mode.facts is not None and mode.facts.gate.on is None:
        lines.append("  the kubelet: not read (no kubeletConfigFile): every value shown is memqos-systemd's")
    elif mode is not None:
        kubelet = [f"  the kubelet: {mode.name}"]
        known = mode.facts is not None and mode.facts.gate.on is not None and mode.why.startswith("the kubelet's")
        kubelet.append(f"    {mode.facts.describe() if known else mode.why}")
        kubelet.append(f"    it writes {properties_where(p.kubelet.levels)} (marked *, as its own config makes them);"
                       f" memqos-systemd the rest" if p.kubelet else "    it writes none of these values: each is memqos-systemd's")
        lines += [w for line in kubelet for w in columns.wrap(line, TABLE_WIDTH, indent="      ")]
    return lines


def plan_to_table(p: Plan, cfg: Config, pending: Mapping[str, str] | None = None, *,
                  context: TableContext = TableContext(), wide: bool = False, encoding: str | None = None,
                  shown_by: Sequence[Feature] | None = None) -> str:
    """The plan for a person: a tree by name (pod, container) whose rows fit TABLE_WIDTH columns,
    the longest names Kubernetes allows cut with an ellipsis, with where its inputs came from, a
    legend, totals and what to run next. `wide` adds the full unit name of every row, and cuts
    no name (nor does JSON). Columns are measured as a terminal draws them (columns.py: a CJK
    character takes two), as the output's `encoding` prints them (escapes where it cannot)."""
    limit = sys.maxsize  # cut below, to the room the other columns leave
    with_max = any(u.memory_max is not None for u in p.units)  # a feature sets MemoryMax (bestEffortCeiling)
    header = (("SLICE / POD / CONTAINER", "LEVEL", "MemoryMin", "MemoryLow", "MemoryHigh")
              + (("MemoryMax",) if with_max else ()) + (("UNIT",) if wide else ()))
    def cell(u: UnitPlan, prop: str, value: int) -> str:
        return show_bytes(value) + ("*" if prop in u.kubelet else "")  # the kubelet's, as its config makes it

    rows = [("  " * d + columns.as_printed(_name_cell(u, pending, limit), encoding), u.level,
             cell(u, "MemoryMin", u.memory_min), cell(u, "MemoryLow", u.memory_low),
             cell(u, "MemoryHigh", u.memory_high)) + ((show_bytes(u.memory_max) if u.memory_max is not None else "",)
                                            if with_max else ())
            + ((columns.as_printed(u.unit, encoding),) if wide else ()) for d, u in _tree_order(p)]
    widths = [max(columns.width(r[i]) for r in [header, *rows]) for i in range(len(header))]
    cut = False
    if not wide:
        room = max(columns.width(header[0]), TABLE_WIDTH - sum(widths[1:]) - 2 * (len(widths) - 1))
        if widths[0] > room:
            mark = columns.ellipsis(encoding)
            rows = [(_fit_name(r[0], room, mark),) + r[1:] for r in rows]
            widths[0], cut = room, True
    left = (0, 1, len(header) - 1) if wide else (0, 1)
    lines = _head_lines(p, cfg, context) + [""]
    for r in [header, *rows]:
        lines.append("  ".join(columns.ljust(c, w) if i in left else columns.rjust(c, w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    made = features.offline() if shown_by is None else shown_by
    lines += ["", LEGEND]
    for feature in made:  # each feature's line of the legend
        lines += feature.plan_legend(p) if hasattr(feature, "plan_legend") else []
    if p.companion:
        lines.append("        *: the kubelet's value (it writes it itself; shown as its own config makes it, never sent)")
    # Each byte once: the pod slices' protection (the node and QoS slices back the same bytes).
    mins, lows, kmin, klow = p.protected()
    reserved = sum(u.memory_min for u in p.units if u.level == "reserved")
    kreserved = sum(u.memory_min for u in p.units if u.level == "reserved" and "MemoryMin" in u.kubelet)
    pods = sum(1 for u in p.units if u.level == "pod")
    lines.append(f"total: {pods} pod(s) protected by {show_bytes(mins + lows)} of {format_bytes(p.allocatable)}"
                 f" allocatable: MemoryMin {show_bytes(mins)} + MemoryLow {show_bytes(lows)}")
    if p.companion:
        lines.append(f"       of which the kubelet writes {show_bytes(kmin + klow)} (MemoryMin {show_bytes(kmin)} +"
                     f" MemoryLow {show_bytes(klow)}), memqos-systemd {show_bytes(mins + lows - kmin - klow)}")
    if reserved:
        lines.append(f"       and {format_bytes(reserved)} of MemoryMin for the reserved slices"
                     + (f" ({show_bytes(kreserved)} of it the kubelet's)" if p.companion else ""))
    for feature in made:  # each feature's paragraph, then the notes that speak of them all
        lines += feature.plan_lines(p, cfg, wide) if hasattr(feature, "plan_lines") else []
    for feature in made:
        lines += feature.plan_notes(p, cfg) if hasattr(feature, "plan_notes") else []
    if context.finished_pods:
        lines.append(f"skipped: {context.finished_pods} finished pod(s) (Succeeded or Failed), which hold no memory")
    if p.warnings:
        lines += ["", "warnings:"] + [line for w in p.warnings for line in columns.wrap(f"  - {w}", TABLE_WIDTH, indent="    ")]
    if not wide:
        lines.append(f"names cut to fit {TABLE_WIDTH} columns; whole, with unit names (for systemctl show): --output"
                     f" wide, or json" if cut else "full unit names (for systemctl show): --output wide, or json")
    lines += ["", NEXT]
    return "\n".join(lines)
