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
