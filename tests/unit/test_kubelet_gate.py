"""kubelet_gate.py: whether the kubelet's own Memory QoS is on, from what is known, most reliable first."""

import pytest

from memqos_systemd.kubelet_gate import Gate, memory_qos_gate, parse_kubelet_metrics, parse_version

METRICS_137 = """\
# HELP kubernetes_build_info [ALPHA] A metric with a constant '1' value labeled by major, minor, git version, ...
# TYPE kubernetes_build_info gauge
kubernetes_build_info{build_date="2026-08-26T12:00:00Z",compiler="gc",git_commit="abc",git_tree_state="clean",git_version="v1.37.1",go_version="go1.25.1",major="1",minor="37",platform="linux/amd64"} 1
# HELP kubernetes_feature_enabled [BETA] This metric records the data about the stage and enablement of a k8s feature.
# TYPE kubernetes_feature_enabled gauge
kubernetes_feature_enabled{name="KubeletFineGrainedAuthz",stage=""} 1
kubernetes_feature_enabled{name="MemoryQoS",stage="BETA"} 1
kubernetes_feature_enabled{name="InPlacePodVerticalScaling",stage=""} 1
kubelet_memory_qos_node_memory_min_bytes 0
"""


def test_the_kubelets_metrics_give_its_gates_and_version():
    gates, version = parse_kubelet_metrics(METRICS_137)
    assert gates["MemoryQoS"] is True and gates["KubeletFineGrainedAuthz"] is True
    assert version == "v1.37.1"
    off, _ = parse_kubelet_metrics(METRICS_137.replace('"MemoryQoS",stage="BETA"} 1', '"MemoryQoS",stage="BETA"} 0'))
    assert off["MemoryQoS"] is False


@pytest.mark.parametrize("text", ["", "garbage\n{}\n", 'kubernetes_feature_enabled{stage="BETA"} 1\n',
                                  'kubernetes_feature_enabled{name="MemoryQoS"} yes\n', "kubernetes_build_info{} 1\n"])
def test_metrics_that_do_not_parse_say_nothing(text):
    gates, version = parse_kubelet_metrics(text)
    assert "MemoryQoS" not in gates and version is None


@pytest.mark.parametrize("text, version", [("v1.37.2", (1, 37)), ("1.36", (1, 36)), ("v1.38.0-rc.1+abc", (1, 38)),
                                           ("", None), (None, None), ("latest", None)])
def test_parse_version(text, version):
    assert parse_version(text) == version


@pytest.mark.parametrize("known, on, how", [
    # What the running kubelet reports wins over its config file, which wins over its version's default.
    ({"reported": False, "configured": True, "version": "v1.37.0"}, False, "the kubelet's /metrics"),
    ({"reported": True}, True, "the kubelet's /metrics"),
    ({"configured": False, "version": "v1.37.0", "config_file": "/var/lib/kubelet/config.yaml"}, False,
     "featureGates in /var/lib/kubelet/config.yaml"),
    ({"configured": True, "version": "v1.36.4"}, True, "featureGates in"),
    ({"version": "v1.37.0"}, True, "the default of kubelet v1.37.0"),  # Beta, on by default
    ({"version": "v1.36.9"}, False, "the default of kubelet v1.36.9"),
    ({}, None, "not known"),
])
def test_the_gate_from_what_is_known(known, on, how):
    gate = memory_qos_gate(**known)
    assert isinstance(gate, Gate) and gate.on is on and how in gate.how


@pytest.mark.parametrize("known, on, how", [
    # The gate: /metrics, else the config file, else off (alpha); the memory reserve: the config file.
    ({"reported": True, "memory": "100%", "config_file": "/k.yaml"}, True,
     "its QOSReserved gate from the kubelet's /metrics; qosReserved.memory 100% in /k.yaml"),
    ({"reported": False, "configured": True, "memory": "100%", "config_file": "/k.yaml"}, False, "/metrics"),
    ({"configured": True, "memory": "50%", "config_file": "/k.yaml"}, True, "gate in /k.yaml; qosReserved.memory 50%"),
    ({"configured": True, "config_file": "/k.yaml"}, False, "but no qosReserved.memory in /k.yaml"),
    ({"reported": True}, None, "set kubeletConfigFile"),  # on, reserve not known
    ({"memory": "100%", "config_file": "/k.yaml"}, False, "alpha, off by default"),
    ({}, False, "alpha, off by default"),
])
def test_qos_reserved_from_what_is_known(known, on, how):
    from memqos_systemd.kubelet_gate import qos_reserved
    gate = qos_reserved(**known)
    assert gate.on is on and how in gate.how, gate


def test_qos_reserved_gate_in_the_metrics():
    gates, _ = parse_kubelet_metrics('kubernetes_feature_enabled{name="QOSReserved",stage="ALPHA"} 1\n')
    assert gates == {"QOSReserved": True}


# ---- writes behind our back: the journal's lines and fights (issue 29) -----------------------------
from memqos_systemd.drift import (  # noqa: E402
    FIGHT_WINDOW, FIGHT_WRITES, FOREIGN_LOG_EVERY, ForeignWrites, fight_line, foreign_write_line,
)
from memqos_systemd.kubelet_gate import likely_writer, parse_labels, who_writes  # noqa: E402
from memqos_systemd.naming import Naming  # noqa: E402

NAMING = Naming("/")
MI = 1 << 20
OURS = {"MemoryMin": 512 * MI, "MemoryLow": 256 * MI, "MemoryHigh": 2**64 - 1}


@pytest.mark.parametrize("unit, changed, writer, says", [
    ("kubepods.slice", ["MemoryMin"], "systemd", "likely the kubelet's own Memory QoS"),
    ("kubepods-burstable.slice", ["MemoryLow"], "systemd", "likely the kubelet's own Memory QoS"),
    ("kubepods-burstable.slice", ["MemoryMin"], "systemd", "another writer (systemctl set-property"),  # not its pattern
    ("kube.slice", ["MemoryMin"], "systemd", "another writer (systemctl set-property"),
    ("kubepods.slice", ["MemoryMin"], "cgroupfs", "a cgroupfs writer (systemd still holds ours"),
])
def test_likely_writer(unit, changed, writer, says):
    assert likely_writer(unit, changed, writer, NAMING).startswith(says)


def test_the_journals_line_names_the_values_where_and_who():
    line = foreign_write_line("kubepods.slice", OURS, {**OURS, "MemoryMin": 0}, "cgroupfs", NAMING)
    assert line.startswith("kubepods.slice: MemoryMin 536870912 -> 0 changed without us in its cgroup file, around"
                           " systemd: a cgroupfs writer")
    assert line.endswith("putting ours back through systemd (logged once an hour per unit and kind; memqos_foreign_writes_total"
                         " counts each time)")
    line = foreign_write_line("kubepods.slice", OURS, {**OURS, "MemoryMin": 0}, "systemd", NAMING)
    assert "changed without us through systemd: likely the kubelet's own Memory QoS" in line
    assert "companion: auto" in line


@pytest.mark.parametrize("level, writer, gate, reserved, says", [
    ("node", "systemd", True, None, "the kubelet's MemoryQoS gate (it rewrites"),
    ("qos", "systemd", None, None, "the kubelet's MemoryQoS gate, if it is on"),
    ("qos", "systemd", False, None, "another writer through systemd"),
    ("qos", "systemd", False, True, "the kubelet's QOSReserved"),
    ("qos", "systemd", True, True, "the kubelet's MemoryQoS gate (it rewrites"),  # then " or the kubelet's QOSReserved"
    ("pod", "systemd", True, None, "another writer through systemd"),  # the gate writes no pod slice after its start
    ("pod", "cgroupfs", True, None, "a cgroupfs writer"),
    ("node", "cgroupfs", True, True, "a cgroupfs writer"),
])
def test_who_writes_as_check_can_tell(level, writer, gate, reserved, says):
    assert who_writes(level, writer, gate, reserved).startswith(says)


def test_each_write_is_counted_but_a_unit_is_logged_once_an_hour():
    w = ForeignWrites()
    logged = [w.seen("kubepods.slice", "node", "systemd", OURS, {**OURS, "MemoryMin": 0}, t)[0]
              for t in (0.0, 60.0, 120.0, FOREIGN_LOG_EVERY - 1, FOREIGN_LOG_EVERY + 1)]
    assert logged == [True, False, False, False, True]
    assert w.seen("kube.slice", "reserved", "systemd", OURS, OURS, 130.0)[0]  # another unit: its own hour
    assert w.seen("kubepods.slice", "node", "cgroupfs", OURS, OURS, 140.0)[0]  # another kind of writer: its own


def test_more_than_fight_writes_in_the_window_is_a_fight_said_once():
    """A writer every 10 s: a fight at its (FIGHT_WRITES + 1)-th write, said once; every later write
    counts into it; it is over once FIGHT_WINDOW passes without one."""
    w = ForeignWrites()
    began = [w.seen("kubepods.slice", "node", "cgroupfs", OURS, {**OURS, "MemoryMin": 0}, 10.0 * i)[1]
             for i in range(FIGHT_WRITES + 3)]
    assert [b is not None for b in began] == [False] * FIGHT_WRITES + [True, False, False]
    fight = w.fights["kubepods.slice"]
    assert (fight.writes, fight.since, fight.last, fight.writers) == (FIGHT_WRITES + 3, 0.0, 50.0, {"cgroupfs"})
    assert fight.changed == ("MemoryMin",)
    w.seen("kubepods.slice", "node", "systemd", OURS, {**OURS, "MemoryMin": 0}, 55.0)  # the D-Bus half
    assert w.fights["kubepods.slice"].writers == {"cgroupfs", "systemd"}
    w.seen("kube.slice", "reserved", "systemd", OURS, OURS, 55.0 + FIGHT_WINDOW)  # the window passed
    assert "kubepods.slice" not in w.fights


def test_writes_spread_wider_than_the_window_are_no_fight():
    w = ForeignWrites()
    gap = FIGHT_WINDOW / FIGHT_WRITES + 1  # a person, now and then
    assert all(w.seen("kubepods.slice", "node", "systemd", OURS, OURS, gap * i)[1] is None for i in range(20))
    assert w.fights == {}


def test_the_fight_line():
    w = ForeignWrites()
    for i in range(FIGHT_WRITES + 1):
        _, began = w.seen("kubepods-burstable.slice", "qos", "systemd", OURS, {**OURS, "MemoryLow": 0}, 60.0 * i)
    line = fight_line(began, NAMING)
    assert line.startswith(f"kubepods-burstable.slice: written behind our back {FIGHT_WRITES + 1} times in"
                           f" {60 * FIGHT_WRITES} s (through systemd): likely the kubelet's own Memory QoS")
    assert "two writers are fighting: memqos-systemd keeps putting its values back every time" in line


def test_parse_labels():
    assert parse_labels('level="node",writer="cgroupfs"') == {"level": "node", "writer": "cgroupfs"}
    assert parse_labels('a="x\\"y"') == {"a": 'x\\"y'}
