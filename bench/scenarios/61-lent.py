#!/usr/bin/python3
"""Guest side of bench/lent.py (issue 35): how much protection BestEffort and over-request usage
receive under each layout, and what outside pressure takes first. Writes lent.json.

No daemon and no kubelet: the pods' cgroups are made as the kubelet and runc make them (transient
slices and scopes over D-Bus) and given, over D-Bus too (SetUnitProperties), the values the real
planner (`plan.plan`) plans for each layout (bench/guest/lentcase.py: the pods, the layouts). Per
run (one layout, memory_recursiveprot on or off):

  fill      caches dropped, then each pod's container reads its file: page cache charged to it
            (g 80 MiB of a 128 MiB request, b 80 of 256, o 96 of 32: beyond its request, be 192)
  predict   effective.py on the files as read (memory.current, memory.min, memory.low of
            kubepods.slice and everything under it; the root memcg is global reclaim's root): what
            each pod's container is protected for now and how much of it is lent, and the floor a
            partly protected one is reclaimed down to (lentcase.floor)
  press     outside kubepods, a transient service in system.slice (OOMScoreAdjust=1000) allocates
            anonymous memory 4 MiB at a time (no swap: only page cache can give) until
            kubepods.slice's memory.events `low` rises (a protection breached), every pod is at its
            floor (+ 8 MiB) and 16 MiB more went, the node thrashes (PSI and file refaults), 120 s
            passed, or the OOM killer ends it (bench/guest/press.py says why each)
  measure   memory.stat file, memory.events low and oom_kill of every pod before and after; how
            the presser ended; lentcase.verdict per pod (a CHECK line each)
The runs come in params' order (lentcase.run_order: what matters first); the cgroup2 mount is
remounted without memory_recursiveprot (node-wide: the lever measured in step 3) for the runs
that ask, and back with it at the end. No run starts once `budget_s` (20 min) has gone."""
# e2e-timeout: 1800
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.environ["MEMQOS_E2E_PAYLOAD"], "bench"))
from mqbench import save, stamp  # noqa: E402
from memqos_e2e import (UINT64_MAX, check, create_container_scope, create_pod_slice, ensure_qos_slices,  # noqa: E402
                        log, need_deb, set_unit_properties, stop_unit, unit_exists, wait_for)

need_deb()
try:
    import memqos_systemd  # noqa: F401  (the .deb's)
except ImportError:
    sys.path.insert(0, os.environ["MEMQOS_E2E_SRC"])  # the payload's copy of the source
import lentcase  # noqa: E402  (bench/guest, on the path with mqbench)
from lentcase import MIB, PODS, UIDS  # noqa: E402
from memqos_systemd.effective import protection  # noqa: E402

CG = "/sys/fs/cgroup"
PAGE = os.sysconf("SC_PAGE_SIZE")
PRESS = os.path.join(os.environ["MEMQOS_E2E_PAYLOAD"], "bench", "press.py")
PARAMS = json.load(open(os.path.join(os.environ["MEMQOS_E2E_PAYLOAD"], "bench", "params.json")))
OUT = {"params": PARAMS, "runs": [], "started": time.time()}
with open("/proc/self/oom_score_adj", "w") as f:
    f.write("-900")  # the benchmark itself must survive the OOM killer


def mem_total() -> int:
    return int(open("/proc/meminfo").readline().split()[1]) * 1024


def recursiveprot() -> bool:
    with open("/proc/mounts") as f:
        return any(len(l.split()) > 3 and l.split()[2] == "cgroup2" and "memory_recursiveprot" in l.split()[3].split(",")
                   for l in f)


def remount(on: bool) -> bool:
    """With a source named, mount(8) replaces the superblock's flags rather than merging them with
    what fstab says (Tejun Heo, "cgroup: remove 'no' prefixed mount options", 2022, Linux 6.0)."""
    opts = "remount,nsdelegate" + (",memory_recursiveprot" if on else "")
    for source in ("cgroup2", "none"):
        p = subprocess.run(["mount", "-o", opts, source, CG], capture_output=True, text=True)
        if p.returncode:
            log(f"mount -o {opts} {source} {CG}: {p.stderr.strip()}")
        if recursiveprot() == on:
            return True
    return False


def drop_caches():
    subprocess.run(["sync"])
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def num(path):
    with open(path) as f:
        t = f.read().strip()
    return UINT64_MAX if t == "max" else int(t)


def kv(path, key):
    with open(path) as f:
        return next((int(l.split()[1]) for l in f if l.split()[0] == key), 0)


CAPACITY = mem_total()
FILES = {n: f"/var/tmp/lent-{n}.dat" for n in PODS}
CAP_MIB = CAPACITY // MIB


def make_files():
    for n, spec in PODS.items():
        if not os.path.exists(FILES[n]):
            subprocess.run(["dd", "if=/dev/zero", f"of={FILES[n]}", "bs=1M", f"count={spec[3]}", "status=none"],
                           check=True)
    subprocess.run(["sync"], check=True)


def dirs(units) -> dict:
    """unit -> its cgroup directory (the plan's parents are the cgroup tree's)."""
    by = {u.unit: u for u in units}
    out = {}

    def d(name):
        if name not in out:
            u = by[name]
            out[name] = os.path.join(d(u.parent) if u.parent else CG, name)
        return out[name]

    for u in units:
        d(u.unit)
    return out


def teardown():
    for n, uid in UIDS.items():
        name = lentcase.pods()[list(PODS).index(n)]
        slice_ = ("kubepods-" + {"Guaranteed": "", "Burstable": "burstable-", "BestEffort": "besteffort-"}[name.qos]
                  + "pod" + uid.replace("-", "_") + ".slice")
        if unit_exists(slice_):
            stop_unit(slice_)
    subprocess.run(["systemctl", "stop", "lent-press.service"], capture_output=True)
    subprocess.run(["systemctl", "reset-failed", "lent-press.service"], capture_output=True)
    for n in PODS:
        if os.path.exists(f"/run/lent-{n}.done"):
            os.remove(f"/run/lent-{n}.done")
    for p in ("/run/lent-go", "/run/lent-press.json"):
        if os.path.exists(p):
            os.remove(p)


def counters(where: dict) -> dict:
    return {n: {"file": kv(f"{d}/memory.stat", "file"), "current": num(f"{d}/memory.current"),
                "low": kv(f"{d}/memory.events", "low"), "oom_kill": kv(f"{d}/memory.events", "oom_kill")}
            for n, d in where.items()}


def run(layout: str, recursive: bool) -> dict:
    r = {"layout": layout, "recursive": recursive, "load": stamp(f"{layout} recursiveprot={recursive}")}
    teardown()
    plan = lentcase.planned(layout, CAPACITY, PAGE)
    d = dirs(plan.units)
    by = {u.unit: u for u in plan.units}
    ensure_qos_slices()
    for u in plan.units:
        if u.level in ("node", "qos"):
            props = u.properties()
            if u.unit.endswith("-besteffort.slice"):
                props.setdefault("MemoryMax", UINT64_MAX)  # a ceiling of the run before, taken back
            set_unit_properties(u.unit, **props)
    r["planned"] = {u.unit: {"min": u.memory_min, "low": u.memory_low, "max": u.memory_max} for u in plan.units}
    r["ceiling"] = plan.ceiling.memory_max if plan.ceiling else None
    drop_caches()
    leaves = {}
    for pod in lentcase.pods():
        n = pod.name
        pod_unit = next(u for u in plan.units if u.level == "pod" and u.pod == pod.key)
        extra = {"MemoryMax": PODS[n][2] * MIB} if PODS[n][2] else {}
        create_pod_slice(UIDS[n], pod.qos, **pod_unit.properties(), **extra)
        scope = lentcase.leaf(n)
        create_container_scope(pod_unit.unit, CIDS_HEX[n], command=(
            "sh", "-c", f"while [ ! -e /run/lent-go ]; do sleep 0.05; done; cat {FILES[n]} > /dev/null;"
                        f" touch /run/lent-{n}.done; exec sleep infinity"), **by[scope].properties(), **extra)
        leaves[n] = d[scope]
    open("/run/lent-go", "w").close()
    t0 = time.monotonic()
    done = wait_for(lambda: all(os.path.exists(f"/run/lent-{n}.done") for n in PODS), timeout=300, interval=0.5)
    r["fill_s"] = round(time.monotonic() - t0, 1)
    check(done, f"{layout}: the pods read their files in {r['fill_s']} s")
    time.sleep(2)

    # predict, from the kernel's own files
    tree = lentcase.tree_of(plan.units, {}, read=lambda unit: (num(f"{d[unit]}/memory.current"),
                                                               num(f"{d[unit]}/memory.min"),
                                                               num(f"{d[unit]}/memory.low")))
    eff = protection(tree, recursive=recursive, page_size=PAGE)
    r["kernel_values"] = {u: {"current": num(f"{d[u]}/memory.current"), "min": num(f"{d[u]}/memory.min"),
                              "low": num(f"{d[u]}/memory.low"), "max": num(f"{d[u]}/memory.max")} for u in d}
    r["emulated"] = {}
    for n in PODS:
        e = eff[lentcase.leaf(n)]
        r["emulated"][n] = {"usage": e.usage, "emin": e.emin, "elow": e.elow, "protected": e.protected, "lent": e.lent,
                            "floor": lentcase.floor(tree, lentcase.leaf(n), recursive=recursive, page_size=PAGE)}
    for q in ("kubepods-burstable.slice", "kubepods-besteffort.slice"):
        e = eff[q]
        r["emulated"][q] = {"usage": e.usage, "protected": e.protected, "lent": e.lent}
    log(layout, "recursive" if recursive else "no recursiveprot", "emulated (MiB):",
        {n: (round(v["usage"] / MIB), round(v["protected"] / MIB), round(v["lent"] / MIB),
             round(v.get("floor", 0) / MIB)) for n, v in r["emulated"].items()})

    # press
    r["before"] = counters(dict(leaves, kubepods=f"{CG}/kubepods.slice", **{"system.slice": f"{CG}/system.slice"}))
    # A pod the emulation protects whole has no floor to reach (None): with every pod so, the presser
    # goes on until the node thrashes, the protection is breached, or its time is up.
    floors = {n: (None if r["emulated"][n]["floor"] >= r["emulated"][n]["usage"] else r["emulated"][n]["floor"])
              for n in PODS}
    spec = {"watch": dict({n: {"path": leaves[n], "floor": floors[n]} for n in PODS},
                          **{"system.slice": {"path": f"{CG}/system.slice", "floor": None}}),
            "cap_mib": CAP_MIB, "time_s": PARAMS.get("press_s", 120)}
    r["press_spec"] = spec
    subprocess.run(["systemd-run", "--quiet", "--unit=lent-press", "--slice=system.slice", "-p", "OOMScoreAdjust=1000",
                    "-p", "MemoryAccounting=yes", "/usr/bin/python3", PRESS, "/run/lent-press.json", json.dumps(spec)],
                   check=True)
    t0 = time.monotonic()

    def ended():
        try:
            if json.load(open("/run/lent-press.json"))["stopped"] != "running":
                return "stopped"
        except (OSError, ValueError, KeyError):
            pass
        state = subprocess.run(["systemctl", "show", "-P", "ActiveState", "lent-press.service"],
                               capture_output=True, text=True).stdout.strip()
        return "ended" if state in ("failed", "inactive") else None

    # The presser bounds itself (time_s); a step stuck in reclaim is the one thing that outlasts it.
    how = wait_for(ended, timeout=spec["time_s"] + 60, interval=1) or "outer timeout"
    r["press_s"] = round(time.monotonic() - t0, 1)
    r["after"] = counters(dict(leaves, kubepods=f"{CG}/kubepods.slice", **{"system.slice": f"{CG}/system.slice"}))
    result = subprocess.run(["systemctl", "show", "-P", "Result", "lent-press.service"], capture_output=True,
                            text=True).stdout.strip()
    try:
        press = json.load(open("/run/lent-press.json"))
    except (OSError, ValueError):
        press = {"trace": [], "stopped": "no trace"}
    r["press"] = dict(press, how=how, result=result)
    subprocess.run(["systemctl", "stop", "lent-press.service"], capture_output=True)
    last = press["trace"][-1] if press["trace"] else {}
    log(f"{layout}: presser {how} ({press['stopped']}, result {result}) after {last.get('alloc_mib')} MiB;",
        "file MiB before/after:", {n: (round(r["before"][n]["file"] / MIB), round(r["after"][n]["file"] / MIB))
                                    for n in PODS}, "low events:", {n: r["after"][n]["low"] - r["before"][n]["low"]
                                                                     for n in PODS})
    # The emulation against the kernel: who lost page cache before the first breach.
    for n in PODS:
        ok, seen = lentcase.verdict(r["emulated"][n], r["before"][n]["file"], r["after"][n]["file"])
        check(ok, f"{layout} rp={recursive}: {n} {seen}")
    teardown()
    return r


CIDS_HEX = {n: lentcase.CIDS[n].split("//")[1] for n in PODS}
check(recursiveprot(), "the cgroup2 mount has memory_recursiveprot at boot")
subprocess.run(["systemctl", "stop", "memqos-systemd.service"], capture_output=True)
make_files()
OUT["capacity"] = CAPACITY
try:
    budget = PARAMS.get("budget_s", 1200)
    for layout, recursive in PARAMS["runs"]:
        if time.time() - OUT["started"] > budget:  # what is left is said, not run
            log(f"{layout} recursiveprot={recursive}: skipped, the guest's budget of {budget} s is spent")
            OUT["runs"].append({"layout": layout, "recursive": recursive, "error": f"skipped (budget {budget} s)"})
            continue
        if recursiveprot() != recursive and not check(remount(recursive), f"cgroup2 remounted with"
                                                      f" memory_recursiveprot {'on' if recursive else 'off'}"):
            OUT["runs"].append({"layout": layout, "recursive": recursive, "error": "remount failed"})
            continue
        try:
            OUT["runs"].append(run(layout, recursive))
        except Exception as e:  # one run lost is reported, the others still run
            log(f"{layout} recursiveprot={recursive}: {type(e).__name__}: {e}")
            OUT["runs"].append({"layout": layout, "recursive": recursive, "error": f"{type(e).__name__}: {e}"})
        save("lent.json", OUT)
finally:
    teardown()
    check(remount(True), "cgroup2 remounted with memory_recursiveprot again")
    OUT["ended"] = time.time()
    save("lent.json", OUT)
