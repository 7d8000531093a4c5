#!/usr/bin/python3
"""Churn on real systemd (issue 7): pods created and deleted at up to 50 pods/s for 60 s.

Three pods (Guaranteed, Burstable, BestEffort) run throughout. Meanwhile one asyncio loop on its
own D-Bus connection does what the kubelet and containerd do for each churn pod: list it in the
stand-in's /pods (rewritten every 0.2 s), StartTransientUnit of its pod slice and wait for the
job, start a process and StartTransientUnit of its container scope (Slice=, Delegate=, PIDs=),
wait; after a life of 1-3 s (every 10th pod: 20 s), StopUnit of the scope, then either take it off /pods and stop the
slice (the kubelet's order) or stop the slice and then take it off /pods (units first), chosen at
random. Pods are launched on a 50/s schedule with at most 25 being created at once: when systemd
or the machine cannot keep up, the launcher falls behind and the rate achieved (printed) is lower.
Nothing here fakes the rate: every pod counted had both units started and stopped by systemd.

While it runs: every live pod's protection is read (0.5 s) to give the time from its creation to
its protection in the kernel (the daemon's lag, printed, not asserted: see docs/RELIABILITY.md),
and every 2 s the time a GetUnit takes PID 1 from here; every 2 s the whole kubepods tree is read bottom-up and no scope may hold
more memory.min/low than its pod slice, no pod slice more than its QoS slice or kubepods.slice;
every second the daemon's RSS. Afterwards: the kernel equals `memqos-systemd plan` for the three
pods (convergence time from the last deletion), no unit, cgroup, transient file or
/run/systemd/system.control drop-in of a churn pod is left, no pod slice is loaded that the kubelet
did not make (a stray made by SetUnitProperties), the daemon was not restarted (its watchdog kept
going), and its RSS before/peak/after."""
# e2e-timeout: 420
import asyncio
import glob
import json
import os
import random
import signal
import time

from memqos_e2e import *

need_deb()
MIB = 1 << 20
RATE = 50.0  # pods/s asked for
DURATION = 60.0  # seconds of launching
LIFE = (1.0, 3.0)  # seconds a pod lives once both its units run
PROBE_LIFE = 20.0  # every 10th pod lives this long: the daemon's lag under churn, measured on them
MAX_CREATING = 25  # pods being created at once (the launcher waits beyond that)
JOB_TIMEOUT = 60.0
KUBEPODS = "/sys/fs/cgroup/kubepods.slice"

# TieredReservation, effective, kubelet polled every second
start_empty_node(pods_only_config(), "config: TieredReservation, effective, pollInterval 1s")

stable = sample_pods()
write_pods(stable)
for p in stable:
    start_pod(p)
stable_units = set()
for p in stable:
    stable_units.add(pod_slice_name(p["metadata"]["uid"], p["status"]["qosClass"]))
    for st in p["status"]["containerStatuses"]:
        stable_units.add(f"cri-containerd-{st['containerID'].split('://')[1]}.scope")
expected = plan_expected(memqos_plan())
bad, took = wait_kernel(expected, 30)
check(not bad, f"before the churn: {len(expected)} units equal plan with the 3 steady pods {bad}")

daemon_pid = int(service_show("MainPID"))
nrestarts0 = int(service_show("NRestarts"))


def proc_status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM"):
                    out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def dbus_calls():
    return {(l.get("method"), l.get("result")): v
            for l, v in metrics().get("memqos_dbus_calls_total", [])}


rss0 = proc_status(daemon_pid)
cpu0_daemon, cpu0_pid1 = cpu_seconds(daemon_pid), cpu_seconds(1)
calls0 = dbus_calls()
log(f"daemon PID {daemon_pid}: {rss0}")


# --------------------------------------------------------------------------- the churn

def read_int(path):
    with open(path) as f:
        text = f.read().strip()
    return UINT64_MAX if text == "max" else int(text)


def tree_violations():
    """Read every scope, then every pod slice, then the QoS slices, then kubepods.slice (children
    before parents: a parent is raised before its child, so a child read first and seen raised
    has a parent already raised). A child above its parent is confirmed by reading the child
    again after the parent: a pod going away in between is not a violation."""
    pods, scopes = [], []
    for qos_dir in (KUBEPODS, KUBEPODS + "/kubepods-burstable.slice",
                    KUBEPODS + "/kubepods-besteffort.slice"):
        try:
            names = os.listdir(qos_dir)
        except OSError:
            continue
        for n in names:
            if "-pod" in n and n.endswith(".slice"):
                d = os.path.join(qos_dir, n)
                pods.append((d, qos_dir))
                try:
                    scopes += [(os.path.join(d, s), d) for s in os.listdir(d) if s.endswith(".scope")]
                except OSError:
                    pass
    qos = [(KUBEPODS + "/kubepods-burstable.slice", KUBEPODS),
           (KUBEPODS + "/kubepods-besteffort.slice", KUBEPODS)]
    values = {}

    def read(d):
        if d not in values:
            try:
                values[d] = (read_int(d + "/memory.min"), read_int(d + "/memory.low"))
            except (OSError, ValueError):
                values[d] = None
        return values[d]

    for child, _ in scopes + pods + qos:
        read(child)
    read(KUBEPODS)
    out = []
    for child, parent in scopes + pods + qos:
        c, p = values.get(child), read(parent)
        if c is None or p is None:
            continue
        for i, key in enumerate(("min", "low")):
            if c[i] > p[i]:
                try:
                    again = read_int(f"{child}/memory.{key}")
                except (OSError, ValueError):
                    continue  # gone meanwhile
                if again > p[i]:
                    out.append(f"{os.path.basename(child)} memory.{key} {fmt_bytes(again)} >"
                               f" {os.path.basename(parent)} {fmt_bytes(p[i])}")
    return out, len(scopes) + len(pods)


def churn_pod(i):
    kind = ("Guaranteed", "Burstable", "Burstable", "BestEffort")[i % 4]
    if kind == "Guaranteed":
        c = {"name": "app", "requests": {"memory": "16Mi", "cpu": "10m"},
             "limits": {"memory": "16Mi", "cpu": "10m"}}
    elif kind == "Burstable":
        c = {"name": "app", "requests": {"memory": "8Mi"}, "limits": {"memory": "64Mi"}}
    else:
        c = {"name": "app"}
    return make_pod(f"churn-{i}", [c])


class Churn:
    def __init__(self):
        self.rng = random.Random(85)
        self.bus = None
        self.jobs = {}  # job path -> future
        self.early = {}  # job path -> result (JobRemoved read before the reply was handled)
        self.listed = {}  # uid -> pod (what /pods serves, besides the steady pods)
        self.dirty = True
        self.records = []
        self.errors = []
        self.launched = 0
        self.creating = 0
        self.live = {}  # uid -> record, pods with both units started and not yet stopping
        self.max_live = 0
        self.violations = []
        self.tree_reads = 0
        self.max_tree = 0
        self.rss = []
        self.done_launching = False
        self.pods_file_writes = 0
        self.rtt = []  # seconds a GetUnit took from here while the churn ran

    # ---- D-Bus
    async def connect(self):
        from dbus_next import BusType, Message, MessageType
        from dbus_next.aio import MessageBus

        self.Message, self.MessageType = Message, MessageType
        self.bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
        await self.call("AddMatch", "s", ["type='signal',sender='org.freedesktop.systemd1',"
                                          "interface='org.freedesktop.systemd1.Manager',"
                                          "member='JobRemoved'"],
                        path="/org/freedesktop/DBus", interface="org.freedesktop.DBus",
                        destination="org.freedesktop.DBus")
        self.bus.add_message_handler(self.on_message)
        await self.call("Subscribe")

    def on_message(self, msg):
        if (msg.message_type == self.MessageType.SIGNAL and msg.member == "JobRemoved"
                and msg.signature == "uoss"):
            _, path, unit, result = msg.body
            fut = self.jobs.pop(path, None)
            if fut is not None:
                if not fut.done():
                    fut.set_result(result)
            elif unit.startswith(("kubepods-", "cri-containerd-")):
                self.early[path] = result
        return None

    async def call(self, member, signature="", body=(), path="/org/freedesktop/systemd1",
                   interface="org.freedesktop.systemd1.Manager",
                   destination="org.freedesktop.systemd1"):
        reply = await self.bus.call(self.Message(destination=destination, path=path,
                                                 interface=interface, member=member,
                                                 signature=signature, body=list(body)))
        if reply.message_type == self.MessageType.ERROR:
            raise SystemdError(f"{member}: {reply.error_name}: {reply.body[0] if reply.body else ''}")
        return reply.body

    async def job(self, member, signature, body, what):
        try:
            (path,) = await self.call(member, signature, body)
        except SystemdError as e:
            if member == "StopUnit" and ("NoSuchUnit" in str(e) or "not loaded" in str(e)):
                return "gone"
            self.errors.append(f"{what}: {e}")
            return None
        if path in self.early:
            return self.early.pop(path)
        fut = asyncio.get_running_loop().create_future()
        self.jobs[path] = fut
        try:
            result = await asyncio.wait_for(fut, JOB_TIMEOUT)
        except asyncio.TimeoutError:
            self.jobs.pop(path, None)
            self.errors.append(f"{what}: job not done in {JOB_TIMEOUT:.0f} s")
            return None
        if result != "done":
            self.errors.append(f"{what}: job {result}")
        return result

    async def start(self, name, props):
        from dbus_next import Variant

        sigs = {"Description": "s", "Slice": "s", "Delegate": "b", "DefaultDependencies": "b",
                "MemoryAccounting": "b", "CPUAccounting": "b", "IOAccounting": "b",
                "TasksAccounting": "b", "PIDs": "au", "Wants": "as"}
        array = [[k, Variant(sigs[k], v)] for k, v in props.items()]
        return await self.job("StartTransientUnit", "ssa(sv)a(sa(sv))", [name, "fail", array, []],
                              f"start {name}") == "done"

    async def stop(self, name):
        return await self.job("StopUnit", "ss", [name, "replace"], f"stop {name}")

    # ---- one pod, as the kubelet and containerd handle it
    async def pod_life(self, i, t_launch):
        loop = asyncio.get_running_loop()
        pod = churn_pod(i)
        uid, qos = pod["metadata"]["uid"], pod["status"]["qosClass"]
        cid = pod["status"]["containerStatuses"][0]["containerID"].split("://")[1]
        slice_name = pod_slice_name(uid, qos)
        scope = f"cri-containerd-{cid}.scope"
        parent = slice_name[: -len(".slice")].rsplit("-", 1)[0] + ".slice"
        rec = {"i": i, "qos": qos, "slice": slice_name, "scope": scope, "launch": t_launch,
               "dir": slice_cgroup_dir(slice_name), "created": None, "protected": None,
               "deleted": None, "probe": i % 10 == 5}
        self.records.append(rec)
        self.listed[uid] = pod
        self.dirty = True
        try:
            acct = dict(MemoryAccounting=True, CPUAccounting=True, IOAccounting=True,
                        TasksAccounting=True, DefaultDependencies=False)
            ok = await self.start(slice_name, dict(
                Description=f"libcontainer container {slice_name[:-6]}", Wants=[parent], **acct))
            pid = None
            if ok:
                pid = os.posix_spawn("/bin/sleep", ["sleep", "infinity"], {}, setsid=True,
                                     file_actions=[(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                                                   (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
                                                   (os.POSIX_SPAWN_OPEN, 2, "/dev/null", os.O_WRONLY, 0)])
                ok = await self.start(scope, dict(
                    Description=f"libcontainer container {cid}", Slice=slice_name, Delegate=True,
                    PIDs=[pid], **acct))
                if not ok:
                    os.kill(pid, signal.SIGKILL)
        finally:
            self.creating -= 1
        if ok:
            rec["created"] = loop.time()
            self.live[uid] = rec
            self.max_live = max(self.max_live, len(self.live))
            await asyncio.sleep(PROBE_LIFE if rec["probe"] else self.rng.uniform(*LIFE))
            self.protected(rec)
            self.live.pop(uid, None)
        await self.stop(scope)
        if self.rng.random() < 0.5:  # the kubelet: off /pods, then its housekeeping stops the slice
            self.listed.pop(uid, None)
            self.dirty = True
            await self.stop(slice_name)
        else:  # units first
            await self.stop(slice_name)
            self.listed.pop(uid, None)
            self.dirty = True
        if ok:
            rec["deleted"] = loop.time()

    def protected(self, rec):
        """Has the daemon given this pod its protection in the kernel yet? Records when first seen."""
        if rec["protected"] is not None:
            return True
        try:
            if rec["qos"] == "Guaranteed":
                ok = read_int(rec["dir"] + "/memory.min") == 16 * MIB
            elif rec["qos"] == "Burstable":
                ok = read_int(rec["dir"] + "/memory.low") == 8 * MIB
            else:
                ok = read_int(f"{rec['dir']}/{rec['scope']}/memory.high") != UINT64_MAX
        except (OSError, ValueError):
            return False
        if ok:
            rec["protected"] = asyncio.get_running_loop().time()
        return ok

    # ---- background tasks
    async def pods_writer(self):
        while True:
            if self.dirty:
                self.dirty = False
                doc = {"kind": "PodList", "apiVersion": "v1", "metadata": {},
                       "items": stable + list(self.listed.values())}
                with open(PODS_FILE + ".tmp", "w") as f:
                    json.dump(doc, f, separators=(",", ":"))
                os.replace(PODS_FILE + ".tmp", PODS_FILE)
                self.pods_file_writes += 1
            if self.done_launching and not self.listed and not self.dirty:
                return
            await asyncio.sleep(0.2)

    async def sampler(self):
        loop = asyncio.get_running_loop()
        n = 0
        while not (self.done_launching and not self.listed):
            for rec in list(self.live.values()):
                self.protected(rec)
            if n % 2 == 0:
                st = proc_status(daemon_pid)
                self.rss.append((loop.time(), st.get("VmRSS", 0)))
            if n % 4 == 2 and not self.done_launching:
                t = loop.time()
                try:
                    await self.call("GetUnit", "s", ["kubepods.slice"])
                    self.rtt.append(loop.time() - t)
                except SystemdError:
                    pass
            if n % 4 == 0:
                v, units = tree_violations()
                self.tree_reads += 1
                self.max_tree = max(self.max_tree, units)
                if v and len(self.violations) < 10:
                    self.violations += v[:3]
            n += 1
            await asyncio.sleep(0.5)

    async def run(self):
        loop = asyncio.get_running_loop()
        await self.connect()
        writer = asyncio.create_task(self.pods_writer())
        sampler = asyncio.create_task(self.sampler())
        tasks = set()
        t0 = loop.time()
        anchor, k = t0, 0
        while loop.time() - t0 < DURATION:
            target = anchor + k / RATE
            now = loop.time()
            if target > now:
                await asyncio.sleep(target - now)
            elif now - target > 0.5:  # behind: start again from now, no burst to catch up
                anchor, k = now, 0
            while self.creating >= MAX_CREATING:
                await asyncio.sleep(0.01)
            if loop.time() - t0 >= DURATION:
                break
            self.creating += 1
            t = asyncio.create_task(self.pod_life(self.launched, loop.time()))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            self.launched += 1
            k += 1
        self.launch_seconds = loop.time() - t0
        self.done_launching = True
        if tasks:
            await asyncio.wait(tasks, timeout=180)
        self.dirty = True
        await writer
        await sampler
        self.t_end = time.monotonic()
        self.seconds = loop.time() - t0
        self.bus.disconnect()


cpu0_self = sum(os.times()[:2])
old_chld = signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the containers' processes reap themselves
churn = Churn()
cursor = journal_cursor()
t_start = time.monotonic()
asyncio.run(churn.run())
signal.signal(signal.SIGCHLD, old_chld)
cpu_self = sum(os.times()[:2]) - cpu0_self
recs = churn.records
created = [r for r in recs if r["created"] is not None]
deleted = [r for r in created if r["deleted"] is not None]
rate_created = len(created) / churn.launch_seconds
log(f"churn: launched {churn.launched} in {churn.launch_seconds:.1f} s, created {len(created)},"
    f" deleted {len(deleted)}, errors {len(churn.errors)}: {churn.errors[:5]}")
check(churn.launched and len(deleted) == churn.launched and not churn.errors,
      f"churn: {churn.launched} pods launched in {churn.launch_seconds:.1f} s (asked {RATE:.0f}/s for"
      f" {DURATION:.0f} s), every one created and deleted by systemd ({len(created) * 2} units"
      f" started, {len(deleted) * 2} stopped): {rate_created:.1f} pods/s achieved, up to"
      f" {churn.max_live} pods running at once, /pods rewritten {churn.pods_file_writes} times;"
      f" errors {churn.errors[:3]}")

# The daemon's lag: creation -> protection in the kernel, by period of launch.
probes = [r for r in created if r["probe"]]
lags = sorted(r["protected"] - r["created"] for r in probes if r["protected"] is not None)
rtt = sorted(churn.rtt)
worst = {}
for r in probes:
    b = int((r["launch"] - recs[0]["launch"]) // 10) * 10
    lag = r["protected"] - r["created"] if r["protected"] is not None else float("inf")
    worst[b] = max(worst.get(b, 0.0), lag)
worst_text = ", ".join(f"{b}-{b + 10}s {'never' if w == float('inf') else f'{w:.1f} s'}"
                       for b, w in sorted(worst.items()))
# Not asserted (docs/RELIABILITY.md, limit 7): under this churn on TCG the daemon falls more than
# 20 s behind (it reads each new unit with serial calls that wait behind PID 1's job work, and
# reads units already gone); what is promised, convergence once the churn stops and bounded
# memory, is checked below.
check(bool(probes), f"the daemon's lag: of the {len(probes)} pods that lived {PROBE_LIFE:.0f} s during"
      f" the churn (1 in 10), {len(lags)} got their protection in the kernel before they were"
      f" deleted; lag from creation: median"
      f" {lags[len(lags) // 2] if lags else float('nan'):.1f} s, max {max(lags, default=float('nan')):.1f} s"
      f" (worst by period of creation: {worst_text}); a GetUnit from here took median {rtt[len(rtt) // 2] * 1000 if rtt else 0:.0f} ms,"
      f" max {max(rtt, default=0) * 1000:.0f} ms during the churn")
periods = {}
for r in created:
    if r["probe"]:
        continue
    b = int((r["launch"] - recs[0]["launch"]) // 10)
    periods.setdefault(b, []).append(r)
lag_text = []
for b in sorted(periods):
    rs = periods[b]
    lags = sorted(r["protected"] - r["created"] for r in rs if r["protected"] is not None)
    med = f"{lags[len(lags) // 2]:.1f}" if lags else "-"
    lag_text.append(f"{b * 10}-{b * 10 + 10}s: {len(lags)}/{len(rs)} protected, median {med} s")
short = [r for r in created if not r["probe"]]
n_prot = sum(1 for r in short if r["protected"] is not None)
check(True, f"pods that lived 1-3 s (read every 0.5 s): {n_prot} of {len(short)} protected before"
            f" deletion; "
            + "; ".join(lag_text))
check(not churn.violations,
      f"no child above its parent in the kernel (memory.min and memory.low; {churn.tree_reads} reads"
      f" of the whole tree, up to {churn.max_tree} pod slices and scopes in one): {churn.violations[:5]}")

# --------------------------------------------------------------------------- afterwards
expected = plan_expected(memqos_plan())
bad, conv = wait_kernel(expected, 120, 0.1)
t_conv = time.monotonic()
check(not bad, f"converged: {len(expected)} units equal plan for the 3 steady pods"
               f" {t_conv - churn.t_end:.1f} s after the last churn pod was deleted and left /pods"
               f" {bad[:5]}")
# Within the resync (60 s, the default): a unit read while its UnitRemoved was handled can stay in
# the daemon's cache until then, keeping its pod planned (seen on 61fe586, fixed in 7be157a).
t_pods = time.monotonic()
wait_for(lambda: metric("memqos_pods") == len(stable), 75, 0.5)
n_pods, took_pods = metric("memqos_pods"), time.monotonic() - t_pods
carried = sorted({l.split(" is no longer listed")[0] for l in journal_since(cursor) if "is no longer listed" in l
                  and "/churn-" in l})
check(n_pods == len(stable), f"the daemon plans only the steady pods by the next resync: memqos_pods"
                             f" {n_pods}, {took_pods:.1f} s after convergence (churn pods it kept at some"
                             f" point because their slice seemed to run: {len(carried)}, {carried[-5:]})")
time.sleep(3)  # a full poll more: a late write would have landed by now


def loaded_units():
    p = systemctl("list-units", "--all", "--plain", "--no-legend", "--no-pager",
                  "kubepods-*pod*.slice", "cri-containerd-*.scope")
    return {line.split()[0]: line.split()[1:4] for line in p.stdout.splitlines() if line.split()}


units = loaded_units()
leaked = {u: s for u, s in units.items() if u not in stable_units}
check(not leaked, f"no unit of a deleted pod is loaded ({len(units)} pod slices and scopes loaded,"
                  f" all of the steady pods): {dict(list(leaked.items())[:5])}")
not_transient = [u for u in units if u.endswith(".slice") and service_show("Transient", u) != "yes"]
check(not not_transient, f"no pod slice the kubelet did not make (a stray SetUnitProperties slice"
                         f" is not transient): {not_transient[:5]}")
control = glob.glob("/run/systemd/system.control/kubepods-*pod*") + \
    glob.glob("/run/systemd/system.control/cri-containerd-*")
check(not control, f"nothing under /run/systemd/system.control for pod slices or scopes: {control[:5]}")
churn_units = {r["slice"] for r in recs} | {r["scope"] for r in recs}


def unit_of(path):
    name = os.path.basename(path)
    return name[:-2] if name.endswith(".d") else name


transient = [p for p in glob.glob("/run/systemd/transient/*") if unit_of(p) in churn_units]
check(not transient, f"no transient unit file or drop-in of a churn pod left: {transient[:5]}")
dirs = [d for d in glob.glob(KUBEPODS + "/**/*.s*", recursive=True)
        if os.path.basename(d) in churn_units]
check(not dirs, f"no cgroup directory of a churn pod left: {dirs[:5]}")
bad = compare_kernel(expected)
check(not bad, f"still equal to plan after that: {bad[:5]}")

# --------------------------------------------------------------------------- the daemon itself
rss1 = proc_status(daemon_pid)
peak = max((v for _, v in churn.rss), default=0)
cpu_daemon, cpu_pid1 = cpu_seconds(daemon_pid) - cpu0_daemon, cpu_seconds(1) - cpu0_pid1
calls1 = dbus_calls()
delta = {f"{m}/{r}": int(v - calls0.get((m, r), 0)) for (m, r), v in calls1.items()
         if v - calls0.get((m, r), 0)}
nr = int(service_show("NRestarts"))
check(int(service_show("MainPID")) == daemon_pid and nr == nrestarts0,
      f"the daemon was not restarted (MainPID {daemon_pid}, NRestarts {nr}: no watchdog kill)")
grow = rss1.get("VmRSS", 0) - rss0.get("VmRSS", 0)
check(grow < 32 * MIB, f"the daemon's memory stayed bounded: RSS {rss0.get('VmRSS', 0) / MIB:.1f} MiB"
                       f" before, peak {peak / MIB:.1f} MiB sampled during, {rss1.get('VmRSS', 0) / MIB:.1f} MiB"
                       f" after (VmHWM {rss1.get('VmHWM', 0) / MIB:.1f} MiB); limit +32 MiB")
lines = journal_since(cursor)
reconciles = [l for l in lines if l.startswith("reconcile:")]
gone = sum(int(l.split(" unit(s) gone")[0].rsplit(" ", 1)[1]) for l in reconciles if "unit(s) gone" in l)
errors = [l for l in lines if l.startswith("systemd:") or "failed" in l]
check(True, f"the daemon's work: {cpu_daemon:.0f} s of CPU (PID 1: {cpu_pid1:.0f} s, this churn driver:"
            f" {cpu_self:.0f} s) over"
            f" {t_conv - t_start:.0f} s; D-Bus calls {delta}; {len(reconciles)} reconcile lines,"
            f" {gone} writes found their unit gone; {len(errors)} error lines {errors[:3]}")
