"""The diff: (desired plan, what systemd holds) -> the ordered changes to send. Pure.

Ordering keeps every child at or below its parent at every moment:
1. grow pass, parents before children: every property whose value goes up;
2. shrink pass, children before parents: every property whose value goes down.
Any prefix of that sequence is also safe, so an apply that stops at a failure
never leaves a child above its parent; the next reconcile finishes the job.

Pod slices and container scopes of ours that systemd has but the plan no
longer names (the pod is gone from the kubelet) are brought back to the
defaults, children first.

Which units we may create by setting properties on them: only the reserved
slices (system.slice, a kube-reserved slice). SetUnitProperties on a slice
that is not loaded makes a plain slice and writes its values as drop-ins under
/run/systemd/system.control/<slice>.d. For a reserved slice that is what we
want: every later write goes to the same drop-ins, and the values apply as soon
as the slice starts. The kubepods tree is the kubelet's: it creates
kubepods.slice and the QoS slices with StartTransientUnit, after which writes
go to /run/systemd/transient, while control drop-ins we had made would win
again at every daemon-reload and undo later writes and a reset (seen on
systemd 252, tests/e2e 45-stale-dropins). So node, QoS, pod and container
units are written only while loaded and running, and picked up by UnitNew /
JobRemoved when the kubelet makes them.

Reserved slices dropped from the config (`retired`) are brought back to the
defaults once, so nothing of ours is left on a slice we no longer manage.

MemoryMax is planned on the units a feature sets it on (features.py; plan.py plans it); a unit
whose planned properties have no MemoryMax keeps whatever MemoryMax it holds (the runtime's limits
on container scopes, the kubelet's on kubepods.slice). Like MemoryHigh, it grows in the grow pass
and shrinks in the shrink pass; how far it may shrink in one write is the feature's to say, laid
on the plan before the diff (its `overlay`).

A unit whose cgroup shows less than systemd holds for it (`kernel_lost`: someone wrote the
cgroup file behind systemd's back; the kernel, not systemd's view, is what protects) gets the
same values set again: systemd then re-writes every memory file of the unit from its own state.
Never the file itself.

A unit whose values were not read (`UNREAD`: a pod slice that has just started,
whose invocation ID came from its cgroup; see daemon.py) gets the plan's three
values in one write: what it holds is unknown (its defaults, or what its
creator set). It is never taken for an orphan, which needs values read.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Collection, Iterable, Mapping

from .naming import Naming
from .plan import INFINITY, Plan, UnitPlan
from .quantity import as_stored

__all__ = ["Change", "DEFAULTS", "UNREAD", "diff", "grow_only", "kernel_lost", "one_write_per_container", "reset_plan",
           "MAY_CREATE"]

DEFAULTS = {"MemoryMin": 0, "MemoryLow": 0, "MemoryHigh": INFINITY}
# What a property is when systemd's answer lacks it: MemoryMax is read only where it is ours.
_UNSET = {**DEFAULTS, "MemoryMax": INFINITY}
# In `observed`: the unit runs, and what it holds was not read (compared with `is`).
UNREAD: Mapping[str, int] = MappingProxyType({})
# Levels whose unit we may create by setting properties on it (see above).
MAY_CREATE = frozenset({"reserved"})


@dataclass(frozen=True)
class Change:
    unit: str
    level: str
    props: Mapping[str, int]  # only the properties that differ, with their new values
    direction: str  # "grow" | "shrink"

    @property
    def must_exist(self) -> bool:
        """The kubepods tree is the kubelet's and the runtime's: never create its units."""
        return self.level not in MAY_CREATE


def kernel_lost(held: Mapping[str, int], kernel: Mapping[str, int], page_size: int) -> dict[str, int]:
    """What a unit's cgroup shows (`kernel`: memory.min/low/high as MemoryMin/Low/High) below what
    systemd holds for it (`held`), where systemd cannot have put it: {property: what the kernel
    shows}. systemd writes every memory file of a unit from its own state whenever it applies the
    unit, so only a writer that went around systemd leaves the kernel showing less:
    * MemoryMin, MemoryLow: less than held, page-rounded down as the kernel stores them. More is
      left alone: a parent's DefaultMemoryMin=/DefaultMemoryLow= shows in a child whose own is
      unset, so the kernel may rightly show more than the unit's property, never less.
    * MemoryHigh: anything but held (a lower one throttles the pod, a higher one lifts the
      throttle the plan sets; systemd derives memory.high from nothing else).
    Empty when the kernel shows what systemd holds (or a property is not known on either side)."""
    lost = {}
    for prop, shown in kernel.items():
        value = held.get(prop)
        if value is None or prop not in DEFAULTS:
            continue
        applied = as_stored(value, page_size)
        if shown < applied or (prop == "MemoryHigh" and shown != applied):
            lost[prop] = shown
    return lost


def diff(desired: Plan | tuple[UnitPlan, ...], observed: Mapping[str, Mapping[str, int] | None],
         naming: Naming | None = None, retired: Iterable[str] = (),
         lost: Mapping[str, Mapping[str, int]] = MappingProxyType({})) -> list[Change]:
    """Ordered changes that take systemd from `observed` to `desired`, and the kernel with it.

    `observed` maps unit name -> the properties systemd holds, None when the
    unit is not loaded, or UNREAD when it runs and its values were not read (all
    three are sent). Units in `observed` that are ours (per `naming`) at the
    pod or container level but absent from `desired` are reset to the defaults,
    and so are the `retired` reserved slices (dropped from the config) that
    systemd has loaded.

    `lost` maps a unit to what its cgroup shows of the properties it shows below what systemd
    holds (`kernel_lost`). A property systemd holds as planned is sent again when the kernel has
    lost it, in the order its kernel value calls for (raising it back is a grow: parents first).
    """
    if isinstance(desired, Plan):
        targets: list[tuple[str, str, Mapping[str, int]]] = list(desired.targets)
        planned = desired.unit_names
        kubelet = desired.kubelet.at
    else:
        targets = [(u.unit, u.level, u.properties()) for u in desired]
        planned = frozenset(u.unit for u in desired)
        levels: dict[str, frozenset[str]] = {}
        for u in desired:
            levels[u.level] = levels.get(u.level, frozenset()) | u.kubelet
        kubelet = lambda level: levels.get(level, frozenset())  # noqa: E731
    if naming is not None:
        orphans = []
        for name in observed:
            if name in planned or observed[name] is None or observed[name] is UNREAD:
                continue
            ref = naming.parse_unit(name)
            if ref is not None and ref.level in ("pod", "container"):
                orphans.append((0 if ref.level == "pod" else 1, name, ref.level))
        # Orphans go last in parent-first order (so first when shrinking): pods, then containers.
        # (Beside the kubelet's own Memory QoS, what it writes on a unit the plan does not name is
        # its own: not ours to take back.)
        targets.extend((name, level, _ours(DEFAULTS, kubelet(level))) for _, name, level in sorted(orphans))
    # Retired reserved slices are roots (siblings of kubepods.slice): their order is free. (Beside
    # the kubelet's own Memory QoS a reserved slice's MemoryMin is the kubelet's: not ours to take back.)
    targets.extend((name, "reserved", _ours(DEFAULTS, kubelet("reserved"))) for name in sorted(set(retired) - planned)
                   if observed.get(name) is not None)

    grow: list[Change] = []
    shrink: list[Change] = []
    for name, level, want in targets:
        have = observed.get(name)
        if (have == want and name not in lost) or not want:
            continue  # the steady case, most units of most rounds; or nothing of it is ours (companion)
        if have is UNREAD:
            # Unknown values: send all three, in the grow pass (parents first) unless all are the
            # defaults, which can only be a lowering (the shrink pass, children first).
            want = dict(want)
            (shrink if want == DEFAULTS else grow).append(
                Change(name, level, want, "shrink" if want == DEFAULTS else "grow"))
            continue
        if have is None:
            if level not in MAY_CREATE or dict(want) == DEFAULTS:
                continue  # nothing to create, or not ours to create
            have = DEFAULTS
        shown = lost.get(name, {})
        up, down = {}, {}
        for k, v in want.items():
            old = have.get(k, _UNSET[k])
            if old == v:
                if k not in shown:
                    continue
                old = shown[k]  # systemd holds it, the kernel does not: set it again
            # For MemoryHigh a larger value is a looser limit; it goes with the growth of
            # protection, so a throttle is lifted before protection is asked for.
            (up if v > old else down)[k] = v
        if up:
            grow.append(Change(name, level, up, "grow"))
        if down:
            shrink.append(Change(name, level, down, "shrink"))
    return grow + shrink[::-1]


def _ours(values: Mapping[str, int], theirs: Collection[str]) -> Mapping[str, int]:
    return {k: v for k, v in values.items() if k not in theirs} if theirs else values


def grow_only(changes: list[Change]) -> list[Change]:
    """While holding, only raised protections are sent: no MemoryMin/MemoryLow goes down, and no
    MemoryHigh or MemoryMax moves either way (suspect pod data must not lift or add a limit)."""
    out = []
    for c in changes:
        props = {k: v for k, v in c.props.items() if k not in ("MemoryHigh", "MemoryMax")}
        if c.direction == "grow" and props:
            out.append(Change(c.unit, c.level, props, c.direction))
    return out


def one_write_per_container(changes: list[Change]) -> list[Change]:
    """`changes` with each container's lowered properties sent with its raised ones.

    A new Burstable container gets MemoryLow raised and MemoryHigh lowered: two writes in two
    passes, where one does (each write costs 20-30 ms under emulation). A container scope is a
    leaf: lowering its values earlier can never put a child above its parent, so its shrink
    joins its grow, at the grow's place (after its parents' grows). Everything else keeps its
    place.
    """
    shrink = {c.unit: c for c in changes if c.level == "container" and c.direction == "shrink"}
    grown = {c.unit for c in changes if c.level == "container" and c.direction == "grow"} & set(shrink)
    out = []
    for c in changes:
        if c.unit in grown:
            if c.direction == "shrink":
                continue
            c = Change(c.unit, c.level, {**c.props, **shrink[c.unit].props}, c.direction)
        out.append(c)
    return out


def reset_plan(observed: Mapping[str, Mapping[str, int] | None], naming: Naming,
               also: Iterable[str] = (), max_units: Iterable[str] = (),
               keep: Callable[[str], Collection[str]] = lambda level: ()) -> list[Change]:
    """Changes that bring every unit of ours back to the defaults, children first. `also`: more
    reserved slices (ones the config no longer names but the service wrote; ledger.py).
    `max_units`: the units whose MemoryMax the service set (features.owned): back to infinity too.
    `keep`: the properties left as they are at a level (companion mode: the kubelet's,
    kubelet_gate.Writes.at)."""
    order = {"node": 0, "reserved": 0, "qos": 1, "pod": 2, "container": 3}
    also = set(also)
    ours = []
    for name, have in observed.items():
        ref = naming.parse_unit(name)
        level = ref.level if ref is not None else "reserved" if name in also else None
        if level is None or have is None:
            continue
        # Root slices above kubepods come before it; kubepods itself is "node" too.
        rank = order[level] - (1 if level == "node" and name != naming.node_slice() else 0)
        ours.append((rank, name, level))
    max_units = set(max_units)
    changes = []
    for _, name, level in sorted(ours, reverse=True):
        defaults = _UNSET if name in max_units else DEFAULTS
        kept = keep(level)
        down = {k: v for k, v in defaults.items() if observed[name].get(k, v) != v and k not in kept}
        if down:
            changes.append(Change(name, level, down, "shrink"))
    return changes
