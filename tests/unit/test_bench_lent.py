"""bench/guest/lentcase.py, the lent-protection benchmark's pure part (issue 35): the layouts the
planner makes of its pods, and the floors the emulation predicts (worked by hand below)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from repo_docs import repo_file  # noqa: E402  (the source tree, also from the .deb's build directory)

sys.path.insert(0, str(repo_file("bench", "guest")))
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


# --- the presser's stop rules (bench/guest/press.py) and the verdict per pod -------------------------

import press  # noqa: E402  (bench/guest, on the path above)


@pytest.mark.parametrize("text,want", [
    ("some avg10=1.50 avg60=0.20 avg300=0.00 total=2500000\nfull avg10=0 avg60=0 avg300=0 total=9\n", 2500000),
    ("full avg10=0 avg60=0 avg300=0 total=9\n", None),
    ("some avg10=1 total=x\n", None),
    ("", None),
])
def test_psi_some_us(text, want):
    assert press.psi_some_us(text) == want


@pytest.mark.parametrize("key,want", [("workingset_refault_file", 77), ("workingset_refault_anon", 3),
                                      ("nr_free_pages", None)])
def test_vmstat_value(key, want):
    text = "nr_file_pages 10\nworkingset_refault_anon 3\nworkingset_refault_file 77\n"
    assert press.vmstat_value(text, key) == want


M = MIB


@pytest.mark.parametrize("current,floors,want", [
    ({"be": 40 * M, "o": 96 * M}, {"be": 32 * M, "o": 96 * M}, True),     # be within 8 MiB of its floor
    ({"be": 41 * M, "o": 96 * M}, {"be": 32 * M, "o": 96 * M}, False),
    ({"be": 10 * M, "o": 99 * M}, {"be": 32 * M, "o": 96 * M}, True),     # o 3 MiB over: within the margin
    ({"be": 10 * M, "sys": 500 * M}, {"be": 0, "sys": None}, False),      # floor 0: down to the margin
    ({"be": 8 * M, "sys": 500 * M}, {"be": 0, "sys": None}, True),        # None: not watched for a floor
    ({"be": 8 * M, "sys": 500 * M}, {"be": None, "sys": None}, False),    # no floor at all: never reached
    ({}, {}, False),
])
def test_floors_reached(current, floors, want):
    assert press.floors_reached(current, floors, 8 * M) is want


# (t s, PSI some total µs, refaults in pages); window 2 s, stall 30 %, 256 pages
@pytest.mark.parametrize("samples,want", [
    ([], None),
    ([(0, 0, 0)], None),
    ([(0, 0, 0), (1, 900_000, 5000)], None),                    # less than the window back
    ([(0, 0, 0), (1, 0, 0), (2, 600_000, 256)], (0.3, 256)),    # both at their thresholds
    ([(0, 0, 0), (1, 0, 0), (2, 500_000, 5000)], None),         # stalled 25 %, 1 s steps: not thrashing
    ([(0, 0, 0), (2, 2_000_000, 100)], None),                   # stalled all along, no refaults: reclaim, not thrash
    ([(0, None, 0), (1, None, 0), (2, None, 5000)], None),      # no PSI, quick steps: refaults alone never decide
    ([(0, None, 0), (2, None, 5000)], (None, 5000)),            # ... but a 2 s step counts as stalled
    ([(0, 0, 0), (1, 0, 0), (3, 10, 300)], (0.0, 300)),         # PSI shows nothing (it lagged in the VM), 2 s step
    ([(0, 0, None), (1, 0, 0), (2, 2_000_000, None)], None),
    # the newest sample against the latest one at least 2 s older (t 1), not the first
    ([(0, 0, 0), (1, 0, 0), (2.5, 100, 10), (3, 1_200_000, 400)], (0.6, 400)),
    ([(0, 0, 0), (1, 0, 0), (2.5, 100, 10), (3, 100, 400)], None),       # quick steps, no stall
])
def test_thrashing(samples, want):
    got = press.thrashing(samples, 2.0, 0.3, 256)
    assert (got if got is None else (got["stall"], got["refault_pages"])) == want


def stopper(**kw):
    spec = {"watch": {"be": {"path": "/x", "floor": 32 * M}, "o": {"path": "/y", "floor": 96 * M},
                      "sys": {"path": "/z", "floor": None}}, "time_s": 120, "cap_mib": 800}
    spec.update(kw)
    return press.Stopper(spec)


def steps(stop, rows):
    """rows: (t, alloc MiB, low, be MiB, psi µs, refault pages); the first stop reason, or None."""
    for t, alloc, low, be, psi, ref in rows:
        why = stop.step(t, alloc, low, {"be": be * M, "o": 96 * M, "sys": 300 * M}, psi, ref)
        if why:
            return why, alloc
    return None


@pytest.mark.parametrize("rows,want", [
    # a low event stops at once, whatever else holds
    ([(0.1, 4, 0, 190, 0, 0), (0.2, 8, 1, 190, 0, 0)], ("low", 8)),
    # floors reached at 12 MiB (be 40 <= 32 + 8): 16 MiB more, then stop
    ([(0.1, 4, 0, 100, 0, 0), (0.2, 8, 0, 60, 0, 0), (0.3, 12, 0, 40, 0, 0), (0.4, 16, 0, 38, 0, 0),
      (0.5, 20, 0, 36, 0, 0), (0.6, 24, 0, 35, 0, 0), (0.7, 28, 0, 35, 0, 0)], ("floors", 28)),
    # be kept above its floor (the kernel protects more) and the node thrashes
    # (defaults: over 3 s, stalled >= 50 % and >= 4 MiB refaulted)
    ([(0, 4, 0, 150, 0, 0), (1, 8, 0, 90, 100_000, 0), (2, 12, 0, 80, 200_000, 10), (3, 16, 0, 80, 1_500_000, 900),
      (4, 20, 0, 80, 2_000_000, 1100)], ("thrashing", 20)),
    # nothing decides: the time bound
    ([(60, 4, 0, 150, 0, 0), (119.9, 8, 0, 150, 0, 0), (120, 12, 0, 150, 0, 0)], ("time", 12)),
    ([(1, 796, 0, 150, 0, 0), (2, 800, 0, 150, 0, 0)], ("cap", 800)),
    ([(1, 4, 0, 150, 0, 0)], None),
])
def test_stopper(rows, want):
    assert steps(stopper(), rows) == want


def test_stopper_keeps_where_the_floors_were_reached_and_what_thrashing_it_saw():
    s = stopper(past_mib=100)
    assert steps(s, [(0, 4, 0, 100, 0, 0), (1, 8, 0, 39, 0, 0), (2, 12, 0, 38, 0, 0),
                     (3, 16, 0, 38, 2_400_000, 5000)]) == ("thrashing", 16)
    assert s.floors_at == 8 and s.thrash == {"stall": 0.8, "step_s": 1, "refault_pages": 5000, "window_s": 3}


def test_stopper_without_floors_presses_until_something_else_stops_it():
    s = press.Stopper({"watch": {"be": {"path": "/x", "floor": None}}, "time_s": 120})
    rows = [(0.1 * i, 4 * i, 0, 122, 0, 0) for i in range(1, 40)]
    assert steps(s, rows) is None and s.floors_at is None


EM_WHOLE = {"usage": 96 * M, "protected": 96 * M, "floor": 96 * M}
EM_PART = {"usage": 193 * M, "protected": 78 * M, "floor": 32 * M}


@pytest.mark.parametrize("em,before,after,ok", [
    (EM_WHOLE, 96 * M, 88 * M, True),      # lost 8 MiB: the tolerance
    (EM_WHOLE, 96 * M, 87 * M, False),
    (EM_PART, 192 * M, 24 * M, True),      # floor 32 - 8
    (EM_PART, 192 * M, 23 * M, False),
    (EM_PART, 192 * M, 150 * M, True),     # kept more than the floor: not against the emulation
])
def test_verdict(em, before, after, ok):
    got, seen = lentcase.verdict(em, before, after)
    assert got is ok and "MiB" in seen


def test_run_order_puts_what_matters_first_and_keeps_only_what_is_asked():
    on = ["effective / Tiered", "effective / Tiered + ceiling", "effective / Hard", "kubelet (v1.37)"]
    assert lentcase.run_order(on, ["effective / Hard", "effective / Tiered"]) == [
        ("effective / Tiered", True), ("effective / Tiered + ceiling", True), ("kubelet (v1.37)", True),
        ("effective / Tiered", False), ("effective / Hard", True), ("effective / Hard", False)]
    assert lentcase.run_order(["kubelet-1.36"], []) == [("kubelet-1.36", True)]


def load_lent():
    import importlib.util

    path = repo_file("bench", "lent.py")
    spec = importlib.util.spec_from_file_location("bench_lent", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fake_run(layout, recursive, be_after, stopped="floors", error=None):
    if error:
        return {"layout": layout, "recursive": recursive, "error": error}
    em = {n: {"usage": u * M, "protected": u * M, "lent": 0, "floor": u * M} for n, u in
          (("g", 81), ("b", 80), ("o", 96))}
    em["be"] = {"usage": 193 * M, "protected": 78 * M, "lent": 78 * M, "floor": 32 * M}
    before = {n: {"file": u * M, "low": 0, "oom_kill": 0} for n, u in (("g", 80), ("b", 80), ("o", 96), ("be", 192))}
    after = {n: dict(v) for n, v in before.items()}
    after["be"]["file"] = be_after * M
    return {"layout": layout, "recursive": recursive, "ceiling": None, "emulated": em, "before": before,
            "after": after, "press": {"stopped": stopped, "alloc_mib": 420, "seconds": 31.5, "floors_at_mib": 400,
                                      "trace": [{"alloc_mib": 420}], "how": "stopped", "result": "success"}}


def test_render_lists_every_case_and_says_which_disagreed():
    lent = load_lent()
    result = {"capacity": 894 * M, "runs": [
        fake_run("kubelet (v1.37)", True, 36), fake_run("effective / Tiered", True, 20),
        fake_run("effective / Tiered", False, 60, stopped="thrashing"),
        fake_run("effective / Hard", True, 0, error="skipped (budget 1200 s)")]}
    out = lent.render(result, {"started": "2026-11-28 14:30"}, {"commit": "abc1234"})
    rows = [l for l in out.splitlines() if l.startswith("| ") and not l.startswith("| layout")]
    # sorted as the layouts are listed, the runs with the option on first
    assert [r.split(" | ")[0:2] for r in rows] == [["| effective / Tiered", "on"], ["| effective / Hard", "on"],
                                                    ["| kubelet (v1.37)", "on"], ["| effective / Tiered", "off"]]
    assert rows[0].endswith("| **no** |") and rows[2].endswith("| yes |") and rows[1].endswith("| not run |")
    assert "floors reached, +16 MiB; 420 MiB in 31.5 s" in rows[2]
    cases = [l for l in out.splitlines() if l.startswith("- ")]
    assert cases[0].startswith("- effective / Tiered, recursiveprot on: **disagreed**: be: kept 20 MiB")
    assert cases[1] == "- effective / Hard, recursiveprot on: not measured (skipped (budget 1200 s))"
    assert cases[2] == "- kubelet (v1.37), recursiveprot on: agreed"
    assert cases[3] == ("- effective / Tiered, recursiveprot off: agreed (not pressed down to the floor:"
                        " be 60 > floor 32 + 8)")
    assert out.startswith("<!-- lent:start -->") and out.endswith("<!-- lent:end -->")
