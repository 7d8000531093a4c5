"""Pure helpers of the lent-protection benchmark (bench/lent.py, guest bench/scenarios/61-lent.py).

The pods, the layouts (each a configuration for the real planner, `plan.plan`), and what the
emulation (`effective.protection`) predicts of a tree read from the kernel: the protection of
each leaf now, and the floor a leaf whose protection is all lent is reclaimed down to.

No I/O: tested on the host (tests/unit/test_bench_lent.py), used as is in the guest.
"""

from __future__ import annotations

from dataclasses import replace

from memqos_systemd.config import parse_config
from memqos_systemd.effective import Cgroup, protection
from memqos_systemd.pods import Container, Pod

MIB = 1 << 20

# name -> (QoS class, request MiB, limit MiB or None, page cache the pod writes MiB)
#   g   Guaranteed, below its request
#   b   Burstable, well below its request
#   o   Burstable beyond its request: 96 MiB of page cache on a 32 MiB request
#   be  BestEffort: 192 MiB of page cache (more than the ceiling leaves it in a 1 GiB guest)
PODS = {
    "g": ("Guaranteed", 128, 128, 80),
    "b": ("Burstable", 256, None, 80),
    "o": ("Burstable", 32, None, 96),
    "be": ("BestEffort", 0, None, 192),
}
UIDS = {"g": "1e35b000-0000-4000-8000-000000000001", "b": "1e35b000-0000-4000-8000-000000000002",
        "o": "1e35b000-0000-4000-8000-000000000003", "be": "1e35b000-0000-4000-8000-000000000004"}
CIDS = {n: "containerd://" + (c * 64) for n, c in zip(PODS, "abcd")}
SYSTEM_RESERVED = "64Mi"

# name -> the configuration `plan` is given (keys as in /etc/memqos-systemd/config.yaml)
LAYOUTS = {
    "effective / Tiered": {"hierarchy": "effective", "memoryReservationPolicy": "TieredReservation"},
    "effective / Tiered + ceiling": {"hierarchy": "effective", "memoryReservationPolicy": "TieredReservation",
                                     "bestEffortCeiling": {"enabled": True}},
    "effective / Hard": {"hierarchy": "effective", "memoryReservationPolicy": "HardReservation"},
    "kubelet (v1.37)": {"hierarchy": "kubelet", "memoryReservationPolicy": "TieredReservation"},
    "kubelet (v1.37) + ceiling": {"hierarchy": "kubelet", "memoryReservationPolicy": "TieredReservation",
                                  "bestEffortCeiling": {"enabled": True}},
    "kubelet-1.36": {"hierarchy": "kubelet-1.36", "memoryReservationPolicy": "TieredReservation"},
}


def pods() -> list[Pod]:
    out = []
    for name, (qos, req, limit, _) in PODS.items():
        c = Container("c", "app", req * MIB, None if limit is None else limit * MIB, CIDS[name])
        out.append(Pod(UIDS[name], "bench", name, qos, (c,)))
    return out


def config(layout: str):
    return parse_config(dict(LAYOUTS[layout], systemReserved={"memory": SYSTEM_RESERVED}), f"layout {layout}")


def leaf(name: str) -> str:
    """The container scope of pod `name` (the plan's name for it)."""
    return f"cri-containerd-{CIDS[name].split('//')[1]}.scope"


def with_usage(tree: Cgroup, name: str, usage: int) -> Cgroup:
    """The tree with cgroup `name`'s usage set to `usage` and every ancestor's changed by as much."""

    def walk(node: Cgroup) -> tuple[Cgroup, int | None]:
        if node.name == name:
            return replace(node, usage=usage), usage - node.usage
        for i, c in enumerate(node.children):
            new, delta = walk(c)
            if delta is not None:
                kids = node.children[:i] + (new,) + node.children[i + 1:]
                return replace(node, usage=node.usage + delta, children=kids), delta
        return node, None

    new, delta = walk(tree)
    if delta is None:
        raise ValueError(f"no cgroup {name!r} in the tree")
    return new


def floor(tree: Cgroup, name: str, *, recursive: bool, step: int = MIB, page_size: int = 4096) -> int:
    """How far reclaim can take cgroup `name` while the others keep their usage: the largest usage
    at or below its present one that the emulation protects whole (usage <= what it protects; the
    kernel skips such a cgroup). Its protection is recomputed at each usage, as the kernel does at
    every reclaim: a share lent in proportion to usage shrinks as the usage does."""
    usage = protection(tree, recursive=recursive, page_size=page_size)[name].usage
    while usage > 0:
        e = protection(with_usage(tree, name, usage), recursive=recursive, page_size=page_size)[name]
        if e.protected >= e.usage:
            return usage
        usage = max(0, usage - step)
    return 0


def planned(layout: str, capacity: int, page_size: int = 4096):
    """The real planner's plan of PODS under `layout` on a node of `capacity` bytes."""
    from memqos_systemd.features import plan_all
    from memqos_systemd.plan import NodeFacts

    return plan_all(pods(), NodeFacts(capacity, page_size), config(layout))


def tree_of(units, usage: dict[str, int], read=None) -> Cgroup:
    """The tree under the root memcg (global reclaim's root) of the planned `units`: each unit's
    MemoryMin/MemoryLow as planned, or as `read(unit) -> (usage, min, low)` returns them (the
    kernel's files); leaves' usage from `usage` (unit -> bytes) when `read` is None, a parent's as
    the sum of its children's (what is charged to a slice itself is then left out)."""
    kids: dict[str | None, list] = {}
    for u in units:
        kids.setdefault(u.parent, []).append(u)

    def build(u) -> Cgroup:
        children = tuple(build(c) for c in kids.get(u.unit, []))
        if read is not None:
            used, mn, lw = read(u.unit)
        else:
            used = usage.get(u.unit, 0) + sum(c.usage for c in children)
            mn, lw = u.memory_min, u.memory_low
        return Cgroup(u.unit, used, mn, lw, children)

    tops = tuple(build(u) for u in kids.get(None, []) if u.level == "node")
    return Cgroup("/", sum(t.usage for t in tops), children=tops)


TOLERANCE = 8 * MIB  # what a pod may lose beyond the emulation's prediction (page-cache noise, a chunk)


def verdict(em: dict, before_file: int, after_file: int, tol: int = TOLERANCE) -> tuple[bool, str]:
    """The emulation against the kernel for one pod. em: the emulation's usage, protected and floor
    (bytes) before the pressure; before_file/after_file: memory.stat `file` before the pressure and
    when it stopped. A pod the emulation protects whole (floor >= usage) loses at most `tol` of its
    page cache; a partly protected one keeps at least its floor - `tol`. (ok, what was seen)"""
    lost = before_file - after_file
    if em["floor"] >= em["usage"]:
        return lost <= tol, (f"protected whole by the emulation ({em['protected'] / MIB:.0f} of"
                             f" {em['usage'] / MIB:.0f} MiB); it lost {lost / MIB:.1f} MiB of page cache")
    return after_file >= em["floor"] - tol, (f"kept {after_file / MIB:.0f} MiB of page cache, the emulation's"
                                             f" floor is {em['floor'] / MIB:.0f} MiB")


# The runs in the order they are made: what matters first, so that a guest out of time loses the rest.
PRIORITY = [("effective / Tiered", True), ("effective / Tiered + ceiling", True), ("kubelet (v1.37)", True),
            ("effective / Tiered", False)]


def run_order(layouts_on: list[str], layouts_off: list[str]) -> list[tuple[str, bool]]:
    """(layout, memory_recursiveprot) of every run asked for, PRIORITY's first (those asked for),
    then the other layouts with the option on, then off, each in the order given."""
    asked = [(l, True) for l in layouts_on] + [(l, False) for l in layouts_off]
    return [r for r in PRIORITY if r in asked] + [r for r in asked if r not in PRIORITY]
