"""The units someone keeps writing behind our back, kept in a runtime file for `status` and `check`.

The daemon puts its values back every time someone else writes a unit of ours (through systemd or
to the cgroup file alone); when one unit is written again and again (drift.ForeignWrites,
"a fight") it says so in the journal, and writes the fights here whenever one begins or is written
again, so that `memqos-systemd status` and `check`, separate processes, can name them. The file
lives next to the reserved-slice ledger (ledger.py), in the unit's RuntimeDirectory; the
DaemonSet's pod mounts the node's.

JSON: {"version": 1, "window": seconds, "units": [{"unit", "level", "writers": [...], "writes",
"since", "last" (Unix times), "changed": [properties]}]}. A fight is current while `last` is within
`window` of now: the reader judges, so a daemon that stopped leaves no fight shown for good. A
file that cannot be read, or of another shape, shows no fight (with no warning: it is only shown).

`ForeignLog` is what the daemon does with each write its reads found behind our back (drift.Drift),
beside putting ours back at the next round: counted, said in the journal, and kept here.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Collection, Iterable

from . import runfile
from .drift import FIGHT_WINDOW, WRITERS, Drift, Fight, ForeignWrites, fight_line, foreign_write_line
from .naming import Naming

__all__ = ["DEFAULT_PATH", "VERSION", "ForeignLog", "write", "current"]

log = logging.getLogger("memqos_systemd")

DEFAULT_PATH = Path("/run/memqos-systemd/fights.json")
VERSION = 1
_MAX_BYTES = 1 << 20


def write(path: Path, fights: Iterable[Fight], window: float, wall_offset: float) -> bool:
    """Replace the file at `path` with `fights` (their times on the daemon's clock; `wall_offset`
    turns them into Unix times). False, with a warning, if it cannot."""
    units = [{"unit": f.unit, "level": f.level, "writers": sorted(f.writers), "writes": f.writes,
              "since": round(f.since + wall_offset, 3), "last": round(f.last + wall_offset, 3),
              "changed": list(f.changed)} for f in sorted(fights, key=lambda f: f.unit)]
    try:
        runfile.replace(path, json.dumps({"version": VERSION, "window": window, "units": units}).encode())
    except OSError as e:
        log.warning("cannot write %s: %s; `status` will not show which units are fought over", path, e.strerror or e)
        return False
    return True


def current(path: Path, now: float) -> list[dict]:
    """The fights in the file at `path` still current at Unix time `now` (last write within the
    window), by unit; [] when there is no file or it is not of the shape `write` gives."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read(_MAX_BYTES))
        if doc.get("version") != VERSION:
            return []
        window = float(doc["window"])
        out = []
        for u in doc["units"]:
            entry = {"unit": str(u["unit"]), "level": str(u["level"]),
                     "writers": [w for w in u["writers"] if w in WRITERS], "writes": int(u["writes"]),
                     "since": float(u["since"]), "last": float(u["last"]), "changed": [str(p) for p in u["changed"]]}
            if entry["last"] > now - window:
                out.append(entry)
        return out
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return []


class ForeignLog:
    """A write found behind our back (drift.Drift): counted by level and writer (`metrics`), said in
    the journal once an hour per unit and kind of writer and once when the unit becomes fought over
    (drift.ForeignWrites), the fights kept at `path` (None: not kept) for status and check. The part
    of the change a feature took on itself (feature.Feature.on_drift, `taken`) is said there."""

    def __init__(self, metrics: Any, path: Path | None):
        self.metrics, self.path = metrics, path
        self.writes = ForeignWrites()

    def seen(self, record: Drift, naming: Naming, taken: Collection[str], now: float) -> None:
        unit, before, after, writer = record.unit, record.before, record.now, record.writer
        ref = naming.parse_unit(unit)
        level = ref.level if ref is not None else "reserved"  # a reserved slice a reload has just retired
        self.metrics.foreign_write(level, writer)
        if taken:
            before, after = ({p: v for p, v in d.items() if p not in taken} for d in (before, after))
            if before == after:
                return
        logged, began = self.writes.seen(unit, level, writer, before, after, now)
        if logged:
            log.warning("%s", foreign_write_line(unit, before, after, writer, naming))
        if began is not None:
            log.warning("%s", fight_line(began, naming))
        if unit in self.writes.fights and self.path is not None:
            write(self.path, self.writes.fights.values(), FIGHT_WINDOW, time.time() - now)
