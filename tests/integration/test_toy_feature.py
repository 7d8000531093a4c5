"""Issue 43: a feature is one module and one line of the table across the whole product. The toy
(toy_reserved_high.py: a MemoryHigh on the kube-reserved slice) is added to the table by one line
(RUNNER) and shows up in `plan`, `apply`, `status`, `check`, the daemon's metrics and `reset`, with
no other product file touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness import Harness, run, until
from test_cli import CODE_ROOT, EXAMPLES, Node
from test_daemon import BURSTABLE, GUARANTEED, NODE_UNITS, TIERED, start_pods

from memqos_systemd import features
from toy_reserved_high import FAMILY, KubeReservedHigh

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
# The feature's one line of the table, then the command line as `python -m memqos_systemd` runs it.
RUNNER = ("import sys; from memqos_systemd import features; from toy_reserved_high import KubeReservedHigh;"
          " features.FEATURES = features.FEATURES + (KubeReservedHigh.made,);"
          " from memqos_systemd.cli import main; sys.exit(main())")


def cli(node: Node, *args, config: Path | None = None, runner: str = RUNNER) -> subprocess.CompletedProcess:
    env = dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS=node.address, MEMQOS_CGROUP_FS=str(node.cgroup),
               MEMQOS_LEDGER=str(node.tmp / "ledger"), MEMQOS_LAST_PODS=str(node.tmp / "last-pods.json"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(CODE_ROOT), str(HERE), os.environ.get("PYTHONPATH")])))
    env.pop("JOURNAL_STREAM", None)
    env.pop("NOTIFY_SOCKET", None)
    argv = [sys.executable, "-c", runner, *map(str, args), "--config", str(config or node.config)]
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          stdin=subprocess.DEVNULL, timeout=60, cwd=str(node.tmp))


def test_the_toys_config_key_is_its_own(fake_systemd, tmp_path):
    """Its key is known through its table line alone, and it is opt-in: off, it plans nothing."""
    node = Node(fake_systemd, tmp_path)
    on = node.write_config("toy.yaml", podsFile=str(node.pods_path), toyKubeReservedHigh=True)
    without = cli(node, "plan", "--pods", EXAMPLES / "pods.json", config=on,
                  runner="import sys; from memqos_systemd.cli import main; sys.exit(main())")
    assert without.returncode == 2 and "toyKubeReservedHigh: true is not a known key" in without.stderr
    bad = cli(node, "plan", "--pods", EXAMPLES / "pods.json",
              config=node.write_config("bad.yaml", podsFile=str(node.pods_path), toyKubeReservedHigh="yes please"))
    assert bad.returncode == 2 and "toyKubeReservedHigh: 'yes please' must be true or false" in bad.stderr
    off = cli(node, "plan", "--pods", EXAMPLES / "pods.json", "--output", "json")
    assert next(u for u in json.loads(off.stdout)["units"] if u["unit"] == "kube.slice")["MemoryHigh"] == "infinity"
    assert "toy:" not in cli(node, "check").stdout


def test_the_toy_feature_shows_up_in_every_command(fake_systemd, tmp_path):
    node = Node(fake_systemd, tmp_path)
    units = node.plan()  # the example's units, as main plans them (no toy)
    node.config = node.write_config("toy.yaml", podsFile=str(node.pods_path), toyKubeReservedHigh=True)
    planned = cli(node, "plan", "--pods", EXAMPLES / "pods.json", "--output", "json")
    assert planned.returncode == 0, planned.stderr
    kube = next(u for u in json.loads(planned.stdout)["units"] if u["unit"] == "kube.slice")
    assert kube["MemoryHigh"] == 2 * kube["MemoryMin"] > 0
    table = cli(node, "plan", "--pods", EXAMPLES / "pods.json", "--output", "table")
    assert f"toy: MemoryHigh {kube['MemoryHigh']} on kube.slice" in table.stdout

    node.start_kubelet_units(units)
    applied = cli(node, "apply", "--once")
    assert applied.returncode == 0, applied.stderr
    assert node.memory("kube.slice")["MemoryHigh"] == kube["MemoryHigh"]

    status = cli(node, "status", "--output", "json")
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert doc["toyKubeReservedHigh"] == {"unit": "kube.slice", "MemoryHigh": kube["MemoryHigh"],
                                          "systemd": kube["MemoryHigh"]}
    assert not next(r for r in doc["units"] if r["unit"] == "kube.slice")["drift"]
    lines = cli(node, "status", "--output", "table").stdout
    assert f"toy: kube.slice MemoryHigh plan {kube['MemoryHigh']}, systemd holds {kube['MemoryHigh']}" in lines
    assert "toyKubeReservedHigh" in doc["companion"]["whoWritesWhat"]  # what the service adds, named

    check = cli(node, "check")
    assert "ok    toy: MemoryHigh on kube.slice" in check.stdout

    reset = cli(node, "reset")
    assert reset.returncode == 0, reset.stderr
    assert node.memory("kube.slice")["MemoryHigh"] == 2**64 - 1


def test_the_daemon_sets_the_toys_metric_family(fake_systemd, tmp_path, monkeypatch):
    monkeypatch.setattr(features, "FEATURES", features.FEATURES + (KubeReservedHigh.made,))  # its one line
    start_pods(fake_systemd, *NODE_UNITS)
    config = {**TIERED, "kubeReserved": {"memory": "1Gi"}, "kubeReservedCgroup": "/kube.slice",
              "enforceNodeAllocatable": ["pods", "kube-reserved"], "toyKubeReservedHigh": True}

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=config) as h:
            await until(lambda: h.metrics.registry.get_sample_value(FAMILY) == 2 * 2**30)
            assert fake_systemd.unit("kube.slice").memory["MemoryHigh"] == 2 * 2**30
    run(body())
