"""/readyz with the daemon: 503 while the first reconcile is not applied, 200 after it; /livez
kept 200 by the daemon's loop.

A DaemonSet's readiness probe asks /readyz, so a rolling update moves to the next node only
once this one is protected again; its liveness probe asks /livez, so a daemon whose loop stopped
is restarted (deploy/kubernetes/daemonset.yaml).
"""

from __future__ import annotations

import asyncio
import os
import urllib.error
import urllib.request

import pytest
from harness import Harness, run, until

pytestmark = pytest.mark.integration

UID = "6a4f2e3b-1c9d-4a5e-8f7b-2d3e4f5a6b7c"
POD = {"metadata": {"name": "g", "namespace": "ns", "uid": UID},
       "spec": {"containers": [{"name": "c", "resources": {"requests": {"memory": "512Mi"},
                                                           "limits": {"memory": "512Mi"}}}]},
       "status": {"phase": "Running", "qosClass": "Guaranteed", "containerStatuses": []}}


def status_of(url: str) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_readyz_turns_200_only_once_the_first_reconcile_is_applied(fake_systemd, tmp_path):
    fake_systemd.add_unit("kubepods.slice")
    fake_systemd.add_unit(f"kubepods-pod{UID.replace('-', '_')}.slice")

    async def body():
        h = Harness(fake_systemd, tmp_path, [POD])
        server = h.metrics.serve("127.0.0.1:0")
        url = f"http://127.0.0.1:{server.port}/readyz"
        try:
            h.source.hold = True  # the first pod fetch waits: nothing can be applied yet
            entered = asyncio.create_task(h.__aenter__())
            await until(h.source.held.is_set)
            assert status_of(url) == 503
            assert fake_systemd.writes == []
            h.source.release()
            await asyncio.wait_for(entered, 10)
            assert h.memory("kubepods.slice")["MemoryMin"] == 512 * 2**20
            assert status_of(url) == 200
            await h.__aexit__(None, None, None)
        finally:
            server.close()
    run(body())


def test_the_daemons_loop_beats_for_livez_even_while_a_fetch_hangs(fake_systemd, tmp_path, monkeypatch):
    """The beat is the loop's own (the agenda's Tick.HEARTBEAT), not a round's: a pod source that
    hangs is the source's fault (a timeout there), not a reason to restart the daemon. Under a
    watchdog of 0.2 s (WatchdogSec=, as systemd tells it) the beat comes every 0.1 s."""
    monkeypatch.setenv("WATCHDOG_USEC", "200000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    fake_systemd.add_unit("kubepods.slice")

    async def body():
        h = Harness(fake_systemd, tmp_path, [POD])
        beats = []
        h.metrics.heartbeat = lambda: beats.append(1)
        h.source.hold = True
        entered = asyncio.create_task(h.__aenter__())
        await until(h.source.held.is_set)
        n = len(beats)
        await until(lambda: len(beats) >= n + 3)
        h.source.release()
        await asyncio.wait_for(entered, 10)
        await h.__aexit__(None, None, None)
    run(body())
