"""Someone else writes the units we manage (issue 15): found, counted, named, put back.

A v1.37 kubelet with its own Memory QoS gate on (the default) rewrites kubepods.slice MemoryMin
and kubepods-burstable.slice MemoryLow every minute, explicit zeros under its default policy
(../shared/notes/kubelet-2026.md). systemd sends no signal for it; the daemon reads the upper
slices' cgroups every second (agenda.KERNEL_WATCH_INTERVAL), re-reads them from systemd when
they differ, and the next round puts its values back. The real thing: e2e 55-foreign-writer.
"""

from __future__ import annotations

import logging

import pytest
from harness import Harness, run, until
from test_daemon import BCTR, BPOD, BURSTABLE, GUARANTEED, NODE_UNITS, RESERVED, behind_our_back, start_pods

pytestmark = pytest.mark.integration


def foreign(h: Harness, unit: str) -> float:
    return h.metrics.registry.get_sample_value("memqos_foreign_writes_total", {"unit": unit}) or 0


def test_the_kubelets_zeros_are_put_back_then_watched_closely_and_named_once(fake_systemd, tmp_path, caplog):
    start_pods(fake_systemd, *NODE_UNITS)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=RESERVED) as h:
            await h.settle()
            planned = {u: h.memory(u) for u in ("kubepods.slice", "kubepods-burstable.slice")}
            assert planned["kubepods.slice"]["MemoryMin"] > 0 and planned["kubepods-burstable.slice"]["MemoryLow"] > 0
            for minute in range(3):
                fake_systemd.clear_calls()
                behind_our_back(fake_systemd, "kubepods.slice", MemoryMin=0)  # what the kubelet writes
                behind_our_back(fake_systemd, "kubepods-burstable.slice", MemoryLow=0)
                # The first within the idle watch interval (5 s), the next within the close one (1 s).
                await until(lambda: all(h.memory(u) == v for u, v in planned.items()), timeout=7 if minute == 0 else 2.5)
                written = {u for u, _ in h.sets()}
                assert written == set(planned), written  # only what was changed is written back
                assert foreign(h, "kubepods.slice") == minute + 1 == foreign(h, "kubepods-burstable.slice")
    with caplog.at_level(logging.WARNING, logger="memqos_systemd"):
        run(body())
    lines = [r.getMessage() for r in caplog.records if "changed without us" in r.getMessage()]
    assert len(lines) == 2, lines  # once an hour per unit: the three minutes log one line each
    node = next(line for line in lines if line.startswith("kubepods.slice:"))
    assert "MemoryMin" in node and "-> 0" in node and "kubelet's own Memory QoS" in node
    assert "featureGates: {MemoryQoS: false}" in node


def test_another_writer_on_a_pod_slice_is_found_by_the_full_resync_and_named_as_such(fake_systemd, tmp_path,
                                                                                     caplog):
    """Pod slices and scopes are not watched every second (220 of them on a full node); the full
    timer resync finds a change there, through the cgroup's values."""
    start_pods(fake_systemd, *NODE_UNITS)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=RESERVED) as h:
            await h.settle()
            want = h.memory(BPOD)
            behind_our_back(fake_systemd, BPOD, MemoryLow=1)
            h.reread()  # every unit, as the full timer resync (or a daemon-reload) does
            await until(lambda: h.memory(BPOD) == want, timeout=3)
            assert foreign(h, BPOD) == 1
    with caplog.at_level(logging.WARNING, logger="memqos_systemd"):
        run(body())
    assert any(r.getMessage().startswith(f"{BPOD}: MemoryLow") and "another writer" in r.getMessage()
               for r in caplog.records)


def test_our_own_writes_are_never_taken_for_someone_elses(fake_systemd, tmp_path):
    """Pods come and go, a reload re-reads everything: the cache follows our writes, so nothing is
    counted as foreign."""
    start_pods(fake_systemd, *NODE_UNITS)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED], config=RESERVED) as h:
            await h.settle()
            h.source.items = [GUARANTEED, BURSTABLE]
            h.fetch_now()
            await until(lambda: h.memory(BPOD)["MemoryLow"] > 0)
            fake_systemd.daemon_reload()
            await h.settle()
            await h.resync_now()
            h.source.items = [GUARANTEED]  # the pod goes: the kubelet stops listing it, then its units
            fake_systemd.remove_unit(BCTR)
            fake_systemd.remove_unit(BPOD)
            h.fetch_now()
            await until(lambda: h.memory("kubepods-burstable.slice")["MemoryLow"] == 0)
            await h.settle()
            samples = [s for m in h.metrics.registry.collect() if m.name == "memqos_foreign_writes" for s in m.samples]
            assert samples == []
    run(body())
