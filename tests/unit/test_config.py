"""The config file (issue #2, "Config"): defaults, validation, the kubelet's config file.

Contract from the issue: KubeletConfiguration names; `memoryReservationPolicy` None |
TieredReservation | HardReservation (default None); `memoryThrottlingFactor` in (0, 1]
(default 0.9, null = no MemoryHigh anywhere); `hierarchy` effective | kubelet (default
effective); `cgroupRoot` (default /); `kubeReserved`/`systemReserved` maps with memory;
`evictionHard` (memory.available as a quantity or a percentage of capacity);
`enforceNodeAllocatable` (pods, kube-reserved, system-reserved; default [pods]);
`kubeReservedCgroup`/`systemReservedCgroup`. Unknown keys and wrong types are errors, with
a one-line message naming the key and the value. Our file wins over the kubelet's config,
which wins over the defaults.
"""

from __future__ import annotations

import dataclasses
import os
from fractions import Fraction

import pytest
import yaml

from memqos_systemd.config import ConfigError, Reserve, load_config, parse_config
from memqos_systemd.sources.kubelet import KubeletSource

Mi, Gi = 2**20, 2**30


def cfg(text: str, **kw):
    return parse_config(yaml.safe_load(text), "config.yaml", **kw)


def error(text: str, **kw) -> str:
    with pytest.raises(ConfigError) as e:
        cfg(text, **kw)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


# ------------------------------------------------------------------ defaults

@pytest.mark.parametrize("doc", [None, {}])
def test_defaults(doc):
    c = parse_config(doc)
    assert c.memory_reservation_policy == "None"
    assert c.memory_throttling_factor == 0.9
    assert c.hierarchy == "effective"
    assert c.cgroup_root == "/"
    assert c.kube_reserved == 0 and c.system_reserved == 0
    assert c.enforce_node_allocatable == ("pods",)
    assert c.kube_reserved_cgroup is None and c.system_reserved_cgroup is None
    # Spec silent on the evictionHard default: the kubelet's own (memory.available 100Mi).
    assert c.eviction_hard_memory.resolve(64 * Gi) == 100 * Mi
    assert c.kubelet_memory_qos_gate is None
    assert c.protection_headroom.resolve(100 * Gi) > 0  # "a sane default"


def test_empty_file_and_missing_file_mean_defaults(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty) == parse_config(None)
    assert load_config(tmp_path / "absent.yaml") == parse_config(None)
    assert load_config(None) == parse_config(None)
    with pytest.raises(ConfigError, match="absent.yaml"):
        load_config(tmp_path / "absent.yaml", required=True)


@pytest.mark.parametrize("text", ["", "\n\n", "# memoryReservationPolicy: TieredReservation\n", "{}\n", "---\n"])
def test_a_file_that_sets_nothing_says_what_that_means(tmp_path, text):
    """issue 26: an empty file is valid and means the built-in defaults, policy None: nothing is
    protected. Easy to take for the packaged settings, so the config says so (check, plan, the
    service's journal show cfg.notes)."""
    path = tmp_path / "config.yaml"
    path.write_text(text)
    [note] = load_config(path).notes
    assert note.startswith(f"{path} sets no key") and "memoryReservationPolicy None: nothing is protected" in note


def test_a_file_that_sets_a_key_or_is_absent_has_nothing_to_note(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("memoryReservationPolicy: None\n")
    assert load_config(path).notes == ()
    assert load_config(tmp_path / "absent.yaml").notes == () and load_config(None).notes == ()


# ------------------------------------------------------------------ valid values

@pytest.mark.parametrize("text, attr, value", [
    ("memoryReservationPolicy: None", "memory_reservation_policy", "None"),
    ("memoryReservationPolicy: TieredReservation", "memory_reservation_policy", "TieredReservation"),
    ("memoryReservationPolicy: HardReservation", "memory_reservation_policy", "HardReservation"),
    ("memoryThrottlingFactor: 0.9", "memory_throttling_factor", 0.9),
    ("memoryThrottlingFactor: 1", "memory_throttling_factor", 1.0),
    ("memoryThrottlingFactor: 1.0", "memory_throttling_factor", 1.0),
    ("memoryThrottlingFactor: 0.001", "memory_throttling_factor", 0.001),
    ("memoryThrottlingFactor: null", "memory_throttling_factor", None),
    ("memoryThrottlingFactor: ~", "memory_throttling_factor", None),
    ("hierarchy: effective", "hierarchy", "effective"),
    ("hierarchy: kubelet", "hierarchy", "kubelet"),
    ("cgroupRoot: /", "cgroup_root", "/"),
    ("cgroupRoot: /foo", "cgroup_root", "/foo"),
    ("cgroupRoot: /foo.slice", "cgroup_root", "/foo.slice"),
    ("kubeReserved: {memory: 2Gi}", "kube_reserved", 2 * Gi),
    ("kubeReserved: {memory: 2Gi, cpu: 500m, ephemeral-storage: 1Gi, pid: 1000}", "kube_reserved", 2 * Gi),
    ("kubeReserved: {cpu: '1'}", "kube_reserved", 0),
    ("kubeReserved: {}", "kube_reserved", 0),
    ("kubeReserved: {memory: 1073741824}", "kube_reserved", Gi),
    ("systemReserved: {memory: 1.5Gi}", "system_reserved", 3 * Gi // 2),
    ("enforceNodeAllocatable: [pods]", "enforce_node_allocatable", ("pods",)),
    ("enforceNodeAllocatable: []", "enforce_node_allocatable", ()),
    ("enforceNodeAllocatable: [none]", "enforce_node_allocatable", ()),
    ("enforceNodeAllocatable: [pods, pods]", "enforce_node_allocatable", ("pods",)),
    ("{enforceNodeAllocatable: [pods, kube-reserved], kubeReservedCgroup: /kube.slice}",
     "enforce_node_allocatable", ("pods", "kube-reserved")),
    ("kubeReservedCgroup: /kube.slice", "kube_reserved_cgroup", "/kube.slice"),
    ("kubeReservedCgroup: /runtime.slice/kube.slice", "kube_reserved_cgroup", "/runtime.slice/kube.slice"),
    ("systemReservedCgroup: /system.slice", "system_reserved_cgroup", "/system.slice"),
])
def test_valid_values(text, attr, value):
    c = cfg(text)
    assert getattr(c, attr) == value
    assert type(getattr(c, attr)) is type(value)


@pytest.mark.parametrize("threshold, capacity, expected", [
    ("100Mi", 8 * Gi, 100 * Mi),
    ("500Mi", 8 * Gi, 500 * Mi),
    (104857600, 8 * Gi, 100 * Mi),
    ("0", 8 * Gi, 0),
    ("25%", 8 * Gi, 2 * Gi),
    ("10%", 10 * Gi, Gi),
    ("0%", 8 * Gi, 0),
    ("5.5%", 2000, 110),
    ("1e1%", 1000, 100),  # the kubelet reads the number with ParseFloat, exponent and all
    ("1%", 50, 1),        # half a byte: rounds up, like every fractional byte here
    ("99.9%", 1000, 999),
])
def test_eviction_hard_quantity_or_percentage(threshold, capacity, expected):
    c = parse_config({"evictionHard": {"memory.available": threshold}})
    assert c.eviction_hard_memory.resolve(capacity) == expected


def test_eviction_hard_other_signals_are_accepted():
    c = cfg("evictionHard: {memory.available: 200Mi, nodefs.available: 10%, nodefs.inodesFree: 5%,"
            " imagefs.available: 15%, imagefs.inodesFree: 5%, pid.available: 10%}")
    assert c.eviction_hard_memory.resolve(8 * Gi) == 200 * Mi


def test_eviction_hard_without_memory_means_zero():
    # Spec silent. The kubelet drops all its default thresholds once evictionHard is set,
    # so a map without memory.available reserves nothing for memory (the code's choice).
    c = cfg("evictionHard: {nodefs.available: 10%}")
    assert c.eviction_hard_memory.resolve(8 * Gi) == 0


def test_protection_headroom_quantity_or_percentage():
    assert cfg("protectionHeadroom: 1Gi").protection_headroom == Reserve(bytes=Gi)
    assert cfg("protectionHeadroom: 10%").protection_headroom == Reserve(fraction=Fraction(1, 10))
    assert cfg("protectionHeadroom: 0").protection_headroom.resolve(Gi) == 0


# ------------------------------------------------------------------ invalid values

def test_factor_message_is_exactly_the_issue_example():
    assert error("memoryThrottlingFactor: 1.5") == "config.yaml: memoryThrottlingFactor: 1.5 is outside (0, 1]"


@pytest.mark.parametrize("text, key, shown", [
    # memoryReservationPolicy
    ("memoryReservationPolicy: Hard", "memoryReservationPolicy", "Hard"),
    ("memoryReservationPolicy: none", "memoryReservationPolicy", "none"),
    ("memoryReservationPolicy: Disabled", "memoryReservationPolicy", "Disabled"),  # the KEP's older word
    ("memoryReservationPolicy: 1", "memoryReservationPolicy", "1"),
    ("memoryReservationPolicy: [None]", "memoryReservationPolicy", "None"),
    # memoryThrottlingFactor
    ("memoryThrottlingFactor: 0", "memoryThrottlingFactor", "0"),
    ("memoryThrottlingFactor: 0.0", "memoryThrottlingFactor", "0.0"),
    ("memoryThrottlingFactor: -0.1", "memoryThrottlingFactor", "-0.1"),
    ("memoryThrottlingFactor: 1.0000001", "memoryThrottlingFactor", "1.0000001"),
    ("memoryThrottlingFactor: 90", "memoryThrottlingFactor", "90"),
    ("memoryThrottlingFactor: '0.9'", "memoryThrottlingFactor", "0.9"),
    ("memoryThrottlingFactor: true", "memoryThrottlingFactor", "true"),
    ("memoryThrottlingFactor: .nan", "memoryThrottlingFactor", "nan"),
    ("memoryThrottlingFactor: .inf", "memoryThrottlingFactor", "inf"),
    ("memoryThrottlingFactor: [0.9]", "memoryThrottlingFactor", "0.9"),
    # hierarchy
    ("hierarchy: Effective", "hierarchy", "Effective"),
    ("hierarchy: kep", "hierarchy", "kep"),
    ("hierarchy: 0", "hierarchy", "0"),
    ("hierarchy: null", "hierarchy", "null"),
    # cgroupRoot
    ("cgroupRoot: foo", "cgroupRoot", "foo"),
    ("cgroupRoot: ''", "cgroupRoot", "''"),
    ("cgroupRoot: 1", "cgroupRoot", "1"),
    ("cgroupRoot: [/]", "cgroupRoot", "/"),
    # kubeReserved / systemReserved
    ("kubeReserved: 1Gi", "kubeReserved", "1Gi"),
    ("kubeReserved: [memory]", "kubeReserved", "memory"),
    ("kubeReserved: {memory: 1Gb}", "kubeReserved.memory", "1Gb"),
    ("kubeReserved: {memory: -1Gi}", "kubeReserved.memory", "-1Gi"),
    ("kubeReserved: {memory: true}", "kubeReserved.memory", "true"),
    ("kubeReserved: {memory: [1Gi]}", "kubeReserved.memory", "1Gi"),
    ("kubeReserved: {cpu: abc}", "kubeReserved.cpu", "abc"),
    ("kubeReserved: {memroy: 1Gi}", "kubeReserved.memroy", "1Gi"),  # a typo must not reserve nothing
    ("kubeReserved: {hugepages-2Mi: 1Gi}", "kubeReserved.hugepages-2Mi", "1Gi"),  # the kubelet refuses it too
    ("systemReserved: {memory: 1 Gi}", "systemReserved.memory", "1 Gi"),
    ("systemReserved: {Memory: 1Gi}", "systemReserved.Memory", "1Gi"),
    ("systemReserved: 5", "systemReserved", "5"),
    # evictionHard
    ("evictionHard: 100Mi", "evictionHard", "100Mi"),
    ("evictionHard: {memory.available: abc}", "evictionHard.memory.available", "abc"),
    ("evictionHard: {memory.available: '100%'}", "evictionHard.memory.available", "100%"),
    ("evictionHard: {memory.available: '-1%'}", "evictionHard.memory.available", "-1%"),
    ("evictionHard: {memory.available: 'x%'}", "evictionHard.memory.available", "x%"),
    ("evictionHard: {memory.available: '%'}", "evictionHard.memory.available", "%"),
    ("evictionHard: {memory.available: '1/2%'}", "evictionHard.memory.available", "1/2%"),
    ("evictionHard: {memory.available: '1e99999999999%'}", "evictionHard.memory.available", "1e99999999999%"),
    ("evictionHard: {memory.available: true}", "evictionHard.memory.available", "true"),
    ("evictionHard: {memory.available: -100Mi}", "evictionHard.memory.available", "-100Mi"),
    ("evictionHard: {memory.available: '<100Mi'}", "evictionHard.memory.available", "<100Mi"),
    ("evictionHard: {memory.availble: 500Mi}", "evictionHard.memory.availble", "500Mi"),  # typo: not silently 0
    ("evictionHard: {nodefs.available: lots}", "evictionHard.nodefs.available", "lots"),
    # enforceNodeAllocatable
    ("enforceNodeAllocatable: pods", "enforceNodeAllocatable", "pods"),
    ("enforceNodeAllocatable: [podz]", "enforceNodeAllocatable", "podz"),
    ("enforceNodeAllocatable: [pods, none]", "enforceNodeAllocatable", "none"),
    ("enforceNodeAllocatable: [Pods]", "enforceNodeAllocatable", "Pods"),
    ("enforceNodeAllocatable: [1]", "enforceNodeAllocatable", "1"),
    # reserved cgroups
    ("kubeReservedCgroup: kube.slice", "kubeReservedCgroup", "kube.slice"),
    ("kubeReservedCgroup: /kube", "kubeReservedCgroup", "/kube"),
    ("kubeReservedCgroup: /kube.service", "kubeReservedCgroup", "/kube.service"),
    ("kubeReservedCgroup: /-.slice", "kubeReservedCgroup", "/-.slice"),
    ("kubeReservedCgroup: /", "kubeReservedCgroup", "/"),
    ("kubeReservedCgroup: ''", "kubeReservedCgroup", "''"),
    ("kubeReservedCgroup: 5", "kubeReservedCgroup", "5"),
    ("systemReservedCgroup: /sys tem.slice", "systemReservedCgroup", "/sys tem.slice"),
    ("systemReservedCgroup: /système.slice", "systemReservedCgroup", "/système.slice"),
    # protectionHeadroom
    ("protectionHeadroom: lots", "protectionHeadroom", "lots"),
    ("protectionHeadroom: '150%'", "protectionHeadroom", "150%"),
    # daemon keys
    ("podsFile: pods.json", "podsFile", "pods.json"),
    ("kubeletConfigFile: kubelet.yaml", "kubeletConfigFile", "kubelet.yaml"),
    ("resyncInterval: 5x", "resyncInterval", "5x"),
    ("resyncInterval: true", "resyncInterval", "true"),
    ("kubelet: http://x", "kubelet", "http://x"),
    ("kubelet: {url: 'ftp://x/pods'}", "kubelet.url", "ftp://x/pods"),
    # Every URL the kubelet source could not take apart (issue 26: "[::1" passed, then killed a reload)
    ("kubelet: {url: 'https://[::1/pods'}", "kubelet.url", "without its ']'"),
    ("kubelet: {url: 'https://[::1]x/pods'}", "kubelet.url", "https://[::1]x/pods"),
    ("kubelet: {url: 'https://[1.2.3.4]/pods'}", "kubelet.url", "not an IPv6 address"),
    ("kubelet: {url: 'https://[zz::1]/pods'}", "kubelet.url", "not an IPv6 address"),
    ("kubelet: {url: 'https://127.0.0.1:99999/pods'}", "kubelet.url", "not a number from 1 to 65535"),
    ("kubelet: {url: 'https://127.0.0.1:0/pods'}", "kubelet.url", "'0'"),
    ("kubelet: {url: 'https://127.0.0.1:/pods'}", "kubelet.url", "port ''"),
    ("kubelet: {url: 'https://127.0.0.1:10250:1/pods'}", "kubelet.url", "'10250:1'"),
    ("kubelet: {url: 'https://host:１２/pods'}", "kubelet.url", "１２"),
    ("kubelet: {url: 'https:///pods'}", "kubelet.url", "has no host"),
    ("kubelet: {url: 'https://a..b/pods'}", "kubelet.url", "neither a host name nor an IP address"),
    ("kubelet: {url: 'https://999.0.0.1/pods'}", "kubelet.url", "not an IPv4 address"),
    ("kubelet: {url: 'https://u:secret@127.0.0.1/pods'}", "kubelet.url", "user name or password"),
    ("kubelet: {url: 'https://127.0.0.1/pods#x'}", "kubelet.url", "fragment"),
    ("kubelet: {url: 'https://127.0.0.1/po ds'}", "kubelet.url", "spaces"),
    ("kubelet: {url: 'https:/127.0.0.1/pods'}", "kubelet.url", "http:// or https://"),
    ("kubelet: {urll: 'http://x/pods'}", "kubelet.urll", "http://x/pods"),
    ("kubelet: {pollInterval: 0s}", "kubelet.pollInterval", "0s"),
    ("kubelet: {clientCertFile: /c.pem}", "kubelet.clientCertFile", "/c.pem"),
    ("metrics: {listen: nohost}", "metrics.listen", "nohost"),
    ("metrics: {listen: '1.2.3.4:99999'}", "metrics.listen", "1.2.3.4:99999"),
    ("metrics: {port: 9759}", "metrics.port", "9759"),
    ("metrics: 9759", "metrics", "9759"),
    ("metrics: {perPod: 'no'}", "metrics.perPod", "no"),
    ("metrics: {perUnit: 1}", "metrics.perUnit", "1"),
    ("metrics: {perPod: false, perUnit: true}", "metrics.perUnit", "true"),
    # bestEffortCeiling
    ("bestEffortCeiling: true", "bestEffortCeiling", "true"),
    ("bestEffortCeiling: {enabled: on please}", "bestEffortCeiling.enabled", "on please"),
    ("bestEffortCeiling: {headroom: 100%}", "bestEffortCeiling.headroom", "100%"),
    ("bestEffortCeiling: {headroom: -1Gi}", "bestEffortCeiling.headroom", "-1Gi"),
    ("bestEffortCeiling: {minimum: lots}", "bestEffortCeiling.minimum", "lots"),
    ("bestEffortCeiling: {minimum: 512Ki}", "bestEffortCeiling.minimum", "512Ki"),
    ("bestEffortCeiling: {minimum: 0}", "bestEffortCeiling.minimum", "0"),
    ("bestEffortCeiling: {enable: true}", "bestEffortCeiling.enable", "true"),
])
def test_invalid_values_name_key_and_value(text, key, shown):
    msg = error(text)
    assert msg.startswith("config.yaml: "), msg
    assert f" {key}: " in msg, msg
    assert shown in msg, msg


@pytest.mark.parametrize("text, key", [
    ("memoryThrottlingFactr: 0.9", "memoryThrottlingFactr"),
    ("memorythrottlingfactor: 0.9", "memorythrottlingfactor"),
    ("MemoryQoS: true", "MemoryQoS"),
    ("featureGates: {MemoryQoS: true}", "featureGates"),  # a kubelet key, not ours
    ("cgroupDriver: systemd", "cgroupDriver"),
    ("1: x", "1"),
])
def test_unknown_keys(text, key):
    msg = error(text)
    assert f"config.yaml: {key}: " in msg
    assert "not a known key" in msg


def test_unknown_key_with_a_close_name_gets_a_hint():
    assert "did you mean memoryThrottlingFactor?" in error("memorythrottlingfactor: 0.9")


@pytest.mark.parametrize("text", ["- memoryThrottlingFactor: 0.9", "0.9", "hello", "true"])
def test_config_must_be_a_map(text):
    assert "config.yaml" in error(text)


@pytest.mark.parametrize("value, says", [
    ("-1Gi", "'-1Gi' is negative: a memory quantity is 0 or more"),
    ("-1", "'-1' is negative"),
    ("-1e99", "'-1e99' is negative"),
    ("99999999Ei", "'99999999Ei' is larger than the largest memory quantity, 9223372036854775807 bytes (8Ei - 1)"),
    ("9223372036854775808", "'9223372036854775808' is larger than the largest memory quantity"),
    ("1e31", "'1e31' is larger than the largest memory quantity"),
    ("1Gb", "'1Gb' is not a memory quantity (e.g. 512Mi"),
])
@pytest.mark.parametrize("key", ["kubeReserved", "systemReserved"])
def test_a_memory_quantity_that_parses_is_not_called_no_quantity(key, value, says):
    """Negative or too large is what the message says, not "is not a memory quantity" (issue 26)."""
    msg = error(f"{key}: {{memory: '{value}'}}")
    assert f"{key}.memory: {says}" in msg, msg
    if "not a memory quantity" not in says:
        assert "not a memory quantity" not in msg, msg


@pytest.mark.parametrize("text, says", [
    ("hierarchy: kubelet\nmemoryReservationPolicy: None\nhierarchy: effective\n",
     "at line 3, column 1: duplicate key 'hierarchy'"),
    ("memoryReservationPolicy: TieredReservation\n# memoryReservationPolicy: None\nmemoryReservationPolicy: None\n",
     "at line 3, column 1: duplicate key 'memoryReservationPolicy'"),
    ("kubelet:\n  url: http://127.0.0.1:10255/pods\n  url: https://127.0.0.1:10250/pods\n",
     "at line 3, column 3: duplicate key 'url'"),
    ("kubeReserved: {memory: 1Gi, memory: 2Gi}\n", "duplicate key 'memory'"),
    ('{"hierarchy": "kubelet", "hierarchy": "effective"}', "not valid JSON: duplicate key 'hierarchy'"),
    ('{"kubelet": {"timeout": 1, "timeout": 2}}', "not valid JSON: duplicate key 'timeout'"),
])
def test_a_key_given_twice_is_refused_not_the_last_one_taken(tmp_path, text, says):
    """issue 26: the last one won, silently."""
    assert says in said(tmp_path, text)


def test_a_merge_key_is_not_a_duplicate():
    assert cfg("kubeReserved: {<<: {memory: 1Gi}, cpu: 1}").kube_reserved == Gi


def test_long_values_are_shortened_in_messages():
    msg = error("memoryReservationPolicy: " + "x" * 5000)
    assert len(msg) < 300


# ------------------------------------------------------------------ cross-checks

@pytest.mark.parametrize("text, needle", [
    ("enforceNodeAllocatable: [pods, kube-reserved]", "kubeReservedCgroup"),
    ("enforceNodeAllocatable: [kube-reserved]", "kubeReservedCgroup"),
    ("enforceNodeAllocatable: [pods, system-reserved]", "systemReservedCgroup"),
    ("{enforceNodeAllocatable: [kube-reserved, system-reserved], kubeReservedCgroup: /kube.slice}",
     "systemReservedCgroup"),
])
def test_enforcing_a_reservation_needs_its_cgroup(text, needle):
    # Node Allocatable: "Specifying kube-reserved value in this flag is invalid if
    # --kube-reserved-cgroup flag is not specified" (and the same for system-reserved).
    msg = error(text)
    assert "enforceNodeAllocatable" in msg and needle in msg


def test_enforcing_both_with_their_cgroups():
    c = cfg("{enforceNodeAllocatable: [pods, kube-reserved, system-reserved],"
            " kubeReservedCgroup: /kube.slice, systemReservedCgroup: /system.slice,"
            " kubeReserved: {memory: 2Gi}, systemReserved: {memory: 1Gi}}")
    assert c.enforce_node_allocatable == ("pods", "kube-reserved", "system-reserved")
    assert (c.kube_reserved, c.system_reserved) == (2 * Gi, Gi)


def test_cgroup_without_enforcement_is_fine():
    c = cfg("{kubeReservedCgroup: /kube.slice, kubeReserved: {memory: 1Gi}}")
    assert c.enforce_node_allocatable == ("pods",)


def test_same_cgroup_for_both_reservations_is_refused():
    msg = error("{kubeReservedCgroup: /kube.slice, systemReservedCgroup: /kube.slice}")
    assert "systemReservedCgroup" in msg and "/kube.slice" in msg


# ------------------------------------------------------------------ the kubelet's config

KUBELET = """\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
featureGates:
  MemoryQoS: true
memoryReservationPolicy: TieredReservation
memoryThrottlingFactor: 0.8
kubeReserved: {cpu: 500m, memory: 2Gi, ephemeral-storage: 1Gi}
systemReserved: {memory: 1Gi}
evictionHard: {memory.available: 200Mi, nodefs.available: 10%, imagefs.available: 15%, nodefs.inodesFree: 5%}
enforceNodeAllocatable: [pods, kube-reserved]
kubeReservedCgroup: /kube.slice
clusterDNS: [10.96.0.10]
rotateCertificates: true
"""


def merged(ours: str, kubelet: str = KUBELET):
    return parse_config(yaml.safe_load(ours), "ours.yaml", yaml.safe_load(kubelet), "kubelet.yaml")


def test_kubelet_values_beat_defaults():
    c = merged("{}")
    assert c.kube_reserved == 2 * Gi and c.system_reserved == Gi
    assert c.eviction_hard_memory.resolve(8 * Gi) == 200 * Mi
    assert c.enforce_node_allocatable == ("pods", "kube-reserved")
    assert c.kube_reserved_cgroup == "/kube.slice"
    assert c.hierarchy == "effective"  # not a kubelet field: our default
    assert c.origins["kubeReserved"] == "kubelet"
    assert c.origins["hierarchy"] == "default"


def test_the_kubelets_policy_and_factor_are_its_own_never_ours():
    """Issue 42: memoryReservationPolicy and memoryThrottlingFactor in the kubelet's file say what the
    kubelet writes itself (kubelet_gate.kubelet_facts); ours stay ours (taking its None as ours left
    the pods with no protection at all)."""
    c = merged("{}")
    assert (c.memory_reservation_policy, c.memory_throttling_factor) == ("None", 0.9)  # our defaults
    assert c.origins["memoryReservationPolicy"] == c.origins["memoryThrottlingFactor"] == "default"
    assert (c.kubelet_file.policy, c.kubelet_file.factor) == ("TieredReservation", 0.8)
    assert c.kubelet_file.gate("MemoryQoS") is True and c.kubelet_file.source == "kubelet.yaml"


def test_our_file_beats_the_kubelet():
    c = merged("{memoryThrottlingFactor: 0.7, memoryReservationPolicy: HardReservation,"
               " kubeReserved: {memory: 3Gi}, enforceNodeAllocatable: [pods]}")
    assert c.memory_throttling_factor == 0.7
    assert c.memory_reservation_policy == "HardReservation"
    assert c.kube_reserved == 3 * Gi
    assert c.system_reserved == Gi  # still the kubelet's
    assert c.enforce_node_allocatable == ("pods",)
    assert c.origins["memoryThrottlingFactor"] == "config"
    assert c.origins["systemReserved"] == "kubelet"


def test_our_null_factor_beats_the_kubelets_factor():
    assert merged("memoryThrottlingFactor: null").memory_throttling_factor is None


def test_kubelet_null_and_empty_fields_mean_unset():
    # In a KubeletConfiguration an absent, null or empty field takes the kubelet's default
    # (cgroupRoot "" is "/"; an empty *ReservedCgroup is "none"). They must not turn into
    # "no MemoryHigh" or an error.
    kubelet = ("kind: KubeletConfiguration\nmemoryThrottlingFactor: null\ncgroupRoot: ''\n"
               "kubeReservedCgroup: ''\nsystemReservedCgroup: ''\nkubeReserved: null\nevictionHard: null\n")
    c = merged("{}", kubelet)
    assert c.memory_throttling_factor == 0.9
    assert c.cgroup_root == "/"
    assert c.kube_reserved_cgroup is None and c.system_reserved_cgroup is None
    assert c.kube_reserved == 0
    assert c.eviction_hard_memory.resolve(8 * Gi) == 100 * Mi


@pytest.mark.parametrize("gates, expected, problem", [
    ("{MemoryQoS: true}", True, None), ("{MemoryQoS: false}", False, None), ("{}", None, None),
    ("{Other: true}", None, None), ("null", None, None),
    # Of the wrong type: a named warning, never "sets no gate" in silence (issue 42).
    ("[MemoryQoS]", None, "kubelet.yaml: featureGates: [MemoryQoS] is a list, not a map of gate: true|false"),
    ("'MemoryQoS=true'", None, "kubelet.yaml: featureGates: 'MemoryQoS=true' is a string, not a map of gate:"),
    ("{MemoryQoS: 'true'}", None, "kubelet.yaml: featureGates.MemoryQoS: 'true' is not true or false"),
    ("{MemoryQoS: 1}", None, "kubelet.yaml: featureGates.MemoryQoS: 1 is not true or false"),
    ("{MemoryQoS: null}", None, "kubelet.yaml: featureGates.MemoryQoS: null is not true or false"),
])
def test_memory_qos_gate_detected(gates, expected, problem):
    c = merged("{}", f"kind: KubeletConfiguration\nfeatureGates: {gates}\n")
    assert c.kubelet_memory_qos_gate is expected
    if problem is None:
        assert c.kubelet_file.problems == ()
    else:
        assert len(c.kubelet_file.problems) == 1 and c.kubelet_file.problems[0].startswith(problem)


@pytest.mark.parametrize("line, problem", [
    ("memoryThrottlingFactor: 2", "kubelet.yaml: memoryThrottlingFactor: 2 is not a number in (0, 1]"),
    ("memoryThrottlingFactor: 'x'", "kubelet.yaml: memoryThrottlingFactor: 'x' is not a number in (0, 1]"),
    ("memoryReservationPolicy: 5", "kubelet.yaml: memoryReservationPolicy: 5 is not a string"),
])
def test_what_the_kubelet_writes_itself_is_never_an_error_of_ours(line, problem):
    """A value the kubelet itself refuses says nothing of the kubelet that runs: a named problem
    (check and the journal say it), not a config the service refuses."""
    c = merged("{}", f"kind: KubeletConfiguration\n{line}\n")
    assert c.kubelet_file.problems[0].startswith(problem)
    assert (c.kubelet_file.policy, c.kubelet_file.factor) == (None, None)


@pytest.mark.parametrize("doc, refused", [
    ("featureGates: {MemoryQoS: false}\nmemoryReservationPolicy: TieredReservation\n",
     "memoryReservationPolicy TieredReservation with featureGates.MemoryQoS false: the kubelet refuses"),
    ("featureGates: {MemoryQoS: false}\nmemoryThrottlingFactor: 0.8\n", "memoryThrottlingFactor 0.8 with"),
    ("featureGates: {MemoryQoS: false}\nmemoryThrottlingFactor: 0.9\nmemoryReservationPolicy: None\n", None),
    ("featureGates: {MemoryQoS: true}\nmemoryReservationPolicy: TieredReservation\n", None),
])
def test_a_config_the_kubelets_validation_refuses_is_named(doc, refused):
    problems = merged("{}", f"kind: KubeletConfiguration\n{doc}").kubelet_file.problems
    assert (problems == ()) if refused is None else (len(problems) == 1 and refused in problems[0]), problems


def test_a_policy_the_kubelet_of_today_does_not_know_is_kept_to_be_named():
    assert merged("{}", "kind: KubeletConfiguration\nmemoryReservationPolicy: Hard\n").kubelet_file.policy == "Hard"


@pytest.mark.parametrize("kubelet", ["kind: Pod\n", "- a\n", "5\n"])
def test_not_a_kubelet_configuration(kubelet):
    with pytest.raises(ConfigError, match="kubelet.yaml"):
        merged("{}", kubelet)


def test_kubelet_config_without_kind_is_accepted():
    assert merged("{}", "kubeReserved: {memory: 1Gi}\n").kube_reserved == Gi


def test_kubelet_only_keys_and_our_only_keys_are_kept_apart():
    # hierarchy/protectionHeadroom are ours, not the kubelet's: ignored there.
    c = merged("{}", "kind: KubeletConfiguration\nhierarchy: kubelet\nprotectionHeadroom: 50%\n")
    assert c.hierarchy == "effective"
    assert c == dataclasses.replace(parse_config({}), kubelet_file=c.kubelet_file)


def test_cross_check_sees_the_merged_values():
    # enforcement from the kubelet, cgroup from us: fine; enforcement without any cgroup: not.
    kubelet = "kind: KubeletConfiguration\nenforceNodeAllocatable: [pods, system-reserved]\n"
    assert merged("systemReservedCgroup: /system.slice", kubelet).system_reserved_cgroup == "/system.slice"
    with pytest.raises(ConfigError, match="systemReservedCgroup"):
        merged("{}", kubelet)


def test_load_config_merges_the_kubelet_file(tmp_path):
    kubelet = tmp_path / "kubelet.yaml"
    kubelet.write_text(KUBELET)
    ours = tmp_path / "config.yaml"
    ours.write_text(f"kubeletConfigFile: {kubelet}\nmemoryThrottlingFactor: 0.95\nhierarchy: kubelet\n")
    c = load_config(ours)
    assert c.memory_throttling_factor == 0.95
    assert c.memory_reservation_policy == "None"  # ours: the kubelet's is its own (kubelet_file)
    assert c.kubelet_file.policy == "TieredReservation"
    assert c.hierarchy == "kubelet"
    assert c.kubelet_memory_qos_gate is True
    assert c.kubelet_config_file == str(kubelet)


def test_load_config_kubelet_file_errors_name_the_file(tmp_path):
    ours = tmp_path / "config.yaml"
    ours.write_text(f"kubeletConfigFile: {tmp_path}/nope.yaml\n")
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_config(ours)
    bad = tmp_path / "kubelet.yaml"
    bad.write_text("kind: KubeletConfiguration\nevictionHard: {memory.available: lots}\n")
    ours.write_text(f"kubeletConfigFile: {bad}\n")
    with pytest.raises(ConfigError) as e:
        load_config(ours)
    assert str(e.value).startswith(f"{bad}: evictionHard.memory.available: 'lots'")


# ------------------------------------------------------------------ YAML itself

def load_text(tmp_path, text: str | bytes):
    p = tmp_path / "config.yaml"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(p)), msg
    return msg


def said(tmp_path, text: str | bytes) -> str:
    """What load_text's message says after the file's name, which is as long as the temporary
    directory's (a package build's may be long): the part whose length the file decides."""
    return load_text(tmp_path, text).removeprefix(str(tmp_path / "config.yaml"))


@pytest.mark.parametrize("text", [
    "memoryThrottlingFactor: [0.9\n",
    "a: b: c\n",
    "key: 'unterminated\n",
    "\tmemoryThrottlingFactor: 0.9\n",
    "{{{\n",
    "a: *undefined\n",
])
def test_yaml_syntax_errors(tmp_path, text):
    assert "not valid YAML" in load_text(tmp_path, text)


def test_yaml_error_says_where(tmp_path):
    assert "line 3" in load_text(tmp_path, "hierarchy: effective\ncgroupRoot: /\nx: y: z\nmetrics: null\n")


@pytest.mark.parametrize("text", [
    "memoryThrottlingFactor: !!python/object:fractions.Fraction {}\n",
    "!!python/object/apply:os.system ['touch {marker}']\n",
    "hierarchy: !!python/object/apply:os.system ['touch {marker}']\n",
    "hierarchy: !!python/name:os.system\n",
    "cgroupRoot: !custom /x\n",
])
def test_unsafe_tags_are_refused(tmp_path, text):
    marker = tmp_path / "pwned"
    msg = load_text(tmp_path, text.replace("{marker}", str(marker)))
    assert "not valid YAML" in msg and "tag" in msg
    assert not marker.exists()


def test_binary_garbage(tmp_path):
    load_text(tmp_path, b"\xff\xfe\x00garbage\x00\x01")


def test_deep_nesting_is_refused(tmp_path):
    msg = load_text(tmp_path, "metrics: " + "[" * 600 + "]" * 600 + "\n")
    assert "nested too deeply" in msg


def test_nesting_that_parses_still_gives_a_one_line_error(tmp_path):
    msg = said(tmp_path, "metrics: " + "[" * 50 + "1" + "]" * 50 + "\n")
    assert "metrics" in msg and len(msg) < 200


def test_huge_file_is_refused_without_parsing_it(tmp_path, monkeypatch):
    import memqos_systemd.config as config_module

    monkeypatch.setattr(config_module, "decode", lambda *a, **kw: pytest.fail("parsed a file over the limit"))
    msg = load_text(tmp_path, "# " + "x" * (2 << 20) + "\n")
    assert "larger than" in msg


def test_large_but_allowed_file_parses(tmp_path):
    p = tmp_path / "config.yaml"
    p.write_text("# comment padding\n" * 20_000 + "hierarchy: kubelet\n")
    assert os.path.getsize(p) < 1 << 20
    assert load_config(p).hierarchy == "kubelet"


def test_alias_bomb_fails_fast(tmp_path):
    # "billion laughs": nine levels of nine aliases is 387 million leaves if expanded.
    levels = ["&a0 [" + ", ".join(["lol"] * 9) + "]"]
    levels += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    msg = said(tmp_path, "resyncInterval: [" + ", ".join(levels) + "]\n")
    # Refused at the first alias, before anything is expanded: none of our documents has a use for them.
    assert "aliases" in msg and len(msg) < 200


def test_unreadable_path(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path, required=True)  # a directory


# ---------------------------------------------------------------- kubelet.serverName

def test_server_name():
    assert parse_config({}).kubelet.server_name is None
    cfg = parse_config({"kubelet": {"url": "https://127.0.0.1:10250/pods", "serverName": "node-1"}})
    assert cfg.kubelet.server_name == "node-1"


@pytest.mark.parametrize("url", [
    "https://127.0.0.1:10250/pods", "http://127.0.0.1:10255/pods", "https://[::1]:10250/pods",
    "https://[fe80::1%25eth0]:10250/pods", "https://node-1.example:10250/pods?x=1", "HTTPS://NODE_1/pods",
    "https://node-1.", "http://localhost",
])
def test_good_kubelet_urls_pass_and_the_source_takes_them_apart(url):
    cfg = parse_config({"kubelet": {"url": url}})
    assert cfg.kubelet.url == url
    # The source names itself by the URL only when it could take it apart (a bad one: "kubelet").
    assert KubeletSource(cfg.kubelet, hostname=lambda: "node-1").name.lower().startswith("kubelet http")


@pytest.mark.parametrize("value", ["", "two words", "a/b", 5, ["x"]])
def test_bad_server_name_names_key_and_value(value):
    with pytest.raises(ConfigError) as e:
        parse_config({"kubelet": {"serverName": value}}, "config.yaml")
    assert str(e.value).startswith("config.yaml: kubelet.serverName: ")


# ---------------------------------------------------------------- reset with a broken config

def test_unit_names_config_keeps_the_keys_that_name_units_and_drops_the_rest(tmp_path):
    from memqos_systemd.config import Config, unit_names_config

    f = tmp_path / "config.yaml"
    f.write_text("cgroupRoot: /custom\nkubeReservedCgroup: /kube.slice\nsystemReservedCgroup: not-a-path\n"
                 "enforceNodeAllocatable: [pods, kube-reserved]\nmemoryThrottlingFactor: 7\nnoSuchKey: 1\n")
    with pytest.raises(ConfigError):
        load_config(f)
    cfg = unit_names_config(f)
    assert (cfg.cgroup_root, cfg.kube_reserved_cgroup, cfg.system_reserved_cgroup) == ("/custom", "/kube.slice", None)
    assert cfg.enforce_node_allocatable == ("pods", "kube-reserved")
    assert cfg.memory_throttling_factor == Config().memory_throttling_factor


def test_unit_names_config_reads_the_kubelets_file_for_what_ours_does_not_say(tmp_path):
    from memqos_systemd.config import unit_names_config

    kubelet = tmp_path / "kubelet.yaml"
    kubelet.write_text("kind: KubeletConfiguration\nsystemReservedCgroup: /system.slice\ncgroupRoot: /k\n")
    f = tmp_path / "config.yaml"
    f.write_text(f"kubeletConfigFile: {kubelet}\ncgroupRoot: /ours\nhierarchy: flat\n")
    cfg = unit_names_config(f)
    assert (cfg.cgroup_root, cfg.system_reserved_cgroup) == ("/ours", "/system.slice")


@pytest.mark.parametrize("text", [None, "", "cgroupRoot: [\n", "- a list\n", "\xff\xfe"])
def test_unit_names_config_of_garbage_is_the_defaults(tmp_path, text):
    from memqos_systemd.config import Config, unit_names_config

    f = tmp_path / "config.yaml"
    if text is not None:
        f.write_bytes(text.encode("latin-1"))
    assert unit_names_config(f) == Config()


def test_best_effort_ceiling_is_off_by_default_and_every_number_is_a_key():
    from memqos_systemd.config import CeilingSettings
    assert parse_config({}).best_effort_ceiling == CeilingSettings() and not CeilingSettings().enabled
    assert CeilingSettings() == CeilingSettings(False, Reserve(256 * Mi), 64 * Mi)  # measured: docs/DESIGN.md
    cfg = parse_config({"bestEffortCeiling": {"enabled": True, "headroom": "1Gi", "minimum": "128Mi"}})
    assert cfg.best_effort_ceiling == CeilingSettings(True, Reserve(1 * Gi), 128 * Mi)
    assert parse_config({"bestEffortCeiling": {"enabled": True, "headroom": 0}}).best_effort_ceiling.headroom == Reserve()
    # issue 33: a percentage, as protectionHeadroom takes, of allocatable (plan.py resolves it).
    assert parse_config({"bestEffortCeiling": {"headroom": "5%"}}).best_effort_ceiling.headroom == Reserve(
        fraction=Fraction(5, 100))
    assert parse_config({"bestEffortCeiling": None}).best_effort_ceiling == CeilingSettings()


@pytest.mark.parametrize("kubelet, gate, memory", [
    ("featureGates: {QOSReserved: true}\nqosReserved: {memory: 100%}", True, "100%"),
    ("featureGates: {QOSReserved: false}\nqosReserved: {memory: 50%}", False, "50%"),
    ("qosReserved: {memory: 50%}", None, "50%"),
    ("featureGates: {QOSReserved: true}", True, None),
    ("featureGates: {QOSReserved: true}\nqosReserved: {memory: ''}", True, None),
    ("qosReserved: [memory]", None, None),
])
def test_the_kubelets_qos_reserved_is_read_from_its_config(kubelet, gate, memory):
    c = merged("{}", f"kind: KubeletConfiguration\n{kubelet}\n")
    assert (c.kubelet_qos_reserved_gate, c.kubelet_qos_reserved_memory) == (gate, memory)


@pytest.mark.parametrize("text", ["pressureGuard: {enabled: true}", "pressureGuard: null", "pressureGuard: false"])
def test_the_removed_pressure_guard_says_what_replaced_it(text):
    """Issue 25: the reactive guard is gone, replaced by a planned BestEffort ceiling. A config that
    still names it is refused (the service keeps its old config on reload) with one line that says
    what to write instead, whatever its value."""
    msg = error(text)
    assert msg == ("config.yaml: pressureGuard: the pressure guard was removed; the BestEffort ceiling replaced it"
                   " (bestEffortCeiling: {enabled: true}, a MemoryMax the kernel enforces, /usr/share/doc/memqos-systemd/DESIGN.md):"
                   " delete pressureGuard"), msg
    assert "\n" not in msg


# issue 33, item 8: the values as YAML spells them, and the words a bad quantity gets.
@pytest.mark.parametrize("text, expected", [
    ("metrics: {perPod: null}", "config.yaml: metrics.perPod: null must be true or false"),
    ("bestEffortCeiling: {enabled: ~}", "config.yaml: bestEffortCeiling.enabled: null must be true or false"),
    ("resyncInterval: false", "config.yaml: resyncInterval: false is not a duration (e.g. 5s, 500ms, 1m)"),
    # 8Ei is 2**63, one byte past the largest: never "'8Ei' is larger than 8Ei".
    ("kubeReserved: {memory: 8Ei}", "config.yaml: kubeReserved.memory: '8Ei' is larger than the largest memory"
                                    " quantity, 9223372036854775807 bytes (8Ei - 1)"),
    # resource.ParseQuantity refuses space around a quantity; so do we.
    ('kubeReserved: {memory: "1Gi\\t"}', "config.yaml: kubeReserved.memory: '1Gi\\t' is not a memory quantity"
                                         " (e.g. 512Mi, 1.5Gi, 1073741824)"),
    ('kubeReserved: {memory: " 1Gi"}', "config.yaml: kubeReserved.memory: ' 1Gi' is not a memory quantity"
                                       " (e.g. 512Mi, 1.5Gi, 1073741824)"),
    # A fraction of a byte in the config is a slip, refused rather than rounded up to 1.
    ("systemReserved: {memory: 500m}", "config.yaml: systemReserved.memory: '500m' is not a whole number of bytes"
                                       " (Kubernetes would round it up to 1; did you mean 500Mi?)"),
    ("systemReserved: {memory: 0.1Ki}", "config.yaml: systemReserved.memory: '0.1Ki' is not a whole number of bytes"
                                        " (Kubernetes would round it up to 103; did you mean a whole number of bytes,"
                                        " or a unit such as Mi or Gi?)"),
])
def test_bad_values_read_as_the_user_wrote_them(text, expected):
    assert error(text) == expected


def test_the_largest_memory_quantity_is_taken():
    assert cfg("kubeReserved: {memory: 9223372036854775807}").kube_reserved == 2**63 - 1
    assert cfg("systemReserved: {memory: 1.5Ki}").system_reserved == 1536  # a fraction of a unit, whole bytes
