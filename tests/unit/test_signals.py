"""signals.py: the table of kernel signals (each row has its case here), the text it writes (checked
by Prometheus' own parsers: `promtool check metrics` and prometheus_client.parser, hostile names
included), the series a pod and a node cost, and that nothing is read between scrapes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from memqos_systemd import signals
from memqos_systemd.cgroupfs import Cgroupfs, KeptFiles
from memqos_systemd.config import Config, MetricsConfig
from memqos_systemd.metrics import Metrics
from memqos_systemd.plan import NodeFacts, plan
from memqos_systemd.pods import Container, Pod
from memqos_systemd.signals import SIGNALS, SignalView

from prereq import require

GI = 2**30
EVENTS = "low 7\nhigh 1207\nmax 2\noom 1\noom_kill 1\noom_group_kill 0\n"
PSI = "some avg10=1.50 avg60=0.20 avg300=0.00 total=2500001\nfull avg10=0.75 avg60=0.10 avg300=0.00 total=7\n"
FILES = {"memory.events": EVENTS, "memory.pressure": PSI, "memory.current": "314572800\n", "memory.min": "0\n",
         "memory.low": "0\n"}

# Per signal (family): the labels of the one cgroup of its level the case's node has, and the
# values the kernel's files above give, by the key's label value ("" for one value).
POD = {"namespace": "web", "pod": "api-0", "qos_class": "Burstable"}
CASES = {
    "memqos_pod_memory_events_total": (POD, {"low": 7, "high": 1207, "max": 2, "oom": 1, "oom_kill": 1}),
    "memqos_pod_memory_pressure_seconds_total": (POD, {"some": 2.500001, "full": 0.000007}),
    "memqos_pod_memory_usage_bytes": (POD, {"": 314572800}),
    "memqos_qos_memory_events_total": ({"qos_class": "Burstable"}, {"low": 7, "high": 1207, "max": 2, "oom": 1,
                                                                    "oom_kill": 1}),
    "memqos_qos_memory_pressure_seconds_total": ({"qos_class": "Burstable"}, {"some": 2.500001, "full": 0.000007}),
    "memqos_qos_memory_usage_bytes": ({"qos_class": "Burstable"}, {"": 314572800}),
    "memqos_container_memory_high_events_total": ({**POD, "container": "api"}, {"": 1207}),
}


def one_pod_plan(namespace="web", name="api-0", container="api", qos="Burstable"):
    pod = Pod("22222222-2222-4222-8222-222222222222", namespace, name, qos,
              (Container(container, "app", GI, 4 * GI, "containerd://" + "b" * 64),))
    return plan([pod], NodeFacts(16 * GI), Config(memory_reservation_policy="TieredReservation"))


def kernel(tmp_path: Path, p, levels=("qos", "pod", "container")) -> Cgroupfs:
    """The plan's cgroups of these levels with the kernel's files (FILES); kubepods.slice's only
    when "node" is asked."""
    fs = Cgroupfs(tmp_path)
    for u in p.units:
        if u.level in levels:
            d = fs.place(p.cgroup_paths)[u.unit]
            d.mkdir(parents=True, exist_ok=True)
            for name, text in FILES.items():
                (d / name).write_text(text)
    return fs


def samples(page: bytes) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(page.decode()):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def promtool_check(page: bytes) -> None:
    promtool = shutil.which("promtool")
    require(promtool, "promtool missing: apt-get install prometheus (scripts/install-deps.sh test)")
    p = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True, timeout=60)
    assert p.returncode == 0, (p.stdout + p.stderr).decode()


def test_every_signal_has_its_case():
    assert {s.family for s in SIGNALS} == set(CASES)
    assert len({s.family for s in SIGNALS}) == len(SIGNALS)
    for s in SIGNALS:
        assert s.level in signals.LABELS and s.type in ("counter", "gauge")
        assert s.family.endswith("_total") == (s.type == "counter")
        assert s.label is not None or len(s.keys) == 1  # without a label, one series a cgroup


@pytest.mark.parametrize("signal", SIGNALS, ids=[s.family for s in SIGNALS])
def test_a_signal_is_its_file_read_through_its_parser(signal, tmp_path):
    """One row of the table: its file in the one cgroup of its level, read at a scrape, gives
    these series (its labels, the key's label) and values."""
    p = one_pod_plan()
    fs = kernel(tmp_path, p)
    view = SignalView.of(p, fs.place(p.cgroup_paths), per_pod=True, per_unit=True)
    s = samples(view.text(KeptFiles()))
    labels, values = CASES[signal.family]
    want = {tuple(sorted({**labels, **({signal.label: k} if signal.label else {})}.items())): v
            for k, v in values.items()}
    got = s[signal.family]
    if signal.level == "qos":  # the case's class; the others' cgroups are there too
        got = {k: v for k, v in got.items() if dict(k)["qos_class"] == labels["qos_class"]}
    assert got == pytest.approx(want)


def test_psi_seconds_are_exact_decimals_of_the_kernels_microseconds():
    assert signals.seconds(b"some avg10=0.00 avg60=0.00 avg300=0.00 total=1\n") == {b"some": b"0.000001"}
    assert signals.seconds(b"full total=123456789012\n") == {b"full": b"123456.789012"}
    assert signals.number(b"max\n") == {b"": b"+Inf"} and signals.number(b"x\n") == {}


# ---- the text, by Prometheus' own parsers --------------------------------------------------------

HOSTILE = [
    ('quo"te', 'back\\slash'),
    ("new\nline", "tab\tand\rreturn"),
    ("ünïcødé-名前", "пространство"),
    ('\\"', '\\n'),  # a backslash before what an escape would make
    ("lone\ud800surrogate", "x"),  # JSON can carry it, UTF-8 cannot: "?"
    ("a/b", "c"),  # split at the first "/" of namespace/name (Kubernetes allows none in either)
]


@pytest.mark.parametrize("name,namespace", HOSTILE)
def test_hostile_names_are_escaped_exactly(name, namespace, tmp_path):
    p = one_pod_plan(namespace=namespace, name=name, container=name + namespace)
    fs = kernel(tmp_path, p)
    m = Metrics()
    m.set_plan(p, fs, MetricsConfig(per_unit=True))
    page = m.render()
    s = samples(page)
    shown = lambda text: text.encode("utf-8", "replace").decode()  # noqa: E731 - the lone surrogate's "?"
    ns, _, pod = f"{namespace}/{name}".partition("/")
    want = {"namespace": shown(ns), "pod": shown(pod), "qos_class": "Burstable"}
    for family in ("memqos_pod_memory_events_total", "memqos_pod_memory_usage_bytes",
                   "memqos_pod_memory_protected_bytes", "memqos_container_memory_high_events_total"):
        got = [dict(k) for k in s[family]]
        assert got and all({k: labels[k] for k in want} == want for labels in got), family
    assert {dict(k)["container"] for k in s["memqos_container_memory_high_events_total"]} == {shown(name + namespace)}
    promtool_check(page)  # last: without promtool (a skip outside CI) the checks above have run


def test_a_whole_page_passes_promtool(tmp_path):
    p = one_pod_plan()
    fs = kernel(tmp_path, p)
    m = Metrics()
    m.set_plan(p, fs, MetricsConfig(per_unit=True))
    m.foreign_write("node", "systemd")
    m.source_success()
    promtool_check(m.render())


# ---- what a pod and a node cost -------------------------------------------------------------------

def node_of(n: int, containers: int = 1):
    pods = [Pod(f"6a4f2e3b-1c9d-4a5e-8f7b-{i:012x}", "prod", f"app-{i}", ("Guaranteed", "Burstable", "BestEffort")[i % 3],
                tuple(Container(f"c{j}", "app", GI // 8, GI // 4, f"containerd://{i:032x}{j:032x}")
                      for j in range(containers)))
            for i in range(n)]
    return plan(pods, NodeFacts(64 * GI), Config(memory_reservation_policy="TieredReservation"))


def series(tmp_path, p, settings) -> tuple[int, int]:
    """(series naming a pod, all others) of a page."""
    fs = kernel(tmp_path, p)
    m = Metrics()
    m.set_plan(p, fs, settings)
    m.dbus_call("GetAll", "ok")
    m.source_success()
    all_ = [s for fam in text_string_to_metric_families(m.render().decode()) for s in fam.samples]
    pod = [s for s in all_ if "pod" in s.labels]
    per_unit = [s for s in all_ if s.name == "memqos_unit_desired_bytes" and s.labels["level"] in ("pod", "container")]
    return len(pod) + len(per_unit), len(all_) - len(pod) - len(per_unit)


@pytest.mark.parametrize("containers", [1, 3])
def test_ten_series_a_pod_whatever_its_containers(containers, tmp_path):
    """The numbers docs/BENCHMARKS.md and monitoring/README.md state: 10 a pod (5 memory.events, 2
    PSI, usage, min and low protection); perUnit adds 3 a pod slice and 4 a container; perPod:
    false none; a node's own series do not grow with its pods."""
    nodes = set()
    for n in (3, 30):
        p = node_of(n, containers)
        per_pod, node = series(tmp_path / f"{n}-default", p, MetricsConfig())
        assert per_pod == 10 * n
        assert series(tmp_path / f"{n}-unit", p, MetricsConfig(per_unit=True))[0] == (10 + 3 + 4 * containers) * n
        assert series(tmp_path / f"{n}-node", p, MetricsConfig(per_pod=False)) == (0, node)
        nodes.add(node)
    assert len(nodes) == 1


def test_nothing_is_read_until_a_scrape(tmp_path, monkeypatch):
    reads = []
    real = KeptFiles.read
    monkeypatch.setattr(KeptFiles, "read", lambda self, path, size=4096: reads.append(path) or real(self, path, size))
    p = one_pod_plan()
    fs = kernel(tmp_path, p, levels=("node", "qos", "pod", "container"))
    m = Metrics()
    m.set_plan(p, fs, MetricsConfig(per_unit=True))
    m.set_plan(p, fs, MetricsConfig())
    assert reads == []
    m.render()
    # The pod's three files, each class's three, and for the effective protection memory.min and
    # memory.low of kubepods.slice and the two QoS slices: once each. (The Burstable pod's own are
    # not read for the per-class series: a class's share depends on its siblings only.)
    assert len(reads) == len(set(reads)) == 3 + 3 * 3 + 2 * 3


# ---- what the kernel protects now, per QoS class (issue 35) ---------------------------------------

def three_class_node():
    """One pod of each class: G requests 10 Gi, B requests 30 Gi (no limit), BE none."""
    pods = [Pod("11111111-1111-4111-8111-111111111111", "prod", "db", "Guaranteed",
                (Container("db", "app", 10 * GI, 10 * GI, "containerd://" + "a" * 64),)),
            Pod("22222222-2222-4222-8222-222222222222", "prod", "web", "Burstable",
                (Container("web", "app", 30 * GI, 0, "containerd://" + "b" * 64),)),
            Pod("33333333-3333-4333-8333-333333333333", "batch", "hog", "BestEffort",
                (Container("hog", "app", 0, 0, "containerd://" + "c" * 64),))]
    return plan(pods, NodeFacts(64 * GI), Config(memory_reservation_policy="TieredReservation"))


def worked_tree(tmp_path: Path, p, *, mounts: str | None = None) -> Cgroupfs:
    """The worked numbers of issue 35 (test_effective's kubepods) on the plan's cgroups (GiB):
    kubepods min 40 low 30; G pod 10 used, min 10; Burstable slice and pod low 30, 10 used;
    BestEffort 40 used, no setting. Whatever the plan says: the kernel's files are what counts."""
    fs = Cgroupfs(tmp_path, mounts=tmp_path / "mounts")
    (tmp_path / "mounts").write_text(mounts if mounts is not None else
                                     f"cgroup2 {tmp_path} cgroup2 rw,nsdelegate,memory_recursiveprot 0 0\n")
    node = p.node_unit().unit
    values = {}
    for u in p.units:
        if u.level == "node":
            values[u.unit] = (60, 40, 30)
        elif u.level == "qos":
            values[u.unit] = (40, 0, 0) if u.unit.endswith("-besteffort.slice") else (10, 0, 30)
        elif u.level == "pod":
            values[u.unit] = {"prod/db": (10, 10, 0), "prod/web": (10, 0, 30), "batch/hog": (40, 0, 0)}[u.pod]
    for unit, (current, mn, low) in values.items():
        d = fs.place(p.cgroup_paths)[unit]
        d.mkdir(parents=True, exist_ok=True)
        for name, v in (("memory.current", current), ("memory.min", mn), ("memory.low", low)):
            (d / name).write_text(f"{v * GI}\n")
    assert node in values
    return fs


def test_effective_and_lent_protection_per_class(tmp_path):
    p = three_class_node()
    fs = worked_tree(tmp_path, p)
    m = Metrics()
    m.set_plan(p, fs, MetricsConfig())
    page = m.render()
    s = samples(page)
    eff = {(dict(k)["qos_class"], dict(k)["kind"]): v / GI for k, v in s["memqos_effective_protection_bytes"].items()}
    lent = {(dict(k)["qos_class"], dict(k)["kind"]): v / GI for k, v in s["memqos_lent_protection_bytes"].items()}
    # BE 40 of U - S = 50 unprotected: min 30 * 40 / 50 = 24, Burstable 6; low: 20 floating over G 10 + BE 40.
    assert eff == {("Guaranteed", "min"): 10, ("Guaranteed", "low"): 4, ("Burstable", "min"): 6,
                   ("Burstable", "low"): 10, ("BestEffort", "min"): 24, ("BestEffort", "low"): 16,
                   ("all", "min"): 40, ("all", "low"): 30}
    assert lent == {("Guaranteed", "min"): 0, ("Guaranteed", "low"): 4, ("Burstable", "min"): 6,
                    ("Burstable", "low"): 0, ("BestEffort", "min"): 24, ("BestEffort", "low"): 16,
                    ("all", "min"): 0, ("all", "low"): 0}
    assert s["memqos_memory_recursiveprot"] == {(): 1}
    promtool_check(page)


def test_without_memory_recursiveprot_besteffort_holds_nothing(tmp_path):
    p = three_class_node()
    fs = worked_tree(tmp_path, p, mounts=f"cgroup2 {tmp_path} cgroup2 rw,nsdelegate 0 0\n")
    m = Metrics()
    m.set_plan(p, fs, MetricsConfig(per_pod=False))  # the classes are served without the pod level too
    s = samples(m.render())
    eff = {(dict(k)["qos_class"], dict(k)["kind"]): v / GI for k, v in s["memqos_effective_protection_bytes"].items()}
    assert eff[("BestEffort", "min")] == eff[("BestEffort", "low")] == 0
    assert (eff[("Burstable", "min")], eff[("Burstable", "low")], eff[("Guaranteed", "min")]) == (0, 10, 10)
    assert set(s["memqos_lent_protection_bytes"].values()) == {0}
    assert s["memqos_memory_recursiveprot"] == {(): 0}


def test_no_protection_series_while_kubepods_cannot_be_read(tmp_path):
    p = three_class_node()
    fs = Cgroupfs(tmp_path, mounts=tmp_path / "no-such-file")
    m = Metrics()
    m.set_plan(p, fs, MetricsConfig())
    s = samples(m.render())
    assert "memqos_effective_protection_bytes" not in s and "memqos_memory_recursiveprot" not in s
