"""Companion mode, the pure parts (issues 36, 42): a plan beside the kubelet holds none of what the
kubelet writes as its own configuration makes it (kubelet_gate.writes), shows the kubelet's values
computed with its policy and factor (never ours), and keeps ours everywhere else; totals count each
byte once; the diff sends none of the kubelet's, and takes back no pod value it writes. The mode
itself: tests/unit/test_kubelet_gate.py. The daemon's side: tests/integration/test_daemon_companion.py."""

from __future__ import annotations

import pytest
from test_plan import Gi, Mi, C, P, cfg, pod_unit, scope

from memqos_systemd.kubelet_gate import Gate, KubeletFacts, Writes, writes
from memqos_systemd.naming import Naming
from memqos_systemd import features
from memqos_systemd.features import plan_all
from memqos_systemd.plan import BRIDGE_LEVELS, HAND_BACK_LEVELS, INFINITY, NodeFacts, plan
from memqos_systemd.reconcile import diff

ON = Gate(True, "its /metrics")
TIERED = writes(KubeletFacts(ON, "TieredReservation"))  # its gate on, TieredReservation, no factor
DEFAULTS = writes(KubeletFacts(ON, "None"))  # a v1.37 kubelet at its defaults: None, no factor
TIERED_FACTOR = writes(KubeletFacts(ON, "TieredReservation", factor=0.9))

PODS = [P("g", "Guaranteed", 1, C("c", 512 * Mi, 512 * Mi, 1)),
        P("b", "Burstable", 2, C("c", 256 * Mi, 1 * Gi, 2)),
        P("e", "BestEffort", 3, C("c", 0, None, 3))]
KEYS = dict(memoryReservationPolicy="TieredReservation", enforceNodeAllocatable=["pods", "kube-reserved"],
            kubeReservedCgroup="/kube.slice", kubeReserved={"memory": "300Mi"}, bestEffortCeiling={"enabled": True})


def companion_plan(kubelet: Writes = TIERED, hand_back: bool = False, bridge: bool = False, **keys):
    return plan_all(PODS, NodeFacts(16 * Gi, 4096, kubelet=kubelet, hand_back=hand_back, bridge=bridge),
                    cfg(**{**KEYS, **keys}))


def alone(**keys):
    return plan_all(PODS, NodeFacts(16 * Gi, 4096), cfg(**{**KEYS, **keys}))


def test_beside_tiered_reservation_its_protection_is_left_to_it_and_memoryhigh_is_ours():
    p = companion_plan()
    assert p.companion
    held = {unit: props for unit, _, props in p.targets if props}
    # No MemoryMin nor MemoryLow of the kubepods tree, nor the reserved slice's MemoryMin, is ours.
    assert not any({"MemoryMin", "MemoryLow"} & set(props) for unit, props in held.items()
                   if unit != "kube.slice"), held
    assert "MemoryMin" not in held.get("kube.slice", {})
    # With no factor the kubelet writes no MemoryHigh: ours, planned by our config.
    ours = alone().by_unit()
    assert held[scope(2)] == {"MemoryHigh": ours[scope(2)].memory_high} and ours[scope(2)].memory_high < INFINITY
    assert held["kubepods-besteffort.slice"]["MemoryMax"] == p.ceiling.memory_max
    # The kubelet's values, shown as its own layout makes them (v1.37: kubepods min G+B, low B).
    units = p.by_unit()
    assert units["kubepods.slice"].memory_min == 768 * Mi and units["kubepods.slice"].memory_low == 256 * Mi
    assert units[pod_unit(2)].memory_low == 256 * Mi and units[pod_unit(2)].kubelet == {"MemoryMin", "MemoryLow"}
    assert units[scope(1)].memory_min == 512 * Mi and units["kube.slice"].memory_min == 300 * Mi


def test_beside_a_kubelet_at_its_defaults_every_pod_is_protected_by_ours():
    """Issue 42: a v1.37 kubelet at its defaults writes no pod's protection: ours, all of it."""
    p, mine = companion_plan(DEFAULTS), alone()
    assert p.companion and p.by_unit().keys() == mine.by_unit().keys()
    for u in p.units:
        m = mine.by_unit()[u.unit]
        if u.level == "reserved":  # its gate on: the reserved slice's MemoryMin is the kubelet's
            assert u.kubelet == {"MemoryMin"}
        else:
            assert not u.kubelet and u.properties() == m.properties(), u.unit
    assert p.protected() == (*mine.protected()[:2], 0, 0) and p.protected()[0] > 0


def test_the_kubelets_values_are_its_own_configs_never_ours():
    """Our policy None, its TieredReservation: its values still show its requests; our factor 0.5,
    its 0.9: its MemoryHigh is 0.9's."""
    p = companion_plan(TIERED_FACTOR, memoryReservationPolicy="None", memoryThrottlingFactor=0.5)
    theirs = companion_plan(TIERED_FACTOR, memoryThrottlingFactor=0.9).by_unit()
    for u in p.units:
        if u.level in ("pod", "container"):
            assert {"MemoryMin", "MemoryLow", "MemoryHigh"} <= u.kubelet
            assert (u.memory_min, u.memory_low, u.memory_high) == (theirs[u.unit].memory_min,
                                                                   theirs[u.unit].memory_low, theirs[u.unit].memory_high)
    assert p.by_unit()[pod_unit(2)].memory_low == 256 * Mi


def test_the_plan_is_ours_where_ours_apply_whatever_hierarchy_says():
    # The kubelet's values: its layout, whatever ours is; ours (MemoryHigh) by our hierarchy.
    eff, kub = companion_plan(hierarchy="effective").by_unit(), companion_plan(hierarchy="kubelet").by_unit()
    for unit, u in eff.items():
        for prop, field in (("MemoryMin", "memory_min"), ("MemoryLow", "memory_low")):
            if prop in u.kubelet:
                assert getattr(u, field) == getattr(kub[unit], field), unit


def test_totals_count_each_byte_once():
    """The pods request 768Mi (512Mi Guaranteed, 256Mi Burstable): never 1Gi (Burstable twice)."""
    for p in (companion_plan(), companion_plan(DEFAULTS), alone()):
        mins, lows, kmin, klow = p.protected()
        pods = [u for u in p.units if u.level == "pod"]
        assert mins == sum(u.memory_min for u in pods) and lows == sum(u.memory_low for u in pods)
        assert mins + lows == 768 * Mi
    assert companion_plan().protected()[2:] == (512 * Mi, 256 * Mi)
    assert companion_plan(DEFAULTS).protected()[2:] == (0, 0)


def test_the_ceiling_beside_the_kubelet_is_the_one_planned_alone():
    assert companion_plan().ceiling == alone().ceiling


def test_the_diff_beside_the_kubelet_sends_nothing_it_writes_and_takes_back_none_of_its_pod_values():
    p = companion_plan()
    naming = Naming.for_config(cfg(**KEYS))
    theirs = {"MemoryMin": 7 * Mi, "MemoryLow": 9 * Mi}
    observed = {u: {**dict(props), **theirs} for u, _, props in p.targets}
    observed["kube.slice"] = {"MemoryMin": 7 * Mi, "MemoryLow": 0, "MemoryHigh": INFINITY}
    observed["kubepods-burstable-pod00000000_0000_0000_0000_000000000099.slice"] = {**theirs, "MemoryHigh": 5 * Mi}
    observed[f"cri-containerd-{99:064x}.scope"] = {**theirs, "MemoryHigh": 5 * Mi}
    observed["system.slice"] = {"MemoryMin": 7 * Mi, "MemoryLow": 0, "MemoryHigh": INFINITY}
    changes = diff(p, observed, naming)
    # Only ours goes back on units the plan does not name: their MemoryHigh; the kubelet's min and low stay.
    assert {(c.unit, tuple(sorted(c.props))) for c in changes} == {
        ("kubepods-burstable-pod00000000_0000_0000_0000_000000000099.slice", ("MemoryHigh",)),
        (f"cri-containerd-{99:064x}.scope", ("MemoryHigh",))}
    # A reserved slice the config dropped: its MemoryMin is the kubelet's, not taken back.
    assert diff(p, observed, naming, retired=["system.slice"]) == changes


def test_handing_back_sends_the_kubelets_values_once_where_it_writes_them_only_at_creation():
    p = companion_plan(hand_back=True)
    for u in p.units:
        if u.level in HAND_BACK_LEVELS:
            assert not u.kubelet  # sent: its own values, so nothing of ours stays there
        elif u.level in ("node", "qos"):
            assert u.kubelet  # it rewrites those every minute itself
    values = p.by_unit()
    assert values[scope(2)].memory_low == 256 * Mi and values[scope(2)].memory_min == 0
    assert values["kube.slice"].memory_min == 300 * Mi


def test_bridging_its_start_sends_its_own_values_on_the_node_and_qos_slices_only():
    """Its start zeros the node and QoS slices under TieredReservation too (e2e 59): while bridged,
    its values are sent there (never ours), and nothing else of its is."""
    held, bridged = companion_plan().by_unit(), companion_plan(bridge=True)
    for u in bridged.units:
        if u.level in BRIDGE_LEVELS:
            assert not u.kubelet and (u.memory_min, u.memory_low) == (held[u.unit].memory_min, held[u.unit].memory_low)
        else:
            assert u.kubelet == held[u.unit].kubelet
    assert bridged.by_unit()["kubepods.slice"].memory_min > 0
    # At its defaults nothing there is its own: the same plan, bridged or not.
    assert companion_plan(DEFAULTS, bridge=True).units == companion_plan(DEFAULTS).units
    assert TIERED.without(BRIDGE_LEVELS).at("node") == frozenset() and TIERED.without(BRIDGE_LEVELS).protects


@pytest.mark.parametrize("kubelet, on", [(Writes(), ("burstableHigh",)), (DEFAULTS, ("burstableHigh",)),
                                         (TIERED, ("burstableHigh",)), (TIERED_FACTOR, ())])
def test_the_burstable_lever_is_on_unless_the_kubelet_writes_the_pods_memoryhigh(kubelet, on):
    naming = Naming.for_config(cfg())
    made = features.offline()
    assert features.on(made, naming, cfg(burstableHigh={"enabled": True}), kubelet) == on
    assert features.on(made, naming, cfg(), kubelet) == ()
