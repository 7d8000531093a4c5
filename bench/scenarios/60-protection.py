#!/usr/bin/python3
"""Guest side of bench/protection.py: does the protection protect? Writes protection.json.

Per run (one configuration x one kind of pressure), new pods:
  G  Guaranteed, request = limit; holds anonymous memory and page cache
  B  Burstable, request, no limit; holds page cache and some anonymous memory
  B2 Burstable whose request is mostly unused, so that the requests add up to ~90 % of allocatable
  BE BestEffort neighbour that applies the pressure: streams a file, allocates anonymous memory
     until the OOM killer acts, or both at once ("mix")
Processes get the kubelet's oom_score_adj for their QoS class; Guaranteed slices and scopes their
MemoryMax (as the kubelet and runc set it). Measured: memory.stat file/anon of each pod before and
after, memory.events low/oom_kill, who the OOM killer chose (kernel log), the time to re-touch
the anonymous memory and re-read the file afterwards. Then the memory.high test: a Burstable
container allocating past its MemoryHigh. Parameters: payload/bench/params.json."""
# e2e-timeout: 1500
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
ALLOCATABLE = CAPACITY - 100 * MIB  # the default evictionHard memory.available
G_REQ, B_REQ = P["g_request_mib"], P["b_request_mib"]
B2_REQ = max(32, int(P["requests_fraction"] * ALLOCATABLE / MIB) - G_REQ - B_REQ)
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


def kmsg_lines():
    p = subprocess.run(["journalctl", "-k", "-b", "-o", "cat", "--no-pager"], capture_output=True, text=True)
    return p.stdout.splitlines()


OOM_RE = re.compile(r"oom-kill:.*task_memcg=([^,]+),task=([^,]+),pid=(\d+)")


def pod_of(memcg, units):
    for label, u in units.items():
        if u["slice"] in memcg:
            return label
    return memcg.rsplit("/", 1)[-1]


def stat_mib(unit):
    s = read_kv(os.path.join(slice_dir(unit), "memory.stat"))
    return {"file": s.get("file", 0) / MIB, "anon": s.get("anon", 0) / MIB}


def events(unit):
    return read_kv(os.path.join(slice_dir(unit), "memory.events"))


def protection_layout(units):
    out = {}
    for name in ["kubepods.slice", "kubepods-burstable.slice", "kubepods-besteffort.slice"] + \
            [units[k]["slice"] for k in ("G", "B", "B2", "BE")]:
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


def the_pods():
    g = make_pod("guaranteed", [{"name": "app", "requests": {"memory": f"{G_REQ}Mi", "cpu": "100m"},
                                 "limits": {"memory": f"{G_REQ}Mi", "cpu": "100m"}}], namespace="bench",
                 qos="Guaranteed")
    b = make_pod("burstable", [{"name": "app", "requests": {"memory": f"{B_REQ}Mi"}}], namespace="bench")
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


async def configure(bus, cfg):
    if cfg["daemon"]:
        extra = {"pressureGuard": {"enabled": "true", **cfg["guard"]}} if "guard" in cfg else {}
        write_config(memoryReservationPolicy=cfg["policy"], hierarchy=cfg["hierarchy"], **extra)
        systemctl("restart", DAEMON)
    else:
        systemctl("stop", DAEMON)
        await bus.set_props([(u, {"MemoryMin": 0, "MemoryLow": 0}) for u in
                             ("kubepods.slice", "kubepods-burstable.slice", "kubepods-besteffort.slice")])


BE_QOS = "kubepods-besteffort.slice"


async def sample(samples, units, stop):
    """Every 0.1 s: the B pod slice's and the Burstable QoS slice's `low` count, the BestEffort QoS
    slice's memory.high and memory.current (what the guard reads and writes)."""
    paths = {"b_low": (os.path.join(slice_dir(units["B"]["slice"]), "memory.events"), "low"),
             "q_low": (os.path.join(slice_dir("kubepods-burstable.slice"), "memory.events"), "low")}
    be = slice_dir(BE_QOS)
    while not stop.is_set():
        row = {"t": now()}
        for k, (path, key) in paths.items():
            row[k] = read_kv(path).get(key, 0)
        row["be_high"] = read_int(os.path.join(be, "memory.high"))
        row["be_cur"] = read_int(os.path.join(be, "memory.current"))
        samples.append(row)
        try:
            await asyncio.wait_for(stop.wait(), 0.1)
        except asyncio.TimeoutError:
            pass


def guard_actions():
    try:
        m = metrics()
    except OSError:
        return {}
    return {a: metric_sum(m, "memqos_guard_actions_total", action=a) for a in ("lower", "raise", "clear")}


def reaction(samples, t_p):
    """From the samples: the first `low` event of B after the pressure began, the first time the
    BestEffort slice's memory.high was below max, and what BestEffort held then and at the end."""
    base = samples[0]["b_low"] if samples else 0
    breach = next((r["t"] for r in samples if r["b_low"] > base), None)
    act = next((r for r in samples if r["be_high"] is not None and r["be_high"] != UINT64_MAX), None)
    out = {"breach_s": None if breach is None else breach - t_p, "action_s": None if act is None else act["t"] - t_p,
           "min_be_high": min((r["be_high"] for r in samples if r["be_high"] is not None), default=None)}
    if act is not None and samples:
        first, last = samples[0], samples[-1]
        out["be_at_action_mib"] = act["be_cur"] / MIB
        out["be_end_mib"] = last["be_cur"] / MIB
        out["be_rate_before_mib_s"] = (act["be_cur"] - first["be_cur"]) / MIB / max(act["t"] - first["t"], 1e-3)
        out["be_rate_after_mib_s"] = (last["be_cur"] - act["be_cur"]) / MIB / max(last["t"] - act["t"], 1e-3)
        out["b_low_at_action"] = act["b_low"] - base
    return out


async def one_run(bus, cfg, pressure):
    label = f"{cfg['name']} / {pressure}"
    say(f"=== run {label}")
    shutil.rmtree(CTL, ignore_errors=True)
    os.makedirs(CTL)
    pods = the_pods()
    write_pods(pods.values())
    drop_caches()
    units, procs = {}, {}
    # the protected pods and the idle one
    spec = {"G": dict(anon=P["g_anon_mib"], file=FILES["G"][0]), "B": dict(anon=P["b_anon_mib"], file=FILES["B"][0]),
            "B2": dict(anon=P["b2_anon_mib"], file=None)}
    reqs = {"G": G_REQ, "B": B_REQ, "B2": B2_REQ}
    for k, s in spec.items():
        pod = pods[k]
        qos = pod["status"]["qosClass"]
        sl = pod_slice(pod["metadata"]["uid"], qos)
        extra = {"MemoryMax": G_REQ * MIB} if qos == "Guaranteed" else {}
        await start_slice(bus, sl, **extra)
        args = [PY, WS, "--ctl", CTL, "--name", k, "--anon", str(s["anon"]),
                "--oom-score-adj", str(oom_adj(qos, reqs[k] * MIB))]
        if s["file"]:
            args += ["--file", s["file"]]
        procs[k] = spawn(args)
        scope = await start_scope(bus, sl, cid_of(pod), [procs[k].pid], **extra)
        units[k] = {"slice": sl, "scope": scope}
    be = pods["BE"]
    units["BE"] = {"slice": pod_slice(be["metadata"]["uid"], "BestEffort"), "scope": f"cri-containerd-{cid_of(be)}.scope"}
    await start_slice(bus, units["BE"]["slice"])
    run = {"config": cfg["name"], "pressure": pressure, "label": label}
    if cfg["daemon"]:
        # the neighbour's scope does not exist yet: wait for the protected ones
        be_units = units.pop("BE")
        run["converged"] = await converge(units)
        units["BE"] = be_units
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
    ev0 = {k: events(units[k]["slice"]) for k in ("G", "B", "B2", "BE")}
    kmsg0 = len(kmsg_lines())
    free0 = meminfo_kib()
    guard0 = guard_actions() if cfg["daemon"] else {}
    pid = daemon_pid() if cfg["daemon"] else 0
    cpu0 = cpu_seconds(pid) if pid else None
    samples, stop_sampling = [], asyncio.Event()
    sampler = asyncio.create_task(sample(samples, units, stop_sampling))
    # the neighbour
    hog_json = os.path.join(CTL, "BE.json")
    stream = ["bash", "-c", f"while [ ! -e {CTL}/go2 ]; do sleep 0.05; done; "
                            f"for i in $(seq {P['stream_passes']}); do cat {BIG} > /dev/null; done"]
    hog_procs = []
    if pressure in ("file", "mix"):
        hog_procs.append(spawn(stream))
    if pressure in ("anon", "mix"):
        target = P["hog_anon_mib"] if pressure == "anon" else P["mix_anon_mib"]
        hold = 3 if pressure == "anon" else 3600
        hog_procs.append(spawn([PY, WS, "--ctl", CTL, "--name", "BE", "--hog-anon", str(target), "--hold", str(hold),
                                "--oom-score-adj", "1000", "--go", "go2"]))
    if hog_procs:
        await start_scope(bus, units["BE"]["slice"], cid_of(be), [p.pid for p in hog_procs])
    t_p = now()
    open(os.path.join(CTL, "go2"), "w").close()
    timeout = cfg.get("timeouts", {}).get(pressure, P["pressure_timeout_s"])
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
    run["pressure_s"] = now() - t_p
    run["timed_out"] = any(p.poll() is None for p in hog_procs)
    stop_sampling.set()
    await sampler
    if cpu0 is not None:
        try:
            run["daemon_cpu_s"] = cpu_seconds(pid) - cpu0
        except OSError:  # the daemon was restarted meanwhile (its watchdog, under memory pressure)
            run["daemon_restarted"] = True
    if cfg["daemon"]:
        g1 = guard_actions()
        run["guard_actions"] = {a: g1.get(a, 0) - guard0.get(a, 0) for a in g1}
        run["guard_log"] = [(round(t - t_p, 3), m) for t, m in journal_since(DAEMON, t_p - 1)
                            if m.startswith("pressure guard:")][:40]
    run["reaction"] = reaction(samples, t_p)
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
    ev1 = {k: events(units[k]["slice"]) for k in ("G", "B", "B2", "BE")}
    kills = []
    for line in kmsg_lines()[kmsg0:]:
        m = OOM_RE.search(line)
        if m:
            kills.append({"pod": pod_of(m.group(1), units), "task": m.group(2), "pid": int(m.group(3))})
    run["oom_kills"] = kills
    run["alive"] = {k: procs[k].poll() is None for k in spec}
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
    run["pods"]["BE"] = {"events": {e: ev1["BE"].get(e, 0) - ev0["BE"].get(e, 0) for e in ("low", "oom", "oom_kill")}}
    run["meminfo_before_kib"] = {k: free0.get(k) for k in ("MemFree", "Cached", "MemAvailable")}
    run["stamp"] = stamp(label)
    # tear down
    for p in procs.values():
        if p.poll() is None:
            p.kill()
    await bus.stop_units([u["slice"] for u in units.values()])
    await bus.wait_gone("kubepods-*pod*.slice", 120)
    b = run["pods"]["B"]
    say(f"    {label}: B file {b['before']['file']:.0f} -> {b['after']['file']:.0f} MiB, G anon "
        f"{run['pods']['G']['before']['anon']:.0f} -> {run['pods']['G']['after']['anon']:.0f} MiB, kills {kills}")
    return run


async def high_test(bus):
    """A Burstable container with request 64Mi and limit 256Mi allocates past its MemoryHigh."""
    say("=== memory.high throttling")
    write_config(memoryReservationPolicy="TieredReservation")
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
    # the daemon reads memory.events every 15 s for memqos_container_memory_high_events_total
    metric, kernel_high = None, ev1.get("high", 0)
    deadline = now() + 45
    while now() < deadline:
        try:
            metric = metric_sum(metrics(), "memqos_container_memory_high_events_total", unit=scope)
        except OSError:
            metric = None
        if metric and metric >= kernel_high:
            break
        await asyncio.sleep(2)
    res["metric_high_events"] = metric
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
                    "capacity": CAPACITY, "allocatable": ALLOCATABLE, "cpus": os.cpu_count(),
                    "swap": meminfo_kib().get("SwapTotal"),
                    "requests_mib": {"G": G_REQ, "B": B_REQ, "B2": B2_REQ}}
    OUT["start_stamp"] = stamp("start")
    make_files()
    bus = await Bus().connect()
    await ensure_qos_slices(bus)
    kubelet_unit()
    write_pods([])
    systemctl("start", "kubelet.service")
    for cfg in P["configs"]:
        await configure(bus, cfg)
        for i, pressure in enumerate([x for x in P["pressures"] if x in cfg.get("pressures", P["default_pressures"])]):
            if "guard" in cfg and i:
                await configure(bus, cfg)  # a fresh guard for every run (the last one's may still be engaged)
            try:
                OUT["runs"].append(await one_run(bus, cfg, pressure))
            except Exception as e:  # keep the other runs
                say(f"run {cfg['name']} / {pressure} failed: {e!r}")
                OUT["runs"].append({"config": cfg["name"], "pressure": pressure, "error": repr(e)})
            dump()
    if P.get("high_test", True):
        await high_test(bus)
    OUT["finished"] = time.time()
    dump()
    check(all("error" not in r for r in OUT["runs"]), f"{len(OUT['runs'])} protection runs completed")


asyncio.run(main())
