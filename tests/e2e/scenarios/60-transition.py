#!/usr/bin/python3
"""Policy changes by config + `systemctl reload` never put a child above its parent.

On the sample node (effective hierarchy, reserved slices, kubelet polled every second) the node
goes None -> TieredReservation -> HardReservation -> TieredReservation -> None, one reload at a
time, each waited for until the kernel holds `memqos-systemd plan`'s values. All along, a thread
reads memory.min and memory.low of every managed unit about every 10 ms; at no sample may a
unit's memory.min exceed its parent cgroup's memory.min, nor its memory.low its parent's
memory.low (kubepods.slice > QoS slices > pod slices > container scopes). The kubelet hierarchy
is left out on purpose: its kubepods.slice has MemoryLow 0 under Burstable pods that have more."""
# e2e-timeout: 240
import os
import threading
import time

from memqos_e2e import *

need_deb()

pods = sample_pods()
start_sample_node(pods, reserved=True)

STEPS = ["None", "TieredReservation", "HardReservation", "TieredReservation", "None"]
expected = {}
for policy in set(STEPS):
    memqos_write_config(sample_config(memoryReservationPolicy=policy))
    expected[policy] = plan_expected(memqos_plan())

memqos_write_config(sample_config(memoryReservationPolicy=STEPS[0]))
memqos_reload()
bad, _ = wait_kernel(expected[STEPS[0]], 20)
check(not bad, f"start: {STEPS[0]}, {len(expected[STEPS[0]])} units equal plan {bad}")

units = list(expected[STEPS[0]])
dirs = {u: unit_cgroup_dir(u) for u in units}
by_dir = {d: u for u, d in dirs.items()}
pairs = [(u, by_dir[os.path.dirname(d)]) for u, d in dirs.items() if os.path.dirname(d) in by_dir]
files = [(u, k, os.path.join(dirs[u], f"memory.{k}")) for u in units for k in ("min", "low")]
log(f"{len(pairs)} child/parent pairs: {[(c[:40], p) for c, p in pairs]}")


class Sampler(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.samples = 0
        self.states = set()
        self.violations = []
        self.max_gap = 0.0

    def run(self):
        # pread on descriptors opened once: a kernfs file is regenerated at offset 0, and it is
        # several times cheaper than open/read/close under TCG (checked below: the last sample
        # must show the final plan, as the plain reads of wait_kernel do).
        fds = {(u, k): os.open(path, os.O_RDONLY) for u, k, path in files}
        last = time.monotonic()
        while not self.stop.is_set():
            vals = {}
            for key, fd in fds.items():
                try:
                    vals[key] = int(os.pread(fd, 32, 0))
                except (OSError, ValueError):
                    vals[key] = None
            self.last = vals
            now = time.monotonic()
            self.max_gap = max(self.max_gap, now - last)
            last = now
            self.samples += 1
            self.states.add(tuple(sorted(vals.items())))
            for child, parent in pairs:
                for k in ("min", "low"):
                    c, p = vals[child, k], vals[parent, k]
                    if c is not None and p is not None and c > p and len(self.violations) < 10:
                        self.violations.append(f"{child} memory.{k} {fmt_bytes(c)} > {parent} "
                                               f"{fmt_bytes(p)} at sample {self.samples}")
            time.sleep(max(0.0, 0.010 - (time.monotonic() - now)))


s = Sampler()
s.start()
t_start = time.monotonic()
for prev, policy in zip(STEPS, STEPS[1:]):
    memqos_write_config(sample_config(memoryReservationPolicy=policy))
    t0 = time.monotonic()
    memqos_reload()
    bad, _ = wait_kernel(expected[policy], 20)
    check(not bad, f"{prev} -> {policy}: kernel equals plan {time.monotonic() - t0:.2f} s after the"
                   f" reload {bad}")
    time.sleep(0.5)
s.stop.set()
s.join()
elapsed = time.monotonic() - t_start
check(s.samples > 100 and len(s.states) >= len(STEPS),
      f"sampled {len(files)} files {s.samples} times in {elapsed:.1f} s (every "
      f"{elapsed / max(s.samples, 1) * 1000:.0f} ms on average, longest gap {s.max_gap * 1000:.0f} ms),"
      f" {len(s.states)} distinct states seen")
final = expected[STEPS[-1]]
stale = [f"{u} {k} {fmt_bytes(v)}" for (u, k), v in s.last.items() if v != final[u][k]]
check(not stale, f"the sampler's last sample shows the final plan (its reads see updates) {stale}")
check(not s.violations, f"no child above its parent (min and low, {len(pairs)} pairs) at any sample:"
                        f" {s.violations}")

# The service has been up for most of this boot by now: the watchdog (WatchdogSec=30s) never fired.
uptime = float(open("/proc/uptime").read().split()[0])
dog = [l for l in journal_since(None) if "atchdog" in l]
check(not dog, f"no watchdog timeout of {MEMQOS_UNIT} in this boot ({uptime / 60:.1f} min up) {dog[:2]}")
