"""In-place resize through the running daemon (issue 16): a resize the kubelet has not allocated
sends nothing and is logged once; one it has allocated moves the container, the pod slice and the
QoS and node sums, parents first when they grow, children first when they shrink.

The pod source answers as a kubelet does (spec, conditions, allocatedResources, resources); the
stand-in systemd records every write. The rules themselves: tests/unit/test_resize.py.
"""

from __future__ import annotations

import copy
import logging

import pytest
from harness import Harness, run, until
from test_daemon import BCTR, BPOD, BURSTABLE, start_pods

pytestmark = pytest.mark.integration

Mi = 2**20
UPPER = ["kubepods.slice", "kubepods-burstable.slice"]


def resized(request: str, limit: str, allocated: str, enacted: tuple[str, str], condition: dict | None) -> dict:
    """BURSTABLE (256Mi/1Gi) as the kubelet lists it during a resize to `request`/`limit`."""
    pod = copy.deepcopy(BURSTABLE)
    pod["spec"]["containers"][0]["resources"] = {"requests": {"memory": request, "cpu": "1"},
                                                 "limits": {"memory": limit, "cpu": "1"}}
    status = pod["status"]["containerStatuses"][0]
    status["allocatedResources"] = {"memory": allocated, "cpu": "1"}
    status["resources"] = {"requests": {"memory": enacted[0], "cpu": "1"}, "limits": {"memory": enacted[1], "cpu": "1"}}
    pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}] + ([condition] if condition else [])
    return pod


INFEASIBLE = {"type": "PodResizePending", "status": "True", "reason": "Infeasible",
              "message": "Node didn't have enough capacity: memory, requested: 68719476736, capacity: 17179869184"}
IN_PROGRESS = {"type": "PodResizeInProgress", "status": "True"}


def test_a_pending_resize_sends_nothing_is_logged_once_and_an_allocated_one_moves_in_order(
        fake_systemd, tmp_path, caplog):
    start_pods(fake_systemd, *UPPER, BPOD, BCTR)

    async def poll(h: Harness, times: int = 1) -> None:
        for _ in range(times):
            before = h.source.fetches
            h.fetch_now()
            await until(lambda: h.source.fetches > before)
            await h.settle()

    async def body():
        async with Harness(fake_systemd, tmp_path, [BURSTABLE]) as h:
            h.watch.scope_parent[BCTR] = BPOD
            await h.settle()
            assert h.memory(BCTR)["MemoryLow"] == 256 * Mi
            before = {u: h.memory(u) for u in (*UPPER, BPOD, BCTR)}

            # Asked for 64Gi: Infeasible. Three polls: nothing written, one log line.
            fake_systemd.clear_calls()
            h.source.items = [resized("64Gi", "96Gi", "256Mi", ("256Mi", "1Gi"), INFEASIBLE)]
            await poll(h, 3)
            assert h.sets() == []
            assert {u: h.memory(u) for u in before} == before

            # Admitted at 512Mi/2Gi, not enacted yet: grows, parents first.
            h.source.items = [resized("512Mi", "2Gi", "512Mi", ("256Mi", "1Gi"), IN_PROGRESS)]
            await poll(h)
            await until(lambda: h.memory(BCTR)["MemoryLow"] == 512 * Mi)
            grown = [(u, p.get("MemoryLow")) for u, p in h.sets()]
            assert grown == [("kubepods.slice", 512 * Mi), ("kubepods-burstable.slice", 512 * Mi),
                             (BPOD, 512 * Mi), (BCTR, 512 * Mi)], grown
            assert h.memory(BCTR)["MemoryHigh"] > before[BCTR]["MemoryHigh"]

            # Back down to 256Mi/1Gi, allocated: shrinks, children first.
            fake_systemd.clear_calls()
            h.source.items = [resized("256Mi", "1Gi", "256Mi", ("512Mi", "2Gi"), IN_PROGRESS)]
            await poll(h)
            await until(lambda: h.memory("kubepods.slice")["MemoryLow"] == 256 * Mi)
            shrunk = [u for u, _ in h.sets()]
            assert shrunk == [BCTR, BPOD, "kubepods-burstable.slice", "kubepods.slice"], shrunk
            assert {u: h.memory(u) for u in before} == before
            assert h.watch.violations == []  # after every single write, no child above its parent

    with caplog.at_level(logging.WARNING, logger="memqos_systemd"):
        run(body())
    lines = [r.getMessage() for r in caplog.records if "resize pending" in r.getMessage()]
    assert lines == ["pod ns/b: resize pending (Infeasible): the kubelet has not allocated the spec's resources;"
                     " planned from what it allocated: memory request 256Mi (the spec asks 64Gi)"]
