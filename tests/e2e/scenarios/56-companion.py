#!/usr/bin/python3
"""Beside the kubelet of today (issues 36, 42): companion mode on real systemd, against a second
writer that writes what a v1.37 kubelet with its Memory QoS on writes, the way libcontainer's
systemd manager writes it (SetUnitProperties, then the cgroup files).

  mode      the kubelet stand-in's /metrics says kubernetes_feature_enabled{name="MemoryQoS"} 1 and
            its config file (kubeletConfigFile) memoryReservationPolicy: TieredReservation: the
            daemon (companion: auto) leaves it the pods' protection (memqos_companion_mode 1,
            memqos_kubelet_protects 1), and `check` says who writes what
  create    the pods' and containers' values written once, as the kubelet and the runtime write
            them at creation: 0 writes of ours follow
  hour      the QoS manager's writes of kubepods.slice and kubepods-burstable.slice, 12 of them
            (one every 0.5 s), the values varying as pods come and go, the files sampled every
            20 ms: the daemon makes 0 SetUnitProperties calls, counts 0 foreign writes and 0
            fights, and the files always show the kubelet's values (the real kubelet's own minute
            round beside the service: 59-real-kubelet-beside, which let this phase shrink from 60)
  ours      what it adds: the BestEffort ceiling as planned; the QoS slices' signals are served;
            the reserved slices hold what the kubelet wrote as it enforced them
  handover  the kubelet restarted with its gate off in its config file alone (its /metrics gone),
            writing its start's zeros: the daemon reads the file again at the kubelet's start and
            owns every value within a few seconds (its plan in the kernel); the zeros are the
            kubelet's moment (memqos_kubelet_resets_total, logged), no foreign write, and no stretch of
            the upper slices' memory.min/low below the lower of the two writers' values is longer
            than 2 s
  defaults  the kubelet restarted at its v1.37 defaults (gate on, no policy, no factor), writing
            its start's zeros: companion mode that protects the pods itself (memqos_kubelet_protects
            0), our plan in the kernel within a few seconds, 0 foreign writes and 0 fights after,
            and `check` says the service protects the pods"""
# e2e-timeout: 300
import atexit
import json
import os
import subprocess
import threading
import time

from memqos_e2e import *

need_deb()
MI = 1 << 20
NODE, BURSTABLE, BESTEFFORT = "kubepods.slice", "kubepods-burstable.slice", "kubepods-besteffort.slice"
METRICS_FILE = PODS_FILE + ".metrics"  # what the stand-in's /metrics serves (kubelet_stub.py)
KUBELET_FILE = "/etc/memqos-systemd/e2e-kubelet.yaml"  # the stand-in's "config file" (readable by the service)
GATE = ('kubernetes_build_info{git_version="v1.37.1",major="1",minor="37"} 1\n'
        'kubernetes_feature_enabled{name="MemoryQoS",stage="BETA"} %d\n')
PERIOD, WRITES = 0.5, 12


def say_gate(on):
    with open(METRICS_FILE + ".tmp", "w") as f:
        f.write(GATE % int(on))
    os.replace(METRICS_FILE + ".tmp", METRICS_FILE)


def kubelet_file(doc):
    with open(KUBELET_FILE + ".tmp", "w") as f:
        f.write(json.dumps(doc))  # YAML is a superset of JSON
    os.replace(KUBELET_FILE + ".tmp", KUBELET_FILE)


atexit.register(lambda: os.path.exists(KUBELET_FILE) and os.unlink(KUBELET_FILE))
TIERED = {"kind": "KubeletConfiguration", "featureGates": {"MemoryQoS": True},
          "memoryReservationPolicy": "TieredReservation"}
pods = sample_pods()  # db: Guaranteed 96Mi; web: Burstable app 48Mi + sidecar 16Mi; batch: BestEffort
units = start_sample_node(pods, reserved=True)
say_gate(True)
kubelet_file(TIERED)
memqos_write_config(sample_config(companion="auto", bestEffortCeiling={"enabled": True}, kubeletConfigFile=KUBELET_FILE))
systemctl("restart", MEMQOS_UNIT)  # a fresh daemon asks the kubelet as it starts
check(wait_for(lambda: metric("memqos_companion_mode") == 1 and metric("memqos_kubelet_protects") == 1, 30),
      "mode: the kubelet's /metrics says its Memory QoS is on, its config file TieredReservation: companion mode,"
      " the kubelet protects the pods (memqos_companion_mode 1, memqos_kubelet_protects 1)")
said = " ".join(text for _, text in check_findings(
    subprocess.run(["memqos-systemd", "check"], capture_output=True, text=True).stdout))
check("companion: the kubelet protects the pods (the kubelet's own Memory QoS is on (kubelet http" in said
      and "memqos-systemd writes the rest: MemoryHigh" in said,
      "mode: check says who writes what, from the kubelet's /metrics and its config file")

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
            sum(v for _, v in m.get("memqos_foreign_writes_total", [])),
            sum(v for _, v in m.get("memqos_kubelet_resets_total", [])))


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
        self.run_now = self.longest = 0.0  # seconds of consecutive samples `ok` refused
        self.since = None  # when the current run of refused samples began

    def stretch(self):
        return max(self.longest, self.run_now)

    def run(self):
        paths = {(u, k): os.path.join(slice_cgroup_dir(u), f"memory.{k}") for u in (NODE, BURSTABLE)
                 for k in ("min", "low")}
        fds = {key: os.open(p, os.O_RDONLY) for key, p in paths.items()}
        while not self.stop.is_set():
            seen = {key: int(os.pread(fd, 32, 0).strip() or 0) for key, fd in fds.items()}
            self.samples += 1
            t = time.monotonic()
            if not self.ok(seen):
                self.bad.append(seen)
                self.since = t if self.since is None else self.since
                self.run_now = t - self.since + 0.02
            elif self.since is not None:
                self.longest, self.run_now, self.since = max(self.longest, self.run_now), 0.0, None
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
check(sampler.samples > 100 and not sampler.bad,
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

# ---- handover: the kubelet restarted with its gate off, in its config file alone --------------------
kubelet_last = qos_values(EXTRAS[(WRITES - 1) % 4])
START_ZEROS = {NODE: {"MemoryMin": 0, "MemoryLow": 0}, BURSTABLE: {"MemoryLow": 0}}
GATE_OFF = {"kind": "KubeletConfiguration", "featureGates": {"MemoryQoS": False}}


def never_below_both(ours):
    return lambda seen: all(seen[(u, k)] >= min(kubelet_last[u][f"Memory{k.capitalize()}"], ours[u][k])
                            for u in (NODE, BURSTABLE) for k in ("min", "low"))


kubelet_file(GATE_OFF)
ours = plan_expected(memqos_plan())  # with the kubelet's gate off: every value ours
os.unlink(METRICS_FILE)  # its /metrics no longer says: its config file alone does (issue 42)
before = calls()
sampler = Sampler(never_below_both(ours))
sampler.start()
restarted = time.monotonic()
kubelet_restart()
libcontainer_writes(START_ZEROS)  # its start (QoS manager and node allocatable) with the gate off
check(wait_for(lambda: metric("memqos_companion_mode") == 0, 20),
      f"handover: every value ours {time.monotonic() - restarted:.1f} s after the kubelet's restart with its gate off"
      f" in its config file alone")
bad, took = wait_kernel({u: ours[u] for u in (NODE, BURSTABLE, *CREATED)}, 20)
time.sleep(1)
sampler.stop.set()
sampler.join()
after = calls()
check(not bad, f"handover: the plan in the kernel {took:.1f} s later {bad[:3]}")
check(sampler.stretch() <= 2.0, f"handover: {sampler.samples} samples, the longest stretch below the lower of the"
                                f" two writers' values {sampler.stretch():.2f} s (goal <= 2 s) {sampler.bad[:2]}")
check(after[1] == before[1], f"handover: {after[1] - before[1]:g} foreign writes (0 expected: the kubelet's start"
                             f" zeros are its moment, memqos_kubelet_resets_total +{after[2] - before[2]:g})")

# ---- defaults: the kubelet of v1.37 at its defaults protects no pod; the service does ---------------
kubelet_file({"kind": "KubeletConfiguration"})  # nothing set: gate on (v1.37), policy None, no factor
say_gate(True)
ours = plan_expected(memqos_plan())  # beside it: ours everywhere but the reserved slices' MemoryMin
check(ours[NODE]["min"] > 0 and ours[web["slice"]]["low"] > 0, f"defaults: the plan protects the pods {ours[NODE]}")
before = calls()
sampler = Sampler(never_below_both(ours))
sampler.start()
kubelet_restart()
libcontainer_writes(START_ZEROS)  # its start with policy None
check(wait_for(lambda: metric("memqos_companion_mode") == 1 and metric("memqos_kubelet_protects") == 0, 20),
      "defaults: companion mode in which the service protects the pods (memqos_kubelet_protects 0)")
bad, took = wait_kernel({u: ours[u] for u in (NODE, BURSTABLE, *CREATED) if u not in ("kube.slice", "system.slice")},
                        20)
check(not bad, f"defaults: our plan in the kernel {took:.1f} s after the kubelet's start {bad[:3]}")
time.sleep(3)  # rounds and resyncs: a v1.37 kubelet at its defaults writes nothing more
sampler.stop.set()
sampler.join()
after = calls()
check(after[1] == before[1], f"defaults: {after[1] - before[1]:g} foreign writes (0 expected: its start zeros put back"
                             f" as its moment, memqos_kubelet_resets_total +{after[2] - before[2]:g})")
check(sampler.stretch() <= 2.0, f"defaults: the longest stretch below the plan {sampler.stretch():.2f} s (goal <= 2 s)")
p = subprocess.run(["memqos-systemd", "check"], capture_output=True, text=True)
said = " ".join(text for _, text in check_findings(p.stdout))
check("companion: the kubelet's Memory QoS protects no pod, the service does" in said,
      f"defaults: check says the service protects the pods (exit {p.returncode})")
os.unlink(METRICS_FILE)
