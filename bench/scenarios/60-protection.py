#!/usr/bin/python3
"""Guest side of bench/protection.py: does the protection protect? Writes protection.json.

First the daemon's own footprint (its cgroup's memory.current and memory.stat with no pod and with
110, and what it reads back in after its cgroup was emptied by memory.reclaim): what its MemoryMin
and MemoryLow are sized from.

Per run (one configuration x one kind of pressure), new pods:
  G  Guaranteed, request = limit; holds anonymous memory and page cache
  B  Burstable, request, no limit; holds page cache and some anonymous memory
  B2 Burstable whose request is mostly unused, so that the requests add up to ~90 % of allocatable
  BE BestEffort neighbour that applies the pressure: streams a file, allocates anonymous memory
     until the OOM killer acts, or both at once ("mix"); or none at all ("none")
  BN instead of BE for "burst": a Burstable neighbour (a request, no limit) that allocates
     anonymous memory until the OOM killer acts (B2's request is smaller by BN's, so the requests
     still add up to the same)
Processes get the kubelet's oom_score_adj for their QoS class; Guaranteed slices and scopes their
MemoryMax (as the kubelet and runc set it). Measured: memory.stat file/anon of each pod before and
after, memory.events low/oom_kill, who the OOM killer chose (kernel log), the time to re-touch
the anonymous memory and re-read the file afterwards; the BestEffort slice's memory.max and when
it was reached; the daemon's health from convergence to the end (health.py: /metrics latency,
watchdog pings, its cgroup's memory.events), its restarts and watchdog kills, and its D-Bus writes
after convergence. Then the memory.high test: a Burstable container allocating past its
MemoryHigh. Parameters: payload/bench/params.json."""
# e2e-timeout: 3000
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.environ["MEMQOS_E2E_PAYLOAD"], "bench"))
from mqbench import *  # noqa: E402,F403
from memqos_e2e import check, make_pod, need_deb  # noqa: E402

need_deb()
P = json.load(open(os.path.join(os.environ["MEMQOS_E2E_PAYLOAD"], "bench", "params.json")))
GUEST = os.path.join(os.environ["MEMQOS_E2E_PAYLOAD"], "bench")
WS = os.path.join(GUEST, "ws.py")
PY = "/usr/bin/python3"
CTL = "/run/memqos-bench"
BIG = "/var/tmp/bench-stream.dat"
OUT = {"params": P, "runs": [], "started": time.time()}

with open("/proc/self/oom_score_adj", "w") as f:
    f.write("-900")  # the benchmark itself must survive the OOM killer


def dump():
    save("protection.json", OUT)


def mem_total() -> int:
    return int(open("/proc/meminfo").readline().split()[1]) * 1024


def meminfo_kib() -> dict:
    """{"MemFree": kB, ...}. read_kv() cannot parse /proc/meminfo ("MemFree:   123 kB"): it gave
    nothing, so the guest's swap was reported as 0 whatever it was."""
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, _, v = line.partition(":")
            if v.split() and v.split()[0].isdigit():
                out[k] = int(v.split()[0])
    return out


CAPACITY = mem_total()
# The daemon's own MemoryMin (units/memqos.slice: 64M) counted in systemReserved, as docs/DESIGN.md
# asks of an operator: left out, HardReservation's MemoryMin of 90 % of allocatable, the daemon's
# 64M and the sampler's locked pages left the guest's own processes too little, and the OOM killer
# took the pods and the test driver (issue 25's first two boots).
SYSTEM_RESERVED_MIB = 64
ALLOCATABLE = CAPACITY - 100 * MIB - SYSTEM_RESERVED_MIB * MIB  # the default evictionHard memory.available too
G_REQ, B_REQ = P["g_request_mib"], P["b_request_mib"]
B2_REQ = max(32, int(P["requests_fraction"] * ALLOCATABLE / MIB) - G_REQ - B_REQ)
BN_REQ = P["bn_request_mib"]
HEALTH = os.path.join(GUEST, "health.py")
FILES = {"G": ("/var/tmp/bench-g.dat", P["g_file_mib"]), "B": ("/var/tmp/bench-b.dat", P["b_file_mib"])}


def oom_adj(qos, request):
    """The kubelet's oom_score_adj (pkg/kubelet/qos/policy.go)."""
    if qos == "Guaranteed":
        return -997
    if qos == "BestEffort":
        return 1000
    adj = 1000 - (1000 * request) // CAPACITY
    return int(min(max(adj, 2), 999))


def make_files():
    for path, mib in FILES.values():
        if not os.path.exists(path):
            subprocess.run(["dd", "if=/dev/urandom", f"of={path}", "bs=1M", f"count={mib}", "status=none"], check=True)
    if not os.path.exists(BIG):
        subprocess.run(["truncate", "-s", f"{P['stream_mib']}M", BIG], check=True)
    subprocess.run(["sync"], check=True)


def drop_caches():
    subprocess.run(["sync"])
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def kmsg_lines() -> list[tuple[float, str]]:
    """(CLOCK_MONOTONIC seconds, text) of this boot's kernel messages."""
    return journal(["-k"])


def watchdog_kills(since: float) -> list[tuple[float, str]]:
    """systemd's watchdog timeouts of the daemon since `since` (monotonic seconds)."""
    return [(round(t, 3), m) for t, m in journal_since(DAEMON, since) if "Watchdog timeout" in m]


def service_cgroup() -> str:
    return CG + systemctl("show", "-p", "ControlGroup", "--value", DAEMON).stdout.strip()


def service_memory() -> dict:
    """The daemon's cgroup: memory.current, the memory.stat lines that say what it holds, and
    memory.events."""
    d = service_cgroup()
    st = read_kv(os.path.join(d, "memory.stat"))
    return {"cgroup": d[len(CG):], "current": read_int(os.path.join(d, "memory.current")),
            "peak": read_int(os.path.join(d, "memory.peak")),
            "min": read_int(os.path.join(d, "memory.min")), "low": read_int(os.path.join(d, "memory.low")),
            "stat": {k: st.get(k) for k in ("anon", "file", "kernel", "kernel_stack", "pagetables", "sock", "slab",
                                            "file_mapped", "active_file", "inactive_file", "workingset_refault_file")},
            "events": read_kv(os.path.join(d, "memory.events"))}


def unit_show(*props_) -> dict:
    out = systemctl("show", *[f"-p{p}" for p in props_], DAEMON).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


OOM_RE = re.compile(r"oom-kill:.*task_memcg=([^,]+),task=([^,]+),pid=(\d+)")


def pod_of(memcg, units):
    for label, u in units.items():
        if u["slice"] in memcg:
            return label
    return memcg.rsplit("/", 1)[-1]


def stat_mib(unit):
    s = read_kv(os.path.join(slice_dir(unit), "memory.stat"))
    out = {"file": s.get("file", 0) / MIB, "anon": s.get("anon", 0) / MIB}
    swapped = read_int(os.path.join(slice_dir(unit), "memory.swap.current"))
    if swapped:
        out["swap"] = swapped / MIB
    return out


def events(unit):
    return read_kv(os.path.join(slice_dir(unit), "memory.events"))


def protection_layout(units):
    out = {}
    for name in ["kubepods.slice", "kubepods-burstable.slice", "kubepods-besteffort.slice"] + \
            [u["slice"] for u in units.values()]:
        d = slice_dir(name)
        out[name] = {k: read_int(os.path.join(d, "memory." + k)) for k in ("min", "low")}
    return out


def spawn(args):
    return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


async def start_scope(bus, slice_name, cid, pids, **props):
    p = {"Description": f"libcontainer container {cid}", "Slice": slice_name, "Delegate": True, "PIDs": pids,
         "DefaultDependencies": False, "MemoryAccounting": True, "CPUAccounting": True, "IOAccounting": True,
         "TasksAccounting": True}
    p.update(props)
    name = f"cri-containerd-{cid}.scope"
    await bus.many([("StartTransientUnit", "ssa(sv)a(sa(sv))", [name, "fail", v_props(p), []])])
    return name


def cid_of(pod):
    return pod["status"]["containerStatuses"][0]["containerID"].split("://")[1]


async def start_slice(bus, name, **props):
    parent = name[: -len(".slice")].rsplit("-", 1)[0] + ".slice"
    p = {"Description": f"libcontainer container {name[:-6]}", "Wants": [parent], "DefaultDependencies": False,
         "MemoryAccounting": True, "CPUAccounting": True, "IOAccounting": True, "TasksAccounting": True}
    p.update(props)
    await bus.many([("StartTransientUnit", "ssa(sv)a(sa(sv))", [name, "fail", v_props(p), []])])


def the_pods(pressure):
    g = make_pod("guaranteed", [{"name": "app", "requests": {"memory": f"{G_REQ}Mi", "cpu": "100m"},
                                 "limits": {"memory": f"{G_REQ}Mi", "cpu": "100m"}}], namespace="bench",
                 qos="Guaranteed")
    b = make_pod("burstable", [{"name": "app", "requests": {"memory": f"{B_REQ}Mi"}}], namespace="bench")
    if pressure in ("burst", "price"):
        b2 = make_pod("burstable-idle", [{"name": "app", "requests": {"memory": f"{B2_REQ - BN_REQ}Mi"}}],
                      namespace="bench")
        bn = make_pod("burstable-hog", [{"name": "hog", "requests": {"memory": f"{BN_REQ}Mi"}}], namespace="bench")
        return {"G": g, "B": b, "B2": b2, "BN": bn}
    b2 = make_pod("burstable-idle", [{"name": "app", "requests": {"memory": f"{B2_REQ}Mi"}}], namespace="bench")
    be = make_pod("besteffort", [{"name": "hog"}], namespace="bench")
    return {"G": g, "B": b, "B2": b2, "BE": be}


async def converge(units, timeout=120):
    """Until the kernel's memory.min/low/high of our pod slices and scopes equal what the daemon
    says it wants (its metrics)."""
    deadline = now() + timeout
    while now() < deadline:
        try:
            m = metrics()
        except OSError:
            await asyncio.sleep(1)
            continue
        ok = True
        want_all = desired(m)
        for u in units.values():
            for unit, d in ((u["slice"], slice_dir(u["slice"])), (u["scope"], os.path.join(slice_dir(u["slice"]), u["scope"]))):
                for prop, f in (("MemoryMin", "min"), ("MemoryLow", "low"), ("MemoryHigh", "high")):
                    want = want_all.get((unit, prop))
                    if want is None:
                        ok = False
                        continue
                    have = read_int(os.path.join(d, "memory." + f))
                    if have is None or (want != float("inf") and have != int(want)) or \
                            (want == float("inf") and have != UINT64_MAX):
                        ok = False
        if ok:
            return True
        await asyncio.sleep(1)
    return False


SWAPFILE = "/var/swap.bench"


def set_swap(on: bool) -> int:
    """Switch the benchmark's swap file on (made once: P["swap_mib"], fallocate'd on the guest's
    ext4 root) or every swap off; the guest's SwapTotal in bytes afterwards."""
    if on:
        if not os.path.exists(SWAPFILE):
            if subprocess.run(["fallocate", "-l", f"{P['swap_mib']}M", SWAPFILE]).returncode != 0:
                subprocess.run(["dd", "if=/dev/zero", f"of={SWAPFILE}", "bs=1M", f"count={P['swap_mib']}",
                                "status=none"], check=True)
            os.chmod(SWAPFILE, 0o600)
            subprocess.run(["mkswap", SWAPFILE], check=True, capture_output=True)
        if meminfo_kib().get("SwapTotal", 0) == 0:
            subprocess.run(["swapon", SWAPFILE], check=True)
    else:
        subprocess.run(["swapoff", "-a"], check=True)
    return meminfo_kib().get("SwapTotal", 0) * 1024


def limited_swap(qos, request_mib, swap_total):
    """The memory.swap.max the kubelet's LimitedSwap asks the runtime for (KEP-2400; kuberuntime's
    calcSwapForBurstablePods): 0 for Guaranteed and BestEffort containers (and a Burstable one whose
    request equals its limit), else request / node memory capacity x the node's swap, truncated."""
    if qos != "Burstable" or not request_mib:
        return 0
    return int(request_mib * MIB / CAPACITY * swap_total)


async def converge_slice(unit, prop, f, timeout=60):
    """Until the kernel's memory.<f> of one slice equals the daemon's desired `prop` for it."""
    deadline = now() + timeout
    while now() < deadline:
        try:
            want = desired(metrics()).get((unit, prop))
        except OSError:
            want = None
        have = read_int(os.path.join(slice_dir(unit), "memory." + f))
        if want is not None and have is not None and \
                (have == UINT64_MAX if want == float("inf") else have == int(want)):
            return True
        await asyncio.sleep(1)
    return False


# Issue 42's goal: beside a stand-in that writes what a v1.37 kubelet at its defaults writes
# (docs/DESIGN.md, "What the kubelet of v1.37.2 writes, measured", (a)): its gate on, no policy,
# no factor; at its start MemoryMin/MemoryLow 0 on kubepods.slice and the Burstable slice, and at a
# container's creation MemoryMin/MemoryLow 0 on its scope; nothing after. The stand-in's /metrics
# (kubelet_stub.py serves PODS_FILE.metrics) and its config file say so, as a real kubelet's do.
STANDIN_METRICS = PODS_FILE + ".metrics"
STANDIN_FILE = "/etc/memqos-systemd/bench-kubelet.yaml"
STANDIN_GATE = ('kubernetes_build_info{git_version="v1.37.2",major="1",minor="37"} 1\n'
                'kubernetes_feature_enabled{name="MemoryQoS",stage="BETA"} 1\n')
ZEROS = {"MemoryMin": 0, "MemoryLow": 0}


def standin(on: bool) -> dict:
    """The v1.37 kubelet stand-in's /metrics and config file (on), or neither; our config's keys."""
    for path in (STANDIN_METRICS, STANDIN_FILE):
        if os.path.exists(path):
            os.unlink(path)
    if not on:
        return {}
    with open(STANDIN_FILE, "w") as f:
        f.write('{"kind": "KubeletConfiguration", "apiVersion": "kubelet.config.k8s.io/v1beta1",'
                ' "featureGates": {"MemoryQoS": true}}\n')  # YAML is a superset of JSON
    with open(STANDIN_METRICS + ".tmp", "w") as f:
        f.write(STANDIN_GATE)
    os.replace(STANDIN_METRICS + ".tmp", STANDIN_METRICS)
    return {"kubeletConfigFile": STANDIN_FILE}


async def standin_start(bus):
    """The stand-in kubelet (re)starts: its start's zeros on the node and Burstable slices."""
    systemctl("restart", "kubelet.service")
    await bus.set_props([(u, ZEROS) for u in ("kubepods.slice", "kubepods-burstable.slice")])


def kubelet_counts() -> dict | None:
    """What the daemon counted of other writers: foreign writes (each a write it put back that it
    could not tell for the kubelet's) and the kubelet's moments (start and create resets)."""
    try:
        m = metrics()
    except OSError:
        return None
    return {"foreign": metric_sum(m, "memqos_foreign_writes_total"), "resets": metric_sum(m, "memqos_kubelet_resets_total"),
            "companion": metric_sum(m, "memqos_companion_mode"), "kubelet_protects": metric_sum(m, "memqos_kubelet_protects")}


async def configure(bus, cfg):
    OUT.setdefault("swap_total", {})[cfg["name"]] = set_swap(bool(cfg.get("swap")))
    if cfg["daemon"]:
        extra = {"systemReserved": {"memory": f"{SYSTEM_RESERVED_MIB}Mi"}, **standin(bool(cfg.get("standin")))}
        if "ceiling" in cfg:
            extra["bestEffortCeiling"] = {"enabled": "true", **cfg["ceiling"]}
        if "lever" in cfg:
            extra["burstableHigh"] = {"enabled": "true", **cfg["lever"]}
        # perUnit: the desired values of the pod slices and scopes, which converge() waits for.
        write_config(memoryReservationPolicy=cfg["policy"], hierarchy=cfg["hierarchy"], metrics={"perUnit": "true"},
                     **extra)
        systemctl("restart", DAEMON)
        if cfg.get("standin"):
            await standin_start(bus)
    else:
        standin(False)
        systemctl("stop", DAEMON)
        await bus.set_props([(u, ZEROS) for u in ("kubepods.slice", "kubepods-burstable.slice", "kubepods-besteffort.slice")])


BE_QOS = "kubepods-besteffort.slice"


async def sample(samples, units, stop, nb):
    """Every 0.1 s: the B pod slice's and the Burstable QoS slice's `low` count, the BestEffort QoS
    slice's memory.high, memory.max, memory.current and its `max` count (the times its usage met
    memory.max)."""
    paths = {"b_low": (os.path.join(slice_dir(units["B"]["slice"]), "memory.events"), "low"),
             "q_low": (os.path.join(slice_dir("kubepods-burstable.slice"), "memory.events"), "low")}
    be = slice_dir(BE_QOS)
    nb_dir = slice_dir(units[nb]["slice"])
    while not stop.is_set():
        row = {"t": now(), "nb_cur": read_int(os.path.join(nb_dir, "memory.current"))}
        for k, (path, key) in paths.items():
            row[k] = read_kv(path).get(key, 0)
        row["be_high"] = read_int(os.path.join(be, "memory.high"))
        row["be_max"] = read_int(os.path.join(be, "memory.max"))
        row["be_cur"] = read_int(os.path.join(be, "memory.current"))
        row["be_maxev"] = read_kv(os.path.join(be, "memory.events")).get("max", 0)
        samples.append(row)
        try:
            await asyncio.wait_for(stop.wait(), 0.1)
        except asyncio.TimeoutError:
            pass


def ceiling_reached(samples, t_p, kills):
    """When the BestEffort slice first met its memory.max (its `max` count rose), and the first OOM
    kill (the kernel's timestamp) after that: the kernel's reaction, with no userspace in the loop."""
    if not samples:
        return {}
    base = samples[0]["be_maxev"]
    hit = next((r for r in samples if r["be_maxev"] > base), None)
    caps = [r["be_max"] for r in samples if r["be_max"] is not None and r["be_max"] != UINT64_MAX]
    out = {"memory_max": (min(caps) if caps else None), "max_events": samples[-1]["be_maxev"] - base}
    if hit is not None:
        out["reached_s"] = hit["t"] - t_p
        kill = next((k for k in kills if k["pod"] == "BE" and k["t"] >= hit["t"] - 0.2), None)
        if kill is not None:
            # the sample is up to 0.1 s late (or more when the guest stalls): an upper bound on
            # the reaction as much as a lower one
            out["kill_after_reached_s"] = kill["t"] - hit["t"]
    return out


def health_summary(path, t_p, t_end):
    """What health.py saw: /metrics latency (all, and during the pressure), the gaps between the
    watchdog pings PID 1 took, the service's `low` count and refaults."""
    rows = []
    try:
        with open(path) as f:
            rows = [json.loads(x) for x in f if x.strip()]
    except (OSError, ValueError):
        return {"error": "no samples"}
    scr = [r for r in rows if r.get("kind") == "http"]
    unit = [r for r in rows if r.get("kind") == "unit"]
    during = [r for r in scr if t_p <= r["t"] <= t_end]
    lat = [r["metrics_s"] for r in scr if r.get("metrics_s") is not None]
    lat_p = [r["metrics_s"] for r in during if r.get("metrics_s") is not None]
    pings = sorted({r["wd"] for r in unit if r.get("wd")})
    gaps = [(b - a) / 1e6 for a, b in zip(pings, pings[1:])]
    ages = [r["loop_age"] for r in scr if r.get("loop_age") is not None]
    livez = [r["livez_s"] for r in scr if t_p <= r["t"] <= t_end and r.get("livez_s") is not None]
    cur = [r["cur"] for r in unit if r.get("cur")]
    lows = [r["low"] for r in unit if r.get("low") is not None]
    ref = [r["refault"] for r in unit if r.get("refault") is not None]
    start = next((r for r in rows if r.get("kind") == "start"), {})
    end = next((r for r in rows if r.get("kind") == "stop"), {})
    return {"mlockall": start.get("mlockall"), "sampler_locked": end.get("VmLck"), "sampler_rss": end.get("VmRSS"),
            "scrapes": len(scr), "scrapes_during": len(during),
            "failed": len(scr) - len(lat), "failed_during": len(during) - len(lat_p),
            "failures": [r.get("metrics_err") for r in scr if r.get("metrics_s") is None][:5],
            "max_s": max(lat, default=None), "max_during_s": max(lat_p, default=None),
            "p50_during_s": percentile(lat_p, 0.5) if lat_p else None,
            "over_2s": sum(1 for x in lat if x > 2.0),
            "pings": len(pings), "max_ping_gap_s": max(gaps, default=None),
            "max_loop_age_s": max(ages, default=None), "loop_ages": len(ages),
            "max_livez_during_s": max(livez, default=None),
            "pids": sorted({r["pid"] for r in unit if r.get("pid")}),
            "cur_min": min(cur, default=None), "cur_max": max(cur, default=None),
            "low_delta": (lows[-1] - lows[0]) if lows else None,
            "refault_delta": (ref[-1] - ref[0]) if ref else None,
            "sample_gap_max_s": max((b["t"] - a["t"] for a, b in zip(unit, unit[1:])), default=None),
            "unit_reads_failed": sum(1 for r in unit if not r.get("wd")),
            "slowest_unit_read_s": max((r.get("took_s") or 0 for r in unit), default=None),
            # the raw samples, thinned to about 300 of each kind
            "rows": {"unit": [[round(r["t"], 2), r.get("wd"), r.get("took_s"), r.get("cur"), r.get("low")]
                              for r in unit[:: max(1, len(unit) // 300)]],
                     "metrics": [[round(r["t"], 2), r.get("metrics_s"), r.get("loop_age"), r.get("livez_s")]
                                 for r in scr[:: max(1, len(scr) // 300)]]}}


def writes_now() -> float | None:
    try:
        return metric_sum(metrics(), "memqos_dbus_calls_total", method="SetUnitProperties")
    except OSError:
        return None


# What a run started, so that a run that fails leaves nothing behind for the next (cleanup).
LEFT = {"procs": [], "slices": []}


async def cleanup(bus):
    for p in LEFT["procs"]:
        if p.poll() is None:
            p.kill()
    if LEFT["slices"]:
        await bus.stop_units(LEFT["slices"])
        await bus.wait_gone("kubepods-*pod*.slice", 120)
    LEFT["procs"].clear()
    LEFT["slices"].clear()


async def one_run(bus, cfg, pressure):
    label = f"{cfg['name']} / {pressure}"
    say(f"=== run {label}")
    shutil.rmtree(CTL, ignore_errors=True)
    os.makedirs(CTL)
    pods = the_pods(pressure)
    nb = "BN" if pressure in ("burst", "price") else "BE"  # the neighbour's pod
    swap_total = OUT["swap_total"][cfg["name"]]
    write_pods(pods.values())
    drop_caches()
    units, procs = {}, {}
    # the protected pods and the idle one
    spec = {"G": dict(anon=P["g_anon_mib"], file=FILES["G"][0]), "B": dict(anon=P["b_anon_mib"], file=FILES["B"][0]),
            "B2": dict(anon=P["b2_anon_mib"], file=None)}
    if pressure == "price":
        # the lever's price: the others' requests are there, their pages are not (an idle node)
        spec = {k: dict(anon=0, file=None) for k in spec}
    reqs = {"G": G_REQ, "B": B_REQ, "B2": B2_REQ - (BN_REQ if nb == "BN" else 0)}
    for k, s in spec.items():
        pod = pods[k]
        qos = pod["status"]["qosClass"]
        sl = pod_slice(pod["metadata"]["uid"], qos)
        extra = {"MemoryMax": G_REQ * MIB} if qos == "Guaranteed" else {}
        await start_slice(bus, sl, **extra)
        if swap_total:  # the runtime's MemorySwapMax on the container (runc: memory.swap.max)
            extra = dict(extra, MemorySwapMax=limited_swap(qos, reqs[k], swap_total))
        args = [PY, WS, "--ctl", CTL, "--name", k, "--anon", str(s["anon"]),
                "--oom-score-adj", str(oom_adj(qos, reqs[k] * MIB))]
        if s["file"]:
            args += ["--file", s["file"]]
        procs[k] = spawn(args)
        LEFT["procs"].append(procs[k])
        scope = await start_scope(bus, sl, cid_of(pod), [procs[k].pid], **extra)
        if cfg.get("standin"):  # the kubelet at its defaults, through the runtime, as it creates the container
            await bus.set_props([(scope, ZEROS)])
        units[k] = {"slice": sl, "scope": scope}
        LEFT["slices"].append(sl)
    neighbour = pods[nb]
    units[nb] = {"slice": pod_slice(neighbour["metadata"]["uid"], neighbour["status"]["qosClass"]),
                 "scope": f"cri-containerd-{cid_of(neighbour)}.scope"}
    await start_slice(bus, units[nb]["slice"])
    LEFT["slices"].append(units[nb]["slice"])
    run = {"config": cfg["name"], "pressure": pressure, "label": label}
    if cfg["daemon"]:
        if cfg.get("standin"):  # it restarts with the pods there: its start's zeros over ours
            counts0 = kubelet_counts()
            await standin_start(bus)
        # the neighbour's scope does not exist yet: wait for the protected ones
        nb_units = units.pop(nb)
        run["converged"] = await converge(units)
        if cfg.get("standin"):
            run["upper_converged"] = all([await converge_slice("kubepods.slice", "MemoryMin", "min"),
                                          await converge_slice("kubepods-burstable.slice", "MemoryLow", "low")])
            run["kubelet_counts_start"] = counts0
            run["kubelet_counts_converged"] = kubelet_counts()
        units[nb] = nb_units
        if "lever" in cfg and nb == "BN":
            # the lever's MemoryHigh on the Burstable neighbour's pod slice, before it allocates
            run["nb_high_converged"] = await converge_slice(units[nb]["slice"], "MemoryHigh", "high")
        # from here on the daemon should write nothing unless the pressure asks it to (the
        # ceiling stepping down); its health is sampled by a process whose memory is locked
        t_conv = now()
        run["daemon_before"] = unit_show("MainPID", "NRestarts", "MemoryMin", "MemoryLow", "OOMScoreAdjust",
                                         "WatchdogUSec")
        run["service_before"] = service_memory()
        writes0 = writes_now()
        health_out = os.path.join(CTL, "health.jsonl")
        health = subprocess.Popen([PY, HEALTH, "--out", health_out, "--interval", str(P["health_interval_s"])],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        LEFT["procs"].append(health)
    run["layout"] = protection_layout(units)
    # fill the working sets
    t0 = now()
    open(os.path.join(CTL, "go"), "w").close()
    deadline = now() + 300
    while now() < deadline and not all(os.path.exists(os.path.join(CTL, k + ".ready")) for k in spec):
        await asyncio.sleep(0.2)
    run["fill_s"] = now() - t0
    await asyncio.sleep(2)
    before = {k: stat_mib(units[k]["slice"]) for k in ("G", "B", "B2")}
    ev0 = {k: events(units[k]["slice"]) for k in ("G", "B", "B2", nb)}
    kmsg0 = len(kmsg_lines())
    free0 = meminfo_kib()
    pid = daemon_pid() if cfg["daemon"] else 0
    cpu0 = cpu_seconds(pid) if pid else None
    samples, stop_sampling = [], asyncio.Event()
    sampler = asyncio.create_task(sample(samples, units, stop_sampling, nb))
    # the neighbour
    hog_json = os.path.join(CTL, nb + ".json")
    stream = ["bash", "-c", f"while [ ! -e {CTL}/go2 ]; do sleep 0.05; done; "
                            f"for i in $(seq {P['stream_passes']}); do cat {BIG} > /dev/null; done"]
    hog_procs = []
    if pressure in ("file", "mix"):
        hog_procs.append(spawn(stream))
    if pressure in ("anon", "mix", "burst", "price"):
        target = P["mix_anon_mib"] if pressure == "mix" else P["hog_anon_mib"]
        hold = 3600 if pressure == "mix" else 3
        adj = 1000 if nb == "BE" else oom_adj("Burstable", BN_REQ * MIB)
        hog_procs.append(spawn([PY, WS, "--ctl", CTL, "--name", nb, "--hog-anon", str(target), "--hold", str(hold),
                                "--oom-score-adj", str(adj), "--go", "go2"]))
    LEFT["procs"] += hog_procs
    if hog_procs:
        nb_extra = {}
        if swap_total:
            nb_extra["MemorySwapMax"] = limited_swap(neighbour["status"]["qosClass"], BN_REQ if nb == "BN" else 0,
                                                     swap_total)
        await start_scope(bus, units[nb]["slice"], cid_of(neighbour), [p.pid for p in hog_procs], **nb_extra)
    t_p = now()
    open(os.path.join(CTL, "go2"), "w").close()
    timeout = P["price_timeout_s"] if pressure == "price" else \
        cfg.get("timeouts", {}).get(pressure, P["pressure_timeout_s"])
    if pressure == "none":
        await asyncio.sleep(P["idle_s"])  # no neighbour: does anything act?
    elif pressure == "mix":
        # the allocator holds its memory until the stream is done
        deadline = now() + timeout
        while now() < deadline and hog_procs[0].poll() is None:
            await asyncio.sleep(0.2)
        for p in hog_procs[1:]:
            if p.poll() is None:
                p.kill()
    else:
        deadline = now() + timeout
        while now() < deadline and any(p.poll() is None for p in hog_procs):
            await asyncio.sleep(0.2)
    t_end = now()
    run["pressure_s"] = t_end - t_p
    run["timed_out"] = any(p.poll() is None for p in hog_procs)
    stop_sampling.set()
    await sampler
    if cpu0 is not None:
        try:
            run["daemon_cpu_s"] = cpu_seconds(pid) - cpu0
        except OSError:  # the daemon was restarted meanwhile (its watchdog, under memory pressure)
            run["daemon_restarted"] = True
    run["samples"] = samples[:: max(1, len(samples) // 300)]
    run["hog_exit"] = [p.poll() for p in hog_procs]
    try:
        run["hog"] = json.load(open(hog_json))
    except (OSError, ValueError):
        run["hog"] = None
    for p in hog_procs:
        if p.poll() is None:
            p.kill()
    await asyncio.sleep(1)
    after = {k: stat_mib(units[k]["slice"]) for k in ("G", "B", "B2")}
    ev1 = {k: events(units[k]["slice"]) for k in ("G", "B", "B2", nb)}
    kills = []
    for t, line in kmsg_lines()[kmsg0:]:
        m = OOM_RE.search(line)
        if m:
            kills.append({"pod": pod_of(m.group(1), units), "task": m.group(2), "pid": int(m.group(3)),
                          "t": t, "after_s": round(t - t_p, 3)})
    run["oom_kills"] = kills
    run["ceiling"] = ceiling_reached(samples, t_p, kills)
    run["alive"] = {k: procs[k].poll() is None for k in spec}
    nbd = slice_dir(units[nb]["slice"])
    run["neighbour"] = {"memory_high": read_int(os.path.join(nbd, "memory.high")),
                        "peak": read_int(os.path.join(nbd, "memory.peak")),
                        "swap_peak": read_int(os.path.join(nbd, "memory.swap.peak")),
                        "swap_max": read_int(os.path.join(nbd, units[nb]["scope"], "memory.swap.max")),
                        "current": read_int(os.path.join(nbd, "memory.current"))}
    if pressure == "price":
        # how far the lone pod grew (its slice's memory.peak) and how long it took to come within
        # 5 % of that (the samples' memory.current; the kernel's peak is the upper bound)
        cur = [(r["t"] - t_p, r["nb_cur"]) for r in samples if r.get("nb_cur") is not None]
        top = max((c for _, c in cur), default=0)
        run["price"] = {"peak": run["neighbour"]["peak"], "allocatable": ALLOCATABLE, "sampled_max": top,
                        "to_95_s": next((t for t, c in cur if c >= 0.95 * top), None),
                        "curve": [[round(t, 2), c] for t, c in cur[:: max(1, len(cur) // 120)]],
                        "hog": run.get("hog")}
    if swap_total:
        run["swap"] = {"total": swap_total, "used_kib": meminfo_kib().get("SwapTotal", 0) - meminfo_kib().get("SwapFree", 0),
                       "swap_max": {k: read_int(os.path.join(slice_dir(units[k]["slice"]), units[k]["scope"],
                                                             "memory.swap.max")) for k in spec}}
    if cfg["daemon"]:
        health.terminate()
        try:
            health.wait(10)
        except subprocess.TimeoutExpired:
            health.kill()
        writes1 = writes_now()
        if cfg.get("standin"):
            run["kubelet_counts_end"] = kubelet_counts()
        run["daemon"] = {
            "health": health_summary(health_out, t_p, t_end),
            "after": unit_show("MainPID", "NRestarts"),
            "service_after": service_memory(),
            "watchdog_kills": watchdog_kills(t_conv - 1),
            "writes_after_convergence": (None if writes0 is None or writes1 is None else writes1 - writes0),
            "since_convergence_s": round(now() - t_conv, 1),
        }
        d = run["daemon"]
        d["restarted"] = d["after"].get("MainPID") != run["daemon_before"].get("MainPID") or \
            d["after"].get("NRestarts") != run["daemon_before"].get("NRestarts")
        d["low_events"] = d["service_after"]["events"].get("low", 0) - run["service_before"]["events"].get("low", 0)
    # re-use what survived
    open(os.path.join(CTL, "reuse"), "w").close()
    deadline = now() + 120
    while now() < deadline and not all(os.path.exists(os.path.join(CTL, k + ".json")) or not run["alive"][k]
                                       for k in spec):
        await asyncio.sleep(0.2)
    reuse = {}
    for k in spec:
        try:
            reuse[k] = json.load(open(os.path.join(CTL, k + ".json")))
        except (OSError, ValueError):
            reuse[k] = None
    run["pods"] = {k: {"before": before[k], "after": after[k],
                       "events": {e: ev1[k].get(e, 0) - ev0[k].get(e, 0) for e in ("low", "high", "max", "oom", "oom_kill")},
                       "alive": run["alive"][k], "reuse": reuse[k], "request_mib": reqs[k]} for k in spec}
    run["pods"][nb] = {"events": {e: ev1[nb].get(e, 0) - ev0[nb].get(e, 0) for e in ("low", "max", "oom", "oom_kill")}}
    run["meminfo_before_kib"] = {k: free0.get(k) for k in ("MemFree", "Cached", "MemAvailable")}
    run["stamp"] = stamp(label)
    # tear down
    await cleanup(bus)
    b = run["pods"]["B"]
    say(f"    {label}: B file {b['before']['file']:.0f} -> {b['after']['file']:.0f} MiB, G anon "
        f"{run['pods']['G']['before']['anon']:.0f} -> {run['pods']['G']['after']['anon']:.0f} MiB, kills {kills}"
        + (f", daemon {run['daemon']['health'].get('max_during_s')} s max /metrics, loop age "
           f"{run['daemon']['health'].get('max_loop_age_s')} s, ping gap "
           f"{run['daemon']['health'].get('max_ping_gap_s')} s, restarted {run['daemon']['restarted']}, "
           f"writes {run['daemon']['writes_after_convergence']}" if "daemon" in run else ""))
    return run


async def footprint(bus):
    """The daemon's own memory, what its MemoryMin and MemoryLow are sized from: its cgroup's
    memory.current and memory.stat with no pod and with P["footprint_pods"] running pods (one
    container each, a `sleep` in its scope), then what it reads back in over a minute of work
    (resyncs, pod polls, a scrape every 15 s) after memory.reclaim emptied its cgroup of every
    file page it could: its working set."""
    say("=== the daemon's footprint")
    write_config(memoryReservationPolicy="TieredReservation", hierarchy="effective")
    write_pods([])
    systemctl("restart", DAEMON)
    res = {}

    async def settle(seconds):
        end = now() + seconds
        while now() < end:
            try:
                metrics()
            except OSError:
                pass
            await asyncio.sleep(min(15, max(0.0, end - now())))

    def measure(what):
        pid = daemon_pid()
        res[what] = {"service": service_memory(), "proc": proc_status(pid) if pid else None, "t": now()}
        s = res[what]["service"]
        say(f"    {what}: memory.current {s['current'] / MIB:.1f} MiB (anon {(s['stat']['anon'] or 0) / MIB:.1f},"
            f" file {(s['stat']['file'] or 0) / MIB:.1f}, kernel {(s['stat']['kernel'] or 0) / MIB:.1f})")

    await settle(P["footprint_settle_s"])
    measure("no_pods")
    n = P["footprint_pods"]
    pods = [make_pod(f"fp-{i}", [{"name": "app", "requests": {"memory": "16Mi"}}], namespace="footprint")
            for i in range(n)]
    slices = [pod_slice(p["metadata"]["uid"]) for p in pods]
    await bus.start_slices(slices)
    procs, calls = [], []
    for p, sl in zip(pods, slices):
        proc = subprocess.Popen(["sleep", "infinity"], start_new_session=True)
        procs.append(proc)
        props = {"Description": f"libcontainer container {cid_of(p)}", "Slice": sl, "Delegate": True,
                 "PIDs": [proc.pid], "DefaultDependencies": False, "MemoryAccounting": True}
        calls.append(("StartTransientUnit", "ssa(sv)a(sa(sv))", [f"cri-containerd-{cid_of(p)}.scope", "fail",
                                                                  v_props(props), []]))
    await bus.many(calls)
    write_pods(pods)
    deadline = now() + 300
    while now() < deadline:
        try:
            if metric_sum(metrics(), "memqos_pods", qos_class="Burstable") >= n:
                break
        except OSError:
            pass
        await asyncio.sleep(2)
    await settle(P["footprint_settle_s"])
    measure(f"pods_{n}")
    d = service_cgroup()
    t = now()
    try:
        with open(os.path.join(d, "memory.reclaim"), "w") as f:
            f.write(str(1 << 30))
    except OSError as e:  # EAGAIN: it could not reclaim all it was asked to, which is expected
        res["reclaim_error"] = str(e)
    res["reclaim_s"] = now() - t
    measure("after_reclaim")
    await settle(P["footprint_refault_s"])
    measure("working_set")
    res["pods"] = n
    OUT["footprint"] = res
    dump()
    for p in procs:
        p.kill()
    await bus.stop_units(slices)
    await bus.wait_gone("kubepods-*pod*.slice", 180)
    write_pods([])


async def lowering(bus):
    """PID 1's SetUnitProperties when MemoryMax goes down on kubepods-besteffort.slice while a
    BestEffort pod holds page cache there (issue 25: the ceiling never lowers below usage in one
    write). With the daemon stopped (nobody else writes the slice): a pod holds 64 MiB anonymous
    and a 256 MiB file in the page cache, then MemoryMax goes to its usage (the ceiling's step),
    then 128 MiB below it (PID 1 reclaims the difference before the call returns), then below
    its anonymous memory (PID 1 reclaims all it can, then the kernel OOM-kills in the slice)."""
    say("=== lowering MemoryMax under usage")
    systemctl("stop", DAEMON)
    write_pods([])
    shutil.rmtree(CTL, ignore_errors=True)
    os.makedirs(CTL)
    drop_caches()
    pod = make_pod("besteffort-cache", [{"name": "c"}], namespace="bench")
    sl = pod_slice(pod["metadata"]["uid"], "BestEffort")
    await start_slice(bus, sl)
    LEFT["slices"].append(sl)
    proc = spawn([PY, WS, "--ctl", CTL, "--name", "L", "--anon", "64", "--file", FILES["B"][0],
                  "--oom-score-adj", "1000"])
    LEFT["procs"].append(proc)
    await start_scope(bus, sl, cid_of(pod), [proc.pid])
    open(os.path.join(CTL, "go"), "w").close()
    deadline = now() + 120
    while now() < deadline and not os.path.exists(os.path.join(CTL, "L.ready")):
        await asyncio.sleep(0.2)
    qos = slice_dir(BE_QOS)
    res = {"steps": []}

    async def lower(what, value):
        ev0 = read_kv(os.path.join(qos, "memory.events"))
        before = read_int(os.path.join(qos, "memory.current"))
        t = now()
        try:
            await bus.set_props([(BE_QOS, {"MemoryMax": value})])
            err = None
        except RuntimeError as e:
            err = str(e)[:200]
        took = now() - t
        ev1 = read_kv(os.path.join(qos, "memory.events"))
        step = {"what": what, "memory_max": value, "usage_before": before, "seconds": took, "error": err,
                "usage_after": read_int(os.path.join(qos, "memory.current")),
                "oom_kill": ev1.get("oom_kill", 0) - ev0.get("oom_kill", 0), "max": ev1.get("max", 0) - ev0.get("max", 0)}
        res["steps"].append(step)
        say(f"    {what}: MemoryMax {value // MIB} MiB over {(before or 0) // MIB} MiB used: {took * 1e3:.0f} ms, "
            f"now {(step['usage_after'] or 0) // MIB} MiB, oom_kill +{step['oom_kill']}")

    page = os.sysconf("SC_PAGE_SIZE")
    usage = read_int(os.path.join(qos, "memory.current"))
    await lower("to the usage (the ceiling's step)", -(-usage // page) * page)
    usage = read_int(os.path.join(qos, "memory.current"))
    await lower("128 MiB below the usage", usage - 128 * MIB)
    await lower("below its anonymous memory (32 MiB)", 32 * MIB)
    res["alive_after"] = proc.poll() is None
    await bus.set_props([(BE_QOS, {"MemoryMax": UINT64_MAX})])
    res["stamp"] = stamp("lowering")
    OUT["lowering"] = res
    dump()
    await cleanup(bus)
    systemctl("start", DAEMON)


async def high_test(bus):
    """A Burstable container with request 64Mi and limit 256Mi allocates past its MemoryHigh."""
    say("=== memory.high throttling")
    write_config(memoryReservationPolicy="TieredReservation", metrics={"perUnit": "true"})
    systemctl("restart", DAEMON)
    shutil.rmtree(CTL, ignore_errors=True)
    os.makedirs(CTL)
    req, lim = P["high_request_mib"], P["high_limit_mib"]
    pod = make_pod("throttled", [{"name": "app", "requests": {"memory": f"{req}Mi"}, "limits": {"memory": f"{lim}Mi"}}],
                   namespace="bench")
    write_pods([pod])
    sl = pod_slice(pod["metadata"]["uid"])
    await start_slice(bus, sl, MemoryMax=lim * MIB)
    # the expected MemoryHigh (KEP-2570): request + 0.9 * (limit - request), rounded down to a page
    high = (req * MIB + 9 * (lim - req) * MIB // 10) // 4096 * 4096
    target = int(high / MIB) + P["high_over_mib"]
    proc = spawn([PY, WS, "--ctl", CTL, "--name", "H", "--high-test", str(target)])
    scope = await start_scope(bus, sl, cid_of(pod), [proc.pid], MemoryMax=lim * MIB)
    d = os.path.join(slice_dir(sl), scope)
    t = now()
    while now() < t + 60 and read_int(os.path.join(d, "memory.high")) != high:
        await asyncio.sleep(0.5)
    res = {"request_mib": req, "limit_mib": lim, "memory_high": read_int(os.path.join(d, "memory.high")),
           "expected_high": high, "target_mib": target}
    ev0 = read_kv(os.path.join(d, "memory.events"))
    open(os.path.join(CTL, "go"), "w").close()
    t0 = now()
    out = os.path.join(CTL, "H.json")
    done = None
    while now() < t0 + P["high_timeout_s"]:
        try:
            done = json.load(open(out))
            if done.get("done"):
                break
        except (OSError, ValueError):
            pass
        if proc.poll() is not None:
            break
        await asyncio.sleep(0.5)
    res["seconds"] = now() - t0
    res["result"] = done
    res["alive"] = proc.poll() is None
    res["memory_current"] = read_int(os.path.join(d, "memory.current"))
    ev1 = read_kv(os.path.join(d, "memory.events"))
    res["events"] = {k: ev1.get(k, 0) - ev0.get(k, 0) for k in ("high", "max", "oom", "oom_kill")}
    try:
        res["pressure"] = open(os.path.join(d, "memory.pressure")).read()
    except OSError:
        pass
    # memqos_container_memory_high_events_total (metrics.perUnit) is read at the scrape; the pod's
    # own count (every config) counts its container's too.
    metric, pod_metric, kernel_high = None, None, ev1.get("high", 0)
    deadline = now() + 45
    while now() < deadline:
        try:
            m = metrics()
            metric = metric_sum(m, "memqos_container_memory_high_events_total", pod="throttled", container="app")
            pod_metric = metric_sum(m, "memqos_pod_memory_events_total", pod="throttled", event="high")
        except OSError:
            metric = None
        if metric and metric >= kernel_high:
            break
        await asyncio.sleep(2)
    res["metric_high_events"] = metric
    res["metric_pod_high_events"] = pod_metric
    res["kernel_high_events_total"] = kernel_high
    res["stamp"] = stamp("memory.high test")
    proc.kill()
    await bus.stop_units([sl])
    OUT["high"] = res
    dump()
    steps = (done or {}).get("steps_s", [])
    check(bool(done and done.get("done")), f"memory.high: allocated {len(steps)}/{target} MiB past high"
          f" {high // MIB} MiB in {res['seconds']:.1f} s")
    check(bool(metric) and metric > 0, f"memory.high events in our metric: {metric} (kernel {kernel_high})")


async def main():
    OUT["guest"] = {"kernel": os.uname().release, "systemd": systemctl("--version").stdout.split("\n")[0],
                    "capacity": CAPACITY, "allocatable": ALLOCATABLE, "system_reserved_mib": SYSTEM_RESERVED_MIB,
                    "cpus": os.cpu_count(),
                    "swap": meminfo_kib().get("SwapTotal"),
                    "requests_mib": {"G": G_REQ, "B": B_REQ, "B2": B2_REQ}}
    OUT["start_stamp"] = stamp("start")
    make_files()
    bus = await Bus().connect()
    await ensure_qos_slices(bus)
    kubelet_unit()
    write_pods([])
    systemctl("start", "kubelet.service")
    if P.get("footprint"):
        await footprint(bus)
    for cfg in P["configs"]:
        try:
            await configure(bus, cfg)
        except Exception as e:  # a swap file that would not switch on: that configuration's runs only
            say(f"configuration {cfg['name']} failed: {e!r}")
            OUT["runs"].append({"config": cfg["name"], "pressure": "-", "error": f"configure: {e!r}"})
            continue
        for pressure in [x for x in P["pressures"] if x in cfg.get("pressures", P["default_pressures"])]:
            try:
                OUT["runs"].append(await one_run(bus, cfg, pressure))
            except Exception as e:  # keep the other runs
                say(f"run {cfg['name']} / {pressure} failed: {e!r}")
                await cleanup(bus)
                OUT["runs"].append({"config": cfg["name"], "pressure": pressure, "error": repr(e)})
            dump()
    if P.get("lowering"):
        await lowering(bus)
    if P.get("high_test", True):
        await high_test(bus)
    OUT["finished"] = time.time()
    OUT["daemon_boot"] = {"watchdog_kills": watchdog_kills(0.0), **unit_show("NRestarts", "MemoryMin", "MemoryLow",
                                                                                 "OOMScoreAdjust", "WatchdogUSec",
                                                                                 "ControlGroup")}
    dump()
    check(all("error" not in r for r in OUT["runs"]), f"{len(OUT['runs'])} protection runs completed")


asyncio.run(main())
