#!/usr/bin/python3
"""Every policy x hierarchy on a kubelet-like node: the kubelet stand-in serves a Guaranteed, a
Burstable (a limited app container and an unlimited sidecar) and a BestEffort pod; their slices
and containerd-style scopes run (StartTransientUnit, a process in each scope); kube.slice (with a
process in it) and system.slice are reserved and enforced. For None, TieredReservation and
HardReservation x effective and kubelet, after a config change and `systemctl reload`, every
unit's memory.min/low/high in /sys/fs/cgroup equals `memqos-systemd plan --output json` for the
same pods file and config at this node's MemTotal. Also: a reserved slice the daemon set before
it existed (kube.slice) gets its MemoryMin when it starts; `status` reports no drift, and per pod
its usage, the kernel's low/oom_kill counts and PSI, its containers by name, in lines of 100 columns."""
# e2e-timeout: 300
import itertools
import json
import os
import subprocess
import time

from memqos_e2e import *

need_deb()
MIB = 1 << 20

pods = sample_pods()
units = start_sample_node(pods)
names = {units[n]["slice"]: f"{n} pod" for n in units}
for n, p in zip(units, pods):
    for c, scope in zip(p["spec"]["containers"], units[n]["scopes"]):
        names[scope] = f"{n}/{c['name']}"
names.update({"kubepods.slice": "kubepods", "kubepods-burstable.slice": "burstable",
              "kubepods-besteffort.slice": "besteffort", "kube.slice": "kube.slice",
              "system.slice": "system.slice"})


def summary(expected, observed):
    """'kubepods 160Mi/64Mi/max, ...' (min/low/high) for the CHECK line, in plan order."""
    parts = []
    for u in expected:
        v = observed.get(u)
        parts.append(f"{names.get(u, u)} " + ("no cgroup" if v is None else
                                               "/".join(fmt_bytes(v[k]) for k in ("min", "low", "high"))))
    return ", ".join(parts)


# --- a reserved slice that does not exist yet -------------------------------------------------
subprocess.run(["systemctl", "stop", "memqos-e2e-kube-daemon.service"], capture_output=True)
kube_cg = slice_cgroup_dir("kube.slice")
check(not os.path.isdir(kube_cg), f"kube.slice has no cgroup before the daemon is told about it")
memqos_write_config(sample_config())
check(memqos_reload(), "reload with kube.slice/system.slice reserved")
expected = plan_expected(memqos_plan())
want_kube = expected["kube.slice"]["min"]
time.sleep(1.5)
state = service_show("ActiveState", "kube.slice")
v = kernel_memory(["kube.slice"])["kube.slice"]
check(True, f"kube.slice after the daemon's write, before anything runs in it: ActiveState={state},"
            f" LoadState={service_show('LoadState', 'kube.slice')}, cgroup "
            f"{'present, memory.min ' + fmt_bytes(v['min']) if v else 'absent'}")
start_reserved_slices()
got = wait_for(lambda: kernel_memory(["kube.slice"])["kube.slice"] and
               kernel_memory(["kube.slice"])["kube.slice"]["min"] == want_kube, 10, 0.05)
v = kernel_memory(["kube.slice"])["kube.slice"]
check(got, f"kube.slice memory.min once a process runs in it: {fmt_bytes(v and v['min'])}"
           f" (plan {fmt_bytes(want_kube)})")

# --- every policy x hierarchy ------------------------------------------------------------------
combos = [("None", "effective"), ("TieredReservation", "effective"),
          ("HardReservation", "effective"), ("HardReservation", "kubelet"),
          ("TieredReservation", "kubelet"), ("None", "kubelet")]
mem_total = mem_total_bytes()
log(f"MemTotal {mem_total} bytes")
for policy, hierarchy in combos:
    memqos_write_config(sample_config(memoryReservationPolicy=policy, hierarchy=hierarchy))
    plan_doc = memqos_plan(node_memory=mem_total)  # the same file the daemon will read
    expected = plan_expected(plan_doc)
    t0 = time.monotonic()
    reloaded = memqos_reload()
    bad, waited = wait_kernel(expected, 20)
    observed = kernel_memory(expected)
    check(reloaded and not bad,
          f"{policy}/{hierarchy}: {len(expected)} units equal plan "
          f"{time.monotonic() - t0:.1f} s after reload (min/low/high): {summary(expected, observed)}"
          + (f"; MISMATCH {bad}" if bad else ""))
    if plan_doc["warnings"]:
        log(f"plan warnings: {plan_doc['warnings']}")
    # Every running unit of the pods is planned (nothing of ours left unmanaged).
    missing = [u for u in names if u not in expected and not u.startswith(("kube.", "system."))]
    check(not missing, f"{policy}/{hierarchy}: every pod slice and scope is in the plan {missing}")

# What the kernel must hold in two well-known cases, independently of `plan`.
b, g = units["web"], units["db"]
k = kernel_memory([b["slice"], g["slice"], "kubepods.slice"])
check_eq((k[b["slice"]]["low"], k[g["slice"]]["min"], k["kubepods.slice"]["min"],
          k["kubepods.slice"]["low"]), (0, 0, 0, 0),
         "None/kubelet: no protection anywhere (web low, db min, kubepods min, low)")

memqos_write_config(sample_config())
memqos_reload()
expected = plan_expected(memqos_plan())
bad, _ = wait_kernel(expected, 20)
k = kernel_memory([b["slice"], g["slice"], "kubepods.slice", "kubepods-burstable.slice"])
check_eq((k[b["slice"]]["low"], k[g["slice"]]["min"], k["kubepods.slice"]["min"],
          k["kubepods.slice"]["low"], k["kubepods-burstable.slice"]["low"]),
         (64 * MIB, 96 * MIB, 96 * MIB, 64 * MIB, 64 * MIB),
         "TieredReservation/effective by hand: web low = 48+16Mi, db min = 96Mi, kubepods min/low,"
         " burstable low")
alloc = plan_doc["node"]["allocatableBytes"]
sidecar = units["web"]["scopes"][1]
want_high = (16 * MIB + 9 * (alloc - 16 * MIB) // 10) // PAGE_SIZE * PAGE_SIZE
check_eq(kernel_memory([sidecar])[sidecar]["high"], want_high,
         f"unlimited sidecar memory.high = 16Mi + 0.9*(allocatable {alloc} - 16Mi), page-rounded")

# `status` sees what we see.
p = subprocess.run(["memqos-systemd", "status", "--output", "json"], capture_output=True, text=True)
try:
    doc = json.loads(p.stdout)
    drift = [r["unit"] for r in doc["units"] if r["drift"]]
    check(p.returncode == 0 and not drift, f"memqos-systemd status: {len(doc['units'])} units, drift {drift}")
    # For people (issue 17): per pod what its cgroup says, its containers by name.
    seen = [(x["pod"], x["usageBytes"], x["events"], x["pressureFullAvg10"]) for x in doc["pods"]]
    check(len(seen) == len(pods) and all(isinstance(u, int) and u > 0 and isinstance(e["low"], int)
                                         and isinstance(e["oom_kill"], int) and isinstance(f, float)
                                         for _, u, e, f in seen),
          f"status per pod: memory.current, memory.events low/oom_kill, PSI full avg10 read: {seen}")
    check_eq(sorted(c["name"] for x in doc["pods"] for c in x["containers"]),
             sorted(c["name"] for p in pods for c in p["spec"]["containers"]), "status names the containers")
except ValueError:
    check(False, f"memqos-systemd status --output json: exit {p.returncode} {p.stderr[-300:]}")
t = subprocess.run(["memqos-systemd", "status", "--output", "table"], capture_output=True, text=True)
lines = t.stdout.splitlines()
# The summary is one paragraph wrapped to 100 columns: its "node: " line and the indented ones after it.
starts = [i for i, line in enumerate(lines) if line.startswith("node: ")]
summary = []
for i in starts:
    para = [lines[i], *itertools.takewhile(lambda x: x.startswith(" "), lines[i + 1:])]
    summary.append(" ".join(x.strip() for x in para))
check(t.returncode == 0 and lines and max(map(len, lines)) <= 100 and len(summary) == 1 and "not holding" in summary[0],
      f"status for people: {len(lines)} lines of at most 100 columns; {summary}")
