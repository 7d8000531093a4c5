#!/usr/bin/python3
"""What systemd 252 does with the calls the daemon makes, checked on the real thing (the daemon is
paused; memqos_systemd/systemd.py's notes say what the source suggests). Each CHECK states the
observed behaviour the daemon relies on; tests/e2e/README.md "What we learned" sums them up.

A. SetUnitProperties(MemoryMin) on a kubepods.slice that is not loaded: is the unit created,
   started, is memory.min written to the kernel, where does the drop-in go; then what the
   kubelet's StartTransientUnit(kubepods.slice) makes of that unit.
B. A transient pod slice (StartTransientUnit, as the kubelet makes it): where its runtime
   SetUnitProperties drop-ins go, and what is left after it stops.
C. SetUnitProperties on a pod slice / container scope that has gone: a stray slice (and its
   drop-in) or NoSuchUnit.
"""
# e2e-timeout: 180
import os
import shutil
import subprocess
import time

from memqos_e2e import *

pause_memqos()  # only our own calls here
CONTROL = "/run/systemd/system.control"
TRANSIENT = "/run/systemd/transient"
MIB = 1 << 20
CGROUP_ROOT = "/sys/fs/cgroup"


# --- A: a kubepods.slice nobody created ------------------------------------------------------
systemctl("stop", "kubepods.slice")
for d in (f"{CONTROL}/kubepods.slice.d",):
    shutil.rmtree(d, ignore_errors=True)
systemctl("daemon-reload")
loaded = wait_for(lambda: not unit_loaded("kubepods.slice"), 5)
check(loaded, f"A: before: kubepods.slice not loaded ({'not loaded' if loaded else 'still loaded'}),"
              f" cgroup dir {'present' if os.path.isdir(CGROUP_ROOT + '/kubepods.slice') else 'absent'}")

set_unit_properties("kubepods.slice", MemoryMin=32 * MIB)
st = show("kubepods.slice", "LoadState", "ActiveState", "Transient", "FragmentPath", "DropInPaths",
          "MemoryMin")
cg_now = os.path.isdir(CGROUP_ROOT + "/kubepods.slice")
min_now = read_file(CGROUP_ROOT + "/kubepods.slice/memory.min")
log(f"A: after SetUnitProperties: {st}, cgroup dir {cg_now}, memory.min {min_now}")
check(st.get("LoadState") == "loaded", f"A: SetUnitProperties loads the slice: LoadState={st.get('LoadState')}"
      f" ActiveState={st.get('ActiveState')} Transient={st.get('Transient')}")
check(f"{CONTROL}/kubepods.slice.d/" in st.get("DropInPaths", ""),
      f"A: its drop-in goes to {CONTROL}/kubepods.slice.d: {st.get('DropInPaths')}"
      f" ({listing(CONTROL + '/kubepods.slice.d')})")
check(True, f"A: right after the call: ActiveState={st.get('ActiveState')}, cgroup dir "
            f"{'present' if cg_now else 'absent'}, memory.min {min_now}")
time.sleep(1)
st1 = show("kubepods.slice", "ActiveState")
check(True, f"A: 1 s later: ActiveState={st1.get('ActiveState')}, memory.min "
            f"{read_file(CGROUP_ROOT + '/kubepods.slice/memory.min')}")

# The kubelet now creates its slices with StartTransientUnit.
err = None
try:
    start_transient_unit("kubepods.slice", dict(
        Description="libcontainer container kubepods", Wants=["-.slice"],
        DefaultDependencies=False, MemoryAccounting=True))
except SystemdError as e:
    err = str(e)
st = show("kubepods.slice", "ActiveState", "Transient", "Description", "DropInPaths")
check(True, f"A: then StartTransientUnit(kubepods.slice): {'error ' + err if err else 'ok'};"
            f" ActiveState={st.get('ActiveState')} Transient={st.get('Transient')}"
            f" Description={st.get('Description')!r}")
uid = new_pod_uid()
pod = create_pod_slice(uid, "burstable")  # starts kubepods.slice through Wants=/Slice= if needed
mmin = read_file(CGROUP_ROOT + "/kubepods.slice/memory.min")
check_eq(mmin, str(32 * MIB), "A: once a pod runs under it, kubepods.slice memory.min")
st = show("kubepods.slice", "ActiveState", "Transient", "DropInPaths")
check(True, f"A: kubepods.slice now ActiveState={st.get('ActiveState')} Transient={st.get('Transient')}"
            f" DropInPaths={st.get('DropInPaths')}")

# --- B: a transient pod slice --------------------------------------------------------------
scope, _ = create_container_scope(pod)
set_unit_properties(pod, MemoryLow=16 * MIB, MemoryHigh=64 * MIB)
set_unit_properties(scope, MemoryHigh=48 * MIB)
st = show(pod, "Transient", "FragmentPath", "DropInPaths")
pod_dropins = st.get("DropInPaths", "")
check(st.get("Transient") == "yes", f"B: pod slice Transient={st.get('Transient')},"
                                    f" FragmentPath={st.get('FragmentPath')}")
check(f"{TRANSIENT}/{pod}.d/" in pod_dropins and f"{CONTROL}/{pod}.d" not in pod_dropins,
      f"B: its runtime drop-ins go to {TRANSIENT}/<slice>.d: {pod_dropins}")
check(not os.path.exists(f"{CONTROL}/{pod}.d"), f"B: nothing in {CONTROL}/<pod slice>.d")
scope_dropins = show(scope, "DropInPaths").get("DropInPaths", "")
check(f"{TRANSIENT}/{scope}.d/" in scope_dropins, f"B: the scope's drop-ins: {scope_dropins}")
check_eq(read_file(unit_cgroup_dir(pod) + "/memory.low"), str(16 * MIB), "B: pod memory.low")
delete_container_scope(scope)
delete_pod_slice(pod)
gone = wait_for(lambda: not unit_loaded(pod) and not unit_loaded(scope), 10)
left = [p for p in (f"{TRANSIENT}/{pod}", f"{TRANSIENT}/{pod}.d", f"{TRANSIENT}/{scope}",
                    f"{TRANSIENT}/{scope}.d", f"{CONTROL}/{pod}.d", slice_cgroup_dir(pod))
        if os.path.exists(p)]
check(gone and not left, f"B: after stopping: units {'unloaded' if gone else 'still loaded'},"
                         f" left behind: {left}")

# --- C: writes to units that have gone -----------------------------------------------------
err = None
try:
    set_unit_properties(pod, MemoryLow=16 * MIB)
except SystemdError as e:
    err = str(e)
st = show(pod, "LoadState", "ActiveState", "Transient", "DropInPaths")
stray = os.path.isdir(f"{CONTROL}/{pod}.d")
check(err is None and stray,
      f"C: SetUnitProperties on a gone pod slice {'succeeds' if err is None else 'fails: ' + err}:"
      f" LoadState={st.get('LoadState')} ActiveState={st.get('ActiveState')}"
      f" Transient={st.get('Transient')}, stray drop-in {CONTROL}/<pod>.d "
      f"{'written' if stray else 'not written'}, cgroup dir "
      f"{'present' if os.path.isdir(slice_cgroup_dir(pod)) else 'absent'}")
err = None
try:
    set_unit_properties(scope, MemoryHigh=48 * MIB)
except SystemdError as e:
    err = str(e)
check(err is not None and "NoSuchUnit" in err or "not found" in (err or ""),
      f"C: SetUnitProperties on a gone scope: {err or 'succeeded'};"
      f" drop-in {'written' if os.path.isdir(f'{CONTROL}/{scope}.d') else 'not written'}")
shutil.rmtree(f"{CONTROL}/{pod}.d", ignore_errors=True)
shutil.rmtree(f"{CONTROL}/{scope}.d", ignore_errors=True)
systemctl("daemon-reload")

# --- D: what a daemon-reload / daemon-reexec looks like to a subscriber --------------------------
# The daemon keeps a cache of what systemd holds, kept by UnitNew/UnitRemoved/JobRemoved/Reloading.
import asyncio

from dbus_next import BusType, Message, MessageType
from dbus_next.aio import MessageBus

uid = new_pod_uid()
pod = create_pod_slice(uid, "burstable")
scope, _ = create_container_scope(pod)
for unit, props in (("kubepods.slice", dict(MemoryMin=8 * MIB, MemoryLow=24 * MIB)),
                    ("kubepods-burstable.slice", dict(MemoryLow=16 * MIB)),
                    (pod, dict(MemoryLow=16 * MIB)), (scope, dict(MemoryHigh=40 * MIB))):
    set_unit_properties(unit, **props)
ours = ("kubepods.slice", "kubepods-burstable.slice", pod, scope)


def held():
    out = {}
    for u in ours:
        st = show(u, "MemoryMin", "MemoryLow", "MemoryHigh")
        out[u] = tuple(st.get(k) for k in ("MemoryMin", "MemoryLow", "MemoryHigh"))
    return out


async def record(cmd, after=None, settle=1.5):
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    got = []

    def handler(msg):
        if msg.message_type == MessageType.SIGNAL and msg.interface == "org.freedesktop.systemd1.Manager":
            arg = msg.body[0] if msg.member != "JobRemoved" else msg.body[2]
            got.append((msg.member, arg))
    bus.add_message_handler(handler)
    await bus.call(Message(destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                           interface="org.freedesktop.DBus", member="AddMatch", signature="s",
                           body=["type='signal',sender='org.freedesktop.systemd1',"
                                 "interface='org.freedesktop.systemd1.Manager'"]))
    await bus.call(Message(destination="org.freedesktop.systemd1", path="/org/freedesktop/systemd1",
                           interface="org.freedesktop.systemd1.Manager", member="Subscribe"))
    proc = await asyncio.create_subprocess_exec(*cmd)
    await proc.wait()
    await asyncio.sleep(settle)
    if after:
        await asyncio.get_running_loop().run_in_executor(None, after)
        await asyncio.sleep(settle)
    bus.disconnect()
    return got


def summary(got):
    counts = {}
    for member, arg in got:
        if member == "Reloading":
            key = f"Reloading({arg})"
        elif isinstance(arg, str) and arg in ours:
            key = f"{member}(ours)"
        else:
            key = f"{member}(other)"
        counts[key] = counts.get(key, 0) + 1
    return counts


def kernel_min():
    return read_file(CGROUP_ROOT + "/kubepods.slice/memory.min")


# kubepods.slice still has part A's /run/systemd/system.control drop-in (MemoryMin=32Mi, written
# while it was not transient); the 8Mi above went to /run/systemd/transient/kubepods.slice.d.
before, kmin_before = held(), kernel_min()
got = asyncio.run(record(["systemctl", "daemon-reload"]))
after, kmin_after = held(), kernel_min()
counts = summary(got)
kept = [u for u in ours[1:] if after[u] == before[u]]
check(len(kept) == 3, f"D: daemon-reload: systemd still holds the values of the transient QoS slice,"
                      f" pod slice and scope ({len(kept)} of 3)")
check(True, f"D: kubepods.slice across daemon-reload: systemd held MemoryMin {before['kubepods.slice'][0]}"
            f" -> {after['kubepods.slice'][0]}, kernel memory.min {kmin_before} -> {kmin_after}"
            f" (DropInPaths {show('kubepods.slice', 'DropInPaths').get('DropInPaths')})")
stale_wins = after["kubepods.slice"][0] == str(32 * MIB) != before["kubepods.slice"][0]
check(True, f"D: the stale system.control drop-in {'WINS over' if stale_wins else 'does not win over'}"
            f" the later transient one after daemon-reload")
check(True, f"D: a subscriber sees during daemon-reload: {counts}")
removed_ours = [a for m, a in got if m == "UnitRemoved" and a in ours]
check(True, f"D: daemon-reload sends UnitRemoved (then UnitNew) for our units: {removed_ours or 'none'}")

set_unit_properties("kubepods.slice", MemoryMin=8 * MIB, MemoryLow=24 * MIB)
before = held()
late_uid = new_pod_uid()
late_pod = pod_slice_name(late_uid, "burstable")
got = asyncio.run(record(["systemctl", "daemon-reexec"], after=lambda: create_pod_slice(late_uid, "burstable"),
                         settle=2.0))
after, kmin_after = held(), kernel_min()
counts = summary(got)
check(True, f"D: daemon-reexec: systemd holds {after['kubepods.slice'][0]} for kubepods.slice"
            f" (set to 8Mi before), kernel {kmin_after}; QoS, pod, scope kept: "
            f"{[after[u] == before[u] for u in ours[1:]]}")
check(True, f"D: a subscriber sees during daemon-reexec (then a new pod slice): {counts}")
check(("UnitNew", late_pod) in got or ("JobRemoved", late_pod) in got,
      f"D: the subscription outlives daemon-reexec: signals for a pod slice created after it: "
      f"{[m for m, a in got if a == late_pod]}")
for u in (scope, pod, late_pod):
    stop_unit(u)

# --- E: a transient kubepods.slice, stopped ------------------------------------------------------
# What the daemon meets when the kubelet's slices are stopped while it still plans pods, and what
# any client setting kubepods.slice meets until the stopped unit is gone.
ensure_qos_slices()
stop_unit("kubepods.slice")
time.sleep(2)
stub = unit_loaded("kubepods.slice")
st = show("kubepods.slice", "LoadState", "ActiveState", "Transient")
err = None
try:
    set_unit_properties("kubepods.slice", MemoryMin=8 * MIB)
except SystemdError as e:
    err = str(e)
check(True, f"E: 2 s after stopping the transient kubepods.slice: in list-units={stub}, a new load"
            f" gives {st}; SetUnitProperties: {err or 'ok'}")
systemctl("daemon-reload")
err2 = None
try:
    set_unit_properties("kubepods.slice", MemoryMin=8 * MIB)
except SystemdError as e:
    err2 = str(e)
st = show("kubepods.slice", "LoadState", "ActiveState", "Transient")
check(err2 is None, f"E: after a daemon-reload SetUnitProperties on kubepods.slice: {err2 or 'ok'} ({st})")
systemctl("stop", "kubepods.slice")
shutil.rmtree(f"{CONTROL}/kubepods.slice.d", ignore_errors=True)
systemctl("daemon-reload")
