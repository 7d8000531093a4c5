#!/usr/bin/python3
"""Outside pressure for the lent-protection benchmark (bench/scenarios/61-lent.py): run in a
transient service in system.slice, outside kubepods. Allocates anonymous memory (touched) CHUNK at
a time; after every step it notes kubepods.slice's `low` events, each watched cgroup's
memory.current, the node's memory PSI (`some` total) and file refaults (/proc/vmstat
`workingset_refault_file`), and every `stat_every` steps each watched cgroup's memory.stat `file`
(memory.stat is the costly read under TCG; memory.current is a counter). It stops at the first of:

  low       kubepods.slice's `low` rose: the kernel found nothing else and breached a protection
  floors    every watched pod with a floor is at or below it + `margin_mib` (what reclaim may take
            of kubepods without a breach is gone), and `past_mib` more was allocated after that
            (so a floor that does not hold shows)
  thrashing over the last `window_s`, the node stalled on memory (PSI some) at least `stall` of
            the time, or the last step took `slow_s` or more, AND refaulted at least `refault_mib`
            of page cache: only protected page cache
            and the executables' is left, and the kernel is re-reading the executables. Both, as
            either alone comes with honest reclaim too: direct reclaim of cold page cache stalls
            the allocator, and reclaim scans every cgroup in proportion, so a few executables'
            pages go (and come back) while BestEffort's cache is still going
  time      `time_s` since the start (a bound, reported as such)
  cap       `cap_mib` allocated

Without swap and with nothing else to reclaim, the kernel neither breaches memory.low nor OOM-kills
while executables' page cache can still be evicted and refaulted: each reclaim pass makes some
progress, so the `low` pass never comes. Under TCG that thrashing ran 12 minutes once; the
`floors` and `thrashing` stops end the run where the measure is taken, `time` bounds it anyway.

At the stop it frees its memory, then reads every watched cgroup's memory.stat once more, writes
the trace and the reason to OUT and exits (a node left thrashing slowed those reads to minutes).

    press.py OUT SPEC_JSON
    SPEC_JSON: {"watch": {"label": {"path": "/sys/fs/cgroup/...", "floor": bytes or null}}, "cap_mib": N,
                "time_s": 120, "margin_mib": 8, "past_mib": 16, "window_s": 3, "stall": 0.5,
                "slow_s": 2, "refault_mib": 4, "stat_every": 4}   (all but watch optional; these are the defaults)

The decisions are pure functions (tests/unit/test_bench_lent.py); stdlib only.
"""
from __future__ import annotations

import json
import os
import sys
import time

CHUNK_MIB = 4
MIB = 1 << 20
PAGE = 4096
EVENTS = "/sys/fs/cgroup/kubepods.slice/memory.events"
DEFAULTS = {"events": EVENTS, "cap_mib": 1 << 20, "time_s": 120, "margin_mib": 8, "past_mib": 16, "window_s": 3.0,
            "stall": 0.5, "slow_s": 2.0, "refault_mib": 4, "stat_every": 4}


def psi_some_us(text: str) -> int | None:
    """The `some` line's total= (µs stalled) of a PSI file's text; None if there is none."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "some":
            for p in parts[1:]:
                if p.startswith("total="):
                    try:
                        return int(p[6:])
                    except ValueError:
                        return None
    return None


def vmstat_value(text: str, key: str) -> int | None:
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            return int(parts[1])
    return None


def floors_reached(current: dict, floors: dict, margin: int) -> bool:
    """Every cgroup with a floor (bytes; None: not watched for it) at or below it + margin; never
    when none has one (every pod protected whole: nothing in kubepods is for reclaim to reach)."""
    watched = [(k, f) for k, f in floors.items() if f is not None and k in current]
    return bool(watched) and all(current[k] <= f + margin for k, f in watched)


def thrashing(samples: list, window: float, stall: float, refault_pages: int, slow: float = 2.0) -> dict | None:
    """samples: (t s, PSI some total µs or None, file refaults in pages or None), oldest first. Over
    the last `window` seconds (from the newest sample back to the latest one at least `window`
    older): the stalled share and the refaults, if both reach their thresholds; else None. A last
    step that took `slow` s or more counts as stalled too (in the VM, PSI's total lagged behind a
    thrashing node's clock: 0.04 s of stall over a 4.5 s step, then 19.5 s at once). Without
    PSI (None) and without a slow step the refaults alone never decide."""
    if len(samples) < 2:
        return None
    t1, s1, r1 = samples[-1]
    old = None
    for t0, s0, r0 in reversed(samples[:-1]):
        if t1 - t0 >= window:
            old = (t0, s0, r0)
            break
    if old is None:
        return None
    t0, s0, r0 = old
    if None in (r0, r1) or t1 <= t0:
        return None
    share = None if None in (s0, s1) else (s1 - s0) / 1e6 / (t1 - t0)
    step = t1 - samples[-2][0]
    refaults = r1 - r0
    if refaults >= refault_pages and ((share is not None and share >= stall) or step >= slow):
        return {"stall": None if share is None else round(share, 3), "step_s": round(step, 2),
                "refault_pages": refaults, "window_s": round(t1 - t0, 2)}
    return None


class Stopper:
    """The stop rules of the module's docstring, one step at a time (pure: no clock, no files)."""

    def __init__(self, spec: dict):
        self.spec = dict(DEFAULTS, **spec)
        self.floors = {k: w.get("floor") for k, w in self.spec["watch"].items()}
        self.samples: list = []
        self.floors_at: int | None = None  # MiB allocated when the floors were first reached
        self.thrash: dict | None = None  # what the `thrashing` stop saw

    def step(self, t: float, alloc_mib: int, low: int, current: dict, psi_us, refaults) -> str | None:
        s = self.spec
        self.samples.append((t, psi_us, refaults))
        if low > 0:
            return "low"
        if self.floors_at is None and floors_reached(current, self.floors, s["margin_mib"] * MIB):
            self.floors_at = alloc_mib
        if self.floors_at is not None and alloc_mib - self.floors_at >= s["past_mib"]:
            return "floors"
        th = thrashing(self.samples, s["window_s"], s["stall"], s["refault_mib"] * MIB // PAGE, s["slow_s"])
        if th is not None:
            self.thrash = th
            return "thrashing"
        if t >= s["time_s"]:
            return "time"
        if alloc_mib >= s["cap_mib"]:
            return "cap"
        return None


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def stat_file(path: str) -> int:
    with open(os.path.join(path, "memory.stat")) as f:
        return next(int(line.split()[1]) for line in f if line.startswith("file "))


def main(argv: list[str]) -> int:
    out, spec = argv[1], json.loads(argv[2])
    stop = Stopper(spec)
    s, watch = stop.spec, stop.spec["watch"]

    def low() -> int:
        return next(int(line.split()[1]) for line in read(s["events"]).splitlines() if line.startswith("low "))

    def psi():
        try:
            return psi_some_us(read("/proc/pressure/memory"))
        except OSError:
            return None

    def save(trace, why, extra=None):
        tmp = out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(dict({"trace": trace, "stopped": why}, **(extra or {})), f)
        os.replace(tmp, out)

    held, trace = [], []
    start_low, start_ref = low(), vmstat_value(read("/proc/vmstat"), "workingset_refault_file")
    t0 = time.monotonic()
    why = None
    while why is None:
        held.append(bytearray(b"\x01") * (CHUNK_MIB * MIB))
        t = time.monotonic() - t0
        alloc = len(held) * CHUNK_MIB
        ref = vmstat_value(read("/proc/vmstat"), "workingset_refault_file")
        current = {k: int(read(os.path.join(w["path"], "memory.current"))) for k, w in watch.items()}
        step = {"alloc_mib": alloc, "t": round(t, 2), "low": low() - start_low, "psi_us": psi(),
                "refault": None if ref is None or start_ref is None else ref - start_ref,
                "current": current}
        if len(held) % s["stat_every"] == 0:
            step["file"] = {k: stat_file(w["path"]) for k, w in watch.items()}
        trace.append(step)
        why = stop.step(t, alloc, step["low"], current, step["psi_us"], step["refault"])
        if why is None and len(held) % 8 == 0:
            save(trace, "running")
    # Free first: a node left thrashing made the last reads take minutes (the pods' page cache does
    # not come back by itself: their readers are done).
    alloc = len(held) * CHUNK_MIB
    held.clear()
    final = {k: stat_file(w["path"]) for k, w in watch.items()}
    trace[-1]["file"] = final
    save(trace, why, {"floors_at_mib": stop.floors_at, "thrash": stop.thrash,
                      "seconds": round(time.monotonic() - t0, 1), "alloc_mib": alloc})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
