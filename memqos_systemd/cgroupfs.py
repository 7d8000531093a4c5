"""The cgroup2 file system: everything we read from /sys/fs/cgroup, and the one file we write.

systemd owns the cgroups of its units: every value of ours goes through D-Bus (systemd.py).
This module only reads what the kernel holds, with one exception, written down in
docs/DESIGN.md ("The one file we write"): a container scope's `memory.oom.group`.

Where a unit's cgroup is (`cgroup_path`, `Cgroupfs.dir_of`): a slice's place follows from its
name; a container scope sits in its pod slice, which the plan names (`Cgroupfs.place`) or, with
no plan (`reset`), a search of the kubepods tree finds. What is read there:

* `user.invocation_id` (`read_invocation_id`, `Cgroupfs.run_of`): the run systemd started a slice
  as, put on its cgroup as it starts it (systemd.py's docstring; e2e 12-invocation-path X).
* memory.min/low/high, and memory.max where MemoryMax is ours (`read_cgroup_memory`,
  `Cgroupfs.kernel_values`, `kernel_shows`): what systemd applied, page-rounded by the kernel; of
  the node, QoS and reserved slices also through descriptors kept open (`Cgroupfs.watch`), with an
  inotify watch on each file that says when anyone writes it (`Cgroupfs.watch_notifier`).
* memory.current of a slice (`Cgroupfs.usage`): how far a MemoryMax of ours may go down in one
  write (a feature's step, features.py).
* memory.current, the `low` count of memory.events and the `some` total of memory.pressure of the
  pod slices with requests (`Cgroupfs.owners_seen`), through descriptors kept open: what a line
  that follows usage is drawn from (lending.py), at each of its looks; and a PSI trigger on
  kubepods.slice's memory.pressure (`Cgroupfs.pressure_wake`) that says when its tasks stall.
* memory.events, memory.pressure and memory.current of the pod and QoS slices and the container
  scopes (`KeptFiles`, parsed by cgroup_tree's `flat_keyed` and `psi_totals`): read at each scrape, for the
  metrics (signals.py says which file goes into which metric), and by `status`
  (`read_memory_events`, `read_pressure`, `read_value`).
* memory.swap.max and memory.oom.group (`Cgroupfs.runtime_settings`): see below.
* memory.current, memory.min and memory.low of the kubepods tree (the node, QoS and pod slices,
  and the slices above kubepods), for the effective protection the kernel gives them
  (effective.py, shown by `status` and the metrics), and whether the cgroup2 mount has the
  option `memory_recursiveprot` (`Cgroupfs.recursive_protection`, from /proc/mounts).

Why that file
-------------
A write of ours to a unit makes systemd re-apply all of that unit's cgroup settings from its own
state (src/core/cgroup.c `cgroup_context_apply`, systemd 252: every invalidated unit is realized
again with its whole target mask). For the memory controller that rewrites `memory.min`,
`memory.low`, `memory.high`, `memory.max`, `memory.swap.max` and `memory.oom.group`. A runtime
that wrote one of those only to the file loses it:

- `memory.swap.max`: runc (1.1, Debian bookworm) sends `MemorySwapMax` to systemd only when the
  converted value is not 0; with swap = limit (an older kubelet's setting) it writes 0 to the file
  alone. systemd has a property for it, so we send the file's value as `MemorySwapMax` in the
  same call as ours (`runtime_settings`, used by runtime_keep.py): systemd then holds it, and it also
  survives a daemon-reload, which it did not before us.
- `memory.oom.group`: the kubelet asks for 1 (kill the whole container on OOM) since 1.28; runc
  1.1 writes it to the file only. systemd derives it from `OOMPolicy=`, which it accepts for a
  scope only while the scope is being created (src/core/dbus-scope.c: transient properties only
  in UNIT_STUB); runc scopes have `Delegate=yes`, hence OOMPolicy=continue, hence 0. No property
  can carry it afterwards, so after our write the file is put back to 1 (`restore_oom_group`),
  only where the runtime had set 1 and the re-apply made it 0. Newer runc (opencontainers/cgroups
  with its PR #41, on systemd >= 253) passes OOMPolicy=kill at creation: systemd then writes 1
  itself and nothing is restored.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import select
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Container, Iterable, Mapping

from .cgroup_tree import (MEMORY_FILES, WITH_MAX, cgroup_path, files_of, flat_keyed, kernel_shows, parse_flat_keyed,
                          parse_pressure, parse_value, psi_totals, recursive_protection)

__all__ = [
    "Cgroupfs", "KeptFiles", "RuntimeSettings", "INVOCATION_XATTRS", "ROOT",
    "dir_of_control_group", "read_file", "read_value", "read_invocation_id", "read_cgroup_memory",
    "read_memory_events", "read_pressure", "MOUNTS", "PressureWake",
]

ROOT = Path("/sys/fs/cgroup")
MOUNTS = Path("/proc/mounts")
_MAX_FILE_BYTES = 64
# Where systemd puts a started unit's invocation ID on its cgroup directory; user.* first, as
# the service runs without capabilities (trusted.* is invisible without CAP_SYS_ADMIN).
INVOCATION_XATTRS = ("user.invocation_id", "trusted.invocation_id")
_HEX = frozenset("0123456789abcdef")


# ---- where a unit's cgroup is ----------------------------------------------------------------
def dir_of_control_group(control_group: str | None, root: str | os.PathLike = ROOT) -> Path | None:
    """systemd's ControlGroup property ('/kubepods.slice/...') -> its directory under `root`.
    None for an empty value (the unit has no cgroup: inactive). ValueError for a path that
    is not absolute or would leave `root`."""
    if not control_group:
        return None
    if not control_group.startswith("/") or "\0" in control_group:
        raise ValueError(f"control group {control_group!r} is not an absolute cgroup path")
    parts = [p for p in control_group.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ValueError(f"control group {control_group!r} contains '.' or '..'")
    return Path(root).joinpath(*parts)


# ---- reading one cgroup ------------------------------------------------------------------------
def read_file(path: str | os.PathLike, size: int = 4096) -> bytes | None:
    """A small cgroup file's content, in one read; None when it cannot be read: absent (no such
    controller, no PSI), gone with its cgroup (ENODEV), unsupported (EOPNOTSUPP: psi=0). Plain os
    calls: this is what a scrape does for every file it serves."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.read(fd, size)
        finally:
            os.close(fd)
    except OSError:
        return None


class KeptFiles:
    """Files read again at every scrape, kept open in between: a `pread` on a descriptor opened
    once costs a sixth of open, read and close, natively and on kernfs in the VM (docs/BENCHMARKS.md,
    "A scrape at the floor's pace"), and a scrape reads hundreds. A file whose cgroup went (ENODEV), or that cannot be read, is
    opened afresh at the next read (a cgroup made again at the same place is then read, not the
    old one); one not opened is not there. At most `limit` descriptors are kept (the rest are
    read with open and close): a scrape never takes the last descriptors the daemon has.
    `keep_only` closes those of files no longer asked for. Not thread-safe: the caller holds
    `lock` around its reads."""

    def __init__(self, limit: int | None = None):
        self._fds: dict[str, int] = {}
        self._limit = _descriptors_to_keep() if limit is None else limit
        self.lock = threading.Lock()

    def read(self, path: str, size: int = 4096) -> bytes | None:
        """The file's content (None: it cannot be read: absent, its cgroup gone, no PSI)."""
        fd = self._fds.get(path)
        if fd is not None:
            try:
                return os.pread(fd, size, 0)
            except OSError:
                del self._fds[path]
                os.close(fd)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            raw = os.pread(fd, size, 0)
        except OSError:
            os.close(fd)
            return None
        if len(self._fds) < self._limit:
            self._fds[path] = fd
        else:
            os.close(fd)
        return raw

    def keep_only(self, paths: Container[str]) -> None:
        """Close the descriptors of files not in `paths`."""
        for path in [p for p in self._fds if p not in paths]:
            os.close(self._fds.pop(path))

    def __len__(self) -> int:
        return len(self._fds)

    def __del__(self):
        for fd in self._fds.values():
            os.close(fd)


def _descriptors_to_keep() -> int:
    """How many descriptors KeptFiles may keep: all but 256 of the soft RLIMIT_NOFILE (the
    packaged unit raises it: LimitNOFILE=), 768 when it cannot be read."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return 768
    return 768 if soft == resource.RLIM_INFINITY else max(0, soft - 256)


def read_value(path: str | os.PathLike) -> int | None:
    """A one-number cgroup file ("max" is UINT64_MAX); None when absent or not a number."""
    raw = read_file(path, _MAX_FILE_BYTES)
    return None if raw is None else parse_value(raw)


def read_invocation_id(cgroup_dir: str | os.PathLike) -> bytes | None:
    """The invocation ID systemd wrote on a unit's cgroup directory when it started the unit
    (systemd.py's docstring), as 16 bytes; None when there is none (not started, the cgroup is
    gone, or this systemd does not set it) or it is not 32 hex digits. No D-Bus call."""
    for name in INVOCATION_XATTRS:
        try:
            raw = os.getxattr(cgroup_dir, name)
        except OSError:
            continue
        text = raw.decode("ascii", "replace")
        if len(text) == 32 and _HEX.issuperset(text) and text != "0" * 32:
            return bytes.fromhex(text)
    return None


def read_cgroup_memory(cgroup_dir: str | os.PathLike, *, with_max: bool = False) -> dict[str, int] | None:
    """MemoryMin/MemoryLow/MemoryHigh as the kernel holds them for a cgroup (memory.min,
    memory.low, memory.high; "max" is infinity), and MemoryMax (memory.max) `with_max`: for a slice
    systemd has just realized, what it applied from the unit's properties, read without a D-Bus
    call. None when a file is missing or not a number. Differs from systemd's own values only where
    systemd derives the kernel's (a parent's DefaultMemoryLow=/DefaultMemoryMin=, page rounding);
    the full re-read over D-Bus corrects what that hides."""
    values = {}
    for name, file in (WITH_MAX if with_max else MEMORY_FILES).items():
        value = read_value(os.path.join(cgroup_dir, file))
        if value is None:
            return None
        values[name] = value
    return values


def read_memory_events(cgroup_dir: str | os.PathLike, name: str = "memory.events") -> dict[str, int]:
    """`memory.events` (or memory.events.local) of a cgroup directory -> {"low": n, "high": n, ...};
    {} when the cgroup is gone (a container that just exited); malformed lines are skipped."""
    return parse_flat_keyed(read_file(os.path.join(cgroup_dir, name)) or b"")


def read_pressure(cgroup_dir: str | os.PathLike, name: str = "memory.pressure") -> dict[str, dict[str, float]]:
    """PSI of a cgroup (`memory.pressure`), as parse_pressure gives it but with `total` in seconds.
    {} when the cgroup is gone or the kernel keeps no PSI (psi=0: the file is absent, or reading it
    fails with EOPNOTSUPP)."""
    raw = read_file(os.path.join(cgroup_dir, name))
    if raw is None:
        return {}
    return {kind: {**values, "total": values["total"] / 1e6} for kind, values in parse_pressure(raw).items()}


@dataclass(frozen=True)
class RuntimeSettings:
    """What a unit's cgroup holds of the settings systemd re-applies that are not ours.
    None: the file is absent (no swap accounting, an older kernel) or unreadable."""

    swap_max: int | None
    oom_group: int | None


class Cgroupfs:
    """The cgroup2 mount at `root`, for the units of one node."""

    def __init__(self, root: str | os.PathLike = ROOT, mounts: str | os.PathLike = MOUNTS):
        self.root = Path(root)
        self.mounts = Path(mounts)  # /proc/mounts: the options of the mount at `root`
        self._placed: tuple[Mapping[str, str], dict[str, Path]] = ({}, {})  # (place's paths, their directories)
        self._found: dict[str, Path] = {}  # scopes found by searching
        self._watched: dict[str, dict[str, int]] = {}  # unit -> {property: open descriptor} (watch)
        self._written: _Inotify | None = None  # says when a watched file is written (watch_notifier)
        self._watch_ids: dict[str, list[int]] = {}  # unit -> its files' inotify watch descriptors
        self._owners = KeptFiles(limit=1024)  # owners_seen's files
        self._wake: PressureWake | None = None  # pressure_wake

    def place(self, paths: Mapping[str, str]) -> Mapping[str, Path]:
        """Where units' cgroups are, `paths` being {unit: cgroup path below the mount} (a plan's
        `cgroup_paths`: a container scope's is in its pod slice): {unit: directory}, learnt for
        `dir_of`. The directories are made again only when `paths` differ from the last ones."""
        if paths != self._placed[0]:
            self._placed = (paths, {unit: self.root / path for unit, path in paths.items()})
        return self._placed[1]

    def dir_of(self, unit: str) -> Path | None:
        """Where a unit's cgroup is: a slice's place follows from its name, a scope's from the
        placed plan, or else from a search of the tree. None for a scope not found."""
        if unit.endswith(".slice"):
            return self.root / cgroup_path(unit)
        placed = self._placed[1].get(unit)
        if placed is not None:
            return placed
        found = self._found.get(unit)
        if found is not None and found.is_dir():
            return found
        found = self._search(unit)
        if found is not None:
            self._found[unit] = found
        return found

    def _search(self, scope: str) -> Path | None:
        # Container scopes sit in a pod slice, one or two slices below the top: kubepods.slice/
        # [kubepods-<qos>.slice/]kubepods-...-pod<uid>.slice/<scope> (or under cgroupRoot).
        for pattern in (f"*/*/{scope}", f"*/*/*/{scope}", f"*/*/*/*/{scope}"):
            for hit in self.root.glob(pattern):
                if hit.is_dir():
                    return hit
        return None

    def forget(self, unit: str) -> None:
        self._found.pop(unit, None)

    def run_of(self, unit: str) -> bytes | None:
        """The invocation ID systemd put on a slice's cgroup as it started it; None for a scope
        (systemd 252 puts none on them) or when there is none (read_invocation_id)."""
        return read_invocation_id(self.root / cgroup_path(unit)) if unit.endswith(".slice") else None

    def kernel_values(self, unit: str, *, with_max: bool = False) -> dict[str, int] | None:
        """memory.min/low/high (and memory.max `with_max`) of a unit's cgroup (read_cgroup_memory);
        None where it cannot be placed or read."""
        where = self.dir_of(unit)
        return None if where is None else read_cgroup_memory(where, with_max=with_max)

    def usage(self, unit: str) -> int | None:
        """memory.current of a slice (a feature's steps down, features.py); None when it cannot be
        read. Opened each time: read only while a MemoryMax of ours is above its plan or going down."""
        return read_value(self.root / cgroup_path(unit) / "memory.current") if unit.endswith(".slice") else None

    def owners_seen(self, units: Iterable[str]) -> dict[str, tuple[int | None, int | None, int | None]]:
        """Of each slice: memory.current, the `low` count of memory.events and the `some` total of
        memory.pressure in µs (each None when it cannot be read), through descriptors kept open
        between calls (KeptFiles: a pread each); the descriptors of slices not asked for close."""
        out, paths = {}, set()
        for unit in units:
            where = str(self.root / cgroup_path(unit))
            files = [f"{where}/memory.current", f"{where}/memory.events", f"{where}/memory.pressure"]
            paths.update(files)
            current, events, pressure = (self._owners.read(f) for f in files)
            low = flat_keyed(events).get(b"low") if events is not None else None
            some = psi_totals(pressure).get(b"some") if pressure is not None else None
            out[unit] = (None if current is None else parse_value(current),
                         int(low) if low is not None and low.isdigit() else None, None if some is None else int(some))
        self._owners.keep_only(paths)
        return out

    def pressure_wake(self) -> "PressureWake":
        """The one PressureWake of this mount (made at the first call)."""
        if self._wake is None:
            self._wake = PressureWake(self.root)
        return self._wake

    def recursive_protection(self) -> bool | None:
        """Whether the cgroup2 mount at `root` has memory_recursiveprot (systemd mounts with it; a
        remount by dockerd or Talos may drop it); None when /proc/mounts shows no cgroup2 mount
        there or cannot be read."""
        try:
            mounts = self.mounts.read_bytes()
        except OSError:
            return None
        return recursive_protection(mounts, self.root)

    def watch(self, held: Mapping[str, Mapping[str, int]], page_size: int, skip: Container[str] = ()) -> list[str]:
        """The units of `held` (a few slices: the node, QoS and reserved ones) whose cgroup does
        not show the values held for them (kernel_shows), read through descriptors kept open
        between calls: pread on an open kernfs file is several times cheaper than open and read
        (tests/e2e/README.md), and this runs every second. A unit whose cgroup cannot be read
        (not made yet, gone) is not reported; descriptors of units no longer asked about close.
        `held` is what each cgroup is expected to show (Observer.upper_values: systemd's values, or
        what a read left alone there), so a difference the last read accepted is not reported again.
        `skip`: units left out this time whose descriptors stay open (a write of ours is out for
        them: Observer.writing), so our own write does not close and reopen their watch."""
        for unit in [u for u in self._watched if u not in held and u not in skip]:
            self._close_watch(unit)
        differ = []
        for unit, values in held.items():
            kernel = self._watched_values(unit, files_of(values))
            if kernel is not None and not kernel_shows(kernel, values, page_size):
                differ.append(unit)
        return differ

    def watch_notifier(self) -> "_Inotify | None":
        """An object whose fileno() is readable once anyone has written one of the files `watch`
        reads (since the last drain_notifier): an inotify watch on each (IN_MODIFY, which every
        write(2) to a file raises, kernfs's included: systemd's as it applies a unit's values over
        D-Bus, and a write around it). The watch then looks at once instead of at its next tick,
        and an idle node costs nothing. None where inotify cannot be had: the watch's timer alone."""
        if self._written is None:
            try:
                self._written = _Inotify()
            except OSError:
                return None
            for unit in list(self._watched):
                self._close_watch(unit)  # opened again, with their inotify watches, at the next watch
        return self._written

    def drain_notifier(self) -> None:
        """Take the notifier's events (it is readable until then)."""
        if self._written is not None:
            self._written.drain()

    def close_notifier(self) -> None:
        """Close the notifier (the daemon stops): the descriptors `watch` keeps stay until it is
        asked again."""
        if self._written is not None:
            self._watch_ids.clear()
            self._written.close()
            self._written = None

    def _watched_values(self, unit: str, files: Mapping[str, str]) -> dict[str, int] | None:
        fds = self._watched.get(unit)
        if fds is not None and fds.keys() != files.keys():
            self._close_watch(unit)  # MemoryMax became ours, or stopped being
            fds = None
        if fds is None:
            where = self.dir_of(unit)
            if where is None:
                return None
            fds = self._watched[unit] = {}
            for prop, file in files.items():
                try:
                    fds[prop] = os.open(where / file, os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    self._close_watch(unit)  # not made yet, or gone: try again next time
                    return None
            if self._written is not None:
                # Added after the open: a file replaced in between is found by the pread (ENODEV).
                self._watch_ids[unit] = [w for w in (self._written.add(where / f) for f in files.values())
                                         if w is not None]
        values = {}
        for prop, fd in fds.items():
            try:
                text = os.pread(fd, _MAX_FILE_BYTES, 0).strip()
            except OSError:
                self._close_watch(unit)  # the cgroup went (ENODEV): open it again next time
                return None
            value = parse_value(text)
            if value is None:
                return None
            values[prop] = value
        return values

    def _close_watch(self, unit: str) -> None:
        for fd in self._watched.pop(unit, {}).values():
            try:
                os.close(fd)
            except OSError:
                pass
        for wd in self._watch_ids.pop(unit, []):
            self._written.remove(wd)

    # ---- settings of the runtime's that systemd would re-apply (see the module docstring)
    def runtime_settings(self, unit: str) -> RuntimeSettings | None:
        """memory.swap.max and memory.oom.group of a unit's cgroup; None when it has no cgroup."""
        where = self.dir_of(unit)
        if where is None or not where.is_dir():
            return None
        return RuntimeSettings(read_value(where / "memory.swap.max"), read_value(where / "memory.oom.group"))

    def oom_group(self, unit: str) -> int | None:
        where = self.dir_of(unit)
        return None if where is None else read_value(where / "memory.oom.group")

    def restore_oom_group(self, unit: str) -> str | None:
        """Write 1 to the unit's memory.oom.group. None when done (or the cgroup is gone: nothing
        to restore); else why not, one line (a read-only cgroup mount, say)."""
        where = self.dir_of(unit)
        if where is None:
            return None
        try:
            fd = os.open(where / "memory.oom.group", os.O_WRONLY)
        except OSError as e:
            return None if e.errno == errno.ENOENT else f"{e.strerror} ({where / 'memory.oom.group'})"
        try:
            os.write(fd, b"1")
        except OSError as e:
            return None if e.errno in (errno.ENOENT, errno.ENODEV) else f"{e.strerror} ({where / 'memory.oom.group'})"
        finally:
            os.close(fd)
        return None


# ---- a PSI trigger (Cgroupfs.pressure_wake) -------------------------------------------------------
class PressureWake:
    """Says when the tasks of one cgroup stall on memory, with no look at all in between: a PSI
    trigger (Documentation/accounting/psi.rst, "Userspace monitor usage") on its memory.pressure,
    `some STALL WINDOW` in µs: the kernel signals POLLPRI once the tasks were stalled for STALL
    within a WINDOW, at most once a window. The trigger is a registration on our own open file,
    gone when it closes: no value of the cgroup's is written, so systemd's state is not touched.

    `fileno()` is an epoll of its own, readable while the trigger has fired (asyncio's readers
    wait for POLLIN, a trigger raises POLLPRI only), made at once so that the loop can watch it
    from its start; `arm` puts the trigger on a unit's cgroup, `disarm` takes it off, `drain` takes
    what fired. A kernel without PSI, or a file that cannot be opened for writing: not armed (the
    looks on their timer alone)."""

    def __init__(self, root: Path):
        self.root = root
        self._epoll = select.epoll()
        self._fd: int | None = None
        self.armed: tuple[str, int, int] | None = None  # (unit, stall µs, window µs)

    def fileno(self) -> int:
        return self._epoll.fileno()

    def arm(self, unit: str, stall_us: int, window_us: int) -> bool:
        """The trigger on `unit`'s memory.pressure (again only when it changes); whether it is armed."""
        if self.armed == (unit, stall_us, window_us) and self._fd is not None:
            return True
        self.disarm()
        path = self.root / cgroup_path(unit) / "memory.pressure"
        try:
            fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            os.write(fd, f"some {stall_us} {window_us}".encode() + b"\0")
            self._epoll.register(fd, select.EPOLLPRI)
        except OSError:
            os.close(fd)
            return False
        self._fd, self.armed = fd, (unit, stall_us, window_us)
        return True

    def disarm(self) -> None:
        if self._fd is not None:
            try:
                self._epoll.unregister(self._fd)
            except OSError:
                pass
            os.close(self._fd)
        self._fd, self.armed = None, None

    def drain(self) -> bool:
        """Whether the trigger fired since the last drain. A cgroup gone (POLLERR) disarms it."""
        try:
            events = self._epoll.poll(0)
        except OSError:
            return False
        fired = False
        for _, mask in events:
            if mask & (select.EPOLLERR | select.EPOLLHUP | select.EPOLLNVAL):
                self.disarm()
            elif mask & select.EPOLLPRI:
                fired = True
        return fired

    def close(self) -> None:
        self.disarm()
        self._epoll.close()


# ---- inotify (Cgroupfs.watch_notifier), through libc: no module of the standard library has it -----
_IN_NONBLOCK, _IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
_IN_MODIFY = 0x2


class _Inotify:
    """One inotify instance: files added with IN_MODIFY; fileno() is readable while events wait."""

    def __init__(self):
        try:
            self._libc = ctypes.CDLL(None, use_errno=True)
            fd = self._libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        except (OSError, AttributeError) as e:
            raise OSError(errno.ENOSYS, f"no inotify: {e}") from None
        if fd < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def add(self, path: str | os.PathLike) -> int | None:
        """Watch `path` for writes; its watch descriptor, or None if it cannot be watched."""
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), _IN_MODIFY)
        return wd if wd >= 0 else None

    def remove(self, wd: int) -> None:
        """Stop watching; a file that has gone took its watch with it (EINVAL then: nothing to do)."""
        self._libc.inotify_rm_watch(self._fd, wd)

    def drain(self) -> None:
        try:
            while os.read(self._fd, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        os.close(self._fd)
