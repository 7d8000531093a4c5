"""The slices the daemon has set values on that no plan may name later, remembered in runtime files.

Reserved slices (kubeReservedCgroup, systemReservedCgroup) are the only units the daemon creates
by writing to them, and their values sit in /run/systemd/system.control/<slice>.d/ until reboot.
When the config stops naming one while the service runs, the daemon resets it at the reload;
when that happens while the service is stopped, nothing would remember the slice was ours, and
neither the next start nor `memqos-systemd reset` (nor `apt remove`) would bring it back to the
defaults. This file remembers, for exactly as long as those drop-ins live: it is under /run too
(the unit's RuntimeDirectory, kept when the service stops).

A property a feature sets beyond the plan's three (features.py) is the other such value: it stays
on the slice when the feature is turned off while the service is stopped, or when the service is
removed. `OwnedSlices` (a file of the feature's own, in the same directory) remembers the slices
where the daemon set it, from before its first write there until systemd holds the default
again, so that the daemon (a reload or start with the feature off) and `reset` (and so `apt
remove` and the DaemonSet's uninstall) put it back, and leave alone one someone else set.

One slice name per line. A missing file is an empty ledger; a line that is not a valid slice
name is ignored with a warning (it names nothing we could have written).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from . import runfile
from .naming import valid_slice_name
from .reconcile import DEFAULTS

__all__ = ["DEFAULT_PATH", "ReservedSlices", "OwnedSlices", "read", "write"]

log = logging.getLogger("memqos_systemd")

DEFAULT_PATH = Path("/run/memqos-systemd/reserved-slices")
_MAX_BYTES = 64 * 1024


def read(path: Path, what: str = "reserved-slice ledger") -> set[str]:
    """The slice names in the ledger at `path` (`what` it is, for the journal); empty when there is none."""
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_BYTES + 1)
    except FileNotFoundError:
        return set()
    except OSError as e:
        log.warning("cannot read the %s %s: %s", what, path, e.strerror or e)
        return set()
    if len(data) > _MAX_BYTES:
        log.warning("the %s %s is larger than %d bytes: ignored", what, path, _MAX_BYTES)
        return set()
    names = set()
    for line in data.decode("utf-8", "replace").splitlines():
        name = line.strip()
        if not name:
            continue
        if valid_slice_name(name):
            names.add(name)
        else:
            log.warning("the %s %s: %r is not a slice name: ignored", what, path, name[:80])
    return names


def write(path: Path, names: set[str] | frozenset[str], what: str = "reserved-slice ledger") -> bool:
    """Replace the ledger at `path` with `names` (atomically); False, with a warning, if it cannot."""
    try:
        runfile.replace(path, "".join(f"{n}\n" for n in sorted(names)).encode())
    except OSError as e:
        log.warning("cannot write the %s %s: %s", what, path, e.strerror or e)
        return False
    return True


class ReservedSlices:
    """The reserved slices of ours beyond the config's own: those a config reload, or the config
    while the service was stopped, no longer names, until they are back at the defaults once
    (`retired`); and the ledger file that keeps both kinds (None: not kept)."""

    def __init__(self, path: Path | None):
        self.path = path
        self.retired: set[str] = set()
        self._written: frozenset[str] | None = None  # the ledger as last written

    def start(self, named: Iterable[str]) -> list[str]:
        """Slices the ledger has and the config does not name (dropped while we were stopped):
        retired, to be reset once as a reload that dropped them would have. Returns them."""
        gone = (read(self.path) if self.path is not None else set()) - set(named)
        self.retired |= gone
        for name in sorted(gone):
            log.info("%s was a reserved cgroup when the service last ran and the config no longer names"
                     " it: bringing it back to MemoryMin=0 MemoryLow=0 MemoryHigh=infinity", name)
        return sorted(gone)

    def config_changed(self, before: Iterable[str], after: Iterable[str]) -> list[str]:
        """A reload changed the reserved slices the config names: those dropped are retired, those
        named again are not. Returns the ones dropped."""
        after = set(after)
        dropped = set(before) - after
        self.retired = (self.retired | dropped) - after
        for name in sorted(dropped):
            log.info("%s is no longer a reserved cgroup in the config: bringing it back to"
                     " MemoryMin=0 MemoryLow=0 MemoryHigh=infinity", name)
        return sorted(dropped)

    def settle(self, done: Callable[[str], bool]) -> None:
        """A retired slice is ours to reset once; after that (`done`) it is the operator's again."""
        self.retired = {n for n in self.retired if not done(n)}

    def after_round(self, named: Iterable[str], held: Mapping[str, Any] | None) -> None:
        """After a round: the retired slices whose values systemd now holds at the defaults (or
        that are gone) are settled, when the round wrote (`held`: what systemd holds after it;
        None: nothing to write), then the ledger is kept (a write of it that failed is tried again)."""
        if held is not None:
            self.settle(lambda name: held.get(name) in (None, DEFAULTS))
        self.keep(named)

    def keep(self, named: Iterable[str]) -> None:
        """Write the config's slices and the retired ones to the ledger when they changed; one that
        failed is tried again at the next call."""
        names = frozenset(named) | frozenset(self.retired)
        if self.path is not None and names != self._written and write(self.path, names):
            self._written = names


class OwnedSlices:
    """The slices on which the daemon set a feature's property, kept in the file at `path` (None:
    in memory only; `what` names it in the journal): `add` before the first write of a value other
    than the default, `discard` once systemd holds the default there again. A write of the file
    that failed is tried again at the next call."""

    def __init__(self, path: Path | None, what: str, *, write: bool = True):
        self.path = path
        self.what = what
        self._write = write  # False: read, never written (a dry run)
        self.names: set[str] = read(path, what) if path is not None else set()
        self._written: frozenset[str] | None = frozenset(self.names)

    def add(self, name: str) -> None:
        self.names.add(name)
        self._keep()

    def discard(self, name: str) -> None:
        self.names.discard(name)
        self._keep()

    def _keep(self) -> None:
        names = frozenset(self.names)
        if self.path is not None and self._write and names != self._written and write(self.path, names, self.what):
            self._written = names
