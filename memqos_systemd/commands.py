"""The commands that talk to systemd: apply, run, status, reset, check.

Each takes the parsed arguments and the loaded config and returns an exit
status (0 ok, 1 runtime failure). Bad input raises and `cli` turns it into 2.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Collection

from . import columns, features, fights, last_pods, ledger, promtext
from .applier import Applier, ApplyResult, summarize
from .cgroup_tree import cgroup_path, kernel_shows
from .cgroupfs import (
    Cgroupfs, read_cgroup_memory, read_file, read_memory_events, read_pressure, read_value,
)
from .config import DEFAULT_CONFIG_PATH, Config, config_present
from .daemon import Daemon, Outside
from .intake import PodIntake
from .kubelet_gate import (GATE_FIX, KNOWN_POLICIES, Mode, Writes, companion_mode, properties_where, who_writes,
                           who_writes_what, writes, written_how)
from .metrics import Metrics, parse_listen
from .naming import Naming, container_scope
from .node import MemoryWatcher, check_node, kubelet_config_findings, page_size, read_meminfo, systemd_findings
from .notify import setup_logging
from .observe import Observer
from .pods import one_line
from .plan import INFINITY, NodeFacts, Plan, levers_on, plan
from .quantity import format_bytes
from .reconcile import DEFAULTS, MAY_CREATE, reset_plan
from .round import Inputs, Round
from .ceiling import step
from .ceiling_watch import CEILING_LEDGER, CEILINGS_PATH, CeilingWatch, ceiling_units
from .lending_watch import lines_now
from .feature import Context
from .runfile import RunLockHeld, hold_run_lock
from .signals import CLASSES, Protection, ProtectionView
from .sources import SourceError, kubelet_gates, make_source
from .sources.file import hidden_from_service
from .sources.kubelet import unreachable_in_service
from .systemd import Systemd, SystemdError

EXIT_OK, EXIT_FAILURE = 0, 1
# check's lines are wrapped to this many columns (a finding's continuation indented under its text).
CHECK_WIDTH = 100
# `run` where another daemon runs: not restarted by the unit (RestartPreventExitStatus=2, as for a
# bad config): a restart cannot help until that one stops.
EXIT_NOT_HERE = 2
SERVICE = "memqos-systemd.service"
CGROUP_ROOT = Path(os.environ.get("MEMQOS_CGROUP_FS", "/sys/fs/cgroup"))
# The reserved slices the service has written (ledger.py); the variable is for tests, like the one above.
LEDGER_PATH = Path(os.environ.get("MEMQOS_LEDGER", str(ledger.DEFAULT_PATH)))
# The pods of the last run, for the first carry_over after a restart (last_pods.py): next to the ledger.
LAST_PODS_PATH = Path(os.environ.get("MEMQOS_LAST_PODS", str(LEDGER_PATH.with_name(last_pods.DEFAULT_PATH.name))))
# The slices whose MemoryMax the service set (the BestEffort ceiling, ledger.OwnedSlices): next to the ledger.
CEILING_LEDGER_PATH = LEDGER_PATH.with_name(CEILINGS_PATH.name)
# One daemon per node, of either route (runfile.hold_run_lock): beside the ledger, in the
# directory the service and the DaemonSet's pod share.
RUN_LOCK_PATH = LEDGER_PATH.with_name("run.lock")
# The units the service finds written behind its back again and again (fights.py), for status and check.
FIGHTS_PATH = LEDGER_PATH.with_name(fights.DEFAULT_PATH.name)
CALL_TIMEOUT = 10.0


def _err(msg: str) -> None:
    print(f"memqos-systemd: error: {msg}", file=sys.stderr)


def _warn(msg: str) -> None:
    print(f"memqos-systemd: warning: {msg}", file=sys.stderr)


def _page_size() -> int:
    return os.sysconf("SC_PAGE_SIZE")


async def _connect() -> Systemd:
    # DBUS_SYSTEM_BUS_ADDRESS points tests at a private bus.
    return await Systemd.connect(None, call_timeout=CALL_TIMEOUT)


def _fetch(cfg: Config):
    return make_source(cfg).fetch()


def _desired(cfg: Config, snapshot, mode: Mode) -> Plan:
    return plan(list(snapshot.pods), NodeFacts(read_meminfo(), _page_size(), mode.writes), cfg)


async def _mode(cfg: Config) -> Mode:
    """Beside the kubelet's own Memory QoS or not, and what it writes as its own, as the service
    decides it (its /metrics and /configz asked once, its config file read)."""
    facts, _, _ = await asyncio.to_thread(kubelet_gates, cfg)
    return companion_mode(cfg.companion, facts)


def _left_to_it(mode: Mode) -> str:
    return f"{mode.name} ({mode.why}): left to the kubelet: {properties_where(mode.writes.levels) or 'nothing'}"


# ------------------------------------------------------------------ apply
def apply(args, cfg: Config) -> int:
    return asyncio.run(_apply(cfg, dry_run=args.dry_run))


async def _apply(cfg: Config, *, dry_run: bool) -> int:
    """The round the service runs (round.py), once: the same intake, plan, diff and apply."""

    # On a machine that is no systemd/cgroup v2 node, that is the first thing to say (not, say,
    # that the kubelet is unreachable): nothing here could be applied.
    not_a_node = _not_a_node()
    if not_a_node:
        _err(f"this machine is no systemd/cgroup v2 node: {'; '.join(not_a_node)}; nothing changed")
        return EXIT_FAILURE
    try:
        snapshot = await asyncio.to_thread(_fetch, cfg)
    except SourceError as e:
        _err(f"{e}; nothing changed")
        return EXIT_FAILURE
    for w in snapshot.warnings:
        _warn(w)
    mode = await _mode(cfg)
    if mode.companion:
        _warn(_left_to_it(mode))
    # The service's own intake: the pods of its last snapshot stand in for the previous one, so a
    # pod the source leaves out keeps its protection while its slice runs, as it does in `run`.
    intake = PodIntake(LAST_PODS_PATH, write=False)
    intake.recall()

    async def one_round(systemd, observer: Observer, applier: Applier) -> tuple[list, ApplyResult]:
        # Reserved slices the service wrote and the config no longer names go back to the
        # defaults, as the service's first round does (ledger.py; read, not written, here).
        retired = frozenset(ledger.read(LEDGER_PATH) - set(observer.naming.reserved_slices()))
        # Every unit of ours systemd has, and those: carry-over asks which pod slices run.
        applier.after_read(await observer.refresh_all(retired))
        for p in intake.accept(snapshot, observer.live_pod_uids()):
            _warn(f"pod {p.display} is not listed by the pod source but its slice still exists; keeping its protection")
        if intake.holding is not None:
            _warn("the pod source lists no pods but pod slices exist; not lowering anything")
        inputs = Inputs(intake.pods, NodeFacts(read_meminfo(), _page_size(), mode.writes), cfg, observer.naming,
                        intake.holding, retired)
        rnd = Round(features=made)
        desired = rnd.plan(inputs)
        for w in desired.warnings:
            _warn(w)
        held = observer.snapshot().held
        waiting = [u.unit for u in desired.units if u.level in ("node", "qos") and held.get(u.unit) is None
                   and u.properties() != DEFAULTS]
        if waiting:
            _warn(f"not loaded yet, left for the kubelet to create (the daemon sets them when it does):"
                  f" {', '.join(waiting)}")
        outcome = await rnd.run(inputs, observer, applier, dry_run=dry_run, echo=print)
        if ceiling.following:
            _warn(f"{desired.ceiling.unit} uses more than its planned MemoryMax {desired.ceiling.memory_max}: stepped"
                  f" down to its usage only (a lower write would make systemd reclaim and OOM-kill); the service"
                  f" follows it down, or run apply again")
        return outcome.changes, outcome.result

    # The BestEffort ceiling as the service steps it, its ledger written before a MemoryMax goes out.
    # A dry run reads the ledger (a ceiling turned off is taken back: shown) and writes nothing.
    made = features.make(Context(Cgroupfs(CGROUP_ROOT), _page_size(), state_dir=CEILING_LEDGER_PATH.parent,
                                 write=not dry_run))
    ceiling = features.by_name(made, CeilingWatch.name)
    return await _send(cfg, one_round, dry_run=dry_run, label="",
                       max_units=lambda naming: features.owned(made, "MemoryMax", naming, cfg),
                       kubelet=mode.writes)


# ------------------------------------------------------------------ reset
def reset(args, cfg: Config) -> int:
    return asyncio.run(_reset(cfg, dry_run=args.dry_run))


async def _reset(cfg: Config, *, dry_run: bool) -> int:
    ceilings = ledger.OwnedSlices(CEILING_LEDGER_PATH, CEILING_LEDGER)
    # Beside the kubelet's own Memory QoS, what it wrote is its own: a pod's it writes only once,
    # at the pod's creation, so taking it back would leave the pod unprotected for good.
    mode = await _mode(cfg)

    def ours(naming: Naming) -> frozenset[str]:
        return ceiling_units(ceilings.names, naming, cfg)  # whose MemoryMax is ours to take back

    async def changes(systemd, observer: Observer, applier: Applier) -> tuple[list, ApplyResult]:
        if await systemd.unit_state(SERVICE) in ("active", "activating", "reloading"):
            _warn(f"{SERVICE} is running and will re-apply its plan; stop it first: systemctl disable --now {SERVICE}")
        # Also the reserved slices the service wrote that the config no longer names (ledger.py).
        former = ledger.read(LEDGER_PATH) - set(observer.naming.reserved_slices())
        applier.after_read(await observer.refresh_all(former))
        snap = observer.snapshot()
        found = reset_plan(snap.held, observer.naming, also=former, max_units=ours(observer.naming),
                           keep=mode.writes.at)
        return found, await applier.apply(found, snap, dry_run=dry_run, echo=print)

    if mode.companion:
        _warn(_left_to_it(mode))
    status = await _send(cfg, changes, dry_run=dry_run, label="reset: ", max_units=ours, kubelet=mode.writes)
    if status == EXIT_OK and not dry_run:
        for name in sorted(ceilings.names):
            ceilings.discard(name)  # MemoryMax back to infinity: nothing of ours is left there
    return status


def _restored(unit: str, error: str | None) -> None:
    if error is not None:
        _warn(f"cannot put memory.oom.group of {unit} back to the runtime's 1 after the write: {error}")


async def _send(cfg: Config, act, *, dry_run: bool, label: str,
                max_units: Callable[[Naming], Collection[str]] = lambda naming: (), kubelet: Writes = Writes()) -> int:
    """Connect, and let `act` compute the changes against what systemd holds and send them (or
    print them): (changes, result). `max_units`: the units whose MemoryMax is ours to read
    (Observer.max_units); `kubelet`: what the kubelet writes as its own (Observer.kubelet)."""
    try:
        systemd = await _connect()
    except SystemdError as e:
        _err(f"cannot reach systemd: {e}; nothing changed")
        return EXIT_FAILURE
    try:
        naming = Naming.for_config(cfg)
        cgroupfs = Cgroupfs(CGROUP_ROOT)
        observer = Observer(systemd, naming, cgroupfs=cgroupfs, max_units=lambda: max_units(naming),
                            kubelet=lambda: kubelet)
        applier = Applier(systemd, cgroupfs=cgroupfs, on_restore=_restored)
        changes, result = await act(systemd, observer, applier)
    except SystemdError as e:
        _err(f"systemd: {e}")
        return EXIT_FAILURE
    finally:
        await systemd.close()
    if dry_run:
        print(f"dry run: {len(changes)} call(s) would be made; nothing changed", file=sys.stderr)
        return EXIT_OK
    if not result.ok:
        _err(f"{label}{summarize(result)}")
        return EXIT_FAILURE
    print(f"{label}{summarize(result)}", file=sys.stderr)
    return EXIT_OK


# ------------------------------------------------------------------ status
def status(args, cfg: Config) -> int:
    return asyncio.run(_status(cfg, args.output or ("table" if sys.stdout.isatty() else "json")))


async def _status(cfg: Config, output: str) -> int:
    snapshot, source_error, desired = None, None, None
    mode = await _mode(cfg)
    try:
        snapshot = await asyncio.to_thread(_fetch, cfg)
        desired = _desired(cfg, snapshot, mode)
    except SourceError as e:
        source_error = str(e)
        _warn(f"{e}; showing what systemd and the kernel hold only")
    try:
        systemd = await _connect()
    except SystemdError as e:
        _err(f"cannot reach systemd: {e}")
        return EXIT_FAILURE
    naming = Naming.for_config(cfg)
    ours = ceiling_units(ledger.OwnedSlices(CEILING_LEDGER_PATH, CEILING_LEDGER).names, naming, cfg)
    try:
        observer = Observer(systemd, naming, max_units=lambda: ours)
        await observer.refresh_all(u.unit for u in desired.units) if desired else await observer.refresh_all()
    except SystemdError as e:
        _err(f"systemd: {e}")
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
            desired = _desired(cfg, intake.snapshot, mode)  # with the pods carried over
    if desired is not None:  # lending on: the lines a look draws now from the pods' usage, not the static ones
        desired = lines_now(desired, Cgroupfs(CGROUP_ROOT), cfg, _page_size(), time.monotonic())
    held = observer.snapshot().held
    rows = _unit_rows(desired, held)
    doc = {"node": None, "holding": None if snapshot is None or intake.holding is None else str(intake.holding),
           "podSource": source_error, "pods": [], "units": rows, "drift": sum(r["drift"] for r in rows),
           "bestEffortCeiling": _ceiling_row(desired, held, naming, cfg),
           "burstableHigh": _lever_doc(desired, cfg),
           "foughtOver": fights.current(FIGHTS_PATH, time.time()), "protection": None,
           "companion": _mode_doc(cfg, mode)}
    if desired is not None:
        mins, lows, kmin, klow = desired.protected()
        doc["node"] = {"capacityBytes": desired.capacity, "allocatableBytes": desired.allocatable,
                       "MemoryMin": mins, "MemoryLow": lows, "kubeletMemoryMin": kmin, "kubeletMemoryLow": klow}
        found = _protection(desired)
        doc["protection"] = _protection_doc(found, desired)
        doc["pods"] = _pod_rows(desired, (intake.snapshot or snapshot).pods, {r["unit"]: r for r in rows}, found)
    if output == "json":
        json.dump(doc, sys.stdout, indent=2, default=str)
        print()
    else:
        print("\n".join(status_lines(doc, wide=output == "wide", encoding=getattr(sys.stdout, "encoding", None))))
    return EXIT_OK


def _adds(cfg: Config, kubelet: Writes) -> tuple[str, ...]:
    """What the service adds that the config turns on (never one that is off): its features
    (features.on) and the plan's levers (plan.levers_on)."""
    made = features.make(Context(Cgroupfs(CGROUP_ROOT), _page_size(), write=False))
    return features.on(made, Naming.for_config(cfg), cfg) + levers_on(cfg, kubelet)


def _mode_doc(cfg: Config, mode: Mode) -> dict:
    """The mode for `status`: its name and why, the kubelet's configuration as far as known, what
    it writes as its own by level, who writes what (an error when nothing protects the pods) and
    the kubelet's moments the running service put back (memqos_kubelet_resets_total)."""
    level, line = who_writes_what(mode, cfg.memory_reservation_policy, cfg.memory_throttling_factor,
                                  _adds(cfg, mode.writes))
    return {"on": mode.companion, "mode": mode.name, "why": mode.why,
            "kubelet": mode.facts.describe() if mode.facts else None,
            "writes": {lv: sorted(p) for lv, p in mode.writes.levels.items() if p}, "podsProtected": level != "error",
            "whoWritesWhat": line,
            "kubeletResets": {f"{lv}/{m}": n for (lv, m), n in
                              _service_counts(cfg, "memqos_kubelet_resets_total", ("level", "moment")).items()}}


def _unit_rows(desired: Plan | None, observed: dict) -> list[dict]:
    """Per unit (planned ones first, then the others of ours systemd has): the plan's values,
    systemd's and the kernel's, and what drifted ("" when nothing did)."""
    rows, dirs = [], {}
    planned = desired.by_unit() if desired else {}
    names = [u.unit for u in desired.units] if desired else []
    names += sorted(n for n in observed if n not in planned and observed[n] is not None)
    page = _page_size()
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
        elif differ == ["MemoryMax"] and _stepping(want["MemoryMax"], held["MemoryMax"],
                                                   read_value(CGROUP_ROOT / d / "memory.current"), page):
            why, drift = "MemoryMax above the plan: it steps down with the slice's usage", False
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


def _planned_values(u) -> dict[str, int]:
    values = {"MemoryMin": u.memory_min, "MemoryLow": u.memory_low, "MemoryHigh": u.memory_high}
    return {**values, "MemoryMax": u.memory_max} if u.memory_max is not None else values


def _stepping(planned: int, held: int, usage: int | None, page: int) -> bool:
    """Whether a MemoryMax above the plan is the BestEffort ceiling on its way down, held where
    the service's step puts it (ceiling.step: never below the slice's usage), and not a value
    someone else set (infinity by set-property, the kubelet's QOSReserved)."""
    s = step(planned, held, usage, page)
    return s.following and s.value == held


def _ceiling_row(desired: Plan | None, observed: dict, naming: Naming, cfg: Config) -> dict | None:
    """The BestEffort ceiling as planned and as systemd holds it, beside the slice's usage and its
    memory.events (`max`: usage reached MemoryMax; `oom_kill`: the kernel killed in the slice, at
    the ceiling or on a node out of memory). None when the ceiling is off and none of ours is held."""
    unit = naming.qos_slice("BestEffort")
    values = observed.get(unit) or {}
    planned = desired.ceiling if desired is not None else None
    if planned is None and not cfg.best_effort_ceiling.enabled and "MemoryMax" not in values:
        return None
    where = CGROUP_ROOT / cgroup_path(unit)
    events = read_memory_events(where) if where.is_dir() else {}
    return {"unit": unit, "enabled": cfg.best_effort_ceiling.enabled,
            "MemoryMax": planned.memory_max if planned else None, "systemd": values.get("MemoryMax"),
            "usageBytes": read_value(where / "memory.current"),
            "lentBytes": planned.lent if planned else None,  # lending on: what the line lends; None: static
            "requestsBytes": planned.requests if planned else None,
            "headroomBytes": (planned.headroom if planned else
                              cfg.best_effort_ceiling.headroom.resolve(desired.allocatable) if desired else None), "minimumBytes": cfg.best_effort_ceiling.minimum,
            "events": {k: events.get(k) for k in ("max", "oom", "oom_kill")}}


def _lever_doc(desired: Plan | None, cfg: Config) -> dict | None:
    """The Burstable lever (burstableHigh): whether it is on and on how many pod slices the plan
    lowers MemoryHigh (each pod's row says how); None when it is off and nothing of it is planned."""
    if not cfg.burstable_high.enabled and not (desired and desired.levers):
        return None
    headroom = cfg.burstable_high.headroom
    return {"enabled": cfg.burstable_high.enabled,
            "headroomBytes": headroom.resolve(desired.allocatable) if desired else None,
            "companion": bool(desired and "MemoryHigh" in desired.kubelet.at("pod")),
            "pods": None if desired is None else len(desired.levers)}


def _lever_of(desired: Plan, unit: str) -> dict | None:
    lever = desired.lever_of(unit) if desired.levers else None
    if lever is None:
        return None
    return {"MemoryHigh": lever.memory_high, "othersRequestsBytes": lever.others, "headroomBytes": lever.headroom,
            "heldAtRequest": lever.floored, "lentBytes": lever.lent, "formula": lever.describe(desired.allocatable)}


def _protection(desired: Plan) -> Protection | None:
    """What the kernel protects now of the kubepods tree (signals.ProtectionView, effective.py),
    read from the cgroups as a scrape reads them; None when kubepods.slice cannot be read."""
    fs = Cgroupfs(CGROUP_ROOT)
    view = ProtectionView.of(desired, fs.place(desired.cgroup_paths), recursive=fs.recursive_protection(), page_size=_page_size())
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


def _pod_rows(desired: Plan, pods, units: dict[str, dict], found: Protection | None = None) -> list[dict]:
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
                    "MemoryHigh": slice_.memory_high, "burstableHigh": _lever_of(desired, slice_.unit),
                    "usageBytes": read_value(where / "memory.current"),
                    "events": {"low": events.get("low"), "oom_kill": events.get("oom_kill")},
                    "pressureFullAvg10": full.get("avg10"), "drift": units[slice_.unit]["why"] or None,
                    "protection": None if e is None else {"minBytes": e.min_now, "lowBytes": e.low_now,
                                                          "protectedBytes": e.protected, "lentBytes": e.lent},
                    "containers": containers})
    return out


WIDTH = 100  # a status line for people fits this many columns


def _human(n: int | None) -> str:
    return "-" if n is None else "inf" if n == INFINITY else "0" if n == 0 else format_bytes(n)


def _table(rows: list[list[str]], *, words_last: bool = False, wide: bool = False,
           ellipsis: str = "…") -> tuple[list[str], bool]:
    """A drift mark (one character), then columns two spaces apart: the first two (a name, a kind)
    left-aligned and the numbers right-aligned (a last column of words left-aligned too); the name
    is cut so that every line fits WIDTH, unless `wide`. Columns are measured as a terminal draws
    them (columns.py). Returns the lines, and whether a name was cut."""
    widths = [max(columns.width(r[i]) for r in rows) for i in range(1, len(rows[0]))]
    rest = sum(widths[1:]) + 2 * (len(widths) - 1) + 2
    longest = widths[0]
    if not wide:
        widths[0] = max(12, min(widths[0], WIDTH - rest))
    out = []
    for mark, *cells in rows:
        parts = [columns.ljust(columns.fit(c, w, ellipsis), w) if i < 2 or (words_last and i == len(cells) - 1)
                 else columns.rjust(c, w) for i, (c, w) in enumerate(zip(cells, widths))]
        out.append(f"{mark} " + "  ".join(parts).rstrip())
    return out, widths[0] < longest


def status_lines(doc: dict, *, wide: bool = False, encoding: str | None = None) -> list[str]:
    """`status` for people: the node's slices (drift marked `!`, with its reason) and the pods with
    their containers (drift marked `!`), one line each, then a summary: protection against
    allocatable, and holding. Names are cut to fit WIDTH, and a line says so; `wide` cuts none.
    Names are measured as the output's `encoding` prints them (columns.as_printed)."""
    lines = []
    mark = columns.ellipsis(encoding)
    cut = False
    upper = [r for r in doc["units"] if r["level"] in ("node", "qos", "reserved")]
    if upper:
        rows = [[" ", "UNIT", "LEVEL", "MIN/LOW (plan)", "HIGH", "DRIFT"]]
        for r in upper:
            want = r.get("planned") or r["desired"] or r["systemd"] or {}
            theirs = set(r.get("kubelet") or ())

            def shown(prop: str) -> str:
                return _human(want.get(prop)) + ("*" if prop in theirs else "")
            rows.append(["!" if r["drift"] else " ", r["unit"], r["level"],
                         f"{shown('MemoryMin')}/{shown('MemoryLow')}", shown("MemoryHigh"), r["why"]])
        table, cut = _table(rows, words_last=True, wide=wide, ellipsis=mark)
        lines += table + [""]
    limit = sys.maxsize if wide else columns.NAME_LIMIT
    if doc["pods"]:
        rows = [[" ", "POD", "QOS", "REQUEST", "MIN/LOW", "USAGE", "NOW/LENT", "LOW EV", "OOM KILL", "FULL10"]]
        for p in doc["pods"]:
            full = p["pressureFullAvg10"]
            now = p.get("protection") or {}
            rows.append(["!" if p["drift"] else " ",
                         columns.as_printed(one_line(f"{p['namespace']}/{p['pod']}", limit), encoding), p["qosClass"],
                         _human(p["requestBytes"]), f"{_human(p['MemoryMin'])}/{_human(p['MemoryLow'])}",
                         _human(p["usageBytes"]),
                         f"{_human(now['protectedBytes'])}/{_human(now['lentBytes'])}" if now else "-",
                         _count(p["events"]["low"]), _count(p["events"]["oom_kill"]),
                         "-" if full is None else f"{full:.2f}"])
            for c in p["containers"]:
                name = columns.as_printed(one_line(c["name"], limit), encoding) if c["name"] else c["unit"]
                rows.append(["!" if c["drift"] else " ", f"  {name} ({_scope_id(c['unit'])})", "container",
                             _human(c["requestBytes"]), f"{_human(c['MemoryMin'])}/{_human(c['MemoryLow'])}",
                             _human(c["usageBytes"]), "", "", "", ""])
        table, cut_here = _table(rows, wide=wide, ellipsis=mark)
        lines += table + [""]
        cut = cut or cut_here
    if doc.get("protection"):
        lines += _protection_lines(doc["protection"])
    unplanned = [r for r in doc["units"] if r["level"] == "unplanned"]
    if unplanned:
        lines.append(f"not in the plan (pods gone; the service resets them): {len(unplanned)} unit(s)"
                     + (f", {sum(r['drift'] for r in unplanned)} with drift" if any(r["drift"] for r in unplanned)
                        else ""))
    if doc.get("bestEffortCeiling"):
        lines += _ceiling_lines(doc["bestEffortCeiling"])
    if doc.get("burstableHigh"):
        lines += _lever_lines(doc["burstableHigh"], doc["pods"], wide)
    lines += columns.wrap(_summary(doc), WIDTH, indent="  ")
    companion = doc.get("companion")
    if companion:
        lines += _mode_lines(companion, wide)
    if doc["drift"]:
        lines.append("drift (!): the plan, systemd and the kernel disagree (why, and the values: --output json)")
    if doc.get("foughtOver"):
        lines.append("fought over (written behind our back again and again, put back each time; who: check):")
        for f in doc["foughtOver"]:
            clock = time.strftime("%H:%M:%S", time.localtime(f["since"]))
            line = f"  {f['unit']}: {f['writes']} writes since {clock}, {written_how(f['writers'])}"
            cut = cut or (not wide and columns.width(line) > WIDTH)
            lines.append(line if wide else columns.fit(line, WIDTH, mark))
    if cut:
        lines.append(f"names cut ({mark}) to fit {WIDTH} columns: --output wide shows them whole")
    return lines


def _mode_lines(mode: dict, wide: bool) -> list[str]:
    """The mode, always (also when the kubelet's gate cannot be read): its name and why, who writes
    what (`*`: the kubelet's values, as its own config makes them), the kubelet's moments put back."""
    mark = "!" if not mode.get("podsProtected", True) else " "
    lines = [f"{mark} mode: {mode['mode']}: {mode['why']}"]
    if mode.get("kubelet"):
        lines.append(f"  the kubelet: {mode['kubelet']}")
    lines.append(f"  who writes what (* the kubelet's): {mode['whoWritesWhat']}")
    resets = mode.get("kubeletResets") or {}
    if resets:
        lines.append("  the kubelet's own moments put back: " + ", ".join(
            f"{n:g} at {'its start' if key.endswith('/start') else 'a container creation'} ({key.split('/')[0]})"
            for key, n in sorted(resets.items())))
    if wide:
        return lines
    # Wrapped, never cut: the reason is what an operator reads the line for (issue 43).
    return [w for line in lines for w in columns.wrap(line, WIDTH, indent="    ")]


def _protection_lines(prot: dict) -> list[str]:
    """What the kernel protects now per QoS class: a heading that says whether memory_recursiveprot
    is on, a line per class, and a line when BestEffort holds protection lent by a parent."""
    option = {True: "on", False: "off", None: "not in /proc/mounts: taken as on"}[prot["memoryRecursiveprot"]]
    rows = [[" ", "CLASS", "CGROUP", "USAGE", "MIN/LOW NOW", "PROTECTED", "LENT"]]
    where = {"Guaranteed": "its pods", "Burstable": "QoS slice", "BestEffort": "QoS slice", "all": prot["node"]}
    for c in CLASSES:
        v = prot["classes"][c]
        rows.append([" ", c, where[c], _human(v["usageBytes"]), f"{_human(v['minBytes'])}/{_human(v['lowBytes'])}",
                     _human(v["protectedBytes"]), _human(v["lentBytes"])])
    table, _ = _table(rows)
    lines = [columns.fit(f"protected now, as the kernel computes it (memory_recursiveprot {option}):", WIDTH)] + table
    be = prot["classes"]["BestEffort"]
    if be["lentBytes"]:
        # What it costs and what to do, not only what it is (issue 43).
        said = [f"! BestEffort holds {_human(be['lentBytes'])} of protection lent by {prot['node']}, not its own"
                f" (memory_recursiveprot):",
                "  reclaim spares that much of BestEffort, whose memory should go first, and reclaims elsewhere",
                "  (outside the pods, Burstable pods beyond their requests); it shrinks as pods use their requests.",
                "  To bound it: bestEffortCeiling in the config (man memqos-systemd, CONFIGURATION)."]
        lines += [columns.fit(line, WIDTH) for line in said]
    return lines + [""]


def _ceiling_lines(c: dict) -> list[str]:
    """The BestEffort ceiling for people, in two lines of at most WIDTH columns: planned, held, the
    usage; how it was planned, and the slice's max and oom_kill counts."""
    held, planned = c["systemd"], c["MemoryMax"]
    stepping = None not in (held, planned) and _stepping(planned, held, c["usageBytes"], _page_size())
    state = " (steps down with the usage)" if stepping else ""
    first = (f"BestEffort ceiling ({c['unit']}): plan {_human(planned) if planned is not None else 'none'},"
             f" systemd holds {_human(held)}{state}, usage {_human(c['usageBytes'])}")
    how = (f"follows usage: lends {_human(c['lentBytes'])} above allocatable - requests {_human(c['requestsBytes'])}"
           f" - headroom {_human(c['headroomBytes'])}" if planned is not None and c.get("lentBytes") is not None
           else f"allocatable - requests {_human(c['requestsBytes'])} - headroom {_human(c['headroomBytes'])}"
           f" (at least {_human(c['minimumBytes'])})" if planned is not None
           else "off" if not c["enabled"] else "left to the kubelet's QOSReserved (plan --output table says why)")
    ev = c["events"]
    # Wrapped, never cut: the usage and the oom_kill count come last and matter most (issue 43).
    return [*columns.wrap(first, WIDTH, indent="  "),
            *columns.wrap(f"  {how}; memory.events max {_count(ev['max'])}, oom_kill {_count(ev['oom_kill'])}",
                          WIDTH, indent="    ")]


def _lever_lines(lever: dict, pods: list[dict], wide: bool) -> list[str]:
    """The Burstable lever for people: a line saying what it does, then per pod it lowers how its
    MemoryHigh was planned; each line at most WIDTH columns unless `wide`."""
    if not lever["enabled"]:
        head = "Burstable lever (burstableHigh): off"
    elif lever["companion"]:
        head = "Burstable lever (burstableHigh): not planned: the kubelet writes the pods' MemoryHigh (its factor)"
    else:
        head = (f"Burstable lever (burstableHigh): MemoryHigh on {_count(lever['pods'])} pod slice(s),"
                f" none grows into others' requests")
    lines = [head]
    for p in pods:
        if p.get("burstableHigh"):
            formula, name = p["burstableHigh"]["formula"], one_line(f"{p['namespace']}/{p['pod']}")
            # a long name is cut, not the formula
            name = name if wide else columns.fit(name, max(12, WIDTH - 4 - columns.width(formula)))
            lines.append(f"  {name}: {formula}")
    if len(lines) > 1:
        lines.append("  above it the kernel reclaims from that pod alone, then throttles it (never kills)")
    return lines if wide else [columns.fit(line, WIDTH) for line in lines]


def _count(n: int | None) -> str:
    return "-" if n is None else str(n)


def _scope_id(unit: str) -> str:
    head, _, rest = unit.rpartition("-")
    return rest[:12] if head else unit


def _summary(doc: dict) -> str:
    node = doc["node"]
    if node is None:
        protected = f"no plan (the pod source failed: {doc['podSource']})"
    else:
        # The pods' own protection (each byte once: the node and QoS slices back the same bytes).
        alloc = node["allocatableBytes"]
        share = (node["MemoryMin"] + node["MemoryLow"]) / alloc * 100 if alloc else 0.0
        theirs = node.get("kubeletMemoryMin", 0) + node.get("kubeletMemoryLow", 0)
        protected = (f"min {_human(node['MemoryMin'])} + low {_human(node['MemoryLow'])} ({share:.0f}% of"
                     f" allocatable {_human(alloc)}"
                     + (f"; the kubelet writes {_human(theirs)} of it" if theirs else "") + ")")
    holding = f"holding: {doc['holding']}" if doc["holding"] else "not holding"
    return f"node: {len(doc['pods'])} pods, {protected}, {holding}, {doc['drift']}/{len(doc['units'])} units drift"


# ------------------------------------------------------------------ check
def check(args, cfg: Config) -> int:
    return asyncio.run(_check(cfg))


async def _check(cfg: Config) -> int:
    findings: list[tuple[str, str]] = [(f.level, f"{f.what}: {f.detail}") for f in _systemd_host()]
    version = access = None
    try:
        systemd = await _connect()
        try:
            version = await systemd.version()
            findings.append(("ok", f"D-Bus: connected to systemd {version}"))
            try:  # what the service's sandbox lets it reach (None: no such service loaded)
                access = await systemd.ip_address_access(SERVICE)
            except SystemdError:
                pass
        finally:
            await systemd.close()
    except SystemdError as e:
        findings.append(("error", f"D-Bus: cannot reach systemd: {e}"))
    for f in check_node(systemd=version, cgroup_root=CGROUP_ROOT):
        findings.append((f.level, f"{f.what}: {f.detail}"))
    set_keys = sorted(k for k, o in cfg.origins.items() if o != "default")
    findings.append(("ok", f"config: policy {cfg.memory_reservation_policy}, hierarchy {cfg.hierarchy}"
                           + (f"; set: {', '.join(set_keys)}" if set_keys else "; all defaults")))
    findings += [("warn", f"config: {note}") for note in cfg.notes]
    for f in kubelet_config_findings(cfg.kubelet_config_file):
        findings.append((f.level, f"{f.what}: {f.detail}"))
    # What the service's sandbox lets it reach of the kubelet: judged, never connected to.
    sandbox = None if cfg.pods_file else unreachable_in_service(cfg.kubelet.url, access)
    blocked = sandbox is not None and sandbox[0] == "error"
    # The pods first: when the kubelet does not answer them, the gate's line says so in a word,
    # and the pods' line says why (one error, named once).
    pods = await _check_pods(cfg, sandbox)
    pods_failed = any(level == "error" for level, _ in pods)
    findings += await asyncio.to_thread(_check_kubelet_gate, cfg, not blocked, pods_failed)
    findings += pods
    for level, text in findings:
        print("\n".join(columns.wrap(f"{level:5} {text}", CHECK_WIDTH, indent=" " * 6)))
    return EXIT_FAILURE if any(level == "error" for level, _ in findings) else EXIT_OK


def _not_a_node() -> list[str]:
    """What makes this machine no systemd/cgroup v2 node (empty on a node): `apply` stops there."""

    found = _systemd_host() + [f for f in check_node(cgroup_root=CGROUP_ROOT) if f.what == "cgroup v2"]
    return [f.detail for f in found if f.level == "error"]


def _systemd_host() -> list:
    """node.systemd_findings for the bus this process would use (DBUS_SYSTEM_BUS_ADDRESS or the system's)."""

    return systemd_findings(os.environ.get("DBUS_SYSTEM_BUS_ADDRESS") or None)


NO_POD_SOURCE = ("error", "pods: no pod source answers: the service protects no pod until one does")


async def _check_pods(cfg: Config, sandbox: tuple[str, str] | None) -> list[tuple[str, str]]:
    """The pod source as the service will see it: an answer, or an error with its fix and the
    consequence (without pods, the service protects no pod). What the service's sandbox hides
    from it (a podsFile under /tmp; a kubelet address its IPAddressAllow= leaves out: `sandbox`,
    unreachable_in_service's verdict) is said too. A kubelet the running service cannot reach is
    not asked from here: its answer to check would change nothing for the service."""
    if sandbox is not None and sandbox[0] == "error":
        return [("error", f"pods: {sandbox[1]}"), NO_POD_SOURCE]
    said = [(sandbox[0], f"pods: {sandbox[1]}")] if sandbox else []
    try:
        snap = await asyncio.to_thread(_fetch, cfg)
    except SourceError as e:
        return said + [("error", f"pods: {e}"), NO_POD_SOURCE]
    hidden = hidden_from_service(cfg.pods_file) if cfg.pods_file else None
    if not hidden:
        return said + [("ok", f"pods: {snap.source} answered with {len(snap.pods)} pods")]
    return [("error", f"pods: {snap.source} answered {len(snap.pods)} pods here, but not in the service: {hidden}"),
            NO_POD_SOURCE]


# What owning every value beside the kubelet's own Memory QoS means (e2e 55-foreign-writer measures it).
FIGHT_KEPT = ("with companion: off, a kubelet with memoryReservationPolicy: TieredReservation writes kubepods.slice"
              " MemoryMin and kubepods-burstable.slice MemoryLow every minute and memqos-systemd puts its own back"
              " within about a second, each time counted in memqos_foreign_writes_total: protection dips every minute")


QOS_RESERVED_FIX = ("turn one of the two off: bestEffortCeiling: {enabled: false} here, or the kubelet's QOSReserved"
                    " (featureGates: {QOSReserved: false}, or no memory in qosReserved, in its config) and restart it")
CONFIGZ_FIX = ("set kubeletConfigFile to the kubelet's config file, or let the service read its /configz (RBAC"
               " nodes/configz get, deploy/rbac/)")


def _check_kubelet_gate(cfg: Config, ask: bool = True, pods_failed: bool = False) -> list[tuple[str, str]]:
    """The kubelet's own Memory QoS and the mode it makes: who writes what, in one line (an error
    when nothing protects the pods, naming the two fixes); every value ours beside a kubelet that
    writes its own (error: the fight, the fix); what could not be read of the kubelet (warn: how to
    find out); its QOSReserved beside the BestEffort ceiling; and the fight as the service has seen it."""
    facts, reserved, answers = kubelet_gates(cfg, ask=ask, pods_failed=pods_failed)
    gate = facts.gate
    mode = companion_mode(cfg.companion, facts)
    level, line = who_writes_what(mode, cfg.memory_reservation_policy, cfg.memory_throttling_factor,
                                  _adds(cfg, mode.writes))
    out = [(level, f"kubelet: {line}")]
    out += [("warn", f"kubelet: {w}") for w in facts.warnings]
    if cfg.companion == "on" and gate.on is False:
        out.append(("error", f"kubelet: its own Memory QoS is off ({gate.how}), yet companion: on leaves it what it would"
                             f" write with it on: nobody writes those; set companion: auto"))
    theirs = writes(facts) if gate.on else Writes()
    if not mode.companion and theirs:
        fought = theirs.protects or "MemoryHigh" in theirs.at("container")
        out.append(("error" if fought else "warn",
                    f"kubelet: its own Memory QoS is on ({gate.how}) and {mode.why}: the kubelet writes"
                    f" {properties_where(theirs.levels)} itself, and the service writes its own over them"
                    + (": two writers fight;" if fought else ";")
                    + f" fix: {GATE_FIX}" + (f"; {FIGHT_KEPT}" if theirs.protects else "")))
    if gate.on is None:
        out.append(("warn", f"kubelet: cannot tell whether its own Memory QoS is on ({gate.how}); it is on by default"
                            f" from v1.37, and the service then leaves what it writes to it if it can tell; set"
                            f" companion: on (or give it the kubelet's /metrics: RBAC nodes/metrics get)"))
    elif mode.companion and not facts.policy_said:
        out.append(("warn", f"kubelet: its memoryReservationPolicy is not known ({facts.policy_how}): taken as its"
                            f" default None, so the service writes the pods' protection; {CONFIGZ_FIX}"
                            + (f" ({answers.configz_why})" if answers.configz_why else "")))
    if mode.companion and not facts.policy_known:
        out.append(("warn", f"kubelet: its memoryReservationPolicy {facts.policy} ({facts.policy_how}) is not one this"
                            f" version knows ({', '.join(KNOWN_POLICIES)}): the pods' MemoryMin and MemoryLow are left"
                            f" to it, which then writes them as that policy says; plan and status show them as"
                            f" TieredReservation's"))
    besteffort = Naming.for_config(cfg).qos_slice("BestEffort")
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
    # The fight as the service has seen it: by level and kind of writer (the units are in its
    # journal; a MemoryMax of the ceiling's written by another is said there, as it stood down),
    # and the units fought over now (fights.py).
    seen = _service_foreign_writes(cfg)
    if seen:
        each = [f"{level} level {n:g} time(s) {written_how([writer])}: {who_writes(level, writer, gate.on, reserved.on)}"
                for (level, writer), n in sorted(seen.items())]
        out.append(("warn", "writers: the service has put back values someone else wrote: " + "; ".join(each)
                            + " (memqos_foreign_writes_total; the units: journalctl -u memqos-systemd)"))
    resets = _service_counts(cfg, "memqos_kubelet_resets_total", ("level", "moment"))
    if resets:
        out.append(("ok", "kubelet: its own moments the service put back (never a fight): " + "; ".join(
            f"{n:g} at {'its start' if moment == 'start' else 'a container creation or resize'} ({lv} level)"
            for (lv, moment), n in sorted(resets.items())) + " (memqos_kubelet_resets_total)"))
    for f in fights.current(FIGHTS_PATH, time.time()):
        who = " or ".join(who_writes(f["level"], w, gate.on, reserved.on) for w in sorted(f["writers"], reverse=True))
        out.append(("warn", f"writers: {f['unit']} is fought over: written behind the service's back {f['writes']}"
                            f" times ({written_how(f['writers'])}) by {who}; the service puts its values back each time"))
    return out


def _service_foreign_writes(cfg: Config) -> dict[tuple[str, str], float]:
    """memqos_foreign_writes_total of the running service, by (level, writer)."""
    return _service_counts(cfg, "memqos_foreign_writes_total", ("level", "writer"))


def _service_counts(cfg: Config, family: str, keys: tuple[str, str]) -> dict[tuple[str, str], float]:
    """A counter of the running service (`family`), by the two labels `keys`, from its metrics
    endpoint (loopback, no credentials); only those above 0; empty when it does not answer."""
    if not cfg.metrics.listen:
        return {}
    host, port = parse_listen(cfg.metrics.listen)
    host = "127.0.0.1" if host in ("", "0.0.0.0") else "::1" if host == "::" else host
    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy
        with opener.open(f"http://{'[' + host + ']' if ':' in host else host}:{port}/metrics", timeout=2) as r:
            text = r.read(4 << 20).decode("utf-8", "replace")
    except (OSError, ValueError):
        return {}
    found: dict[tuple[str, str], float] = {}
    for sample in promtext.samples(text, (family,)).samples:
        if keys[0] in sample.labels and keys[1] in sample.labels:
            found[(sample.labels[keys[0]], sample.labels[keys[1]])] = sample.value
    return {k: n for k, n in found.items() if n > 0}


# ------------------------------------------------------------------ run
def run(args, cfg: Config) -> int:
    log = setup_logging()

    for f in check_node(systemd=None):
        if f.level == "error":
            log.error("preflight: %s: %s", f.what, f.detail)
            return EXIT_FAILURE
        if f.level == "warn":
            log.warning("preflight: %s: %s", f.what, f.detail)
    try:
        run_lock = hold_run_lock(RUN_LOCK_PATH)  # held until this function returns
    except RunLockHeld as e:
        log.error("another memqos-systemd runs on this node (%s; %s): run the service or the DaemonSet, never"
                  " both (/usr/share/doc/memqos-systemd/DEPLOY.md)", e, RUN_LOCK_PATH)
        return EXIT_NOT_HERE
    except OSError as e:
        run_lock = None
        log.warning("cannot take %s: %s; another daemon on this node would go unnoticed", RUN_LOCK_PATH,
                    e.strerror or e)
    metrics = _metrics(cfg, log)
    outside = Outside(connect=lambda address: Systemd.connect(address, call_timeout=CALL_TIMEOUT),
                      make_source=make_source, read_capacity=read_meminfo, page_size=page_size(),
                      metrics=metrics, memory_watcher=_memory_watcher(log), ledger_path=LEDGER_PATH,
                      state_dir=CEILING_LEDGER_PATH.parent, last_pods_path=LAST_PODS_PATH, fights_path=FIGHTS_PATH)
    for note in cfg.notes:
        log.warning("config: %s", note)
    if cfg.kubelet_memory_qos_gate and cfg.companion == "off":
        log.warning("the kubelet's own Memory QoS is on (featureGates in %s) and companion: off: what it writes"
                    " itself the service writes again; %s", cfg.kubelet_config_file, GATE_FIX)
    config_path = getattr(args, "config", None)
    config_path = _default_config_path() if config_path is None else config_path
    try:
        return asyncio.run(Daemon(config_path, cfg, outside).run())
    finally:
        if run_lock is not None:
            run_lock.close()


def _default_config_path() -> str | None:
    return DEFAULT_CONFIG_PATH if config_present(DEFAULT_CONFIG_PATH) else None


def _metrics(cfg: Config, log) -> Any:
    metrics = Metrics()
    if cfg.metrics.listen:
        try:
            metrics.serve(cfg.metrics.listen)
            log.info("metrics on http://%s/metrics", cfg.metrics.listen)
        except OSError as e:
            log.error("metrics: cannot listen on %s: %s (continuing without)", cfg.metrics.listen, e)
    return metrics


def _memory_watcher(log) -> Any:
    try:
        return MemoryWatcher()
    except Exception as e:  # no udev in a container, no netlink permission, ...
        log.warning("memory hotplug: cannot watch udev (%s); capacity is re-read on the resync timer", e)
        return None
