#!/usr/bin/python3
"""Beside the kubelet of today (issue 36): companion mode on real systemd, against a second writer
that writes what a v1.37 kubelet with its Memory QoS on writes, the way libcontainer's systemd
manager writes it (SetUnitProperties, then the cgroup files).

  mode      the kubelet stand-in's /metrics says kubernetes_feature_enabled{name="MemoryQoS"} 1:
            the daemon (companion: auto) says companion mode (memqos_companion_mode 1), and
            `check` calls it an informed choice
  create    the pods' and containers' values written once, as the kubelet and the runtime write
            them at creation: 0 writes of ours follow
  hour      the QoS manager's writes of kubepods.slice and kubepods-burstable.slice, 60 of them
            (an hour of minutes, one every 0.5 s), the values varying as pods come and go, the
            files sampled every 20 ms: the daemon makes 0 SetUnitProperties calls, counts 0
            foreign writes and 0 fights, and the files always show the kubelet's values
  ours      what it adds: the BestEffort ceiling as planned; the QoS slices' signals are served;
            the reserved slices hold what the kubelet wrote as it enforced them
  handover  the kubelet restarted with its gate off: the daemon owns every value again within
            a few seconds of the restart (its plan in the kernel), and no sample of the upper
            slices' memory.min/low falls below the lower of the two writers' values"""
# e2e-timeout: 240
import os
import subprocess
import threading
import time

from memqos_e2e import *

need_deb()
MI = 1 << 20
NODE, BURSTABLE, BESTEFFORT = "kubepods.slice", "kubepods-burstable.slice", "kubepods-besteffort.slice"
METRICS_FILE = PODS_FILE + ".metrics"  # what the stand-in's /metrics serves (kubelet_stub.py)
GATE = ('kubernetes_build_info{git_version="v1.37.1",major="1",minor="37"} 1\n'
        'kubernetes_feature_enabled{name="MemoryQoS",stage="BETA"} %d\n')
PERIOD, WRITES = 0.5, 60


def say_gate(on):
    with open(METRICS_FILE + ".tmp", "w") as f:
        f.write(GATE % int(on))
    os.replace(METRICS_FILE + ".tmp", METRICS_FILE)


pods = sample_pods()  # db: Guaranteed 96Mi; web: Burstable app 48Mi + sidecar 16Mi; batch: BestEffort
units = start_sample_node(pods, reserved=True)
say_gate(True)
memqos_write_config(sample_config(companion="auto", bestEffortCeiling={"enabled": True}))
systemctl("restart", MEMQOS_UNIT)  # a fresh daemon asks the kubelet as it starts
check(wait_for(lambda: metric("memqos_companion_mode") == 1, 30),
      "mode: the kubelet's /metrics says its Memory QoS is on: companion mode (memqos_companion_mode 1)")
said = " ".join(text for _, text in check_findings(
    subprocess.run(["memqos-systemd", "check"], capture_output=True, text=True).stdout))
check("companion mode (the kubelet's own Memory QoS is on (the kubelet's /metrics" in said,
      "mode: check says companion mode, from the kubelet's /metrics")

db, web = units["db"], units["web"]
G, B = 96 * MI, (48 + 16) * MI
# What the kubelet of today writes with TieredReservation (docs/DESIGN.md, "Companion mode"): the
# QoS manager's every minute, the pod's and the container's at creation (the runtime's CRI Unified).
# The enforced reserved slices' memory.min it writes as it enforces them (enforceExistingCgroup).
CREATED = {db["slice"]: {"MemoryMin": G}, db["scopes"][0]: {"MemoryMin": G},
           web["slice"]: {"MemoryLow": B}, web["scopes"][0]: {"MemoryLow": 48 * MI},
           web["scopes"][1]: {"MemoryLow": 16 * MI},
           "kube.slice": {"MemoryMin": 64 * MI}, "system.slice": {"MemoryMin": 96 * MI}}


def qos_values(extra):
    """The QoS manager's values with `extra` bytes more Burstable requests (pods come and go)."""
    return {NODE: {"MemoryMin": G + B + extra, "MemoryLow": B + extra},
            BURSTABLE: {"MemoryMin": 0, "MemoryLow": B + extra}}


FILES = {"MemoryMin": "memory.min", "MemoryLow": "memory.low", "MemoryHigh": "memory.high"}


def libcontainer_writes(values):
    """libcontainer's systemd manager: each unit's properties over D-Bus, then its files."""
    for unit, props in values.items():
        set_unit_properties(unit, **props)
        for prop, value in props.items():
            with open(os.path.join(unit_cgroup_dir(unit), FILES[prop]), "w") as f:
                f.write(str(value))


def calls():
    m = metrics()
    return (metric("memqos_dbus_calls_total", m, method="SetUnitProperties") or 0,
            sum(v for _, v in m.get("memqos_foreign_writes_total", [])))


libcontainer_writes(CREATED)
libcontainer_writes(qos_values(0))
time.sleep(3)  # a resync's worth of rounds on what the kubelet wrote
before = calls()
mark = journal_cursor()


class Sampler(threading.Thread):
    """The upper slices' memory.min/low every 20 ms, each sample checked by `ok`."""

    def __init__(self, ok):
        super().__init__(daemon=True)
        self.ok, self.stop, self.samples, self.bad = ok, threading.Event(), 0, []

    def run(self):
        paths = {(u, k): os.path.join(slice_cgroup_dir(u), f"memory.{k}") for u in (NODE, BURSTABLE)
                 for k in ("min", "low")}
        fds = {key: os.open(p, os.O_RDONLY) for key, p in paths.items()}
        while not self.stop.is_set():
            seen = {key: int(os.pread(fd, 32, 0).strip() or 0) for key, fd in fds.items()}
            self.samples += 1
            if not self.ok(seen):
                self.bad.append(seen)
            time.sleep(0.02)
        for fd in fds.values():
            os.close(fd)


# Every value the kubelet writes in the hour, per file: a sample must show one of them (a sample
# between its D-Bus write and its file write, or between two units, shows the one before or after).
EXTRAS = [(i % 4) * 8 * MI for i in range(4)]
allowed = {(u, k): {qos_values(e)[u][f"Memory{k.capitalize()}"] for e in EXTRAS}
           for u in (NODE, BURSTABLE) for k in ("min", "low")}
sampler = Sampler(lambda seen: all(v in allowed[key] for key, v in seen.items()))
sampler.start()
for i in range(WRITES):
    libcontainer_writes(qos_values(EXTRAS[i % 4]))
    time.sleep(PERIOD)
sampler.stop.set()
sampler.join()
after = calls()
check(after[0] == before[0], f"hour: {WRITES} writes of the kubelet's QoS manager: the daemon made"
                             f" {int(after[0] - before[0])} SetUnitProperties calls (0 expected)")
check(after[1] == before[1], f"hour: {int(after[1] - before[1])} foreign writes counted (0 expected)")
fought = [line for line in journal_since(mark) if "fighting" in line or "changed without us" in line]
check(not fought, f"hour: the journal names no foreign write nor fight: {fought[:2]}")
check(sampler.samples > 500 and not sampler.bad,
      f"hour: {sampler.samples} samples of the upper slices' files, every one a value the kubelet wrote"
      f" {sampler.bad[:2]}")
created = {u: read_memory(u) for u in CREATED}
check(all(created[u][k[len("Memory"):].lower()] == v for u, p in CREATED.items() for k, v in p.items()),
      f"create: the pods' and containers' values are the kubelet's: {created}")

plan = memqos_plan()  # offline: no kubelet asked, every value ours, the same ceiling and reserved slices
ceiling = next(u for u in plan["units"] if u["unit"] == BESTEFFORT).get("MemoryMax")
check(ceiling not in (None, "infinity") and int(service_show("MemoryMax", BESTEFFORT)) == ceiling,
      f"ours: the BestEffort ceiling holds its plan ({fmt_bytes(ceiling or 0)})")
reserved = {u: read_memory(u)["min"] for u in ("kube.slice", "system.slice")}
check(reserved == {u: CREATED[u]["MemoryMin"] for u in reserved},
      f"ours: the reserved slices hold what the kubelet wrote {reserved}")
check(metric("memqos_qos_memory_usage_bytes", qos_class="Burstable") not in (None, 0),
      "ours: the QoS slices' signals are served (memqos_qos_memory_usage_bytes)")

# ---- handover: the kubelet restarted with its gate off --------------------------------------------
ours = plan_expected(plan)
kubelet_last = qos_values(EXTRAS[(WRITES - 1) % 4])


def never_below_both(seen):
    return all(seen[(u, k)] >= min(kubelet_last[u][f"Memory{k.capitalize()}"], ours[u][k])
               for u in (NODE, BURSTABLE) for k in ("min", "low"))


sampler = Sampler(never_below_both)
sampler.start()
say_gate(False)
restarted = time.monotonic()
kubelet_restart()
check(wait_for(lambda: metric("memqos_companion_mode") == 0, 20),
      f"handover: every value ours {time.monotonic() - restarted:.1f} s after the kubelet's restart with its gate off")
bad, took = wait_kernel({u: ours[u] for u in (NODE, BURSTABLE, *CREATED)}, 20)
sampler.stop.set()
sampler.join()
check(not bad, f"handover: the plan in the kernel {took:.1f} s later {bad[:3]}")
check(not sampler.bad, f"handover: {sampler.samples} samples, none below the lower of the two writers' values"
                       f" {sampler.bad[:2]}")
os.unlink(METRICS_FILE)
