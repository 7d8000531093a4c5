"""The diff and its order: only what differs, and no child ever above its parent."""

import pytest
from hypothesis import given, settings, strategies as st

from memqos_systemd.naming import Naming
from memqos_systemd.plan import INFINITY, Plan, UnitPlan
from memqos_systemd.reconcile import DEFAULTS, diff, kernel_lost, reset_plan

MI = 2**20
NAMING = Naming("/")
G_UID = "6a4f2e3b-1c9d-4a5e-8f7b-2d3e4f5a6b7c"
B_UID = "8b3c7d2e-4f5a-6b7c-9d1e-3f4a5b6c7d8e"
GPOD = NAMING.pod_slice("Guaranteed", G_UID)
BPOD = NAMING.pod_slice("Burstable", B_UID)
GCTR = "cri-containerd-" + "a" * 64 + ".scope"
BCTR = "cri-containerd-" + "b" * 64 + ".scope"


def tree(g: int, b: int, high: int = INFINITY) -> Plan:
    """kubepods > (G pod > G ctr), (burstable > B pod > B ctr), besteffort; tiered-style values."""
    units = (
        UnitPlan("kubepods.slice", "node", None, g, b),
        UnitPlan("kubepods-burstable.slice", "qos", "kubepods.slice", 0, b),
        UnitPlan("kubepods-besteffort.slice", "qos", "kubepods.slice", 0, 0),
        UnitPlan(GPOD, "pod", "kubepods.slice", g, 0, INFINITY, "ns/g"),
        UnitPlan(BPOD, "pod", "kubepods-burstable.slice", 0, b, INFINITY, "ns/b"),
        UnitPlan(GCTR, "container", GPOD, g, 0, INFINITY, "ns/g"),
        UnitPlan(BCTR, "container", BPOD, 0, b, high, "ns/b"),
    )
    return Plan(16 << 30, 15 << 30, units)


def held(p: Plan) -> dict:
    return {u.unit: u.properties() for u in p.units}


def test_steady_node_sends_nothing():
    p = tree(512 * MI, 256 * MI)
    assert diff(p, held(p), NAMING) == []


def test_growth_goes_parents_first():
    changes = diff(tree(512 * MI, 256 * MI), held(tree(0, 0)), NAMING)
    order = [c.unit for c in changes]
    assert order == ["kubepods.slice", "kubepods-burstable.slice", GPOD, BPOD, GCTR, BCTR]
    assert all(c.direction == "grow" for c in changes)
    assert changes[0].props == {"MemoryMin": 512 * MI, "MemoryLow": 256 * MI}


def test_shrink_goes_children_first():
    changes = diff(tree(0, 0), held(tree(512 * MI, 256 * MI)), NAMING)
    assert [c.unit for c in changes] == [BCTR, GCTR, BPOD, GPOD, "kubepods-burstable.slice", "kubepods.slice"]
    assert all(c.direction == "shrink" for c in changes)


def test_only_differing_properties_are_sent():
    changes = diff(tree(512 * MI, 256 * MI, high=900 * MI), held(tree(512 * MI, 256 * MI)), NAMING)
    assert [(c.unit, dict(c.props)) for c in changes] == [(BCTR, {"MemoryHigh": 900 * MI})]


def test_pod_and_container_units_are_never_created():
    observed = held(tree(0, 0))
    observed[BPOD] = None  # the pod slice has gone (or is not there yet)
    del observed[BCTR]
    units = [c.unit for c in diff(tree(0, 256 * MI), observed, NAMING)]
    assert BPOD not in units and BCTR not in units
    assert units == ["kubepods.slice", "kubepods-burstable.slice"]


def test_the_kubepods_tree_is_never_created_only_written_once_the_kubelet_has_made_it():
    # A slice created by SetUnitProperties keeps its values in system.control drop-ins that win
    # over the kubelet's transient unit at every daemon-reload (45-stale-dropins): wait for it.
    observed = {u: None for u in held(tree(0, 0))}
    assert diff(tree(512 * MI, 256 * MI), observed, NAMING) == []
    observed["kubepods.slice"] = dict(DEFAULTS)  # the kubelet made kubepods.slice, not the QoS slices yet
    changes = diff(tree(512 * MI, 256 * MI), observed, NAMING)
    assert [c.unit for c in changes] == ["kubepods.slice"]
    assert changes[0].must_exist


RESERVED = Naming("/", ("/system.slice", "/kube-reserved.slice"))


def test_reserved_slices_are_created_when_they_must_hold_something():
    p = Plan(16 << 30, 15 << 30, tree(0, 0).units + (
        UnitPlan("system.slice", "reserved", None, 256 * MI, 0),
        UnitPlan("kube-reserved.slice", "reserved", None, 0, 0)))
    observed = {u.unit: u.properties() for u in tree(0, 0).units}
    observed["system.slice"] = observed["kube-reserved.slice"] = None
    changes = diff(p, observed, RESERVED)
    assert [(c.unit, dict(c.props), c.must_exist) for c in changes] == [
        ("system.slice", {"MemoryMin": 256 * MI}, False)]  # nothing to hold: kube-reserved not made


def test_a_reserved_slice_dropped_from_the_config_is_reset_once_and_only_if_loaded():
    p = tree(0, 0)
    observed = held(p)
    observed["system.slice"] = {"MemoryMin": 256 * MI, "MemoryLow": 0, "MemoryHigh": INFINITY}
    observed["kube-reserved.slice"] = None  # not loaded: nothing to do, nothing created
    changes = diff(p, observed, NAMING, retired=["system.slice", "kube-reserved.slice"])
    assert [(c.unit, dict(c.props), c.direction) for c in changes] == [("system.slice", {"MemoryMin": 0}, "shrink")]
    observed["system.slice"] = dict(DEFAULTS)
    assert diff(p, observed, NAMING, retired=["system.slice"]) == []
    # Without the hint, a slice that is not ours is never touched.
    observed["system.slice"] = {"MemoryMin": 256 * MI, "MemoryLow": 0, "MemoryHigh": INFINITY}
    assert diff(p, observed, NAMING) == []


def test_orphaned_pod_units_are_reset_children_first_before_their_parents_shrink():
    observed = held(tree(512 * MI, 256 * MI))
    desired = Plan(16 << 30, 15 << 30, tuple(u for u in tree(512 * MI, 0).units if u.unit not in (BPOD, BCTR)))
    changes = diff(desired, observed, NAMING)
    assert [c.unit for c in changes] == [BCTR, BPOD, "kubepods-burstable.slice", "kubepods.slice"]
    assert changes[0].props == {"MemoryLow": 0}


def test_units_that_are_not_ours_are_never_touched():
    observed = held(tree(0, 0))
    observed["sshd.service"] = {"MemoryMin": 5, "MemoryLow": 5, "MemoryHigh": 5}
    observed["kubepods-burstable-pod..%2Fetc.slice"] = {"MemoryMin": 5, "MemoryLow": 0, "MemoryHigh": INFINITY}
    assert diff(tree(0, 0), observed, NAMING) == []
    assert all(c.unit in held(tree(0, 0)) for c in reset_plan(observed, NAMING))


def test_reset_brings_every_unit_of_ours_to_defaults_children_first():
    observed = held(tree(512 * MI, 256 * MI, high=900 * MI))
    changes = reset_plan(observed, NAMING)
    order = [c.unit for c in changes]
    assert set(order[:2]) == {BCTR, GCTR} and set(order[2:4]) == {BPOD, GPOD}
    assert order[4:] == ["kubepods-burstable.slice", "kubepods.slice"]
    final = dict(observed)
    for c in changes:
        final[c.unit] = {**final[c.unit], **c.props}
    assert all(v == DEFAULTS for v in final.values())


# ---- every prefix of an apply keeps children at or below their parents

amounts = st.integers(min_value=0, max_value=4096).map(lambda n: n * MI)


def violations(p: Plan, state: dict) -> list[str]:
    bad = []
    for u in p.units:
        if u.parent is None:
            continue
        for prop in ("MemoryMin", "MemoryLow"):
            if state[u.unit][prop] > state[u.parent][prop]:
                bad.append(f"{u.unit} {prop} above {u.parent}")
    return bad


@settings(max_examples=300, deadline=None)
@given(g0=amounts, b0=amounts, g1=amounts, b1=amounts)
def test_no_prefix_of_an_apply_puts_a_child_above_its_parent(g0, b0, g1, b1):
    before, after = tree(g0, b0), tree(g1, b1)
    state = held(before)
    assert not violations(after, state)
    for change in diff(after, state, NAMING):
        state[change.unit] = {**state[change.unit], **change.props}
        assert not violations(after, state), change
    assert state == held(after)


def test_a_unit_whose_values_were_not_read_gets_all_three_in_one_write_in_its_place():
    """UNREAD (a pod slice taken by the invocation ID on its cgroup): what it holds is unknown, so
    every planned value is sent, in the grow pass after its parents; a unit whose plan is all
    defaults gets them in the shrink pass."""
    from memqos_systemd.reconcile import UNREAD

    p = tree(512 * MI, 256 * MI)
    have = held(p)
    have[BPOD] = UNREAD
    changes = diff(p, have, NAMING)
    assert [(c.unit, dict(c.props), c.direction) for c in changes] == [
        (BPOD, {"MemoryMin": 0, "MemoryLow": 256 * MI, "MemoryHigh": INFINITY}, "grow")]

    have = {**held(p), "kubepods-besteffort.slice": held(p)["kubepods-besteffort.slice"]}
    besteffort_pod = NAMING.pod_slice("BestEffort", G_UID)
    plan = Plan(p.capacity, p.allocatable, p.units + (
        UnitPlan(besteffort_pod, "pod", "kubepods-besteffort.slice", 0, 0, INFINITY, "ns/be"),))
    have[besteffort_pod] = UNREAD
    have[BPOD] = {"MemoryMin": 0, "MemoryLow": 0, "MemoryHigh": INFINITY}  # grows: parents first
    changes = diff(plan, have, NAMING)
    assert [(c.unit, c.direction) for c in changes] == [(BPOD, "grow"), (besteffort_pod, "shrink")]
    assert dict(changes[1].props) == DEFAULTS


def test_a_unit_whose_values_were_not_read_is_never_taken_for_an_orphan():
    """Orphans are reset to what they held minus ours; with nothing read there is nothing to
    compare, and the full re-read finds its values later."""
    from memqos_systemd.reconcile import UNREAD

    p = tree(512 * MI, 256 * MI)
    stray = NAMING.pod_slice("Burstable", "00000000-0000-4000-8000-000000000001")
    assert diff(p, {**held(p), stray: UNREAD}, NAMING) == []


# ---- in-place resize (issue 16): the diff of two plans of the same pod, as the kubelet reports it

def _resize_pod_list(**changes) -> list:
    """The pod "running" of a real v1.35 /pods answer (512Mi/1Gi, allocated and enacted), with
    its container's spec and status replaced by `changes`, beside a pod that stays as it is."""
    import copy
    import json
    from pathlib import Path

    with open(Path(__file__).parent / "data" / "kubelet-pods-resize-v1.35.json") as f:
        items = {i["metadata"]["name"]: i for i in json.load(f)["items"]}
    pod = copy.deepcopy(items["running"])
    c, cs = pod["spec"]["containers"][0], pod["status"]["containerStatuses"][0]
    c["resources"] = changes.get("spec", c["resources"])
    cs["allocatedResources"] = changes.get("allocated", cs["allocatedResources"])
    cs["resources"] = changes.get("enacted", cs["resources"])
    pod["status"]["conditions"] += changes.get("conditions", [])
    return [pod, items["done"]]  # "done": 768Mi, a neighbour in the same QoS slice


def _resize_plan(**changes) -> Plan:
    from memqos_systemd.config import parse_config
    from memqos_systemd.plan import NodeFacts, plan
    from memqos_systemd.pods import parse_pods

    pods, _ = parse_pods(_resize_pod_list(**changes))
    return plan(pods, NodeFacts(16 << 30, 4096), parse_config({"memoryReservationPolicy": "TieredReservation"}))


RESIZE_POD = NAMING.pod_slice("Burstable", "5d1c9a0e-7b3f-4c2a-9e61-000000000002")
IN_PROGRESS = [{"type": "PodResizeInProgress", "status": "True", "observedGeneration": 2}]
GROWN = {"spec": {"requests": {"cpu": "250m", "memory": "768Mi"}, "limits": {"cpu": "500m", "memory": "1536Mi"}},
         "allocated": {"cpu": "250m", "memory": "768Mi"}}
# memory.high = floor((req + 0.9 × (limit − req)) / 4 KiB) × 4 KiB:
HIGH_512 = 1020051456   # 512Mi + 0.9 × 512Mi = 972.8Mi = 1020054732.8 bytes -> 249036 pages
HIGH_768 = 1530081280   # 768Mi + 0.9 × 768Mi = 1459.2Mi = 1530082508.8 bytes -> 373555 pages


def _scope_of(p: Plan) -> str:
    return next(u.unit for u in p.units if u.level == "container" and u.parent == RESIZE_POD)


def test_a_resize_in_progress_grows_parents_first():
    before = _resize_plan()
    after = _resize_plan(**GROWN, conditions=IN_PROGRESS)  # allocated 768Mi; still enacted 512Mi/1Gi
    changes = diff(after, held(before), NAMING)
    scope = _scope_of(after)
    # kubepods and burstable: 512Mi + 768Mi -> 768Mi + 768Mi (the neighbour "done" holds 768Mi)
    assert [(c.unit, dict(c.props), c.direction) for c in changes] == [
        ("kubepods.slice", {"MemoryLow": 1536 * MI}, "grow"),
        ("kubepods-burstable.slice", {"MemoryLow": 1536 * MI}, "grow"),
        (RESIZE_POD, {"MemoryLow": 768 * MI}, "grow"),
        (scope, {"MemoryLow": 768 * MI, "MemoryHigh": HIGH_768}, "grow"),
    ]
    assert held(before)[scope] == {"MemoryMin": 0, "MemoryLow": 512 * MI, "MemoryHigh": HIGH_512}
    assert held(before)["kubepods.slice"]["MemoryLow"] == 1280 * MI


def test_a_resize_back_down_shrinks_children_first():
    grown = _resize_plan(**GROWN, enacted={"requests": {"cpu": "250m", "memory": "768Mi"},
                                           "limits": {"cpu": "500m", "memory": "1536Mi"}})
    after = _resize_plan(conditions=IN_PROGRESS, enacted=GROWN["spec"])  # back to 512Mi, allocated
    changes = diff(after, held(grown), NAMING)
    assert [(c.unit, dict(c.props), c.direction) for c in changes] == [
        (_scope_of(after), {"MemoryLow": 512 * MI, "MemoryHigh": HIGH_512}, "shrink"),
        (RESIZE_POD, {"MemoryLow": 512 * MI}, "shrink"),
        ("kubepods-burstable.slice", {"MemoryLow": 1280 * MI}, "shrink"),
        ("kubepods.slice", {"MemoryLow": 1280 * MI}, "shrink"),
    ]


def test_a_pending_resize_changes_nothing():
    before = _resize_plan()
    for reason in ("Deferred", "Infeasible"):
        pending = [{"type": "PodResizePending", "status": "True", "reason": reason, "observedGeneration": 2}]
        huge = {"requests": {"cpu": "250m", "memory": "64Gi"}, "limits": {"cpu": "500m", "memory": "96Gi"}}
        assert diff(_resize_plan(spec=huge, conditions=pending), held(before), NAMING) == []
        assert diff(_resize_plan(spec=GROWN["spec"], conditions=pending), held(before), NAMING) == []


# ---- MemoryMax: the BestEffort ceiling, on that slice alone (issue 25) ----------------------------
BE = "kubepods-besteffort.slice"


def with_ceiling(p: Plan, value: int | None) -> Plan:
    import dataclasses
    return dataclasses.replace(p, units=tuple(dataclasses.replace(u, memory_max=value) if u.unit == BE else u
                                              for u in p.units))


def test_memorymax_goes_up_in_the_grow_pass_and_down_in_the_shrink_pass():
    observed = held(with_ceiling(tree(512 * MI, 256 * MI), 900 * MI))
    up = diff(with_ceiling(tree(512 * MI, 256 * MI), 1200 * MI), observed, NAMING)
    assert [(c.unit, dict(c.props), c.direction) for c in up] == [(BE, {"MemoryMax": 1200 * MI}, "grow")]
    # More protection and a lower ceiling (a new Burstable pod): the protection grows first, parents
    # first; the ceiling comes down in the shrink pass.
    down = diff(with_ceiling(tree(512 * MI, 300 * MI), 700 * MI), observed, NAMING)
    assert [(c.unit, c.direction) for c in down] == [("kubepods.slice", "grow"), ("kubepods-burstable.slice", "grow"),
                                                     (BPOD, "grow"), (BCTR, "grow"), (BE, "shrink")]


def test_a_memorymax_that_is_not_planned_is_never_touched():
    """The runtime's limit on a container scope, the kubelet's on kubepods.slice, the kubelet's
    QOSReserved on the BestEffort slice while the ceiling is off: held, never ours."""
    p = tree(512 * MI, 256 * MI)
    observed = {u: {**v, "MemoryMax": 123 * MI} for u, v in held(p).items()}
    assert diff(p, observed, NAMING) == []
    assert all("MemoryMax" not in c.props for c in reset_plan(observed, NAMING))


def test_a_planned_memorymax_not_read_yet_is_taken_as_infinity():
    p = with_ceiling(tree(0, 0), 900 * MI)
    assert [(c.unit, dict(c.props), c.direction) for c in diff(p, held(tree(0, 0)), NAMING)] == [
        (BE, {"MemoryMax": 900 * MI}, "shrink")]


def test_while_holding_memorymax_moves_neither_way():
    from memqos_systemd.reconcile import grow_only
    observed = held(with_ceiling(tree(0, 0), 900 * MI))
    for value in (500 * MI, 1200 * MI):
        assert grow_only(diff(with_ceiling(tree(0, 0), value), observed, NAMING)) == []


def test_reset_takes_back_the_memorymax_of_the_ceilings_it_is_told_of():
    observed = held(with_ceiling(tree(512 * MI, 256 * MI), 900 * MI))
    changes = reset_plan(observed, NAMING, max_units={BE})
    assert (BE, {"MemoryMax": INFINITY}) in [(c.unit, dict(c.props)) for c in changes]
    assert all("MemoryMax" not in c.props for c in changes if c.unit != BE)
    assert all("MemoryMax" not in c.props for c in reset_plan(observed, NAMING))  # not ours: left
    observed[BE]["MemoryMax"] = INFINITY
    assert BE not in [c.unit for c in reset_plan(observed, NAMING, max_units={BE})]


# ---- the kernel shows less than systemd holds (issue 29) -------------------------------------------
PAGE = 4096


@pytest.mark.parametrize("held, kernel, lost", [
    # The kernel shows what systemd applied: page-rounded down, infinity as is.
    ({"MemoryMin": 100 * MI, "MemoryLow": 0, "MemoryHigh": INFINITY},
     {"MemoryMin": 100 * MI, "MemoryLow": 0, "MemoryHigh": INFINITY}, {}),
    ({"MemoryMin": 0, "MemoryLow": 10_000_000, "MemoryHigh": 300_000_000},
     {"MemoryMin": 0, "MemoryLow": 9_998_336, "MemoryHigh": 299_999_232}, {}),
    # A cgroupfs writer's zeros (koordlet, a person, libcontainer's file write after its D-Bus call).
    ({"MemoryMin": 100 * MI, "MemoryLow": 50 * MI, "MemoryHigh": INFINITY},
     {"MemoryMin": 0, "MemoryLow": 50 * MI, "MemoryHigh": INFINITY}, {"MemoryMin": 0}),
    ({"MemoryMin": 100 * MI, "MemoryLow": 50 * MI, "MemoryHigh": INFINITY},
     {"MemoryMin": 0, "MemoryLow": 4096, "MemoryHigh": INFINITY}, {"MemoryMin": 0, "MemoryLow": 4096}),
    # More protection than the unit's own: a parent's DefaultMemoryLow=/DefaultMemoryMin= does that.
    ({"MemoryMin": 0, "MemoryLow": 0, "MemoryHigh": INFINITY},
     {"MemoryMin": 64 * MI, "MemoryLow": 64 * MI, "MemoryHigh": INFINITY}, {}),
    # memory.high other than systemd's, either way: a throttle the plan has not, or one it lost.
    ({"MemoryMin": 0, "MemoryLow": 0, "MemoryHigh": 900 * MI},
     {"MemoryMin": 0, "MemoryLow": 0, "MemoryHigh": 100 * MI}, {"MemoryHigh": 100 * MI}),
    ({"MemoryMin": 0, "MemoryLow": 0, "MemoryHigh": 900 * MI},
     {"MemoryMin": 0, "MemoryLow": 0, "MemoryHigh": INFINITY}, {"MemoryHigh": INFINITY}),
    ({"MemoryMin": 0, "MemoryLow": 0, "MemoryHigh": INFINITY},
     {"MemoryMin": 0, "MemoryLow": 0, "MemoryHigh": 1 << 30}, {"MemoryHigh": 1 << 30}),
    # MemoryMax (the BestEffort ceiling's) is not compared: a rival writer of it is heeded, not fought
    # (ceiling_watch.stand_down), and a lower memory.max only caps BestEffort harder.
    ({"MemoryMin": 0, "MemoryLow": 0, "MemoryHigh": INFINITY, "MemoryMax": 1 << 30},
     {"MemoryMin": 0, "MemoryLow": 0, "MemoryHigh": INFINITY, "MemoryMax": 1 << 29}, {}),
    # What is not known on one side is not compared.
    ({"MemoryMin": 100 * MI}, {"MemoryMin": 0, "MemoryLow": 0, "MemoryHigh": 0}, {"MemoryMin": 0}),
    ({"MemoryMin": 100 * MI, "MemoryLow": 0, "MemoryHigh": INFINITY}, {}, {}),
])
def test_kernel_lost(held, kernel, lost):
    assert kernel_lost(held, kernel, PAGE) == lost


def test_a_property_the_kernel_lost_while_systemd_holds_the_plan_is_set_again():
    p = tree(512 * MI, 256 * MI)
    changes = diff(p, held(p), NAMING, lost={"kubepods.slice": {"MemoryMin": 0}})
    assert [(c.unit, dict(c.props), c.direction) for c in changes] == [
        ("kubepods.slice", {"MemoryMin": 512 * MI}, "grow")]  # only what the kernel lost


def test_what_the_kernel_lost_goes_in_the_order_its_kernel_value_calls_for():
    """Raising a zeroed parent back is a grow (parents first); lowering a memory.high a writer
    lifted is a shrink (children first); a pod slice's and its parent's in one diff keep the order."""
    p = tree(512 * MI, 256 * MI, high=900 * MI)
    lost = {"kubepods.slice": {"MemoryLow": 0}, BPOD: {"MemoryLow": 0}, BCTR: {"MemoryHigh": INFINITY}}
    changes = diff(p, held(p), NAMING, lost=lost)
    assert [(c.unit, dict(c.props), c.direction) for c in changes] == [
        ("kubepods.slice", {"MemoryLow": 256 * MI}, "grow"), (BPOD, {"MemoryLow": 256 * MI}, "grow"),
        (BCTR, {"MemoryHigh": 900 * MI}, "shrink")]


def test_systemd_holding_other_values_is_sent_as_ever_whatever_the_kernel_shows():
    """A writer through systemd and then the file (libcontainer's Set): systemd's values differ from
    the plan, so the diff sends them anyway; also a value the kernel shows as planned while systemd
    holds another (it would come back at the next daemon-reload)."""
    p = tree(512 * MI, 256 * MI)
    observed = held(p)
    observed["kubepods.slice"] = {**observed["kubepods.slice"], "MemoryMin": 0}
    changes = diff(p, observed, NAMING, lost={"kubepods.slice": {"MemoryMin": 0}})
    assert [(c.unit, dict(c.props)) for c in changes] == [("kubepods.slice", {"MemoryMin": 512 * MI})]
    observed["kubepods.slice"] = {**observed["kubepods.slice"], "MemoryMin": 600 * MI}
    changes = diff(p, observed, NAMING, lost={"kubepods.slice": {"MemoryMin": 512 * MI}})
    assert [(c.unit, dict(c.props), c.direction) for c in changes] == [
        ("kubepods.slice", {"MemoryMin": 512 * MI}, "shrink")]


def test_what_the_kernel_shows_of_a_unit_not_read_or_not_loaded_changes_nothing():
    p = tree(512 * MI, 256 * MI)
    observed = held(p)
    observed[BPOD] = None
    assert diff(p, observed, NAMING, lost={BPOD: {"MemoryLow": 0}}) == []
