#!/usr/bin/python3
"""The BestEffort ceiling (issue 25) on real systemd and a real kernel: MemoryMax of
kubepods-besteffort.slice planned, lowered without stalling PID 1, and taken back on every way out.

On the sample node (a Guaranteed, a Burstable and a BestEffort pod) plus a BestEffort pod "hog"
whose process allocates anonymous memory:
A. enable: `bestEffortCeiling` on, headroom chosen so the plan is 300 MiB: memory.max of the slice
   is the plan's MemoryMax, the slice is in the ceiling ledger, no other cgroup of ours changed
   memory.max.
B. lower with usage above: the hog holds 200 MiB; a reload lowers the plan to 96 MiB. The daemon
   steps memory.max to the slice's usage (never below it), the hog allocates on, the kernel
   OOM-kills it inside the BestEffort slice (and only there), and memory.max follows down to the
   plan. A thread asks PID 1 for a property every 50 ms meanwhile: its slowest answer is PID 1's
   responsiveness.
C. disable: a reload with the ceiling off puts memory.max back to max; the ledger is empty.
C2. the Burstable lever (issue 35): `burstableHigh` on: the Burstable pod no limit caps gets the
   plan's MemoryHigh (allocatable - the others' requests) in the kernel, set over D-Bus (systemd
   holds it), no other unit's memory.high moves; off: back to max (systemd: infinity).
D. reset: on again, the service stopped, `memqos-systemd reset`: memory.max back to max.
E. measured, with the service stopped: PID 1's SetUnitProperties on the slice while it sits at its
   ceiling (a page-cache reader pressing on it), and lowering MemoryMax to the usage (the step)
   versus 64 MiB below it in one write (what the step avoids: PID 1 reclaims and OOM-kills).
`apt remove` taking it back is checked in 79-remove."""
# e2e-timeout: 300
import os
import subprocess
import threading
import time

from memqos_e2e import *

need_deb()
MIB = 1 << 20
BE = "kubepods-besteffort.slice"
BE_DIR = slice_cgroup_dir(BE)
LEDGER = "/run/memqos-systemd/ceiling-slices"
HOG = "/run/memqos-e2e-hog.py"
GO = "/run/memqos-e2e-hog.go"
SPARSE = "/var/tmp/memqos-e2e-sparse"

with open(HOG, "w") as f:
    f.write('''import os, sys, time
mode = sys.argv[1]
if mode == "anon":  # anon HOLD_MIB MARKER: hold HOLD_MIB, then 1 MiB every 20 ms once GO exists
    chunks = []
    def one():
        b = bytearray(1 << 20)
        b[::4096] = b"\\x01" * 256  # touch every page
        chunks.append(b)
    for _ in range(int(sys.argv[2])):
        one()
    open(sys.argv[3], "w").write("ready")
    while not os.path.exists("%s"):
        time.sleep(0.02)
    while True:
        one()
        time.sleep(0.02)
else:  # file PATH: read it over and over (page cache)
    while True:
        with open(sys.argv[2], "rb") as f:
            while f.read(1 << 20):
                pass
''' % GO)


def read_num(path):
    with open(path) as f:
        text = f.read().strip()
    return UINT64_MAX if text == "max" else int(text)


def be_max():
    return read_num(os.path.join(BE_DIR, "memory.max"))


def be_usage():
    return read_num(os.path.join(BE_DIR, "memory.current"))


def be_events():
    with open(os.path.join(BE_DIR, "memory.events")) as f:
        return {k: int(v) for k, v in (line.split() for line in f)}


def ledger():
    try:
        with open(LEDGER) as f:
            return f.read().split()
    except FileNotFoundError:
        return []


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


class Pid1Probe(threading.Thread):
    """Asks PID 1 for its Version every 50 ms on a connection of its own; the answers' times."""

    def __init__(self):
        super().__init__(daemon=True)
        self.times, self.stop = [], threading.Event()

    def run(self):
        import asyncio

        from dbus_next import BusType, Message
        from dbus_next.aio import MessageBus

        async def go():
            bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
            while not self.stop.is_set():
                t0 = time.monotonic()
                await bus.call(Message(destination="org.freedesktop.systemd1", path="/org/freedesktop/systemd1",
                                       interface="org.freedesktop.DBus.Properties", member="Get", signature="ss",
                                       body=["org.freedesktop.systemd1.Manager", "Version"]))
                self.times.append(time.monotonic() - t0)
                await asyncio.sleep(0.05)
            bus.disconnect()
        asyncio.run(go())

    def result(self):
        self.stop.set()
        self.join(10)
        t = sorted(self.times)
        return {"n": len(t), "median_ms": t[len(t) // 2] * 1e3 if t else None, "max_ms": t[-1] * 1e3 if t else None}


class MaxTrace(threading.Thread):
    """memory.max and memory.current of the BestEffort slice every 10 ms: the values memory.max took."""

    def __init__(self):
        super().__init__(daemon=True)
        self.seen, self.stop = [], threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.sample()
            time.sleep(0.01)

    def sample(self):
        m, u = be_max(), be_usage()
        if not self.seen or self.seen[-1][1] != m:
            self.seen.append((time.monotonic(), m, u))

    def result(self):
        self.stop.set()
        self.join(5)
        self.sample()  # what the caller has just seen too
        return self.seen


def oom_invokers():
    """Who invoked the kernel's OOM killer, in order, this boot (the task whose charge or write
    could not be reclaimed: `<comm> invoked oom-killer`, dmesg)."""
    out = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
    return [line.split("]", 1)[-1].split(" invoked oom-killer")[0].strip() for line in out.splitlines()
            if " invoked oom-killer" in line]


def timed_set(**props):
    t0 = time.monotonic()
    set_unit_properties(BE, **props)
    return time.monotonic() - t0


def start_hog(name, *argv):
    """A BestEffort pod whose one container runs the hog; listed by the kubelet stand-in."""
    pod = make_pod(name, [{"name": "main"}])
    slice_name = create_pod_slice(pod["metadata"]["uid"], "BestEffort")
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    scope, pid = create_container_scope(slice_name, cid, command=("python3", HOG, *argv))
    return pod, scope, pid


# --- A. enable --------------------------------------------------------------------------------------
pods = sample_pods()
units = start_sample_node(pods)
others = [u for n in units for u in (units[n]["slice"], *units[n]["scopes"])] + ["kubepods.slice",
                                                                                "kubepods-burstable.slice"]
others_max = {u: read_cgroup_file(u, "memory.max") for u in others}
memqos_write_config(sample_config())
doc = memqos_plan()
alloc = doc["node"]["allocatableBytes"]
requests = 96 * MIB + 64 * MIB  # db (Guaranteed), web (Burstable: app + sidecar)


def ceiling_config(planned_mib, **more):
    return sample_config(bestEffortCeiling={"enabled": True, "headroom": alloc - requests - planned_mib * MIB,
                                            "minimum": "16Mi", **more})


memqos_write_config(ceiling_config(300))
plan_max = next(u["MemoryMax"] for u in memqos_plan()["units"] if u["unit"] == BE)
check_eq(plan_max, 300 * MIB, "the plan's MemoryMax for kubepods-besteffort.slice")
check(memqos_reload(), "reload: bestEffortCeiling on")
check(wait_for(lambda: be_max() == plan_max, 10, 0.05), f"A. memory.max of {BE} is the plan's {fmt_bytes(be_max())}")
check_eq(ledger(), [BE], "the ceiling ledger names the slice")
changed = {u: v for u, v in ((u, read_cgroup_file(u, "memory.max")) for u in others) if v != others_max[u]}
check(not changed, f"no other cgroup's memory.max changed ({len(others)} units) {changed}")
check_eq(show(BE, "MemoryMax")["MemoryMax"], str(plan_max), "systemd holds it (systemctl show)")

# --- B. lower with usage above -------------------------------------------------------------------------
ready = "/run/memqos-e2e-hog.ready"
for p in (GO, ready):
    if os.path.exists(p):
        os.unlink(p)
hog_pod, hog_scope, hog_pid = start_hog("hog", "anon", "200", ready)
write_pods([*pods, hog_pod])
check(wait_for(lambda: os.path.exists(ready), 60, 0.1), f"the hog holds 200 MiB: {BE} uses {fmt_bytes(be_usage())}")
events0, invokers0 = be_events(), len(oom_invokers())
protected = {n: units[n]["pids"] for n in ("db", "web")}
protected_events = {u: read_cgroup_file(u, "memory.events") for u in ("kubepods-burstable.slice",
                                                                       units["db"]["slice"])}
mark = journal_cursor()
probe, trace = Pid1Probe(), MaxTrace()
probe.start()
trace.start()
memqos_write_config(ceiling_config(96))
t0 = time.monotonic()
check(memqos_reload(), "reload: the plan goes down to 96 MiB, below what BestEffort uses")
stepped = wait_for(lambda: be_max() < plan_max, 10, 0.02)
step_value, usage_then = be_max(), be_usage()
check(stepped and step_value > 96 * MIB and step_value >= 200 * MIB,
      f"B. stepped to the usage, not to the plan: memory.max {fmt_bytes(step_value)} (usage {fmt_bytes(usage_then)},"
      f" plan 96Mi) {time.monotonic() - t0:.2f} s after the reload")
at_step = oom_invokers()[invokers0:]
check("systemd" not in at_step, f"the step made PID 1 kill nothing: OOM killer invoked by {at_step or 'nobody'},"
                                 f" the hog {'alive' if alive(hog_pid) else 'killed by its own charge'}")
open(GO, "w").close()  # the hog allocates on, into the ceiling
t1 = time.monotonic()
killed = wait_for(lambda: not alive(hog_pid), 60, 0.02)
t_kill = time.monotonic() - t1
reached = wait_for(lambda: be_max() == 96 * MIB, 15, 0.02)
t_plan = time.monotonic() - t1
seen = trace.result()
pid1 = probe.result()
events1 = be_events()
invokers = oom_invokers()[invokers0:]
check(killed and invokers and "systemd" not in invokers,
      f"the kernel OOM-killed the hog {t_kill:.2f} s after it went on allocating, the OOM killer invoked by"
      f" {invokers} (never systemd)")
check(events1.get("oom_kill", 0) > events0.get("oom_kill", 0),
      f"inside {BE}: memory.events oom_kill {events0.get('oom_kill')} -> {events1.get('oom_kill')},"
      f" oom {events0.get('oom')} -> {events1.get('oom')}, max {events0.get('max')} -> {events1.get('max')}")
check(all(alive(pid) for pids in protected.values() for pid in pids) and
      all(read_cgroup_file(u, "memory.events") == v for u, v in protected_events.items()),
      "the Guaranteed and Burstable pods' processes live, their memory.events unchanged")
values = [m for _, m, _ in seen]
below = [(fmt_bytes(m), fmt_bytes(u)) for _, m, u in seen if m < u]
check(reached and values[-1] == 96 * MIB and not below,
      f"memory.max followed down to the plan {t_plan:.2f} s after: {' -> '.join(fmt_bytes(v) for v in values)};"
      f" never below the usage {below}")
check(pid1["n"] and pid1["max_ms"] < 2000,
      f"PID 1 answered throughout: {pid1['n']} asks, median {pid1['median_ms'] or 0:.0f} ms, slowest"
      f" {pid1['max_ms'] or 0:.0f} ms")
lines = [m for m in journal_since(mark) if "BestEffort ceiling" in m or "kubepods-besteffort.slice MemoryMax" in m]
check(any("stepping MemoryMax down" in m for m in lines) and any("at its planned MemoryMax" in m for m in lines),
      f"the journal tells the step-down: {lines[:4]}")
stop_pod(hog_pod)
write_pods(pods)

# --- C. disable -----------------------------------------------------------------------------------------
memqos_write_config(sample_config())
check(memqos_reload(), "reload: bestEffortCeiling off")
check(wait_for(lambda: be_max() == UINT64_MAX and ledger() == [], 10, 0.05),
      f"C. memory.max back to max ({fmt_bytes(be_max())}), the ledger empty {ledger()}")

# --- C2. the Burstable lever (issue 35), on real systemd: on, then off -----------------------------
# web (Burstable: app limited, sidecar not, so no limit caps the pod) gets MemoryHigh = allocatable -
# the others' requests (db's 96Mi; batch is BestEffort), over D-Bus; off puts it back to max.
web = units["web"]["slice"]
lever_units = [u for n in units for u in (units[n]["slice"], *units[n]["scopes"])] + ["kubepods.slice",
                                                                                     "kubepods-burstable.slice"]
high_before = {u: read_cgroup_file(u, "memory.high") for u in lever_units}
memqos_write_config(sample_config(burstableHigh={"enabled": True}))
web_plan = next(u for u in memqos_plan()["units"] if u["unit"] == web)
formula = max((64 * MIB // PAGE_SIZE + 1) * PAGE_SIZE, (alloc - 96 * MIB) // PAGE_SIZE * PAGE_SIZE)
check(web_plan["MemoryHigh"] == formula and web_plan.get("burstableHigh", {}).get("othersRequestsBytes") == 96 * MIB,
      f"the plan's lever for {web}: MemoryHigh {web_plan['MemoryHigh']} = allocatable {alloc} - the others' requests"
      f" 96Mi = {formula} ({web_plan.get('burstableHigh')})")
check(memqos_reload(), "reload: burstableHigh on")
check(wait_for(lambda: read_cgroup_file(web, "memory.high") == str(formula), 10, 0.05),
      f"C2. memory.high of {web} in the kernel is the plan's {read_cgroup_file(web, 'memory.high')}")
check_eq(show(web, "MemoryHigh")["MemoryHigh"], str(formula), "systemd holds it: set over D-Bus (systemctl show)")
moved = {u: v for u, v in ((u, read_cgroup_file(u, "memory.high")) for u in lever_units if u != web)
         if v != high_before[u]}
check(not moved, f"no other unit's memory.high moved ({len(lever_units) - 1} units) {moved}")
memqos_write_config(sample_config())
check(memqos_reload(), "reload: burstableHigh off")
check(wait_for(lambda: read_cgroup_file(web, "memory.high") == "max", 10, 0.05)
      and show(web, "MemoryHigh")["MemoryHigh"] == "infinity",
      f"memory.high of {web} back to {read_cgroup_file(web, 'memory.high')}, systemd's MemoryHigh"
      f" {show(web, 'MemoryHigh')['MemoryHigh']}")

# --- the figures behind the defaults (docs/DESIGN.md, "The BestEffort ceiling") ----------------------
starter = make_pod("starter", [{"name": "main"}])
starter_slice = create_pod_slice(starter["metadata"]["uid"], "BestEffort")
c = runc_run(starter_slice, starter["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1])
peak = read_num(os.path.join(slice_cgroup_dir(starter_slice), "memory.peak"))
held_after = read_num(os.path.join(slice_cgroup_dir(starter_slice), "memory.current"))
runc_delete(c["id"])
stop_unit(starter_slice)
with open("/proc/zoneinfo") as f:
    marks = {k: 0 for k in ("min", "low", "high")}
    for line in f:
        parts = line.split()
        if len(parts) == 2 and parts[0] in marks and parts[1].isdigit():
            marks[parts[0]] += int(parts[1]) * 4096
with open("/proc/meminfo") as f:
    meminfo = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
tops = {d: read_num(os.path.join("/sys/fs/cgroup", d, "memory.current")) for d in sorted(os.listdir("/sys/fs/cgroup"))
        if os.path.exists(os.path.join("/sys/fs/cgroup", d, "memory.current"))}
outside = meminfo["MemTotal"] - meminfo["MemFree"] - sum(tops.values())
check(True, f"figures: a BestEffort pod's container started by runc: memory.peak {fmt_bytes(peak)} (runc init), "
            f"{fmt_bytes(held_after)} once it runs; the kernel's watermarks min/low/high "
            f"{'/'.join(fmt_bytes(v) for v in marks.values())} (min_free_kbytes "
            f"{open('/proc/sys/vm/min_free_kbytes').read().strip()}); outside the pods: "
            + ", ".join(f"{d} {fmt_bytes(v)}" for d, v in tops.items() if d != "kubepods.slice")
            + f", in no cgroup (the kernel's own) {fmt_bytes(outside)}; MemTotal {fmt_bytes(meminfo['MemTotal'])},"
              f" MemAvailable {fmt_bytes(meminfo['MemAvailable'])}")

# --- D. reset ------------------------------------------------------------------------------------------
memqos_write_config(ceiling_config(300))
check(memqos_reload(), "reload: on again")
check(wait_for(lambda: be_max() == 300 * MIB, 10, 0.05), f"memory.max {fmt_bytes(be_max())}")
pause_memqos()
p = subprocess.run(["memqos-systemd", "reset"], capture_output=True, text=True)
check(p.returncode == 0 and be_max() == UINT64_MAX and ledger() == [],
      f"D. reset: exit {p.returncode}, memory.max {fmt_bytes(be_max())}, ledger {ledger()} {p.stderr.strip()[-200:]}")

# --- E. PID 1's SetUnitProperties on the slice, measured (the service stopped) -----------------------
figures = {}
subprocess.run(["truncate", "-s", "2G", SPARSE], check=True)
reader_pod, reader_scope, reader_pid = start_hog("reader", "file", SPARSE)
set_unit_properties(BE, MemoryMax=128 * MIB)
wait_for(lambda: be_events().get("max", 0) > 100, 60, 0.1)  # pressing on its ceiling
figures["at the ceiling, a write that keeps it (MemoryLow=0)"] = [timed_set(MemoryLow=0) for _ in range(5)]
figures["at the ceiling, MemoryMax to the same value"] = [timed_set(MemoryMax=128 * MIB) for _ in range(5)]
stop_pod(reader_pod)
set_unit_properties(BE, MemoryMax=UINT64_MAX)
subprocess.run(["sh", "-c", "sync; echo 1 > /proc/sys/vm/drop_caches"], check=True)  # the reader's cache, reparented
for p in (GO, ready):
    if os.path.exists(p):
        os.unlink(p)
hog_pod, hog_scope, hog_pid = start_hog("hog2", "anon", "160", ready)
wait_for(lambda: os.path.exists(ready), 60, 0.1)
u, kills, invokers0 = be_usage(), be_events().get("oom_kill", 0), len(oom_invokers())
figures["lowering to the usage (the step)"] = [timed_set(MemoryMax=-(-u // 4096) * 4096)]
figures["lowering 64 MiB below the usage in one write (anon, no swap)"] = [timed_set(MemoryMax=u - 64 * MIB)]
hog_killed = wait_for(lambda: not alive(hog_pid), 10, 0.05) and be_events().get("oom_kill", 0) > kills
one_write_invokers = oom_invokers()[invokers0:]
stop_pod(hog_pod)
reader_pod, reader_scope, reader_pid = start_hog("reader2", "file", SPARSE)
set_unit_properties(BE, MemoryMax=UINT64_MAX)
wait_for(lambda: be_usage() > 200 * MIB, 60, 0.1)
u = be_usage()
figures["lowering 128 MiB below the usage in one write (page cache)"] = [timed_set(MemoryMax=u - 128 * MIB)]
stop_pod(reader_pod)
set_unit_properties(BE, MemoryMax=UINT64_MAX, MemoryLow=0)
os.unlink(SPARSE)
summary = "; ".join(f"{k}: {', '.join(f'{t * 1e3:.0f}' for t in v)} ms" for k, v in figures.items())
# Who invokes the OOM killer after a one-write lowering is a race: PID 1, reclaiming in its write,
# or the hog itself at its next charge (both seen): a figure, not a condition. The condition is the
# step's: PID 1 kills nothing there (B, above).
check(hog_killed,
      f"E. measured: {summary}; the one-write lowering OOM-killed the hog; the OOM killer invoked by"
      f" {one_write_invokers} ('systemd': in PID 1's write)")
