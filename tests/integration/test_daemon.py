"""The daemon against a real dbus-daemon and the recording systemd stand-in.

Each test runs `Daemon.run()` in the test's event loop with a pod source the test
controls, and asserts what was sent to "systemd" (the stand-in records every call).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import os

import pytest
import yaml
from fakesystemd import unit_path
from harness import ControlledSource, Harness, run, until

from memqos_systemd.config import ConfigError
from memqos_systemd.daemon import Daemon
from memqos_systemd.intake import Holding
from memqos_systemd.pods import parse_pods
from memqos_systemd.sources import SourceError
from memqos_systemd.systemd import UINT64_MAX

pytestmark = pytest.mark.integration

MI = 2**20
G_UID = "6a4f2e3b-1c9d-4a5e-8f7b-2d3e4f5a6b7c"
B_UID = "8b3c7d2e-4f5a-6b7c-9d1e-3f4a5b6c7d8e"
N_UID = "3f2e1d0c-9b8a-4765-b4c3-d2e1f0a9b8c7"
GPOD = f"kubepods-pod{G_UID.replace('-', '_')}.slice"
BPOD = f"kubepods-burstable-pod{B_UID.replace('-', '_')}.slice"
NPOD = f"kubepods-burstable-pod{N_UID.replace('-', '_')}.slice"
GCTR = "cri-containerd-" + "a" * 64 + ".scope"
BCTR = "cri-containerd-" + "b" * 64 + ".scope"
TIERED = {"memoryReservationPolicy": "TieredReservation"}


def pod(uid: str, name: str, req: str, lim: str | None, cid: str | None, qos: str) -> dict:
    res = {"requests": {"memory": req, "cpu": "1"}}
    if lim:
        res["limits"] = {"memory": lim, "cpu": "1"}
    status = {"phase": "Running", "qosClass": qos, "containerStatuses": []}
    if cid:
        status["containerStatuses"].append({"name": "c", "containerID": f"containerd://{cid}", "state": {"running": {}}})
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"containers": [{"name": "c", "resources": res}]}, "status": status}


GUARANTEED = pod(G_UID, "g", "512Mi", "512Mi", "a" * 64, "Guaranteed")
BURSTABLE = pod(B_UID, "b", "256Mi", "1Gi", "b" * 64, "Burstable")
NEWCOMER = pod(N_UID, "n", "128Mi", None, None, "Burstable")


def start_pods(fake, *units):
    for u in units:
        fake.add_unit(u)


def test_first_reconcile_applies_parents_first_then_reports_ready(fake_systemd, tmp_path):
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", GPOD, BPOD, GCTR, BCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE]) as h:
            sets = h.sets()
            order = [u for u, _ in sets]
            assert order.index("kubepods.slice") < order.index("kubepods-burstable.slice") < order.index(BPOD)
            assert order.index(BPOD) < order.index(BCTR) and order.index(GPOD) < order.index(GCTR)
            assert h.memory("kubepods.slice") == {"MemoryMin": 512 * MI, "MemoryLow": 256 * MI, "MemoryHigh": UINT64_MAX}
            assert h.memory(BPOD)["MemoryLow"] == 256 * MI
            assert h.memory(GCTR)["MemoryMin"] == 512 * MI
            # Burstable container: 256Mi + 0.9 * (1Gi - 256Mi), whole pages.
            assert h.memory(BCTR)["MemoryHigh"] == (256 * MI + 9 * (768 * MI) // 10) // 4096 * 4096
            messages = h.notify.drain()
            assert any(m.startswith("READY=1") for m in messages)
            assert "kubepods-besteffort.slice" not in order  # nothing to hold: not created
    run(body())


def test_steady_node_costs_no_dbus_call(fake_systemd, tmp_path):
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", GPOD, BPOD, GCTR, BCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE]) as h:
            fake_systemd.clear_calls()
            for _ in range(3):
                await h.settle()
            assert fake_systemd.calls == []
    run(body())


def test_new_pod_slice_gets_its_properties_on_unit_new(fake_systemd, tmp_path):
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", GPOD, GCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED]) as h:
            h.source.items = [GUARANTEED, NEWCOMER]
            fake_systemd.add_unit(NPOD)  # the kubelet starts the pod: UnitNew
            await until(lambda: (h.memory(NPOD) or {}).get("MemoryLow") == 128 * MI)
            assert h.memory("kubepods-burstable.slice")["MemoryLow"] == 128 * MI
            assert h.memory("kubepods.slice")["MemoryLow"] == 128 * MI
    run(body())


def test_dropped_unit_signals_make_the_daemon_re_read_every_unit_and_the_pods(fake_systemd, tmp_path, monkeypatch):
    """Systemd's signal queue is bounded; what the dropped signals said is found by a full re-read
    (the new pod below is written though its UnitNew was dropped), and the metric counts it."""
    import time

    import memqos_systemd.systemd_signals as signals_module

    monkeypatch.setattr(signals_module, "MAX_QUEUED_SIGNALS", 2)
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", GPOD, GCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED]) as h:
            h.source.items = [GUARANTEED, NEWCOMER]
            fetches = h.source.fetches
            for i in range(6):  # UnitNew of units that are not ours fill the queue first
                fake_systemd.add_unit(f"unrelated{i}.service")
            fake_systemd.add_unit(NPOD)  # its UnitNew is dropped
            time.sleep(0.3)  # hold the daemon's loop: all the signals arrive at once
            await until(lambda: (h.memory(NPOD) or {}).get("MemoryLow") == 128 * MI)
            assert h.metrics.registry.get_sample_value("memqos_signal_overflows_total") == 1
            assert h.source.fetches > fetches
            assert any(c.method == "ListUnitsByPatterns" and len(c.args[1]) > 1 for c in fake_systemd.calls)
    run(body())


@pytest.mark.parametrize("failure", [
    SourceError("kubelet http://127.0.0.1:10255/pods: connection refused", "connect"),
    SourceError("kubelet http://127.0.0.1:10255/pods: not JSON", "decode"),
])
def test_pod_source_failure_lowers_nothing(fake_systemd, tmp_path, failure):
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", GPOD, BPOD, GCTR, BCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE]) as h:
            before = {u: h.memory(u) for u in ("kubepods.slice", BPOD, GCTR)}
            fake_systemd.clear_calls()
            h.source.items = failure
            h.fetch_now()
            await h.settle()
            await h.settle()
            assert h.source.fetches >= 2
            assert fake_systemd.writes == []
            assert {u: h.memory(u) for u in before} == before
            assert h.metrics.registry.get_sample_value("memqos_source_errors_total", {"kind": failure.kind}) >= 1
    run(body())


def test_a_pod_source_failure_is_logged_once_per_cause(fake_systemd, tmp_path, caplog):
    """An operator fixing kubelet access one thing at a time (the token file, then the token, then
    the RBAC rule) sees each new cause in the journal once, not once per poll, nor only the first."""
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", GPOD, GCTR)
    causes = [SourceError("kubelet https://127.0.0.1:10250/pods: HTTP 401 Unauthorized", "http"),
              SourceError("kubelet https://127.0.0.1:10250/pods: HTTP 403 Forbidden", "http")]

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED]) as h:
            for cause in (causes[0], causes[0], causes[0], causes[1], causes[1], causes[0]):
                h.source.items = cause
                h.fetch_now()
                await h.settle()
            h.source.items = [GUARANTEED]
            h.fetch_now()
            await h.settle()
    with caplog.at_level(logging.INFO, logger="memqos_systemd"):
        run(body())
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("pod source")]
    assert said == [f"pod source failed: {causes[0]}; holding the last good snapshot (1 pods)",
                    f"pod source failed: {causes[1]}; holding the last good snapshot (1 pods)",
                    f"pod source failed: {causes[0]}; holding the last good snapshot (1 pods)",
                    "pod source recovered: 1 pods"]


def test_no_snapshot_at_start_only_raises(fake_systemd, tmp_path):
    """Daemon restarted while the kubelet is down: existing protection must survive."""
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", BPOD)
    for unit, low in (("kubepods.slice", 256 * MI), ("kubepods-burstable.slice", 256 * MI), (BPOD, 256 * MI)):
        fake_systemd.remove_unit(unit)
        fake_systemd.add_unit(unit, memory={"MemoryLow": low})

    async def body():
        async with Harness(fake_systemd, tmp_path, SourceError("kubelet: connection refused", "connect")) as h:
            assert h.daemon.ready
            assert h.memory(BPOD)["MemoryLow"] == 256 * MI
            assert h.memory("kubepods.slice")["MemoryLow"] == 256 * MI
            assert fake_systemd.writes == []
    run(body())


def test_pods_dropped_by_the_source_keep_protection_until_their_slices_are_gone(fake_systemd, tmp_path):
    """A sudden empty (or shorter) pod list while the pods' slices still run lowers nothing."""
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", GPOD, BPOD, GCTR, BCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE]) as h:
            fake_systemd.clear_calls()
            h.source.items = []
            h.fetch_now()
            await h.settle()
            assert len(h.daemon.intake.pods) == 2  # carried over: their slices still run
            assert fake_systemd.writes == []
            # One pod really goes away: its slices are removed, and only its share is released.
            for unit in (BCTR, BPOD):
                fake_systemd.remove_unit(unit)
            await until(lambda: h.memory("kubepods.slice")["MemoryLow"] == 0)
            assert h.memory("kubepods.slice")["MemoryMin"] == 512 * MI
            assert h.memory(GPOD)["MemoryMin"] == 512 * MI
    run(body())


def test_first_answer_empty_while_pod_slices_run_is_not_believed(fake_systemd, tmp_path):
    """The daemon restarts and the pod source's first answer is an empty list: hold. The metrics say
    so, and count the units whose lowering is held back as drifted, until the slice is gone."""
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", BPOD)
    for unit in ("kubepods.slice", "kubepods-burstable.slice", BPOD):
        fake_systemd.remove_unit(unit)
        fake_systemd.add_unit(unit, memory={"MemoryLow": 256 * MI})

    async def body():
        async with Harness(fake_systemd, tmp_path, []) as h:
            metric = h.metrics.registry.get_sample_value
            assert h.daemon.intake.holding is Holding.SUSPECT_EMPTY
            assert fake_systemd.writes == []
            assert metric("memqos_holding") == 1
            assert metric("memqos_units_drifted") == 3  # kubepods, its Burstable slice, the pod slice
            fake_systemd.remove_unit(BPOD)
            await until(lambda: h.daemon.intake.holding is None)
            await until(lambda: h.memory("kubepods.slice")["MemoryLow"] == 0)
            await until(lambda: metric("memqos_holding") == 0 and metric("memqos_units_drifted") == 0)
    run(body())


def test_failed_call_midway_retries_and_never_leaves_a_child_above_its_parent(fake_systemd, tmp_path):
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", GPOD, BPOD, GCTR, BCTR)
    fake_systemd.fail_next("SetUnitProperties", "org.freedesktop.DBus.Error.Failed")
    fake_systemd.fail_next("SetUnitProperties", "org.freedesktop.DBus.Error.Failed")

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE]) as h:
            state = {u: {"MemoryMin": 0, "MemoryLow": 0} for u in
                     ("kubepods.slice", "kubepods-burstable.slice", GPOD, BPOD, GCTR, BCTR)}
            parents = {"kubepods-burstable.slice": "kubepods.slice", GPOD: "kubepods.slice",
                       BPOD: "kubepods-burstable.slice", GCTR: GPOD, BCTR: BPOD}
            assert h.memory(BCTR)["MemoryLow"] == 256 * MI
            # Replay only the calls that succeeded (the first two were refused) and check every step.
            for unit, props in h.sets()[2:]:
                state[unit].update({k: v for k, v in props.items() if k in ("MemoryMin", "MemoryLow")})
                for child, parent in parents.items():
                    for k in ("MemoryMin", "MemoryLow"):
                        assert state[child][k] <= state[parent][k], (unit, child, k)
    run(body())


def test_bus_drop_reconnects_and_reapplies(fake_systemd, tmp_path):
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", BPOD, BCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [BURSTABLE]) as h:
            assert h.memory(BPOD)["MemoryLow"] == 256 * MI
            fake_systemd.kill_bus()
            # systemd "restarted" meanwhile and lost the runtime values.
            for unit in ("kubepods.slice", "kubepods-burstable.slice", BPOD, BCTR):
                fake_systemd.remove_unit(unit)
                fake_systemd.add_unit(unit)
            fake_systemd.restart_bus()
            await until(lambda: (h.memory(BPOD) or {}).get("MemoryLow") == 256 * MI, timeout=15)
            assert h.memory("kubepods.slice")["MemoryLow"] == 256 * MI
    run(body())


def test_kubelet_restart_triggers_a_full_reread(fake_systemd, tmp_path):
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", BPOD, BCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [BURSTABLE]) as h:
            # The kubelet rewrites the QoS slice behind our back, then its start job finishes.
            fake_systemd.remove_unit("kubepods-burstable.slice")
            fake_systemd.add_unit("kubepods-burstable.slice", memory={"MemoryLow": 0})
            fake_systemd.emit_job_removed("kubelet.service", "done")
            await until(lambda: h.memory("kubepods-burstable.slice")["MemoryLow"] == 256 * MI)
    run(body())


def test_kubelet_start_re_reads_the_upper_slices_not_every_pod_unit(fake_systemd, tmp_path):
    """A kubelet start rewrites the kubepods and QoS slices (with its MemoryQoS gate): those are
    read again, and the pods fetched; the pod slices and scopes are not each read again (one
    GetAll each in PID 1's queue just as the node's pods start). A value the kubelet lowered on
    the QoS slice while it started is put back."""
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", BPOD, BCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [BURSTABLE]) as h:
            await h.settle()
            fake_systemd.clear_calls()
            fetches = h.source.fetches
            behind_our_back(fake_systemd, "kubepods-burstable.slice", MemoryLow=0)
            behind_our_back(fake_systemd, BPOD, MemoryLow=0)  # left to the full re-read
            fake_systemd.emit_job_removed("kubelet.service", "done")
            await until(lambda: h.memory("kubepods-burstable.slice")["MemoryLow"] == 256 * MI)
            await h.settle()
            assert h.source.fetches > fetches
            read = {c.path for c in fake_systemd.calls_to("GetAll")}
            assert unit_path("kubepods-burstable.slice") in read
            assert read.isdisjoint({unit_path(BPOD), unit_path(BCTR)}), read
            assert h.memory(BPOD)["MemoryLow"] == 0
    run(body())


def test_reload_with_invalid_config_keeps_the_old_one(fake_systemd, tmp_path):
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", BPOD, BCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [BURSTABLE]) as h:
            h.config_path.write_text("memoryReservationPolicy: Sometimes\n")
            h.daemon.request_reload()
            await h.settle()
            assert h.daemon.config.memory_reservation_policy == "TieredReservation"
            assert h.memory(BPOD)["MemoryLow"] == 256 * MI
            assert h.metrics.registry.get_sample_value("memqos_config_reloads_total", {"result": "refused"}) == 1
            # A good reload to None takes protection away, children first.
            fake_systemd.clear_calls()
            h.config_path.write_text("memoryReservationPolicy: None\n")
            h.daemon.request_reload()
            await until(lambda: h.memory("kubepods.slice")["MemoryLow"] == 0)
            order = [u for u, _ in h.sets()]
            assert order.index(BCTR) < order.index(BPOD) < order.index("kubepods-burstable.slice") < order.index("kubepods.slice")
    run(body())


def test_a_reload_to_an_empty_config_says_in_the_journal_what_it_means(fake_systemd, tmp_path, caplog):
    """issue 26: valid, and it means the built-in defaults, policy None: the protection goes."""
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", BPOD, BCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [BURSTABLE]) as h:
            h.config_path.write_text("")
            with caplog.at_level(logging.WARNING, logger="memqos_systemd"):
                h.daemon.request_reload()
                await until(lambda: h.memory(BPOD)["MemoryLow"] == 0)
            said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
            assert f"config: {h.config_path} sets no key (it is empty, or comments only): the built-in defaults" \
                   f" apply, memoryReservationPolicy None: nothing is protected, only throttled" in said, said
    run(body())


def _source_that_cannot_be_made(config):
    raise RuntimeError("the source's constructor broke\nover two lines")


# A reload to each of these is refused in one journal line naming the cause, and the old config
# stays in force (issue 26: a kubelet URL the config let through killed the daemon on reload).
HOSTILE_RELOADS = [
    ("an IPv6 host without its ]", "kubelet: {url: 'https://[::1/pods'}\n", "kubelet.url: 'https://[::1/pods'"),
    ("a port out of range", "kubelet: {url: 'https://127.0.0.1:99999/pods'}\n", "kubelet.url"),
    ("credentials in the URL", "kubelet: {url: 'https://u:p@127.0.0.1:10250/pods'}\n", "kubelet.url"),
    ("not YAML", "memoryReservationPolicy: [\n", "config.yaml"),
    ("an unknown policy", "memoryReservationPolicy: Sometimes\n", "memoryReservationPolicy: 'Sometimes'"),
    ("a cgroupRoot systemd cannot name", "cgroupRoot: /foo.slice/bar.slice\n", "cgroupRoot '/foo.slice/bar.slice'"),
    ("a reserved cgroup that is kubepods.slice",
     "kubeReserved: {memory: 1Gi}\nkubeReservedCgroup: /kubepods.slice\nenforceNodeAllocatable: [pods, kube-reserved]\n",
     "reserved cgroup slice 'kubepods.slice'"),
    ("not UTF-8", b"memoryReservationPolicy: \xff\xfe\n", "config.yaml"),
    ("the file gone", None, "config.yaml"),
    ("a directory", "directory", "config.yaml"),
    ("a source whose constructor raises", "kubelet: {url: 'https://127.0.0.1:10250/pods'}\n",
     "RuntimeError: the source's constructor broke"),
]


@pytest.mark.parametrize("what, text, named", HOSTILE_RELOADS, ids=[r[0] for r in HOSTILE_RELOADS])
def test_a_hostile_reload_keeps_the_old_config_in_force(fake_systemd, tmp_path, caplog, what, text, named):
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", BPOD, BCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [BURSTABLE]) as h:
            before = (h.daemon.config, h.daemon.naming, h.daemon.source)
            if text is None:
                h.config_path.unlink()
            elif text == "directory":
                h.config_path.unlink()
                h.config_path.mkdir()
            elif isinstance(text, bytes):
                h.config_path.write_bytes(text)
            else:
                h.config_path.write_text(text)
            if what.startswith("a source"):
                h.daemon.out.make_source = _source_that_cannot_be_made
            fake_systemd.clear_calls()
            with caplog.at_level(logging.INFO, logger="memqos_systemd"):
                h.daemon.request_reload()
                await h.settle()
                await h.settle()  # and a round after it: the daemon goes on
            assert h.alive()
            assert (h.daemon.config, h.daemon.naming, h.daemon.source) == before
            refused = [r.getMessage() for r in caplog.records if "reload refused" in r.getMessage()]
            assert len(refused) == 1 and "\n" not in refused[0] and named in refused[0], refused
            assert h.metrics.registry.get_sample_value("memqos_config_reloads_total", {"result": "refused"}) == 1
            assert not h.sets()  # nothing lowered, nothing half-applied
            assert h.memory(BPOD)["MemoryLow"] == 256 * MI
            # The next good reload takes effect.
            if h.config_path.is_dir():
                h.config_path.rmdir()
            h.daemon.out.make_source = lambda c: h.source
            h.config_path.write_text("memoryReservationPolicy: HardReservation\n")
            h.daemon.request_reload()
            await until(lambda: h.memory(BPOD)["MemoryMin"] == 256 * MI)
            assert h.metrics.registry.get_sample_value("memqos_config_reloads_total", {"result": "ok"}) == 1
    run(body())


def test_a_config_whose_parts_cannot_be_made_stops_the_start_as_a_config_error(fake_systemd, tmp_path):
    """At start, the same failures as a reload's are a ConfigError: `run` exits 2 with the line,
    and the unit does not restart it (RestartPreventExitStatus=2) to fail again every 2 s."""
    h = Harness(fake_systemd, tmp_path, [BURSTABLE])
    with pytest.raises(ConfigError, match=r"config.yaml: RuntimeError: the source's constructor broke\\nover two lines$"):
        Daemon(str(h.config_path), h.daemon.config, dataclasses.replace(h.daemon.out, make_source=_source_that_cannot_be_made))
    assert fake_systemd.calls == []


def test_a_reload_to_a_shorter_resync_interval_takes_effect_at_once(fake_systemd, tmp_path):
    """The timer's deadline was set with the old interval (60 s by default): after a reload to
    resyncInterval 1s the first timer resync came up to a minute later (seen in the VM,
    32-resync-kernel: 16 resyncs took 63 s instead of 16)."""
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", BPOD, BCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [BURSTABLE]) as h:
            import yaml
            h.config_path.write_text(yaml.safe_dump({**TIERED, "resyncInterval": "1s"}))
            h.daemon.request_reload()
            await h.settle()
            assert h.daemon.config.resync_interval == 1
            fake_systemd.clear_calls()  # the reload's own full re-read
            await until(lambda: len(fake_systemd.calls_to("ListUnitsByPatterns")) >= 2, timeout=4)
    run(body())


def test_the_plans_cgroups_are_read_at_each_scrape_as_the_config_asks(fake_systemd, tmp_path):
    """The daemon hands each new plan and its cgroups to the metrics with the config's `metrics:`;
    the containers' memory.events are read at a scrape (no thread reads them in between), and a
    reload that turns perPod off leaves the node's and the classes' series only."""
    import yaml
    from prometheus_client.parser import text_string_to_metric_families

    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", BPOD, BCTR)
    scope_dir = tmp_path / "cgroup" / "kubepods.slice" / "kubepods-burstable.slice" / BPOD / BCTR
    scope_dir.mkdir(parents=True)
    (scope_dir / "memory.events").write_text("low 0\nhigh 42\nmax 0\noom 0\noom_kill 0\n")
    for d in (scope_dir.parent, scope_dir.parent.parent):  # its pod slice and QoS slice count it too
        (d / "memory.events").write_text("low 0\nhigh 42\nmax 0\noom 0\noom_kill 0\n")

    def scrape(h) -> dict[str, dict[tuple, float]]:
        out: dict[str, dict[tuple, float]] = {}
        for fam in text_string_to_metric_families(h.metrics.render().decode()):
            for sample in fam.samples:
                out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
        return out

    async def body():
        config = {**TIERED, "metrics": {"perUnit": True}}
        async with Harness(fake_systemd, tmp_path, [BURSTABLE], config=config) as h:
            b = (("container", "c"), ("namespace", "ns"), ("pod", "b"), ("qos_class", "Burstable"))
            assert scrape(h)["memqos_container_memory_high_events_total"] == {b: 42}
            (scope_dir / "memory.events").write_text("low 0\nhigh 43\nmax 0\noom 0\noom_kill 0\n")
            assert scrape(h)["memqos_container_memory_high_events_total"] == {b: 43}
            # A container of a later plan is read too.
            gdir = tmp_path / "cgroup" / "kubepods.slice" / GPOD / GCTR
            gdir.mkdir(parents=True)
            (gdir / "memory.events").write_text("low 0\nhigh 7\nmax 0\noom 0\noom_kill 0\n")
            h.source.items = [BURSTABLE, GUARANTEED]
            h.fetch_now()
            await h.settle()
            g = (("container", "c"), ("namespace", "ns"), ("pod", "g"), ("qos_class", "Guaranteed"))
            assert scrape(h)["memqos_container_memory_high_events_total"] == {b: 43, g: 7}
            # perPod off: no series names a pod.
            h.config_path.write_text(yaml.safe_dump({**TIERED, "metrics": {"perPod": False}}))
            h.daemon.request_reload()
            await h.settle()
            s = scrape(h)
            assert not [name for name, series in s.items() for labels in series if "pod" in dict(labels)]
            assert s["memqos_qos_memory_events_total"][(("event", "high"), ("qos_class", "Burstable"))] == 42
            assert s["memqos_pods"][(("qos_class", "Guaranteed"),)] == 1
    run(body())


@pytest.mark.parametrize("ids_on_cgroups", [True, False])
def test_unit_that_starts_after_unit_new_gets_its_properties_when_its_job_is_done(fake_systemd, tmp_path,
                                                                                  ids_on_cgroups):
    """systemd sends UnitNew when a transient unit is loaded, before its start job has run.

    Seen on real systemd 252: the pod slice was still inactive when UnitNew arrived, the write
    was (rightly) refused, and nothing looked again until the next resync. Without an invocation
    ID on the cgroup (ids_on_cgroups False) the slice is read over D-Bus, as before.
    """
    if not ids_on_cgroups:
        fake_systemd.cgroup_root = None
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", GPOD, GCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, {**NEWCOMER}]) as h:
            fake_systemd.add_unit(NPOD, active_state="inactive")
            await h.settle()
            assert (h.memory(NPOD) or {}).get("MemoryLow") == 0  # not running yet: not written
            fake_systemd.set_active_state(NPOD, "active")
            fake_systemd.emit_job_removed(NPOD, "done")
            await until(lambda: h.memory(NPOD)["MemoryLow"] == 128 * MI)
    run(body())


def test_a_new_pod_slice_the_kubelet_has_listed_costs_one_call_its_write_by_the_id_on_its_cgroup(
        fake_systemd, tmp_path):
    """The pod is listed before its slice starts (as the kubelet does): the slice's UnitNew is
    answered with one write, all three values, to the run named by the invocation ID systemd put
    on its cgroup. No state check, no GetAll, no Get of the ID (each a call that waits in PID 1's
    queue during a burst)."""
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", GPOD, GCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, NEWCOMER]) as h:
            await h.settle()
            fake_systemd.clear_calls()
            fake_systemd.add_unit(NPOD)
            await until(lambda: (h.memory(NPOD) or {}).get("MemoryLow") == 128 * MI)
            await h.settle()
            calls = fake_systemd.calls
            assert [c.method for c in calls] == ["SetProperties"]
            assert calls[0].path == fake_systemd.unit(NPOD).invocation_path
            # What differs from what the kernel shows it holds (memory.min/low/high): MemoryLow.
            assert fake_systemd.write_of(calls[0]) == (NPOD, True, {"MemoryLow": 128 * MI})
            assert h.cache[NPOD] == {"MemoryMin": 0, "MemoryLow": 128 * MI,
                                                       "MemoryHigh": UINT64_MAX}
            assert h.daemon.observer.runs == {}
    run(body())


@pytest.mark.parametrize("files", ["unreadable", "kubelet-set"])
def test_a_new_pod_slice_whose_kernel_values_cannot_be_read_or_differ_gets_what_differs(fake_systemd, tmp_path, files):
    """Without the kernel's memory files (unreadable), all three planned values are sent in the
    one write; with values the creator set (the kubelet's MemoryQoS gate sets MemoryMin), what
    differs from them is sent, MemoryMin back to 0 included, each by the run's ID."""
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", GPOD, GCTR)

    async def body():
        h = Harness(fake_systemd, tmp_path, [GUARANTEED, NEWCOMER])
        if files == "unreadable":
            h.daemon.out.cgroupfs.kernel_values = lambda unit, with_max=False: None
        async with h:
            await h.settle()
            fake_systemd.clear_calls()
            fake_systemd.add_unit(NPOD, memory={"MemoryMin": 128 * MI} if files == "kubelet-set" else None)
            await until(lambda: (h.memory(NPOD) or {}).get("MemoryLow") == 128 * MI)
            await h.settle()
            sent = [fake_systemd.write_of(c)[2] for c in fake_systemd.calls]
            assert {c.method for c in fake_systemd.calls} == {"SetProperties"}
            if files == "unreadable":
                assert sent == [{"MemoryMin": 0, "MemoryLow": 128 * MI, "MemoryHigh": UINT64_MAX}]
            else:  # the diff's order: what grows first, then what shrinks
                assert sent == [{"MemoryLow": 128 * MI}, {"MemoryMin": 0}]
            assert h.memory(NPOD) == {"MemoryMin": 0, "MemoryLow": 128 * MI, "MemoryHigh": UINT64_MAX}
    run(body())


def test_a_pod_slice_loaded_before_its_start_costs_nothing_until_its_job_ends_then_one_write(fake_systemd, tmp_path):
    """UnitNew before the start job: no ID on the cgroup yet, and nothing is asked of systemd (a
    ListUnitsByPatterns with a pattern per new unit is matched against every unit in PID 1); its
    JobRemoved brings the ID, and one write."""
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", GPOD, GCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, NEWCOMER]) as h:
            await h.settle()
            fake_systemd.clear_calls()
            fake_systemd.add_unit(NPOD, active_state="inactive")
            await until(lambda: NPOD in h.daemon.observer.starts.awaiting)
            await h.settle()
            assert fake_systemd.calls == []
            assert NPOD not in h.cache
            fake_systemd.set_active_state(NPOD, "active")
            fake_systemd.emit_job_removed(NPOD, "done")
            await until(lambda: (h.memory(NPOD) or {}).get("MemoryLow") == 128 * MI)
            await h.settle()
            assert [c.method for c in fake_systemd.calls] == ["SetProperties"]
            assert not h.daemon.observer.starts.awaiting
    run(body())


def test_a_running_pods_new_request_costs_only_its_writes_each_to_the_run_on_its_cgroup(fake_systemd, tmp_path):
    """A Burstable pod's request grows: its pod slice, the QoS slice and kubepods.slice are
    written, each to the run named by the ID on its cgroup: no state check (ListUnitsByPatterns,
    GetUnit, Get) and no ID read first. The container scope (no ID on its cgroup on 252) is still
    checked and its ID read."""
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", BPOD, BCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [BURSTABLE]) as h:
            await h.settle()
            fake_systemd.clear_calls()
            h.source.items = [pod(B_UID, "b", "300Mi", "1Gi", "b" * 64, "Burstable")]
            h.fetch_now()  # not left to the next poll, 5 s away
            await until(lambda: h.memory(BCTR)["MemoryLow"] == 300 * MI)
            await h.settle()
            calls = fake_systemd.calls
            slices = ("kubepods.slice", "kubepods-burstable.slice", BPOD)
            runs = {fake_systemd.unit(u).invocation_path: u for u in (*slices, BCTR)}
            assert sorted(runs[c.path] for c in calls if c.method == "SetProperties") == sorted((*slices, BCTR))
            checks = [c for c in calls if c.method != "SetProperties"]
            # Only the scope is checked (its state in one listing; its ID was read at the first round).
            assert [c.method for c in checks] == ["ListUnitsByPatterns"], checks
            assert checks[0].args[1] == [BCTR]
    run(body())


def test_a_slice_whose_cgroup_carries_an_older_runs_id_is_still_written(fake_systemd, tmp_path):
    """The ID on a cgroup names a run that has ended (an older run's, left on a directory systemd
    did not make again): systemd refuses that write, and the daemon asks systemd for the state
    and ID instead, and writes."""
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", BPOD, BCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [BURSTABLE]) as h:
            await h.settle()
            os.setxattr(tmp_path / "cgroup/kubepods.slice/kubepods-burstable.slice" / BPOD,
                        "user.invocation_id", os.urandom(16).hex().encode())
            fake_systemd.clear_calls()
            h.source.items = [pod(B_UID, "b", "300Mi", "1Gi", "b" * 64, "Burstable")]
            h.fetch_now()  # not left to the next poll, 5 s away
            await until(lambda: h.memory(BPOD)["MemoryLow"] == 300 * MI)
            await h.settle()
            runs = {fake_systemd.unit(u).invocation_path: u
                    for u in ("kubepods.slice", "kubepods-burstable.slice", BPOD, BCTR)}
            written = [runs.get(c.path, "an ended run") for c in fake_systemd.calls_to("SetProperties")]
            assert sorted(written) == sorted(["kubepods.slice", "kubepods-burstable.slice", "an ended run", BPOD, BCTR])
            assert written.index("an ended run") < written.index(BPOD)
            assert fake_systemd.created == []
            assert h.dbus_errors() == 0
    run(body())


def test_while_holding_a_new_pod_slice_is_read_not_taken_unread(fake_systemd, tmp_path):
    """Holding (no pod list yet) sends only raised values, which needs the values held: a new pod
    slice is read over D-Bus even with an ID on its cgroup, and nothing is lowered on it."""
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice")

    async def body():
        async with Harness(fake_systemd, tmp_path, SourceError("kubelet: connection refused", "connect")) as h:
            fake_systemd.clear_calls()
            fake_systemd.add_unit(NPOD, memory={"MemoryLow": 64 * MI})
            await until(lambda: NPOD in h.cache)
            await h.settle()
            assert h.cache[NPOD]["MemoryLow"] == 64 * MI
            assert "GetAll" in [c.method for c in fake_systemd.calls]
            assert fake_systemd.writes == []
            assert h.memory(NPOD)["MemoryLow"] == 64 * MI
    run(body())


def test_nothing_is_read_or_written_while_systemd_reloads(fake_systemd, tmp_path):
    """Seen on systemd 252: units read mid daemon-reload look unset, and the daemon 'fixed' them."""
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", BPOD, BCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [BURSTABLE]) as h:
            fake_systemd.emit_reloading(True)
            await until(lambda: h.daemon.agenda.systemd_reloading)
            fake_systemd.clear_calls()
            # Mid-reload the slice reads back as if nothing were set.
            fake_systemd.remove_unit("kubepods-burstable.slice")
            fake_systemd.add_unit("kubepods-burstable.slice")
            h.daemon.wake()
            await asyncio.sleep(0.3)
            assert fake_systemd.calls == []
            # Reload done: the daemon reads again after a moment, and repairs what is really missing.
            fake_systemd.emit_reloading(False)
            await until(lambda: h.memory("kubepods-burstable.slice")["MemoryLow"] == 256 * MI)
    run(body())


def test_units_announced_while_the_daemon_reads_are_not_forgotten(fake_systemd, tmp_path):
    """Seen on systemd 252: a pod slice and its scope started back to back; the scope's UnitNew and
    JobRemoved arrived while the daemon was reading the slice, and were cleared with it."""
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", GPOD, GCTR)
    newcomer = pod(N_UID, "n", "128Mi", "1Gi", "c" * 64, "Burstable")
    scope = "cri-containerd-" + "c" * 64 + ".scope"

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, newcomer]) as h:
            for _ in range(3):
                fake_systemd.delay_next("ListUnitsByPatterns", 0.3)  # widen the window in which signals arrive
            fake_systemd.add_unit(NPOD)
            await asyncio.sleep(0.05)
            fake_systemd.add_unit(scope)
            fake_systemd.emit_job_removed(scope, "done")
            await until(lambda: (h.memory(scope) or {}).get("MemoryLow") == 128 * MI)
            assert h.memory(NPOD)["MemoryLow"] == 128 * MI
    run(body())


def test_unit_signals_do_not_cut_the_retry_backoff_short(fake_systemd, tmp_path):
    """Seen in the VM: kubepods.slice unloadable and a stream of UnitNew gave 157 failed calls in 3 s."""
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", BPOD, BCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [BURSTABLE]) as h:
            for _ in range(50):
                fake_systemd.fail_next("SetUnitProperties", "org.freedesktop.systemd1.NoSuchUnit")
            fake_systemd.clear_calls()
            h.source.items = [BURSTABLE, NEWCOMER]
            h.fetch_now()
            for i in range(20):  # a storm of unit signals for 2 s
                fake_systemd.add_unit(f"kubepods-besteffort-pod{i:032x}.slice")
                await asyncio.sleep(0.1)
            # Backoff 1 s, 2 s, ...: a handful of attempts in 2 s, not one per signal.
            assert len(fake_systemd.writes) <= 4
    run(body())


def test_kubepods_tree_is_left_to_the_kubelet_to_create_then_written_when_it_appears(fake_systemd, tmp_path):
    """As at boot: /pods answers before the kubelet has made its slices.

    Setting properties on a slice that is not loaded would make it, with control drop-ins that
    win over the kubelet's transient unit at every daemon-reload (seen on systemd 252)."""
    async def body():
        async with Harness(fake_systemd, tmp_path, [BURSTABLE]) as h:
            assert h.sets() == [] and fake_systemd.created == []
            assert any(m.startswith("READY=1") for m in h.notify.drain())
            fake_systemd.add_unit("kubepods.slice")
            await until(lambda: h.memory("kubepods.slice")["MemoryLow"] == 256 * MI)
            fake_systemd.add_unit("kubepods-burstable.slice")
            await until(lambda: h.memory("kubepods-burstable.slice")["MemoryLow"] == 256 * MI)
            assert fake_systemd.created == []
    run(body())


def test_a_reserved_slice_dropped_from_the_config_is_reset_by_the_reload_then_left_alone(fake_systemd, tmp_path):
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", BPOD, BCTR)
    fake_systemd.add_unit("system.slice")
    reserved = {**TIERED, "enforceNodeAllocatable": ["pods", "system-reserved"],
                "systemReservedCgroup": "/system.slice", "systemReserved": {"memory": "300Mi"}}

    async def body():
        async with Harness(fake_systemd, tmp_path, [BURSTABLE], config=reserved) as h:
            assert h.memory("system.slice")["MemoryMin"] > 0
            import yaml
            h.config_path.write_text(yaml.safe_dump(TIERED))
            h.daemon.request_reload()
            await until(lambda: h.memory("system.slice")["MemoryMin"] == 0)
            assert h.memory("system.slice") == {"MemoryMin": 0, "MemoryLow": 0, "MemoryHigh": UINT64_MAX}
            # Once reset, it is the operator's slice again: their own value stays.
            fake_systemd.remove_unit("system.slice")
            fake_systemd.add_unit("system.slice", memory={"MemoryMin": 64 * MI})
            fake_systemd.clear_calls()
            h.reread()
            await h.settle()
            await h.settle()
            assert h.memory("system.slice")["MemoryMin"] == 64 * MI
            assert all(u != "system.slice" for u, _ in h.sets())
    run(body())


def test_the_ledger_is_written_at_the_first_round_even_with_no_reserved_slice(fake_systemd, tmp_path):
    """Found in the VM (10-install): with no reserved slice the empty ledger was never written."""
    path = tmp_path / "run" / "reserved-slices"

    async def body():
        async with Harness(fake_systemd, tmp_path, [], ledger_path=path):
            assert path.read_text() == ""
    run(body())


def test_a_ledger_that_could_not_be_written_is_written_once_it_can_be_on_a_steady_node(fake_systemd, tmp_path):
    """A failed write is tried again every round, rounds that are skipped on a steady node too."""
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", BPOD, BCTR)
    blocker = tmp_path / "run"
    blocker.write_text("")  # a file where the ledger's directory must go
    path = blocker / "reserved-slices"

    async def body():
        async with Harness(fake_systemd, tmp_path, [BURSTABLE], ledger_path=path) as h:
            for _ in range(3):
                await h.settle()
            assert not path.exists()
            blocker.unlink()
            await h.settle()
            assert path.read_text() == ""
    run(body())


def test_a_reserved_slice_dropped_from_the_config_while_the_service_was_stopped_is_reset_at_start(fake_systemd, tmp_path):
    """RELIABILITY limit 4, closed: the ledger remembers the reserved slices the daemon wrote."""
    from memqos_systemd import ledger

    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", BPOD, BCTR)
    fake_systemd.add_unit("system.slice")
    path = tmp_path / "run" / "reserved-slices"
    reserved = {**TIERED, "enforceNodeAllocatable": ["pods", "system-reserved"],
                "systemReservedCgroup": "/system.slice", "systemReserved": {"memory": "300Mi"}}

    async def body():
        async with Harness(fake_systemd, tmp_path, [BURSTABLE], config=reserved, ledger_path=path) as h:
            assert h.memory("system.slice")["MemoryMin"] > 0
        assert ledger.read(path) == {"system.slice"}
        # Stopped; the operator drops the reserved cgroup from the config; started again.
        again = tmp_path / "again"
        again.mkdir()
        async with Harness(fake_systemd, again, [BURSTABLE], config=TIERED, ledger_path=path) as h:
            await until(lambda: h.memory("system.slice") == {"MemoryMin": 0, "MemoryLow": 0,
                                                              "MemoryHigh": UINT64_MAX})
            await h.settle()
        assert ledger.read(path) == set()  # reset once; the operator's slice again
        assert path.exists()  # written at the first round even when empty: the operator sees it is kept
    run(body())


def test_a_kubelet_that_is_not_listening_yet_after_its_start_is_asked_again_within_a_second(fake_systemd, tmp_path):
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", BPOD, BCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, []) as h:
            h.source.items = SourceError("connection refused")
            fake_systemd.emit_job_removed("kubelet.service", "done")
            await until(lambda: h.source.fetches >= 3, timeout=3)  # the poll interval is far longer
            h.source.items = [BURSTABLE]
            await until(lambda: (h.memory(BPOD) or {}).get("MemoryLow") == 256 * MI, timeout=3)
    run(body())


# ------------------------------------------------------------------ idle cost (issue 6)

RESERVED = {**TIERED, "enforceNodeAllocatable": ["pods", "kube-reserved"],
            "kubeReservedCgroup": "/kube.slice", "kubeReserved": {"memory": "300Mi"}}
NODE_UNITS = ["kubepods.slice", "kubepods-burstable.slice", GPOD, BPOD, GCTR, BCTR, "kube.slice"]
UPPER_UNITS = ["kube.slice", "kubepods-burstable.slice", "kubepods.slice"]  # node, QoS, reserved
# What a timer resync lists, by name: the upper units, kubepods-besteffort.slice too (not in memory).
UPPER_NAMES = sorted([*UPPER_UNITS, "kubepods-besteffort.slice"])


def test_a_reserved_slice_that_does_not_run_is_written_once_not_in_a_loop(fake_systemd, tmp_path):
    """A reserved slice nothing runs in: our write loads it (UnitNew) and systemd's garbage
    collector unloads it again (UnitRemoved), its values kept as drop-ins. Seen on systemd 252 (e2e
    25-ceiling): kube.slice was written every 30 ms, each UnitNew bringing a round that found it
    unloaded and wrote it again. Written once; again only when the plan changes."""
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", BPOD, BCTR)
    fake_systemd.collect_created = True

    def kube_writes() -> list[dict]:
        return [props for unit, props in h.sets() if unit == "kube.slice"]

    async def body():
        nonlocal h
        async with Harness(fake_systemd, tmp_path, [BURSTABLE], config=RESERVED) as h:
            await until(lambda: fake_systemd.dropins_of.get("kube.slice", {}).get("MemoryMin") == 300 * MI)
            for _ in range(5):
                h.fetch_now()
                await h.settle()
            await asyncio.sleep(0.3)
            assert h.memory("kube.slice") is None  # not loaded: its values are drop-ins
            assert kube_writes() == [{"MemoryMin": 300 * MI}], kube_writes()
            await h.resync_now()  # the timer reads the reserved slices: still not loaded
            await h.settle()
            assert len(kube_writes()) == 1
            h.config_path.write_text(yaml.safe_dump({**RESERVED, "kubeReserved": {"memory": "200Mi"}}))
            h.daemon.request_reload()  # a plan that changes: written again, once
            await until(lambda: len(kube_writes()) == 2)
            for _ in range(3):
                await h.settle()
            assert kube_writes()[1:] == [{"MemoryMin": 200 * MI}], kube_writes()

    h = None
    run(body())


def units_read(fake) -> list[str]:
    """The units whose properties were read (GetAll on their object path), sorted."""
    from fakesystemd import unit_path

    by_path = {unit_path(u): u for u in NODE_UNITS}
    return sorted(by_path.get(c.path, c.path) for c in fake.calls_to("GetAll"))


def behind_our_back(fake, unit: str, **props) -> None:
    """A third party changes a unit's values through systemd (`systemctl set-property`): no
    signal, nothing the daemon hears of; systemd applies them to the unit's cgroup at once."""
    def change() -> None:
        fake._units[unit].memory.update(props)
        fake._sync_cgroup(unit)
    fake._run(change)


def units_listed(fake) -> list[list[str]]:
    """The patterns of each ListUnitsByPatterns call, in order."""
    return [c.args[1] for c in fake.calls_to("ListUnitsByPatterns")]


def test_timer_resync_reads_the_upper_slices_and_every_nth_one_reads_every_unit(fake_systemd, tmp_path,
                                                                                monkeypatch):
    """A GetAll answers ~72 properties on systemd, and every row of a listing is decoded in
    Python: listing and reading every pod slice and container scope every minute was most of the
    idle CPU. A timer resync lists the upper units by name, every FULL_RESYNC_EVERY-th one every
    unit; of those, it reads over D-Bus only the units whose cgroup does not show the cached
    values (the stand-in keeps slices' cgroups, not scopes': the daemon has no kernel view of the
    scopes here and reads them). A unit the cache lacks waits for the full one."""
    import memqos_systemd.agenda as agenda_mod

    monkeypatch.setattr(agenda_mod, "FULL_RESYNC_EVERY", 3)
    start_pods(fake_systemd, *NODE_UNITS)
    scopes = sorted([GCTR, BCTR])

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=RESERVED) as h:
            read, listed = [], []
            for _ in range(6):
                fake_systemd.clear_calls()
                await h.resync_now()
                read.append(units_read(fake_systemd))
                listed.append(units_listed(fake_systemd))
                assert fake_systemd.writes == []
            assert read == [[], [], scopes] * 2
            assert listed == [[UPPER_NAMES], [UPPER_NAMES], [h.daemon.naming.patterns()]] * 2
            # A unit the cache has no values for (its UnitNew missed) is read by the full one only.
            h.daemon.observer.forget(BPOD)
            fake_systemd.clear_calls()
            await h.resync_now()
            assert units_read(fake_systemd) == [] and BPOD not in h.cache
            await h.resync_now()
            fake_systemd.clear_calls()
            await h.resync_now()
            assert units_read(fake_systemd) == sorted([BPOD, *scopes])
            assert h.cache[BPOD] == h.memory(BPOD)
    run(body())


def kernel_only(tmp_path, unit: str, file: str, value: int) -> None:
    """Someone writes a unit's cgroup file behind systemd's back: systemd still holds its value."""
    from memqos_systemd.cgroup_tree import cgroup_path

    (tmp_path / "cgroup" / cgroup_path(unit) / file).write_text(f"{value}\n")


def test_a_timer_resync_reads_over_dbus_the_units_whose_cgroup_differs(fake_systemd, tmp_path, monkeypatch):
    """The kernel's files stand in for a GetAll only while they show the cached values: a cgroup
    that shows anything else is read over D-Bus, and what systemd holds decides. A value changed
    through systemd shows in the cgroup, so it is read and put right; a file that shows more than
    systemd holds (as a parent's DefaultMemoryLow= makes it) is read and left; one that shows less
    was written behind systemd's back, and the same value is set again (issue 29)."""
    import memqos_systemd.agenda as agenda_mod

    monkeypatch.setattr(agenda_mod, "FULL_RESYNC_EVERY", 2)
    start_pods(fake_systemd, *NODE_UNITS)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=RESERVED) as h:
            for _ in range(2):
                await h.resync_now()
            planned = h.memory(BPOD)
            kernel_only(tmp_path, BPOD, "memory.low", planned["MemoryLow"] + 4096)
            fake_systemd.clear_calls()
            await h.resync_now()  # the upper slices only
            assert units_read(fake_systemd) == [] and fake_systemd.writes == []
            await h.resync_now()  # every unit (the scopes here have no cgroup: always read)
            assert BPOD in units_read(fake_systemd) and "kubepods.slice" not in units_read(fake_systemd)
            assert fake_systemd.writes == [] and h.memory(BPOD) == planned
            kernel_only(tmp_path, BPOD, "memory.low", 4096)
            fake_systemd.clear_calls()
            await h.resync_now()
            assert fake_systemd.writes == []  # not watched: the full resync finds it
            await h.resync_now()
            assert BPOD in units_read(fake_systemd) and h.sets() == [(BPOD, {"MemoryLow": planned["MemoryLow"]})]
            assert (tmp_path / "cgroup" / "kubepods.slice/kubepods-burstable.slice" / BPOD / "memory.low").read_text() \
                == f"{planned['MemoryLow']}\n"  # the stand-in, as systemd, wrote the file again
            behind_our_back(fake_systemd, BPOD, MemoryLow=0)
            fake_systemd.clear_calls()
            await h.resync_now()
            await h.resync_now()
            assert h.memory(BPOD) == planned
            assert [u for u, _ in h.sets()] == [BPOD]
    run(body())


def test_a_new_pod_slice_cached_from_its_cgroup_is_read_over_dbus_by_the_next_full_resync(fake_systemd, tmp_path,
                                                                                           monkeypatch):
    """A pod slice taken by its cgroup's invocation ID is cached with the values its cgroup
    shows, which may not be systemd's own (a parent's DefaultMemoryLow=): the cgroup agreeing
    with itself proves nothing, so the next full re-read asks systemd for it, and only then
    trusts the kernel."""
    import memqos_systemd.agenda as agenda_mod

    monkeypatch.setattr(agenda_mod, "FULL_RESYNC_EVERY", 1)
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", BPOD, BCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [BURSTABLE, GUARANTEED]) as h:
            fake_systemd.add_unit(GPOD)
            await until(lambda: GPOD in h.cache)
            await h.settle()
            assert GPOD in h.daemon.observer.unconfirmed
            fake_systemd.clear_calls()
            await h.resync_now()
            assert GPOD in units_read(fake_systemd) and GPOD not in h.daemon.observer.unconfirmed
            fake_systemd.clear_calls()
            await h.resync_now()
            assert GPOD not in units_read(fake_systemd)
    run(body())


def test_events_that_call_for_a_full_reread_still_read_every_unit(fake_systemd, tmp_path):
    start_pods(fake_systemd, *NODE_UNITS)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=RESERVED) as h:
            # (A kubelet start reads only the upper slices: see test_kubelet_start_re_reads_...)
            for event in (lambda: fake_systemd.emit_reloading(False), h.daemon.request_reload):
                fake_systemd.clear_calls()
                event()
                await until(lambda: len(fake_systemd.calls_to("GetAll")) >= len(NODE_UNITS), timeout=5)
                await h.settle()
                assert units_read(fake_systemd) == sorted(NODE_UNITS)
    run(body())


def test_a_unit_removed_while_a_timer_resync_reads_is_not_kept_in_the_cache(fake_systemd, tmp_path):
    """The units a timer resync does not read keep their cached values, taken after the reads:
    one whose UnitRemoved came meanwhile is not brought back (it would look live to carry_over)."""
    start_pods(fake_systemd, *NODE_UNITS)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=RESERVED) as h:
            kernel_only(tmp_path, "kubepods.slice", "memory.min", 8192)  # so that one is read
            fake_systemd.clear_calls()
            fake_systemd.delay_next("GetAll", 0.5)
            h.daemon.agenda.resync_now()
            h.daemon.wake()
            await until(lambda: fake_systemd.calls_to("GetAll"))
            fake_systemd.remove_unit(BPOD)
            await h.settle()
            await h.settle()
            assert units_read(fake_systemd) == ["kubepods.slice"]
            assert units_listed(fake_systemd)[0] == UPPER_NAMES
            assert BPOD not in h.cache
            assert h.cache[BCTR] is not None and h.cache[GPOD] is not None
    run(body())


def test_drift_on_a_pod_slice_is_corrected_by_the_next_full_resync(fake_systemd, tmp_path, monkeypatch):
    import memqos_systemd.agenda as agenda_mod

    monkeypatch.setattr(agenda_mod, "FULL_RESYNC_EVERY", 3)
    start_pods(fake_systemd, *NODE_UNITS)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=RESERVED) as h:
            pod_values, qos_values = h.memory(BPOD), h.memory("kubepods-burstable.slice")
            behind_our_back(fake_systemd, BPOD, MemoryLow=0)
            behind_our_back(fake_systemd, "kubepods-burstable.slice", MemoryLow=0)
            await h.resync_now()
            assert h.memory("kubepods-burstable.slice") == qos_values  # read, and corrected, every time
            assert h.memory(BPOD)["MemoryLow"] == 0  # not read by this one
            await h.resync_now()
            assert h.memory(BPOD)["MemoryLow"] == 0
            await h.resync_now()  # the third: every unit
            assert h.memory(BPOD) == pod_values
    run(body())


def test_an_unchanged_pod_list_is_not_planned_again_until_something_changes(fake_systemd, tmp_path, monkeypatch):
    """Planning is pure and the diff reads only the cache: a poll that brings the same pods to
    the same cache is not planned again. Anything else they depend on still is: the pods, the
    node's memory, a value read back from systemd, a unit event. (`planned` counts the rounds
    that plan and diff; `computed`, the calls of `plan` itself, which the same inputs reuse.)"""
    import memqos_systemd.round as round_mod

    planned, computed = [], []
    real_plan, real_run = round_mod.plan, round_mod.Round.run

    async def run_counted(self, *a, **kw):
        outcome = await real_run(self, *a, **kw)
        if outcome is not None and not outcome.settled:
            planned.append(1)
        return outcome

    monkeypatch.setattr(round_mod, "plan", lambda *a, **kw: computed.append(1) or real_plan(*a, **kw))
    monkeypatch.setattr(round_mod.Round, "run", run_counted)
    start_pods(fake_systemd, *NODE_UNITS)

    async def settle_after(h: Harness, change) -> int:
        before = len(planned)
        change()
        h.fetch_now()
        await h.settle()
        return len(planned) - before

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=RESERVED) as h:
            await h.settle()  # the first round after the writes finds nothing to send
            fetches = h.source.fetches
            for _ in range(3):
                assert await settle_after(h, lambda: None) == 0
            assert h.source.fetches >= fetches + 3  # asked every time, planned none
            # Other pods (the same, parsed again, are the same): planned, and written.
            bigger = copy.deepcopy(BURSTABLE)
            bigger["spec"]["containers"][0]["resources"]["requests"]["memory"] = "384Mi"
            assert await settle_after(h, lambda: setattr(h.source, "items", [GUARANTEED, bigger])) == 1
            assert h.memory(BPOD)["MemoryLow"] == 384 * MI
            computed_then = len(computed)
            assert await settle_after(h, lambda: None) == 1  # the round after a write plans again
            assert len(computed) == computed_then  # with the plan it had: the same inputs
            assert await settle_after(h, lambda: None) == 0
            # The node's memory changes (udev memory event).
            h.capacity = 32 << 30
            assert await settle_after(h, h.daemon.on_memory_event) == 1
            await h.settle()
            # A value read back from systemd differs from what was written: corrected.
            behind_our_back(fake_systemd, "kubepods.slice", MemoryLow=0)
            h.daemon.agenda.resync_now()
            assert await settle_after(h, lambda: None) == 1
            assert h.memory("kubepods.slice")["MemoryLow"] > 0
            await h.settle()
            # A unit event: a container scope started again.
            assert await settle_after(h, lambda: fake_systemd.emit_job_removed(BCTR, "done")) >= 1
            # A stable node: nothing planned, nothing read, nothing written.
            fake_systemd.clear_calls()
            for _ in range(3):
                assert await settle_after(h, lambda: None) == 0
            assert fake_systemd.calls == []
    run(body())


def test_a_pod_the_kubelet_leaves_out_of_its_first_list_after_a_daemon_restart_keeps_its_protection(
        fake_systemd, tmp_path):
    """The daemon restarts (systemctl restart, a crash, an upgrade) while the kubelet, mid-restart
    itself, lists only some pods: a pod of the last run whose slice still runs is kept until its
    slice is gone, as it would be without the restart (the pods of the last run are remembered
    in the runtime directory, last_pods.py)."""
    from memqos_systemd import last_pods

    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", GPOD, BPOD, GCTR, BCTR)
    first, again = tmp_path / "first", tmp_path / "again"
    first.mkdir()
    again.mkdir()
    path = tmp_path / "run" / "last-pods.json"

    async def body():
        async with Harness(fake_systemd, first, [GUARANTEED, BURSTABLE], last_pods_path=path) as h:
            held = {u: h.memory(u) for u in ("kubepods.slice", "kubepods-burstable.slice", BPOD, BCTR)}
            assert held[BPOD]["MemoryLow"] == 256 * MI
        assert [p.uid for p in last_pods.read(path)] == [G_UID, B_UID]
        fake_systemd.clear_calls()
        async with Harness(fake_systemd, again, [GUARANTEED], last_pods_path=path) as h:
            await h.settle()
            assert {u: h.memory(u) for u in held} == held
            assert all(u not in (BPOD, BCTR) for u, _ in h.sets())
            assert h.daemon.intake.holding is None  # a snapshot like any: B is carried, not held for
            assert [p.uid for p in last_pods.read(path)] == [G_UID, B_UID]  # still remembered
            # The pod really goes: its slices are removed, and only then is its share released.
            for unit in (BCTR, BPOD):
                fake_systemd.remove_unit(unit)
            await until(lambda: h.memory("kubepods.slice")["MemoryLow"] == 0)
            assert [p.uid for p in h.daemon.intake.pods] == [G_UID]
            assert h.memory("kubepods.slice")["MemoryMin"] == 512 * MI
            assert h.memory(GPOD)["MemoryMin"] == 512 * MI
        assert [p.uid for p in last_pods.read(path)] == [G_UID]
    run(body())


def test_the_pods_of_the_last_run_are_never_planned_on_their_own(fake_systemd, tmp_path, caplog):
    """A remembered pod whose slice is gone, or that the kubelet lists again (with new values:
    the list wins), is not carried; without a path nothing is read or written."""
    import logging
    from memqos_systemd import last_pods

    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", GPOD, GCTR)
    path = tmp_path / "run" / "last-pods.json"
    old, _ = parse_pods({"items": [pod(G_UID, "g", "256Mi", "256Mi", "a" * 64, "Guaranteed"), BURSTABLE]})
    assert last_pods.write(path, old)

    async def body():
        with caplog.at_level(logging.INFO, logger="memqos_systemd"):
            async with Harness(fake_systemd, tmp_path, [GUARANTEED], last_pods_path=path) as h:
                await h.settle()
                assert [p.uid for p in h.daemon.intake.pods] == [G_UID]  # B's slice is not live
                assert h.memory(GPOD)["MemoryMin"] == 512 * MI  # the kubelet's values, not the file's
                assert h.memory("kubepods.slice")["MemoryLow"] == 0
        assert f"remembered 2 pods from the last run ({path})" in caplog.text
        assert "no longer listed" not in caplog.text
        assert [p.uid for p in last_pods.read(path)] == [G_UID]
    run(body())


def test_the_pods_are_written_only_when_they_change_and_a_failed_write_warns_once(fake_systemd, tmp_path,
                                                                                   monkeypatch, caplog):
    """The poll runs every 5 s and an unchanged /pods gives the same pods: no write then. A write
    that fails is tried again at each poll, with one warning, until it succeeds."""
    import logging
    from memqos_systemd import last_pods

    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", GPOD, BPOD, GCTR, BCTR)
    blocker = tmp_path / "run"
    blocker.write_text("")  # a file where the directory must go
    path = blocker / "last-pods.json"
    writes = []
    real_write = last_pods.write
    monkeypatch.setattr(last_pods, "write", lambda *a, **k: writes.append(a[1]) or real_write(*a, **k))

    class SameObjects(ControlledSource):
        """As the kubelet source: the same Pod objects while the document is unchanged."""
        def fetch(self):
            key = repr(self.items)
            if getattr(self, "_last", (None,))[0] != key:
                self._last = (key, super().fetch())
            self.fetches += 1
            return self._last[1]

    async def body():
        with caplog.at_level(logging.WARNING, logger="memqos_systemd"):
            h = Harness(fake_systemd, tmp_path, [GUARANTEED], last_pods_path=path)
            h.source = h.daemon.source = SameObjects([GUARANTEED])
            async with h:
                for _ in range(3):
                    h.fetch_now()
                    await h.settle()
                assert not path.exists() and len(writes) >= 3  # tried at every poll
                assert sum("cannot remember the pods" in r.getMessage() for r in caplog.records) == 1
                blocker.unlink()
                h.fetch_now()
                await h.settle()
                assert [p.uid for p in last_pods.read(path)] == [G_UID]
                done = len(writes)
                for _ in range(3):
                    h.fetch_now()
                    await h.settle()
                assert len(writes) == done  # the same pods: not written again
                h.source.items = [GUARANTEED, BURSTABLE]
                h.fetch_now()
                await until(lambda: len(writes) > done)
                await h.settle()
                assert len(writes) == done + 1
                assert [p.uid for p in last_pods.read(path)] == [G_UID, B_UID]
    run(body())


def test_an_unusable_file_of_the_last_pods_is_one_warning_and_the_daemon_starts_as_before(fake_systemd, tmp_path,
                                                                                           caplog):
    import logging
    from memqos_systemd import last_pods

    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", GPOD, GCTR)
    path = tmp_path / "last-pods.json"
    path.write_text('{"version": 1, "pods": [{"uid": 5}]}')

    async def body():
        with caplog.at_level(logging.WARNING, logger="memqos_systemd"):
            async with Harness(fake_systemd, tmp_path, [GUARANTEED], last_pods_path=path) as h:
                await h.settle()
                assert h.memory(GPOD)["MemoryMin"] == 512 * MI
        warned = [r.getMessage() for r in caplog.records if "last run" in r.getMessage()]
        assert len(warned) == 1 and str(path) in warned[0] and "ignored" in warned[0]
        assert [p.uid for p in last_pods.read(path)] == [G_UID]  # replaced by this run's pods
    run(body())


def test_the_reconcile_line_names_each_unit_written_with_its_old_and_new_value(fake_systemd, tmp_path, caplog):
    """On a quiet node an operator who sees "reconcile: 1 change(s) applied" asks which unit and
    from what: the line says so (the cached value it replaced, then the value sent)."""
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", BPOD, BCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [BURSTABLE]) as h:
            with caplog.at_level(logging.INFO, logger="memqos_systemd"):
                fake_systemd.remove_unit("kubepods-burstable.slice")
                fake_systemd.add_unit("kubepods-burstable.slice", memory={"MemoryLow": 0})
                fake_systemd.emit_job_removed("kubelet.service", "done")
                await until(lambda: h.memory("kubepods-burstable.slice")["MemoryLow"] == 256 * MI)
                await h.settle()
            lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("reconcile:")]
            assert lines == [f"reconcile: 1 change(s) applied (kubepods-burstable.slice MemoryLow 0 -> {256 * MI})"]
    run(body())


RELOADS = ["reloading", "reloaded", "reexecuted"]


async def reload_during_a_held_fetch(h, fake, units, how: str) -> list:
    """Hold a pod fetch mid-round; meanwhile systemd reloads: Reloading(true), then UnitRemoved
    and UnitNew for each of `units`, as a daemon-reload announces every unit. The fetch is let go
    while the reload is under way ("reloading"), or once it has ended and its quiet time has
    passed ("reloaded"; "reexecuted": UnitRemoved only, as after daemon-reexec). Returns the
    writes sent before the reload's re-read; returns once a round has followed that re-read."""
    ended_before_release = how != "reloading"
    memory = {u: h.memory(u) for u in units}
    fetches = h.source.fetches
    h.source.hold = True
    h.fetch_now()
    await until(h.source.held.is_set)
    fake.emit_reloading(True)
    await until(lambda: h.daemon.agenda.systemd_reloading)
    for unit in units:  # UnitRemoved: forgotten until the re-read
        if how == "reexecuted":
            fake.announce_removed(unit)
        else:
            fake.remove_unit(unit)
    await until(lambda: all(("removed", u) in h.events for u in units))  # delivered to the daemon
    if how != "reexecuted":
        for unit in units:
            fake.add_unit(unit, memory=memory[unit])
    if ended_before_release:
        fake.emit_reloading(False)
        await until(lambda: not h.daemon.agenda.systemd_reloading)
        await asyncio.sleep(1.5)  # past SYSTEMD_SETTLE
    h.source.release()
    await until(lambda: h.source.fetches > fetches)
    await asyncio.sleep(0.3)
    midway = list(fake.writes)
    if not ended_before_release:
        fake.emit_reloading(False)
        await until(lambda: not h.daemon.agenda.systemd_reloading)
        await asyncio.sleep(1.5)  # SYSTEMD_SETTLE, then the full re-read
    await h.settle()
    return midway


@pytest.mark.parametrize("how", RELOADS)
def test_a_round_under_way_when_systemd_starts_reloading_writes_nothing(fake_systemd, tmp_path, how):
    """Seen on systemd 252 (e2e 40-survival, one CI run in seven): a daemon-reload sends UnitRemoved
    then UnitNew for every unit (11-systemd-facts D). A round already past its quiet check (here:
    waiting for the pods) went on with a cache the UnitRemoveds had emptied, and wrote the reserved
    slices, which the diff may create, with what systemd already held. The round is dropped: the
    full re-read after the reload decides. Also when the reload ended while the round waited."""
    start_pods(fake_systemd, *NODE_UNITS)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=RESERVED) as h:
            assert h.memory("kube.slice")["MemoryMin"] == 300 * MI
            fake_systemd.clear_calls()
            midway = await reload_during_a_held_fetch(h, fake_systemd, ["kube.slice"], how)
            assert midway == []
            assert "GetAll" in [c.method for c in fake_systemd.calls]
            assert fake_systemd.writes == []
    run(body())


def test_a_daemon_reload_costs_one_read_per_unit(fake_systemd, tmp_path):
    """A daemon-reload sends UnitRemoved and UnitNew for every unit before Reloading(false): the
    full re-read after it serves those UnitNew too. Seen in the VM: two GetAll per unit (24 for
    12 units), the second a repeat of the first."""
    start_pods(fake_systemd, *NODE_UNITS)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=RESERVED) as h:
            await h.settle()
            fake_systemd.clear_calls()
            fake_systemd.emit_reloading(True)
            for unit in NODE_UNITS:
                memory = h.memory(unit)
                fake_systemd.remove_unit(unit)
                fake_systemd.add_unit(unit, memory=memory)
            fake_systemd.emit_reloading(False)
            await until(lambda: len(fake_systemd.calls_to("GetAll")) >= len(NODE_UNITS))
            await asyncio.sleep(0.5)
            await h.settle()
            assert units_read(fake_systemd) == sorted(NODE_UNITS)
            assert fake_systemd.writes == []
    run(body())


@pytest.mark.parametrize("how", RELOADS)
def test_a_pod_list_that_arrives_while_systemd_reloads_drops_no_carried_pod(fake_systemd, tmp_path, how):
    """A pod the kubelet no longer lists keeps its protection while its slice runs (carry_over asks
    the cache). A daemon-reload's UnitRemoveds empty the cache until the re-read: a pod list that
    arrived then found no slice running, and the pod was dropped for good. The list is now asked
    for again after the re-read."""
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", GPOD, BPOD, GCTR, BCTR)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE]) as h:
            h.source.items = [GUARANTEED]
            h.fetch_now()
            await h.settle()
            assert len(h.daemon.intake.pods) == 2  # carried over: its slice still runs
            fake_systemd.clear_calls()
            midway = await reload_during_a_held_fetch(h, fake_systemd, [BCTR, BPOD], how)
            assert midway == []
            assert {p.uid for p in h.daemon.intake.pods} == {G_UID, B_UID}
            assert h.memory("kubepods-burstable.slice")["MemoryLow"] == 256 * MI
            assert fake_systemd.writes == []
    run(body())
