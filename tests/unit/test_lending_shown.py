"""How the lines that follow usage (issue 44, lending_watch.lines_now) are shown: `status` draws
them from the pods' cgroups as a first look does, and says per lever its line and what it lends;
`plan`, which has no usage, says that the service draws its lines from usage and where to see them.
The node is test_burstable_lever's (16Gi, allocatable 16284Mi; requests 3684Mi), headroom 256Mi."""

from __future__ import annotations

from memqos_systemd import lending
from memqos_systemd.burstable_lever import BurstableLever
from memqos_systemd.ceiling_watch import CeilingWatch
from memqos_systemd.cgroup_tree import cgroup_path
from memqos_systemd.cgroupfs import Cgroupfs
from memqos_systemd.cli import plan_to_table
from memqos_systemd.config import parse_config
from memqos_systemd.face import WIDTH
from memqos_systemd.lending_watch import LendingWatch, lines_now
from memqos_systemd.metrics import Metrics
from memqos_systemd.features import plan_all
from memqos_systemd.plan import NodeFacts, plan

from test_burstable_lever import NODE
from test_plan import Gi, Mi, pod_unit

PAGE = 4096

_lever_of = BurstableLever().pod_doc
_lever_lines = BurstableLever().status_lines


def _ceiling_lines(row: dict) -> list[str]:
    return CeilingWatch(Cgroupfs(), None, PAGE).status_lines(row, [], False)
ALLOC = 16284 * Mi
LEVERS = {"bestEffortCeiling": {"enabled": True}, "burstableHigh": {"enabled": True}}
LENDING = {**LEVERS, "lending": {"enabled": True}}
HEADROOM = 64 * Mi  # lending.headroom's default
G, B1, B2, CAPPED = pod_unit(1, "Guaranteed"), pod_unit(2), pod_unit(3), pod_unit(4)
REQUESTS = {G: 2 * Gi, B1: Gi, B2: 512 * Mi, CAPPED: 100 * Mi}
USAGE = {G: Gi, B1: 256 * Mi, B2: 0, CAPPED: 50 * Mi}


def planned(keys):
    cfg = parse_config(keys)
    return plan_all(list(NODE), NodeFacts(16 * Gi, PAGE), cfg), cfg


def cgroups(tmp_path, usage=USAGE):
    for unit, used in usage.items():
        d = tmp_path / cgroup_path(unit)
        d.mkdir(parents=True)
        (d / "memory.current").write_text(f"{used}\n")
        (d / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
        (d / "memory.pressure").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
                                           "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    return Cgroupfs(tmp_path)


def reserve(unit):
    return min(REQUESTS[unit], USAGE[unit] + lending.slack_min(REQUESTS[unit]))


def grid(x):
    q = lending.quantum(ALLOC, PAGE)
    return x // q * q


def test_status_draws_the_lines_a_look_draws_now(tmp_path):
    desired, cfg = planned(LENDING)
    now = lines_now(desired, cgroups(tmp_path), cfg, PAGE, 100.0)
    ceiling = grid(ALLOC - HEADROOM - sum(reserve(u) for u in REQUESTS))
    assert now.ceiling.memory_max == ceiling
    # lent above the same line with every request reserved (lending's headroom, which status shows)
    assert now.ceiling.lent == ceiling - (ALLOC - HEADROOM - sum(REQUESTS.values())) > 0
    assert now.ceiling.headroom == HEADROOM and desired.ceiling.headroom == 256 * Mi
    b1 = now.lever_of(B1)
    assert b1.memory_high == grid(ALLOC - HEADROOM - sum(reserve(u) for u in REQUESTS if u != B1))
    assert b1.lent == b1.memory_high - desired.lever_of(B1).memory_high > 0
    assert now.by_unit()[B1].memory_high == b1.memory_high  # laid as drawn, not stepped
    assert now.by_unit()["kubepods-besteffort.slice"].memory_max == ceiling
    assert now.ceiling.guard == lending.GUARD and desired.ceiling.guard == 0  # its steps stop above the usage


def test_lending_off_leaves_the_plan_as_it_is(tmp_path):
    desired, cfg = planned(LEVERS)
    assert lines_now(desired, cgroups(tmp_path), cfg, PAGE, 100.0) is desired
    desired, cfg = planned({"lending": {"enabled": True}})  # no lever to draw
    assert lines_now(desired, cgroups(tmp_path / "x"), cfg, PAGE, 100.0) is desired


def test_an_unreadable_owner_keeps_its_whole_request(tmp_path):
    desired, cfg = planned(LENDING)
    fs = cgroups(tmp_path, {u: v for u, v in USAGE.items() if u != G})
    now = lines_now(desired, fs, cfg, PAGE, 100.0)
    assert now.ceiling.memory_max == grid(ALLOC - HEADROOM - REQUESTS[G] - sum(reserve(u) for u in REQUESTS if u != G))


def test_status_lines_say_each_line_and_what_it_lends(tmp_path):
    desired, cfg = planned(LENDING)
    now = lines_now(desired, cgroups(tmp_path), cfg, PAGE, 100.0)
    lever = _lever_of(now, B1)
    assert lever["lentBytes"] == now.lever_of(B1).lent and lever["MemoryHigh"] == now.lever_of(B1).memory_high
    assert lever["formula"].startswith(f"MemoryHigh {_gi(lever['MemoryHigh'])} follows usage: lends ")
    assert "above allocatable 15.9Gi - others' requests" in lever["formula"]
    row = {"unit": "kubepods-besteffort.slice", "enabled": True, "MemoryMax": now.ceiling.memory_max,
           "systemd": now.ceiling.memory_max, "usageBytes": 0, "lentBytes": now.ceiling.lent,
           "requestsBytes": now.ceiling.requests, "headroomBytes": now.ceiling.headroom,
           "minimumBytes": now.ceiling.minimum, "events": {"max": 0, "oom": 0, "oom_kill": 0}}
    lines = _ceiling_lines(row)  # wrapped, never cut (issue 43)
    first = lines[0]
    how = next(line for line in lines if line.startswith("  follows usage"))
    assert first.startswith(f"BestEffort ceiling (kubepods-besteffort.slice): plan {_gi(now.ceiling.memory_max)}")
    assert how.startswith(f"  follows usage: lends {_gi(now.ceiling.lent)} above allocatable - requests 3.6Gi")
    assert all(len(line) <= WIDTH for line in lines)
    assert " ".join(" ".join(lines).split()).endswith("memory.events max 0, oom_kill 0")
    static = {**row, "lentBytes": None, "MemoryMax": desired.ceiling.memory_max}
    assert any(line.startswith("  allocatable - requests 3.6Gi - headroom") for line in _ceiling_lines(static))
    pods = [{"namespace": "default", "pod": "b1", "burstableHigh": lever}]
    lines = _lever_lines({"enabled": True, "companion": False, "pods": 2}, pods, False)
    assert lines[1].startswith("  default/b1: MemoryHigh ") and "follows usage: lends" in lines[1]


def test_metrics_show_the_lines_and_go_with_them(tmp_path):
    desired, cfg = planned(LENDING)
    now = lines_now(desired, cgroups(tmp_path), cfg, PAGE, 100.0)
    m = Metrics()
    m.declare(LendingWatch.families)  # as the daemon does, for each feature of the table
    watch = LendingWatch(Cgroupfs(tmp_path), PAGE, m)

    def sample(name, lever, pod=""):
        return m.registry.get_sample_value(name, {"lever": lever, "pod": pod})
    watch.show_lines(now)
    assert sample("memqos_lending_line_bytes", "bestEffortCeiling") == now.ceiling.memory_max
    assert sample("memqos_lending_lent_bytes", "bestEffortCeiling") == now.ceiling.lent
    pod = now.lever_of(B1).pod
    assert sample("memqos_lending_line_bytes", "burstableHigh", pod) == now.lever_of(B1).memory_high
    assert sample("memqos_lending_lent_bytes", "burstableHigh", pod) == now.lever_of(B1).lent
    watch.show_lines(None)  # lending off: the series go
    assert sample("memqos_lending_line_bytes", "bestEffortCeiling") is None
    assert sample("memqos_lending_lent_bytes", "burstableHigh", pod) is None


def test_plan_says_the_service_draws_the_lines_from_usage():
    desired, cfg = planned(LENDING)
    table = plan_to_table(desired, cfg).splitlines()
    at = next(i for i, line in enumerate(table) if line.startswith("lending on: "))
    assert "memqos_lending_line_bytes" in table[at + 2] and all(len(line) <= 100 for line in table[at:at + 3])
    assert not any(line.startswith("lending on") for line in plan_to_table(*planned(LEVERS)).splitlines())


def _gi(n):
    from memqos_systemd.face import human
    return human(n)
