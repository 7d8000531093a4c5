"""bench/guest/lentcase.py, the lent-protection benchmark's pure part (issue 35): the layouts the
planner makes of its pods, and the floors the emulation predicts (worked by hand below)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "guest"))
import lentcase  # noqa: E402

from memqos_systemd.effective import Cgroup, protection  # noqa: E402

MIB = 1 << 20
CAPACITY = 1000 * MIB


def usage_of(units):
    """Every pod's page cache as PODS says (g 80, b 80, o 96, be 192 MiB) on its container scope."""
    return {lentcase.leaf(n): spec[3] * MIB for n, spec in lentcase.PODS.items()}


def test_with_usage_moves_the_ancestors_alike():
    t = Cgroup("/", 10, children=(Cgroup("p", 7, children=(Cgroup("a", 3), Cgroup("b", 4))),))
    t2 = lentcase.with_usage(t, "a", 1)
    assert (t2.usage, t2.children[0].usage, t2.children[0].children[0].usage) == (8, 5, 1)
    with pytest.raises(ValueError, match="no cgroup 'x'"):
        lentcase.with_usage(t, "x", 1)


# Worked by hand (MiB; P - S is what kubepods' children leave unclaimed, X the others' usage above
# their own claim; a leaf whose protection is all lent keeps P - S - X when X < P - S):
#   effective / Tiered: low 288 = 256 + 32 claimed 80 + 32 + ... by the Burstable slice (176 of
#     usage, all claimed within 288), P - S = 112, X = g's 80 (it has no memory.low) -> be 32;
#     min 128, g claims 80, 48 left, X = the Burstable slice's 176 > 48 -> nothing by min.
#   effective / Hard: min 416, g 80 + Burstable slice 176 claimed, P - S = 160, X = 0 -> be 160.
#   kubelet (v1.37) and kubelet-1.36: min 416, g claims 80, P - S = 336, X = the Burstable slice's
#     176 (its memory.min is 0) -> be 160 (and the Burstable slice is all protected by min).
@pytest.mark.parametrize("layout,be_floor", [
    ("effective / Tiered", 32), ("effective / Hard", 160), ("kubelet (v1.37)", 160), ("kubelet-1.36", 160)])
def test_besteffort_floor_per_layout(layout, be_floor):
    p = lentcase.planned(layout, CAPACITY)
    tree = lentcase.tree_of(p.units, usage_of(p.units))
    got = lentcase.floor(tree, lentcase.leaf("be"), recursive=True)
    assert abs(got - be_floor * MIB) <= MIB
    # Without memory_recursiveprot nothing is lent: the BestEffort pod can be reclaimed to nothing.
    assert lentcase.floor(tree, lentcase.leaf("be"), recursive=False) == 0


@pytest.mark.parametrize("layout", list(lentcase.LAYOUTS))
def test_over_request_usage_is_all_protected_with_recursiveprot_and_only_its_request_without(layout):
    p = lentcase.planned(layout, CAPACITY)
    tree = lentcase.tree_of(p.units, usage_of(p.units))
    o = lentcase.leaf("o")
    on, off = protection(tree, recursive=True)[o], protection(tree, recursive=False)[o]
    # All of it, but under kubelet-1.36: there memory.min alone protects it (kubepods.slice has no
    # memory.low), lent from kubepods' 416 MiB in proportion to usage: 336 * 176 / 368 to the
    # Burstable slice, 96 / 176 of that to o (87.6 MiB).
    want = 336 * 176 * 96 / 368 / 176 if layout == "kubelet-1.36" else 96
    assert abs(on.protected - want * MIB) < MIB and on.protected > 32 * MIB
    # kubelet-1.36 has no memory.low on kubepods.slice: the Burstable slice's low is worth nothing,
    # and without the option its pods keep nothing (their memory.min is 0).
    assert off.protected == (0 if layout == "kubelet-1.36" else 32 * MIB)


def test_the_ceiling_is_planned_below_the_besteffort_pods_page_cache():
    """The pods are sized so that the ceiling matters: BestEffort writes more than it may hold."""
    for layout in ("effective / Tiered + ceiling", "kubelet (v1.37) + ceiling"):
        p = lentcase.planned(layout, CAPACITY)
        assert p.ceiling is not None and p.ceiling.memory_max < lentcase.PODS["be"][3] * MIB
