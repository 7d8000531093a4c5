"""The monitoring mixin (monitoring/, issue 17), checked with the real tools: `promtool check rules`
and `promtool test rules` (Debian's prometheus package) on the shipped rules; every alert has a
test file with a series that fires it and one that must not, a runbook section and a working
runbook_url; the dashboard parses, its queries are valid PromQL, and the rules and the dashboard
use only series the daemon serves (rendered here from a real `Metrics`) or the rules record."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from memqos_systemd.cgroupfs import Cgroupfs
from memqos_systemd.config import Config, MetricsConfig
from memqos_systemd.metrics import Metrics
from memqos_systemd.plan import NodeFacts, plan
from memqos_systemd.pods import Container, Pod

from prereq import require


def _repo_dir(name: str) -> Path:
    for d in Path(__file__).resolve().parents:
        if (d / name).exists():
            return d / name
    pytest.fail(f"{name} not found above tests/ (debian/pybuild.testfiles copies what tests read)")


MON = _repo_dir("monitoring")
RUNBOOK = _repo_dir("docs") / "runbook.md"
RULE_FILES = [MON / "alerts.yaml", MON / "rules.yaml"]
TEST_FILES = sorted((MON / "tests").glob("*.yaml"))
PROMTOOL = shutil.which("promtool")
GI = 2**30


def _promtool(*args: str, cwd: Path = MON) -> subprocess.CompletedProcess:
    require(PROMTOOL, "promtool missing: apt-get install prometheus (scripts/install-deps.sh test)")
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def _rules(path: Path) -> list[dict]:
    return [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]


ALERTS = {r["alert"]: r for r in _rules(MON / "alerts.yaml")}
RECORDED = {r["record"] for r in _rules(MON / "rules.yaml")}


# ---- promtool -------------------------------------------------------------------------------------

def test_promtool_check_rules():
    p = _promtool("check", "rules", *map(str, RULE_FILES))
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("test_file", TEST_FILES, ids=[f.stem for f in TEST_FILES])
def test_promtool_test_rules(test_file):
    p = _promtool("test", "rules", str(test_file.relative_to(MON)))
    assert p.returncode == 0, p.stdout + p.stderr


def test_every_alert_has_a_firing_and_a_silent_case():
    """In the promtool tests: for each alert an evaluation that expects it to fire, and one on
    input series that expects no alert."""
    fires, silent = set(), set()
    for f in TEST_FILES:
        for group in yaml.safe_load(f.read_text()).get("tests", []):
            if not group.get("input_series"):
                continue
            for t in group.get("alert_rule_test", []):
                (fires if t.get("exp_alerts") else silent).add(t["alertname"])
    assert set(ALERTS) - fires == set(), "alerts no test fires"
    assert set(ALERTS) - silent == set(), "alerts no test expects silent"


def test_the_issue_lists_these_alerts():
    """Issue 17: protection breached, OOM kill in a protected pod, sustained full pressure,
    holding > N min, pod source down, drift not corrected, a foreign writer, the daemon absent."""
    assert set(ALERTS) == {"MemqosProtectionBreached", "MemqosProtectedPodOOMKilled",
                           "MemqosPodMemoryFullPressure", "MemqosHolding", "MemqosPodSourceDown",
                           "MemqosDriftNotCorrected", "MemqosForeignWriter", "MemqosDaemonAbsent"}


# ---- runbook --------------------------------------------------------------------------------------

def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as '-'."""
    out = set()
    for line in markdown.splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_alert_has_severity_text_and_a_runbook_section(name):
    rule = ALERTS[name]
    assert rule["labels"]["severity"] in ("warning", "critical")
    ann = rule["annotations"]
    assert ann["summary"] and ann["description"]
    url = ann["runbook_url"]
    assert url.split("#")[0].endswith("docs/runbook.md")
    assert url.split("#")[1] == name.lower() and name.lower() in _anchors(RUNBOOK.read_text())
    section = RUNBOOK.read_text().split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]
    for part in ("**Meaning.**", "**Confirm.**", "**What to do.**"):
        assert part in section, f"runbook {name}: no {part}"


# ---- metric names ---------------------------------------------------------------------------------

def _served_names(tmp_path: Path, settings: MetricsConfig = MetricsConfig(per_unit=True)) -> set[str]:
    """Every sample name the daemon's /metrics serves once each kind of event has happened: a real
    Metrics with a plan, its pods', QoS slices' and containers' cgroup files, and one call of each
    method; by default with every series (metrics.perUnit)."""
    pods = [
        Pod("11111111-1111-4111-8111-111111111111", "db", "pg-0", "Guaranteed",
            (Container("pg", "app", GI, GI, "containerd://" + "a" * 64),)),
        Pod("22222222-2222-4222-8222-222222222222", "web", "api-0", "Burstable",
            (Container("api", "app", GI, 4 * GI, "containerd://" + "b" * 64),)),
    ]
    p = plan(pods, NodeFacts(16 * GI), Config(memory_reservation_policy="TieredReservation"))
    fs = Cgroupfs(tmp_path)
    for u in p.units:
        if u.level in ("qos", "pod", "container") or u.unit == "kubepods.slice":
            d = fs.place(p.cgroup_paths)[u.unit]
            d.mkdir(parents=True, exist_ok=True)
            (d / "memory.events").write_text("low 1\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
            (d / "memory.current").write_text("4096\n")
            (d / "memory.pressure").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=1\n"
                                               "full avg10=0.00 avg60=0.00 avg300=0.00 total=1\n")
    m = Metrics()
    m.set_plan(p, fs, settings)
    m.round_state(1, True)
    m.observe_reconcile(0.01, 1)
    m.dbus_call("SetUnitProperties", "ok")
    m.source_ok()
    m.source_error("connect")
    m.config_reload(True)
    m.signal_overflow()
    m.foreign_write("node", "cgroupfs")
    m.oom_group_restored(True)
    names = {s.name for fam in text_string_to_metric_families(m.render().decode()) for s in fam.samples}
    node = {"memqos_qos_memory_events_total", "memqos_qos_memory_pressure_seconds_total", "memqos_units_drifted",
            "memqos_holding", "memqos_qos_memory_usage_bytes"}
    pods = {"memqos_pod_memory_events_total", "memqos_pod_memory_pressure_seconds_total",
            "memqos_pod_memory_usage_bytes", "memqos_pod_memory_protected_bytes"}
    assert node <= names and (pods <= names) == settings.per_pod  # the names the rules rely on
    return names


def _names_in(expr: str) -> set[str]:
    """The series names of ours a PromQL expression uses (quoted strings dropped)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    return set(re.findall(r"[a-zA-Z_:]*memqos[a-zA-Z0-9_:]*", expr))


def _dashboard() -> dict:
    return json.loads((MON / "dashboard.json").read_text())


def _dashboard_exprs(d: dict) -> list[str]:
    exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", []) if t.get("expr")]
    exprs += [a["expr"] for a in d.get("annotations", {}).get("list", []) if a.get("expr")]
    exprs += [v["definition"] for v in d["templating"]["list"] if v.get("definition")]
    return exprs


def test_rules_and_dashboard_use_only_series_that_exist(tmp_path):
    known = _served_names(tmp_path) | RECORDED
    used = {}
    for path in RULE_FILES:
        for r in _rules(path):
            for n in _names_in(r["expr"]):
                used.setdefault(n, []).append(r.get("alert") or r.get("record"))
    d = _dashboard()
    for e in _dashboard_exprs(d):
        for n in _names_in(e):
            used.setdefault(n, []).append("dashboard.json")
    assert {n: where for n, where in used.items() if n not in known} == {}
    assert "namespace_pod:memqos_pod_memory_protected_bytes:sum" in used  # the dashboard reads the rules


def test_without_per_pod_series_every_alert_and_node_panel_keeps_its_series(tmp_path):
    """metrics.perPod: false serves the node's and the QoS classes' series only: each alert on the
    kernel's signals has a branch on those (its promtool tests fire it from them alone), and every
    recording rule and dashboard query not about single pods uses only those."""
    known = _served_names(tmp_path, MetricsConfig(per_pod=False)) | RECORDED
    per_pod_rules = {r["record"] for r in _rules(MON / "rules.yaml") if r["record"].startswith("namespace_pod")}
    for name in ("MemqosProtectionBreached", "MemqosProtectedPodOOMKilled", "MemqosPodMemoryFullPressure"):
        assert "memqos_qos_memory_" in ALERTS[name]["expr"] and "unless on (job, instance)" in ALERTS[name]["expr"]
    d = _dashboard()
    pods_row = next(p["gridPos"]["y"] for p in d["panels"] if p["type"] == "row" and p["title"] == "Pods")
    daemon_row = next(p["gridPos"]["y"] for p in d["panels"] if p["type"] == "row" and p["title"] == "The daemon")
    node_panels = [p for p in d["panels"] if not pods_row <= p["gridPos"]["y"] < daemon_row]
    for p in node_panels:
        for t in p.get("targets", []):
            # A panel may try the per-pod series first ("or" the class's): the last branch must be served.
            names = _names_in(t["expr"].rsplit(" or ", 1)[-1]) - per_pod_rules - {"memqos_pod_memory_protected_bytes"}
            assert names <= known, (p["title"], names - known)
    for r in _rules(MON / "rules.yaml"):
        if r["record"] not in per_pod_rules:
            assert _names_in(r["expr"]) <= known, r["record"]


def test_dashboard_parses_and_its_queries_are_promql(tmp_path):
    """Grafana's variables replaced by values of their kind, each query is checked by promtool as
    the expression of a recording rule."""
    d = _dashboard()
    assert d["uid"] and d["title"] and d["schemaVersion"] >= 30
    titles = [p["title"] for p in d["panels"]]
    for wanted in ("Node protection against allocatable", "Per-pod usage against protection",
                   "Breaches and OOM kills per pod (time range)", "Pod pressure (full)"):
        assert wanted in titles
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    subst = {"$__rate_interval": "1m", "$__range": "1h", "$__interval": "1m",
             "$instance": ".*", "$namespace": ".*"}
    rules = []
    for i, e in enumerate(_dashboard_exprs(d)):
        for k, v in subst.items():
            e = e.replace(k, v)
        assert "$" not in e, e
        if e.startswith("label_values("):
            e = e[len("label_values("):].rsplit(",", 1)[0]  # its selector
        rules.append({"record": f"dashboard_query_{i}", "expr": e})
    f = tmp_path / "dashboard-queries.yaml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    p = _promtool("check", "rules", str(f))
    assert p.returncode == 0, p.stdout + p.stderr
