#!/usr/bin/python3
"""What the pressure guard (issue 19) costs while nothing presses, natively (no VM).

    .venv/bin/python bench/guard_cost.py [--seconds 60] [--cgroup DIR]

The guard's work every pressureGuard.interval (0.25 s by default) is the daemon's `guard_tick`:
three preads on kept descriptors (cgroupfs.guard_counters: memory.events and memory.pressure of
kubepods-burstable.slice, memory.current of kubepods-besteffort.slice) and guard.decide. Measured
here on this host's kernfs files: the per-tick CPU (many ticks in a row), and an asyncio loop that
wakes every interval and ticks, as the daemon's `_guard_loop` does, against the same loop asleep, and
the guard at rest with the kernel's notification (a tick every GUARD_IDLE_INTERVAL; a real node
adds one tick per change of the Burstable slice's memory.events) (the process's CPU over
--seconds each). The files: a cgroup v2 directory given by --cgroup whose
memory.events, memory.pressure and memory.current are real (kernfs), linked under the names the
daemon opens; on a host without the v2 memory controller, whatever kernfs memory files it has.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from memqos_systemd.agenda import GUARD_IDLE_INTERVAL  # noqa: E402
from memqos_systemd.cgroupfs import Cgroupfs  # noqa: E402
from memqos_systemd.config import GuardSettings  # noqa: E402
from memqos_systemd.guard import GuardState, Reading, decide  # noqa: E402

CANDIDATES = {  # file the daemon opens -> kernfs files that stand in for it, first found wins
    "memory.events": ["{cg}/memory.events", "/sys/fs/cgroup/memory/memory.stat"],
    "memory.pressure": ["{cg}/memory.pressure", "/sys/fs/cgroup/unified/memory.pressure", "/proc/pressure/memory"],
    "memory.current": ["{cg}/memory.current", "/sys/fs/cgroup/memory/memory.usage_in_bytes"],
}


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--cgroup", default="/sys/fs/cgroup")
    ap.add_argument("--ticks", type=int, default=20000)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="memqos-guard-cost-")
    burst = os.path.join(root, "kubepods.slice", "kubepods-burstable.slice")
    be = os.path.join(root, "kubepods.slice", "kubepods-besteffort.slice")
    os.makedirs(burst)
    os.makedirs(be)
    used = {}
    for name, options in CANDIDATES.items():
        src = next((p.format(cg=args.cgroup) for p in options if os.path.exists(p.format(cg=args.cgroup))), None)
        if src is None:
            sys.exit(f"no kernfs file stands in for {name} on this host")
        os.symlink(src, os.path.join(be if name == "memory.current" else burst, name))
        used[name] = src
    fs = Cgroupfs(root)
    s = GuardSettings(enabled=True)
    state = GuardState()

    def tick(now: float) -> None:
        nonlocal state
        low, stall, usage = fs.guard_counters("kubepods-burstable.slice", "kubepods-besteffort.slice")
        state, _ = decide(state, Reading(now, low, stall, usage), s, holding=False, capacity=1 << 34)

    t0, c0 = time.monotonic(), cpu()
    for i in range(args.ticks):
        tick(i * s.interval)
    per_tick = (cpu() - c0) / args.ticks
    wall_tick = (time.monotonic() - t0) / args.ticks

    async def loop(work: bool, interval: float) -> float:
        c = cpu()
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            await asyncio.sleep(interval)
            if work:
                tick(time.monotonic())
        return cpu() - c

    asleep = asyncio.run(loop(False, s.interval))  # the loop's wakes alone
    ticking = asyncio.run(loop(True, s.interval))  # engaged, or no notifier: a tick every interval
    idle = asyncio.run(loop(True, GUARD_IDLE_INTERVAL))  # idle with the kernel's notification
    per_hour = ticking * 3600 / args.seconds
    out = {
        "files": used, "interval_s": s.interval, "ticks_timed": args.ticks,
        "cpu_per_tick_us": round(per_tick * 1e6, 1), "wall_per_tick_us": round(wall_tick * 1e6, 1),
        "loop_seconds": args.seconds, "loop_wakes_only_cpu_s": round(asleep, 4), "loop_with_ticks_cpu_s": round(ticking, 4),
        "cpu_s_per_hour": round(per_hour, 2), "share_of_a_core_pct": round(100 * per_hour / 3600, 3),
        "idle_notified_interval_s": GUARD_IDLE_INTERVAL, "idle_notified_cpu_s": round(idle, 4),
        "idle_notified_cpu_s_per_hour": round(idle * 3600 / args.seconds, 3),
        "load": os.getloadavg(), "python": sys.version.split()[0],
    }
    print(json.dumps(out, indent=1))
    fs.close_kept()
    return 0


if __name__ == "__main__":
    sys.exit(main())
