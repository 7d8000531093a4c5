#!/usr/bin/python3
"""The real kubelet of v1.37.2 (issue 41) on containerd 2.4.2 and Debian's runc, standalone with
static pods: what it writes, in each of the issue's configurations, in one boot (the kubelet
restarted with each configuration in turn):
  (a) its defaults: the MemoryQoS gate on, memoryReservationPolicy None, no throttling factor;
  (b) memoryReservationPolicy: TieredReservation;
  (c) (b) and memoryThrottlingFactor: 0.9;
  (d) the gate off.
Every SetUnitProperties/StartTransientUnit on systemd is seen on the bus (busctl monitor) with
its sender (the kubelet, or runc started by containerd's shim), and the kernel's memory.min/low/
high/max of every cgroup below kubepods.slice and of kube.slice (kube-reserved, enforced) are
sampled every 20 ms. Each configuration's window is cut in: start (restart to the pods' manifests),
create (manifests to running), remove (the previous configuration's pods deleted) and minute (to
the kubelet's periodic QoS round, one minute after its start). The table is saved as facts.json
in the artifacts (docs/DESIGN.md, "What the kubelet of v1.37.2 writes") and checked below."""
# e2e-timeout: 900
# e2e-go: kubelet containerd containerd-shim-runc-v2 ctr
import json
import os
import subprocess
import time

from memqos_e2e import *
from realnode import *
from memqos_e2e import CGROUP_ROOT

ART = os.environ.get("MEMQOS_E2E_ARTIFACTS", ".")
MI = 1 << 20
MAX = UINT64_MAX
RESTART_GAP = 8  # s after the kubelet's start writes before the new pods' manifests
# The configurations whose minute round is waited for (a minute each). (c)'s round is (b)'s (the
# factor is no QoS-slice property) and (d)'s writes no memory property as (a)'s; both measured in
# full on 2026-12-07 (docs/DESIGN.md). 59-real-kubelet-beside passes (b)'s round again with the
# service beside it. (c) and (d) end at the round after the previous pods' deletion.
MINUTE = ("a", "b")
pause_memqos()

CONFIGS = [
    ("a", "defaults: gate on, policy None, no factor", kubelet_config()),
    ("b", "TieredReservation", kubelet_config(policy="TieredReservation")),
    ("c", "TieredReservation + factor 0.9", kubelet_config(policy="TieredReservation", factor=0.9)),
    ("d", "the MemoryQoS gate off", kubelet_config(gate=False)),
]
# The pods of every configuration, by the label their units get in the table.
G_REQ, B_APP, B_APP_LIM, B_SIDECAR, P_REQ, P_LIM = 64 * MI, 32 * MI, 128 * MI, 16 * MI, 32 * MI, 96 * MI


def pods_for(k):
    pod_level = static_pod(f"p-{k}", [{"name": "main"}])
    # A Burstable pod with pod-level resources only (PodLevelResources, beta and on in v1.37).
    pod_level["spec"]["resources"] = {"requests": {"memory": f"{P_REQ // MI}Mi"},
                                      "limits": {"memory": f"{P_LIM // MI}Mi"}}
    return [
        static_pod(f"g-{k}", [{"name": "main", "requests": {"memory": f"{G_REQ // MI}Mi", "cpu": "100m"},
                                "limits": {"memory": f"{G_REQ // MI}Mi", "cpu": "100m"}}]),
        static_pod(f"b-{k}", [{"name": "app", "requests": {"memory": f"{B_APP // MI}Mi"},
                               "limits": {"memory": f"{B_APP_LIM // MI}Mi"}},
                              {"name": "sidecar", "requests": {"memory": f"{B_SIDECAR // MI}Mi"}}]),
        static_pod(f"be-{k}", [{"name": "job"}]),
        pod_level,
    ]


# pod name prefix -> (pod slice label, {container: scope label})
LABELS = {"g": ("pod G", {"main": "ctr G"}),
          "b": ("pod B", {"app": "ctr B limit", "sidecar": "ctr B no-limit"}),
          "be": ("pod BE", {"job": "ctr BE"}),
          "p": ("pod B pod-level", {"main": "ctr B pod-level"})}
PROP_FILE = {"MemoryMin": "memory.min", "MemoryLow": "memory.low", "MemoryHigh": "memory.high",
             "MemoryMax": "memory.max"}


class Labeller:
    def __init__(self):
        self.units = {"kubepods.slice": "kubepods.slice", "kubepods-burstable.slice": "burstable.slice",
                      "kubepods-besteffort.slice": "besteffort.slice", "kube.slice": "kube.slice (reserved)"}

    def learn(self, units):
        for name, u in units.items():
            pod_label, ctrs = LABELS[name.rsplit("-", 1)[0]]
            self.units[u["slice"]] = pod_label
            for c, scope in u["scopes"].items():
                self.units[scope] = ctrs[c]

    def __call__(self, unit):
        if unit in self.units:
            return self.units[unit]
        if unit.startswith("cri-containerd-") and unit.endswith(".scope"):
            return "sandbox"  # the pause containers (the kubelet lists only the app containers)
        return unit


def fmt(v):
    if v is None or v == MAX:
        return "max"
    if isinstance(v, int) and v >= MI and v % MI == 0:
        return f"{v // MI}Mi"
    return str(v)


def summarize(calls, label, t0):
    """{who: {label: {prop: [values in order, distinct consecutive]}}} of the memory properties;
    other properties are counted under "other"."""
    out = {}
    for c in calls:
        who = "kubelet" if c["who"].startswith("kubelet.service") else "runc"
        cell = out.setdefault(who, {}).setdefault(label(c["unit"]), {})
        for p, v in c["props"].items():
            if p in PROP_FILE:
                seq = cell.setdefault(p, [])
                if not seq or seq[-1] != v:
                    seq.append(v)
            else:
                cell.setdefault("other", set()).add(p)
    for who in out.values():
        for cell in who.values():
            if "other" in cell:
                cell["other"] = sorted(cell["other"])
    return out


def file_only_writes(sampler, mon, label, since, until):
    """Kernel value changes in [since, until) with no D-Bus call setting that value on that unit in
    the 3 s before: a write to the file alone."""
    out = []
    for (unit, f), line in sampler.timeline.items():
        prop = next(p for p, pf in PROP_FILE.items() if pf == f)
        for i, (t, v) in enumerate(line):
            if i == 0 or not since <= t < until:
                continue  # the first value is the cgroup's own at its creation
            want = MAX if v is None else v
            hit = [c for c in mon.calls(since=t - 3, until=t + 0.1, unit=unit)
                   if c["props"].get(prop) in (want, v)]
            if not hit:
                out.append(f"{label(unit)} {f}={fmt(v)} at {t - since:.1f}s")
    return out


def kernel_now(sampler, label):
    out = {}
    for (unit, f), line in sampler.timeline.items():
        if unit_exists_cgroup(unit):
            out.setdefault(label(unit), {})[f] = fmt(line[-1][1])
    return out


def unit_exists_cgroup(unit):
    return bool(find_cgroup(unit))


def find_cgroup(unit):
    for root in ("kubepods.slice", "kube.slice"):
        base = os.path.join(CGROUP_ROOT, root)
        if os.path.basename(base) == unit:
            return base
        for dirpath, dirs, _ in os.walk(base):
            if unit in dirs:
                return os.path.join(dirpath, unit)
    return None


def meminfo():
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            out[k] = int(v.split()[0]) * 1024
    return out


def current(unit):
    try:
        with open(os.path.join(cgroup_path(unit), "memory.current")) as f:
            return int(f.read())
    except (OSError, SystemdError):
        return None


def minute_round(mon, t_start):
    """The kubelet's periodic QoS round: its call to kubepods-burstable.slice 50 s or more after
    its start (the first round is at the start; wait.Until then every minute)."""
    calls = mon.calls(since=t_start + 50, who=KUBELET_UNIT, unit="kubepods-burstable.slice")
    return calls[0]["t"] if calls else None


def deletion_round(mon, old_slices, t_removed):
    """The kubelet's QoS round once the deleted pods' cgroups are gone (its call to
    kubepods-burstable.slice then)."""
    if any(find_cgroup(u) for u in old_slices):
        return None
    calls = mon.calls(since=t_removed, who=KUBELET_UNIT, unit="kubepods-burstable.slice")
    return calls[-1]["t"] if calls else None


def last(rec, who, lab, prop, windows=("start", "create", "remove", "minute")):
    """The last value `who` wrote to `lab`'s `prop` in the windows, None if it wrote none."""
    v = None
    for w in windows:
        seq = rec["written"][w].get(who, {}).get(lab, {}).get(prop)
        if seq:
            v = seq[-1]
    return v


def written(rec, who, lab, windows=("start", "create", "remove", "minute")):
    """The memory properties `who` wrote to `lab` in the windows: {prop: last value}."""
    return {p: last(rec, who, lab, p, windows) for p in PROP_FILE
            if last(rec, who, lab, p, windows) is not None}


def page_floor(x):
    return int(x) // 4096 * 4096


def expect(key, rec):
    """The facts of this configuration (docs/DESIGN.md, "What the kubelet of v1.37.2 writes"),
    as measured on 2026-12-07; a change in a new kubelet or runtime shows here first."""
    gate = key != "d"
    tiered = key in ("b", "c")
    factor = 0.9 if key == "c" else None
    start = ("start",)
    alloc = last(rec, "kubelet", "kubepods.slice", "MemoryMax", start)
    k = rec["kernel_end"]
    # At its start, whatever the configuration: kubepods.slice and the Burstable slice to 0 (no pod
    # counted yet), kubepods.slice's MemoryMax = allocatable, the reservation enforced.
    check(written(rec, "kubelet", "kubepods.slice", start) == {"MemoryMin": 0, "MemoryLow": 0, "MemoryMax": alloc}
          and alloc and k["kubepods.slice"]["memory.max"] == fmt(alloc),
          f"({key}) start: kubepods.slice MemoryMin=0 MemoryLow=0 MemoryMax=allocatable ({fmt(alloc)}) over D-Bus: "
          f"{written(rec, 'kubelet', 'kubepods.slice', start)}")
    check(written(rec, "kubelet", "burstable.slice", start) == {"MemoryLow": 0},
          f"({key}) start: kubepods-burstable.slice MemoryLow=0: {written(rec, 'kubelet', 'burstable.slice', start)}")
    want = {"MemoryMax": KUBE_RESERVED, **({"MemoryMin": KUBE_RESERVED} if gate else {})}
    check(written(rec, "kubelet", "kube.slice (reserved)") == want and k["kube.slice (reserved)"]["memory.min"] == "192Mi",
          f"({key}) kube.slice (kube-reserved enforced): {written(rec, 'kubelet', 'kube.slice (reserved)')} "
          f"(kernel memory.min {k['kube.slice (reserved)']['memory.min']}"
          f"{': the gate off writes none and leaves the old one' if not gate else ''})")
    # After the previous pods' deletion (a round once their cgroups are gone, seconds later) and
    # in the periodic QoS round: the sums under TieredReservation, no memory property otherwise.
    for w in ("remove", "minute") if key in MINUTE else ("remove",):
        want = {"MemoryMin": G_REQ + B_APP + B_SIDECAR + P_REQ, "MemoryLow": B_APP + B_SIDECAR + P_REQ} \
            if tiered else {}
        seen = ("minute",) if w == "remove" and rec["deletion_in_minute"] else (w,)  # (see rec)
        got = written(rec, "kubelet", "kubepods.slice", seen)
        check(got == want, f"({key}) {'minute round' if w == 'minute' else 'after a deletion'}: kubepods.slice {got}"
                           + (" (the deletion's round was the minute round)" if seen != (w,) else ""))
        want = {"MemoryLow": want["MemoryLow"]} if want else {}
        got = written(rec, "kubelet", "burstable.slice", seen)
        check(got == want, f"({key}) {'minute round' if w == 'minute' else 'after a deletion'}: "
                           f"kubepods-burstable.slice {got}")
    # The pod slices, by the kubelet at their creation.
    pods = {"pod G": {"MemoryMax": G_REQ, **({"MemoryMin": G_REQ} if tiered else {})},
            "pod B": {"MemoryLow": B_APP + B_SIDECAR} if tiered else {},
            "pod B pod-level": {"MemoryMax": P_LIM, **({"MemoryLow": P_REQ} if tiered else {}),
                                **({"MemoryHigh": page_floor(P_REQ + factor * (P_LIM - P_REQ))} if factor else {})},
            "pod BE": {}}
    for lab, want in pods.items():
        got = written(rec, "kubelet", lab, ("create",))
        check(got == want, f"({key}) {lab} slice at creation: {got}")
    # The container scopes, by runc from the CRI's Unified map.
    def high(req, lim):
        return page_floor(req + factor * ((lim or alloc) - req)) if factor else None

    if gate:
        zero = {"MemoryMin": 0, "MemoryLow": 0}
        ctrs = {"ctr G": {"MemoryMax": G_REQ, **({"MemoryMin": G_REQ} if tiered else zero)},
                "ctr B limit": {"MemoryMax": B_APP_LIM, **({"MemoryLow": B_APP} if tiered else zero)},
                "ctr B no-limit": {"MemoryLow": B_SIDECAR} if tiered else dict(zero),
                "ctr BE": dict(zero),
                "ctr B pod-level": {"MemoryMax": P_LIM, **zero}}
        if factor:
            ctrs["ctr B limit"]["MemoryHigh"] = high(B_APP, B_APP_LIM)
            ctrs["ctr B no-limit"]["MemoryHigh"] = high(B_SIDECAR, None)
            ctrs["ctr BE"]["MemoryHigh"] = high(0, None)
    else:
        ctrs = {"ctr G": {"MemoryMax": G_REQ, "MemoryHigh": MAX},
                "ctr B limit": {"MemoryMax": B_APP_LIM, "MemoryHigh": MAX},
                "ctr B no-limit": {"MemoryHigh": MAX}, "ctr BE": {"MemoryHigh": MAX},
                "ctr B pod-level": {"MemoryMax": P_LIM, "MemoryHigh": MAX}}
    for lab, want in ctrs.items():
        got = written(rec, "runc", lab, ("create",))
        kern = k.get(lab, {})
        ok = got == want and all(kern.get(PROP_FILE[p]) == fmt(v) for p, v in want.items())
        check(ok, f"({key}) {lab} scope at creation (runc): {got}; kernel {kern}")
    # Not a check: the bus's stamps and the 20 ms samples can disagree by a sample or two.
    log(f"FACT ({key}) kernel changes with no D-Bus call of that value in the 3 s before: {rec['file_only']}")


t_boot = time.monotonic()
node = RealNode()
mon = BusMonitor()
sampler = KernelSampler()
label = Labeller()
report = {"configs": {}, "timing": node.timing, "memory": {}}
previous = []
for key, what, cfg in CONFIGS:
    t0 = time.monotonic()
    took = node.kubelet_start(cfg)
    # Its start writes: the reservation enforced on kube.slice, then a few s with the pods of the
    # previous configuration adopted and no new one (does a restart leave kubepods.slice at 0?).
    wait_for(lambda: mon.calls(since=t0, who=KUBELET_UNIT, unit="kube.slice"), 30, 0.5)
    time.sleep(RESTART_GAP)
    t_pods = time.monotonic()
    pods = pods_for(key)
    try:
        units = node.run_pods(pods)
    except SystemdError as e:
        check(False, f"({key}) {e}")
        units = {}
    label.learn(units)
    t_created = time.monotonic()
    node.remove_pods(previous)
    t_removed = time.monotonic()
    previous = [p["metadata"]["name"] for p in pods]
    if key in MINUTE:
        t_round = wait_for(lambda: minute_round(mon, t0), max(1, t0 + 100 - time.monotonic()), 0.5)
    else:
        # the round after the deletion, once the old pods' slices are gone: then 2 s more
        gone = [u for u, lab in label.units.items() if u.endswith(".slice") and lab.startswith("pod ")
                and not any(u == x["slice"] for x in units.values())]
        t_round = wait_for(lambda: (lambda t: t if t and time.monotonic() > t + 2 else None)(
            deletion_round(mon, gone, t_removed)), 40, 0.5)
    time.sleep(2)
    t_end = time.monotonic()
    t_minute = (t_round - 1) if t_round and key in MINUTE else t_end
    windows = {"start": (t0, t_pods), "create": (t_pods, t_created), "remove": (t_created, t_minute),
               "minute": (t_minute, t_end)}
    rec = {
        "what": what, "config": cfg, "healthz_s": took,
        # Under load (TCG, pods 30 s to run) the old pods' cgroups may outlive the window between the
        # new pods and the minute round: the deletion's round is then the minute round itself.
        "deletion_in_minute": key in MINUTE and t_removed < t_minute and not mon.calls(
            since=t_created, until=t_minute, who=KUBELET_UNIT, unit="kubepods-burstable.slice"),
        "windows_s": {w: [round(a - t0, 1), round(b - t0, 1)] for w, (a, b) in windows.items()},
        "minute_round_s": round(t_round - t0, 1) if t_round and key in MINUTE else None,
        "deletion_round_s": round(t_round - t0, 1) if t_round and key not in MINUTE else None,
        "units": units,
        "written": {w: summarize(mon.calls(since=a, until=b), label, t0) for w, (a, b) in windows.items()},
        "file_only": {w: file_only_writes(sampler, mon, label, a, b) for w, (a, b) in windows.items()},
        "kernel_end": kernel_now(sampler, label),
        "calls": [dict(c, t=round(c["t"] - t0, 3)) for c in mon.calls(since=t0, until=t_end)],
    }
    report["configs"][key] = rec
    report["memory"][key] = {"MemAvailable": meminfo()["MemAvailable"],
                             **{u: current(u) for u in ("kubelet.service", "containerd.service",
                                                        "kube.slice", "system.slice", "kubepods.slice")}}
    check(units and t_round, f"({key}) {what}: kubelet healthy {took} s after its restart, pods running "
                             f"{t_created - t_pods:.1f} s after their manifests, "
                             + (f"the minute round at {rec['minute_round_s']} s" if key in MINUTE else
                                f"the round after the deletion at {rec['deletion_round_s']} s (no minute waited)"))
    for w, by_who in rec["written"].items():
        for who, cells in sorted(by_who.items()):
            for lab, props in sorted(cells.items()):
                vals = " ".join(f"{p}={'>'.join(fmt(v) for v in seq)}" for p, seq in props.items() if p != "other")
                log(f"FACT ({key}) {w:6} {who:7} {lab:22} {vals or '-'} (other: {','.join(props.get('other', []))})")
        if rec["file_only"][w]:
            log(f"FACT ({key}) {w:6} file only: {rec['file_only'][w]}")
    for lab, files in sorted(rec["kernel_end"].items()):
        log(f"FACT ({key}) kernel {lab:22} " + " ".join(f"{f[7:]}={v}" for f, v in sorted(files.items())))
    expect(key, rec)
    with open(os.path.join(ART, "facts.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)

node.remove_pods()
report["total_s"] = round(time.monotonic() - t_boot, 1)
report["samples"] = sampler.samples
log(f"FACT memory by configuration: {json.dumps(report['memory'])}")
log(f"FACT total {report['total_s']} s, {sampler.samples} kernel samples")
with open(os.path.join(ART, "facts.json"), "w") as f:
    json.dump(report, f, indent=1, default=str)
subprocess.run(f"journalctl -u kubelet.service -u containerd.service --no-pager -o short-monotonic > {ART}/journal.txt",
               shell=True)
