#!/usr/bin/python3
"""Living beside the kubelet's own Memory QoS (issue 15): its writes found and put back.

A stand-in for a v1.37 kubelet with its MemoryQoS gate on (the default) and the default policy
writes, through systemd as the kubelet does (SetUnitProperties by name on its own slices),
kubepods.slice MemoryMin=0 and kubepods-burstable.slice MemoryLow=0 every 60 s for 5 minutes,
while a sampler reads those two files every 50 ms. Then the kubelet with the gate off: the same
zeros written once as it starts (kubernetes/kubernetes#138903).
  fact     systemd 252 sends no PropertiesChanged for MemoryMin/MemoryLow on a slice (so the
           daemon reads the upper slices' cgroups every second instead)
  minute   5 rounds of the kubelet's zeros: protection below the plan at most 5 % of the time;
           each round put back; memqos_foreign_writes_total counts every one, per unit; the
           journal names the fight once per unit (the kubelet, and the fix)
  restart  the kubelet restarted (its start job ends) and its zeros written at start: back to
           the plan within 2 s of the job's end"""
# e2e-timeout: 480
import os
import subprocess
import threading
import time

from memqos_e2e import *

need_deb()
NODE, BURSTABLE = "kubepods.slice", "kubepods-burstable.slice"
PERIOD, ROUNDS = 60.0, 5

pods = sample_pods()
start_sample_node(pods)
memqos_write_config(pods_only_config())
# A fresh daemon: it logs a foreign write once an hour per unit, and an earlier scenario of this
# boot (32-resync-kernel's set-property on kubepods-burstable.slice) would have used that up.
systemctl("restart", MEMQOS_UNIT)
check(memqos_reload(), "config: TieredReservation, effective, pods only, pollInterval 1s")
plan = plan_expected(memqos_plan())
bad, took = wait_kernel(plan, 20)
check(not bad, f"{len(plan)} units equal plan before the kubelet's writes {bad}")
want = {NODE: ("min", plan[NODE]["min"]), BURSTABLE: ("low", plan[BURSTABLE]["low"])}
check(all(v > 0 for _, v in want.values()), f"the plan protects through both: {want}")
files = {u: f"{slice_cgroup_dir(u)}/memory.{k}" for u, (k, _) in want.items()}


def kubelet_zeros():
    """What the kubelet's QoS manager writes with the default policy: explicit zeros."""
    set_unit_properties(NODE, MemoryMin=0)
    set_unit_properties(BURSTABLE, MemoryLow=0)


# ---- fact: no PropertiesChanged for the memory properties of a slice ------------------------------
# A slice of its own, watched with busctl monitor: set-property MemoryLow on it, then stop it (its
# ActiveState change does send PropertiesChanged: the monitor is seen to work).
PROBE = "memqos-e2e-probe.slice"
start_transient_unit(PROBE, {"Description": "e2e probe"})
watch = subprocess.Popen(["busctl", "monitor", "--system",
                          f"--match=type='signal',interface='org.freedesktop.DBus.Properties',path='{unit_path(PROBE)}'"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
time.sleep(1.0)
systemctl("set-property", "--runtime", PROBE, f"MemoryLow={1 << 20}", "MemoryMin=4096")
time.sleep(1.5)
mark_stop = time.monotonic()
stop_unit(PROBE)
time.sleep(1.0)
watch.terminate()
out = watch.communicate(timeout=10)[0]
messages = out.split("\n\n")
on_write = [m for m in messages if "PropertiesChanged" in m and "Memory" in m]
on_stop = [m for m in messages if "PropertiesChanged" in m and "ActiveState" in m]
check(not on_write and on_stop, f"fact: after set-property MemoryLow/MemoryMin on a slice, {len(on_write)}"
                                f" PropertiesChanged name a memory property; its stop sent {len(on_stop)} (ActiveState):"
                                " the cgroup properties are not EMITS_CHANGE, so the daemon reads the cgroups")
systemctl("reset-failed", PROBE)


# ---- minute: the kubelet's zeros every 60 s ------------------------------------------------------------
class Sampler(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.samples = self.below = 0
        self.longest = self.current = 0.0

    def run(self):
        fds = {u: os.open(f, os.O_RDONLY) for u, f in files.items()}
        last = time.monotonic()
        while not self.stop.is_set():
            now = time.monotonic()
            low = any(int(os.pread(fd, 32, 0).strip() or 0) < want[u][1] for u, fd in fds.items())
            self.samples += 1
            if low:
                self.below += 1
                self.current += now - last
                self.longest = max(self.longest, self.current)
            else:
                self.current = 0.0
            last = now
            time.sleep(0.05)

metric_before = {u: metric("memqos_foreign_writes_total", unit=u) or 0 for u in want}
mark = journal_cursor()
sampler = Sampler()
sampler.start()
started = time.monotonic()
for i in range(ROUNDS):
    while time.monotonic() < started + i * PERIOD:
        time.sleep(0.05)
    kubelet_zeros()
while time.monotonic() < started + ROUNDS * PERIOD:
    time.sleep(0.1)
sampler.stop.set()
sampler.join()
share = sampler.below / max(sampler.samples, 1)
check(share <= 0.05, f"minute: protection below the plan {100 * share:.2f} % of {sampler.samples} samples over"
                     f" {ROUNDS * PERIOD:.0f} s (goal <= 5 %); longest {sampler.longest:.2f} s")
bad, _ = wait_kernel(plan, 10)
check(not bad, f"minute: the plan holds after the last round {bad}")
counted = {u: (metric("memqos_foreign_writes_total", unit=u) or 0) - metric_before[u] for u in want}
check(all(n >= ROUNDS for n in counted.values()), f"minute: memqos_foreign_writes_total grew by {counted}"
                                                    f" (>= {ROUNDS} each)")
lines = [m for m in journal_since(mark) if "changed without us" in m]
named = [m for m in lines if "kubelet's own Memory QoS" in m and "featureGates: {MemoryQoS: false}" in m]
check(len(lines) == 2 and len(named) == 2, f"minute: the journal names the fight once per unit ({len(lines)} lines):"
                                            f" {[m[:160] for m in lines]}")

# ---- restart: the gate off, the zeros once at the kubelet's start -----------------------------------
p = subprocess.run(["systemctl", "restart", KUBELET_UNIT], capture_output=True, text=True)
job_end = time.monotonic()
kubelet_zeros()
back = wait_for(lambda: not compare_kernel({u: plan[u] for u in want}), 10, 0.02)
took = time.monotonic() - job_end
check(bool(back) and took <= 2.0, f"restart: back to the plan {took:.2f} s after the kubelet's start job ended"
                                  f" (goal <= 2 s; systemctl restart exit {p.returncode})")
