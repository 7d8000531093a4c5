"""Node facts on fake /proc and /sys trees: meminfo, preflight, hotplug watcher, cgroup reads."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from memqos_systemd import node
from memqos_systemd.node import (
    Finding, MemoryChange, MemoryWatcher, NodeError, check_node, kernel_version,
    page_size, parse_mountinfo, read_meminfo, systemd_version,
)
from prereq import require

MEMINFO = """\
MemTotal:       16303848 kB
MemFree:          812364 kB
MemAvailable:    9482112 kB
HugePages_Total:       0
"""


# ---------------------------------------------------------------- meminfo

def test_meminfo(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text(MEMINFO)
    assert read_meminfo(f) == 16303848 * 1024


def test_meminfo_real():
    assert read_meminfo() > 0


@pytest.mark.parametrize("text,msg", [
    ("MemFree: 1 kB\n", "no MemTotal"),
    ("MemTotal: lots kB\n", "cannot parse"),
    ("MemTotal: 0 kB\n", "MemTotal is 0"),
    ("", "no MemTotal"),
])
def test_meminfo_bad(tmp_path, text, msg):
    f = tmp_path / "meminfo"
    f.write_text(text)
    with pytest.raises(NodeError, match=msg):
        read_meminfo(f)


def test_meminfo_missing_is_an_oserror(tmp_path):
    # The daemon catches OSError/ValueError around capacity reads.
    with pytest.raises(OSError, match="cannot read"):
        read_meminfo(tmp_path / "nope")


def test_page_size():
    assert page_size() > 0 and page_size() & (page_size() - 1) == 0


# ---------------------------------------------------------------- preflight on fake trees

UNIFIED = ("30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4"
           " - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n")
UNIFIED_NO_RECURSIVEPROT = ("30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4"
                            " - cgroup2 cgroup2 rw,nsdelegate\n")
HYBRID = """\
31 23 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
32 31 0:29 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
33 31 0:30 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
35 31 0:32 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,memory
"""
V1 = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
"""
PROC_MOUNTS = "22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n"


def fake_node(tmp_path: Path, mountinfo: str, controllers: str | None = "cpuset cpu io memory hugetlb pids") -> dict:
    cg = tmp_path / "sys/fs/cgroup"
    cg.mkdir(parents=True)
    if controllers is not None:
        (cg / "cgroup.controllers").write_text(controllers + "\n")
    mi = tmp_path / "proc/self/mountinfo"
    mi.parent.mkdir(parents=True)
    # The fake tree lives under tmp_path: point the mount entries at it.
    mi.write_text(PROC_MOUNTS + mountinfo.replace(" /sys/fs/cgroup", f" {cg}"))
    return {"cgroup_root": cg, "mountinfo": mi}


def by_what(findings: list[Finding]) -> dict[str, Finding]:
    return {f.what: f for f in findings}


def test_preflight_unified_all_good(tmp_path):
    f = check_node(kernel_release="6.1.0-50-amd64", systemd="252.33-1~deb12u1", **fake_node(tmp_path, UNIFIED))
    assert [(x.what, x.level) for x in f] == [
        ("cgroup v2", "ok"), ("memory controller", "ok"), ("memory_recursiveprot", "ok"),
        ("kernel", "ok"), ("systemd", "ok"),
    ]


def test_preflight_without_recursiveprot_warns(tmp_path):
    f = by_what(check_node(kernel_release="6.1.0", **fake_node(tmp_path, UNIFIED_NO_RECURSIVEPROT)))
    assert f["memory_recursiveprot"].level == "warn"
    assert "without memory_recursiveprot" in f["memory_recursiveprot"].detail
    assert f["cgroup v2"].level == "ok"


def test_preflight_hybrid_is_an_error_and_the_other_checks_still_run(tmp_path):
    node = fake_node(tmp_path, HYBRID, controllers=None)
    (node["cgroup_root"] / "unified").mkdir()
    (node["cgroup_root"] / "unified" / "cgroup.controllers").write_text("\n")  # memory is bound to v1
    f = check_node(kernel_release="6.1.0", systemd=252, **node)
    assert [(x.what, x.level) for x in f] == [
        ("cgroup v2", "error"), ("memory controller", "error"), ("memory_recursiveprot", "warn"),
        ("kernel", "ok"), ("systemd", "ok"),
    ]
    assert "hybrid" in f[0].detail and "systemd.unified_cgroup_hierarchy=1" in f[0].detail
    # Checked on the hybrid's cgroup2 mount, and said where the memory controller went.
    assert f[1].detail == (f"not in {node['cgroup_root']}/unified/cgroup.controllers: it is bound to cgroup v1 at"
                           f" {node['cgroup_root']}/memory")
    assert f[2].detail.startswith(f"{node['cgroup_root']}/unified is mounted without memory_recursiveprot")


def test_preflight_v1_is_an_error_and_the_other_checks_still_run(tmp_path):
    f = check_node(kernel_release="4.19.0", systemd=239, **fake_node(tmp_path, V1, controllers=None))
    assert [(x.what, x.level) for x in f] == [
        ("cgroup v2", "error"), ("memory controller", "error"), ("memory_recursiveprot", "warn"),
        ("kernel", "warn"), ("systemd", "error"),
    ]
    assert "cgroup v1" in f[0].detail and "no cgroup2 hierarchy is mounted" in f[1].detail


def test_preflight_memory_controller_missing(tmp_path):
    f = by_what(check_node(kernel_release="6.1.0", **fake_node(tmp_path, UNIFIED, controllers="cpu io pids")))
    assert f["memory controller"].level == "error"
    assert "cpu io pids" in f["memory controller"].detail


@pytest.mark.parametrize("release,level", [
    ("5.4.0-100-generic", "warn"),
    ("5.8.18", "warn"),
    ("5.9.0", "ok"),
    ("5.10.0-28-amd64", "ok"),
    ("6.1.0-50-amd64", "ok"),
    ("garbage", "warn"),
])
def test_preflight_kernel(tmp_path, release, level):
    f = by_what(check_node(kernel_release=release, **fake_node(tmp_path, UNIFIED)))
    assert f["kernel"].level == level
    if release.startswith("5.4"):
        assert "livelock" in f["kernel"].detail


@pytest.mark.parametrize("version,level", [
    (239, "error"), (240, "ok"), ("252.33-1~deb12u1", "ok"), ("systemd 237 (237-3ubuntu10)", "error"),
    ("v255", "ok"), ("unknown", "warn"),
])
def test_preflight_systemd(tmp_path, version, level):
    f = by_what(check_node(kernel_release="6.1", systemd=version, **fake_node(tmp_path, UNIFIED)))
    assert f["systemd"].level == level
    if level == "error":
        assert "MemoryMin/MemoryLow" in f["systemd"].detail


def test_preflight_systemd_not_given_is_not_checked(tmp_path):
    assert "systemd" not in by_what(check_node(kernel_release="6.1", **fake_node(tmp_path, UNIFIED)))


def test_preflight_mountinfo_unreadable(tmp_path):
    paths = fake_node(tmp_path, UNIFIED)
    os.unlink(paths["mountinfo"])
    f = by_what(check_node(kernel_release="6.1", **paths))
    assert f["mounts"].level == "warn"
    assert f["cgroup v2"].level == "ok"  # cgroup.controllers at the root still says unified
    assert f["memory_recursiveprot"].level == "warn"


def test_preflight_real_node_does_not_crash():
    findings = check_node()
    assert findings and all(f.level in ("ok", "warn", "error") for f in findings)
    assert all(str(f).startswith(f.level + ": ") for f in findings)


def test_mountinfo_escapes():
    m = parse_mountinfo(r"36 35 98:0 /mnt1 /mnt/with\040space rw,noatime master:1 - ext3 /dev/root rw,errors=continue")
    assert m[0].mount_point == "/mnt/with space" and m[0].fstype == "ext3"
    assert {"noatime", "errors=continue"} <= m[0].options


def test_versions():
    assert kernel_version("6.1.0-50-amd64") == (6, 1)
    assert kernel_version("") is None
    assert systemd_version("252.33-1~deb12u1") == 252
    assert systemd_version(None) is None


# ---------------------------------------------------------------- hotplug watcher with a fake monitor

class FakeDevice:
    def __init__(self, action, sys_name):
        self.action = action
        self.sys_name = sys_name


class FakeMonitor:
    def __init__(self):
        self.queue: list = []
        self.filters: list = []
        self.started = False
        self.r, self.w = os.pipe()

    def filter_by(self, subsystem, device_type=None):
        self.filters.append(subsystem)

    def start(self):
        self.started = True

    def fileno(self):
        return self.r

    def poll(self, timeout=None):
        assert timeout == 0, "the watcher must never block the event loop"
        if not self.queue:
            return None
        item = self.queue.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    def close(self):
        os.close(self.r)
        os.close(self.w)


@pytest.fixture
def monitor():
    m = FakeMonitor()
    yield m
    m.close()


@pytest.fixture
def meminfo(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal: 1048576 kB\n")
    return f


def test_watcher_setup(monitor, meminfo):
    w = MemoryWatcher(lambda c: None, monitor=monitor, meminfo=meminfo)
    assert monitor.filters == ["memory"] and monitor.started
    assert w.fileno() == monitor.r
    assert w.capacity == 2**30


def test_watcher_online_rereads_meminfo(monitor, meminfo):
    calls: list[MemoryChange] = []
    w = MemoryWatcher(calls.append, monitor=monitor, meminfo=meminfo)
    # Bookworm onlines nothing by itself: 'add' first, MemTotal unchanged.
    monitor.queue += [FakeDevice("add", "memory32"), FakeDevice("add", "memory33")]
    assert w.poll_events() == [("add", "memory32"), ("add", "memory33")]
    assert calls[-1] == MemoryChange(2**30, 2**30, (("add", "memory32"), ("add", "memory33")))
    assert not calls[-1].changed
    # Then the blocks are onlined: capacity comes from /proc/meminfo, not the event.
    meminfo.write_text("MemTotal: 1572864 kB\n")
    monitor.queue += [FakeDevice("online", "memory32"), FakeDevice("online", "memory33")]
    assert len(w.poll_events()) == 2
    assert len(calls) == 2 and calls[-1].capacity == 1572864 * 1024 and calls[-1].previous == 2**30
    assert calls[-1].changed and w.capacity == 1572864 * 1024


@pytest.mark.parametrize("action", ["offline", "remove"])
def test_watcher_offline_and_remove(monitor, meminfo, action):
    calls = []
    w = MemoryWatcher(calls.append, monitor=monitor, meminfo=meminfo)
    meminfo.write_text("MemTotal: 524288 kB\n")
    monitor.queue.append(FakeDevice(action, "memory9"))
    w.poll_events()
    assert calls[0].capacity == 2**29 and calls[0].events == ((action, "memory9"),)


def test_watcher_ignores_other_actions_and_empty_polls(monitor, meminfo):
    calls = []
    w = MemoryWatcher(calls.append, monitor=monitor, meminfo=meminfo)
    assert w.poll_events() == []
    monitor.queue += [FakeDevice("change", "memory1"), FakeDevice("bind", "memory1"), FakeDevice(None, "x")]
    assert w.poll_events() == []
    assert calls == []


def test_watcher_lost_events_still_reread(monitor, meminfo):
    calls = []
    w = MemoryWatcher(calls.append, monitor=monitor, meminfo=meminfo)
    monitor.queue.append(OSError(errno.ENOBUFS, "No buffer space available"))
    assert w.poll_events() == [("lost", "udev")]
    assert len(calls) == 1


def test_watcher_survives_bad_meminfo_and_bad_callback(monitor, meminfo, caplog):
    def boom(change):
        raise RuntimeError("callback bug")

    w = MemoryWatcher(boom, monitor=monitor, meminfo=meminfo)
    monitor.queue.append(FakeDevice("online", "memory3"))
    assert w.poll_events() == [("online", "memory3")]  # callback raised: logged, not propagated
    assert "callback failed" in caplog.text
    os.unlink(meminfo)
    monitor.queue.append(FakeDevice("online", "memory4"))
    assert w.poll_events() == [("online", "memory4")]
    assert w.capacity == 2**30  # kept


def test_watcher_without_callback(monitor, meminfo):
    w = MemoryWatcher(monitor=monitor, meminfo=meminfo)
    monitor.queue.append(FakeDevice("online", "memory3"))
    assert w.poll_events() == [("online", "memory3")]


def test_watcher_with_asyncio_reader(monitor, meminfo):
    """The daemon's use: loop.add_reader(fileno, poll_events)."""
    import asyncio

    async def main():
        loop = asyncio.get_running_loop()
        got = asyncio.Event()
        seen = []

        def on_change(change):
            seen.append(change)
            got.set()

        w = MemoryWatcher(on_change, monitor=monitor, meminfo=meminfo)

        def on_readable():
            os.read(monitor.r, 1)
            w.poll_events()

        loop.add_reader(w.fileno(), on_readable)
        try:
            monitor.queue.append(FakeDevice("online", "memory5"))
            os.write(monitor.w, b"x")
            await asyncio.wait_for(got.wait(), 5)
        finally:
            loop.remove_reader(w.fileno())
        return seen

    assert asyncio.run(main())[0].events == (("online", "memory5"),)


def test_watcher_real_pyudev_monitor():
    """Production path: pyudev's own Context and netlink Monitor (no memory events expected here)."""
    try:
        import pyudev
    except ImportError:
        pyudev = None
    require(pyudev, "pyudev is not installed (apt-get install python3-pyudev)")
    try:
        w = MemoryWatcher()
    except OSError as e:  # no netlink in this sandbox
        require(False, f"no udev netlink monitor here: {e}")
    assert isinstance(w.fileno(), int) and w.fileno() >= 0
    assert w.poll_events() == [] and w.capacity == read_meminfo()
    assert isinstance(w._monitor, pyudev.Monitor)
    w.close()


# ---------------------------------------------------------------- cgroup reads


def test_node_module_never_writes_files():
    import re
    src = Path(node.__file__).read_text()
    opens = re.findall(r"\bopen\(([^)]*)\)", src)
    # open(path, "rb"), or os.open(path, os.O_RDONLY | ...) with no flag that writes or creates.
    assert opens and all(args.endswith('"rb"') or ("os.O_RDONLY" in args and not re.search(
        r"O_WRONLY|O_RDWR|O_CREAT|O_TRUNC|O_APPEND", args)) for args in opens), opens
    assert not re.search(r"write_text|write_bytes|os\.write|\.write\(", src)


# ---------------------------------------------------------------- systemd node, kubelet's cgroupDriver

def test_systemd_findings_on_a_systemd_node_are_none(tmp_path):
    booted = tmp_path / "run/systemd/system"
    booted.mkdir(parents=True)
    bus = tmp_path / "bus"
    bus.write_text("")  # stands for the socket: only its presence is checked
    assert node.systemd_findings(f"unix:path={bus}", booted_dir=booted) == []


def test_systemd_not_pid1_and_no_bus_socket_are_said_in_those_words(tmp_path, monkeypatch):
    (tmp_path / "proc/1").mkdir(parents=True)
    (tmp_path / "proc/1/comm").write_text("bash\n")
    monkeypatch.setattr(node, "SYSTEM_BUS_SOCKET", str(tmp_path / "system_bus_socket"))
    f = node.systemd_findings(None, booted_dir=tmp_path / "run/systemd/system", proc=tmp_path / "proc")
    assert [(x.level, x.what) for x in f] == [("error", "systemd"), ("error", "system bus")]
    assert f[0].detail.startswith("systemd is not PID 1 on this machine (PID 1 is 'bash')")
    assert f[1].detail == (f"the system bus socket {tmp_path}/system_bus_socket is missing: is dbus running?"
                           f" (systemctl start dbus.socket)")


@pytest.mark.parametrize("address, path", [
    ("unix:path=/run/x/bus", "/run/x/bus"),
    ("unix:path=/run/x/bus,guid=0123", "/run/x/bus"),
    ("unix:path=/tmp/a%20b", "/tmp/a b"),
    ("tcp:host=127.0.0.1,port=1;unix:path=/second", "/second"),
    ("unix:abstract=/tmp/dbus-x", None),
    ("tcp:host=127.0.0.1,port=1", None),
])
def test_only_the_named_socket_is_checked_when_the_bus_address_is_set(tmp_path, address, path):
    # PID 1 is not asked about: DBUS_SYSTEM_BUS_ADDRESS says where systemd is.
    f = node.systemd_findings(address, booted_dir=tmp_path / "absent")
    if path is None:
        assert f == []
    else:
        assert [x.detail for x in f] == [f"the system bus socket {path} is missing: DBUS_SYSTEM_BUS_ADDRESS names it"]


@pytest.mark.parametrize("text, level, needle", [
    ("kind: KubeletConfiguration\ncgroupDriver: systemd\n", "ok", "systemd ("),
    ("kind: KubeletConfiguration\ncgroupDriver: cgroupfs\n", "error", "cgroupfs ("),
    ("kind: KubeletConfiguration\n", "warn", "does not set cgroupDriver: the kubelet then uses cgroupfs"),
    ("- not a map\n", "warn", "is not a KubeletConfiguration"),
    ("cgroupDriver: [\n", "warn", "cannot tell:"),
])
def test_the_kubelets_cgroup_driver_from_its_config(tmp_path, text, level, needle):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(text)
    f = node.kubelet_config_findings(str(cfg))
    assert len(f) == 1 and f[0].what == "kubelet cgroupDriver" and f[0].level == level
    assert needle in f[0].detail and (str(cfg) in f[0].detail)
    if level == "error":
        assert "set cgroupDriver: systemd" in f[0].detail


def test_the_kubelets_config_defaults_to_kubeadms_path_and_is_unknown_when_absent(tmp_path):
    """Without either file: unknown, and how to find out (issue 26: check said nothing)."""
    kubeadm = tmp_path / "var/lib/kubelet/config.yaml"
    [unknown] = node.kubelet_config_findings(None, default=str(kubeadm))
    assert (unknown.level, unknown.what) == ("warn", "kubelet cgroupDriver")
    assert unknown.detail.startswith(f"unknown: no kubeletConfigFile is set and there is no {kubeadm} (kubeadm's)")
    for how in ("ps -o args= -C kubelet", "--cgroup-driver=systemd", "set kubeletConfigFile", "kubepods.slice"):
        assert how in unknown.detail
    kubeadm.parent.mkdir(parents=True)
    kubeadm.write_text("cgroupDriver: systemd\n")
    assert [x.detail for x in node.kubelet_config_findings(None, default=str(kubeadm))] == [f"systemd ({kubeadm})"]
