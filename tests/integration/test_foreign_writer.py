"""Someone else writes the units we manage (issues 15 and 29): found, counted, named, put back.

Two kinds of writer (drift.WRITERS):
* through systemd: a v1.37 kubelet with its own Memory QoS gate on (the default) rewrites
  kubepods.slice MemoryMin and kubepods-burstable.slice MemoryLow every minute, explicit zeros
  under its default policy (the model of issue 29; issue 41 measures the real one); libcontainer's Set sends them over
  D-Bus and then writes the files too;
* the cgroup file alone (`fake.write_cgroup_file`): an agent that writes cgroupfs for its own
  Memory QoS (koordlet), a person. systemd still holds ours; the kernel does not.
systemd sends no signal for either; the daemon reads the upper slices' cgroups whenever one of
their files is written (inotify) and on a timer, re-reads them from systemd when they differ, and
the next round puts its values back through systemd (the same values again when systemd still
holds them: it then re-writes every memory file of the unit). Pod slices and container scopes are
compared with their cgroups at the full timer resync. The real thing: e2e 55-foreign-writer.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from harness import Harness, run, until
from prereq import require
from test_daemon import BCTR, BPOD, BURSTABLE, GUARANTEED, NODE_UNITS, RESERVED, behind_our_back, start_pods

import memqos_systemd.agenda as agenda_mod
from memqos_systemd.cgroupfs import Cgroupfs, read_cgroup_memory
from memqos_systemd.drift import FIGHT_WRITES

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def inotify(tmp_path):
    """The daemon finds a write to the upper slices' files through inotify (Cgroupfs.watch_notifier)
    within the 2 s these tests allow, where its idle timer alone takes 5 s: a machine that cannot
    give an inotify instance on tmp_path (max_user_instances used up) skips them, CI fails."""
    fs = Cgroupfs(tmp_path)
    require(fs.watch_notifier() is not None, "no inotify instance on the test's directory")
    fs.close_notifier()


def foreign(h: Harness, level: str, writer: str = "systemd") -> float:
    return h.metrics.registry.get_sample_value("memqos_foreign_writes_total", {"level": level, "writer": writer}) or 0


def kernel(fake, unit: str) -> dict:
    return read_cgroup_memory(fake.cgroup_dir(unit))


def journal(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


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
                # Found as the files are written (inotify), the first as fast as the next: not at the
                # idle watch's next tick (5 s).
                await until(lambda: all(h.memory(u) == v for u, v in planned.items()), timeout=2)
                written = {u for u, _ in h.sets()}
                assert written == set(planned), written  # only what was changed is written back
                assert foreign(h, "node") == minute + 1 == foreign(h, "qos")
            assert foreign(h, "node", "cgroupfs") == 0
    with caplog.at_level(logging.WARNING, logger="memqos_systemd"):
        run(body())
    lines = [r.getMessage() for r in caplog.records if "changed without us" in r.getMessage()]
    assert len(lines) == 2, lines  # once an hour per unit: the three minutes log one line each
    node = next(line for line in lines if line.startswith("kubepods.slice:"))
    assert "MemoryMin" in node and "-> 0" in node and "kubelet's own Memory QoS" in node
    assert "companion: auto" in node


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
            assert foreign(h, "pod") == 1
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


# ---- the cgroup file alone (issue 29) ---------------------------------------------------------------
def test_a_cgroupfs_writer_on_the_upper_slices_is_put_back_through_systemd_at_once(fake_systemd, tmp_path, caplog):
    """systemd still holds ours, the kernel shows zeros: the same values are set again over D-Bus
    (the stand-in, like systemd, then re-writes every memory file of the unit), counted as a
    cgroupfs writer and named so, once an hour per unit."""
    start_pods(fake_systemd, *NODE_UNITS)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=RESERVED) as h:
            await h.settle()
            planned = {u: kernel(fake_systemd, u) for u in ("kubepods.slice", "kubepods-burstable.slice", "kube.slice")}
            held = {u: h.memory(u) for u in planned}
            for round_ in range(2):
                fake_systemd.clear_calls()
                fake_systemd.write_cgroup_file("kubepods.slice", MemoryMin=0, MemoryLow=0)
                fake_systemd.write_cgroup_file("kubepods-burstable.slice", MemoryLow=0)
                fake_systemd.write_cgroup_file("kube.slice", MemoryMin=0)
                # Found as the files are written (inotify), not at the idle watch's tick (5 s).
                await until(lambda: all(kernel(fake_systemd, u) == v for u, v in planned.items()), timeout=2)
                assert {u: h.memory(u) for u in planned} == held  # systemd's values never moved
                sent = sorted((u, dict(p)) for u, p in h.sets())
                assert sent == [("kube.slice", {"MemoryMin": held["kube.slice"]["MemoryMin"]}),
                                ("kubepods-burstable.slice", {"MemoryLow": held["kubepods-burstable.slice"]["MemoryLow"]}),
                                ("kubepods.slice", {"MemoryMin": held["kubepods.slice"]["MemoryMin"],
                                                    "MemoryLow": held["kubepods.slice"]["MemoryLow"]})], sent
                assert [foreign(h, lv, "cgroupfs") for lv in ("node", "qos", "reserved")] == [round_ + 1] * 3
                assert foreign(h, "node", "systemd") == 0
                await h.settle()  # nothing more to send: the kernel shows systemd's values again
                assert len(h.sets()) == 3
    with caplog.at_level(logging.WARNING, logger="memqos_systemd"):
        run(body())
    lines = journal(caplog, "changed without us")
    assert len(lines) == 3, lines  # once an hour per unit (and kind of writer)
    node = next(line for line in lines if line.startswith("kubepods.slice:"))
    assert "in its cgroup file, around systemd" in node and "a cgroupfs writer" in node and "-> 0" in node


def test_through_systemd_then_the_file_as_libcontainer_does(fake_systemd, tmp_path):
    """libcontainer's systemd driver sends the kubelet's values over D-Bus, then writes the files:
    whichever of the two the daemon finds first, the plan is back in systemd and the kernel."""
    start_pods(fake_systemd, *NODE_UNITS)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=RESERVED) as h:
            await h.settle()
            held, shown = h.memory("kubepods.slice"), kernel(fake_systemd, "kubepods.slice")
            for _ in range(3):
                behind_our_back(fake_systemd, "kubepods.slice", MemoryMin=0)
                fake_systemd.write_cgroup_file("kubepods.slice", MemoryMin=0)
                await until(lambda: h.memory("kubepods.slice") == held and kernel(fake_systemd, "kubepods.slice") == shown,
                            timeout=2)
                # The file write landing after our put-back, as it may: put back again.
                fake_systemd.write_cgroup_file("kubepods.slice", MemoryMin=0)
                await until(lambda: kernel(fake_systemd, "kubepods.slice") == shown, timeout=2)
                await asyncio.sleep(agenda_mod.KERNEL_DRIFT_GAP)
            assert foreign(h, "node", "systemd") == 3 and foreign(h, "node", "cgroupfs") >= 3
    run(body())


@pytest.mark.parametrize("writer", ["cgroupfs", "systemd"])
def test_a_pod_slice_or_container_scope_written_behind_our_back_is_put_back_by_the_full_resync(
        fake_systemd, tmp_path, monkeypatch, writer):
    """Pod slices and scopes are not watched (220 of them on a full node): the full timer resync
    compares their cgroups with the cache, and reads over D-Bus those that differ. Each kind of
    writer is then put back: a writer must not win for longer than one full resync."""
    monkeypatch.setattr(agenda_mod, "FULL_RESYNC_EVERY", 1)  # every timer resync is the full one
    start_pods(fake_systemd, "kubepods.slice", "kubepods-burstable.slice", "kube.slice")
    fake_systemd.add_unit(BPOD)
    fake_systemd.add_unit(BCTR, slice=BPOD)  # with its cgroup directory

    async def body():
        async with Harness(fake_systemd, tmp_path, [BURSTABLE], config=RESERVED) as h:
            await h.settle()
            await h.resync_now()  # the new pod slice, cached from its cgroup, read once over D-Bus
            want = {u: (h.memory(u), kernel(fake_systemd, u)) for u in (BPOD, BCTR)}
            assert want[BPOD][1]["MemoryLow"] > 0 and want[BCTR][1]["MemoryHigh"] < 1 << 40
            fake_systemd.clear_calls()
            for unit, props in ((BPOD, {"MemoryLow": 0}), (BCTR, {"MemoryLow": 0, "MemoryHigh": 1 << 40})):
                if writer == "cgroupfs":
                    fake_systemd.write_cgroup_file(unit, **props)
                else:
                    behind_our_back(fake_systemd, unit, **props)
            await h.settle()
            assert h.sets() == []  # not watched: nothing happens before the full resync
            await h.resync_now()
            await until(lambda: all((h.memory(u), kernel(fake_systemd, u)) == w for u, w in want.items()), timeout=3)
            assert sorted(u for u, _ in h.sets()) == [BCTR, BPOD]
            assert foreign(h, "pod", writer) == 1 and foreign(h, "container", writer) == 1
    run(body())


def test_a_unit_written_again_and_again_is_fought_over_said_once_and_kept_for_status(fake_systemd, tmp_path,
                                                                                     caplog):
    """More than FIGHT_WRITES writes behind our back within the window: ours is still put back every
    time; the journal says it once, and the fight is kept in /run for `status` and `check`."""
    start_pods(fake_systemd, *NODE_UNITS)
    fights_path = tmp_path / "fights.json"

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=RESERVED,
                           fights_path=fights_path) as h:
            await h.settle()
            shown = kernel(fake_systemd, "kubepods.slice")
            for n in range(FIGHT_WRITES + 2):
                fake_systemd.write_cgroup_file("kubepods.slice", MemoryMin=0)
                await until(lambda: kernel(fake_systemd, "kubepods.slice") == shown, timeout=2)
                assert fights_path.exists() == (n >= FIGHT_WRITES)
                await asyncio.sleep(agenda_mod.KERNEL_DRIFT_GAP)
            assert foreign(h, "node", "cgroupfs") == FIGHT_WRITES + 2
    with caplog.at_level(logging.WARNING, logger="memqos_systemd"):
        run(body())
    said = journal(caplog, "two writers are fighting")
    assert len(said) == 1 and said[0].startswith("kubepods.slice: written behind our back 4 times"), said
    assert "in its cgroup file" in said[0] and "keeps putting its values back" in said[0]
    doc = json.loads(fights_path.read_text())
    assert [(u["unit"], u["level"], u["writers"], u["writes"]) for u in doc["units"]] == [
        ("kubepods.slice", "node", ["cgroupfs"], FIGHT_WRITES + 2)]


def test_what_the_kernel_lost_while_the_daemon_was_stopped_is_put_back_as_it_starts(fake_systemd, tmp_path):
    """Its first read of every unit compares each with its cgroup too: a pod slice's zero written
    while no daemon ran is put back by the first round, not at the first full resync."""
    start_pods(fake_systemd, *NODE_UNITS)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=RESERVED) as h:
            await h.settle()
            shown = kernel(fake_systemd, BPOD)
        fake_systemd.write_cgroup_file(BPOD, MemoryLow=0)
        fake_systemd.clear_calls()
        (tmp_path / "again").mkdir()
        async with Harness(fake_systemd, tmp_path / "again", [GUARANTEED, BURSTABLE], config=RESERVED,
                           cgroupfs=Cgroupfs(tmp_path / "cgroup")) as h:
            assert kernel(fake_systemd, BPOD) == shown  # ready: its first round has put it back
            assert [u for u, _ in h.sets()] == [BPOD]
            assert foreign(h, "pod", "cgroupfs") == 1
    run(body())


class Looked(Cgroupfs):
    """The watch's looks, each with what it reported (Cgroupfs.watch: the units whose cgroup
    differs from what the daemon expects), for a test to wait on the looks themselves rather than
    on a count of the timer's ticks. Without `inotify`: a node where inotify cannot be had (no
    instance left), the watch's timer alone."""

    def __init__(self, root, inotify: bool):
        super().__init__(root)
        self.inotify = inotify
        self.looks: list[list[str]] = []

    def watch_notifier(self):
        return super().watch_notifier() if self.inotify else None

    def watch(self, held, page_size, skip=()):
        found = super().watch(held, page_size, skip)
        self.looks.append(list(found))
        return found


@pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "timer alone"])
def test_a_cgroup_showing_more_protection_than_systemd_holds_is_read_once_not_at_every_look(
        fake_systemd, tmp_path, inotify):
    """A MemoryLow raised in the file alone is left alone (reconcile.kernel_lost: more protection,
    as a parent's DefaultMemoryLow= shows too): systemd is asked once, and what the cgroup showed
    is what the watch expects from then on (Observer.left), not at each look of the watch (every
    KERNEL_WATCH_INTERVAL after a drift), which cost PID 1 two GetAll a second and the daemon a
    round for as long as the value stayed. A second write is looked at again.

    Waited on as events: the read that records what was left, then four looks of the watch
    (counted as they happen, whatever paces them). A round for another reason (the pod source's
    poll, every pollInterval) is not the watch's doing, so rounds are not counted: a report of the
    watch is what asks for a round, and there is none after the first."""
    from fakesystemd import unit_path
    start_pods(fake_systemd, *NODE_UNITS)
    cgroupfs = Looked(tmp_path / "cgroup", inotify)
    found = 2 if inotify else 2 + agenda_mod.KERNEL_WATCH_IDLE  # the idle watch's timer
    qos = "kubepods-burstable.slice"

    def reads() -> int:
        return sum(c.path == unit_path(qos) for c in fake_systemd.calls_to("GetAll"))

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=RESERVED,
                           cgroupfs=cgroupfs) as h:
            await h.settle()
            held = h.memory(qos)
            fake_systemd.clear_calls()
            fake_systemd.write_cgroup_file(qos, MemoryLow=held["MemoryLow"] + (64 << 20))
            await until(lambda: reads() == 1 and qos in h.daemon.observer.left, timeout=found)
            after_read = len(cgroupfs.looks)
            await until(lambda: len(cgroupfs.looks) >= after_read + 4,  # four looks of the close watch
                        timeout=4 * agenda_mod.KERNEL_WATCH_INTERVAL + 2)
            assert [look for look in cgroupfs.looks[after_read:] if look] == []
            assert reads() == 1 and h.sets() == []
            fake_systemd.write_cgroup_file(qos, MemoryLow=held["MemoryLow"] + (128 << 20))
            await until(lambda: reads() == 2, timeout=found)
            assert h.memory(qos) == held and h.sets() == []
    run(body())
