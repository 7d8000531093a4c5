"""`status`: the plan beside what systemd and the kernel hold, per unit and per pod, as a document
(JSON) or lines for people (status_view.py). Each feature of the table adds its own part
(Feature.status_doc, pod_doc, explains, shown); none is named here."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Sequence

from . import fights
from .cgroup_tree import cgroup_path, kernel_shows
from .cgroupfs import Cgroupfs, read_cgroup_memory, read_file, read_memory_events, read_pressure, read_value
from .cmd_common import EXIT_FAILURE, EXIT_OK, connect, err, fetch, mode_of, service_counts, warn
from .config import Config
from .feature import Feature
from .intake import PodIntake
from .kubelet_gate import Mode, who_writes_what
from .naming import container_scope
from .plan import NodeFacts, Plan
from .reconcile import DEFAULTS, MAY_CREATE
from .signals import Protection, ProtectionView
from .sources import SourceError
from .status_view import status_lines
from .systemd import SystemdError
from .node import page_size, read_meminfo
from .places import CGROUP_ROOT, FIGHTS_PATH, LAST_PODS_PATH
from .wiring import adds, wire

__all__ = ["status"]


def status(args, cfg: Config) -> int:
    return asyncio.run(_status(cfg, args.output or ("table" if sys.stdout.isatty() else "json")))


async def _status(cfg: Config, output: str) -> int:
    snapshot, source_error, desired = None, None, None
    mode = await mode_of(cfg)
    wiring = wire(cfg, write=False, kubelet=mode.writes)
    try:
        snapshot = await asyncio.to_thread(fetch, cfg)
        desired = wiring.plan(snapshot.pods, NodeFacts(read_meminfo(), wiring.page_size, mode.writes))
    except SourceError as e:
        source_error = str(e)
        warn(f"{e}; showing what systemd and the kernel hold only")
    try:
        systemd = await connect()
    except SystemdError as e:
        err(f"cannot reach systemd: {e}")
        return EXIT_FAILURE
    naming = wiring.naming
    try:
        observer = wiring.observer(systemd, cgroups=False)
        await observer.refresh_all(u.unit for u in desired.units) if desired else await observer.refresh_all()
    except SystemdError as e:
        err(f"systemd: {e}")
        return EXIT_FAILURE
    finally:
        await systemd.close()
    # The pods as the service takes them (intake.py): a pod the source dropped while its slice
    # runs is still protected, and a first empty answer while slices run is held.
    intake = PodIntake(LAST_PODS_PATH, write=False)
    intake.recall()
    if snapshot is not None:
        intake.accept(snapshot, observer.live_pod_uids())
        if intake.snapshot is not None and intake.snapshot.pods != snapshot.pods:
            # with the pods carried over
            desired = wiring.plan(intake.snapshot.pods, NodeFacts(read_meminfo(), wiring.page_size, mode.writes))
    for feature in wiring.features:  # what each feature shows as planned now (lending: the lines a look draws)
        if desired is not None and hasattr(feature, "shown"):
            desired = feature.shown(desired, cfg)
    held = observer.snapshot().held
    rows = _unit_rows(desired, held, wiring.features)
    doc = {"node": None, "holding": None if snapshot is None or intake.holding is None else str(intake.holding),
           "podSource": source_error, "pods": [], "units": rows, "drift": sum(r["drift"] for r in rows),
           **{f.name: f.status_doc(desired, held, naming, cfg) for f in wiring.features if hasattr(f, "status_doc")},
           "foughtOver": fights.current(FIGHTS_PATH, time.time()), "protection": None,
           "companion": _mode_doc(cfg, mode)}
    if desired is not None:
        mins, lows, kmin, klow = desired.protected()
        doc["node"] = {"capacityBytes": desired.capacity, "allocatableBytes": desired.allocatable,
                       "MemoryMin": mins, "MemoryLow": lows, "kubeletMemoryMin": kmin, "kubeletMemoryLow": klow}
        found = _protection(desired)
        doc["protection"] = _protection_doc(found, desired)
        doc["pods"] = _pod_rows(desired, (intake.snapshot or snapshot).pods, {r["unit"]: r for r in rows}, found,
                                wiring.features)
    if output == "json":
        json.dump(doc, sys.stdout, indent=2, default=str)
        print()
    else:
        print("\n".join(status_lines(doc, wide=output == "wide", encoding=getattr(sys.stdout, "encoding", None),
                                      shown_by=wiring.features)))
    return EXIT_OK


def _mode_doc(cfg: Config, mode: Mode) -> dict:
    """The mode for `status`: its name and why, the kubelet's configuration as far as known, what
    it writes as its own by level, who writes what (an error when nothing protects the pods) and
    the kubelet's moments the running service put back (memqos_kubelet_resets_total)."""
    level, line = who_writes_what(mode, cfg.memory_reservation_policy, cfg.memory_throttling_factor,
                                  adds(cfg, mode.writes))
    return {"on": mode.companion, "mode": mode.name, "why": mode.why,
            "kubelet": mode.facts.describe() if mode.facts else None,
            "writes": {lv: sorted(p) for lv, p in mode.writes.levels.items() if p}, "podsProtected": level != "error",
            "whoWritesWhat": line,
            "kubeletResets": {f"{lv}/{m}": n for (lv, m), n in
                              service_counts(cfg, "memqos_kubelet_resets_total", ("level", "moment")).items()}}


def _unit_rows(desired: Plan | None, observed: dict, made: Sequence[Feature] = ()) -> list[dict]:
    """Per unit (planned ones first, then the others of ours systemd has): the plan's values,
    systemd's and the kernel's, and what drifted ("" when nothing did; a feature may explain a
    difference that is no drift: Feature.explains)."""
    rows, dirs = [], {}
    planned = desired.by_unit() if desired else {}
    names = [u.unit for u in desired.units] if desired else []
    names += sorted(n for n in observed if n not in planned and observed[n] is not None)
    page = page_size()
    for name in names:
        u = planned.get(name)
        d = dirs[name] = cgroup_path(name, dirs.get(u.parent) if u and u.parent else None)
        want = u.properties() if u else None
        held = observed.get(name)
        kernel = read_cgroup_memory(CGROUP_ROOT / d, with_max="MemoryMax" in held) if held is not None else None
        why, drift = "", True
        differ = [k for k, v in (want or {}).items() if held is not None and held.get(k) != v]
        if held is None and u is not None and u.level in MAY_CREATE and want != DEFAULTS:
            why = "not created"  # a reserved slice the service makes; not yet
        elif differ and (explained := _explained(made, name, differ, want, held, CGROUP_ROOT / d)):
            why, drift = explained, False
        elif differ:
            why = "systemd differs from the plan"
        elif held is not None and kernel is not None and not kernel_shows(kernel, held, page):
            why = "the kernel differs from systemd"
        rows.append({"unit": name, "level": u.level if u else "unplanned", "cgroup": d, "desired": want,
                     "systemd": held, "kernel": kernel, "drift": drift and bool(why), "why": why,
                     # every planned value, the kubelet's among them (`kubelet`: what it writes there, shown
                     # as its own configuration makes it; never compared nor sent: not in `desired`)
                     "planned": _planned_values(u) if u else None, "kubelet": sorted(u.kubelet) if u else []})
    return rows


def _explained(made: Sequence[Feature], unit: str, differ: list[str], want, held, where) -> str | None:
    return next((why for f in made if hasattr(f, "explains") and (why := f.explains(unit, differ, want, held, where))),
                None)


def _planned_values(u) -> dict[str, int]:
    values = {"MemoryMin": u.memory_min, "MemoryLow": u.memory_low, "MemoryHigh": u.memory_high}
    return {**values, "MemoryMax": u.memory_max} if u.memory_max is not None else values


def _protection(desired: Plan) -> Protection | None:
    """What the kernel protects now of the kubepods tree (signals.ProtectionView, effective.py),
    read from the cgroups as a scrape reads them; None when kubepods.slice cannot be read."""
    fs = Cgroupfs(CGROUP_ROOT)
    view = ProtectionView.of(desired, fs.place(desired.cgroup_paths), recursive=fs.recursive_protection(), page_size=page_size())
    return view.compute(read_file)


def _protection_doc(found: Protection | None, desired: Plan) -> dict | None:
    """Per QoS class (Guaranteed: its pods summed; all: kubepods.slice) what the kernel protects now:
    usage, effective min and low up to the usage, the larger of the two per cgroup (what reclaim
    spares) and the parts of each lent by a parent (memory_recursiveprot)."""
    if found is None:
        return None
    node = desired.node_unit().unit
    return {"memoryRecursiveprot": found.recursive, "node": node,
            "classes": {c: {"usageBytes": share.usage, "minBytes": share.min, "lowBytes": share.low,
                            "protectedBytes": share.protected, "lentBytes": share.lent,
                            "lentMinBytes": share.lent_min, "lentLowBytes": share.lent_low}
                        for c, share in found.classes.items()}}


def _pod_rows(desired: Plan, pods, units: dict[str, dict], found: Protection | None = None,
              made: Sequence[Feature] = ()) -> list[dict]:
    """Per pod: its QoS class, request, the plan's protection, and from its cgroup the usage, the
    kernel's low and oom_kill counts and PSI full avg10, what the kernel protects now of it and
    what of that a parent lends (`found`); its containers by name."""
    by_pod: dict[str, list] = {}
    for u in desired.units:
        if u.level in ("pod", "container"):
            by_pod.setdefault(u.pod, []).append(u)
    out = []
    for pod in pods:
        units_of = by_pod.get(pod.key, [])
        slice_ = next((u for u in units_of if u.level == "pod"), None)
        if slice_ is None:
            continue
        where = CGROUP_ROOT / units[slice_.unit]["cgroup"]
        events = read_memory_events(where) if where.is_dir() else {}
        e = found.units.get(slice_.unit) if found is not None else None
        full = read_pressure(where).get("full", {})
        names = {container_scope(c.container_id): c for c in pod.containers if c.container_id}
        containers = []
        for u in units_of:
            if u.level == "container":
                c = names.get(u.unit)
                containers.append({"name": c.name if c else None, "unit": u.unit,
                                   "requestBytes": c.request if c else None, "MemoryMin": u.memory_min,
                                   "MemoryLow": u.memory_low, "MemoryHigh": u.memory_high,
                                   "usageBytes": read_value(CGROUP_ROOT / units[u.unit]["cgroup"] / "memory.current"),
                                   "drift": units[u.unit]["why"] or None})
        out.append({"namespace": pod.namespace, "pod": pod.name, "qosClass": pod.qos, "unit": slice_.unit,
                    "requestBytes": pod.request, "MemoryMin": slice_.memory_min, "MemoryLow": slice_.memory_low,
                    "MemoryHigh": slice_.memory_high, **{f.name: f.pod_doc(desired, slice_.unit) for f in made if hasattr(f, "pod_doc")},
                    "usageBytes": read_value(where / "memory.current"),
                    "events": {"low": events.get("low"), "oom_kill": events.get("oom_kill")},
                    "pressureFullAvg10": full.get("avg10"), "drift": units[slice_.unit]["why"] or None,
                    "protection": None if e is None else {"minBytes": e.min_now, "lowBytes": e.low_now,
                                                          "protectedBytes": e.protected, "lentBytes": e.lent},
                    "containers": containers})
    return out


