"""The daemon's "reconcile:" line names what it wrote (applier.name_changes)."""

import pytest

from memqos_systemd.applier import name_changes
from memqos_systemd.reconcile import UNREAD, Change
from memqos_systemd.systemd import UINT64_MAX


def change(unit, **props):
    return Change(unit=unit, level="qos", props=props, direction="grow")


@pytest.mark.parametrize("changes, was, want", [
    ([], {}, ""),
    ([change("kube.slice", MemoryMin=64, MemoryLow=96)], {"kube.slice": {"MemoryMin": 0, "MemoryLow": 0}},
     "kube.slice MemoryMin 0 -> 64 MemoryLow 0 -> 96"),
    ([change("a.scope", MemoryHigh=UINT64_MAX)], {"a.scope": {"MemoryHigh": 4096}}, "a.scope MemoryHigh 4096 -> infinity"),
    # Not in the cache, or cached as unread (a new pod slice taken from its cgroup): "?".
    ([change("a.slice", MemoryLow=1), change("b.slice", MemoryLow=2)], {"b.slice": UNREAD},
     "a.slice MemoryLow ? -> 1, b.slice MemoryLow ? -> 2"),
    ([change(f"p{i}.slice", MemoryLow=i) for i in range(6)], {},
     "p0.slice MemoryLow ? -> 0, p1.slice MemoryLow ? -> 1, p2.slice MemoryLow ? -> 2, p3.slice MemoryLow ? -> 3,"
     " and 2 more"),
])
def test_name_changes(changes, was, want):
    assert name_changes(changes, was) == want
