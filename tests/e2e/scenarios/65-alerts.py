#!/usr/bin/python3
"""The monitoring mixin on real data (issue 17): a real Prometheus (Debian's) scrapes the daemon
every 2 s and evaluates alerts.yaml and rules.yaml as the .deb installs them (/usr/share/memqos-systemd/
monitoring/) every second, while
the protection benchmark's pods (bench/scenarios/60-protection.py: a Guaranteed pod, a Burstable
one, an idle Burstable one whose request brings the requests to 90 % of allocatable, and a
BestEffort neighbour that allocates anonymous memory until the OOM killer takes it, or under
Tiered until the alert fires) run under
  tiered  memoryReservationPolicy TieredReservation: the kernel reclaims the Burstable pods below
          their memory.low (their memory.events `low` rises): MemqosProtectionBreached fires for
          them;
  hard    HardReservation, the same pods in another namespace: MemqosProtectionBreached stays
          silent (the pods hold MemoryMin, which the kernel does not reclaim below), although
          Prometheus had their series.
The rules load with no error. Prometheus runs in system.slice (reserved and enforced: 256Mi)
with OOMScoreAdjust=-900, its data on /var/tmp. While the neighbour thrashes, the guest (TCG)
stalls and scrapes fail (the daemon even missed its 30 s watchdog, in all 3 runs measured), so each
run keeps its pods until Prometheus has scraped them after the pressure: the kernel's counters
keep what happened, and the alert's 5-minute window reaches back to the scrapes before it."""
# e2e-timeout: 600
import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

from memqos_e2e import *

need_deb()
PAYLOAD = os.environ["MEMQOS_E2E_PAYLOAD"]
WS = os.path.join(PAYLOAD, "bench", "ws.py")          # the benchmark's workload
# The rules as the package installs them (debian/memqos-systemd.install), not the source tree's.
RULES = [os.path.join("/usr/share/memqos-systemd/monitoring", f) for f in ("alerts.yaml", "rules.yaml")]
PROM_UNIT = "memqos-e2e-prometheus.service"
PROM_DIR = "/var/tmp/memqos-e2e-prometheus"
PROM = "http://127.0.0.1:9090"
CTL = "/run/memqos-e2e-alerts"
MIB = 1 << 20
ALERT = "MemqosProtectionBreached"
# The benchmark's parameters (bench/protection.py, params()).
G_REQ, G_ANON, G_FILE = 192, 80, 64
B_REQ, B_ANON, B_FILE = 320, 32, 256
B2_ANON, HOG_MIB = 16, 1600
PRESSURE_MAX_S = 120  # the breach must stay within MemqosProtectionBreached's 5-minute window
FILES = {"G": ("/var/tmp/alerts-g.dat", G_FILE), "B": ("/var/tmp/alerts-b.dat", B_FILE)}
ACCOUNTING = dict(MemoryAccounting=True, CPUAccounting=True, IOAccounting=True, TasksAccounting=True)

check(shutil.which("prometheus") is not None, "Debian's prometheus is in the image (image/packages.txt)")
check(all(os.path.exists(p) for p in RULES + [WS, "/usr/share/doc/memqos-systemd/runbook.md"]),
      "the package installed the rules and the runbook; the payload has bench/ws.py")
with open("/proc/self/oom_score_adj", "w") as f:
    f.write("-900")  # the scenario itself must outlive the neighbour's OOM

# system.slice reserved and enforced (MemoryMin), as a node that protects its own daemons does:
# without it, Prometheus (and the daemon, when it still ran in system.slice, before memqos.slice)
# lost their pages to the Tiered thrash, the daemon missed its watchdog for 30 s, was killed, and
# no scrape saw the breach (first run).
SYSTEM_RESERVED_MIB = 256
CAPACITY = mem_total_bytes()
# Allocatable: capacity - systemReserved - the default evictionHard memory.available
ALLOCATABLE = CAPACITY - (SYSTEM_RESERVED_MIB + 100) * MIB
B2_REQ = max(32, int(0.9 * ALLOCATABLE / MIB) - G_REQ - B_REQ)


def config(policy):
    """sample_config() with system.slice the only reserved cgroup."""
    cfg = sample_config(memoryReservationPolicy=policy, systemReserved={"memory": f"{SYSTEM_RESERVED_MIB}Mi"},
                        enforceNodeAllocatable=["pods", "system-reserved"])
    cfg.pop("kubeReserved")
    cfg.pop("kubeReservedCgroup")
    return cfg


# ---- Prometheus ---------------------------------------------------------------------------------
def prom_get(path, **params):
    url = f"{PROM}{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=10) as r:
        doc = json.load(r)
    if doc.get("status") != "success":
        raise RuntimeError(f"{path}: {doc}")
    return doc["data"]


def query(expr):
    """An instant query now: [(labels, value)]."""
    try:
        return [(r["metric"], float(r["value"][1])) for r in prom_get("/api/v1/query", query=expr)["result"]]
    except OSError:
        return []


def start_prometheus():
    shutil.rmtree(PROM_DIR, ignore_errors=True)
    os.makedirs(PROM_DIR)
    config = {"global": {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "1s"},
              "rule_files": RULES,
              "scrape_configs": [{"job_name": "memqos-systemd",
                                  "static_configs": [{"targets": ["127.0.0.1:9759"]}]}]}
    with open(os.path.join(PROM_DIR, "prometheus.yml"), "w") as f:
        json.dump(config, f)  # JSON is YAML
    systemctl("reset-failed", PROM_UNIT)
    subprocess.run(["systemd-run", "--quiet", "--unit", PROM_UNIT, "--property", "OOMScoreAdjust=-900",
                    "--property", "Type=exec", "/usr/bin/prometheus",
                    f"--config.file={PROM_DIR}/prometheus.yml", f"--storage.tsdb.path={PROM_DIR}/data",
                    "--web.listen-address=127.0.0.1:9090", "--storage.tsdb.retention.time=1h"], check=True)
    import atexit
    atexit.register(systemctl, "stop", PROM_UNIT)
    return wait_for(lambda: query('up{job="memqos-systemd"} == 1'), 90, 1.0)


# ---- the benchmark's pods -----------------------------------------------------------------------
def make_files():
    """The working sets' files. Sparse: read, their holes fill the page cache as data would, and
    making them costs nothing (dd from /dev/urandom took most of a minute under TCG)."""
    for path, mib in FILES.values():
        subprocess.run(["truncate", "-s", f"{mib}M", path], check=True)


def drop_caches():
    subprocess.run(["sync"])
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def oom_adj(qos, request_mib):
    """The kubelet's oom_score_adj for the QoS class (pkg/kubelet/qos/policy.go)."""
    if qos == "Guaranteed":
        return -997
    if qos == "BestEffort":
        return 1000
    return int(min(max(1000 - (1000 * request_mib * MIB) // CAPACITY, 2), 999))


def the_pods(namespace):
    g = make_pod("guaranteed", [{"name": "app", "requests": {"memory": f"{G_REQ}Mi", "cpu": "100m"},
                                 "limits": {"memory": f"{G_REQ}Mi", "cpu": "100m"}}], namespace=namespace)
    b = make_pod("burstable", [{"name": "app", "requests": {"memory": f"{B_REQ}Mi"}}], namespace=namespace)
    b2 = make_pod("burstable-idle", [{"name": "app", "requests": {"memory": f"{B2_REQ}Mi"}}], namespace=namespace)
    be = make_pod("besteffort", [{"name": "hog"}], namespace=namespace)
    return {"G": g, "B": b, "B2": b2, "BE": be}


def container_id(pod):
    return pod["status"]["containerStatuses"][0]["containerID"].split("://")[1]


def run_in_scope(pod_slice, cid, args, **props):
    """Start `args` and put it in the container's scope, as runc does. Returns the Popen."""
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    start_transient_unit(f"cri-containerd-{cid}.scope",
                         dict(Description=f"libcontainer container {cid}", Slice=pod_slice, Delegate=True,
                              PIDs=[proc.pid], DefaultDependencies=False, **ACCOUNTING, **props))
    return proc


def events(pod_slice):
    """The pod slice's memory.events (read from its cgroup directory: no D-Bus call)."""
    with open(os.path.join(slice_cgroup_dir(pod_slice), "memory.events")) as f:
        return {k: int(v) for k, _, v in (line.partition(" ") for line in f.read().splitlines())}


def protection(pod_slice, kind):
    with open(os.path.join(slice_cgroup_dir(pod_slice), f"memory.{kind}")) as f:
        return int(f.read())


def one_run(policy, namespace):
    """The pods under `policy`, the neighbour allocating until the OOM killer acts. Returns what
    the kernel counted and when the run started and ended (Unix time)."""
    memqos_write_config(config(policy))
    check(memqos_reload(timeout=90), f"{namespace}: config {policy}, effective, pods and system.slice")
    shutil.rmtree(CTL, ignore_errors=True)
    os.makedirs(CTL)
    pods = the_pods(namespace)
    write_pods(pods.values())
    drop_caches()
    t_start = time.time()
    slices, procs = {}, {}
    spec = {"G": (G_REQ, G_ANON, FILES["G"][0]), "B": (B_REQ, B_ANON, FILES["B"][0]), "B2": (B2_REQ, B2_ANON, None)}
    for k, (req, anon, path) in spec.items():
        pod = pods[k]
        qos = pod["status"]["qosClass"]
        extra = {"MemoryMax": G_REQ * MIB} if qos == "Guaranteed" else {}
        slices[k] = create_pod_slice(pod["metadata"]["uid"], qos, **extra)
        args = ["/usr/bin/python3", WS, "--ctl", CTL, "--name", k, "--anon", str(anon),
                "--oom-score-adj", str(oom_adj(qos, req))] + (["--file", path] if path else [])
        procs[k] = run_in_scope(slices[k], container_id(pod), args, **extra)
    slices["BE"] = create_pod_slice(pods["BE"]["metadata"]["uid"], "BestEffort")
    # the daemon has set the protections (the kernel shows them), and Prometheus has the pods
    kind = "low" if policy == "TieredReservation" else "min"
    ok = wait_for(lambda: all(protection(slices[k], kind) == spec[k][0] * MIB for k in ("B", "B2")), 60, 0.5)
    check(ok, f"{namespace}: the Burstable pod slices hold memory.{kind} = their requests "
              f"({protection(slices['B'], kind) // MIB}Mi, {protection(slices['B2'], kind) // MIB}Mi)")
    seen = wait_for(lambda: len(query(f'sum by (pod) (memqos_pod_memory_protected_bytes{{namespace="{namespace}"}})'
                                      f' > 0')) >= 3, 60, 1.0)
    check(bool(seen), f"{namespace}: Prometheus scraped the protection of the 3 protected pods")
    open(os.path.join(CTL, "go"), "w").close()
    wait_for(lambda: all(os.path.exists(os.path.join(CTL, k + ".ready")) for k in spec), 300, 0.2)
    time.sleep(5)  # a few scrapes of the filled pods before the pressure
    log(f"{namespace}: system.slice memory.current {int(open('/sys/fs/cgroup/system.slice/memory.current').read()) // MIB}Mi,"
        f" memory.min {int(open('/sys/fs/cgroup/system.slice/memory.min').read()) // MIB}Mi")
    ev0 = {k: events(slices[k]) for k in spec}
    hog = run_in_scope(slices["BE"], container_id(pods["BE"]),
                       ["/usr/bin/python3", WS, "--ctl", CTL, "--name", "BE", "--hog-anon", str(HOG_MIB),
                        "--hold", "3", "--oom-score-adj", "1000", "--go", "go2"])
    t_p = time.monotonic()
    open(os.path.join(CTL, "go2"), "w").close()
    # Until the OOM killer ends the neighbour, or (Tiered) the alert fires for the Burstable pod:
    # under TCG the thrashing before the OOM kill can take minutes, and nothing more is learnt.
    while time.monotonic() < t_p + PRESSURE_MAX_S and hog.poll() is None:
        if policy == "TieredReservation" and "burstable" in fired(namespace, t_start):
            break
        time.sleep(2)
    pressure_s = time.monotonic() - t_p
    ended = "the OOM killer" if hog.poll() == -9 else f"exit {hog.poll()}" if hog.poll() is not None else "us"
    if hog.poll() is None:
        hog.kill()
    # The pods stay until Prometheus has scraped them after the pressure: while the neighbour
    # thrashes, the guest (TCG) stalls, scrapes fail, and the daemon may miss its watchdog and be
    # restarted (it was in all 3 runs measured); the kernel's counters keep what happened.
    t_after = time.time()
    fresh = wait_for(lambda: query(f'timestamp(memqos_pod_memory_events_total{{namespace="{namespace}",'
                                   f'pod="burstable",event="low"}}) > {t_after:.0f}'), 150, 2.0)
    time.sleep(3)  # a few rule evaluations on it
    up_again = time.time() - t_after
    check(bool(fresh), f"{namespace}: Prometheus scraped the pods again {up_again:.0f} s after the pressure")
    ev1 = {k: events(slices[k]) for k in spec}
    low = {k: ev1[k].get("low", 0) - ev0[k].get("low", 0) for k in spec}
    kills = {k: ev1[k].get("oom_kill", 0) - ev0[k].get("oom_kill", 0) for k in spec}
    restarts = service_show("NRestarts")
    log(f"{namespace}: neighbour ran {pressure_s:.1f} s, ended by {ended}; kernel low events {low}, "
        f"oom_kill {kills}; scraped again after {up_again:.0f} s; daemon NRestarts {restarts}")
    for p in procs.values():
        if p.poll() is None:
            p.kill()
    for s in slices.values():
        stop_unit(s)
    return {"low": low, "kills": kills, "pressure_s": pressure_s, "neighbour_ended_by": ended,
            "scraped_again_s": up_again, "daemon_restarts": restarts,
            "start": t_start, "end": time.time()}


def fired(namespace, since):
    """{pod: evaluations that found ALERT firing} for the pods of `namespace` since `since` (Unix
    time), from Prometheus' ALERTS series."""
    window = max(1, int(time.time() - since) + 1)
    rows = query(f'count_over_time(ALERTS{{alertname="{ALERT}",alertstate="firing",namespace="{namespace}"}}[{window}s])')
    return {r["pod"]: v for r, v in rows}


# ---- the run -----------------------------------------------------------------------------------
make_files()
start_empty_node(config("TieredReservation"), "config: TieredReservation, pods and system.slice enforced")
import atexit
atexit.register(reset_reserved_slices)  # system.slice back to MemoryMin=0 once the config is restored
check(start_prometheus(), "Prometheus scrapes the daemon (up == 1)")
groups = prom_get("/api/v1/rules")["groups"]
rules = [r for g in groups for r in g["rules"]]
alerts = sorted(r["name"] for r in rules if r["type"] == "alerting")
check(len(alerts) == 8 and all(r.get("health") == "ok" for r in rules),
      f"Prometheus loaded {len(rules)} rules, {len(alerts)} alerts, health "
      f"{sorted({r.get('health') for r in rules})}: {alerts}")

runs = {}
for policy, namespace in (("TieredReservation", "tiered"), ("HardReservation", "hard")):
    runs[namespace] = one_run(policy, namespace)
    save = os.path.join(os.environ.get("MEMQOS_E2E_ARTIFACTS", "."), "alerts.json")
    with open(save, "w") as f:
        json.dump(runs, f, indent=1)

tiered, hard = runs["tiered"], runs["hard"]
got = fired("tiered", tiered["start"])
in_prom = query(f'max by (pod) (max_over_time(memqos_pod_memory_events_total{{namespace="tiered",event="low"}}'
                f'[{int(time.time() - tiered["start"]) + 1}s]))')
log(f"tiered: low in Prometheus {[(r['pod'], v) for r, v in in_prom]}; {ALERT} firing samples {got}")
check(tiered["low"]["B"] > 0, f"tiered: the kernel reclaimed the Burstable pod below memory.low: "
                              f"{tiered['low']['B']} low events (idle Burstable {tiered['low']['B2']})")
check("burstable" in got, f"tiered: {ALERT} fired for tiered/burstable on the scraped data "
                          f"({got.get('burstable', 0):.0f} firing evaluations; all: {got})")
check("guaranteed" not in got, f"tiered: not for the Guaranteed pod (it has no MemoryLow): {sorted(got)}")

got = fired("hard", hard["start"])
window = int(time.time() - hard["start"]) + 1
scraped = query(f'count_over_time(memqos_pod_memory_events_total{{namespace="hard",event="low"}}[{window}s])')
log(f"hard: kernel low events {hard['low']}, {ALERT} firing samples {got}, low samples scraped "
    f"{[(r['pod'], v) for r, v in scraped]}")
check(len(scraped) >= 3 and all(v >= 5 for _, v in scraped),
      f"hard: Prometheus scraped the pods' memory.events throughout "
      f"({sorted((r['pod'], int(v)) for r, v in scraped)} samples)")
check(not got, f"hard: {ALERT} silent for the same pods and neighbour under HardReservation ({got})")
window = int(time.time() - tiered["start"]) + 1
scrapes = query(f'count_over_time(up{{job="memqos-systemd"}}[{window}s])')
failed = query(f'count_over_time((up{{job="memqos-systemd"}} == 0)[{window}s:2s])')
log(f"scrapes of the daemon during both runs: {scrapes}, failed (up == 0): {failed}")
