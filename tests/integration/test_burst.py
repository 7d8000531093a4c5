"""Pods started back to back: what the daemon asks systemd and the pod source, per pod.

Seen in the TCG-emulated VM (tests/e2e/scenarios/30-unitnew.py, burst): one pod gets its values
130-230 ms after its slice appears, but the last of 6 pods started back to back waited 1.7-2.8 s.
There every D-Bus call costs 20-30 ms and a kubelet /pods fetch tens of ms, so the time is the
number of calls and fetches: this test counts them (counts, not timings, so it cannot flake).

The burst is played as on a real node: each pod's slice, then its container scope, are loaded
(UnitNew) before their start job has run, then started (JobRemoved "done"); the kubelet lists the
pod only after that (or, as 30-unitnew does, lists every pod before the burst). The stand-in
answers one call at a time, each taking a few milliseconds, and a fetch takes a few more, so
signals pile up while the daemon works, as they do in the VM.
"""

from __future__ import annotations

import asyncio
import collections
import time

import pytest

from fakesystemd import WRITE_METHODS
from harness import Harness, run, until
from test_daemon import GCTR, GPOD, GUARANTEED, MI, pod, start_pods

pytestmark = pytest.mark.integration

# Upper bounds, per pod of the burst. Before the fix: ~28 calls and ~3.5 fetches a pod.
MAX_CALLS_PER_POD = 10
MAX_FETCHES_PER_POD = 1.5


def burst_pod(i: int) -> tuple[dict, str, str]:
    uid = f"00000000-0000-4000-8000-{i:012x}"
    cid = f"{i:064x}"
    p = pod(uid, f"burst-{i}", f"{8 + i}Mi", "1Gi", cid, "Burstable")
    return p, f"kubepods-burstable-pod{uid.replace('-', '_')}.slice", f"cri-containerd-{cid}.scope"


@pytest.mark.parametrize("gap", [0.002, 0.03])  # between one unit started and the next loaded
@pytest.mark.parametrize("listed", ["after", "before"])
@pytest.mark.parametrize("n", [6, 20])
def test_a_burst_of_pods_costs_a_bounded_number_of_calls_and_fetches_per_pod(fake_systemd, tmp_path, n, listed, gap):
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", GPOD, GCTR)
    burst = [burst_pod(i) for i in range(n)]

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED]) as h:
            fetch = h.source.fetch

            def slow_fetch():
                time.sleep(0.01)  # a kubelet /pods answer, parsed (in the daemon's worker thread)
                return fetch()
            h.source.fetch = slow_fetch
            if listed == "before":
                h.source.items = [GUARANTEED, *(p for p, _, _ in burst)]
                h.fetch_now()
            await h.settle()
            fake_systemd.set_latency(0.01)
            fake_systemd.clear_calls()
            fetches = h.source.fetches
            active_at = {}  # unit -> how many calls systemd had received when the unit started
            for p, slice_, scope in burst:
                for unit in (slice_, scope):
                    fake_systemd.add_unit(unit, active_state="inactive")  # UnitNew: loaded, not started
                    await asyncio.sleep(0.002)  # then its start job runs
                    active_at[unit] = len(fake_systemd.calls)
                    fake_systemd.set_active_state(unit, "active")
                    fake_systemd.emit_job_removed(unit, "done")
                    await asyncio.sleep(gap)
                if listed == "after":
                    h.source.items = [*h.source.items, p]  # the kubelet lists the pod a moment later

            def done():
                return all((h.memory(s) or {}).get("MemoryLow") == (8 + i) * MI
                           and (h.memory(c) or {}).get("MemoryLow") == (8 + i) * MI
                           for i, (_, s, c) in enumerate(burst))
            await until(done, timeout=30)
            total = sum(8 + i for i in range(n)) * MI
            await until(lambda: h.memory("kubepods-burstable.slice")["MemoryLow"] == total, timeout=10)
            await h.settle()  # nothing left unknown: no more fast polls

            calls = fake_systemd.calls
            per_method = collections.Counter(c.method for c in calls)
            fetched = h.source.fetches - fetches
            print(f"\nburst of {n} pods listed {listed} their units start: {len(calls)} D-Bus calls ({len(calls) / n:.1f} a pod) {dict(per_method)};"
                  f" {fetched} fetches ({fetched / n:.2f} a pod)")
            # Safety first: no unit created, none written before it was running.
            assert fake_systemd.created == []
            for unit, index in active_at.items():
                early = [c for c in calls[:index]
                         if c.method in WRITE_METHODS and fake_systemd.write_of(c)[0] == unit]
                assert early == [], f"{unit} written before it was started"
            assert len(calls) <= MAX_CALLS_PER_POD * n, per_method
            assert fetched <= MAX_FETCHES_PER_POD * n
    run(body())
