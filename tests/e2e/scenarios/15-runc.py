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
  update   `runc update` with the same values (the kubelet's resource resync): our values survive
           it (and the daemon-reload below)
  resize   played end to end as the kubelet does it: /pods first reports the resize allocated
           (allocatedResources, status resources), then `runc update --resources` (limit and the
           kubelet's unified map, as containerd sends a resize): memory.low and memory.high follow,
           the runtime's settings stay
  pending  a resize in the spec only, reported Infeasible (PodResizePending): nothing moves
  drift    a third party's MemoryLow on a container (which itself resets oom.group): corrected by
           the full timer resync, oom.group back to 1
  reload   `systemctl daemon-reload` resets oom.group everywhere; the daemon puts the runtime's 1
           back on the containers it writes; swap.max stays (systemd holds it since our first write);
           our values survive it after the runc updates
  delete   a pod's containers deleted by runc and its slice stopped: nothing of it is left (no
           unit, transient file, drop-in or cgroup)
  reset    `systemctl stop` + `memqos-systemd reset`: every container at 0/0/max, the runtime's
           settings kept; a daemon-reload after it (no daemon) keeps swap.max, and oom.group goes
           to 0 as it would on any node (documented)"""
# e2e-timeout: 300
import json
import os
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


def reported(pod, request, limit, *, spec=None, pending=None):
    """`pod` as the kubelet reports it after an in-place resize: allocated `request`, enacted
    `limit` (status), and the spec asking `spec` (request, limit) when a resize is pending."""
    pod = json.loads(json.dumps(pod))
    c, st = pod["spec"]["containers"][0], pod["status"]["containerStatuses"][0]
    asked = spec or (request, limit)
    c["resources"] = {"requests": {"memory": f"{asked[0]}Mi"}, "limits": {"memory": f"{asked[1]}Mi"}}
    st["allocatedResources"] = {"memory": f"{request}Mi"}
    st["resources"] = {"requests": {"memory": f"{request}Mi"}, "limits": {"memory": f"{limit}Mi"}}
    if pending:
        pod["status"]["conditions"] = [{"type": "PodResizePending", "status": "True", "reason": pending,
                                        "message": f"Node didn't have enough capacity: memory, requested: {asked[0]}Mi"}]
    return pod


# ---- facts: what runc 1.1 leaves, and what a bare write of ours did before the fix ------------------
cur, cur_units = runc_pod("cur", 64, 128, current=True)
old, old_units = runc_pod("old", 32, 96, current=False)
ctl, ctl_units = runc_pod("ctl", 16, 64, current=True)  # never listed: a control
ctl_old, ctl_old_units = runc_pod("ctl-old", 16, 64, current=False)
quiet, quiet_units = runc_pod("quiet", 16, 64, current=True)  # never listed, never written
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

# ---- update: the kubelet's resource resync runs runc update with the same values --------------------
app = cur_units["app"]
runc_update(cur_units["id"], limit=128 * MIB, swap=128 * MIB, unified=KUBELET_UNIFIED)
held = read_memory(app)
check((held["low"], held["high"]) == (plan[app]["low"], plan[app]["high"]),
      f"update: runc update (same values) leaves our memory.low/high: {held} (the daemon-reload below too)")
runtime_kept("update")

# ---- resize: /pods reports it allocated, then runc update ------------------------------------------
before = dict(plan[app])
write_pods([reported(cur, 96, 192), old])  # the kubelet's status moves first
plan = plan_expected(memqos_plan())
runc_update(cur_units["id"], limit=192 * MIB, swap=192 * MIB, unified=KUBELET_UNIFIED)
set_by_runc[app] = runtime(app)
bad, took = wait_kernel(plan, 30)
check(not bad and plan[app]["low"] == 96 * MIB and plan[app]["high"] > before["high"],
      f"resize: memory.low {fmt_bytes(before['low'])} -> {fmt_bytes(plan[app]['low'])}, memory.high"
      f" {fmt_bytes(before['high'])} -> {fmt_bytes(plan[app]['high'])}: kernel = plan {took:.1f} s after {bad}")
runtime_kept("resize")
check_eq(read_cgroup_file(app, "memory.max"), str(192 * MIB), "resize: memory.max is runc's new limit")

# ---- pending: a resize the kubelet cannot admit moves nothing ---------------------------------------
mark = journal_cursor()
write_pods([reported(cur, 96, 192, spec=(65536, 131072), pending="Infeasible"), old])
time.sleep(3)  # three polls
bad = compare_kernel(plan)
noted = [m for m in journal_since(mark) if "resize pending (Infeasible)" in m]
check(not bad and len(noted) == 1, f"pending: an Infeasible resize to 64Gi moves nothing {bad}; logged once:"
                                   f" {[m[:120] for m in noted]}")
write_pods([reported(cur, 96, 192), old])

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
bad = compare_kernel(plan)
check(not bad, f"daemon-reload: our values survive it, after the runc updates {bad}")
check(bool(kept), "daemon-reload: the daemon put the runtime's memory.oom.group back on the containers it manages")
check_eq(runtime(quiet_units["app"])["memory.oom.group"], "0",
         "fact: the daemon-reload reset memory.oom.group of a container nobody wrote (unlisted: left as on a"
         " node without the daemon)")
now = metric("memqos_oom_group_restores_total", result="ok") or 0
check(now >= restored + 1, f"memqos_oom_group_restores_total{{result=ok}}: {restored:g} before the daemon-reload,"
                           f" {now:g} after")
lines = [m for m in journal_since(mark) if "memory.oom.group" in m]
log(f"journal: {lines}")

# ---- delete: a pod goes, as the kubelet and containerd remove it -------------------------------------
gone = [quiet_units["app"], quiet_units["pause"], quiet_units["slice"]]
for unit in gone[:2]:
    runc_delete(unit[len("cri-containerd-"):-len(".scope")])
stop_unit(quiet_units["slice"])
left = {u: [p for p in (f"/run/systemd/transient/{u}", f"/run/systemd/transient/{u}.d",
                        f"/run/systemd/system.control/{u}.d") if os.path.exists(p)] + (["loaded"] if unit_loaded(u) else [])
        for u in gone}
check(not any(left.values()) and not os.path.exists(slice_cgroup_dir(quiet_units["slice"])),
      f"delete: nothing of the deleted pod is left (unit, transient file, drop-in, cgroup): {left}")

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
