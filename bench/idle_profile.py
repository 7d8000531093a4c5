#!/usr/bin/env python3
"""Benchmark: the daemon's CPU while idle on a node of 110 pods, natively, with a profile.

    python3 bench/idle_profile.py [--idle 120] [--speed 1] [--profile-idle 60] [--scrape 30]
                                  [--no-pod-signals] [--watch-every S] [--json out.json]
    python3 bench/idle_profile.py --render out.json   # the report again, from saved results

(with dbus-next importable: e.g. `.venv/bin/python bench/idle_profile.py`; needs dbus-daemon.)

No VM. Two processes, so that only the daemon's CPU is counted:

* this one runs a private dbus-daemon with the systemd stand-in (tests/fakesystemd.py) holding
  225 units of ours (kubepods.slice, its two QoS slices, 110 pod slices, 110 container scopes,
  kube.slice and system.slice), every GetAll answer padded to systemd 252's ~72 properties,
  a kubelet `/pods` endpoint on 127.0.0.1 (a stdlib HTTP server; ~5 KB of JSON per pod, as a
  kubelet's pods with their managedFields are), and the sd_notify socket;
* a child runs the real `Daemon` (the kubelet source, the metrics endpoint, WatchdogSec=30s as
  the shipped unit has) against them, waits until it has converged, then measures an idle
  window with nothing changing: CPU of the whole process (resource.getrusage: every thread),
  split by activity (CPU time of the thread doing it: the pod poll = fetch over HTTP and parse in
  the worker thread + the reconcile (plan, diff) on the loop; the resync = Observer.refresh_all
  with the replies it waits for; the scrapes = the request threads of the metrics endpoint;
  other = the rest: the loop, timers, watchdog, metrics server), then a second window under
  cProfile (the loop thread and the worker threads' calls) for the top functions. cProfile slows
  what it profiles, so the CPU figures come from the first window only.

The watch of the node, QoS and reserved slices' cgroups (Daemon.watch_upper_slices: every 5 s
idle, and whenever one of their files is written) is timed as an activity of its own, its count
the number of times it ran; `--watch-every S` makes it read them every S seconds for good instead
(the 1 s watch issue 29 asked to weigh), not divided by `--speed`.

The intervals are the defaults (pollInterval 5 s, resyncInterval 60 s); `--speed K` divides
both, and the scrape interval, by K and the window's CPU is then reported per hour at the
defaults (divided by K). Prints CPU seconds per hour idle and % of one core.

A Prometheus stand-in in this process scrapes the daemon's /metrics every `--scrape` seconds
(divided by K; 0: never), from the start, asking as Prometheus does (OpenMetrics first, gzip).
The pod and QoS slices and the containers have the files the kernel's signals are read from at
each scrape (memory.events, memory.pressure, memory.current); `--no-pod-signals` runs the same
daemon without them (its plan handed to the metrics without the cgroups), for the figure side by
side. The scrapes' CPU in the daemon (the request threads:
collect and render) is its own activity.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import http.server
import io
import json
import os
import pstats
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "bench", "guest"))
from scrape_cost import write_kernel_files  # noqa: E402

PODS = 110
QOS = ("Guaranteed", "Burstable", "Burstable", "BestEffort")  # 28 G, 55 B, 27 BE
RESERVED = ("kube.slice", "system.slice")
DEFAULT_POLL, DEFAULT_RESYNC = 5.0, 60.0
PROMETHEUS = {"Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                        "text/plain;version=0.0.4;q=0.5,*/*;q=0.1", "Accept-Encoding": "gzip"}


# ------------------------------------------------------------------ the node

def make_pod(n: int) -> dict:
    """One pod as the kubelet's /pods lists it (metadata with managedFields, spec, status)."""
    qos = QOS[n % len(QOS)]
    uid = str(uuid.UUID(int=0x6A4F2E3B1C9D4A5E8F7B2D3E4F5A0000 + n))
    cid = f"{n:064x}"
    if qos == "Guaranteed":
        res = {"requests": {"memory": "512Mi", "cpu": "500m"}, "limits": {"memory": "512Mi", "cpu": "500m"}}
    elif qos == "Burstable":
        res = {"requests": {"memory": f"{64 + n}Mi", "cpu": "100m"}, "limits": {"memory": "1Gi"}}
    else:
        res = {}
    name = f"app-{n:03d}-7c9f8d6b5-x{n:04x}"
    labels = {"app.kubernetes.io/name": f"app-{n:03d}", "app.kubernetes.io/instance": "prod",
              "pod-template-hash": "7c9f8d6b5", "team": "platform"}
    managed = [{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                "time": "2026-11-22T10:00:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {f"f:{k}": {} for k in labels},
                                            "f:ownerReferences": {}},
                             "f:spec": {"f:containers": {f'k:{{"name":"app-{n}"}}': {
                                 "f:env": {}, "f:image": {}, "f:imagePullPolicy": {}, "f:name": {}, "f:ports": {},
                                 "f:resources": {}, "f:terminationMessagePath": {}}},
                                 "f:dnsPolicy": {}, "f:restartPolicy": {}, "f:schedulerName": {}}}},
               {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": "2026-11-22T10:00:05Z",
                "fieldsType": "FieldsV1", "subresource": "status",
                "fieldsV1": {"f:status": {"f:conditions": {}, "f:containerStatuses": {}, "f:hostIP": {},
                                          "f:phase": {}, "f:podIP": {}, "f:podIPs": {}, "f:startTime": {}}}}]
    container = {
        "name": f"app-{n}", "image": f"registry.example.com/team/app-{n:03d}:1.4.{n}",
        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
        "env": [{"name": f"SETTING_{i}", "value": f"value-{i}-{n}"} for i in range(8)],
        "resources": res,
        "volumeMounts": [{"name": "kube-api-access-x", "readOnly": True,
                          "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"}, "periodSeconds": 10},
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent"}
    return {
        "metadata": {"name": name, "generateName": name[:-5], "namespace": "prod", "uid": uid,
                     "resourceVersion": str(100000 + n), "creationTimestamp": "2026-11-22T10:00:00Z",
                     "labels": labels, "annotations": {"kubernetes.io/config.seen": "2026-11-22T10:00:01Z",
                                                       "kubernetes.io/config.source": "api"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name[:-6],
                                          "uid": str(uuid.UUID(int=n)), "controller": True,
                                          "blockOwnerDeletion": True}],
                     "managedFields": managed},
        "spec": {"containers": [container], "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
                 "dnsPolicy": "ClusterFirst", "serviceAccountName": "default", "nodeName": "node-1",
                 "schedulerName": "default-scheduler", "priority": 0, "enableServiceLinks": True,
                 "preemptionPolicy": "PreemptLowerPriority",
                 "volumes": [{"name": "kube-api-access-x", "projected": {"defaultMode": 420, "sources": [
                     {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                     {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}}],
                 "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                  "effect": "NoExecute", "tolerationSeconds": 300},
                                 {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                                  "effect": "NoExecute", "tolerationSeconds": 300}]},
        "status": {"phase": "Running", "qosClass": qos, "hostIP": "10.0.0.1", "podIP": f"10.244.0.{n % 250}",
                   "podIPs": [{"ip": f"10.244.0.{n % 250}"}], "startTime": "2026-11-22T10:00:01Z",
                   "conditions": [{"type": t, "status": "True", "lastProbeTime": None,
                                   "lastTransitionTime": "2026-11-22T10:00:05Z"}
                                  for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")],
                   "containerStatuses": [{"name": f"app-{n}", "state": {"running": {"startedAt": "2026-11-22T10:00:04Z"}},
                                          "lastState": {}, "ready": True, "restartCount": 0,
                                          "image": container["image"], "imageID": f"sha256:{cid}",
                                          "containerID": f"containerd://{cid}", "started": True}]},
    }


def units_of(pods: list[dict]) -> list[tuple[str, str]]:
    """(unit, its parent slice for a scope, else "") for every unit of the node."""
    from memqos_systemd.naming import Naming, container_scope

    naming = Naming("/", ())
    units = [(u, "") for u in ("kubepods.slice", "kubepods-burstable.slice", "kubepods-besteffort.slice", *RESERVED)]
    for p in pods:
        pod_slice = naming.pod_slice(p["status"]["qosClass"], p["metadata"]["uid"])
        units.append((pod_slice, ""))
        units.append((container_scope(p["status"]["containerStatuses"][0]["containerID"]), pod_slice))
    return units


def config_dict(url: str, speed: float, lending: bool = False) -> dict:
    """The node's config; `lending`: TieredReservation with the two levers whose lines follow
    usage (issue 44), which read every Guaranteed and Burstable pod's cgroup at each look."""
    extra = {"memoryReservationPolicy": "TieredReservation", "bestEffortCeiling": {"enabled": True},
             "burstableHigh": {"enabled": True}, "lending": {"enabled": True}} if lending else {}
    return {"kubelet": {"url": url, "pollInterval": f"{int(DEFAULT_POLL * 1000 / speed)}ms"},
            "resyncInterval": f"{int(DEFAULT_RESYNC * 1000 / speed)}ms",
            "enforceNodeAllocatable": ["pods", "kube-reserved", "system-reserved"],
            "kubeReservedCgroup": "/kube.slice", "systemReservedCgroup": "/system.slice",
            "kubeReserved": {"memory": "1Gi"}, "systemReserved": {"memory": "1Gi"}, **extra}


# ------------------------------------------------------------------ parent: the outside world

def serve_pods(body: bytes) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):  # noqa: N802 - the stdlib's name
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def kernel_files(fake, units: list[tuple[str, str]]) -> None:
    """What the kernel shows in the slices' files the protection signals read (metrics.py)."""
    for i, (unit, _) in enumerate(units):
        if not unit.startswith("kubepods") or not unit.endswith(".slice"):
            continue
        write_kernel_files(str(fake.cgroup_dir(unit)), i)


def scraper(port: int, every: float, stop: threading.Event, seen: dict) -> None:
    """Prometheus: GET /metrics every `every` seconds, from when the endpoint answers."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=PROMETHEUS)
    while not stop.wait(every):
        try:
            with opener.open(request, timeout=10) as r:
                seen["bytes"] = len(r.read())
                seen["scrapes"] = seen.get("scrapes", 0) + 1
        except OSError:
            pass


def parent(args) -> int:
    from fakesystemd import PADDING_FOR_SYSTEMD_252, DBusDaemon, FakeSystemd, find_dbus_daemon

    executable = find_dbus_daemon()
    if not executable:
        print("dbus-daemon is not installed (apt-get install dbus)", file=sys.stderr)
        return 2
    pods = [make_pod(n) for n in range(PODS)]
    body = json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": pods}).encode()
    work = tempfile.mkdtemp(prefix="memqos-idle-")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(os.path.join(work, "notify"))

    def drain():
        while True:
            try:
                notify.recv(4096)
            except OSError:
                return

    threading.Thread(target=drain, daemon=True).start()
    bus = DBusDaemon(executable)
    bus.start()
    fake = FakeSystemd(bus, padding_properties=PADDING_FOR_SYSTEMD_252)
    # The units' cgroups as the kernel shows them (memory.min/low/high, a slice's invocation ID),
    # which the daemon reads as it does under systemd.
    fake.cgroup_root = os.path.join(work, "cgroup")
    fake.start()
    httpd = serve_pods(body)
    try:
        units = units_of(pods)
        for u, parent in units:
            fake.add_unit(u, slice=parent)
        kernel_files(fake, units)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        stop, seen = threading.Event(), {}
        if args.scrape > 0:
            threading.Thread(target=scraper, args=(port, args.scrape / args.speed, stop, seen), daemon=True).start()
        out = os.path.join(work, "result.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--bus", fake.address,
               "--url", f"http://127.0.0.1:{httpd.server_address[1]}/pods", "--idle", str(args.idle),
               "--profile-idle", str(args.profile_idle), "--speed", str(args.speed), "--out", out,
               "--cgroup", os.path.join(work, "cgroup"), "--metrics-port", str(port)]
        if args.no_pod_signals:
            cmd.append("--no-pod-signals")
        if args.lending:
            cmd.append("--lending")
        if args.watch_every:
            cmd += ["--watch-every", str(args.watch_every)]
        env = {**os.environ, "NOTIFY_SOCKET": os.path.join(work, "notify"), "WATCHDOG_USEC": "30000000"}
        env.pop("WATCHDOG_PID", None)
        subprocess.run(cmd, check=True, env=env)
        stop.set()
        with open(out) as f:
            result = json.load(f)
        result["lending"] = args.lending
        result["scrape"] = {"every_s": args.scrape, "pod_signals": not args.no_pod_signals,
                            "bytes": seen.get("bytes", 0), "scrapes": seen.get("scrapes", 0)}
        result["node"] = {"pods": PODS, "units": len(units), "pods_json_bytes": len(body),
                          "getall_properties": 4 + PADDING_FOR_SYSTEMD_252}
        report(result)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    finally:
        httpd.shutdown()
        fake.stop()
        bus.stop()
        notify.close()
    return 0


def steady_state(r: dict) -> tuple[float, float]:
    """(CPU s per hour idle at the defaults, of which resyncs), the resyncs counted at their
    average over the full-read cycle: (N-1) timer resyncs as measured in the window (or full
    ones, if the window had none) and one full re-read as timed after it."""
    w, acts = r["window"], r["activities"]
    per_hour = 3600.0 / (w["seconds"] * r["speed"])
    n, full = r["full_resync_every"], r["full_resync_cpu_s"]
    light = acts.get("resync, timer: upper slices (refresh_all)", {"cpu_s": 0.0, "count": 0})
    light_each = light["cpu_s"] / light["count"] if light["count"] else full
    in_window = sum(a["cpu_s"] for k, a in acts.items() if k.startswith("resync"))
    resyncs = 3600.0 / DEFAULT_RESYNC * ((n - 1) * light_each + full) / n
    return (w["cpu_s"] - in_window) * per_hour + resyncs, resyncs


def report(r: dict) -> None:
    node, w = r["node"], r["window"]
    per_hour = 3600.0 / (w["seconds"] * r["speed"])
    total = w["cpu_s"] * per_hour
    steady, resyncs = steady_state(r)
    print(f"node: {node['pods']} pods, {node['units']} units of ours, /pods {node['pods_json_bytes'] / 1e6:.2f} MB,"
          f" GetAll answers {node['getall_properties']} properties")
    sc = r.get("scrape")
    if sc:
        print(f"scraped every {sc['every_s']:g} s at the defaults ({sc['scrapes']} scrapes, {sc['bytes']} bytes each);"
              f" protection signals {'on' if sc['pod_signals'] else 'off (--no-pod-signals)'}"
              + (f"; reading them: {1000 * r['signals_read_s']:.2f} ms per scrape" if r.get("signals_read_s") else ""))
    if r.get("watch_every"):
        print(f"the upper slices' cgroups read every {r['watch_every']:g} s for good (--watch-every)")
    if r.get("lending"):
        print("lending on (--lending): both levers' lines follow usage, every owner's cgroup read at each look")
    print(f"idle window: {w['seconds']:.0f} s at intervals / {r['speed']:g} (poll {DEFAULT_POLL / r['speed']:g} s,"
          f" resync {DEFAULT_RESYNC / r['speed']:g} s);"
          f" D-Bus calls {w['dbus_calls']}, writes {w['writes']}")
    print(f"CPU in the window: {w['cpu_s']:.3f} s (system {w['sys_cpu_s']:.3f} s) = {total:.2f} CPU s per hour"
          f" = {total / 36:.3f} % of a core")
    n = r["full_resync_every"]
    cycle = "at every resync" if n == 1 else f"every {n}th resync, the upper slices at the others"
    event = r.get("event_full_resync_cpu_s")
    also = (f" (one an event calls for, every unit read over D-Bus: {1000 * event:.1f} ms)"
            if event is not None else "")
    print(f"a full re-read of every unit: {1000 * r['full_resync_cpu_s']:.1f} ms{also}; the timer reads every unit"
          f" {cycle}: resyncs cost {resyncs:.2f} CPU s per hour on average")
    print(f"CPU while idle, steady state (the window, its resyncs replaced by the cycle's average):"
          f" {steady:.2f} CPU s per hour = {steady / 36:.3f} % of a core (goal <= 0.1 %: 3.6 s per hour)")
    print("\nby activity (CPU s per hour at the defaults; count in the window; ms each):")
    for name, a in r["activities"].items():
        each = 1000 * a["cpu_s"] / a["count"] if a["count"] else 0.0
        print(f"  {name:44} {a['cpu_s'] * per_hour:8.2f}  ({a['count']:3d} x {each:7.2f} ms)")
    print(f"  {'other (loop, timers, watchdog, metrics server)':44} {r['other_cpu_s'] * per_hour:8.2f}")
    if "gc" in r:
        runs = ", ".join(f"gen {g}: {v['count']} x {1000 * v['cpu_s'] / v['count']:.2f} ms" if v["count"]
                         else f"gen {g}: 0" for g, v in r["gc"].items())
        gc_s = sum(v["cpu_s"] for v in r["gc"].values()) * per_hour
        print(f"  {'of all these, cyclic GC (in every thread)':44} {gc_s:8.2f}  ({runs})")
    print(f"\ntop functions (profiled window of {r['profile_seconds']:.0f} s; cProfile slows"
          f" what it profiles):\n{r['profile']}")


# ------------------------------------------------------------------ child: the daemon, measured

LOOP_FRAMES = ("(_run_once)", "selectors.py", "select.epoll", "events.py:78(_run)", "_contextvars.Context",
               "(run_forever)", "(run_until_complete)", "runners.py", "(run)", "{built-in method _asyncio")


class Activity:
    def __init__(self):
        self.cpu = 0.0
        self.count = 0
        self.lock = threading.Lock()

    def add(self, seconds: float) -> None:
        with self.lock:
            self.cpu += seconds
            self.count += 1


def cpu_now() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def sys_now() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def child(args) -> int:
    import memqos_systemd.agenda as agenda_mod
    from memqos_systemd.observe import Observer
    from memqos_systemd.config import parse_config
    import memqos_systemd.metrics as metrics_mod
    from memqos_systemd.daemon import Daemon, Outside
    from memqos_systemd.metrics import Metrics
    from memqos_systemd.cgroupfs import Cgroupfs
    from memqos_systemd.notify import Notifier
    from memqos_systemd.sources import make_source
    from memqos_systemd.systemd import Systemd

    speed = args.speed
    if args.watch_every:
        agenda_mod.KERNEL_WATCH_IDLE = agenda_mod.KERNEL_WATCH_INTERVAL = args.watch_every
    cfg = parse_config(config_dict(args.url, speed, args.lending))
    if args.no_pod_signals:
        set_plan = Metrics.set_plan
        Metrics.set_plan = lambda self, plan, cgroupfs=None, settings=None: set_plan(self, plan)
    metrics = Metrics()
    acts = {"pod poll: fetch /pods + parse (worker thread)": Activity(),
            "reconcile: plan + diff (every poll and resync)": Activity(),
            "resync, timer: upper slices (refresh_all)": Activity(),
            "resync, full: every unit (refresh_all)": Activity(),
            "metrics scrape: collect + render (request thread)": Activity(),
            "kernel watch: upper slices' cgroups": Activity()}
    fetch_a, plan_a, light_a, full_a, scrape_a, watch_a = acts.values()
    profiles: list[cProfile.Profile] = []
    state = {"profiling": False}

    def timed_thread(fn, act):
        def wrapper(*a, **kw):
            prof = None
            if state["profiling"]:
                prof = cProfile.Profile()
                profiles.append(prof)
                prof.enable()
            t = time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                act.add(time.thread_time() - t)
                if prof is not None:
                    prof.disable()
        return wrapper

    def timed_async(fn, act):
        async def wrapper(*a, **kw):
            t = time.thread_time()  # the loop's thread: includes the replies read meanwhile
            try:
                return await fn(*a, **kw)
            finally:
                act.add(time.thread_time() - t)
        return wrapper

    metrics_mod._ThreadingServer.process_request_thread = timed_thread(
        metrics_mod._ThreadingServer.process_request_thread, scrape_a)
    server = metrics.serve(f"127.0.0.1:{args.metrics_port}")  # as the default 127.0.0.1:9759

    def make_src(c):
        src = make_source(c)
        src.fetch = timed_thread(src.fetch, fetch_a)
        return src

    outside = Outside(connect=lambda address: Systemd.connect(args.bus, call_timeout=30.0),
                      make_source=make_src, read_capacity=lambda: 64 << 30, page_size=4096,
                      metrics=metrics, notifier=Notifier(os.environ.get("NOTIFY_SOCKET", "")),
                      cgroupfs=Cgroupfs(args.cgroup))
    watch = Daemon.watch_upper_slices

    def timed_watch(self):  # on the loop's thread, which the profiled window profiles already
        t = time.thread_time()
        try:
            watch(self)
        finally:
            watch_a.add(time.thread_time() - t)

    Daemon.watch_upper_slices = timed_watch  # a tick's work, the inotify reader's and the round's
    d = Daemon(None, cfg, outside)
    d.round.run = timed_async(d.round.run, plan_a)
    refresh_all = Observer.refresh_all
    light_refresh, full_refresh = timed_async(refresh_all, light_a), timed_async(refresh_all, full_a)

    async def timed_refresh_all(self, *a, **kw):
        return await (light_refresh if kw.get("levels") is not None else full_refresh)(self, *a, **kw)

    Observer.refresh_all = timed_refresh_all

    def calls() -> tuple[int, int]:
        total = writes = 0
        for m in metrics.registry.collect():
            if m.name == "memqos_dbus_calls":
                for s in m.samples:
                    if s.name.endswith("_total"):
                        total += int(s.value)
                        if s.labels["method"] == "SetUnitProperties":
                            writes += int(s.value)
        return total, writes

    # Python's cyclic garbage collector, by generation: it runs in whichever thread allocates,
    # so its time is also inside the activities above; counted apart to show its share.
    gc_cpu = {0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0]}
    gc_started: dict[int, float] = {}

    def gc_timer(phase: str, info: dict) -> None:
        tid = threading.get_ident()
        if phase == "start":
            gc_started[tid] = time.thread_time()
        elif tid in gc_started:
            entry = gc_cpu[info["generation"]]
            entry[0] += 1
            entry[1] += time.thread_time() - gc_started.pop(tid)

    async def main():
        task = asyncio.create_task(d.run())
        while not d.ready:
            if task.done():
                task.result()
            await asyncio.sleep(0.05)
        # memory.events files for every planned container, as the kernel has them.
        paths = d.round.last_plan.cgroup_paths
        for u in d.round.last_plan.units:
            if u.level == "container":
                p = os.path.join(args.cgroup, paths[u.unit].lstrip("/"))
                os.makedirs(p, exist_ok=True)
                with open(os.path.join(p, "memory.events"), "w") as f:
                    f.write("low 0\nhigh 3\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n")
        # Converged: the first reconcile wrote everything; let one poll and a resync pass.
        await asyncio.sleep(max(DEFAULT_RESYNC / speed, DEFAULT_POLL / speed) + 1)
        before_calls = calls()
        for a in acts.values():
            a.cpu, a.count = 0.0, 0
        cpu0, sys0, wall0 = cpu_now(), sys_now(), time.monotonic()
        gc.callbacks.append(gc_timer)
        await asyncio.sleep(args.idle)
        gc.callbacks.remove(gc_timer)
        cpu1, sys1, wall1 = cpu_now(), sys_now(), time.monotonic()
        after_calls = calls()
        measured = {k: {"cpu_s": a.cpu, "count": a.count} for k, a in acts.items()}
        # The profiled window.
        state["profiling"] = True
        main_prof = cProfile.Profile()
        main_prof.enable()
        await asyncio.sleep(args.profile_idle)
        main_prof.disable()
        state["profiling"] = False
        # What a full re-read costs, whether or not the window held one (with the defaults a
        # full one comes every FULL_RESYNC_EVERY-th resync: 15 minutes): three as the timer makes
        # them (a unit whose cgroup shows the cached values is not read over D-Bus), timed
        # directly, then three as an event (daemon-reload, reconnect) makes them: every unit read.
        full_a.cpu, full_a.count = 0.0, 0
        for _ in range(3):
            await d.observer.refresh_all(d.reserved.retired, trust_kernel=True)
        full_each = full_a.cpu / full_a.count
        full_a.cpu, full_a.count = 0.0, 0
        for _ in range(3):
            await d.observer.refresh_all(d.reserved.retired)
        event_each = full_a.cpu / full_a.count
        # The kernel's signals alone (signals.py: 110 pod slices' three files, the QoS slices' and
        # kubepods.slice's three), read and written as a scrape does, 20 times.
        t = time.thread_time()
        for _ in range(20):
            with metrics._files.lock:
                view = metrics._made_of(metrics._shown)[1]
                if view is not None:
                    view.text(metrics._files)
        signals_read = (time.thread_time() - t) / 20
        d.stop()
        await task
        return (cpu1 - cpu0, sys1 - sys0, wall1 - wall0, measured, before_calls, after_calls, main_prof, full_each,
                event_each, signals_read)

    cpu, sys_cpu, wall, measured, c0, c1, main_prof, full_each, event_each, signals_read = asyncio.run(main())
    server.close()
    buf = io.StringIO()
    stats = pstats.Stats(main_prof, stream=buf)
    for p in profiles:
        stats.add(p)
    # The loop's own frames and its wait in epoll would head the list: leave them out.
    texts = []
    for order in ("cumulative", "tottime"):
        buf.seek(0)
        buf.truncate()
        stats.strip_dirs().sort_stats(order).print_stats(args.top + len(LOOP_FRAMES))
        text = buf.getvalue()
        text = text[text.find("   ncalls"):] if "   ncalls" in text else text
        lines = [ln for ln in text.splitlines() if not any(f in ln for f in LOOP_FRAMES)]
        texts.append(f"sorted by {order}:\n" + "\n".join(lines[:args.top + 1]))
    text = "\n\n".join(texts)
    result = {"speed": speed, "watch_every": args.watch_every,
              "window": {"seconds": wall, "cpu_s": cpu, "sys_cpu_s": sys_cpu,
                         "dbus_calls": c1[0] - c0[0], "writes": c1[1] - c0[1]},
              "full_resync_every": agenda_mod.FULL_RESYNC_EVERY, "full_resync_cpu_s": full_each,
              "event_full_resync_cpu_s": event_each, "signals_read_s": signals_read,
              "activities": measured, "other_cpu_s": cpu - sum(a["cpu_s"] for a in measured.values()),
              "gc": {str(g): {"count": n, "cpu_s": t} for g, (n, t) in gc_cpu.items()},
              "profile_seconds": args.profile_idle, "profile": text.rstrip()}
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--idle", type=float, default=120.0, help="seconds of the measured idle window")
    ap.add_argument("--profile-idle", type=float, default=60.0, help="seconds of the profiled idle window")
    ap.add_argument("--speed", type=float, default=1.0, help="divide the daemon's intervals by this")
    ap.add_argument("--top", type=int, default=25, help="functions to print from the profile")
    ap.add_argument("--scrape", type=float, default=30.0, help="scrape /metrics every this many seconds (0: never)")
    ap.add_argument("--no-pod-signals", action="store_true",
                    help="run without the protection signals (the pod and QoS slices' files), for comparison")
    ap.add_argument("--watch-every", type=float, default=0.0,
                    help="read the upper slices' cgroups every this many seconds for good (0: the daemon's own)")
    ap.add_argument("--lending", action="store_true",
                    help="TieredReservation, bestEffortCeiling, burstableHigh and lending on (issue 44): the lines"
                         " follow usage, every Guaranteed and Burstable pod's cgroup read at each look")
    ap.add_argument("--json", help="also write the raw results here")
    ap.add_argument("--render", metavar="JSON", help="print the report of saved results (--json) and exit")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--bus", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--cgroup", help=argparse.SUPPRESS)
    ap.add_argument("--metrics-port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.render:
        with open(args.render) as f:
            report(json.load(f))
        return 0
    return child(args) if args.child else parent(args)


if __name__ == "__main__":
    sys.exit(main())
