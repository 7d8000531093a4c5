"""Our writes keep the runtime's own cgroup settings (issue 21; cgroupfs.py, "Why that file").

The stand-in re-applies a unit's memory files from its own state at every write and at a
daemon-reload, as systemd 252 does: memory.swap.max from MemorySwapMax, memory.oom.group from
OOMPolicy (0 for a runc scope). A runtime that wrote memory.oom.group=1 or memory.swap.max=0 only
to the files (runc 1.1 with a kubelet's settings) loses them unless the daemon carries the swap
value in its own call and puts memory.oom.group back. The real thing: e2e 15-runc.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from harness import Harness, run, until
from test_daemon import BCTR, BPOD, BURSTABLE, GCTR, GPOD, GUARANTEED, start_pods

from memqos_systemd.cgroupfs import Cgroupfs, RuntimeSettings, read_value
from memqos_systemd.systemd import UINT64_MAX

pytestmark = pytest.mark.integration

NODE = ("kubepods.slice", "kubepods-burstable.slice", "kubepods-besteffort.slice")


def start_node(fake) -> None:
    """The node's slices and the two pods, each container scope in its pod slice (with a cgroup)."""
    start_pods(fake, *NODE, GPOD, BPOD)
    fake.add_unit(GCTR, slice=GPOD)
    fake.add_unit(BCTR, slice=BPOD)


def runtime_writes(fake, scope: str, *, oom_group: str = "1", swap_max: str = "0") -> None:
    """What runc 1.1 does after creating the scope: the kubelet's unified settings, files only."""
    d = fake.cgroup_dir(scope)
    (d / "memory.oom.group").write_text(f"{oom_group}\n")
    (d / "memory.swap.max").write_text(f"{swap_max}\n")


def files(fake, scope: str) -> tuple[str, str]:
    d = fake.cgroup_dir(scope)
    return (d / "memory.oom.group").read_text().strip(), (d / "memory.swap.max").read_text().strip()


def test_a_write_to_a_container_keeps_the_runtimes_oom_group_and_swap_max(fake_systemd, tmp_path):
    """The Burstable container's first write (MemoryLow up, MemoryHigh down) carries MemorySwapMax=0
    from the file, so systemd keeps it; memory.oom.group, which no property can carry, is put back
    to 1 right after. The Guaranteed container's runtime left the defaults: nothing carried."""
    start_node(fake_systemd)
    runtime_writes(fake_systemd, BCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE]) as h:
            written = dict(h.sets())
            assert written[BCTR]["MemorySwapMax"] == 0
            assert written[BCTR]["MemoryLow"] == 256 << 20
            assert "MemorySwapMax" not in written[GCTR]
            assert fake_systemd.unit(BCTR).swap_max == 0  # systemd holds it now
            assert files(fake_systemd, BCTR) == ("1", "0")
            assert files(fake_systemd, GCTR) == ("0", "max")
            assert h.metrics.registry.get_sample_value("memqos_oom_group_restores_total", {"result": "ok"}) == 1
    run(body())


def test_after_a_daemon_reload_the_runtimes_oom_group_is_back(fake_systemd, tmp_path):
    """A daemon-reload re-applies every unit: memory.oom.group is 0 again, with or without us (seen
    on 252 with a container we never wrote). The full re-read after it puts back the 1 the runtime
    had set; memory.swap.max stays 0 because systemd holds it since our first write."""
    start_node(fake_systemd)
    runtime_writes(fake_systemd, BCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE]):
            assert files(fake_systemd, BCTR) == ("1", "0")
            fake_systemd.clear_calls()
            fake_systemd.daemon_reload()
            await until(lambda: files(fake_systemd, BCTR)[0] == "1")
            assert files(fake_systemd, BCTR) == ("1", "0")
            assert files(fake_systemd, GCTR) == ("0", "max")  # the runtime never set 1: left alone
            assert fake_systemd.writes == []  # put back in the file, not by a write
    run(body())


def test_a_container_whose_runtime_set_oom_group_0_is_left_alone(fake_systemd, tmp_path):
    """singleProcessOOMKill (the kubelet's opt-out): the runtime set 0, so there is nothing to keep."""
    start_node(fake_systemd)
    runtime_writes(fake_systemd, BCTR, oom_group="0", swap_max="max")

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE]) as h:
            assert "MemorySwapMax" not in dict(h.sets())[BCTR]
            assert files(fake_systemd, BCTR) == ("0", "max")
            assert h.metrics.registry.get_sample_value("memqos_oom_group_restores_total", {"result": "ok"}) is None
    run(body())


def test_a_read_only_cgroup_mount_is_reported_and_the_write_still_lands(fake_systemd, tmp_path, caplog,
                                                                        monkeypatch):
    """Where memory.oom.group cannot be written (a read-only cgroup mount: the adapter's own answer
    to that is tested below), our values still land; the journal says once why the runtime's
    setting was lost, and the metric counts the error."""
    start_node(fake_systemd)
    runtime_writes(fake_systemd, BCTR)
    monkeypatch.setattr(Cgroupfs, "restore_oom_group", lambda self, unit: "Read-only file system (memory.oom.group)")

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE]) as h:
            assert fake_systemd.unit(BCTR).memory["MemoryLow"] == 256 << 20
            assert h.metrics.registry.get_sample_value("memqos_oom_group_restores_total", {"result": "error"}) == 1
            assert files(fake_systemd, BCTR) == ("0", "0")
    with caplog.at_level("WARNING", logger="memqos_systemd"):
        run(body())
    assert [r.getMessage() for r in caplog.records if "memory.oom.group" in r.getMessage()] == [
        f"cannot put memory.oom.group of {BCTR} back to the runtime's 1: Read-only file system (memory.oom.group);"
        " systemd reset it when it re-applied the unit's settings"]


def test_reset_keeps_the_runtimes_settings(fake_systemd, tmp_path):
    """`memqos-systemd reset` writes through the same Applier: the container's MemoryLow goes back
    to 0 and memory.oom.group / memory.swap.max stay what the runtime set."""
    start_node(fake_systemd)
    runtime_writes(fake_systemd, BCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE]):
            pass
    run(body())  # the daemon's values are in place; it has stopped
    env = dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS=fake_systemd.address,
               MEMQOS_CGROUP_FS=str(fake_systemd.cgroup_root), MEMQOS_LEDGER=str(tmp_path / "ledger"))
    config = tmp_path / "config.yaml"
    config.write_text("memoryReservationPolicy: TieredReservation\n")
    fake_systemd.clear_calls()
    p = subprocess.run([sys.executable, "-m", "memqos_systemd", "reset", "--config", str(config)],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    written = {unit: props for unit, _, props in fake_systemd.writes}
    assert written[BCTR]["MemoryLow"] == 0 and written[BCTR]["MemorySwapMax"] == 0
    assert files(fake_systemd, BCTR) == ("1", "0")


# ---- the adapter alone -------------------------------------------------------------------------
def test_read_value_takes_numbers_and_max(tmp_path):
    for text, value in (("0\n", 0), ("1", 1), ("max\n", UINT64_MAX), ("12345\n", 12345), ("", None),
                        ("-1\n", None), ("nan", None), (str(2**64) + "\n", None)):
        (tmp_path / "f").write_text(text)
        assert read_value(tmp_path / "f") == value, text
    assert read_value(tmp_path / "absent") is None


def test_cgroupfs_finds_a_scope_without_a_plan(tmp_path):
    """`reset` has no plan to name a scope's pod slice: the kubepods tree is searched."""
    pod = tmp_path / "kubepods.slice" / "kubepods-burstable.slice" / BPOD
    scope = pod / BCTR
    scope.mkdir(parents=True)
    (scope / "memory.swap.max").write_text("0\n")
    (scope / "memory.oom.group").write_text("1\n")
    fs = Cgroupfs(tmp_path)
    assert fs.dir_of(BCTR) == scope
    assert fs.dir_of(BPOD) == pod
    assert fs.runtime_settings(BCTR) == RuntimeSettings(0, 1)
    assert fs.runtime_settings("cri-containerd-" + "c" * 64 + ".scope") is None
    (scope / "memory.oom.group").write_text("0\n")
    assert fs.restore_oom_group(BCTR) is None and read_value(scope / "memory.oom.group") == 1
    (scope / "memory.oom.group").unlink()
    (scope / "memory.oom.group").mkdir()
    assert "memory.oom.group" in fs.restore_oom_group(BCTR)
