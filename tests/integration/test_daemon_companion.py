"""Companion mode (issues 36, 42): beside a kubelet whose own Memory QoS is on, the daemon writes
none of what the kubelet writes as its own configuration makes it (kubelet_gate.writes: its policy,
its factor, its gate), counts none of its writes as a fight, and writes the rest: beside
TieredReservation its MemoryHigh (no factor) and the BestEffort ceiling; beside a kubelet at its
v1.37 defaults (None, no factor) every pod's protection, put back after the kubelet's start resets
it. The mode follows the kubelet (its /metrics, else its config file, read again at each of its
starts) unless `companion:` forces it, and a change of mode hands the values over without lowering any.

The kubelet here writes as the kubelet of today does, through systemd and then the file (what
libcontainer's systemd manager does); the same on real systemd: tests/e2e/scenarios/56-companion.py."""

from __future__ import annotations

import json

import pytest
import yaml
from harness import Harness, run, until
from test_daemon import (BCTR, BPOD, BURSTABLE, GCTR, GPOD, GUARANTEED, MI, NODE_UNITS, RESERVED, behind_our_back,
                         start_pods)

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
COMPANION = {**RESERVED, "bestEffortCeiling": {"enabled": True}}
# The kubelet's config files: TieredReservation (its gate on: the policy needs it), its v1.37
# defaults (the gate on by default, None, no factor), its gate off.
TIERED_KUBELET = {"kind": "KubeletConfiguration", "featureGates": {"MemoryQoS": True},
                  "memoryReservationPolicy": "TieredReservation"}
DEFAULT_KUBELET = {"kind": "KubeletConfiguration", "featureGates": {"MemoryQoS": True}}
GATE_OFF_KUBELET = {"kind": "KubeletConfiguration", "featureGates": {"MemoryQoS": False}}


def kubelet_file(tmp_path, doc) -> str:
    path = tmp_path / "kubelet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


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
    """Every property the daemon sent that the kubelet writes as its own in the mode in force."""
    return [(u, p) for u, p in h.sets() if set(p) & h.daemon.companion.writes.of(u, LEVEL[u])]


def counted(h: Harness, family: str) -> float:
    r = h.metrics.registry
    return sum(s.value for m in r.collect() if m.name == family for s in m.samples if s.name == f"{family}_total")


def foreign(h: Harness) -> float:
    return counted(h, "memqos_foreign_writes")


def test_beside_tiered_reservation_nothing_it_writes_is_written_nor_fought_over(fake_systemd, tmp_path):
    start_pods(fake_systemd, *UNITS)
    (fake_systemd.cgroup_dir(BE) / "memory.current").write_text(f"{100 * MI}\n")
    config = {**COMPANION, "kubeletConfigFile": kubelet_file(tmp_path, TIERED_KUBELET)}

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=config,
                           state_dir=tmp_path) as h:
            await h.settle()
            assert h.metrics.registry.get_sample_value("memqos_companion_mode") == 1
            assert h.metrics.registry.get_sample_value("memqos_kubelet_protects") == 1
            assert ours_written(h) == []
            # Ours: the ceiling, and MemoryHigh (the kubelet has no throttling factor); never its
            # MemoryMin and MemoryLow, nor the reserved slice's MemoryMin.
            assert {k for _, p in h.sets() for k in p} <= {"MemoryHigh", "MemoryMax"}, h.sets()
            assert BE in {u for u, _ in h.sets()} and fake_systemd.unit(BE).memory_max < 1 << 40
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


async def settled_beside_tiered(h: Harness, fake) -> None:
    """Settled beside a kubelet that protects the pods, its values written."""
    await h.settle()
    assert h.daemon.companion.mode.writes.protects
    kubelet_writes(fake)
    await h.resync_now()


def zero_at_start(fake) -> None:
    """What a v1.37 kubelet's start writes with its gate off or its policy None: kubepods.slice
    MemoryMin and MemoryLow and the Burstable slice's MemoryLow to 0 (its QoS manager's Start)."""
    behind_our_back(fake, "kubepods.slice", MemoryMin=0, MemoryLow=0)
    fake.write_cgroup_file("kubepods.slice", MemoryMin=0, MemoryLow=0)
    behind_our_back(fake, "kubepods-burstable.slice", MemoryLow=0)
    fake.write_cgroup_file("kubepods-burstable.slice", MemoryLow=0)


def test_beside_a_kubelet_at_its_defaults_ours_protect_the_pods_and_come_back_after_its_start(fake_systemd, tmp_path):
    """Issue 42: a v1.37 kubelet at its defaults writes no pod's protection; the service does, and
    puts its own back after the kubelet's start resets them, counted apart from foreign writes."""
    start_pods(fake_systemd, *UNITS)
    config = {**RESERVED, "kubeletConfigFile": kubelet_file(tmp_path, DEFAULT_KUBELET)}

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=config, state_dir=tmp_path) as h:
            await h.settle()
            assert h.daemon.companion.mode.companion  # its gate is on: the reserved slice's MemoryMin is its own
            assert h.metrics.registry.get_sample_value("memqos_kubelet_protects") == 0
            ours = {u: h.memory(u) for u in ("kubepods.slice", "kubepods-burstable.slice", GPOD, BPOD, GCTR, BCTR)}
            assert ours["kubepods.slice"]["MemoryMin"] > 0 and ours[BPOD]["MemoryLow"] > 0
            assert not any("MemoryMin" in p for u, p in h.sets() if u == "kube.slice")
            fake_systemd.emit_job_removed("kubelet.service", "done")
            zero_at_start(fake_systemd)
            await h.resync_now()
            await until(lambda: all(h.memory(u) == v for u, v in ours.items()), timeout=5)
            assert foreign(h) == 0 and not h.daemon.foreign.writes.fights
            assert counted(h, "memqos_kubelet_resets") >= 1
    run(body())


def test_beside_tiered_reservation_its_start_zeros_are_bridged_with_its_own_values(fake_systemd, tmp_path):
    """Issue 41 (measured with the real kubelet of v1.37.2, e2e 59): under TieredReservation too
    its start sets kubepods.slice and the Burstable slice to 0, and it counts the running pods only
    at its next round. Its own values are written there until then (counted as its start's moment,
    never a foreign write); its round's write ends that, and nothing of its is written after."""
    start_pods(fake_systemd, *UNITS)
    config = {**RESERVED, "kubeletConfigFile": kubelet_file(tmp_path, TIERED_KUBELET)}

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=config, state_dir=tmp_path) as h:
            await settled_beside_tiered(h, fake_systemd)
            fake_systemd.clear_calls()
            fake_systemd.emit_job_removed("kubelet.service", "done")
            await until(lambda: h.daemon.companion.bridge, timeout=5)
            zero_at_start(fake_systemd)
            await h.resync_now()
            await until(lambda: h.memory("kubepods.slice")["MemoryMin"] > 0
                        and h.memory("kubepods-burstable.slice")["MemoryLow"] > 0, timeout=5)
            sent = {u for u, _ in h.sets()}
            assert sent <= {"kubepods.slice", "kubepods-burstable.slice", "kubepods-besteffort.slice"}, sent
            assert foreign(h) == 0 and counted(h, "memqos_kubelet_resets") >= 1
            kubelet_writes(fake_systemd, 2)  # its round, which counts the pods: its own from now on
            await h.resync_now()
            await until(lambda: not h.daemon.companion.bridge, timeout=5)
            fake_systemd.clear_calls()
            await h.resync_now()
            await h.settle()
            assert ours_written(h) == [] and foreign(h) == 0 and not h.daemon.foreign.writes.fights
            assert h.memory("kubepods.slice")["MemoryMin"] == 2 * 768 * MI
    run(body())


def test_the_gate_in_the_kubelets_file_is_read_again_at_its_start(fake_systemd, tmp_path):
    """Issue 42, the first handover: the gate learned only from the kubelet's file follows its
    restarts, not only our own start and reload. Gate off in the file, the kubelet restarts and
    resets kubepods.slice: the service owns every value within seconds and puts its own back."""
    start_pods(fake_systemd, *UNITS)
    path = kubelet_file(tmp_path, TIERED_KUBELET)
    config = {**RESERVED, "kubeletConfigFile": path}

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=config, state_dir=tmp_path) as h:
            await settled_beside_tiered(h, fake_systemd)
            kubelet_file(tmp_path, GATE_OFF_KUBELET)
            fake_systemd.clear_calls()
            fake_systemd.emit_job_removed("kubelet.service", "done")
            zero_at_start(fake_systemd)
            await until(lambda: not h.daemon.companion.mode.companion, timeout=5)
            assert str(path) in h.daemon.companion.mode.why
            await h.resync_now()
            await until(lambda: h.memory("kubepods.slice")["MemoryMin"] > 0
                        and h.memory("kubepods-burstable.slice")["MemoryLow"] > 0, timeout=5)
            assert foreign(h) == 0 and not h.daemon.foreign.writes.fights
            assert h.metrics.registry.get_sample_value("memqos_companion_mode") == 0
    run(body())


def test_the_kubelets_write_after_its_start_is_not_fought_while_its_mode_is_decided(fake_systemd, tmp_path):
    """Issue 42, the hand-back race: the kubelet restarts with its gate on (its /metrics only; its
    port answers seconds after its start) and writes its QoS values at once. Its write is held for
    it, never taken back nor counted as a fight; once it answers, the mode is companion."""
    start_pods(fake_systemd, *UNITS)

    async def body():
        h = Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=RESERVED, state_dir=tmp_path)
        source = SlowMetricsSource(h.source, gate_on=False)
        h.daemon.source = source
        async with h:
            await h.settle()
            assert not h.daemon.companion.mode.companion
            source.gate_on, source.answers = True, False  # it restarts; its port does not answer yet
            fake_systemd.emit_job_removed("kubelet.service", "done")
            await until(lambda: h.daemon.agenda.deciding(h.daemon.out.clock()), timeout=5)
            # Asked and not answering: what it is known by is the version it last reported.
            await until(lambda: "the default of kubelet v1.37.1" in h.daemon.companion.facts.gate.how, timeout=5)
            fake_systemd.clear_calls()
            kubelet_writes(fake_systemd, 2)
            await h.resync_now()
            await h.settle()
            assert [(u, p) for u, p in h.sets() if u in ("kubepods.slice", "kubepods-burstable.slice")] == []
            assert h.memory("kubepods.slice")["MemoryMin"] == 2 * 768 * MI
            assert foreign(h) == 0 and not h.daemon.foreign.writes.fights
            source.answers = True
            h.fetch_now()
            await until(lambda: h.daemon.companion.mode.writes.protects, timeout=5)
            await h.resync_now()
            assert h.memory("kubepods.slice")["MemoryMin"] == 2 * 768 * MI and foreign(h) == 0
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


class SlowMetricsSource(MetricsSource):
    """A kubelet whose port does not answer /metrics for a while after its start (`answers`)."""

    def __init__(self, source, gate_on: bool):
        super().__init__(source, gate_on)
        self.answers = True

    def metrics_text(self) -> str:
        if not self.answers:
            from memqos_systemd.sources import SourceError
            raise SourceError("kubelet http://127.0.0.1:10255/metrics: connection refused", "connect")
        return super().metrics_text()

    def configz_text(self) -> str:
        """Its /configz: TieredReservation while its gate is on (the policy needs the gate)."""
        if not self.answers:
            from memqos_systemd.sources import SourceError
            raise SourceError("kubelet http://127.0.0.1:10255/configz: connection refused", "connect")
        policy = "TieredReservation" if self.gate_on else "None"
        return json.dumps({"kubeletconfig": {"memoryReservationPolicy": policy,
                                             "featureGates": {"MemoryQoS": self.gate_on}}})


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
            # Its gate on at its v1.37 defaults: only the reserved slice's MemoryMin is its own (handed
            # back once at our start with its own value: what it enforces).
            assert h.daemon.companion.writes.at("reserved") == ({"MemoryMin"} if gate_on else frozenset())
            assert all(p["MemoryMin"] == 300 * MI for u, p in h.sets() if u == "kube.slice" and "MemoryMin" in p)
            assert (h.memory("kubepods.slice")["MemoryMin"] > 0) and h.memory(BPOD)["MemoryLow"] > 0
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
    """Ours first; then companion beside TieredReservation (a reload): nothing is taken back at the
    node and QoS slices, ours stay there until the kubelet writes its own (every minute); where it
    writes only at creation (pods, containers, reserved slices) its values are written once, so
    nothing of ours stays that it would not write; then ours again: written over what the kubelet
    left, never below the plan."""
    start_pods(fake_systemd, *UNITS)
    tiered = {**RESERVED, "kubeletConfigFile": kubelet_file(tmp_path, TIERED_KUBELET)}

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config={**tiered, "companion": "off"}) as h:
            await h.settle()
            ours = {u: h.memory(u) for u in KUBELET}
            assert ours["kubepods.slice"]["MemoryMin"] > 0
            fake_systemd.clear_calls()
            h.config_path.write_text(yaml.safe_dump({**tiered, "companion": "auto"}))
            h.daemon.request_reload()
            await until(lambda: h.daemon.companion.mode.companion, timeout=5)
            await h.resync_now()
            await h.settle()
            for u in ("kubepods.slice", "kubepods-burstable.slice"):
                assert h.memory(u) == ours[u]  # not taken back
            for u, props in KUBELET.items():  # where it writes once: its values
                if LEVEL[u] in ("pod", "container", "reserved"):
                    assert all(h.memory(u)[k] == v for k, v in props.items()), (u, h.memory(u))
            assert not h.daemon.companion.hand_back
            fake_systemd.clear_calls()
            await h.resync_now()
            assert ours_written(h) == []
            kubelet_writes(fake_systemd, 0)  # a kubelet whose policy asks for no protection: zeros
            await h.resync_now()
            assert ours_written(h) == [] and h.memory("kubepods.slice")["MemoryMin"] == 0
            h.config_path.write_text(yaml.safe_dump({**tiered, "companion": "off"}))
            h.daemon.request_reload()
            await until(lambda: {u: h.memory(u) for u in KUBELET} == ours, timeout=5)
            assert all(p.get(k, 0) >= 0 for _, p in h.sets() for k in p)
    run(body())
