"""Metrics rendered from a private registry (the HTTP endpoint is in tests/integration/test_metrics_http.py)."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

import memqos_systemd
from memqos_systemd.config import Config, MetricsConfig
from memqos_systemd.metrics import Metrics, parse_listen
from memqos_systemd.plan import INFINITY, NodeFacts, plan
from memqos_systemd.pods import Container, Pod

GI = 2**30
CID = "containerd://" + "a" * 64


def make_pods() -> list[Pod]:
    return [
        Pod("11111111-1111-4111-8111-111111111111", "db", "pg-0", "Guaranteed",
            (Container("pg", "app", 2 * GI, 2 * GI, CID),)),
        Pod("22222222-2222-4222-8222-222222222222", "web", "api-0", "Burstable",
            (Container("api", "app", GI, 4 * GI, "containerd://" + "b" * 64),)),
        Pod("33333333-3333-4333-8333-333333333333", "web", "api-1", "Burstable",
            (Container("api", "app", GI, None, None),)),
        Pod("44444444-4444-4444-8444-444444444444", "batch", "job", "BestEffort",
            (Container("job", "app", 0, None, "containerd://" + "c" * 64),)),
    ]


def make_plan():
    return plan(make_pods(), NodeFacts(16 * GI), Config(memory_reservation_policy="TieredReservation"))


def scrape(m: Metrics) -> dict[str, dict[tuple, float]]:
    """name -> {sorted label items: value} from the text exposition."""
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(m.render().decode()):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


class Clock:
    def __init__(self, t=0.0):
        self.t = t

    def __call__(self):
        return self.t


def test_private_registry_only():
    before = set(REGISTRY._names_to_collectors)
    a, b = Metrics(), Metrics()  # two instances do not collide
    assert a.registry is not b.registry
    assert set(REGISTRY._names_to_collectors) == before


def test_only_module_importing_prometheus_client():
    pkg = Path(memqos_systemd.__file__).parent
    importers = []
    for f in pkg.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n.split(".")[0] == "prometheus_client" for n in names):
                importers.append(f.name)
    assert set(importers) == {"metrics.py"}


def test_build_info():
    s = scrape(Metrics(version="9.9.9"))
    assert s["memqos_build_info"] == {(("version", "9.9.9"),): 1.0}
    assert scrape(Metrics())["memqos_build_info"] == {(("version", memqos_systemd.__version__),): 1.0}


def test_set_plan():
    p = make_plan()
    m = Metrics()
    m.set_plan(p)
    s = scrape(m)
    node = p.node_unit()
    assert node.unit == "kubepods.slice"
    assert s["memqos_node_memory_min_bytes"][()] == node.memory_min == 2 * GI
    assert s["memqos_node_memory_low_bytes"][()] == node.memory_low == 2 * GI
    assert s["memqos_node_capacity_bytes"][()] == 16 * GI
    assert s["memqos_node_allocatable_bytes"][()] == p.allocatable
    assert s["memqos_pods"] == {(("qos_class", "Guaranteed"),): 1, (("qos_class", "Burstable"),): 2,
                                (("qos_class", "BestEffort"),): 1}
    assert s["memqos_plan_warnings"][()] == len(p.warnings)
    # The node, QoS and reserved slices' desired values; the pods' are memqos_pod_memory_protected_bytes.
    desired = s["memqos_unit_desired_bytes"]
    upper = [u for u in p.units if u.level in ("node", "qos", "reserved")]
    assert len(desired) == 3 * len(upper) == 9
    for u in upper:
        for prop, value in u.properties().items():
            got = desired[(("level", u.level), ("property", prop), ("unit", u.unit))]
            assert got == (math.inf if value == INFINITY else value)
    burstable = (("level", "qos"), ("property", "MemoryLow"), ("unit", "kubepods-burstable.slice"))
    assert desired[burstable] == 2 * GI


def test_per_unit_desired_values_are_opt_in():
    p = make_plan()
    m = Metrics()
    m.set_plan(p, settings=MetricsConfig(per_unit=True))
    desired = scrape(m)["memqos_unit_desired_bytes"]
    assert len(desired) == 3 * len(p.units)
    for u in p.units:
        for prop, value in u.properties().items():
            got = desired[(("level", u.level), ("property", prop), ("unit", u.unit))]
            assert got == (math.inf if value == INFINITY else value)
    m.set_plan(p, settings=MetricsConfig(per_pod=False))
    assert len(scrape(m)["memqos_unit_desired_bytes"]) == 9


def test_set_plan_replaces_units():
    m = Metrics()
    m.set_plan(make_plan(), settings=MetricsConfig(per_unit=True))
    m.set_plan(plan([], NodeFacts(16 * GI), Config()), settings=MetricsConfig(per_unit=True))
    s = scrape(m)
    units = {dict(k)["unit"] for k in s["memqos_unit_desired_bytes"]}
    assert units == {"kubepods.slice", "kubepods-burstable.slice", "kubepods-besteffort.slice"}
    assert set(s["memqos_pods"].values()) == {0}


def test_no_plan_yet_no_plan_metrics():
    s = scrape(Metrics())
    assert "memqos_unit_desired_bytes" not in s and "memqos_node_memory_min_bytes" not in s


def test_observe_reconcile():
    m = Metrics(wall_clock=lambda: 1700000000.0)
    m.observe_reconcile(0.004, 3)
    m.observe_reconcile(0.2, 0)
    s = scrape(m)
    assert s["memqos_reconcile_duration_seconds_count"][()] == 2
    assert s["memqos_reconcile_duration_seconds_sum"][()] == pytest.approx(0.204)
    assert s["memqos_reconcile_duration_seconds_bucket"][(("le", "0.005"),)] == 1
    assert s["memqos_reconcile_changes_total"][()] == 3
    assert s["memqos_last_reconcile_timestamp_seconds"][()] == 1700000000.0


def test_dbus_calls():
    m = Metrics()
    m.dbus_call("SetUnitProperties", "ok")
    m.dbus_call("SetUnitProperties", "ok")
    m.dbus_call("SetUnitProperties", "NoSuchUnit")
    m.dbus_call("ListUnitsByPatterns", "timeout")
    s = scrape(m)["memqos_dbus_calls_total"]
    assert s[(("method", "SetUnitProperties"), ("result", "ok"))] == 2
    assert s[(("method", "SetUnitProperties"), ("result", "NoSuchUnit"))] == 1
    assert s[(("method", "ListUnitsByPatterns"), ("result", "timeout"))] == 1


def test_source_success_error_and_age():
    clock = Clock(100.0)
    m = Metrics(clock=clock, wall_clock=lambda: 1700000000.0)
    assert "memqos_source_snapshot_age_seconds" not in scrape(m)  # no good snapshot yet
    m.source_error("timeout")
    m.source_error("timeout")
    m.source_error("pods")

    class Snap:
        fetched_at = 95.0

    m.source_ok(Snap())
    clock.t = 130.0
    s = scrape(m)
    assert s["memqos_source_errors_total"] == {(("kind", "timeout"),): 2, (("kind", "pods"),): 1}
    assert s["memqos_source_last_success_timestamp_seconds"][()] == 1700000000.0
    assert s["memqos_source_snapshot_age_seconds"][()] == 35.0
    m.source_success()  # now
    assert scrape(m)["memqos_source_snapshot_age_seconds"][()] == 0.0


def test_foreign_writes_are_counted_by_level_and_writer_only():
    """One series per level (plan.LEVELS) and writer (drift.WRITERS), whatever the unit: a fleet's
    series stay bounded; the journal names the unit."""
    m = Metrics()
    for _ in range(3):
        m.foreign_write("node", "systemd")
    m.foreign_write("qos", "systemd")
    m.foreign_write("pod", "cgroupfs")
    m.foreign_write("kubepods-burstable-pod1.slice", "someone")  # not a level: "other", never a new label value
    s = scrape(m)["memqos_foreign_writes_total"]
    assert s == {(("level", "node"), ("writer", "systemd")): 3, (("level", "qos"), ("writer", "systemd")): 1,
                 (("level", "pod"), ("writer", "cgroupfs")): 1, (("level", "other"), ("writer", "other")): 1}


def test_config_reload():
    m = Metrics()
    m.config_reload(True)
    m.config_reload(False)
    m.config_reload(False)
    s = scrape(m)["memqos_config_reloads_total"]
    assert s == {(("result", "ok"),): 1, (("result", "refused"),): 2}


@pytest.mark.parametrize("listen,expect", [
    ("127.0.0.1:9759", ("127.0.0.1", 9759)),
    ("[::1]:9759", ("::1", 9759)),
    ("localhost:0", ("localhost", 0)),
    ("0.0.0.0:80", ("0.0.0.0", 80)),
])
def test_parse_listen(listen, expect):
    assert parse_listen(listen) == expect


@pytest.mark.parametrize("listen", ["9759", ":9759", "127.0.0.1:", "127.0.0.1:http", "127.0.0.1:70000"])
def test_parse_listen_bad(listen):
    with pytest.raises(ValueError, match="metrics.listen"):
        parse_listen(listen)


def test_no_metrics_answers_every_call_of_metrics():
    """NoMetrics stands in for Metrics wherever there is no endpoint (the daemon never asks
    `if metrics:`): every public method of one is a method of the other, with the same parameters."""
    import inspect

    from memqos_systemd.metrics import NoMetrics

    skip = {"render", "serve"}  # the endpoint itself: only Metrics has one
    calls = {n: inspect.signature(f) for n, f in inspect.getmembers(Metrics, inspect.isfunction)
             if not n.startswith("_") and n not in skip}
    noop = {n: inspect.signature(f) for n, f in inspect.getmembers(NoMetrics, inspect.isfunction)
            if not n.startswith("_")}
    assert noop == calls


def test_pod_signals_come_from_the_cgroups_at_each_scrape(tmp_path):
    """The pod and QoS slices' files are read when scraped, through cgroupfs.py; a pod whose cgroup
    is gone has no series, a kernel without PSI gives no pressure series, a plan without cgroups none."""
    from memqos_systemd.cgroupfs import Cgroupfs

    p = make_plan()
    fs = Cgroupfs(tmp_path)
    m = Metrics()
    m.set_plan(p)
    assert "memqos_pod_memory_events_total" not in scrape(m)
    m.set_plan(p, fs)
    assert "memqos_pod_memory_events_total" not in scrape(m)  # no cgroup made yet
    pods = {u.pod: u for u in p.units if u.level == "pod"}
    api = fs.dir_of(pods["web/api-0"].unit)
    api.mkdir(parents=True)
    (api / "memory.events").write_text("low 7\nhigh 1\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n")
    (api / "memory.current").write_text("1000\n")
    s = scrape(m)
    labels = {"namespace": "web", "pod": "api-0", "qos_class": "Burstable"}
    key = lambda **more: tuple(sorted({**labels, **more}.items()))  # noqa: E731
    assert s["memqos_pod_memory_events_total"][key(event="low")] == 7
    assert key(event="oom_group_kill") not in s["memqos_pod_memory_events_total"]
    assert s["memqos_pod_memory_usage_bytes"][key()] == 1000
    assert s["memqos_pod_memory_protected_bytes"][key(kind="low")] == GI
    assert "memqos_pod_memory_pressure_seconds_total" not in s  # no memory.pressure: no PSI
    (api / "memory.pressure").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=3000000\n"
                                         "full avg10=0.00 avg60=0.00 avg300=0.00 total=1000000\n")
    node = fs.dir_of("kubepods.slice")
    (node / "memory.pressure").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=9000000\n"
                                          "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    s = scrape(m)
    assert s["memqos_pod_memory_pressure_seconds_total"][key(kind="some")] == 3.0
    assert s["memqos_qos_memory_pressure_seconds_total"][(("kind", "some"), ("qos_class", "all"))] == 9.0
    assert {dict(k)["pod"] for k in s["memqos_pod_memory_events_total"]} == {"api-0"}  # the others: no cgroup


def test_units_drifted_and_holding():
    m = Metrics()
    m.round_state(3, True)
    s = scrape(m)
    assert s["memqos_units_drifted"][()] == 3 and s["memqos_holding"][()] == 1
    m.round_state(0, False)
    s = scrape(m)
    assert s["memqos_units_drifted"][()] == 0 and s["memqos_holding"][()] == 0

