"""Node facts: memory capacity, page size, preflight checks, memory hotplug.

Everything that reads /proc or /sys takes its paths as arguments, so tests run
against fake trees. Cgroup files are read in cgroupfs.py.

* `read_meminfo()`       MemTotal in bytes (the capacity the planner uses).
* `check_node()`         preflight findings for `memqos-systemd check` and start-up.
* `systemd_findings()`   is systemd PID 1, is the system bus socket there (check, apply).
* `kubelet_config_findings()`  the kubelet's cgroupDriver, from its config file (check).
* `MemoryWatcher`        memory hotplug events from udev (subsystem `memory`);
                         the event is only a trigger, capacity is re-read from
                         /proc/meminfo every time.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

__all__ = [
    "NodeError", "Finding", "MemoryChange", "MemoryWatcher", "read_meminfo", "Capacity", "page_size", "check_node",
    "parse_mountinfo", "kernel_version", "systemd_version", "systemd_findings", "kubelet_config_findings",
    "MIN_KERNEL", "MIN_SYSTEMD", "MEMORY_ACTIONS", "SYSTEM_BUS_SOCKET", "KUBEADM_KUBELET_CONFIG",
]

log = logging.getLogger(__name__)
_service_log = logging.getLogger("memqos_systemd")  # the service's lines, as the daemon logs them

MIN_KERNEL = (5, 9)   # memory.high throttling can livelock before 5.9
MIN_SYSTEMD = 240     # MemoryMin= arrived in 240 (MemoryLow= in 237)
MEMORY_ACTIONS = ("add", "remove", "online", "offline")
_MAX_PROC_BYTES = 1 << 20
# sd_booted(): this directory exists only when systemd is PID 1 (the DaemonSet mounts the node's).
BOOTED_DIR = "/run/systemd/system"
# Where dbus-daemon listens for the system bus (/var/run is a link to /run), and where kubeadm
# writes the kubelet's KubeletConfiguration.
SYSTEM_BUS_SOCKET = "/run/dbus/system_bus_socket"
KUBEADM_KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"


class NodeError(OSError):
    """A node fact could not be read or parsed (the message names the file)."""


def _read_text(path: str | os.PathLike, limit: int = _MAX_PROC_BYTES) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", "replace")


# ------------------------------------------------------------------ capacity

def read_meminfo(path: str | os.PathLike = "/proc/meminfo") -> int:
    """MemTotal in bytes. Raises NodeError when the file is unreadable or has no MemTotal."""
    try:
        text = _read_text(path)
    except OSError as e:
        raise NodeError(f"{path}: cannot read: {e.strerror or e}") from None
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            m = re.fullmatch(r"MemTotal:\s+([0-9]+)(?:\s+(kB))?\s*", line)
            if not m:
                raise NodeError(f"{path}: cannot parse {line.strip()!r}")
            value = int(m.group(1)) * (1024 if m.group(2) else 1)
            if value <= 0:
                raise NodeError(f"{path}: MemTotal is {value}")
            return value
    raise NodeError(f"{path}: no MemTotal line")


class Capacity:
    """The node's memory as the service plans with it (`bytes`), read at start and again at a
    resync or a memory hotplug (`reread`); one that cannot be read keeps the last, said in one line."""

    def __init__(self, read: Callable[[], int]) -> None:
        self.read = read  # read_meminfo, or a test's
        self.bytes = read()

    def reread(self) -> None:
        try:
            capacity = self.read()
        except (OSError, ValueError) as e:
            _service_log.error("cannot read node memory, keeping %d bytes: %s", self.bytes, e)
            return
        if capacity != self.bytes:
            _service_log.info("node memory changed: %d -> %d bytes", self.bytes, capacity)
            self.bytes = capacity


def page_size() -> int:
    return os.sysconf("SC_PAGE_SIZE")


# ------------------------------------------------------------------ preflight

@dataclass(frozen=True)
class Finding:
    level: str  # "ok" | "warn" | "error"
    what: str   # short name of the check, e.g. "cgroup v2"
    detail: str  # one line for people

    def __str__(self) -> str:
        return f"{self.level}: {self.what}: {self.detail}"


@dataclass(frozen=True)
class Mount:
    mount_point: str
    fstype: str
    options: frozenset[str]  # per-mount and super-block options together


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """/proc/self/mountinfo lines -> mounts, in order (later mounts shadow earlier ones)."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        try:
            sep = fields.index("-", 6)
        except ValueError:
            continue
        if len(fields) < sep + 3 or len(fields) < 6:
            continue
        opts = set(fields[5].split(",")) | set(fields[sep + 3].split(",") if len(fields) > sep + 3 else ())
        mounts.append(Mount(_unescape(fields[4]), fields[sep + 1], frozenset(opts)))
    return mounts


def kernel_version(release: str) -> tuple[int, int] | None:
    """'6.1.0-50-amd64' -> (6, 1); None when it does not start with N.N."""
    m = re.match(r"\s*([0-9]+)\.([0-9]+)", release or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def systemd_version(version: object) -> int | None:
    """systemd's Manager.Version ('252.33-1~deb12u1', 'systemd 252 (252.33-1~deb12u1)', 252) -> 252."""
    if isinstance(version, int) and not isinstance(version, bool):
        return version
    m = re.search(r"(?<![0-9.])([0-9]{2,4})(?:[.~\-+ ]|$)", str(version or ""))
    return int(m.group(1)) if m else None


def check_node(*, kernel_release: str | None = None, systemd: object = None,
               cgroup_root: str | os.PathLike = "/sys/fs/cgroup",
               mountinfo: str | os.PathLike = "/proc/self/mountinfo") -> list[Finding]:
    """Preflight findings, in order. `systemd` is systemd's version (int or its Version string);
    None skips that check (the caller asks systemd over D-Bus and checks D-Bus access itself).
    `kernel_release` defaults to platform.release()."""
    if kernel_release is None:
        import platform
        kernel_release = platform.release()
    findings: list[Finding] = []
    root = Path(cgroup_root)
    root_s = os.path.normpath(str(cgroup_root))
    # After an error here the other checks still run (on the cgroup2 mount there is, if any),
    # so one run of `check` lists everything a machine lacks.
    mounts: list[Mount] = []
    try:
        mounts = parse_mountinfo(_read_text(mountinfo, 16 << 20))
    except OSError as e:
        findings.append(Finding("warn", "mounts", f"{mountinfo}: cannot read: {e.strerror or e}"))
    v1 = [m for m in mounts if m.fstype == "cgroup" and (m.mount_point + "/").startswith(root_s + "/")]
    found, v2_dir, v2_mount = _cgroup_v2_finding(mounts, v1, root, root_s)
    findings.append(found)
    findings.append(_memory_controller_finding(v2_dir, root, [m for m in v1 if "memory" in m.options]))
    findings.append(_recursiveprot_finding(v2_dir, v2_mount, root, root_s, mountinfo))
    findings.append(_kernel_finding(kernel_release))
    if systemd is not None:
        findings.append(_systemd_finding(systemd))
    return findings


def _cgroup_v2_finding(mounts: list[Mount], v1: list[Mount], root: Path,
                       root_s: str) -> tuple[Finding, Path | None, Mount | None]:
    """Whether `root` is the unified cgroup2 hierarchy; and the cgroup v2 hierarchy the remaining
    checks look at (the root, or a hybrid's cgroup2 mount; None: none) with its mount."""
    at_root = [m for m in mounts if m.mount_point == root_s]
    root_mount = at_root[-1] if at_root else None
    cgroup2 = [m for m in mounts if m.fstype == "cgroup2"]
    has_controllers = (root / "cgroup.controllers").is_file()
    unified = has_controllers and (root_mount is None or root_mount.fstype == "cgroup2")
    if unified and not v1:
        return Finding("ok", "cgroup v2", f"{root_s} is the unified cgroup2 hierarchy"), root, root_mount
    if cgroup2 or has_controllers:
        where = ", ".join(m.mount_point for m in cgroup2) or root_s
        found = Finding("error", "cgroup v2", f"hybrid cgroup hierarchy: cgroup v1 controllers at {root_s} and cgroup2"
                                              f" only at {where}; boot with systemd.unified_cgroup_hierarchy=1")
        if not has_controllers:
            return found, Path(cgroup2[-1].mount_point), cgroup2[-1]
        return found, root, root_mount
    return (Finding("error", "cgroup v2",
                    f"{root_s} is cgroup v1 ({root_mount.fstype if root_mount else 'no cgroup2 mount'});"
                    f" memory protection needs cgroup v2: boot with systemd.unified_cgroup_hierarchy=1"), None, None)


def _memory_controller_finding(v2_dir: Path | None, root: Path, memory_v1: list[Mount]) -> Finding:
    if v2_dir is None:
        return Finding("error", "memory controller", "no cgroup2 hierarchy is mounted, so none of its"
                                                     " controllers is available")
    try:
        controllers = _read_text(v2_dir / "cgroup.controllers").split()
    except OSError as e:
        return Finding("error", "memory controller", f"{v2_dir / 'cgroup.controllers'}: cannot read: {e.strerror or e}")
    if "memory" in controllers:
        return Finding("ok", "memory controller", "enabled" if v2_dir == root else f"enabled in {v2_dir}")
    if memory_v1:
        return Finding("error", "memory controller", f"not in {v2_dir / 'cgroup.controllers'}: it is bound to cgroup v1"
                                                     f" at {memory_v1[-1].mount_point}")
    return Finding("error", "memory controller", f"not in {v2_dir / 'cgroup.controllers'}"
                                                 f" ({' '.join(controllers) or 'empty'}); is cgroup_disable=memory on"
                                                 f" the kernel command line?")


def _recursiveprot_finding(v2_dir: Path | None, v2_mount: Mount | None, root: Path, root_s: str,
                           mountinfo: str | os.PathLike) -> Finding:
    v2_s = str(v2_dir) if v2_dir is not None else root_s
    if v2_mount is not None and "memory_recursiveprot" in v2_mount.options:
        return Finding("ok", "memory_recursiveprot", f"{v2_s} is mounted with memory_recursiveprot"
                       if v2_dir != root else "mounted with memory_recursiveprot")
    if v2_mount is None:
        return Finding("warn", "memory_recursiveprot", f"no cgroup2 mount found for {v2_s} in {mountinfo}; cannot tell"
                                                       f" whether memory_recursiveprot is on")
    return Finding("warn", "memory_recursiveprot",
                   f"{v2_s} is mounted without memory_recursiveprot: protection does not pass down to pods unless"
                   f" every level sets it (systemd >= 247 mounts it when the kernel supports it)")


def systemd_findings(bus_address: str | None, *, booted_dir: str | os.PathLike = BOOTED_DIR,
                     proc: str | os.PathLike = "/proc") -> list[Finding]:
    """Errors that make this machine no systemd node, in words an operator can act on: systemd
    is not PID 1 (sd_booted(): `booted_dir` exists only when it is), or the system bus socket is
    missing. `bus_address` is DBUS_SYSTEM_BUS_ADDRESS: when set (tests, or another bus on
    purpose), the systemd to talk to is on that bus, so only its socket is checked."""
    findings: list[Finding] = []
    if bus_address is None:
        if not os.path.isdir(booted_dir):
            try:
                pid1 = _read_text(Path(proc) / "1" / "comm", 256).strip() or "?"
            except OSError:
                pid1 = "?"
            findings.append(Finding("error", "systemd", f"systemd is not PID 1 on this machine (PID 1 is {pid1!r}):"
                                                        f" memqos-systemd works only on a node booted with systemd"))
        socket_path: str | None = SYSTEM_BUS_SOCKET
        fix = "is dbus running? (systemctl start dbus.socket)"
    else:
        socket_path = _unix_socket_path(bus_address)
        fix = "DBUS_SYSTEM_BUS_ADDRESS names it"
    if socket_path is not None and not os.path.exists(socket_path):
        findings.append(Finding("error", "system bus", f"the system bus socket {socket_path} is missing: {fix}"))
    return findings


def _unix_socket_path(address: str) -> str | None:
    """The file of the first unix:path= entry of a D-Bus address, or None (abstract, tcp, ...)."""
    for entry in address.split(";"):
        transport, _, params = entry.partition(":")
        if transport != "unix":
            continue
        for param in params.split(","):
            key, _, value = param.partition("=")
            if key == "path" and value:
                return re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), value)
        return None
    return None


def kubelet_config_findings(path: str | None, *, default: str = KUBEADM_KUBELET_CONFIG) -> list[Finding]:
    """The kubelet's cgroupDriver, from `path` (kubeletConfigFile) or, when that is unset, from
    kubeadm's `default` if it exists. When neither is there: unknown, and how to find out."""
    from .config import ConfigError, read_yaml

    if path is None:
        if not os.path.isfile(default):
            return [Finding("warn", "kubelet cgroupDriver",
                            f"unknown: no kubeletConfigFile is set and there is no {default} (kubeadm's);"
                            f" memqos-systemd needs the systemd driver. To check: the kubelet's command line"
                            f" (ps -o args= -C kubelet) has --cgroup-driver=systemd, or cgroupDriver: systemd"
                            f" in the file its --config names (then set kubeletConfigFile to it); with the"
                            f" systemd driver a running kubelet's pods are under /sys/fs/cgroup/kubepods.slice")]
        path = default
    try:
        doc = read_yaml(path, what="kubelet config")
    except ConfigError as e:
        return [Finding("warn", "kubelet cgroupDriver", f"cannot tell: {e}")]
    if not isinstance(doc, dict):
        return [Finding("warn", "kubelet cgroupDriver", f"cannot tell: {path} is not a KubeletConfiguration")]
    driver = doc.get("cgroupDriver")
    if driver == "systemd":
        return [Finding("ok", "kubelet cgroupDriver", f"systemd ({path})")]
    if driver is None or driver == "":
        return [Finding("warn", "kubelet cgroupDriver",
                        f"{path} does not set cgroupDriver: the kubelet then uses cgroupfs, unless its command"
                        f" line says --cgroup-driver=systemd; memqos-systemd needs systemd")]
    shown = driver if isinstance(driver, str) and driver.isprintable() and len(driver) <= 40 else "?"
    return [Finding("error", "kubelet cgroupDriver",
                    f"{shown} ({path}): memqos-systemd works only with the systemd cgroup driver, whose pod"
                    f" slices and container scopes are systemd units; set cgroupDriver: systemd in the kubelet's"
                    f" config and in the container runtime's (SystemdCgroup = true for containerd)")]


def _kernel_finding(release: str) -> Finding:
    version = kernel_version(release)
    if version is None:
        return Finding("warn", "kernel", f"cannot parse kernel release {release!r}")
    if version < MIN_KERNEL:
        return Finding("warn", "kernel",
                       f"kernel {release} is older than {MIN_KERNEL[0]}.{MIN_KERNEL[1]}: memory.high throttling"
                       f" can livelock a cgroup (set memoryThrottlingFactor: null to not set MemoryHigh)")
    return Finding("ok", "kernel", f"kernel {release}")


def _systemd_finding(version: object) -> Finding:
    number = systemd_version(version)
    if number is None:
        return Finding("warn", "systemd", f"cannot parse systemd version {str(version)!r}")
    if number < MIN_SYSTEMD:
        return Finding("error", "systemd", f"systemd {number} is older than {MIN_SYSTEMD}: MemoryMin/MemoryLow"
                                           f" are not supported")
    return Finding("ok", "systemd", f"systemd {number}")


# ------------------------------------------------------------------ hotplug

@dataclass(frozen=True)
class MemoryChange:
    capacity: int              # MemTotal in bytes, re-read after the events
    previous: int | None       # the capacity before (None if it was never read)
    events: tuple[tuple[str, str], ...]  # (action, device name), e.g. ("online", "memory32")

    @property
    def changed(self) -> bool:
        return self.capacity != self.previous


class MemoryWatcher:
    """Memory hotplug events from udev -> `callback(MemoryChange)` (callback optional).

    Production: `MemoryWatcher(cb)` makes a pyudev Context and netlink Monitor.
    Tests pass `monitor=` (anything with filter_by/start/fileno/poll(timeout) whose
    devices have `.action` and `.sys_name`). For asyncio:
    `loop.add_reader(w.fileno(), w.poll_events)`.
    """

    def __init__(self, callback: Callable[[MemoryChange], Any] | None = None, *, context: Any = None, monitor: Any = None,
                 meminfo: str | os.PathLike = "/proc/meminfo", source: str = "udev"):
        self._callback = callback
        self._meminfo = meminfo
        if monitor is None:
            import pyudev
            if context is None:
                context = pyudev.Context()
            monitor = pyudev.Monitor.from_netlink(context, source=source)
        self._monitor = monitor
        self._monitor.filter_by("memory")
        self._monitor.start()
        try:
            self.capacity: int | None = read_meminfo(meminfo)
        except NodeError as e:
            log.warning("memory watcher: %s", e)
            self.capacity = None

    def fileno(self) -> int:
        return self._monitor.fileno()

    def close(self) -> None:
        """Drop the monitor (remove the fd from the event loop first). pyudev closes the
        netlink socket when the Monitor is garbage collected."""
        self._monitor = _Closed()

    def poll_events(self) -> list[tuple[str, str]]:
        """Drain what is pending without blocking; if any memory add/remove/online/offline
        came (or events were lost), re-read capacity and call the callback once.
        Returns the relevant events as (action, device name), with ("lost", "udev") when
        the monitor reported an error (events may have been dropped). Never raises for
        bad events or files."""
        events: list[tuple[str, str]] = []
        for _ in range(10000):  # bounded: a flood is handled over several wake-ups
            try:
                device = self._monitor.poll(timeout=0)
            except OSError as e:
                # e.g. ENOBUFS: the kernel dropped events; capacity may have changed.
                log.warning("memory watcher: udev monitor: %s; re-reading capacity", e.strerror or e)
                events.append(("lost", "udev"))
                break
            if device is None:
                break
            action = getattr(device, "action", None)
            if action in MEMORY_ACTIONS:
                events.append((action, str(getattr(device, "sys_name", "?"))))
        if not events:
            return events
        try:
            capacity = read_meminfo(self._meminfo)
        except NodeError as e:
            log.warning("memory watcher: after %s: %s", _describe(events), e)
            return events
        previous, self.capacity = self.capacity, capacity
        if capacity != previous:
            log.debug("memory hotplug (%s): MemTotal %s -> %d bytes", _describe(events), previous, capacity)
        if self._callback is not None:
            try:
                self._callback(MemoryChange(capacity, previous, tuple(events)))
            except Exception:  # the callback's fault; keep the reader alive
                log.exception("memory watcher: callback failed")
        return events


class _Closed:
    def fileno(self) -> int:
        raise ValueError("memory watcher is closed")

    def poll(self, timeout=None):
        return None


def _describe(events: Iterable[tuple[str, str]]) -> str:
    events = list(events)
    text = ", ".join(f"{a} {n}" for a, n in events[:4])
    return text + (f" (+{len(events) - 4} more)" if len(events) > 4 else "")
