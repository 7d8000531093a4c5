"""applier.sibling_groups: which writes of a diff may be in flight together.

A group's writes go out together and systemd may apply them in any order, so a group must never
hold a unit and one of its ancestors, and groups must keep the diff's order (parents first when
growing, children first when shrinking)."""

import pytest

from memqos_systemd.applier import sibling_groups
from memqos_systemd.reconcile import Change, DEFAULTS, diff

from test_plan import NODE_PODS, run

MI = 2**20


def ch(unit, level, direction="grow"):
    return Change(unit, level, {"MemoryLow": MI}, direction)


def names(groups):
    return [[c.unit for c in g] for g in groups]


@pytest.mark.parametrize("changes, expected", [
    ([], []),
    # The node level can nest (a parent slice above kubepods.slice): never grouped.
    ([ch("a.slice", "node"), ch("kubepods.slice", "node")], [["a.slice"], ["kubepods.slice"]]),
    ([ch("kubepods-burstable.slice", "qos"), ch("kubepods-besteffort.slice", "qos")],
     [["kubepods-burstable.slice"], ["kubepods-besteffort.slice"]]),
    ([ch("system.slice", "reserved"), ch("kube.slice", "reserved")], [["system.slice"], ["kube.slice"]]),
    # Pod slices together, then their containers together.
    ([ch("kubepods.slice", "node"), ch("p1.slice", "pod"), ch("p2.slice", "pod"), ch("c1.scope", "container"),
      ch("c2.scope", "container")],
     [["kubepods.slice"], ["p1.slice", "p2.slice"], ["c1.scope", "c2.scope"]]),
    # The shrink pass, children first, is cut from the grow pass.
    ([ch("p1.slice", "pod"), ch("p2.slice", "pod", "shrink"), ch("p3.slice", "pod", "shrink")],
     [["p1.slice"], ["p2.slice", "p3.slice"]]),
    ([ch("c1.scope", "container", "shrink"), ch("p1.slice", "pod", "shrink"), ch("p2.slice", "pod", "shrink"),
      ch("kubepods.slice", "node", "shrink")],
     [["c1.scope"], ["p1.slice", "p2.slice"], ["kubepods.slice"]]),
])
def test_groups(changes, expected):
    groups = sibling_groups(changes)
    assert names(groups) == expected
    assert [c for g in groups for c in g] == changes  # same changes, same order


@pytest.mark.parametrize("policy", ["None", "TieredReservation", "HardReservation"])
@pytest.mark.parametrize("root", ["/", "/a/b"])
def test_no_group_of_a_real_diff_holds_a_unit_and_its_ancestor(policy, root):
    """A node of every QoS class, nested under a cgroup root or not, growing from nothing and
    shrinking back: each group's units are pairwise unrelated, and the groups keep the order."""
    plan = run(NODE_PODS, memoryReservationPolicy=policy, cgroupRoot=root,
               systemReservedCgroup="/system.slice", systemReserved={"memory": "1Gi"})
    parent = {u.unit: u.parent for u in plan.units}

    def ancestors(unit):
        out = set()
        while parent.get(unit):
            unit = parent[unit]
            out.add(unit)
        return out

    held = {u.unit: dict(u.properties()) for u in plan.units}
    up = diff(plan, {u.unit: dict(DEFAULTS) for u in plan.units})
    down = diff(tuple(type(u)(u.unit, u.level, u.parent, 0, 0, 2**64 - 1) for u in plan.units), held)
    assert up or policy == "None"
    assert any(len(g) > 1 for g in sibling_groups(up)), "nothing written together: the check checks nothing"
    for changes in (up, down):
        groups = sibling_groups(changes)
        assert [c for g in groups for c in g] == changes
        for group in groups:
            units = {c.unit for c in group}
            for c in group:
                assert not (ancestors(c.unit) & units), (c.unit, units)
