"""The Burstable lever (burstableHigh, issue 35 item 2) in the daemon, on the stand-in systemd: a
reload that turns it on writes the MemoryHigh of the Burstable pod slice that no limit caps, over
D-Bus like every other value; a reload that turns it off puts the plan's MemoryHigh (infinity, no
pod-level limit) back; the pod capped by its container's limit and every other unit never move.

The kernel's side (the pod throttled at memory.high, the neighbour's page cache kept) is measured
in the VM by bench/protection.py (docs/BENCHMARKS.md, "Issue 35: the Burstable lever and swap
(VM)"); e2e 25-ceiling (C2) checks the value on real systemd."""

from __future__ import annotations

import pytest
import yaml
from harness import Harness, run, until
from test_daemon import BCTR, BPOD, BURSTABLE, GUARANTEED, NODE_UNITS, TIERED, pod, start_pods

from memqos_systemd.quantity import UINT64_MAX

pytestmark = pytest.mark.integration

MI = 2**20
CAPACITY = 2 << 30
U_UID = "1d2c3b4a-5e6f-4a7b-8c9d-0e1f2a3b4c5d"
UPOD = f"kubepods-burstable-pod{U_UID.replace('-', '_')}.slice"
UCTR = "cri-containerd-" + "c" * 64 + ".scope"
UNLIMITED = pod(U_UID, "u", "128Mi", None, "c" * 64, "Burstable")  # a Burstable pod without a limit
LEVER = {**TIERED, "burstableHigh": {"enabled": True}}
# allocatable (2Gi - the default evictionHard 100Mi) - the others' requests (Guaranteed 512Mi + Burstable 256Mi)
PLANNED = (2048 - 100 - 512 - 256) * MI


def high(fake, unit: str) -> int:
    return fake.unit(unit).memory["MemoryHigh"]


def high_writes(fake) -> list[tuple[str, int]]:
    return [(unit, props["MemoryHigh"]) for unit, _, props in fake.writes if "MemoryHigh" in props]


def test_a_reload_turns_it_on_then_off_and_only_the_unlimited_pods_slice_moves(fake_systemd, tmp_path):
    start_pods(fake_systemd, *NODE_UNITS, UPOD, UCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE, UNLIMITED], config=TIERED,
                           capacity=CAPACITY) as h:
            await until(lambda: h.memory(UPOD)["MemoryLow"] == 128 * MI)
            before = {u: h.memory(u) for u in [*NODE_UNITS, UPOD, UCTR]}
            assert high(fake_systemd, UPOD) == UINT64_MAX
            # on: the unlimited pod's slice gets the lever; the one its 1Gi limit caps does not
            fake_systemd.clear_calls()
            h.config_path.write_text(yaml.safe_dump(LEVER))
            h.daemon.request_reload()
            await until(lambda: high(fake_systemd, UPOD) == PLANNED, timeout=3)
            assert high_writes(fake_systemd) == [(UPOD, PLANNED)]
            assert {u: h.memory(u) for u in [*NODE_UNITS, UCTR]} == {u: before[u] for u in [*NODE_UNITS, UCTR]}
            assert high(fake_systemd, BPOD) == UINT64_MAX and high(fake_systemd, BCTR) < UINT64_MAX
            fake_systemd.clear_calls()
            await h.resync_now()
            assert high_writes(fake_systemd) == []  # settled: nothing written again
            # off: back to the plan's MemoryHigh, infinity
            h.config_path.write_text(yaml.safe_dump(TIERED))
            h.daemon.request_reload()
            await until(lambda: high(fake_systemd, UPOD) == UINT64_MAX, timeout=3)
            assert high_writes(fake_systemd) == [(UPOD, UINT64_MAX)]
            assert {u: h.memory(u) for u in [*NODE_UNITS, UPOD, UCTR]} == before
    run(body())


def test_started_with_it_on_it_follows_the_pods(fake_systemd, tmp_path):
    """A pod that leaves gives its request back to the others: the lever rises with it."""
    start_pods(fake_systemd, *NODE_UNITS, UPOD, UCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE, UNLIMITED], config=LEVER,
                           capacity=CAPACITY) as h:
            await until(lambda: high(fake_systemd, UPOD) == PLANNED)
            h.source.items = [GUARANTEED, UNLIMITED]  # the Burstable pod left, its units with it
            fake_systemd.remove_unit(BCTR)
            fake_systemd.remove_unit(BPOD)
            h.fetch_now()
            await until(lambda: high(fake_systemd, UPOD) == PLANNED + 256 * MI, timeout=3)
    run(body())
