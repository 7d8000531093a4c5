#!/usr/bin/python3
"""Writes addressed by invocation ID: what the daemon relies on, on real systemd.

The daemon writes the kubepods tree through Unit.SetProperties on each unit's invocation path
(memqos_systemd/systemd.py). The checks of A-E are what that relies on and fail if systemd
does otherwise; R records a fact (the part of the window this does not close); O runs the
daemon's own adapter through the same steps.

Manager.SetUnitProperties(name, ...) on a pod slice that has just been stopped and collected makes
a stray (a plain inactive slice, /run/systemd/system.control/<slice>.d, a cgroup directory; see
11-systemd-facts C). systemd also addresses a unit by its invocation ID: GetUnitByInvocationID(ay)
gives /org/freedesktop/systemd1/unit/<32 hex>, "valid only as long as the invocation ID stays the
same". What systemd 252 does with that (the daemon is paused):

A. do transient slices and scopes (StartTransientUnit, as the kubelet and runc make them) have an
   InvocationID while active?
B. which path GetUnitByInvocationID returns;
C. Unit.SetProperties(true, MemoryLow=8Mi) on that path while the unit runs: result, kernel
   memory.low, where the drop-in goes; GetAll on the path;
E. the invocation ID of a running unit across daemon-reload (and daemon-reexec): the path still
   valid?
D. after the slice (and scope) stopped and were collected: SetProperties and GetAll on the saved
   path: error name, and whether anything is created (unit loaded, system.control drop-in,
   transient file, cgroup directory);
R. the rest of the window: a slice stopped but not yet collected (held with Unit.Ref()), written
   through its invocation path, then let go: what is written and what is left (a fact);
X. the invocation ID systemd puts on a pod slice's cgroup directory as the extended attributes
   user.invocation_id and trusted.invocation_id: present once the start job has ended, equal to
   InvocationID, readable in the service's sandbox (no capabilities: trusted.* needs
   CAP_SYS_ADMIN), the new run's after a restart of the same name. The daemon writes a pod slice
   that has just started with it, without asking systemd for the ID. (Container scopes: recorded;
   on 252 they have none);
O. memqos_systemd's Systemd.set_memory_if_loaded on a running pod slice and scope (the values
   reach the kernel), and again with the same round's state after the slice was collected:
   NoSuchUnit, and nothing of it is created.
"""
# e2e-timeout: 180
import os
import shutil
import subprocess
import time

from memqos_e2e import *
from memqos_e2e import SD_MANAGER, SD_PATH, _call, slice_cgroup_dir, systemctl, unit_loaded

pause_memqos()  # only our own calls here
CONTROL = "/run/systemd/system.control"
TRANSIENT = "/run/systemd/transient"
MIB = 1 << 20
UNIT_IFACE = "org.freedesktop.systemd1.Unit"
PROPS_IFACE = "org.freedesktop.DBus.Properties"


def try_call(path, iface, member, sig="", body=()):
    """(True, reply body) or (False, 'member: error.name: message')."""
    try:
        return True, _call(path, iface, member, sig, body)
    except SystemdError as e:
        return False, str(e)


def val(v):
    if isinstance(v, dict):  # busctl JSON variant
        v = v.get("data")
    return v.value if hasattr(v, "value") else v


def hexid(v):
    v = val(v)
    if isinstance(v, (bytes, bytearray)):
        return v.hex()
    if isinstance(v, list):
        return bytes(v).hex()
    return repr(v)


def invocation_id(name):
    ok, r = try_call(unit_path(name), PROPS_IFACE, "Get", "ss", [UNIT_IFACE, "InvocationID"])
    return hexid(r[0]) if ok else f"error {r}"


def listing_or_absent(path):
    return listing(path, "absent")


def traces(unit):
    """What exists for a unit name, without loading it (list-units, files, cgroup dir)."""
    out = {
        "loaded": unit_loaded(unit),
        "control.d": listing_or_absent(f"{CONTROL}/{unit}.d"),
        "transient": "present" if os.path.exists(f"{TRANSIENT}/{unit}") else "absent",
        "transient.d": listing_or_absent(f"{TRANSIENT}/{unit}.d"),
    }
    if unit.endswith(".slice"):
        out["cgroup"] = "present" if os.path.isdir(slice_cgroup_dir(unit)) else "absent"
    return out


def getall_summary(path, iface=UNIT_IFACE):
    ok, r = try_call(path, PROPS_IFACE, "GetAll", "s", [iface])
    if not ok:
        return f"fails: {r}"
    props = r[0] if r else {}
    if isinstance(props, dict) and "data" in props and "type" in props:  # busctl JSON
        props = props["data"]
    props = props or {}
    return (f"ok ({len(props)} properties; Id={val(props.get('Id'))!r}"
            f" ActiveState={val(props.get('ActiveState'))!r}"
            f" InvocationID={hexid(props.get('InvocationID'))})")


def set_by_path(path, **props):
    body = [True, [(k, ("t", v)) for k, v in props.items()]]
    ok, r = try_call(path, UNIT_IFACE, "SetProperties", "ba(sv)", body)
    return "ok" if ok else f"fails: {r}"


def inv_path(inv_hex):
    """GetUnitByInvocationID(ay). The helpers' dbus-next conversion turns an `ay` into a list,
    which dbus-next refuses (it wants bytes), so with dbus-next the call is made here."""
    import memqos_e2e

    if memqos_e2e.BACKEND != "dbus-next":
        ok, r = try_call(SD_PATH, SD_MANAGER, "GetUnitByInvocationID", "ay",
                         [bytes.fromhex(inv_hex)])
        return (True, r[0]) if ok else (False, r)
    import asyncio

    from dbus_next import BusType, Message, MessageType
    from dbus_next.aio import MessageBus

    dn = memqos_e2e._dn

    async def go():
        if dn["bus"] is None or not dn["bus"].connected:
            dn["bus"] = await MessageBus(bus_type=BusType.SYSTEM).connect()
        return await dn["bus"].call(Message(
            destination="org.freedesktop.systemd1", path=SD_PATH, interface=SD_MANAGER,
            member="GetUnitByInvocationID", signature="ay", body=[bytes.fromhex(inv_hex)]))

    if dn["loop"] is None:
        dn["loop"] = asyncio.new_event_loop()
    reply = dn["loop"].run_until_complete(go())
    if reply.message_type == MessageType.ERROR:
        return False, (f"GetUnitByInvocationID: {reply.error_name}:"
                       f" {reply.body[0] if reply.body else ''}")
    return True, reply.body[0]


def is_hex32(s):
    return isinstance(s, str) and len(s) == 32 and all(c in "0123456789abcdef" for c in s)


# --- A: invocation IDs of transient slices and scopes ------------------------------------------
ensure_qos_slices()
uid = new_pod_uid()
pod = create_pod_slice(uid, "burstable")
scope, _ = create_container_scope(pod)
units = ("kubepods.slice", "kubepods-burstable.slice", pod, scope)
ids = {u: invocation_id(u) for u in units}
shown = {u: show(u, "InvocationID", "ActiveState", "Transient") for u in units}
for u in units:
    label = "pod slice" if u == pod else "container scope" if u == scope else u
    check(True, f"A: {label}"
                f" ({shown[u].get('ActiveState')}, Transient={shown[u].get('Transient')}):"
                f" InvocationID over D-Bus {ids[u] or '(empty)'}, systemctl show"
                f" {shown[u].get('InvocationID') or '(empty)'}")
check(all(is_hex32(ids[u]) and ids[u] != '0' * 32 for u in units),
      "A: every transient slice and scope has a non-empty invocation ID while active")

pod_inv, scope_inv = ids[pod], ids[scope]
if not (is_hex32(pod_inv) and pod_inv != "0" * 32):
    check(True, f"A: the pod slice has no invocation ID ({pod_inv}): B-R cannot be checked")
    for u in (scope, pod):
        stop_unit(u)
    raise SystemExit(0)

# --- B: GetUnitByInvocationID ----------------------------------------------------------------
ok, pod_path = inv_path(pod_inv)
ok_s, scope_path = inv_path(scope_inv) if is_hex32(scope_inv) else (False, "no invocation ID")
ok_n, name_path = try_call(SD_PATH, SD_MANAGER, "GetUnit", "s", [pod])
expected = f"/org/freedesktop/systemd1/unit/{pod_inv}"
# A bus label cannot start with a digit: systemd escapes a leading digit (5 -> _35).
escaped = ("_%02x" % ord(pod_inv[0]) + pod_inv[1:]) if pod_inv[0].isdigit() else pod_inv
expected = f"/org/freedesktop/systemd1/unit/{escaped}"
check(ok and pod_path == expected, f"B: GetUnitByInvocationID(pod slice): {pod_path if ok else 'fails: ' + pod_path};"
            f" the form /org/freedesktop/systemd1/unit/<invocation id hex, a leading digit"
            f" escaped as _3N>: {ok and pod_path == expected}; GetUnit(name) gives"
            f" {name_path[0] if ok_n else name_path}")
check(True, f"B: GetUnitByInvocationID(scope): {scope_path if ok_s else 'fails: ' + scope_path};"
            f" form unit/<invocation id>: {ok_s and scope_path.endswith(scope_inv[1:])}")
if not ok:
    pod_path = expected  # still try the documented form below
if not ok_s and is_hex32(scope_inv):
    scope_path = "/org/freedesktop/systemd1/unit/" + (
        ("_%02x" % ord(scope_inv[0]) + scope_inv[1:]) if scope_inv[0].isdigit() else scope_inv)

# --- C: writes through the invocation path while the units run --------------------------------
res = set_by_path(pod_path, MemoryLow=8 * MIB)
st = show(pod, "MemoryLow", "DropInPaths", "Transient")
check(res == "ok" and read_file(slice_cgroup_dir(pod) + '/memory.low') == str(8 * MIB),
      f"C: Unit.SetProperties(true, MemoryLow=8Mi) on the pod slice's invocation path: {res};"
            f" kernel memory.low {read_file(slice_cgroup_dir(pod) + '/memory.low')}"
            f" (8Mi = {8 * MIB}), systemd MemoryLow={st.get('MemoryLow')}")
check(listing_or_absent(f"{CONTROL}/{pod}.d") == "absent", f"C: its drop-in (not under system.control): DropInPaths={st.get('DropInPaths')}; {TRANSIENT}/<pod>.d"
            f" {listing_or_absent(f'{TRANSIENT}/{pod}.d')}; {CONTROL}/<pod>.d {listing_or_absent(f'{CONTROL}/{pod}.d')}")
check(True, f"C: GetAll({UNIT_IFACE}) on the invocation path while running: {getall_summary(pod_path)}")
check(True, f"C: GetAll(org.freedesktop.systemd1.Slice) on it: "
            f"{getall_summary(pod_path, 'org.freedesktop.systemd1.Slice')}")
if isinstance(scope_path, str) and scope_path.startswith("/"):
    res = set_by_path(scope_path, MemoryHigh=48 * MIB)
    sst = show(scope, "MemoryHigh", "DropInPaths")
    check(True, f"C: SetProperties(MemoryHigh=48Mi) on the scope's invocation path: {res};"
                f" systemd MemoryHigh={sst.get('MemoryHigh')}, DropInPaths={sst.get('DropInPaths')}")

# --- E: daemon-reload and daemon-reexec --------------------------------------------------------
for cmd in ("daemon-reload", "daemon-reexec"):
    t = time.monotonic()
    systemctl(cmd)
    wait_for(lambda: try_call(SD_PATH, PROPS_IFACE, "Get", "ss", [SD_MANAGER, "Version"])[0], 20, 0.2)
    after = {u: invocation_id(u) for u in (pod, scope)}
    check(True, f"E: after {cmd} ({time.monotonic() - t:.1f} s): pod slice invocation ID"
                f" {'unchanged' if after[pod] == pod_inv else 'CHANGED ' + pod_inv + ' -> ' + after[pod]},"
                f" scope {'unchanged' if after[scope] == scope_inv else 'CHANGED ' + scope_inv + ' -> ' + after[scope]}")
    check(True, f"E: after {cmd}: GetAll on the saved invocation path: {getall_summary(pod_path)};"
                f" GetUnitByInvocationID: {inv_path(pod_inv)[1]}")
    res = set_by_path(pod_path, MemoryLow=12 * MIB)
    check(res == "ok" and read_file(slice_cgroup_dir(pod) + '/memory.low') == str(12 * MIB),
          f"E: after {cmd}: SetProperties(MemoryLow=12Mi) on the saved path: {res}; kernel"
                f" memory.low {read_file(slice_cgroup_dir(pod) + '/memory.low')}"
                f" (12Mi = {12 * MIB})")

# --- D: after the units have gone --------------------------------------------------------------
stop_unit(scope)
stop_unit(pod)
gone = wait_for(lambda: not unit_loaded(pod) and not unit_loaded(scope), 15, 0.1)
check(True, f"D: after StopUnit: pod slice and scope {'collected' if gone else 'still loaded'};"
            f" pod slice traces {traces(pod)}")
check(True, f"D: GetUnitByInvocationID(saved pod ID) once gone: {inv_path(pod_inv)[1]}")
res = set_by_path(pod_path, MemoryLow=8 * MIB)
NOTHING = {"loaded": False, "control.d": "absent", "transient": "absent", "transient.d": "absent",
           "cgroup": "absent"}
check(gone and "NoUnitForInvocationID" in res,
      f"D: SetProperties(MemoryLow=8Mi) on the gone pod slice's invocation path: {res}")
check(traces(pod) == NOTHING, f"D: after that call, nothing of the pod slice exists: {traces(pod)}")
check(True, f"D: GetAll on the gone pod slice's invocation path: {getall_summary(pod_path)};"
            f" then traces {traces(pod)}")
if isinstance(scope_path, str) and scope_path.startswith("/"):
    res = set_by_path(scope_path, MemoryHigh=48 * MIB)
    check(True, f"D: SetProperties on the gone scope's invocation path: {res}; GetAll:"
                f" {getall_summary(scope_path)}; scope traces {traces(scope)}")
# For contrast, the same ID in the name-looking path that GetUnit gives would load by name; not
# repeated here (11-systemd-facts C: SetUnitProperties by name makes the stray).

# --- R: stopped but not yet collected (held by Unit.Ref) ---------------------------------------
uid2 = new_pod_uid()
pod2 = create_pod_slice(uid2, "burstable")
inv2 = invocation_id(pod2)
ok2, path2 = inv_path(inv2) if is_hex32(inv2) else (False, inv2)
if not ok2:
    check(True, f"R: no invocation path for a second pod slice: {path2}")
else:
    okr, r = try_call(unit_path(pod2), UNIT_IFACE, "Ref")
    check(True, f"R: Unit.Ref() on a second pod slice: {'ok' if okr else r}")
    stop_unit(pod2)
    time.sleep(0.5)
    st = show(pod2, "ActiveState", "InvocationID")
    check(True, f"R: stopped, held: loaded={unit_loaded(pod2)} ActiveState={st.get('ActiveState')}"
                f" InvocationID {'same' if st.get('InvocationID') == inv2 else st.get('InvocationID')};"
                f" GetUnitByInvocationID: {inv_path(inv2)[1]}")
    check(True, f"R: before the write: traces {traces(pod2)}")
    res = set_by_path(path2, MemoryLow=8 * MIB)
    check(True, f"R: SetProperties(MemoryLow=8Mi) on the stopped-not-collected slice's invocation"
                f" path: {res}; traces {traces(pod2)}")
    if okr:
        okr, r = try_call(unit_path(pod2), UNIT_IFACE, "Unref")
    gone2 = wait_for(lambda: not unit_loaded(pod2), 15, 0.1)
    check(True, f"R: after Unref: {'collected' if gone2 else 'still loaded'} (Unref {'ok' if okr else r});"
                f" traces left {traces(pod2)}")

# --- X: the invocation ID on the cgroup directory ---------------------------------------------
XATTRS = ("user.invocation_id", "trusted.invocation_id")


def xattrs(path):
    out = {}
    for name in XATTRS:
        try:
            out[name] = os.getxattr(path, name).decode("ascii", "replace")
        except OSError as e:
            out[name] = f"error {e.errno}"
    return out


uid4 = new_pod_uid()
pod4 = create_pod_slice(uid4, "burstable")  # returns once its start job has ended
seen4 = xattrs(slice_cgroup_dir(pod4))
scope4, _ = create_container_scope(pod4)
scope4_dir = unit_cgroup_dir(scope4)
seen4s = xattrs(scope4_dir)
inv4, inv4s = invocation_id(pod4), invocation_id(scope4)
check(all(v == inv4 for v in seen4.values()),
      f"X: pod slice cgroup xattrs right after its start job: {seen4}; InvocationID {inv4}")
# A fact, not relied on: on 252 a scope's cgroup has neither attribute (seen: ENODATA), so the
# daemon writes only pod slices this way.
check(True, f"X: container scope cgroup xattrs (not used): {seen4s}; InvocationID {inv4s}")
probe = ("import os,sys\n"
         "for p in sys.argv[1:]:\n"
         "    try: print(os.getxattr(p, 'user.invocation_id').decode())\n"
         "    except OSError as e: print('error', e.errno)\n")
r = subprocess.run(["systemd-run", "--quiet", "--wait", "--pipe", "--collect",
                    "-p", "CapabilityBoundingSet=", "-p", "NoNewPrivileges=yes",
                    "-p", "ProtectControlGroups=no", "-p", "ProtectSystem=strict",
                    "-p", "PrivateDevices=yes", "-p", "ProtectKernelTunables=yes",
                    "/usr/bin/python3", "-c", probe, slice_cgroup_dir(pod4), scope4_dir],
                   capture_output=True, text=True, timeout=60)
lines = r.stdout.split()
check(r.returncode == 0 and lines[:1] == [inv4],
      f"X: user.invocation_id read in a sandbox like the service's (no capabilities,"
      f" ProtectControlGroups=no): {r.stdout.strip()!r} {r.stderr.strip()[:200]!r}")
stop_unit(scope4)
stop_unit(pod4)
wait_for(lambda: not unit_loaded(pod4), 15, 0.1)
pod4 = create_pod_slice(uid4, "burstable")
again4 = invocation_id(pod4)
seen4b = xattrs(slice_cgroup_dir(pod4))
check(again4 != inv4 and all(v == again4 for v in seen4b.values()),
      f"X: the same pod slice name started again: InvocationID {inv4} -> {again4}, xattrs {seen4b}")
stop_unit(pod4)

# --- O: the daemon's own adapter --------------------------------------------------------------
import asyncio

from memqos_systemd.systemd import NoSuchUnit, Systemd

uid3 = new_pod_uid()
pod3 = create_pod_slice(uid3, "burstable")
scope3, _ = create_container_scope(pod3)


async def adapter_write(sd, states):
    await sd.set_memory_if_loaded(pod3, {"MemoryLow": 16 * MIB}, status=states[pod3])
    await sd.set_memory_if_loaded(scope3, {"MemoryHigh": 64 * MIB}, status=states[scope3])


async def adapter_late_write(sd, states):
    try:
        await sd.set_memory_if_loaded(pod3, {"MemoryLow": 32 * MIB}, status=states[pod3])
        return "accepted"
    except NoSuchUnit as e:
        return f"NoSuchUnit: {e}"


# One loop of our own, run step by step: the helpers (stop_unit) run theirs in between.
loop = asyncio.new_event_loop()
sd = loop.run_until_complete(Systemd.connect())
# Not subscribed: no signal tells the adapter the slice went, so its write of the old state
# goes out, to the invocation path it read for the first write (the window of 85-churn).
states = loop.run_until_complete(sd.unit_states([pod3, scope3]))
loop.run_until_complete(adapter_write(sd, states))
low = read_file(slice_cgroup_dir(pod3) + "/memory.low")
high = show(scope3, "MemoryHigh").get("MemoryHigh")
stop_unit(scope3)
stop_unit(pod3)
collected = wait_for(lambda: not unit_loaded(pod3), 15, 0.1)
late = loop.run_until_complete(adapter_late_write(sd, states))
loop.run_until_complete(sd.close())
loop.close()
check(low == str(16 * MIB) and high == str(64 * MIB),
      f"O: set_memory_if_loaded reached the kernel: pod slice memory.low {low}, scope MemoryHigh {high}")
check(collected and late.startswith("NoSuchUnit") and "run of the unit has ended" in late,
      f"O: set_memory_if_loaded after the slice was collected, with the round's old state: {late}")
check(traces(pod3) == NOTHING, f"O: nothing of the collected pod slice exists after it: {traces(pod3)}")

# --- cleanup: strays of our own names only ------------------------------------------------------
removed = False
for u in (pod, scope, pod2, pod3, scope3, pod4, scope4):
    if unit_loaded(u):
        stop_unit(u)
    d = f"{CONTROL}/{u}.d"
    if os.path.isdir(d):
        shutil.rmtree(d, ignore_errors=True)
        removed = True
if removed:
    systemctl("daemon-reload")
for u in (pod, pod2, pod3, pod4):
    try:
        os.rmdir(slice_cgroup_dir(u))
    except OSError:
        pass
