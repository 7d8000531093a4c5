"""The pressure guard (issue 19) in the daemon: counters in the stand-in's cgroup directories, the
BestEffort QoS slice's MemoryHigh out through systemd (the stand-in), nothing else touched.

The kernel's side (what the `low` count does under an allocating neighbour, and whether the guard
keeps a Burstable pod's page cache) is measured in the VM: bench/protection.py."""

from __future__ import annotations

import logging

import pytest
import yaml
from harness import Harness, run, until
from test_daemon import BURSTABLE, GUARANTEED, NODE_UNITS, TIERED, start_pods

from memqos_systemd.quantity import UINT64_MAX

pytestmark = pytest.mark.integration

MI = 2**20
BE = "kubepods-besteffort.slice"
GUARD = {**TIERED, "pressureGuard": {"enabled": True, "interval": "50ms", "releaseAfter": "300ms",
                                     "releaseEvery": "100ms"}}


def counters(fake, *, low: int, besteffort: int) -> None:
    """What the kernel would show: the Burstable QoS slice's memory.events and the BestEffort
    slice's memory.current (the stand-in keeps the other memory files)."""
    (fake.cgroup_dir("kubepods-burstable.slice") / "memory.events").write_text(
        f"low {low}\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    (fake.cgroup_dir(BE) / "memory.current").write_text(f"{besteffort}\n")


async def baseline(h: Harness, low: int) -> None:
    """Until the guard has read the counters once (its first reading is its baseline)."""
    await until(lambda: h.daemon.guard.state.low == low, timeout=3)


def actions(h: Harness, action: str) -> float:
    return h.metrics.registry.get_sample_value("memqos_guard_actions_total", {"action": action}) or 0


def high(h: Harness) -> float:
    return h.metrics.registry.get_sample_value("memqos_guard_besteffort_high_bytes")


def test_low_events_cap_besteffort_then_release_it_step_by_step_and_touch_nothing_else(fake_systemd, tmp_path,
                                                                                     caplog):
    start_pods(fake_systemd, *NODE_UNITS, BE)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=GUARD) as h:
            counters(fake_systemd, low=0, besteffort=300 * MI)
            await h.settle()
            await baseline(h, 0)
            protected = {u: h.memory(u) for u in NODE_UNITS}
            fake_systemd.clear_calls()
            counters(fake_systemd, low=5, besteffort=300 * MI)  # reclaim below MemoryLow
            await until(lambda: h.memory(BE)["MemoryHigh"] == 300 * MI, timeout=3)
            assert actions(h, "lower") == 1 and high(h) == 300 * MI
            counters(fake_systemd, low=9, besteffort=300 * MI)  # it goes on: a step lower
            await until(lambda: h.memory(BE)["MemoryHigh"] == 270 * MI, timeout=3)
            # calm: raised step by step (x1.5 every 100 ms after 300 ms) until it is the planner's again
            await until(lambda: h.memory(BE)["MemoryHigh"] == UINT64_MAX, timeout=10)
            assert actions(h, "raise") >= 5 and actions(h, "clear") == 1 and high(h) == float("inf")
            assert {u for u, _ in h.sets()} == {BE}, h.sets()  # never a Guaranteed or Burstable unit
            assert {u: h.memory(u) for u in NODE_UNITS} == protected
            assert h.watch.lowered() == []
    with caplog.at_level(logging.INFO, logger="memqos_systemd"):
        run(body())
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("pressure guard:")]
    assert lines[0].startswith(f"pressure guard: lower MemoryHigh of {BE} to {300 * MI} (300 MiB): 5 low event(s)")
    assert lines[-1] == (f"pressure guard: clear MemoryHigh of {BE} to infinity (the planner's value): calm for "
                         + lines[-1].split("calm for ")[1])


def test_no_neighbour_no_action(fake_systemd, tmp_path):
    start_pods(fake_systemd, *NODE_UNITS, BE)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=GUARD) as h:
            counters(fake_systemd, low=0, besteffort=0)
            await h.settle()
            await baseline(h, 0)
            fake_systemd.clear_calls()
            counters(fake_systemd, low=7, besteffort=4 * MI)  # below minBestEffort: not what presses
            for _ in range(3):
                await h.resync_now()
            assert h.sets() == [] and sum(actions(h, a) for a in ("lower", "raise", "clear")) == 0
    run(body())


HOLD = {**GUARD, "pressureGuard": {**GUARD["pressureGuard"], "releaseAfter": "1h"}}  # engaged for good


async def engaged(h: Harness, fake) -> dict:
    """The guard engaged at 200 MiB; what the Guaranteed and Burstable units held before."""
    counters(fake, low=0, besteffort=200 * MI)
    await h.settle()
    await baseline(h, 0)
    protected = {u: h.memory(u) for u in NODE_UNITS}
    counters(fake, low=1, besteffort=200 * MI)
    await until(lambda: h.memory(BE)["MemoryHigh"] == 200 * MI, timeout=3)
    return protected


def test_a_stopping_daemon_lifts_its_throttle(fake_systemd, tmp_path):
    """SIGTERM leaves protections in place, not the guard's throttle: nobody would lift it."""
    start_pods(fake_systemd, *NODE_UNITS, BE)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=HOLD) as h:
            protected = await engaged(h, fake_systemd)
        assert h.memory(BE)["MemoryHigh"] == UINT64_MAX and actions(h, "clear") == 1
        assert {u: h.memory(u) for u in NODE_UNITS} == protected
    run(body())


def test_turned_off_by_a_reload_while_engaged_it_clears(fake_systemd, tmp_path):
    start_pods(fake_systemd, *NODE_UNITS, BE)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=HOLD) as h:
            await engaged(h, fake_systemd)
            h.config_path.write_text(yaml.safe_dump(TIERED))
            h.daemon.request_reload()
            await until(lambda: h.memory(BE)["MemoryHigh"] == UINT64_MAX, timeout=8)
            assert actions(h, "clear") == 1
    run(body())
