"""cgroupfs.py: where a unit's cgroup is, and what is read there (and the one file written)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prereq import require

from memqos_systemd import cgroup_tree, cgroupfs
from memqos_systemd.cgroup_tree import cgroup_path, kernel_shows
from memqos_systemd.cgroupfs import Cgroupfs, dir_of_control_group, read_memory_events, read_pressure, read_value
from memqos_systemd.quantity import UINT64_MAX

SCOPE = "cri-containerd-" + "b" * 64 + ".scope"
POD = "kubepods-burstable-pod8b3c7d2e_4f5a_6b7c_9d1e_3f4a5b6c7d8e.slice"


def test_dir_of_control_group(tmp_path):
    cg = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice"
    assert dir_of_control_group(cg, tmp_path) == tmp_path / "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice"
    assert dir_of_control_group(cg) == Path("/sys/fs/cgroup" + cg)
    assert dir_of_control_group("") is None and dir_of_control_group(None) is None
    assert dir_of_control_group("/", tmp_path) == tmp_path


@pytest.mark.parametrize("bad", ["relative.slice", "/a/../../etc", "/./x", "/a\0b"])
def test_dir_of_control_group_refuses_escapes(bad):
    with pytest.raises(ValueError):
        dir_of_control_group(bad)


def test_read_memory_events(tmp_path):
    (tmp_path / "memory.events").write_text("low 3\nhigh 1207\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n")
    assert read_memory_events(tmp_path) == {"low": 3, "high": 1207, "max": 0, "oom": 0, "oom_kill": 0,
                                            "oom_group_kill": 0}


def test_read_memory_events_gone_and_garbage(tmp_path):
    assert read_memory_events(tmp_path / "vanished.scope") == {}
    (tmp_path / "memory.events").write_text("high x\nweird\nmax 2\n")
    assert read_memory_events(tmp_path) == {"max": 2}


def test_read_pressure(tmp_path):
    (tmp_path / "memory.pressure").write_text("some avg10=1.50 avg60=0.20 avg300=0.00 total=2500000\n"
                                              "full avg10=0.75 avg60=0.10 avg300=0.00 total=1250001\n")
    p = read_pressure(tmp_path)
    assert p["some"] == {"avg10": 1.5, "avg60": 0.2, "avg300": 0.0, "total": 2.5}
    assert p["full"]["avg10"] == 0.75 and p["full"]["total"] == 1.250001
    # No PSI (psi=0, an old kernel), a gone cgroup, garbage: nothing, never an exception.
    assert read_pressure(tmp_path / "gone") == {}
    (tmp_path / "memory.pressure").write_text("some avg10=x total=\nfull\nnoise avg10=1 total=5\n")
    assert read_pressure(tmp_path) == {}


def test_read_value(tmp_path):
    (tmp_path / "memory.current").write_text("314572800\n")
    (tmp_path / "memory.max").write_text("max\n")
    (tmp_path / "bad").write_text("12x\n")
    assert read_value(tmp_path / "memory.current") == 314572800
    assert read_value(tmp_path / "memory.max") == UINT64_MAX
    assert read_value(tmp_path / "bad") is None and read_value(tmp_path / "gone") is None


@pytest.mark.parametrize("unit, parent, path", [
    ("kubepods.slice", None, "kubepods.slice"),
    ("kubepods-burstable.slice", None, "kubepods.slice/kubepods-burstable.slice"),
    (POD, None, f"kubepods.slice/kubepods-burstable.slice/{POD}"),
    (SCOPE, "kubepods.slice/x.slice", f"kubepods.slice/x.slice/{SCOPE}"),
    (SCOPE, None, SCOPE),
])
def test_cgroup_path(unit, parent, path):
    assert cgroup_path(unit, parent) == path


def test_a_placed_plan_names_its_units_dirs(tmp_path):
    from memqos_systemd.plan import Plan, UnitPlan

    units = (UnitPlan("kubepods.slice", "node", None), UnitPlan("kubepods-burstable.slice", "qos", "kubepods.slice"),
             UnitPlan(POD, "pod", "kubepods-burstable.slice"), UnitPlan(SCOPE, "container", POD))
    plan = Plan(1 << 30, 1 << 30, units)
    assert plan.cgroup_paths[SCOPE] == f"kubepods.slice/kubepods-burstable.slice/{POD}/{SCOPE}"
    fs = Cgroupfs(tmp_path)
    where = tmp_path / "kubepods.slice" / "kubepods-burstable.slice" / POD / SCOPE
    assert fs.dir_of(SCOPE) is None  # not placed, not on disk
    dirs = fs.place(plan.cgroup_paths)
    assert fs.dir_of(SCOPE) == where == dirs[SCOPE]
    assert dirs[POD] == where.parent and dirs["kubepods.slice"] == tmp_path / "kubepods.slice"
    assert fs.place(dict(plan.cgroup_paths)) is dirs  # made again only for other paths, compared by value
    moved = {**plan.cgroup_paths, SCOPE: f"kubepods.slice/{SCOPE}"}
    assert fs.place(moved)[SCOPE] == fs.dir_of(SCOPE) == tmp_path / "kubepods.slice" / SCOPE


def test_flat_keyed_and_psi_totals_keep_the_kernels_digits():
    events = b"low 3\nhigh 1207\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n"
    assert cgroup_tree.flat_keyed(events) == {b"low": b"3", b"high": b"1207", b"max": b"0", b"oom": b"0",
                                           b"oom_kill": b"0", b"oom_group_kill": b"0"}
    # Anything else line by line: a line that is not `key digits` is left out.
    assert cgroup_tree.flat_keyed(b"high x\nweird\nmax 2\n") == {b"max": b"2"}
    assert cgroup_tree.flat_keyed(b"a 1 2\nb 3\n") == {b"b": b"3"}
    assert cgroup_tree.flat_keyed(b"") == {}
    psi = b"some avg10=1.50 avg60=0.20 avg300=0.00 total=2500000\nfull avg10=0.75 avg60=0.10 avg300=0.00 total=7\n"
    assert cgroup_tree.psi_totals(psi) == {b"some": b"2500000", b"full": b"7"}
    assert cgroup_tree.psi_totals(b"some avg10=x total=\nfull total=-1\n") == {}


def test_kept_files_read_with_pread_and_close_what_is_no_longer_asked(tmp_path):
    import os

    def open_fds():
        return len(os.listdir("/proc/self/fd"))
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("1\n")
    b.write_text("2\n")
    files = cgroupfs.KeptFiles(limit=8)  # not from this shell's ulimit -n
    before = open_fds()
    assert files.read(str(a)) == b"1\n" and files.read(str(b)) == b"2\n" and files.read(str(tmp_path / "c")) is None
    assert open_fds() == before + 2 == before + len(files)  # the absent one is not kept
    a.write_text("10\n")  # a new value shows at the next read, as a kernel file's does
    assert files.read(str(a)) == b"10\n" and open_fds() == before + 2
    files.keep_only({str(b)})
    assert open_fds() == before + 1 and files.read(str(b)) == b"2\n"
    full = cgroupfs.KeptFiles(limit=1)
    assert full.read(str(a)) == b"10\n" and full.read(str(b)) == b"2\n" and len(full) == 1  # over: open, read, close
    del files, full
    assert open_fds() == before


def test_kept_files_open_again_a_file_that_fails():
    """A kernfs file whose cgroup was removed fails every read (ENODEV): the descriptor is closed and
    the path opened again, so a cgroup made again at the same place is read, and a gone one is not."""
    import os

    files = cgroupfs.KeptFiles(limit=8)  # not from this shell's ulimit -n
    r, w = os.pipe()  # pread on a pipe fails (ESPIPE), as a kept file of a removed cgroup does (ENODEV)
    os.close(w)
    files._fds["/gone/memory.events"] = r
    assert files.read("/gone/memory.events") is None and len(files) == 0
    try:
        os.fstat(r)
        raise AssertionError("the failing descriptor was not closed")
    except OSError:
        pass


def test_kernel_shows_page_rounded_values():
    held = {"MemoryMin": 0, "MemoryLow": 100_000_000, "MemoryHigh": UINT64_MAX}
    kernel = {"MemoryMin": 0, "MemoryLow": 100_000_000 // 4096 * 4096, "MemoryHigh": UINT64_MAX}
    assert kernel_shows(kernel, held, 4096)
    assert not kernel_shows({**kernel, "MemoryLow": 100_000_000}, held, 4096)
    # Only what is held is compared (companion mode: the kubelet's properties are not ours).
    assert kernel_shows({**kernel, "MemoryHigh": 1 << 30}, {"MemoryMin": 0, "MemoryLow": 100_000_000}, 4096)
    assert not kernel_shows({**kernel, "MemoryMin": 4096}, {"MemoryMin": 0}, 4096)


def test_the_only_write_is_memory_oom_group_back_to_1():
    """cgroupfs.py writes one file: memory.oom.group, the value 1 (docs/DESIGN.md, "The one file we
    write"). Besides, a PSI trigger is registered on memory.pressure (PressureWake): a poll
    registration on our own open file, gone with it, which sets no value of the cgroup's.
    Everything else is read-only."""
    src = Path(cgroupfs.__file__).read_text()
    opens = re.findall(r"os\.open\(([^)]*)\)", src)
    writes = [args for args in opens if "O_RDONLY" not in args]
    assert writes == ['where / "memory.oom.group", os.O_WRONLY',
                      "path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC"] and len(opens) > 2
    assert 'path = self.root / cgroup_path(unit) / "memory.pressure"' in src
    assert re.findall(r"os\.write\(([^)]*)\)", src) == ['fd, b"1"', 'fd, f"some {stall_us} {window_us}".encode(']  # (the regex stops at its ")")
    assert not re.search(r"write_text|write_bytes|open\([^)]*['\"][wa]", src)


# What the watch tests' slices hold, as systemd holds it and as their cgroup files show it.
HELD = {"MemoryMin": 1 << 30, "MemoryLow": 0, "MemoryHigh": UINT64_MAX}


def held_slice(root, unit: str):
    """`unit`'s cgroup under `root`, its memory.min/low/high showing HELD; its directory."""
    where = root / cgroup_path(unit)
    where.mkdir(parents=True)
    for file, text in (("memory.min", str(1 << 30)), ("memory.low", "0"), ("memory.high", "max")):
        (where / file).write_text(text + "\n")
    return where


def test_watch_reports_the_slices_whose_cgroup_differs_and_keeps_its_descriptors(tmp_path):
    import os

    def open_fds():
        return len(os.listdir("/proc/self/fd"))
    fs = Cgroupfs(tmp_path)
    held = HELD
    node = held_slice(tmp_path, "kubepods.slice")
    before = open_fds()
    assert fs.watch({"kubepods.slice": held, "system.slice": held}, 4096) == []  # system.slice: no cgroup yet
    assert open_fds() == before + 3  # kept open for the next call
    (node / "memory.min").write_text("0\n")  # the kubelet's explicit zero
    assert fs.watch({"kubepods.slice": held}, 4096) == ["kubepods.slice"]
    assert open_fds() == before + 3
    assert fs.watch({}, 4096, skip={"kubepods.slice"}) == [] and open_fds() == before + 3  # skipped: kept
    assert fs.watch({}, 4096) == [] and open_fds() == before  # closed once not asked about


def test_the_watch_notifier_is_readable_once_a_watched_file_is_written(tmp_path):
    """inotify (IN_MODIFY) on the files `watch` reads: readable after any write(2) to one of them
    (systemd's as it applies a unit, or a write around it), until drained; a write to a file not
    watched, or reads, leave it quiet. Files watched before the notifier existed are watched too."""
    import select

    def readable(n) -> bool:
        return bool(select.select([n.fileno()], [], [], 0.2)[0])

    fs = Cgroupfs(tmp_path)
    held = HELD
    for unit in ("kubepods.slice", "system.slice"):
        held_slice(tmp_path, unit)
    assert fs.watch({"kubepods.slice": held}, 4096) == []  # opened before the notifier
    n = fs.watch_notifier()
    require(n is not None, "no inotify instance (max_user_instances used up?)")
    assert fs.watch_notifier() is n
    assert fs.watch({"kubepods.slice": held}, 4096) == [] and not readable(n)
    with open(tmp_path / "kubepods.slice/memory.min", "w") as f:  # a cgroupfs writer's zero
        f.write("0\n")
    assert readable(n)
    fs.drain_notifier()
    assert not readable(n)
    (tmp_path / "system.slice/memory.low").write_text("5\n")  # not watched
    assert not readable(n)
    assert fs.watch({"kubepods.slice": held, "system.slice": held}, 4096) == ["kubepods.slice", "system.slice"]
    assert not readable(n)  # reading is not writing
    (tmp_path / "system.slice/memory.high").write_text("max\n")
    assert readable(n)
    fs.drain_notifier()
    assert fs.watch({"kubepods.slice": held}, 4096) == ["kubepods.slice"]  # system.slice closed, unwatched
    fs.drain_notifier()  # (the kernel says IN_IGNORED of each watch removed)
    (tmp_path / "system.slice/memory.low").write_text("0\n")
    assert not readable(n)
    fs.close_notifier()
    assert fs.watch({"kubepods.slice": held}, 4096) == ["kubepods.slice"]  # reading goes on without it


def test_memory_max_is_compared_where_it_is_ours(tmp_path):
    """The BestEffort ceiling: a held MemoryMax is compared with memory.max (the watch, a timer
    resync's trust in the kernel); without one, memory.max is not looked at (the runtime's)."""
    import os
    held = {"MemoryMin": 0, "MemoryLow": 0, "MemoryHigh": UINT64_MAX}
    be = tmp_path / "kubepods.slice" / "kubepods-besteffort.slice"
    be.mkdir(parents=True)
    for file, text in (("memory.min", "0"), ("memory.low", "0"), ("memory.high", "max"), ("memory.max", "1000001"),
                       ("memory.current", "123456789")):
        (be / file).write_text(text + "\n")
    fs = Cgroupfs(tmp_path)
    unit = "kubepods-besteffort.slice"
    assert fs.kernel_values(unit, with_max=True)["MemoryMax"] == 1000001
    assert not kernel_shows(fs.kernel_values(unit, with_max=True), {**held, "MemoryMax": 1000001}, 4096)  # unrounded
    assert kernel_shows(fs.kernel_values(unit), held, 4096)  # not ours: memory.max is not looked at
    (be / "memory.max").write_text(f"{1000001 // 4096 * 4096}\n")
    assert kernel_shows(fs.kernel_values(unit, with_max=True), {**held, "MemoryMax": 1000001}, 4096)  # page-rounded
    before = len(os.listdir("/proc/self/fd"))
    assert fs.watch({unit: held}, 4096) == [] and len(os.listdir("/proc/self/fd")) == before + 3
    assert fs.watch({unit: {**held, "MemoryMax": 500 << 20}}, 4096) == [unit]  # reopened with memory.max
    assert len(os.listdir("/proc/self/fd")) == before + 4
    assert fs.usage(unit) == 123456789 and fs.usage("nothing.slice") is None


def test_owners_seen_reads_usage_low_and_stall_and_none_where_it_cannot(tmp_path):
    fs = Cgroupfs(tmp_path)
    a = "kubepods-burstable-poda.slice"
    where = tmp_path / cgroup_path(a)
    where.mkdir(parents=True)
    (where / "memory.current").write_text("123\n")
    (where / "memory.events").write_text("low 7\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    (where / "memory.pressure").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=4567\n"
                                           "full avg10=0.00 avg60=0.00 avg300=0.00 total=89\n")
    gone = "kubepods-burstable-podb.slice"
    assert fs.owners_seen([a, gone]) == {a: (123, 7, 4567), gone: (None, None, None)}
    (where / "memory.current").write_text("456\n")
    assert fs.owners_seen([a]) == {a: (456, 7, 4567)}  # through the kept descriptor


def test_pressure_wake_is_not_armed_where_no_trigger_can_be_put(tmp_path):
    """A plain file (no PSI: no kernfs poll) or no file at all: not armed, never fires."""
    fs = Cgroupfs(tmp_path)
    wake = fs.pressure_wake()
    assert wake is fs.pressure_wake() and wake.fileno() >= 0
    assert not wake.arm("kubepods.slice", 10_000, 1_000_000) and wake.armed is None
    (tmp_path / "kubepods.slice").mkdir()
    (tmp_path / "kubepods.slice" / "memory.pressure").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    assert not wake.arm("kubepods.slice", 10_000, 1_000_000) and not wake.drain()
    wake.close()
