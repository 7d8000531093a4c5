"""Companion mode (issue 36): beside a kubelet whose own Memory QoS is on, the daemon writes none of
what the kubelet writes (kubelet_gate.KUBELET_OWNS), counts none of its writes as a fight, and still
does what the kubelet does not: the BestEffort ceiling. The mode
follows the kubelet (its /metrics, else its config file) unless `companion:` forces it, and a
change of mode hands the values over without lowering any.

The kubelet here writes as the kubelet of today does, through systemd and then the file (what
libcontainer's systemd manager does); the same on real systemd: tests/e2e/scenarios/56-companion.py."""

from __future__ import annotations

import pytest
import yaml
from harness import Harness, run, until
from test_daemon import (BCTR, BPOD, BURSTABLE, GCTR, GPOD, GUARANTEED, MI, NODE_UNITS, RESERVED, behind_our_back,
                         start_pods)

from memqos_systemd.kubelet_gate import kubelet_owns

pytestmark = pytest.mark.integration

BE = "kubepods-besteffort.slice"
UNITS = [*NODE_UNITS, BE]
LEVEL = {"kubepods.slice": "node", "kubepods-burstable.slice": "qos", BE: "qos", GPOD: "pod", BPOD: "pod",
         GCTR: "container", BCTR: "container", "kube.slice": "reserved"}
# What a v1.37 kubelet with TieredReservation writes (its QoS manager every minute; the pod's and the
# container's at creation): kubepods MemoryMin = Σ G + B requests, MemoryLow = Σ B requests (#140267).
KUBELET = {
    "kubepods.slice": {"MemoryMin": 768 * MI, "MemoryLow": 256 * MI},
    "kubepods-burstable.slice": {"MemoryMin": 0, "MemoryLow": 256 * MI},
    GPOD: {"MemoryMin": 512 * MI}, BPOD: {"MemoryLow": 256 * MI},
    GCTR: {"MemoryMin": 512 * MI}, BCTR: {"MemoryLow": 256 * MI},
    "kube.slice": {"MemoryMin": 300 * MI},  # as it enforces kubeReserved (enforceExistingCgroup)
}
COMPANION = {**RESERVED, "companion": "on", "bestEffortCeiling": {"enabled": True}}


def kubelet_writes(fake, scale: int = 1) -> None:
    """The kubelet's writes, through systemd and then to the files (`scale` varies the values, as a
    pod's resize would, so that each write is a change). (The stand-in keeps no file of its own for
    a scope: the pod's and container's go through systemd alone, which writes their files.)"""
    for unit, props in KUBELET.items():
        values = {k: v * scale for k, v in props.items()}
        behind_our_back(fake, unit, **values)
        if LEVEL[unit] in ("node", "qos", "reserved"):
            fake.write_cgroup_file(unit, **values)


def ours_written(h: Harness) -> list[tuple[str, dict]]:
    """Every property the daemon sent that the kubelet owns in companion mode."""
    return [(u, p) for u, p in h.sets() if set(p) & kubelet_owns(LEVEL[u])]


def foreign(h: Harness) -> float:
    r = h.metrics.registry
    return sum(s.value for m in r.collect() if m.name == "memqos_foreign_writes" for s in m.samples
               if s.name == "memqos_foreign_writes_total")


def test_beside_the_kubelet_nothing_it_writes_is_written_nor_fought_over(fake_systemd, tmp_path):
    start_pods(fake_systemd, *UNITS)
    (fake_systemd.cgroup_dir(BE) / "memory.current").write_text(f"{100 * MI}\n")

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=COMPANION,
                           state_dir=tmp_path) as h:
            await h.settle()
            assert h.metrics.registry.get_sample_value("memqos_companion_mode") == 1
            assert ours_written(h) == []
            written = {u for u, _ in h.sets()}
            assert written == {BE}, written  # the ceiling: ours; the reserved slice's MemoryMin the kubelet's
            assert fake_systemd.unit(BE).memory_max < 1 << 40
            for minute in (1, 2, 3, 2):  # the kubelet's QoS manager, every minute
                fake_systemd.clear_calls()
                kubelet_writes(fake_systemd, minute)
                await h.resync_now()
                await h.settle()
                assert ours_written(h) == [] and h.sets() == []
                assert all(h.memory(u)[k] == v * minute for u, p in KUBELET.items() for k, v in p.items())
            assert foreign(h) == 0
            assert not h.daemon.foreign.writes.fights
    run(body())


class MetricsSource:
    """A pod source that also serves the kubelet's /metrics (KubeletSource.metrics_text)."""

    def __init__(self, source, gate_on: bool):
        self._source, self.gate_on = source, gate_on

    def fetch(self):
        return self._source.fetch()

    def metrics_text(self) -> str:
        return (f'kubernetes_feature_enabled{{name="MemoryQoS",stage="BETA"}} {int(self.gate_on)}\n'
                'kubernetes_build_info{git_version="v1.37.1"} 1\n')


@pytest.mark.parametrize("gate_on", [True, False], ids=["gate on", "gate off"])
def test_auto_follows_the_kubelets_metrics(fake_systemd, tmp_path, gate_on):
    start_pods(fake_systemd, *UNITS)

    async def body():
        h = Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=RESERVED)
        h.daemon.source = MetricsSource(h.source, gate_on)
        async with h:
            await h.settle()
            assert h.daemon.companion.mode.companion is gate_on
            assert "kubelet's /metrics" in h.daemon.companion.mode.why
            assert (ours_written(h) == []) is gate_on
    run(body())


def test_auto_follows_the_kubelets_config_file(fake_systemd, tmp_path):
    start_pods(fake_systemd, *UNITS)
    kubelet = tmp_path / "kubelet.yaml"
    kubelet.write_text(yaml.safe_dump({"kind": "KubeletConfiguration", "featureGates": {"MemoryQoS": True}}))

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=RESERVED) as h:
            await h.settle()
            assert not h.daemon.companion.mode.companion  # not known: every value ours
            fake_systemd.clear_calls()
            h.config_path.write_text(yaml.safe_dump({**RESERVED, "kubeletConfigFile": str(kubelet)}))
            h.daemon.request_reload()  # (the file is read as the service reads it: load_config)
            await until(lambda: h.daemon.companion.mode.companion, timeout=5)
            assert str(kubelet) in h.daemon.companion.mode.why
            await h.resync_now()
            assert h.sets() == []
    run(body())


def test_a_change_of_mode_hands_values_over_without_lowering_any(fake_systemd, tmp_path):
    """Ours first; then companion (a reload): nothing is taken back, ours stay until the kubelet
    writes its own; then ours again: written over what the kubelet left, never below the plan."""
    start_pods(fake_systemd, *UNITS)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config={**RESERVED, "companion": "off"}) as h:
            await h.settle()
            ours = {u: h.memory(u) for u in KUBELET}
            assert ours["kubepods.slice"]["MemoryMin"] > 0
            fake_systemd.clear_calls()
            h.config_path.write_text(yaml.safe_dump({**RESERVED, "companion": "on"}))
            h.daemon.request_reload()
            await until(lambda: h.daemon.companion.mode.companion, timeout=5)
            await h.resync_now()
            assert h.sets() == [] and {u: h.memory(u) for u in KUBELET} == ours
            kubelet_writes(fake_systemd, 0)  # a kubelet whose policy asks for no protection: zeros
            await h.resync_now()
            assert h.sets() == [] and h.memory("kubepods.slice")["MemoryMin"] == 0
            h.config_path.write_text(yaml.safe_dump({**RESERVED, "companion": "off"}))
            h.daemon.request_reload()
            await until(lambda: {u: h.memory(u) for u in KUBELET} == ours, timeout=5)
            assert all(p.get(k, 0) >= 0 for _, p in h.sets() for k in p)
    run(body())
