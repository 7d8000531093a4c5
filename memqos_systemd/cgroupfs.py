"""The cgroup2 file system: everything we read from /sys/fs/cgroup, and the one file we write.

systemd owns the cgroups of its units: every value of ours goes through D-Bus (systemd.py).
This module only reads what the kernel holds, with one exception, written down in
docs/DESIGN.md ("The one file we write"): a container scope's `memory.oom.group`.

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
  same call as ours (`runtime_settings`, used by the Applier): systemd then holds it, and it also
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

import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .naming import cgroup_path
from .quantity import UINT64_MAX

__all__ = ["Cgroupfs", "RuntimeSettings", "UINT64_MAX", "read_value"]

ROOT = Path("/sys/fs/cgroup")
_MAX_FILE_BYTES = 64


def read_value(path: str | os.PathLike) -> int | None:
    """A one-number cgroup file ("max" is UINT64_MAX); None when absent or not a number."""
    try:
        with open(path, "rb") as f:
            text = f.read(_MAX_FILE_BYTES).strip()
    except OSError:
        return None
    if text == b"max":
        return UINT64_MAX
    if text.isdigit() and int(text) <= UINT64_MAX:
        return int(text)
    return None


@dataclass(frozen=True)
class RuntimeSettings:
    """What a unit's cgroup holds of the settings systemd re-applies that are not ours.
    None: the file is absent (no swap accounting, an older kernel) or unreadable."""

    swap_max: int | None
    oom_group: int | None


class Cgroupfs:
    """The cgroup2 mount at `root`. `scope_parent(scope)` names a container scope's pod slice when
    the caller knows it (the daemon's plan); otherwise the kubepods tree is searched."""

    def __init__(self, root: str | os.PathLike = ROOT, *,
                 scope_parent: Callable[[str], str | None] | None = None):
        self.root = Path(root)
        self.scope_parent = scope_parent
        self._found: dict[str, Path] = {}  # scopes found by searching

    def dir_of(self, unit: str) -> Path | None:
        """Where a unit's cgroup is: a slice's place follows from its name, a scope's from its
        parent slice. None for a scope that cannot be placed."""
        if unit.endswith(".slice"):
            return self.root / cgroup_path(unit)
        parent = self.scope_parent(unit) if self.scope_parent is not None else None
        if parent is not None:
            return self.root / cgroup_path(unit, cgroup_path(parent))
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
