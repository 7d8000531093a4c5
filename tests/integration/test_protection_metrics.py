"""The protection signals (issue 17) of the running daemon, scraped over real HTTP: the pod and QoS
slices' memory.events, memory.pressure and memory.current, what the plan protects, drift and
holding. The daemon runs on the stand-in (tests/harness.py), whose running slices have cgroup
directories under tmp_path/cgroup; the test writes the kernel's files there."""

from __future__ import annotations

import shutil
import urllib.request

import pytest
from harness import Harness, run, until

from memqos_systemd.cgroupfs import Cgroupfs
from prometheus_client.parser import text_string_to_metric_families
from test_daemon import BPOD, BURSTABLE, GPOD, GUARANTEED, MI, start_pods

pytestmark = pytest.mark.integration

PSI = "some avg10={s10} avg60=0.00 avg300=0.00 total={s}\nfull avg10={f10} avg60=0.00 avg300=0.00 total={f}\n"


def kernel_files(fake, unit: str, *, low=0, oom_kill=0, current=0, some_us=0, full_us=0, full10="0.00") -> None:
    d = fake.cgroup_dir(unit)
    d.mkdir(parents=True, exist_ok=True)
    (d / "memory.events").write_text(f"low {low}\nhigh 0\nmax 0\noom {oom_kill}\noom_kill {oom_kill}\n"
                                     "oom_group_kill 0\n")
    (d / "memory.current").write_text(f"{current}\n")
    (d / "memory.pressure").write_text(PSI.format(s10="0.00", s=some_us, f10=full10, f=full_us))


def scrape(server) -> dict[str, dict[tuple, float]]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(server.url, timeout=5) as r:
        text = r.read().decode()
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def pod_labels(pod: str, qos: str, **more) -> tuple:
    return tuple(sorted({"namespace": "ns", "pod": pod, "qos_class": qos, **more}.items()))


def test_pod_and_qos_signals_are_read_at_each_scrape_and_go_with_the_pod(fake_systemd, tmp_path):
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", GPOD, BPOD)
    kernel_files(fake_systemd, BPOD, low=13604, current=300 * MI, some_us=2_500_000, full_us=1_250_000, full10="3.50")
    kernel_files(fake_systemd, GPOD, oom_kill=1, current=500 * MI)
    kernel_files(fake_systemd, "kubepods.slice", full_us=4_000_000)
    kernel_files(fake_systemd, "kubepods-burstable.slice", some_us=7_000_000)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE]) as h:
            server = h.metrics.serve("127.0.0.1:0")
            try:
                s = scrape(server)
                events = s["memqos_pod_memory_events_total"]
                assert events[pod_labels("b", "Burstable", event="low")] == 13604
                assert events[pod_labels("g", "Guaranteed", event="oom_kill")] == 1
                assert {dict(k)["event"] for k in events} == {"low", "high", "max", "oom", "oom_kill"}
                pressure = s["memqos_pod_memory_pressure_seconds_total"]
                assert pressure[pod_labels("b", "Burstable", kind="some")] == 2.5
                assert pressure[pod_labels("b", "Burstable", kind="full")] == 1.25
                assert s["memqos_pod_memory_usage_bytes"][pod_labels("b", "Burstable")] == 300 * MI
                protected = s["memqos_pod_memory_protected_bytes"]
                assert protected[pod_labels("b", "Burstable", kind="low")] == 256 * MI  # Tiered: MemoryLow
                assert protected[pod_labels("b", "Burstable", kind="min")] == 0
                assert protected[pod_labels("g", "Guaranteed", kind="min")] == 512 * MI
                qos = s["memqos_qos_memory_pressure_seconds_total"]
                assert qos[(("kind", "full"), ("qos_class", "all"))] == 4.0
                assert qos[(("kind", "some"), ("qos_class", "Burstable"))] == 7.0
                assert s["memqos_units_drifted"][()] == 0 and s["memqos_holding"][()] == 0

                # Read at the scrape: a new count shows at once.
                kernel_files(fake_systemd, BPOD, low=13700)
                assert scrape(server)["memqos_pod_memory_events_total"][pod_labels("b", "Burstable", event="low")] \
                    == 13700
                # The pod goes: the source drops it and its slice is removed; its series go with it.
                h.source.items = [GUARANTEED]
                fake_systemd.remove_unit(BPOD)
                shutil.rmtree(fake_systemd.cgroup_dir(BPOD), ignore_errors=True)
                h.fetch_now()
                await until(lambda: not any(dict(k)["pod"] == "b" for k in
                                            scrape(server).get("memqos_pod_memory_protected_bytes", {})))
                s = scrape(server)
                for name in ("memqos_pod_memory_events_total", "memqos_pod_memory_pressure_seconds_total",
                             "memqos_pod_memory_usage_bytes"):
                    assert {dict(k)["pod"] for k in s[name]} == {"g"}, name
            finally:
                server.close()
    run(body())


def test_effective_and_lent_protection_per_class_at_each_scrape(fake_systemd, tmp_path):
    """What the kernel protects now per QoS class (issue 35), from the files the daemon's values
    reached (the stand-in writes memory.min and memory.low as systemd applies them) and the usage:
    the BestEffort slice, which claims nothing, is lent kubepods.slice's unclaimed memory.min under
    memory_recursiveprot, and that shows, read again at each scrape."""
    (tmp_path / "mounts").write_text(f"cgroup2 {tmp_path / 'cgroup'} cgroup2 rw,nsdelegate,memory_recursiveprot 0 0\n")
    besteffort = "kubepods-besteffort.slice"
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", besteffort, GPOD, BPOD)
    kernel_files(fake_systemd, GPOD, current=382 * MI)
    kernel_files(fake_systemd, BPOD, current=300 * MI)
    kernel_files(fake_systemd, "kubepods-burstable.slice", current=300 * MI)
    kernel_files(fake_systemd, besteffort, current=1000 * MI)
    kernel_files(fake_systemd, "kubepods.slice", current=1682 * MI)

    def by_class(s, family):
        return {(dict(k)["qos_class"], dict(k)["kind"]): v / MI for k, v in s[family].items()}

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE],
                           cgroupfs=Cgroupfs(tmp_path / "cgroup", mounts=tmp_path / "mounts")) as h:
            server = h.metrics.serve("127.0.0.1:0")
            try:
                s = scrape(server)
                # Tiered: kubepods min 512 (G), low 256 (B). The G pod claims its usage 382 of min:
                # 130 left, lent over the unprotected usage 1300 (B 300, BE 1000): 30 and 100.
                # Low: the Burstable slice claims all 256: nothing left to lend.
                assert by_class(s, "memqos_effective_protection_bytes") == {
                    ("Guaranteed", "min"): 382, ("Guaranteed", "low"): 0, ("Burstable", "min"): 30,
                    ("Burstable", "low"): 256, ("BestEffort", "min"): 100, ("BestEffort", "low"): 0,
                    ("all", "min"): 512, ("all", "low"): 256}
                lent = by_class(s, "memqos_lent_protection_bytes")
                assert {k: v for k, v in lent.items() if v} == {("Burstable", "min"): 30, ("BestEffort", "min"): 100}
                assert s["memqos_memory_recursiveprot"] == {(): 1}

                # BestEffort grows to 2300: U - S = 2600, so 130 * 300 / 2600 = 15 and 130 * 2300 / 2600 = 115.
                kernel_files(fake_systemd, besteffort, current=2300 * MI)
                kernel_files(fake_systemd, "kubepods.slice", current=2982 * MI)
                lent = by_class(scrape(server), "memqos_lent_protection_bytes")
                assert (lent[("Burstable", "min")], lent[("BestEffort", "min")]) == (15, 115)
            finally:
                server.close()
    run(body())
