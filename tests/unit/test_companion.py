"""Companion mode, the pure parts (issue 36): the mode from `companion:` and the kubelet's gate; a
plan beside the kubelet holds none of what the kubelet writes; the diff sends none of it, and takes
back no pod the kubelet's values are on. The daemon's side: tests/integration/test_daemon_companion.py."""

from __future__ import annotations

import pytest
from test_plan import Gi, Mi, C, P, cfg, pod_unit, scope

from memqos_systemd.kubelet_gate import KUBELET_OWNS, Gate, companion_mode, kubelet_owns
from memqos_systemd.naming import Naming
from memqos_systemd.plan import INFINITY, NodeFacts, plan
from memqos_systemd.reconcile import diff

ON, OFF, UNKNOWN = Gate(True, "its /metrics"), Gate(False, "its /metrics"), Gate(None, "not known")


@pytest.mark.parametrize("setting, gate, companion, says", [
    ("auto", ON, True, "the kubelet's own Memory QoS is on (its /metrics)"),
    ("auto", OFF, False, "the kubelet's own Memory QoS is off (its /metrics)"),
    ("auto", UNKNOWN, False, "is not known (not known); set companion: on or off"),
    ("on", OFF, True, "companion: on in the config"),
    ("on", UNKNOWN, True, "companion: on in the config"),
    ("off", ON, False, "companion: off in the config"),
])
def test_the_mode_follows_the_kubelet_unless_the_config_forces_it(setting, gate, companion, says):
    mode = companion_mode(setting, gate)
    assert mode.companion is companion and says in mode.why


def test_the_kubelet_owns_its_memory_qos_values_at_every_level_and_no_memorymax():
    for level in ("node", "reserved", "qos", "pod", "container"):
        assert kubelet_owns(level) == {"MemoryMin", "MemoryLow", "MemoryHigh"}
    assert all("MemoryMax" not in props for props in KUBELET_OWNS.values())


PODS = [P("g", "Guaranteed", 1, C("c", 512 * Mi, 512 * Mi, 1)),
        P("b", "Burstable", 2, C("c", 256 * Mi, 1 * Gi, 2)),
        P("e", "BestEffort", 3, C("c", 0, None, 3))]
KEYS = dict(memoryReservationPolicy="TieredReservation", enforceNodeAllocatable=["pods", "kube-reserved"],
            kubeReservedCgroup="/kube.slice", kubeReserved={"memory": "300Mi"}, bestEffortCeiling={"enabled": True})


def companion_plan(**keys):
    return plan(PODS, NodeFacts(16 * Gi, 4096, kubelet_writes=True), cfg(**{**KEYS, **keys}))


def test_beside_the_kubelet_only_the_ceiling_is_held():
    p = companion_plan()
    assert p.companion
    held = {unit: props for unit, _, props in p.targets if props}
    assert held == {"kubepods-besteffort.slice": {"MemoryMax": p.ceiling.memory_max}}
    # The kubelet's, shown: the reservation as the reserved slice's MemoryMin (enforceExistingCgroup).
    assert p.by_unit()["kube.slice"].memory_min == 300 * Mi
    # What the kubelet writes is still planned, to be shown: its layout (hierarchy: kubelet).
    units = p.by_unit()
    assert units[pod_unit(2)].memory_low == 256 * Mi and units[pod_unit(2)].kubelet == KUBELET_OWNS["pod"]
    assert units[scope(1)].memory_min == 512 * Mi and units["kubepods.slice"].memory_min == 768 * Mi


def test_beside_the_kubelet_the_plan_is_its_layout_whatever_hierarchy_says():
    assert companion_plan(hierarchy="effective").by_unit() == companion_plan(hierarchy="kubelet").by_unit()


def test_the_ceiling_beside_the_kubelet_is_the_one_planned_alone():
    alone = plan(PODS, NodeFacts(16 * Gi, 4096), cfg(**KEYS))
    assert companion_plan().ceiling == alone.ceiling


def test_the_diff_beside_the_kubelet_sends_nothing_it_writes_and_takes_back_no_pod():
    p = companion_plan()
    naming = Naming.for_config(cfg(**KEYS))
    theirs = {"MemoryMin": 7 * Mi, "MemoryLow": 9 * Mi, "MemoryHigh": 11 * Mi}
    observed = {u.unit: dict(theirs) for u in p.units}
    observed["kubepods-burstable-pod00000000_0000_0000_0000_000000000099.slice"] = dict(theirs)  # not planned
    observed[f"cri-containerd-{99:064x}.scope"] = dict(theirs)
    observed["kube.slice"] = {"MemoryMin": 0, "MemoryLow": 0, "MemoryHigh": INFINITY}
    observed["system.slice"] = dict(theirs)
    changes = diff(p, observed, naming)
    assert {(c.unit, tuple(sorted(c.props))) for c in changes} == {("kubepods-besteffort.slice", ("MemoryMax",))}
    # A reserved slice the config dropped holds the kubelet's values too: not taken back.
    assert diff(p, observed, naming, retired=["system.slice"]) == changes
