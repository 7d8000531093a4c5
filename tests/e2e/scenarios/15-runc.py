#!/usr/bin/python3
"""Our writes keep what the real runtime set outside systemd (issue 21), on Debian's runc 1.1.

Every container here is made by `runc --systemd-cgroup run` as containerd drives it
(tests/e2e/README.md, "The real runtime"): a pause container per pod that /pods never lists, and
the app containers configured like a current kubelet's (limit, swap = limit, unified
memory.oom.group=1 and memory.swap.max=0) or an older one's (limit, swap = limit, no unified map).
runc writes memory.oom.group only to the file, and with swap = limit and no unified map also
memory.swap.max; systemd 252 rewrites both from its own state whenever it re-applies a unit.
  facts    what runc sends and writes; a write that does what the daemon did before the fix
           (MemoryLow alone, on an unlisted control container) turns oom.group 1 -> 0 and the
           older container's swap.max 0 -> max; writes to the pod slice or a sibling do not
  listed   pods listed after their containers started (the kubelet's order): every unit of the
           plan lands in the kernel, and every container's memory.oom.group / memory.swap.max is
           what runc set; no other setting file of any container or pod slice changed
  resize   `runc update --resources` of a container (limit and the kubelet's unified map, as
           containerd sends a resize) and the pod list moving its limit: MemoryHigh follows, the
           runtime's settings stay
  drift    a third party's MemoryLow on a container (which itself resets oom.group): corrected by
           the full timer resync, oom.group back to 1
  reload   `systemctl daemon-reload` resets oom.group everywhere; the daemon puts the runtime's 1
           back on the containers it writes; swap.max stays (systemd holds it since our first write)
  reset    `systemctl stop` + `memqos-systemd reset`: every container at 0/0/max, the runtime's
           settings kept; a daemon-reload after it (no daemon) keeps swap.max, and oom.group goes
           to 0 as it would on any node (documented)"""
# e2e-timeout: 300
import subprocess
import time

from memqos_e2e import *

need_deb()
MIB = 1 << 20
RUNTIME_FILES = ("memory.oom.group", "memory.swap.max")
OURS = ("memory.min", "memory.low", "memory.high")

start_empty_node(pods_only_config(resyncInterval="1s"),
                 "config: TieredReservation, effective, pods only, pollInterval 1s, resyncInterval 1s")


def runtime(unit):
    return {f: read_cgroup_file(unit, f) for f in RUNTIME_FILES}


def burstable_pod(name, request, limit, *, current):
    """A pod slice as the kubelet makes it (MemoryMax = the pod's limit), its pause container, and
    one app container run as a current (unified map) or an older kubelet would configure it."""
    pod = make_pod(name, [{"name": "app", "requests": {"memory": f"{request}Mi"}, "limits": {"memory": f"{limit}Mi"}}])
    slice_name = create_pod_slice(pod["metadata"]["uid"], "burstable", MemoryMax=limit * MIB)
    pause = runc_run(slice_name)
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("://")[1]
    app = runc_run(slice_name, cid, limit=limit * MIB, swap=limit * MIB,
                   unified=KUBELET_UNIFIED if current else None)
    return pod, {"slice": slice_name, "pause": pause["scope"], "app": app["scope"], "id": cid}


# ---- facts: what runc 1.1 leaves, and what a bare write of ours did before the fix ------------------
cur, cur_units = burstable_pod("cur", 64, 128, current=True)
old, old_units = burstable_pod("old", 32, 96, current=False)
ctl, ctl_units = burstable_pod("ctl", 16, 64, current=True)  # never listed: a control
ctl_old, ctl_old_units = burstable_pod("ctl-old", 16, 64, current=False)
quiet, quiet_units = burstable_pod("quiet", 16, 64, current=True)  # never listed, never written
containers = {u["app"]: u for u in (cur_units, old_units)}
pauses = [cur_units["pause"], old_units["pause"]]
set_by_runc = {s: runtime(s) for s in [*containers, *pauses, ctl_units["app"], ctl_old_units["app"]]}
log(f"after runc run: {set_by_runc}")
check_eq(set_by_runc[cur_units["app"]], {"memory.oom.group": "1", "memory.swap.max": "0"},
         "current kubelet's container: runc left memory.oom.group=1, memory.swap.max=0")
check_eq(set_by_runc[old_units["app"]], {"memory.oom.group": "0", "memory.swap.max": "0"},
         "older kubelet's container: runc left memory.swap.max=0 (swap = limit)")
held = {s: show(s, "MemorySwapMax", "MemoryMax", "OOMPolicy", "Delegate")
        for s in (cur_units["app"], old_units["app"])}
check(held[cur_units["app"]].get("MemorySwapMax") == "0" and held[old_units["app"]].get("MemorySwapMax") == "infinity",
      f"what systemd holds: current {held[cur_units['app']]}; older {held[old_units['app']]}"
      " (runc sent MemorySwapMax only from the unified map; OOMPolicy is never sent)")
for unit in (ctl_units["app"], ctl_old_units["app"]):
    set_unit_properties(unit, MemoryLow=8 * MIB)  # the daemon's write as it was before the fix
check_eq(runtime(ctl_units["app"]), {"memory.oom.group": "0", "memory.swap.max": "0"},
         "fact: a bare MemoryLow write on a current kubelet's container turns memory.oom.group 1 -> 0")
check_eq(runtime(ctl_old_units["app"]), {"memory.oom.group": "0", "memory.swap.max": "max"},
         "fact: on an older kubelet's container it turns memory.swap.max 0 -> max")
set_unit_properties(quiet_units["slice"], MemoryLow=8 * MIB)
set_unit_properties(quiet_units["pause"], MemoryLow=1 * MIB)
check_eq(runtime(quiet_units["app"]), {"memory.oom.group": "1", "memory.swap.max": "0"},
         "fact: writes to its pod slice and to a sibling container leave a container's settings alone"
         " (only a write to the scope itself re-applies them)")

# ---- listed: the kubelet lists the pods after their containers started ------------------------------
before = {u: cgroup_settings(u) for u in [*containers, *pauses, cur_units["slice"], old_units["slice"]]}
write_pods([cur, old])
plan = plan_expected(memqos_plan())
bad, took = wait_kernel(plan, 30)
check(not bad, f"{len(plan)} units: kernel = plan {took:.1f} s after the pods were listed {bad}")


def runtime_kept(step, expected=None):
    expected = expected or set_by_runc
    now = {s: runtime(s) for s in [*containers, *pauses]}
    wrong = {s: (now[s], expected[s]) for s in now if now[s] != expected[s]}
    check(not wrong, f"{step}: memory.oom.group and memory.swap.max of {len(now)} containers are what runc set"
                     f" {wrong}")


runtime_kept("listed")
changed = {}
for unit, files in before.items():
    after = cgroup_settings(unit)
    diff = {f: (files.get(f), after.get(f)) for f in sorted(set(files) | set(after))
            if f not in OURS and files.get(f) != after.get(f)}
    if diff:
        changed[unit] = diff
check(not changed, f"listed: no other setting file of {len(before)} containers and pod slices changed"
                   f" (memory.min/low/high aside) {changed}")
swap_held = show(old_units["app"], "MemorySwapMax").get("MemorySwapMax")
check_eq(swap_held, "0", "listed: systemd now holds the older container's MemorySwapMax (carried in our write)")

# ---- resize: runc update and the pod list moving the limit --------------------------------------------
mark = journal_cursor()
runc_update(cur_units["id"], limit=192 * MIB, swap=192 * MIB, unified=KUBELET_UNIFIED)
set_by_runc[cur_units["app"]] = runtime(cur_units["app"])
resized = make_pod("cur", [{"name": "app", "id": cur_units["id"], "requests": {"memory": "64Mi"},
                            "limits": {"memory": "192Mi"}}], uid=cur["metadata"]["uid"])
write_pods([resized, old])
plan = plan_expected(memqos_plan())
bad, took = wait_kernel(plan, 30)
check(not bad and plan[cur_units["app"]]["high"] > 128 * MIB,
      f"resize: kernel = plan {took:.1f} s after the pod list moved (container memory.high"
      f" {fmt_bytes(plan[cur_units['app']]['high'])}) {bad}")
runtime_kept("resize")
check_eq(read_cgroup_file(cur_units["app"], "memory.max"), str(192 * MIB), "resize: memory.max is runc's new limit")

# ---- drift: a third party writes a container; the full timer resync puts it right ------------------
set_unit_properties(old_units["app"], MemoryLow=1 * MIB)
check_eq(runtime(old_units["app"])["memory.oom.group"], "0",
         "drift: the third party's write itself reset memory.oom.group (systemd, not us)")
bad, took = wait_kernel(plan, 40)
check(not bad, f"drift: corrected {took:.1f} s after the third party's write {bad}")
runtime_kept("drift")

# ---- reload: daemon-reload resets memory.oom.group on every container; ours get it back --------------
check_eq(runtime(quiet_units["app"])["memory.oom.group"], "1",
         "before the daemon-reload: a container nobody wrote keeps runc's memory.oom.group")
restored = metric("memqos_oom_group_restores_total", result="ok") or 0
systemctl("daemon-reload")
kept = wait_for(lambda: all(runtime(s) == set_by_runc[s] for s in containers), 15, 0.1)
runtime_kept("daemon-reload")
check(bool(kept), "daemon-reload: the daemon put the runtime's memory.oom.group back on the containers it manages")
check_eq(runtime(quiet_units["app"])["memory.oom.group"], "0",
         "fact: the daemon-reload reset memory.oom.group of a container nobody wrote (unlisted: left as on a"
         " node without the daemon)")
now = metric("memqos_oom_group_restores_total", result="ok") or 0
check(now >= restored + 1, f"memqos_oom_group_restores_total{{result=ok}}: {restored:g} before the daemon-reload,"
                           f" {now:g} after")
lines = [m for m in journal_since(mark) if "memory.oom.group" in m]
log(f"journal: {lines}")

# ---- reset: the daemon stopped, every container back to 0/0/max, the runtime's settings kept ---------
systemctl("stop", MEMQOS_UNIT)
try:
    p = subprocess.run(["memqos-systemd", "reset"], capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, f"reset: exit {p.returncode} {p.stderr.strip()[-300:]}")
    values = {s: read_memory(s) for s in containers}
    check(all(v["min"] == 0 and v["low"] == 0 and v["high"] == UINT64_MAX for v in values.values()),
          f"reset: every container at 0/0/max {values}")
    runtime_kept("reset")
    systemctl("daemon-reload")
    time.sleep(1)
    after = {s: runtime(s) for s in containers}
    check(all(after[s]["memory.swap.max"] == set_by_runc[s]["memory.swap.max"] for s in containers),
          f"reset, then daemon-reload with the daemon stopped: memory.swap.max kept (systemd holds it) {after}")
    log(f"after reset and a daemon-reload without the daemon: {after} (memory.oom.group 0: systemd's own,"
        " as on a node without the daemon)")
finally:
    systemctl("start", MEMQOS_UNIT)
    runc_delete_all()
