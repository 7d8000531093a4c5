"""The operator commands as an operator runs them: `python3 -m memqos_systemd apply|reset|status|check|run`
in a real subprocess, talking to the recording systemd stand-in on a private dbus-daemon
(DBUS_SYSTEM_BUS_ADDRESS points the system bus there).

Issue #3's operator surface: exit 0 ok, 1 runtime failure (pod source or systemd unreachable),
2 bad input; failures are one clear line on stderr, never a traceback; --dry-run sends nothing.

The node's capacity is this machine's MemTotal (apply has no --node-memory), so the values
expected in "systemd" are what `memqos-systemd plan` prints for the same pods and config on
this machine; tests/unit/test_cli_plan.py checks those values by hand on a 16Gi node.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

import memqos_systemd
from memqos_systemd.cgroup_tree import cgroup_path
from memqos_systemd.node import check_node, read_meminfo
from memqos_systemd.sources.kubelet import node_hostname
from kubelet_standin import Kubelet, Server, make_pki, pod, pod_list, server_context
from prereq import require
from sockets import socket_path

pytestmark = pytest.mark.integration

INF = 2**64 - 1
DEFAULTS = {"MemoryMin": 0, "MemoryLow": 0, "MemoryHigh": INF}
CODE_ROOT = Path(memqos_systemd.__file__).resolve().parent.parent
FAKE_VERSION = "252.36-1~deb12u1"  # FakeSystemd's default Version
# SetProperties: the kubepods tree, on the running unit's invocation path; SetUnitProperties: by name.
CALL = re.compile(r"(SetProperties|SetUnitProperties) (\S+) runtime=true((?: (?:MemoryMin|MemoryLow|MemoryHigh)=(?:\d+|infinity))+)")


def _find_examples() -> Path | None:
    for d in Path(__file__).resolve().parents:
        if (d / "examples" / "pods.json").is_file():
            return d / "examples"
    return None


EXAMPLES = _find_examples()
RESERVED = ("kube.slice", "system.slice")  # examples/config.yaml enforces both
LEDGER_POD = "kubepods-pod6a4f2e3b_1c9d_4a5e_8f7b_2d3e4f5a6b7c.slice"
LEDGER_SCOPE = "cri-containerd-71b91629faef90a4934e94a4b7ffdb6686df30c86c502252924c9937616e4762.scope"
INDEXER_POD = "kubepods-burstable-pod3f2e1d0c_9b8a_4765_b4c3_d2e1f0a9b8c7.slice"
INDEXER_SCOPE = "cri-containerd-70fa78e5ae55563976b332a6da662e9877dc6ed6965f676453d8f4a35ebdf483.scope"


def parse_call_line(line: str) -> tuple[str, dict]:
    m = CALL.fullmatch(line)
    assert m, f"not a SetProperties / SetUnitProperties line: {line!r}"
    method, unit = m.group(1), m.group(2)
    # Only the reserved slices are written by name; the kubepods tree only while it runs.
    assert method == ("SetUnitProperties" if unit in RESERVED else "SetProperties"), line
    props = {}
    for pair in m.group(3).split():
        name, value = pair.split("=")
        props[name] = INF if value == "infinity" else int(value)
    return unit, props


def no_traceback(p: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout, p.stderr


def one_error_line(p: subprocess.CompletedProcess, code: int) -> str:
    no_traceback(p)
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("memqos-systemd: error: "), lines[0]
    return lines[0]


def free_port() -> int:
    """A 127.0.0.1 port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """The example node (examples/) as files in tmp_path, and the CLI pointed at the fake's bus."""

    def __init__(self, fake, tmp_path: Path):
        if EXAMPLES is None:
            require(False, "examples/ not found above tests/")
        self.fake = fake
        self.tmp = tmp_path
        # Without the stand-in: a socket that is not there (in a directory short enough to name one).
        self.no_bus = socket_path(tmp_path, "no-bus-here")
        self.address = fake.address if fake is not None else f"unix:path={self.no_bus}"
        self.pods_doc = json.loads((EXAMPLES / "pods.json").read_text())
        self.pods_path = tmp_path / "pods.json"
        self.pods_path.write_text(json.dumps(self.pods_doc))
        self.base_config = yaml.safe_load((EXAMPLES / "config.yaml").read_text())
        if read_meminfo() < 4 << 30:
            # A small test machine: keep allocatable positive (the example reserves 1.6Gi).
            self.base_config.update(kubeReserved={"memory": "64Mi"}, systemReserved={"memory": "32Mi"})
        self.config = self.write_config(podsFile=str(self.pods_path))
        self.cgroup = tmp_path / "cgroup"
        self.cgroup.mkdir(exist_ok=True)
        # A cgroup v2 root with the memory controller: apply and check look at it (the machine
        # running the tests need not be a cgroup v2 node).
        (self.cgroup / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
        # The kernel's files here are the test's own (node.kernel): the stand-in does not mirror
        # its slices into them.
        if fake is not None:
            fake.cgroup_root = None

    def write_config(self, name: str = "config.yaml", **changes) -> Path:
        path = self.tmp / name
        path.write_text(yaml.safe_dump({**self.base_config, **changes}))
        return path

    def cli(self, *args, config: Path | None = None, address: str | None = None,
            stdout: int | None = None) -> subprocess.CompletedProcess:
        env = dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS=address or self.address, MEMQOS_CGROUP_FS=str(self.cgroup),
                   MEMQOS_LEDGER=str(self.tmp / "ledger"), MEMQOS_LAST_PODS=str(self.tmp / "last-pods.json"),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(CODE_ROOT), os.environ.get("PYTHONPATH")])))
        env.pop("JOURNAL_STREAM", None)
        env.pop("NOTIFY_SOCKET", None)
        argv = [sys.executable, "-m", "memqos_systemd", *map(str, args)]
        if config is not None or (args and args[0] != "plan"):
            argv += ["--config", str(config or self.config)]
        return subprocess.run(argv, stdout=subprocess.PIPE if stdout is None else stdout, stderr=subprocess.PIPE,
                              text=True, env=env, stdin=subprocess.DEVNULL, timeout=60, cwd=str(self.tmp))

    def plan(self) -> dict[str, dict]:
        """unit -> the properties `plan` says it should hold on this machine (MemTotal, OS page size),
        for examples/ as they are (computed once: it depends on nothing else)."""
        if not _PLAN:
            p = self.cli("plan", "--pods", EXAMPLES / "pods.json", "--output", "json", config=self.config)
            assert p.returncode == 0, p.stderr
            _PLAN.update({u["unit"]: {"level": u["level"], "MemoryMin": u["MemoryMin"], "MemoryLow": u["MemoryLow"],
                                      "MemoryHigh": INF if u["MemoryHigh"] == "infinity" else u["MemoryHigh"]}
                          for u in json.loads(p.stdout)["units"]})
        return dict(_PLAN)

    def start_kubelet_units(self, plan: dict[str, dict]) -> None:
        """Load what the kubelet and containerd would have started: every planned unit but the
        reserved slices (left for SetUnitProperties to create), at systemd's defaults."""
        for unit in plan:
            if unit not in RESERVED:
                self.fake.add_unit(unit)

    def start_applied(self, plan: dict[str, dict]) -> None:
        """A node `apply` has already brought to the plan: every planned unit holds its values."""
        for unit, props in plan.items():
            self.fake.add_unit(unit, transient=unit not in RESERVED, memory=want(props))

    def memory(self, unit: str) -> dict | None:
        u = self.fake.unit(unit)
        return None if u is None else dict(u.memory)

    def sets(self) -> list[tuple[str, dict]]:
        out = []
        for unit, runtime, props in self.fake.writes:
            assert runtime is True, "runtime=false would survive a reboot"
            out.append((unit, props))
        return out

    def kernel(self, cgroup: str, values: dict) -> None:
        d = self.cgroup / cgroup
        d.mkdir(parents=True, exist_ok=True)
        for prop, fname in (("MemoryMin", "memory.min"), ("MemoryLow", "memory.low"), ("MemoryHigh", "memory.high")):
            v = values[prop]
            (d / fname).write_text("max\n" if v == INF else f"{v}\n")


_PLAN: dict[str, dict] = {}


def want(props: dict) -> dict:
    return {k: props[k] for k in DEFAULTS}


@pytest.fixture
def node(fake_systemd, tmp_path) -> Node:
    return Node(fake_systemd, tmp_path)


# ====================================================================== apply --once
def test_apply_once_sends_what_the_services_first_round_sends(node):
    """One round for both (round.py, issue 27): the same systemd state and pods give the same
    writes through `apply --once` and through `run`'s first round. The state has a bit of
    everything: units at systemd's defaults (new Burstable containers: MemoryLow up and MemoryHigh
    down, one write each), a pod slice already at its plan, a pod slice of ours no pod lists any
    more, and a reserved slice the config no longer names but the service wrote (the ledger).
    Before the one round, `apply --once` sent two writes per such container and left the dropped
    reserved slice as it was: that was the defect, the service's round was right."""
    import asyncio

    from harness import Harness

    from memqos_systemd.cgroupfs import Cgroupfs

    plan = node.plan()
    orphan = "kubepods-burstable-pod0e0e0e0e_0e0e_4e0e_8e0e_0e0e0e0e0e0e.slice"
    settled_pod = next(u for u, p in plan.items() if p["level"] == "pod")
    state = {u: (DEFAULTS if u != settled_pod else want(plan[u])) for u in plan if u not in RESERVED}
    state.update({orphan: {**DEFAULTS, "MemoryLow": 64 << 20}, "former.slice": {**DEFAULTS, "MemoryMin": 1 << 30}})

    def set_up() -> None:
        for unit in state:
            if node.fake.unit(unit) is not None:
                node.fake.remove_unit(unit)
        for unit in RESERVED:
            if node.fake.unit(unit) is not None:
                node.fake.remove_unit(unit)
        for unit, memory in state.items():
            node.fake.add_unit(unit, transient=unit != "former.slice", memory=dict(memory))
        (node.tmp / "ledger").write_text("former.slice\nkube.slice\nsystem.slice\n")
        node.fake.clear_calls()

    def sent() -> list:
        return sorted((unit, sorted(props.items())) for unit, _, props in node.fake.writes)

    set_up()
    p = node.cli("apply", "--once")
    no_traceback(p)
    assert p.returncode == 0, p.stderr
    by_apply = sent()
    assert ("former.slice", [("MemoryMin", 0)]) in by_apply
    assert (orphan, [("MemoryLow", 0)]) in by_apply
    assert not any(unit == settled_pod for unit, _ in by_apply)

    set_up()

    async def first_round():
        async with Harness(node.fake, node.tmp / "run", node.pods_doc["items"], yaml.safe_load(node.config.read_text()),
                           capacity=read_meminfo(), ledger_path=node.tmp / "ledger", cgroupfs=Cgroupfs(node.cgroup)):
            pass  # entered once ready: the first round has been applied

    (node.tmp / "run").mkdir()
    asyncio.run(asyncio.wait_for(first_round(), 60))
    assert sent() == by_apply


def test_dry_run_prints_the_calls_and_sends_nothing_then_apply_sends_them_then_a_steady_node_sends_none(node):
    plan = node.plan()
    assert len(plan) == 19  # 2 QoS + node + 2 reserved + 6 pods + 8 containers (see test_cli_plan)
    node.start_kubelet_units(plan)
    node.fake.clear_calls()

    dry = node.cli("apply", "--once", "--dry-run")
    no_traceback(dry)
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    calls = [parse_call_line(line) for line in lines]
    assert lines and len(lines) == len(calls)
    assert dry.stderr.strip().splitlines()[-1] == f"dry run: {len(lines)} call(s) would be made; nothing changed"
    # Nothing was sent, nothing was created, every unit still holds systemd's defaults.
    assert node.fake.writes == []
    assert node.fake.created == []
    assert all(node.memory(u) == DEFAULTS for u in plan if u not in RESERVED)
    assert node.memory("kube.slice") is None
    # Every unit whose plan differs from the defaults is named; nothing else is.
    assert {u for u, _ in calls} == {u for u, p in plan.items() if want(p) != DEFAULTS}

    applied = node.cli("apply", "--once")
    no_traceback(applied)
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout == ""  # the calls are only echoed by --dry-run
    assert applied.stderr.strip().splitlines()[-1] == f"{len(calls)} change(s) applied"
    # Exactly the calls the dry run announced, in the same order.
    sent = node.sets()
    assert sent == calls
    for unit, props in plan.items():
        assert node.memory(unit) == want(props), unit
    assert sorted(node.fake.created) == sorted(RESERVED)  # systemd made the reserved slices
    # Protection grows parents first: the node slice, the QoS slice, the pod, its container.
    lows = [u for u, p in sent if "MemoryLow" in p and p["MemoryLow"] > 0]
    assert lows.index("kubepods.slice") < lows.index("kubepods-burstable.slice") < lows.index(INDEXER_POD) \
        < lows.index(INDEXER_SCOPE)
    mins = [u for u, p in sent if p.get("MemoryMin", 0) > 0]
    assert mins.index("kubepods.slice") < mins.index(LEDGER_POD) < mins.index(LEDGER_SCOPE)

    node.fake.clear_calls()
    again = node.cli("apply", "--once")
    assert again.returncode == 0, again.stderr
    assert again.stderr.strip().splitlines()[-1] == "0 change(s) applied"
    assert node.fake.writes == []


def test_apply_sets_again_what_the_kernel_lost_behind_systemds_back(node):
    """systemd holds the plan; the kernel's files show less (a cgroupfs writer's zeros): apply --once
    sets the same values again through systemd (which then re-writes the files), and nothing else."""
    plan = node.plan()
    node.start_applied(plan)
    for unit in ("kubepods.slice", "kubepods-burstable.slice"):
        node.kernel(cgroup_path(unit), want(plan[unit]))
    node.kernel(cgroup_path("kubepods-burstable.slice"), {**want(plan["kubepods-burstable.slice"]), "MemoryLow": 0})
    node.fake.clear_calls()
    p = node.cli("apply", "--once")
    no_traceback(p)
    assert p.returncode == 0, p.stderr
    assert node.sets() == [("kubepods-burstable.slice", {"MemoryLow": plan["kubepods-burstable.slice"]["MemoryLow"]})]


def test_apply_before_the_kubelet_made_its_slices_creates_none_and_says_so(node):
    """A slice made by SetUnitProperties keeps our values in control drop-ins that win over the
    kubelet's own slice at every daemon-reload (systemd 252): only reserved slices are made."""
    p = node.cli("apply", "--once")
    no_traceback(p)
    assert p.returncode == 0, p.stderr
    warning = [line for line in p.stderr.splitlines() if "left for the kubelet to create" in line]
    assert len(warning) == 1 and "kubepods.slice" in warning[0] and "kubepods-burstable.slice" in warning[0]
    assert sorted(node.fake.created) == sorted(RESERVED)
    assert {u for u, _ in node.sets()} == set(RESERVED)


def test_a_deleted_pod_is_brought_back_to_defaults_children_first(node):
    plan = node.plan()
    node.start_kubelet_units(plan)
    assert node.cli("apply", "--once").returncode == 0
    # The indexer pod is deleted from the API but its units are still there (the kubelet is slow).
    node.pods_doc["items"] = [p for p in node.pods_doc["items"] if p["metadata"]["name"] != "indexer-5f8d9c7b6-qq4rt"]
    node.pods_path.write_text(json.dumps(node.pods_doc))
    node.fake.clear_calls()
    p = node.cli("apply", "--once")
    assert p.returncode == 0, p.stderr
    order = [u for u, _ in node.sets()]
    assert node.memory(INDEXER_POD) == DEFAULTS and node.memory(INDEXER_SCOPE) == DEFAULTS
    assert node.memory("kubepods-burstable.slice")["MemoryLow"] == plan["kubepods-burstable.slice"]["MemoryLow"] - 2**30
    # Shrinking: children before their parents.
    assert order.index(INDEXER_SCOPE) < order.index(INDEXER_POD) < order.index("kubepods-burstable.slice") \
        < order.index("kubepods.slice")


def test_an_empty_pod_list_while_pod_slices_exist_lowers_no_protection(node):
    plan = node.plan()
    node.start_applied(plan)
    node.pods_path.write_text(json.dumps({"kind": "PodList", "apiVersion": "v1", "items": []}))
    node.fake.clear_calls()
    p = node.cli("apply", "--once")
    no_traceback(p)
    assert p.returncode == 0, p.stderr
    assert "lists no pods but pod slices exist; not lowering anything" in p.stderr
    # Every protection stays; what may go is a throttle (MemoryHigh raised to infinity), never lowered.
    for unit, props in node.sets():
        assert set(props) == {"MemoryHigh"} and props["MemoryHigh"] == INF, (unit, props)
    for unit, props in plan.items():
        held = node.memory(unit)
        assert (held["MemoryMin"], held["MemoryLow"]) == (props["MemoryMin"], props["MemoryLow"]), unit
        assert held["MemoryHigh"] >= props["MemoryHigh"], unit


def test_apply_keeps_a_pod_the_service_remembered_while_its_slice_runs(node):
    """`apply --once` takes pods as the service does (intake.PodIntake): a pod the service's last
    snapshot had (/run/memqos-systemd/last-pods.json), that the pod source leaves out while its
    slice still runs, keeps its protection; without that memory it would be reset, as above."""
    from memqos_systemd import last_pods
    from memqos_systemd.pods import parse_pods

    plan = node.plan()
    node.start_applied(plan)
    pods, _ = parse_pods(node.pods_doc)
    assert last_pods.write(node.tmp / "last-pods.json", pods)
    listed = [p for p in node.pods_doc["items"] if not p["metadata"]["name"].startswith("indexer-")]
    assert len(listed) == len(node.pods_doc["items"]) - 1
    node.pods_path.write_text(json.dumps({**node.pods_doc, "items": listed}))
    node.fake.clear_calls()
    p = node.cli("apply", "--once")
    no_traceback(p)
    assert p.returncode == 0, p.stderr
    assert "pod search/indexer-5f8d9c7b6-qq4rt is not listed by the pod source but its slice still exists; keeping its protection" \
        in p.stderr
    assert node.sets() == []  # the plan is what the node holds: nothing lowered, nothing to send
    assert node.memory(INDEXER_POD) == want(plan[INDEXER_POD])
    assert (node.tmp / "last-pods.json").read_bytes() == last_pods.encode(pods)  # read, never written


def _broken_sources(node: Node) -> dict:
    garbage = node.tmp / "garbage.bin"
    garbage.write_bytes(bytes(range(256)) * 4)
    truncated = node.tmp / "truncated.json"
    truncated.write_text(json.dumps(node.pods_doc)[:5000])
    deployment = node.tmp / "deployment.yaml"
    deployment.write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n")
    port = free_port()
    return {
        "missing podsFile": ({"podsFile": str(node.tmp / "gone.json")}, ["gone.json", "No such file"]),
        "binary garbage": ({"podsFile": str(garbage)}, ["garbage.bin", "not UTF-8"]),
        "half-written JSON": ({"podsFile": str(truncated)}, ["truncated.json", "not valid YAML (or JSON)"]),
        "a Deployment": ({"podsFile": str(deployment)}, ["deployment.yaml", "Deployment"]),
        "kubelet on a closed port": ({"kubelet": {"url": f"http://127.0.0.1:{port}/pods", "timeout": "3s"}},
                                     [f"127.0.0.1:{port}", "connection refused"]),
    }


@pytest.mark.parametrize("case", ["missing podsFile", "binary garbage", "half-written JSON", "a Deployment",
                                  "kubelet on a closed port"])
def test_apply_with_a_broken_pod_source_exits_1_and_sends_nothing(node, case):
    plan = node.plan()
    node.start_applied(plan)
    node.fake.clear_calls()
    changes, needles = _broken_sources(node)[case]
    config = node.write_config("broken.yaml", **changes)
    # (--dry-run fails the same way; checked once, for the first case)
    for args in (["apply", "--once"], ["apply", "--once", "--dry-run"])[:2 if case == "missing podsFile" else 1]:
        p = node.cli(*args, config=config)
        line = one_error_line(p, 1)
        assert line.endswith("; nothing changed"), line
        for needle in needles:
            assert needle in line, (needle, line)
        assert p.stdout == ""
    assert node.fake.writes == []
    for unit, props in plan.items():
        assert node.memory(unit) == want(props), unit


ACCESS_DENIED = "org.freedesktop.DBus.Error.AccessDenied"


def test_apply_refused_by_systemd_midway_exits_1_and_the_next_apply_finishes(node):
    plan = node.plan()
    node.start_kubelet_units(plan)
    node.fake.clear_calls()
    node.fake.fail_next("SetUnitProperties", ACCESS_DENIED, "Access denied")
    p = node.cli("apply", "--once")
    line = one_error_line(p, 1)
    # The first call (the node slice, parents first) was refused; nothing after it was sent.
    assert line.startswith("memqos-systemd: error: 0 change(s) applied, stopped at kubepods.slice: "), line
    assert "access denied" in line and "change(s) not sent" in line
    assert len(node.sets()) == 1  # the refused call only
    assert all(node.memory(u) == DEFAULTS for u in plan if u not in RESERVED)

    again = node.cli("apply", "--once")
    assert again.returncode == 0, again.stderr
    for unit, props in plan.items():
        assert node.memory(unit) == want(props), unit


def test_apply_with_bad_config_exits_2_and_sends_nothing(node):
    node.start_kubelet_units(node.plan())
    node.fake.clear_calls()
    config = node.write_config("bad.yaml", podsFile=str(node.pods_path), memoryThrottlingFactor=1.5)
    line = one_error_line(node.cli("apply", "--once", config=config), 2)
    assert "memoryThrottlingFactor: 1.5" in line
    assert node.fake.calls == []


@pytest.mark.parametrize("command", [["reset"], ["status", "--output", "json"]])
def test_systemd_unreachable_exits_1_with_one_line(tmp_path, command):
    node = Node(None, tmp_path)  # DBUS_SYSTEM_BUS_ADDRESS: a socket that does not exist
    p = node.cli(*command)
    line = one_error_line(p, 1)
    assert "cannot reach systemd" in line and "No such file" in line, line
    assert p.stdout == ""


@pytest.mark.parametrize("command", [["apply", "--once", "--dry-run"], ["apply", "--once"]])
def test_apply_off_a_node_says_so_first_and_changes_nothing(tmp_path, command):
    """Before the pod source is asked (here a missing pods file, which would be the first error
    otherwise): no bus socket, and then no cgroup v2 either."""
    node = Node(None, tmp_path)
    config = node.write_config("gone.yaml", podsFile=str(tmp_path / "gone.json"))
    line = one_error_line(node.cli(*command, config=config), 1)
    assert line == (f"memqos-systemd: error: this machine is no systemd/cgroup v2 node: the system bus socket"
                    f" {node.no_bus} is missing: DBUS_SYSTEM_BUS_ADDRESS names it; nothing changed")
    (node.cgroup / "cgroup.controllers").unlink()
    line = one_error_line(node.cli(*command, config=config), 1)
    assert line.startswith("memqos-systemd: error: this machine is no systemd/cgroup v2 node: the system bus socket")
    assert "; boot with systemd.unified_cgroup_hierarchy=1; nothing changed" in line


@pytest.mark.parametrize("command", [["apply", "--once"], ["reset"]])
def test_bus_up_but_systemd_not_on_it_exits_1_with_one_line(dbus_daemon, tmp_path, command):
    node = Node(None, tmp_path)
    line = one_error_line(node.cli(*command, address=dbus_daemon.address), 1)
    assert "systemd" in line, line


# ====================================================================== reset
def test_reset_dry_run_then_reset_brings_our_units_to_defaults_children_first(node):
    plan = node.plan()
    node.start_applied(plan)
    # Not ours: a getty slice with its own values, and a slice that only looks like a pod slice.
    getty = {"MemoryMin": 64 << 20, "MemoryLow": 128 << 20, "MemoryHigh": 1 << 30}
    node.fake.add_unit("system-getty.slice", memory=getty)
    node.fake.add_unit("kubepods-burstable-podnot_a_uid.slice", memory=getty)
    node.fake.clear_calls()

    dry = node.cli("reset", "--dry-run")
    no_traceback(dry)
    assert dry.returncode == 0, dry.stderr
    calls = [parse_call_line(line) for line in dry.stdout.splitlines()]
    assert dry.stderr.strip().splitlines()[-1] == f"dry run: {len(calls)} call(s) would be made; nothing changed"
    assert node.fake.writes == []
    assert {u for u, _ in calls} == {u for u, p in plan.items() if want(p) != DEFAULTS}
    for unit, props in calls:
        assert props == {k: v for k, v in DEFAULTS.items() if plan[unit][k] != v}, unit

    p = node.cli("reset")
    no_traceback(p)
    assert p.returncode == 0, p.stderr
    assert p.stderr.strip() == f"reset: {len(calls)} change(s) applied"
    assert node.sets() == calls
    for unit in plan:
        assert node.memory(unit) == DEFAULTS, unit
    assert node.memory("system-getty.slice") == getty
    assert node.memory("kubepods-burstable-podnot_a_uid.slice") == getty
    # Children before parents: every container, then every pod, then the QoS slices, then the top.
    rank = {"container": 0, "pod": 1, "qos": 2, "node": 3, "reserved": 3}
    ranks = [rank[plan[u]["level"]] for u, _ in calls]
    assert ranks == sorted(ranks)

    node.fake.clear_calls()
    again = node.cli("reset")
    assert again.returncode == 0 and again.stderr.strip() == "reset: 0 change(s) applied"
    assert node.fake.writes == []


def test_reset_also_resets_reserved_slices_the_service_wrote_that_the_config_no_longer_names(node):
    """The ledger (/run/memqos-systemd/reserved-slices, here MEMQOS_LEDGER) names slices the
    service wrote; one the config dropped while the service was stopped is reset too. A slice
    named by neither is not ours and keeps its values."""
    node.start_applied(node.plan())
    node.fake.add_unit("former-reserved.slice", transient=False, memory={"MemoryMin": 256 << 20})
    node.fake.add_unit("operators-own.slice", transient=False, memory={"MemoryMin": 128 << 20})
    (node.tmp / "ledger").write_text("former-reserved.slice\n")
    p = node.cli("reset")
    no_traceback(p)
    assert p.returncode == 0, p.stderr
    assert node.memory("former-reserved.slice") == DEFAULTS
    assert node.memory("operators-own.slice")["MemoryMin"] == 128 << 20
    assert "operators-own.slice" not in {u for u, _ in node.sets()}


@pytest.mark.parametrize("broken, why", [
    ({"hierarchy": "flat"}, "hierarchy: 'flat'"),
    # Used to die with a traceback after reaching systemd; now the names fall back to the defaults.
    ({"kubeReservedCgroup": "/kubepods.slice"}, "kubeReservedCgroup: '/kubepods.slice'"),
    ("not: [valid", "not valid YAML"),
], ids=["wrong value", "reserved slice is kubepods.slice", "not YAML"])
def test_reset_with_a_broken_config_resets_by_the_unit_names_and_the_ledger(node, broken, why):
    """The rollback must not depend on the file it may be rolling back from: with a config it
    cannot use, reset says which and why, and resets every kubepods unit systemd has and the
    reserved slices the ledger names."""
    plan = node.plan()
    node.start_applied(plan)
    (node.tmp / "ledger").write_text("kube.slice\nsystem.slice\n")
    if isinstance(broken, dict):
        config = node.write_config("broken.yaml", **broken)
    else:
        config = node.tmp / "broken.yaml"
        config.write_text(broken)
    p = node.cli("reset", config=config)
    no_traceback(p)
    assert p.returncode == 0, p.stderr
    warning, done = p.stderr.strip().splitlines()
    assert warning.startswith(f"memqos-systemd: warning: config not used: {config}") and why in warning, warning
    assert warning.endswith("resetting by the unit names found (cgroupRoot /) and the ledger of reserved slices")
    assert done.startswith("reset: ") and done.endswith(" change(s) applied")
    for unit in plan:
        assert node.memory(unit) == DEFAULTS, unit


BE_SLICE = "kubepods-besteffort.slice"


def ceiling_above_its_plan(node):
    """An applied node with bestEffortCeiling on whose BestEffort slice uses 10 MiB and a byte more
    than the planned MemoryMax: (the config, the planned MemoryMax, the slice's memory.current)."""
    node.start_applied(node.plan())
    config = node.write_config("ceiling.yaml", podsFile=str(node.pods_path), bestEffortCeiling={"enabled": True})
    doc = json.loads(node.cli("plan", "--pods", node.pods_path, "--output", "json", config=config).stdout)
    planned = next(u["MemoryMax"] for u in doc["units"] if u["unit"] == BE_SLICE)
    usage = node.cgroup / "kubepods.slice" / BE_SLICE / "memory.current"
    usage.parent.mkdir(parents=True, exist_ok=True)
    usage.write_text(f"{planned + (10 << 20) + 1}\n")
    return config, planned, usage


def test_the_ceiling_through_apply_status_and_a_reset_with_a_broken_config(node):
    """bestEffortCeiling (issue 25): apply --once steps MemoryMax no lower than the slice's usage
    (memory.current) and remembers the slice in the ledger before it writes; status shows the
    ceiling beside the usage; reset takes it back by the ledger, with a config it cannot use."""
    config, planned, usage = ceiling_above_its_plan(node)
    p = node.cli("apply", "--once", config=config)
    no_traceback(p)
    assert p.returncode == 0, p.stderr
    assert "uses more than its planned MemoryMax" in p.stderr and "stepped down to its usage only" in p.stderr
    assert node.fake.unit(BE_SLICE).memory_max == planned + (10 << 20) + 4096
    assert (node.tmp / "ceiling-slices").read_text() == f"{BE_SLICE}\n"
    assert [u for u, props in node.sets() if "MemoryMax" in props] == [BE_SLICE]
    usage.write_text("1000\n")
    assert node.cli("apply", "--once", config=config).returncode == 0
    assert node.fake.unit(BE_SLICE).memory_max == planned

    s = node.cli("status", "--output", "json", config=config)
    assert s.returncode == 0, s.stderr
    ceiling = json.loads(s.stdout)["bestEffortCeiling"]
    assert {k: ceiling[k] for k in ("unit", "enabled", "MemoryMax", "systemd", "usageBytes")} == {
        "unit": BE_SLICE, "enabled": True, "MemoryMax": planned, "systemd": planned, "usageBytes": 1000}
    table = node.cli("status", "--output", "table", config=config).stdout
    at = table.splitlines().index(next(x for x in table.splitlines() if x.startswith("BestEffort ceiling")))
    first, second = table.splitlines()[at:at + 2]
    assert first.startswith(f"BestEffort ceiling ({BE_SLICE}): plan ") and first.endswith("usage 1000")
    assert second.startswith("  allocatable - requests ") and "oom_kill -" in second
    assert max(len(first), len(second)) <= 100

    broken = node.tmp / "broken.yaml"
    broken.write_text("not: [valid")
    r = node.cli("reset", config=broken)
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    assert node.fake.unit(BE_SLICE).memory_max == INF
    assert (node.tmp / "ceiling-slices").read_text() == ""


def test_status_calls_a_memorymax_above_the_plan_a_step_only_where_the_usage_holds_it(node):
    """The BestEffort ceiling steps down no lower than the slice's usage: status shows that as no
    drift. A MemoryMax above the plan that is not at the usage (infinity by set-property, the
    kubelet's QOSReserved) is drift."""
    config, planned, usage = ceiling_above_its_plan(node)
    for held, drift in ((planned + (10 << 20) + 4096, False), (INF, True)):
        node.fake.set_memory_max(BE_SLICE, held)
        s = node.cli("status", "--output", "json", config=config)
        no_traceback(s)
        row = next(r for r in json.loads(s.stdout)["units"] if r["unit"] == BE_SLICE)
        assert row["drift"] is drift, row
        assert ("steps down with the slice's usage" in row["why"]) is not drift, row
        table = node.cli("status", "--output", "table", config=config).stdout  # its line is cut at 100 columns
        assert ("(steps down" in table) is not drift, table


def test_reset_and_a_dry_run_take_back_only_a_memorymax_that_is_ours(node):
    """One rule says whose MemoryMax is ours (ceiling_watch.ceiling_units) for the service, apply,
    reset and status: a kubelet whose config caps BestEffort itself (QOSReserved) keeps its value
    through a reset with bestEffortCeiling on; and a dry run reads the ledger as apply does (a
    ceiling turned off is shown taken back), writing neither systemd nor the ledger."""
    node.start_applied(node.plan())
    kubelet_config = node.tmp / "kubelet.yaml"
    kubelet_config.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                              "cgroupDriver: systemd\nfeatureGates: {QOSReserved: true}\nqosReserved: {memory: 100%}\n")
    config = node.write_config("qos.yaml", podsFile=str(node.pods_path), bestEffortCeiling={"enabled": True},
                               kubeletConfigFile=str(kubelet_config))
    node.fake.set_memory_max(BE_SLICE, 5 << 30)  # the kubelet's QOSReserved limit
    r = node.cli("reset", config=config)
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    assert node.fake.unit(BE_SLICE).memory_max == 5 << 30, r.stderr

    ours = node.tmp / "ceiling-slices"
    ours.write_text(f"{BE_SLICE}\n")  # a ceiling the service set, since turned off
    node.fake.set_memory_max(BE_SLICE, 500 << 20)
    node.fake.clear_calls()
    d = node.cli("apply", "--once", "--dry-run", config=node.write_config("off.yaml", podsFile=str(node.pods_path)))
    no_traceback(d)
    assert d.returncode == 0, d.stderr
    assert any(BE_SLICE in line and "MemoryMax" in line for line in d.stdout.splitlines()), d.stdout
    assert node.sets() == [] and node.fake.unit(BE_SLICE).memory_max == 500 << 20
    assert ours.read_text() == f"{BE_SLICE}\n"


@pytest.mark.parametrize("policy", [None, "TieredReservation"], ids=["its defaults", "tiered"])
def test_apply_beside_a_v137_kubelet_writes_what_it_does_not(node, policy):
    """Issue 42: beside a kubelet at its v1.37 defaults (gate on, policy None, no factor) the dry run
    shows the pods' protection: nobody else writes it. Beside TieredReservation it shows none of the
    kubelet's MemoryMin and MemoryLow, and still our MemoryHigh (it has no factor)."""
    plan = node.plan()
    node.start_kubelet_units(plan)
    node.fake.clear_calls()
    kubelet_config = node.tmp / "kubelet.yaml"
    kubelet_config.write_text("kind: KubeletConfiguration\ncgroupDriver: systemd\nfeatureGates: {MemoryQoS: true}\n"
                              + (f"memoryReservationPolicy: {policy}\n" if policy else ""))
    dry = node.cli("apply", "--once", "--dry-run", config=node.write_config("k.yaml", podsFile=str(node.pods_path),
                                                                                 kubeletConfigFile=str(kubelet_config)))
    no_traceback(dry)
    assert dry.returncode == 0, dry.stderr
    calls = [parse_call_line(line) for line in dry.stdout.splitlines()]
    protection = {u for u, props in calls if u not in RESERVED and {"MemoryMin", "MemoryLow"} & set(props)}
    highs = {u for u, props in calls if "MemoryHigh" in props}
    assert not any("MemoryMin" in props for u, props in calls if u in RESERVED)  # its own, with its gate on
    assert highs, dry.stdout
    if policy is None:
        assert "kubepods.slice" in protection and len(protection) > 5, dry.stdout
    else:
        assert protection == set(), dry.stdout
    assert node.fake.writes == []


def test_reset_refused_by_systemd_exits_1_with_one_line(node):
    plan = node.plan()
    node.start_applied(plan)
    node.fake.clear_calls()
    node.fake.fail_next("SetUnitProperties", ACCESS_DENIED, "Access denied")
    line = one_error_line(node.cli("reset"), 1)
    m = re.fullmatch(r"memqos-systemd: error: reset: (\d+) change\(s\) applied, stopped at (\S+\.scope): set .*:"
                     r" access denied \(needs root, or a polkit rule\); (\d+) change\(s\) not sent", line)
    assert m, line
    applied, refused, not_sent = int(m[1]), m[2], int(m[3])
    # Lowering goes children first: the container scopes are the first group, written together.
    # The refused write's siblings were in flight with it and were applied; nothing after their
    # group was sent, so every pod, QoS and node slice keeps its values.
    sent = node.sets()
    assert len(sent) == applied + 1 and all(u.endswith(".scope") for u, _ in sent)
    assert not_sent > 0
    for unit, props in plan.items():
        if unit in {u for u, _ in sent} and unit != refused:
            assert node.memory(unit) == DEFAULTS, unit
        else:
            assert node.memory(unit) == want(props), unit


def test_reset_warns_when_the_service_is_running(node):
    node.start_applied(node.plan())
    node.fake.add_unit("memqos-systemd.service", active_state="active")
    p = node.cli("reset")
    no_traceback(p)
    assert p.returncode == 0
    assert "memqos-systemd.service is running and will re-apply its plan; stop it first" in p.stderr
    assert node.memory("kubepods.slice") == DEFAULTS


# ====================================================================== status
def test_status_json_shows_desired_systemd_kernel_and_flags_drift(node):
    plan = node.plan()
    node.start_kubelet_units(plan)
    # An orphan of ours: a pod slice the pod source no longer lists, still holding values.
    orphan = "kubepods-burstable-pod11111111_2222_4333_8444_555555555555.slice"
    node.fake.add_unit(orphan, memory={"MemoryLow": 1 << 20})
    assert node.cli("apply", "--once").returncode == 0
    assert node.memory(orphan) == DEFAULTS  # apply resets orphans
    # Drift in systemd: someone ran `systemctl set-property kubepods-burstable.slice MemoryLow=1M`.
    node.fake.remove_unit("kubepods-burstable.slice")
    node.fake.add_unit("kubepods-burstable.slice", memory={**want(plan["kubepods-burstable.slice"]), "MemoryLow": 1 << 20})
    # The kernel agrees with systemd for kubepods.slice, and not for the ledger's container scope.
    node.kernel("kubepods.slice", want(plan["kubepods.slice"]))
    ledger_cgroup = f"kubepods.slice/{LEDGER_POD}/{LEDGER_SCOPE}"
    node.kernel(ledger_cgroup, {**want(plan[LEDGER_SCOPE]), "MemoryMin": 0})

    node.fake.clear_calls()
    p = node.cli("status", "--output", "json")
    no_traceback(p)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert set(doc) == {"node", "holding", "podSource", "pods", "units", "drift", "bestEffortCeiling", "foughtOver",
                        "protection", "companion", "burstableHigh"}
    assert doc["bestEffortCeiling"] is None  # off, and nothing of ours held
    assert doc["burstableHigh"] is None and all(p["burstableHigh"] is None for p in doc["pods"])  # off
    assert doc["foughtOver"] == []  # no fight kept in /run (fights.py)
    assert doc["companion"]["on"] is False
    rows = {r["unit"]: r for r in doc["units"]}
    for r in doc["units"]:
        assert set(r) == {"unit", "level", "cgroup", "desired", "systemd", "kernel", "drift", "why", "kubelet", "planned"}
        assert r["kubelet"] == []  # every value ours: the kubelet writes none of them (companion mode: off)
    assert set(plan) <= set(rows)

    top = rows["kubepods.slice"]
    assert top["level"] == "node" and top["cgroup"] == "kubepods.slice"
    assert top["desired"] == top["systemd"] == top["kernel"] == want(plan["kubepods.slice"])
    assert top["drift"] is False

    qos = rows["kubepods-burstable.slice"]
    assert qos["desired"] == want(plan["kubepods-burstable.slice"])
    assert qos["systemd"]["MemoryLow"] == 1 << 20
    assert qos["kernel"] is None  # no cgroup files for it
    assert qos["drift"] is True

    scope = rows[LEDGER_SCOPE]
    assert scope["level"] == "container" and scope["cgroup"] == ledger_cgroup
    assert scope["desired"] == scope["systemd"] == want(plan[LEDGER_SCOPE])
    assert scope["kernel"]["MemoryMin"] == 0  # systemd holds 2Gi; the kernel does not
    assert scope["drift"] is True

    assert rows[orphan]["level"] == "unplanned" and rows[orphan]["desired"] is None
    assert rows[orphan]["systemd"] == DEFAULTS and rows[orphan]["drift"] is False
    # The reserved slices were created by apply and hold their reservation.
    assert rows["kube.slice"]["systemd"] == want(plan["kube.slice"]) and rows["kube.slice"]["drift"] is False
    assert doc["drift"] == sum(r["drift"] for r in doc["units"]) == 2

    assert qos["why"] == "systemd differs from the plan" and scope["why"] == "the kernel differs from systemd"

    table = node.cli("status", "--output", "table")
    assert table.returncode == 0, table.stderr
    drift_lines = [line for line in table.stdout.splitlines() if line.startswith("!")]
    # The container by its name (and its scope's ID, shortened), under its pod.
    assert sorted(line.split()[1] for line in drift_lines) == ["kubepods-burstable.slice", "postgres"]
    assert f"2/{len(rows)} units drift" in table.stdout
    assert node.fake.writes == []  # status only reads


def test_status_for_people_one_line_per_pod_and_the_summary(node):
    """Per pod one line of at most 100 columns (QoS, request, protection, usage, the kernel's low and
    oom_kill counts, PSI full avg10), its containers by name, drift marked on the unit that has it
    (a reserved slice not yet created included), a summary line; `--output json` has the same."""
    plan = node.plan()
    for unit, props in plan.items():  # applied, but kube.slice and system.slice: not created yet
        if unit not in RESERVED:
            node.fake.add_unit(unit, transient=True, memory=want(props))
    ledger = node.cgroup / "kubepods.slice" / LEDGER_POD
    ledger.mkdir(parents=True)
    (ledger / "memory.events").write_text("low 13604\nhigh 0\nmax 0\noom 1\noom_kill 1\noom_group_kill 0\n")
    (ledger / "memory.current").write_text(f"{300 << 20}\n")
    (ledger / "memory.pressure").write_text("some avg10=4.00 avg60=1.00 avg300=0.00 total=9\n"
                                            "full avg10=1.50 avg60=0.50 avg300=0.00 total=5\n")
    p = node.cli("status", "--output", "table")
    no_traceback(p)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert all(len(line) <= 100 for line in lines), max(lines, key=len)
    [ledger_line] = [line for line in lines if "payments/ledger-db-0" in line]
    # NOW/LENT "-": kubepods.slice has no memory.current here, so what the kernel protects is not known.
    assert ledger_line.split() == ["payments/ledger-db-0", "Guaranteed", "2Gi", "2Gi/0", "300Mi", "-", "13604", "1",
                                       "1.50"]
    assert any(line.split()[:2] == ["postgres", "(71b91629faef)"] and "container" in line for line in lines)
    marked = {line.split()[1]: line for line in lines if line.startswith("!")}
    assert set(marked) == {"kube.slice", "system.slice"} and all(
        line.endswith("not created") for line in marked.values())
    summary = [line for line in lines if line.startswith("node: ")]
    assert len(summary) == 1 and "6 pods" in summary[0] and "allocatable" in summary[0]
    assert "not holding" in summary[0] and "2/19 units drift" in summary[0]
    # A name cut to fit is said to be, and --output wide shows every one whole (issue 26).
    assert lines[-1] == "names cut (…) to fit 100 columns: --output wide shows them whole"
    wide = node.cli("status", "--output", "wide")
    assert wide.returncode == 0 and "…" not in wide.stdout, wide.stderr
    doc = json.loads(node.cli("status", "--output", "json").stdout)
    for p in doc["pods"]:
        assert any(line.split()[:2] == [f"{p['namespace']}/{p['pod']}", p["qosClass"]]
                   for line in wide.stdout.splitlines()), p["pod"]

    doc = json.loads(node.cli("status", "--output", "json").stdout)
    pods = {f"{x['namespace']}/{x['pod']}": x for x in doc["pods"]}
    assert len(pods) == 6 and doc["holding"] is None and doc["drift"] == 2
    pg = pods["payments/ledger-db-0"]
    assert pg["events"] == {"low": 13604, "oom_kill": 1} and pg["pressureFullAvg10"] == 1.5
    assert pg["usageBytes"] == 300 << 20 and pg["MemoryMin"] == plan[LEDGER_POD]["MemoryMin"]
    assert [c["name"] for c in pg["containers"]] == ["postgres"] and pg["containers"][0]["unit"] == LEDGER_SCOPE
    assert [c["name"] for c in pods["ml/feature-store-6c7d8e9f0-lm3np"]["containers"]] == ["server", "cache"]
    assert pods["batch/thumbnailer-29154710-7hxzq"]["events"] == {"low": None, "oom_kill": None}  # no cgroup here
    assert doc["node"]["allocatableBytes"] > 0 and doc["node"]["MemoryMin"] == plan["kubepods.slice"]["MemoryMin"]


def test_status_says_the_service_holds(node):
    """A first answer of no pods while pod slices run: the service would hold, and status says so."""
    plan = node.plan()
    node.start_applied(plan)
    empty = node.tmp / "empty.json"
    empty.write_text(json.dumps({"kind": "PodList", "items": []}))
    p = node.cli("status", "--output", "table", config=node.write_config("empty.yaml", podsFile=str(empty)))
    assert p.returncode == 0, p.stderr
    [summary] = [line for line in p.stdout.splitlines() if line.startswith("node: ")]
    assert "holding: suspect empty pod list" in summary


def test_status_with_a_broken_pod_source_still_shows_systemd(node):
    plan = node.plan()
    node.start_applied(plan)
    config = node.write_config("broken.yaml", podsFile=str(node.tmp / "gone.json"))
    p = node.cli("status", "--output", "json", config=config)
    no_traceback(p)
    assert p.returncode == 0
    assert "gone.json" in p.stderr and "showing what systemd and the kernel hold only" in p.stderr
    rows = {r["unit"]: r for r in json.loads(p.stdout)["units"]}
    assert rows["kubepods.slice"]["systemd"] == want(plan["kubepods.slice"])
    assert rows["kubepods.slice"]["desired"] is None


# ====================================================================== check
def findings(p: subprocess.CompletedProcess) -> list[tuple[str, str]]:
    """check's output as (level, text) findings: a finding's first line starts with its level,
    its further lines (wrapped at 100 columns) with six spaces; no line is wider, but for a word
    (a URL, a path) wider on its own."""
    no_traceback(p)
    out: list[tuple[str, str]] = []
    for line in p.stdout.splitlines():
        assert len(line) <= 100 or " " not in line[6:].strip(), line
        if line.startswith(" " * 6) and out:
            out[-1] = (out[-1][0], f"{out[-1][1]} {line.strip()}")
            continue
        level, _, text = line.partition(" ")
        assert level in ("ok", "warn", "error"), line
        out.append((level, text.strip()))
    return out


def errors(p: subprocess.CompletedProcess) -> list[str]:
    return [text for level, text in findings(p) if level == "error"]


NO_POD_SOURCE = "pods: no pod source answers: the service protects no pod until one does"


def test_check_runs_every_check_on_the_fake_node(node):
    kubelet_config = node.tmp / "kubelet.yaml"
    kubelet_config.write_text("kind: KubeletConfiguration\ncgroupDriver: systemd\n")
    config = node.write_config("k.yaml", podsFile=str(node.pods_path), kubeletConfigFile=str(kubelet_config))
    p = node.cli("check", config=config)
    assert p.stderr == ""
    lines = findings(p)
    assert ("ok", f"D-Bus: connected to systemd {FAKE_VERSION}") in lines
    # The node's own findings, from the cgroup root the command was pointed at.
    for f in check_node(systemd=FAKE_VERSION, cgroup_root=node.cgroup):
        assert (f.level, f"{f.what}: {f.detail}") in lines, f
    assert any(level == "ok" and text.startswith("config: policy TieredReservation, hierarchy effective; set: ")
               for level, text in lines)
    assert ("ok", f"kubelet cgroupDriver: systemd ({kubelet_config})") in lines
    # The pods file answers here, but it is under /tmp (pytest's tmp_path): hidden from the service.
    assert errors(p) == [f"pods: file {node.pods_path} answered 6 pods here, but not in the service: the service has"
                         f" its own, empty /tmp (PrivateTmp=yes in memqos-systemd.service): move the file out of /tmp,"
                         f" e.g. to /etc/memqos-systemd/", NO_POD_SOURCE]
    assert p.returncode == 1


def test_check_says_what_an_empty_config_means(node):
    """issue 26: valid, and it means policy None: nothing protected."""
    empty = node.tmp / "empty.yaml"
    empty.write_text("# memoryReservationPolicy: TieredReservation\n")
    lines = findings(node.cli("check", config=empty))
    assert ("ok", "config: policy None, hierarchy effective; all defaults") in lines
    assert ("warn", f"config: {empty} sets no key (it is empty, or comments only): the built-in defaults apply,"
                    f" memoryReservationPolicy None: nothing is protected, only throttled") in lines


def test_check_off_cgroup_v2_goes_on_with_the_remaining_checks(node):
    (node.cgroup / "cgroup.controllers").unlink()
    p = node.cli("check")
    assert p.returncode == 1
    whats = [text.split(":", 1)[0] for _, text in findings(p)]
    # cgroup v2 failed, and every check after it still ran and said something.
    assert whats[whats.index("cgroup v2"):] == ["cgroup v2", "memory controller", "memory_recursiveprot", "kernel",
                                                "systemd", "config", "kubelet cgroupDriver", "kubelet", "kubelet", "pods", "pods"]
    assert any(e.startswith("cgroup v2: ") and "systemd.unified_cgroup_hierarchy=1" in e for e in errors(p))


@pytest.mark.parametrize("command", [["check"], ["apply", "--once", "--dry-run"], ["status", "--output", "json"]])
def test_output_that_cannot_be_written_is_one_line_and_exit_1(node, command):
    """issue 20: `check > /dev/full` raised OSError; now one line on stderr, exit 1, and nothing sent."""
    with open("/dev/full", "w") as full:
        p = node.cli(*command, stdout=full.fileno())
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == 1, p.stderr
    assert p.stderr.splitlines()[-1] == "memqos-systemd: error: cannot write the output: No space left on device"
    assert node.fake.writes == []


def test_check_with_systemd_unreachable_names_the_missing_socket_and_exits_1(tmp_path):
    node = Node(None, tmp_path)
    p = node.cli("check")
    assert p.returncode == 1
    first, second = errors(p)[:2]
    assert first == f"system bus: the system bus socket {node.no_bus} is missing: DBUS_SYSTEM_BUS_ADDRESS names it"
    assert second.startswith("D-Bus: cannot reach systemd: ")


@pytest.mark.parametrize("policy", ["TieredReservation", None], ids=["tiered", "its default"])
@pytest.mark.parametrize("companion", ["auto", "off"])
def test_check_says_who_writes_what_beside_the_kubelet(node, companion, policy):
    """With the kubelet's own Memory QoS on, `check` says in one line who writes what, as the
    kubelet's own configuration makes it (issue 42): beside TieredReservation the kubelet writes the
    pods' protection and the service the rest; beside its v1.37 default (None) the service protects
    the pods. `companion: off` beside TieredReservation is an error: the two fight, and the fix is to
    leave the kubelet its values (issue 36: no longer to turn its feature off)."""
    kubelet_config = node.tmp / "kubelet.yaml"
    kubelet_config.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                              "cgroupDriver: systemd\nfeatureGates: {MemoryQoS: true}\n"
                              + (f"memoryReservationPolicy: {policy}\n" if policy else ""))
    config = node.write_config("gate.yaml", podsFile=str(node.pods_path), kubeletConfigFile=str(kubelet_config),
                               companion=companion)
    p = node.cli("check", config=config)
    said = [(level, text) for level, text in findings(p) if text.startswith("kubelet: ")]
    level, text = said[0]
    how = f"(the kubelet's own Memory QoS is on (featureGates in {kubelet_config}))"
    if companion == "auto" and policy:
        assert level == "ok" and text.startswith(f"kubelet: companion: the kubelet protects the pods {how}: the"
                                                 f" kubelet writes MemoryMin and MemoryLow of kubepods.slice"), text
        assert "memqos-systemd writes the rest: MemoryHigh by its memoryThrottlingFactor 0.9" in text, text
        assert len(said) == 1, said
    elif companion == "auto":
        assert level == "ok" and text.startswith(f"kubelet: companion: the kubelet's Memory QoS protects no pod,"
                                                 f" the service does {how}: the kubelet writes MemoryMin of the"
                                                 f" reserved slices; memqos-systemd writes the rest: the pods'"
                                                 f" MemoryMin and MemoryLow by its memoryReservationPolicy"
                                                 f" TieredReservation"), text
        assert "its start sets kubepods.slice's MemoryMin and MemoryLow and the Burstable slice's MemoryLow to 0" in text
        assert len(said) == 1, said
    else:
        assert level == "ok" and text.startswith("kubelet: every value the service's (companion: off in the config)")
        (level, text), = said[1:]
        assert f"its own Memory QoS is on (featureGates in {kubelet_config})" in text, text
        if policy:
            assert level == "error" and "fight" in text and "companion: auto" in text, text
            assert p.returncode == 1
        else:  # its reserved slices' MemoryMin only: both write the same reservation
            assert level == "warn" and "MemoryMin of the reserved slices" in text, text
    assert "featureGates: {MemoryQoS: false}" not in p.stdout


def test_check_is_an_error_when_nothing_protects_the_pods(node):
    """Issue 42: a kubelet at its v1.37 defaults (None) and this service's policy None: nobody
    writes a pod's protection; check names the two fixes."""
    kubelet_config = node.tmp / "kubelet.yaml"
    kubelet_config.write_text("kind: KubeletConfiguration\ncgroupDriver: systemd\n")
    config = node.write_config("none.yaml", podsFile=str(node.pods_path), kubeletConfigFile=str(kubelet_config),
                               memoryReservationPolicy="None", companion="on")
    p = node.cli("check", config=config)
    said = [text for level, text in findings(p) if level == "error" and text.startswith("kubelet: ")]
    assert said and said[0].startswith("kubelet: nothing protects the pods: the kubelet's memoryReservationPolicy is"
                                       f" None (its default: {kubelet_config} sets none), and this service's is None;"
                                       " fix one: memoryReservationPolicy: TieredReservation in the kubelet's config"), said
    assert "memoryReservationPolicy: TieredReservation in /etc/memqos-systemd/config.yaml" in said[0]
    assert p.returncode == 1


# ---------------------------------------------------------------------- check: the pod source
# The kubelet as on a kubeadm node: https on 127.0.0.1 with the certificate it signed itself for
# this machine's hostname, tokens checked, RBAC decided per token (tests/kubelet_standin.py).
READER = "system:serviceaccount:memqos-system:memqos-systemd"
GOOD_TOKEN, OTHER_TOKEN = "memqos-reader-token-0123456789", "some-other-service-account-token"


@pytest.fixture(scope="module")
def kubelet_pki(tmp_path_factory) -> Path:
    require(shutil.which("openssl"), "openssl is not installed (scripts/install-deps.sh test)")
    return make_pki(tmp_path_factory.mktemp("pki"), node_hostname())


@pytest.fixture
def kubelet(kubelet_pki):
    pods = pod_list(pod("a", "11111111-1111-4111-8111-111111111111"), pod("b", "22222222-2222-4222-8222-222222222222"))
    server = Server(Kubelet(pods, {GOOD_TOKEN: (READER, {"pods"}), OTHER_TOKEN: ("system:serviceaccount:x:y", set())}),
                    server_context(kubelet_pki, "kubelet"))
    yield server
    server.close()


def kubeadm_config(node: Node, server: Server, pki: Path, token: str | None = GOOD_TOKEN, **kubelet) -> Path:
    """The shipped config's kubelet block, with the stand-in's port and the test's files."""
    block = {"url": server.url(), "caFile": str(pki / "kubelet.crt")}
    if token is not None:
        (node.tmp / "kubelet-token").write_text(token)
        (node.tmp / "kubelet-token").chmod(0o600)
        block["tokenFile"] = str(node.tmp / "kubelet-token")
    block.update(kubelet)
    config = {k: v for k, v in node.base_config.items() if k != "podsFile"}
    path = node.tmp / "kubeadm.yaml"
    path.write_text(yaml.safe_dump({**config, "kubelet": block}))
    return path


def test_check_with_the_kubelet_answering_on_10250_exits_0(node, kubelet, kubelet_pki):
    p = node.cli("check", config=kubeadm_config(node, kubelet, kubelet_pki))
    assert p.returncode == 0, p.stdout
    assert ("ok", f"pods: kubelet {kubelet.url()} answered with 2 pods") in findings(p)
    assert errors(p) == []


LOCALHOST = [(2, bytes([127, 0, 0, 0]), 8), (10, bytes(15) + b"\x01", 128)]  # IPAddressAllow=localhost
ANY = [(2, bytes(4), 0), (10, bytes(16), 0)]  # IPAddressDeny=any


@pytest.mark.parametrize("allow", ["localhost", "::1 only", "::1 only, the service stopped"])
def test_check_says_when_the_services_sandbox_keeps_it_from_the_kubelet(node, kubelet, kubelet_pki, allow):
    """issue 26: a kubelet URL the unit's IPAddressAllow= leaves out answered check (outside the
    sandbox), and check said nothing. The running service as systemd holds it (drop-ins included)
    decides, and check then does not ask the kubelet; a stopped one (a DaemonSet's node with the
    package there) is judged by the packaged unit, which allows 127.0.0.1."""
    node.fake.add_unit("memqos-systemd.service", transient=False, ip_deny=ANY,
                       ip_allow=LOCALHOST if allow == "localhost" else LOCALHOST[1:],
                       active_state="inactive" if "stopped" in allow else "active")
    p = node.cli("check", config=kubeadm_config(node, kubelet, kubelet_pki))
    if allow != "::1 only":  # the packaged unit with the packaged URL, or no service running: fine
        assert ("ok", f"pods: kubelet {kubelet.url()} answered with 2 pods") in findings(p) and errors(p) == []
        return
    assert errors(p) == [f"pods: kubelet.url {kubelet.url()!r} is out of the service's reach: the running service's"
                         f" unit lets it reach only ::1/128, not 127.0.0.1: use https://127.0.0.1:10250/pods (the"
                         f" kubelet listens on every address), or allow it in a drop-in: systemctl edit"
                         f" memqos-systemd, [Service] IPAddressAllow=127.0.0.1", NO_POD_SOURCE]
    assert p.returncode == 1


@pytest.mark.parametrize("running", [True, False])
def test_check_names_a_kubelet_url_off_the_loopback_without_connecting_to_it(node, running):
    """issue 33: http://10.1.2.3:10255/pods, which the unit's IPAddressDeny=any /
    IPAddressAllow=localhost blocks. The running service's sandbox: an error, and neither /pods
    nor /metrics is asked (nothing leaves this machine). No service running: the packaged unit's
    settings, a warning (a DaemonSet's pod has none), after which check does ask the kubelet; no
    test may reach 10.1.2.3, so that case is the verdict alone."""
    url = "http://10.1.2.3:10255/pods"
    if running:
        node.fake.add_unit("memqos-systemd.service", transient=False, ip_deny=ANY, ip_allow=LOCALHOST)
        config = node.write_config("far.yaml", kubelet={"url": url, "timeout": "1s"},
                                   **{"podsFile": None})
        p = node.cli("check", config=config)
        assert errors(p) == [f"pods: kubelet.url {url!r} is out of the service's reach: the running service's unit"
                             f" lets it reach only 127.0.0.0/8 ::1/128, not 10.1.2.3: use https://127.0.0.1:10250/pods"
                             f" (the kubelet listens on every address), or allow it in a drop-in: systemctl edit"
                             f" memqos-systemd, [Service] IPAddressAllow=10.1.2.3", NO_POD_SOURCE]
        assert any(level == "warn" and "not asked: the service's sandbox keeps it from kubelet.url" in text
                   for level, text in findings(p)), p.stdout
        assert p.returncode == 1
        return
    from memqos_systemd.sources.kubelet import unreachable_in_service

    level, why = unreachable_in_service(url, None)
    assert level == "warn" and why.startswith(f"kubelet.url {url!r} is out of the service's reach: the packaged unit"
                                              f" (IPAddressDeny=any, IPAddressAllow=localhost;"), why
    assert why.endswith("[Service] IPAddressAllow=10.1.2.3")


CHECK_OUTCOMES = {
    # name: (config changes for kubeadm_config, the first error line's expected content)
    "connection refused": ({"url": "read-only"}, ["connection refused: nothing listens there; if it is the kubelet's"
                                                   " read-only port, it is off", "https://127.0.0.1:10250/pods with"
                                                   " tokenFile and caFile"]),
    "TLS": ({"caFile": "cluster-ca"}, ["TLS certificate not trusted: ", "set kubelet.caFile to the CA of the kubelet's"
                                       " serving certificate: /var/lib/kubelet/pki/kubelet.crt when the kubelet signed"
                                       " its own certificate"]),
    "401": ({"token": "expired-or-wrong-token"}, ["HTTP 401 Unauthorized: the kubelet did not accept the token in",
                                                  "(missing, expired or wrong)"]),
    "403": ({"token": OTHER_TOKEN}, ["HTTP 403 Forbidden (user=system:serviceaccount:x:y, verb=get, resource=nodes,"
                                     " subresource=pods)", "ClusterRole memqos-systemd-pod-reader (get on nodes/pods"]),
    "token file missing": ({"token": None, "tokenFile": "missing"}, ["kubelet-token-missing: cannot read: No such file",
                                                                     "memqos-system/memqos-systemd"]),
}


@pytest.mark.parametrize("outcome", list(CHECK_OUTCOMES))
def test_check_says_why_the_kubelet_did_not_answer_and_exits_1(node, kubelet, kubelet_pki, outcome):
    changes, needles = CHECK_OUTCOMES[outcome]
    changes = dict(changes)
    token = changes.pop("token", GOOD_TOKEN)
    if changes.get("url") == "read-only":
        changes["url"] = f"http://127.0.0.1:{free_port()}/pods"
    if changes.get("caFile") == "cluster-ca":
        changes["caFile"] = str(kubelet_pki / "ca.crt")
    if changes.get("tokenFile") == "missing":
        changes["tokenFile"] = str(node.tmp / "kubelet-token-missing")
    p = node.cli("check", config=kubeadm_config(node, kubelet, kubelet_pki, token=token, **changes))
    assert p.returncode == 1
    problem, verdict = errors(p)  # nothing else is wrong on the fake node
    assert problem.startswith("pods: kubelet ") and verdict == NO_POD_SOURCE
    for needle in needles:
        assert needle in problem, (needle, problem)
    assert GOOD_TOKEN not in p.stdout and OTHER_TOKEN not in p.stdout
    # The kubelet's error is named once (issue 33): the gate's line points at the pods line.
    assert sum(needles[0] in text for _, text in findings(p)) == 1, p.stdout
    if outcome != "403":  # a 403 on /pods may still let /metrics answer
        gate = [text for _, text in findings(p) if text.startswith("kubelet: cannot tell")]
        assert gate and "/metrics did not answer either: see pods" in gate[0], p.stdout


GATE_METRICS = ('kubernetes_build_info{git_version="v1.37.1",major="1",minor="37"} 1\n'
                'kubernetes_feature_enabled{name="MemoryQoS",stage="BETA"} %d\n')


@pytest.mark.parametrize("case", ["on by default (v1.37, nothing in its config)", "off", "metrics forbidden",
                                  "metrics that are not metrics", "metrics without the gate"])
def test_check_asks_the_kubelet_whether_its_own_memory_qos_is_on(node, kubelet, kubelet_pki, case):
    """The running kubelet says it in /metrics (kubernetes_feature_enabled), defaults included;
    without the RBAC rule nodes/metrics get, check says it cannot tell, and what to do."""
    kubelet.respond.metrics = (b"<html>a proxy's page</html>\n" if case == "metrics that are not metrics" else
                               b'kubernetes_feature_enabled{name="SidecarContainers",stage=""} 1\n'
                               if case == "metrics without the gate" else
                               (GATE_METRICS % (0 if case == "off" else 1)).encode())
    if case != "metrics forbidden":
        kubelet.respond.tokens = {GOOD_TOKEN: (READER, {"pods", "metrics"})}
    p = node.cli("check", config=kubeadm_config(node, kubelet, kubelet_pki))
    lines = [(level, text) for level, text in findings(p) if text.startswith("kubelet: ")]
    # On: companion mode, its policy not known (no file, no /configz): taken as its default None,
    # and ours protect; not known: a warning that says how to find out.
    assert p.returncode == 0, p.stdout
    gate = f"(kubelet https://127.0.0.1:{kubelet.port}/metrics (kubernetes_feature_enabled))"
    if case == "off":
        (level, text), = lines
        assert level == "ok" and text.startswith(f"kubelet: every value the service's (the kubelet's own Memory QoS is"
                                                 f" off {gate}): the kubelet writes none; memqos-systemd writes the"
                                                 f" rest"), text
    elif case.startswith("on"):
        (level, text), warn = lines
        assert level == "ok" and text.startswith("kubelet: companion: the kubelet's Memory QoS protects no pod, the"
                                                 f" service does (the kubelet's own Memory QoS is on {gate})"), text
        assert warn[0] == "warn" and "its memoryReservationPolicy is not known" in warn[1], warn
        assert "nodes/configz" in warn[1] and "/configz" in warn[1], warn
    else:
        (_, mode), (level, text) = lines
        assert mode.startswith("kubelet: every value the service's (whether the kubelet's own Memory QoS is on is not"
                               " known"), mode
        assert level == "warn" and "cannot tell whether its own Memory QoS is on" in text
        assert "on by default from v1.37" in text and "None" not in text, text
        metrics = f"kubelet https://127.0.0.1:{kubelet.port}/metrics"  # named by what was asked (issue 26)
        if case == "metrics forbidden":
            assert f"not known: {metrics}: HTTP 403 Forbidden (user={READER}, verb=get, resource=nodes," \
                   f" subresource=metrics): this user may not read the kubelet's metrics: bind it to ClusterRole" \
                   f" memqos-systemd-pod-reader (get on nodes/metrics, deploy/rbac/ or /usr/share/memqos-systemd/rbac/)" \
                   in text, text
            assert "/pods" not in text and "nodes/pods" not in text, text
        elif case == "metrics without the gate":
            assert f"not known: {metrics} lists no MemoryQoS gate, and no config file of its is read" in text, text
        else:
            assert f"not known: {metrics} answered, but not with the kubelet's metrics (no kubernetes_feature_enabled line)" \
                   in text, text


QOS_RESERVED_METRICS = 'kubernetes_feature_enabled{name="QOSReserved",stage="ALPHA"} %d\n'


@pytest.mark.parametrize("case", ["config file: gate and memory", "metrics: gate on, config: memory",
                                  "metrics: gate on, no config file", "metrics: gate off", "ceiling off"])
def test_check_fails_when_the_kubelets_qosreserved_and_the_ceiling_would_both_cap_besteffort(
        node, kubelet, kubelet_pki, case):
    """A kubelet with QOSReserved and qosReserved.memory writes kubepods-besteffort.slice's
    MemoryMax every minute, the BestEffort ceiling's: an error while bestEffortCeiling is on."""
    kubelet_config = node.tmp / "kubelet.yaml"
    gates = "featureGates: {QOSReserved: true}\n" if case.startswith("config") else ""
    kubelet_config.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                              f"cgroupDriver: systemd\n{gates}qosReserved: {{memory: 100%}}\n")
    kubelet.respond.metrics = (QOS_RESERVED_METRICS % (0 if case.endswith("gate off") else 1)).encode()
    kubelet.respond.tokens = {GOOD_TOKEN: (READER, {"pods", "metrics"})}
    config = kubeadm_config(node, kubelet, kubelet_pki)
    doc = yaml.safe_load(config.read_text())
    doc["bestEffortCeiling"] = {"enabled": case != "ceiling off"}
    if "no config file" not in case:
        doc["kubeletConfigFile"] = str(kubelet_config)
    config.write_text(yaml.safe_dump(doc))
    p = node.cli("check", config=config)
    lines = [(level, text) for level, text in findings(p) if "QOSReserved" in text]
    (level, text), = lines
    if case in ("config file: gate and memory", "metrics: gate on, config: memory"):
        assert p.returncode == 1 and level == "error" and "qosReserved.memory 100%" in text, text
        assert "leaves the ceiling to the kubelet" in text and "bestEffortCeiling: {enabled: false}" in text
    elif case == "metrics: gate on, no config file":
        assert p.returncode == 0 and level == "warn" and "set kubeletConfigFile" in text, text
    elif case == "metrics: gate off":
        assert p.returncode == 0 and level == "ok" and "the BestEffort ceiling is the service's alone" in text, text
    else:
        assert p.returncode == 0 and level == "ok" and "bestEffortCeiling is off here: no conflict" in text, text


def test_check_names_the_writers_the_service_has_seen(node, kubelet, kubelet_pki):
    """The running service's memqos_foreign_writes_total (its metrics endpoint, by level and kind of
    writer) is the fight as it happened, and the units fought over now are in /run (fights.py):
    check names the likely writer of each, the kubelet's MemoryQoS gate (on here) or a cgroupfs
    writer."""
    from memqos_systemd import fights
    from memqos_systemd.drift import Fight
    from memqos_systemd.metrics import Metrics

    kubelet.respond.metrics = (GATE_METRICS % 1).encode()
    kubelet.respond.tokens = {GOOD_TOKEN: (READER, {"pods", "metrics"})}
    service = Metrics()
    server = service.serve("127.0.0.1:0")
    try:
        for _ in range(3):
            service.foreign_write("node", "systemd")
        service.foreign_write("qos", "cgroupfs")
        now = time.time()
        fights.write(node.tmp / "fights.json", [
            Fight("kubepods-burstable.slice", "qos", {"cgroupfs"}, 12, now - 100, now - 5, ("MemoryLow",)),
            Fight("kube.slice", "reserved", {"systemd"}, 5, now - 2000, now - 1000, ("MemoryMin",))],  # over
            window=600, wall_offset=0)
        config = kubeadm_config(node, kubelet, kubelet_pki)
        doc = yaml.safe_load(config.read_text())
        config.write_text(yaml.safe_dump({**doc, "metrics": {"listen": f"127.0.0.1:{server.port}"}}))
        p = node.cli("check", config=config)
    finally:
        server.close()
    said = [text for level, text in findings(p) if level == "warn" and text.startswith("writers: ")]
    assert len(said) == 2, said
    assert said[0].startswith("writers: the service has put back values someone else wrote: node level 3 time(s)"
                              " through systemd: the kubelet's MemoryQoS gate (under TieredReservation it rewrites kubepods.slice")
    assert "companion: auto" in said[0]
    assert "; qos level 1 time(s) in its cgroup file: a cgroupfs writer (systemd still holds ours" in said[0]
    assert said[1].startswith("writers: kubepods-burstable.slice is fought over: written behind the service's back"
                              " 12 times (in its cgroup file) by a cgroupfs writer")


def test_status_names_the_units_fought_over(node):
    """The service keeps the units it finds written behind its back again and again in /run
    (fights.py); status shows those whose last write is within the window, in the table and JSON."""
    from memqos_systemd import fights
    from memqos_systemd.drift import Fight

    plan = node.plan()
    node.start_applied(plan)
    now = time.time()
    pod = "kubepods-burstable-pod" + "1" * 8 + "_" + "2" * 4 + "_" + "3" * 4 + "_" + "4" * 4 + "_" + "5" * 12 + ".slice"
    fights.write(node.tmp / "fights.json", [
        Fight("kubepods.slice", "node", {"cgroupfs", "systemd"}, 7, now - 60, now - 1, ("MemoryMin",)),
        Fight(pod, "pod", {"cgroupfs"}, 4, now - 30, now - 2, ("MemoryLow",)),
        Fight("kube.slice", "reserved", {"systemd"}, 5, now - 2000, now - 1000, ("MemoryMin",))], window=600,
        wall_offset=0)
    p = node.cli("status", "--output", "table")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert all(len(line) <= 100 for line in lines), max(lines, key=len)
    start = next(i for i, line in enumerate(lines) if line.startswith("fought over (written behind our back"))
    assert lines[start + 1].startswith(f"  {pod}: 4 writes since ")  # cut to 100 columns, in its cgroup file
    assert lines[start + 2].startswith("  kubepods.slice: 7 writes since ")
    assert lines[start + 2].endswith(", through systemd and in its cgroup file")
    assert lines[start + 3:] == ["names cut (…) to fit 100 columns: --output wide shows them whole"]
    wide = node.cli("status", "--output", "wide").stdout.splitlines()
    assert any(line.startswith(f"  {pod}: 4 writes since ") and line.endswith(", in its cgroup file") for line in wide)
    doc = json.loads(node.cli("status", "--output", "json").stdout)
    assert [(f["unit"], f["writes"]) for f in doc["foughtOver"]] == [(pod, 4), ("kubepods.slice", 7)]


def test_check_fails_on_the_kubelets_cgroupfs_driver(node, kubelet, kubelet_pki):
    kubelet_config = node.tmp / "kubelet.yaml"
    kubelet_config.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                              "cgroupDriver: cgroupfs\n")
    config = kubeadm_config(node, kubelet, kubelet_pki)
    doc = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**doc, "kubeletConfigFile": str(kubelet_config)}))
    p = node.cli("check", config=config)
    assert p.returncode == 1
    assert errors(p) == [f"kubelet cgroupDriver: cgroupfs ({kubelet_config}): memqos-systemd works only with the"
                         f" systemd cgroup driver, whose pod slices and container scopes are systemd units; set"
                         f" cgroupDriver: systemd in the kubelet's config and in the container runtime's"
                         f" (SystemdCgroup = true for containerd)"]


def test_check_fails_on_a_pods_file_the_service_cannot_see_and_not_on_one_it_can(node, tmp_path):
    hidden = node.write_config("hidden.yaml", podsFile=str(node.pods_path))  # under /tmp
    p = node.cli("check", config=hidden)
    assert p.returncode == 1
    assert errors(p)[0].startswith(f"pods: file {node.pods_path} answered 6 pods here, but not in the service: the"
                                   f" service has its own, empty /tmp (PrivateTmp=yes")
    # The same file where the service can read it: outside /tmp, /var/tmp, /home, /root, /dev/shm
    # (/run is read-only to the service, not hidden; the checkout itself may be under /tmp, as a
    # CI clone is).
    with tempfile.TemporaryDirectory(dir="/run", prefix="memqos-check-pods-") as d:
        visible = Path(d) / "pods.json"
        visible.write_text(node.pods_path.read_text())
        p = node.cli("check", config=node.write_config("visible.yaml", podsFile=str(visible)))
    assert ("ok", f"pods: file {visible} answered with 6 pods") in findings(p)
    assert p.returncode == 0, p.stdout


def test_check_and_apply_help_state_the_exit_codes_these_tests_observe():
    out = {}
    for command in ("check", "apply", "reset"):
        p = subprocess.run([sys.executable, "-m", "memqos_systemd", command, "--help"], capture_output=True,
                           text=True, env=dict(os.environ, COLUMNS="200"), cwd=str(CODE_ROOT), timeout=60)
        assert p.returncode == 0, p.stderr
        out[command] = " ".join(p.stdout.split())
    assert "Exit status: 0 when nothing is an error (warnings allowed), 1 when something is (no pod source" \
           " answering is one" in out["check"] and "2 when the config cannot be used" in out["check"]
    assert "Exit status: 0 done, 1 no node, the pod source or systemd failed" in out["apply"]
    assert "2 bad config" in out["apply"]
    assert "systemctl disable --now memqos-systemd && memqos-systemd reset" in out["reset"]


@pytest.mark.parametrize("changes, commands, needle", [
    ({"hierarchy": "flat"}, ["apply", "status", "check", "run"], "hierarchy: 'flat'"),
    # A reserved cgroup that is one of the pod slices: apply must say so before reaching systemd.
    # (reset goes on without such a config: test_reset_with_a_broken_config_...)
    ({"kubeReservedCgroup": "/kubepods.slice"}, ["apply"], "kubeReservedCgroup: '/kubepods.slice'"),
    # issue 26: check and status died with "ValueError: Invalid IPv6 URL", run looped
    ({"kubelet": {"url": "https://[::1/pods"}}, ["apply", "status", "check", "run"], "kubelet.url: 'https://[::1/pods'"),
], ids=["wrong value", "reserved slice is kubepods.slice", "a kubelet URL that cannot be taken apart"])
def test_bad_config_is_exit_2_for_the_daemon_commands(node, changes, commands, needle):
    node.start_applied(node.plan())
    node.fake.clear_calls()
    config = node.write_config("bad.yaml", podsFile=str(node.pods_path), **changes)
    for command in commands:
        line = one_error_line(node.cli(command, config=config), 2)
        assert needle in line and str(config) in line, (command, line)
    assert node.fake.calls == []


def test_reservations_above_the_node_are_exit_2_naming_the_file_in_human_units(node):
    """issue 20: the plan cannot be made; the line names the file that set the reservations and
    shows them in human units. Nothing is written (systemd was read, to diff)."""
    node.start_applied(node.plan())
    node.fake.clear_calls()
    config = node.write_config("big.yaml", podsFile=str(node.pods_path), kubeReserved={"memory": "64Pi"})
    for command in ("apply", "status"):
        line = one_error_line(node.cli(command, config=config), 2)
        assert line.startswith(f"memqos-systemd: error: {config}: allocatable memory is negative: capacity "), line
        assert " - kubeReserved 64Pi - " in line, line
    assert node.fake.writes == []


# ====================================================================== run
def _this_host_cgroup_error():
    return next((f for f in check_node() if f.what == "cgroup v2" and f.level == "error"), None)


def test_run_on_a_host_without_unified_cgroup_v2_exits_1_with_one_log_line(node):
    problem = _this_host_cgroup_error()
    if problem is None:
        require(False, "this test needs a host without the unified cgroup v2 hierarchy; run would start the service")
    p = node.cli("run")
    no_traceback(p)
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == [f"memqos-systemd: error: preflight: cgroup v2: {problem.detail}"]
    assert node.fake.writes == []
