"""The BestEffort ceiling (issue 25) in the daemon: MemoryMax of kubepods-besteffort.slice planned,
stepped down with the slice's usage (memory.current in the stand-in's cgroup directory), taken
back when it is turned off, left alone when someone else writes it; no other unit's MemoryMax.

The kernel's side (the OOM kill inside BestEffort, PID 1 kept responsive) is proven in the VM:
tests/e2e/scenarios/25-ceiling.py."""

from __future__ import annotations

import asyncio
import logging

import pytest
import yaml
from harness import Harness, run, until
from test_daemon import BURSTABLE, GUARANTEED, NODE_UNITS, TIERED, start_pods

from memqos_systemd import features, ledger
from memqos_systemd.ceiling_watch import CeilingWatch
from memqos_systemd.quantity import UINT64_MAX

pytestmark = pytest.mark.integration

MI = 2**20
BE = "kubepods-besteffort.slice"
CEILING = {**TIERED, "bestEffortCeiling": {"enabled": True}}
CAPACITY = 2 << 30
# allocatable (2Gi - the default evictionHard 100Mi) - requests (512Mi + 256Mi) - the default headroom
PLANNED = (2048 - 100 - 512 - 256 - 256) * MI


def usage(fake, n: int) -> None:
    """What the kernel would show as the BestEffort slice's memory.current."""
    (fake.cgroup_dir(BE) / "memory.current").write_text(f"{n}\n")


def memory_max(fake, unit: str = BE) -> int:
    return fake.unit(unit).memory_max


def max_writes(fake) -> list[tuple[str, int]]:
    return [(unit, props["MemoryMax"]) for unit, _, props in fake.writes if "MemoryMax" in props]


def behind_our_back(fake, unit: str, value: int) -> None:
    """A kubelet with QOSReserved sets the slice's MemoryMax through systemd (and its file)."""
    def change() -> None:
        fake._units[unit].memory_max = value
        fake._sync_cgroup(unit)
    fake._run(change)


def gauge(h: Harness, kind: str) -> float:
    return h.metrics.registry.get_sample_value("memqos_besteffort_ceiling_bytes", {"kind": kind})


def ceiling(h: Harness) -> CeilingWatch:
    """The daemon's ceiling, one feature of its table (features.py)."""
    return features.by_name(h.daemon.features, CeilingWatch.name)


def node(fake, tmp_path, config=CEILING, *, run_dir=None) -> Harness:
    """The daemon on a 2 GiB node with a Guaranteed and a Burstable pod; its ceiling ledger in
    `tmp_path` (another daemon's, when `run_dir` is that one's)."""
    return Harness(fake, run_dir or tmp_path, [GUARANTEED, BURSTABLE], config=config, capacity=CAPACITY,
                   state_dir=tmp_path)


def test_on_it_sets_the_planned_memorymax_on_the_besteffort_slice_alone_and_remembers_it(fake_systemd, tmp_path):
    start_pods(fake_systemd, *NODE_UNITS, BE)
    usage(fake_systemd, 100 * MI)

    async def body():
        async with node(fake_systemd, tmp_path) as h:
            await until(lambda: memory_max(fake_systemd) == PLANNED)
            assert max_writes(fake_systemd) == [(BE, PLANNED)]
            assert {u: memory_max(fake_systemd, u) for u in NODE_UNITS} == dict.fromkeys(NODE_UNITS, UINT64_MAX)
            assert ledger.read(tmp_path / "ceiling-slices") == {BE}
            assert gauge(h, "planned") == PLANNED == gauge(h, "held")
            fake_systemd.clear_calls()
            await h.resync_now()
            assert max_writes(fake_systemd) == []  # settled: nothing written again
    run(body())


def test_above_the_plan_it_steps_to_the_usage_and_follows_it_down(fake_systemd, tmp_path, caplog):
    start_pods(fake_systemd, *NODE_UNITS, BE)
    usage(fake_systemd, 1500 * MI + 100)

    async def body():
        async with node(fake_systemd, tmp_path) as h:
            await until(lambda: memory_max(fake_systemd) == 1500 * MI + 4096)  # the usage, up to a page
            assert ceiling(h).following and gauge(h, "held") == 1500 * MI + 4096
            usage(fake_systemd, 1200 * MI)  # a BestEffort process was OOM-killed at the step
            await until(lambda: memory_max(fake_systemd) == 1200 * MI, timeout=3)  # looked at again within 1 s
            usage(fake_systemd, 100 * MI)
            await until(lambda: memory_max(fake_systemd) == PLANNED, timeout=5)  # (the next look: within 2 s)
            assert not ceiling(h).following
            assert max_writes(fake_systemd) == [(BE, 1500 * MI + 4096), (BE, 1200 * MI), (BE, PLANNED)]
    with caplog.at_level(logging.INFO, logger="memqos_systemd"):
        run(body())
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("BestEffort ceiling:")]
    assert len(lines) == 2 and "stepping MemoryMax down with its usage" in lines[0], lines
    assert lines[1] == f"BestEffort ceiling: {BE} at its planned MemoryMax {PLANNED} (924Mi)"


def test_a_usage_that_stays_above_is_looked_at_less_and_less_often(fake_systemd, tmp_path):
    """Nothing moves: no write, and the look backs off (1 s, 2 s, 4 s, ...: ceiling.FOLLOW_*)."""
    start_pods(fake_systemd, *NODE_UNITS, BE)
    usage(fake_systemd, 1500 * MI)

    async def body():
        async with node(fake_systemd, tmp_path) as h:
            await until(lambda: memory_max(fake_systemd) == 1500 * MI)
            before = h.reconciles()
            await until(lambda: h.reconciles() >= before + 2, timeout=10)  # at +1 s and +3 s (a busy machine: room)
            assert max_writes(fake_systemd) == [(BE, 1500 * MI)]
    run(body())


def test_a_config_that_cannot_be_planned_while_it_follows_the_usage_does_not_spin(fake_systemd, tmp_path, caplog):
    """A round that cannot plan (PlanError) ends the ceiling's looks too: its next look, already
    past, left the agenda's timeout at 0 and the loop logged "cannot plan" ~50 times a second."""
    start_pods(fake_systemd, *NODE_UNITS, BE)
    usage(fake_systemd, 1500 * MI)

    async def body():
        async with node(fake_systemd, tmp_path) as h:
            await until(lambda: ceiling(h).following)
            h.config_path.write_text(yaml.safe_dump({**CEILING, "kubeReserved": {"memory": "3Gi"}}))  # > capacity
            before = h.reconciles()
            h.daemon.request_reload()
            await until(lambda: any("cannot plan" in r.getMessage() for r in caplog.records), timeout=3)
            await asyncio.sleep(2)
            assert h.alive() and h.reconciles() == before  # no round ran
    with caplog.at_level(logging.ERROR, logger="memqos_systemd"):
        run(body())
    assert len([r for r in caplog.records if "cannot plan" in r.getMessage()]) <= 3


def test_a_reload_that_turns_it_off_puts_infinity_back_and_forgets_the_slice(fake_systemd, tmp_path):
    start_pods(fake_systemd, *NODE_UNITS, BE)
    usage(fake_systemd, 100 * MI)

    async def body():
        async with node(fake_systemd, tmp_path) as h:
            await until(lambda: memory_max(fake_systemd) == PLANNED)
            protected = {u: h.memory(u) for u in NODE_UNITS}
            h.config_path.write_text(yaml.safe_dump(TIERED))
            h.daemon.request_reload()
            await until(lambda: memory_max(fake_systemd) == UINT64_MAX, timeout=3)
            await until(lambda: ledger.read(tmp_path / "ceiling-slices") == set())
            assert {u: h.memory(u) for u in NODE_UNITS} == protected
            fake_systemd.clear_calls()
            await h.resync_now()
            assert max_writes(fake_systemd) == [] and gauge(h, "held") == float("inf")
    run(body())


def test_started_with_it_off_it_takes_back_a_memorymax_of_its_own_and_no_one_elses(fake_systemd, tmp_path):
    """Turned off while the service was stopped: the ledger says whose MemoryMax that is."""
    start_pods(fake_systemd, *NODE_UNITS, BE)
    ledger.write(tmp_path / "ceiling-slices", {BE})
    behind_our_back(fake_systemd, BE, 700 * MI)

    async def body():
        async with node(fake_systemd, tmp_path, config=TIERED):
            await until(lambda: memory_max(fake_systemd) == UINT64_MAX, timeout=3)
            await until(lambda: ledger.read(tmp_path / "ceiling-slices") == set())
    run(body())
    # Without the ledger (a kubelet's QOSReserved set it): left alone, and not even read.
    behind_our_back(fake_systemd, BE, 700 * MI)
    fake_systemd.clear_calls()

    (tmp_path / "again").mkdir()

    async def again():
        async with node(fake_systemd, tmp_path, config=TIERED, run_dir=tmp_path / "again") as h:
            await h.resync_now()
            assert memory_max(fake_systemd) == 700 * MI and max_writes(fake_systemd) == []
            assert h.metrics.registry.get_sample_value("memqos_foreign_writes_total", {"level": "qos", "writer": "systemd"}) is None
    run(again())


def test_someone_elses_memorymax_makes_it_stand_down_until_the_config_is_reloaded(fake_systemd, tmp_path, caplog):
    start_pods(fake_systemd, *NODE_UNITS, BE)
    usage(fake_systemd, 100 * MI)

    async def body():
        async with node(fake_systemd, tmp_path) as h:
            await until(lambda: memory_max(fake_systemd) == PLANNED)
            fake_systemd.clear_calls()
            behind_our_back(fake_systemd, BE, 500 * MI)  # the kubelet's QOSReserved, every minute
            h.reread()
            await until(lambda: h.metrics.registry.get_sample_value("memqos_foreign_writes_total", {"level": "qos", "writer": "systemd"}) == 1)
            await h.resync_now()
            behind_our_back(fake_systemd, BE, 400 * MI)  # its next minute
            h.reread()
            await until(lambda: h.metrics.registry.get_sample_value("memqos_foreign_writes_total", {"level": "qos", "writer": "systemd"}) == 2)
            await h.resync_now()
            assert memory_max(fake_systemd) == 400 * MI and max_writes(fake_systemd) == []  # never fought
            h.daemon.request_reload()  # the operator says it is gone
            await until(lambda: memory_max(fake_systemd) == PLANNED, timeout=3)
    with caplog.at_level(logging.WARNING, logger="memqos_systemd"):
        run(body())
    lines = [r.getMessage() for r in caplog.records if "changed without us" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(f"{BE}: MemoryMax {PLANNED} -> {500 * MI} changed without us")
    assert "stands down" in lines[0] and "QOSReserved" in lines[0]


def test_while_holding_the_ceiling_does_not_move(fake_systemd, tmp_path):
    """No pod list yet: suspect data must not lift or add a limit (reconcile.grow_only)."""
    start_pods(fake_systemd, *NODE_UNITS, BE)
    usage(fake_systemd, 100 * MI)

    async def body():
        async with Harness(fake_systemd, tmp_path, RuntimeError("kubelet down"), config=CEILING, capacity=CAPACITY) as h:
            await h.settle()
            assert h.daemon.intake.holding is not None and max_writes(fake_systemd) == []
    run(body())
