#!/usr/bin/python3
"""The kubelet goes away with its cgroups, comes back, and systemd reloads: the node keeps the
protection the current plan asks for, and a reset stays a reset.

11-systemd-facts shows the mechanism: SetUnitProperties on a kubepods.slice that is not loaded
makes a plain (non-transient) slice whose values go to /run/systemd/system.control/<slice>.d;
when the kubelet then creates the slice with StartTransientUnit, later writes go to
/run/systemd/transient/<slice>.d, and on every daemon-reload the same-named system.control
drop-in wins again, in systemd and in the kernel. Here on the daemon's own path:
  1. a node with pods (QoS slices made first, as the kubelet does at start-up);
  2. the kubelet stops and its slices go (the daemon, still planning the pods, must not hammer
     systemd about the kubepods.slice it cannot re-create); it comes back and lists its pods before it has made
     its slices again (as at boot, see 77-boot-order): the daemon must not make kubepods.slice or
     the QoS slices itself (that would make plain slices with system.control drop-ins); it
     waits for the kubelet's;
  3. the kubelet makes its slices (StartTransientUnit) and runs two more pods: kubepods.slice's
     protection grows, written to /run/systemd/transient; the kernel holds the plan;
  4. systemctl daemon-reload, with kubepods.slice's and the Burstable QoS slice's memory.min/low
     read every ~2 ms: never below the plan;
  5. the package's removal path without removing it: stop the service, `memqos-systemd reset`,
     then the daemon-reload dpkg runs after removing a unit file: every unit still 0/0/max."""
# e2e-timeout: 240
import os
import subprocess
import threading
import time

from memqos_e2e import *

need_deb()
MIB = 1 << 20
CONTROL = "/run/systemd/system.control"

memqos_write_config(pods_only_config())
pods = sample_pods()
start_sample_node(pods)
check(memqos_reload(), "1. config: TieredReservation, pollInterval 1s")
expected = plan_expected(memqos_plan())
bad, _ = wait_kernel(expected, 20)
check(not bad and service_show("Transient", "kubepods.slice") == "yes",
      f"1. {len(expected)} units equal plan; kubepods.slice made by StartTransientUnit {bad}")

# --- 2. the kubelet and its cgroups go away; back, it lists pods before making its slices -------
# As at boot (77-boot-order): the kubelet's /pods answers before it has created kubepods.slice.
# The daemon plans the node and QoS slices but leaves them to the kubelet to create.
kubelet_stop()
for p in pods:
    stop_pod(p)
errors0 = metric("memqos_dbus_calls_total", method="SetUnitProperties", result="error") or 0
mark = journal_cursor()
stop_unit("kubepods.slice")
time.sleep(3)
errors = (metric("memqos_dbus_calls_total", method="SetUnitProperties", result="error") or 0) - errors0
not_found = [l for l in journal_since(mark) if "not found" in l]
check(errors <= 3, f"2. kubepods.slice stopped while the daemon still plans pods: {errors:.0f} failed"
                   f" SetUnitProperties in 3 s, {len(not_found)} journal lines like "
                   f"{not_found[:1]} (a retry with backoff makes at most 3)")
# The stopped transient name loads again after a reboot or a daemon-reload (11-systemd-facts E).
systemctl("daemon-reload")
mark = journal_cursor()
kubelet_start(pods)
fetched = wait_for(lambda: any("kubelet.service (re)started" in l for l in journal_since(mark)), 10, 0.1)
time.sleep(3)  # several polls of the kubelet with its pods listed
dropins = {u: sorted(os.listdir(f"{CONTROL}/{u}.d")) if os.path.isdir(f"{CONTROL}/{u}.d") else None
           for u in ("kubepods.slice", "kubepods-burstable.slice", "kubepods-besteffort.slice")}
check(fetched and all(v is None for v in dropins.values()),
      f"2. pods listed, no slices yet: the daemon made no slice of the kubepods tree (control drop-ins"
      f" {dropins}); kubepods.slice ActiveState={service_show('ActiveState', 'kubepods.slice')} "
      f"Transient={service_show('Transient', 'kubepods.slice')}")

# --- 3. the kubelet makes its slices and runs more pods -------------------------------------
more = [make_pod("db2", [{"name": "pg", "requests": {"memory": "32Mi", "cpu": "50m"},
                          "limits": {"memory": "32Mi", "cpu": "50m"}}]),
        make_pod("web2", [{"name": "app", "requests": {"memory": "32Mi"}}])]
pods2 = pods + more
ensure_qos_slices()
for p in pods:
    start_pod(p)
write_pods(pods2)
for p in more:
    start_pod(p)
expected = plan_expected(memqos_plan())
bad, _ = wait_kernel(expected, 20)
kp = expected["kubepods.slice"]
bu = expected["kubepods-burstable.slice"]
check(not bad, f"3. kubelet back with {len(pods2)} pods: {len(expected)} units equal plan (kubepods "
               f"min {fmt_bytes(kp['min'])} low {fmt_bytes(kp['low'])}, burstable low "
               f"{fmt_bytes(bu['low'])}) {bad}; kubepods.slice Transient="
               f"{service_show('Transient', 'kubepods.slice')}, DropInPaths "
               f"{service_show('DropInPaths', 'kubepods.slice')}")
if bad:  # (a lost UnitNew, 30-unitnew): let a reload re-read so the steps below measure themselves
    memqos_reload()
    wait_kernel(expected, 15)

# --- 4. daemon-reload --------------------------------------------------------------------------
watched = {("kubepods.slice", "min"): kp["min"], ("kubepods.slice", "low"): kp["low"],
           ("kubepods-burstable.slice", "low"): bu["low"]}
fds = {key: os.open(os.path.join(slice_cgroup_dir(key[0]), f"memory.{key[1]}"), os.O_RDONLY)
       for key in watched}
lowest = dict(watched)
samples = [0]
stop = threading.Event()


def sample():
    while not stop.is_set():
        for key, fd in fds.items():
            v = int(os.pread(fd, 32, 0))
            lowest[key] = min(lowest[key], v)
        samples[0] += 1
        time.sleep(0.002)


t = threading.Thread(target=sample, daemon=True)
t.start()
t0 = time.monotonic()
systemctl("daemon-reload")
time.sleep(3)
stop.set()
t.join()
dips = [f"{u} memory.{k} down to {fmt_bytes(lowest[u, k])} (plan {fmt_bytes(v)})"
        for (u, k), v in watched.items() if lowest[u, k] < v]
check(not dips, f"4. daemon-reload: {samples[0]} samples in {time.monotonic() - t0:.1f} s, never below"
                f" the plan {dips}")
bad, _ = wait_kernel(expected, 5)
check(not bad, f"4. after daemon-reload: {len(expected)} units equal plan {bad}")

# --- 5. what `apt remove` does: stop, reset, and dpkg's daemon-reload ---------------------------
systemctl("stop", MEMQOS_UNIT)
p = subprocess.run(["memqos-systemd", "reset", "--config", MEMQOS_CONFIG], capture_output=True,
                   text=True)
defaults = {"min": 0, "low": 0, "high": UINT64_MAX}
not_reset = [f"{u} {v}" for u, v in kernel_memory(expected).items() if v != defaults]
check(p.returncode == 0 and not not_reset, f"5. memqos-systemd reset: {p.stderr.strip()}; every unit"
                                           f" 0/0/max {not_reset}")
systemctl("daemon-reload")
not_reset = [f"{u} {v}" for u, v in kernel_memory(expected).items() if v != defaults]
check(not not_reset, f"5. ... and still after a daemon-reload {not_reset}")
systemctl("start", MEMQOS_UNIT)
bad, _ = wait_kernel(expected, 20)
check(not bad, f"service started again: {len(expected)} units equal plan {bad}")
