#!/usr/bin/python3
"""What one scrape of the daemon's /metrics costs, next to its floor, at N pods; natively (the
cgroup files as regular files) or in the e2e guest (real cgroups under /sys/fs/cgroup).

    python3 scrape_cost.py --root DIR --pods 110,500 [--scrapes K] [--rounds R] [--json OUT]

(bench/scrape_cost.py runs it natively, and in the VM through bench/scenarios/70-scrape.py.)

Three processes, so that each CPU figure is one process's own (getrusage / thread_time):

* the daemon's side: the real `Metrics` of memqos_systemd with a plan of N pods (28 % Guaranteed,
  50 % Burstable, 22 % BestEffort, one container each) and its cgroups, serving /metrics on
  127.0.0.1 over the real HTTP server; its CPU per scrape is the whole process's over K scrapes,
  HTTP included;
* the floor: one process that reads the same cgroup files (open, read, close) and writes as many
  text lines as the page has, as long on average (`name{n="i",pad="..."} value`, one %-format
  each, sent over a socket); its reading and its writing are timed apart; its reading is also
  timed on descriptors kept open (pread), as the daemon reads;
* this one: Prometheus' stand-in, asking as Prometheus 2.x does (Accept: OpenMetrics first,
  Accept-Encoding: gzip; a new connection per scrape, as our server closes each).

In rounds, the daemon and the floor in turn (R rounds of K each), so that both see the same
host; per figure the median of the rounds. Also: the page's lines, bytes and series (per pod,
per node), the daemon's render() alone (no HTTP), and what compressing the page would cost.
With --src DIR the daemon's side imports memqos_systemd from DIR (an older tree, for before and
after: its containers' counts are fed once, as its 15 s thread did).
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time

QOS = ("Guaranteed", "Burstable", "Burstable", "BestEffort")
GI = 1 << 30
CONFIGS = {  # name -> metrics settings (config.yaml's metrics:)
    "default": {"per_pod": True, "per_unit": False},
    "perPod: false": {"per_pod": False, "per_unit": False},
    "perUnit: true": {"per_pod": True, "per_unit": True},
}
HEADERS = {"Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
           "Accept-Encoding": "gzip", "User-Agent": "Prometheus/2.42.0", "X-Prometheus-Scrape-Timeout-Seconds": "10"}


def cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# ------------------------------------------------------------------ the node

def node_plan(n: int):
    """The plan of n pods, one container each (memqos_systemd's own plan())."""
    from memqos_systemd.config import Config
    from memqos_systemd.plan import NodeFacts, plan
    from memqos_systemd.pods import Container, Pod

    pods = []
    for i in range(n):
        qos = QOS[i % len(QOS)]
        request, limit = {"Guaranteed": (GI // 2, GI // 2), "Burstable": ((64 + i) << 20, GI), "BestEffort": (0, None)}[qos]
        pods.append(Pod(f"6a4f2e3b-1c9d-4a5e-8f7b-{i:012x}", "prod", f"app-{i:03d}-7c9f8d6b5-x{i:04x}", qos,
                        (Container(f"app-{i}", "app", request, limit, f"containerd://{i:064x}"),)))
    return plan(pods, NodeFacts(64 * GI), Config(memory_reservation_policy="TieredReservation"))


def cgroup_dirs(root: str, p) -> list[tuple[str, str]]:
    """(level, directory) of the node, QoS, pod and container cgroups, parents first."""
    paths = p.cgroup_paths
    node = p.node_unit().unit
    return [("qos" if u.unit == node else u.level, os.path.join(root, paths[u.unit])) for u in p.units
            if u.level in ("qos", "pod", "container") or u.unit == node]


def make_node(root: str, p, real: bool) -> list[str]:
    """The cgroups of plan p under root: real ones (mkdir in the cgroup2 tree, the memory
    controller enabled on the way down), or directories with the kernel's files written."""
    made, enabled = [], set()
    for i, (level, d) in enumerate(cgroup_dirs(root, p)):
        if real:
            parent = os.path.dirname(d)
            if parent not in made:  # the top (root); the others come before their children
                os.makedirs(parent, exist_ok=True)
                made.append(parent)
            if parent not in enabled:  # its children get the memory controller's files
                with open(os.path.join(parent, "cgroup.subtree_control"), "w") as f:
                    f.write("+memory")
                enabled.add(parent)
            os.makedirs(d, exist_ok=True)
            made.append(d)
            continue
        write_kernel_files(d, i)
        made.append(d)
    return made


def write_kernel_files(d: str, i: int) -> None:
    """What the kernel shows in a cgroup's memory.events, memory.current and memory.pressure (the
    i-th cgroup's numbers), as regular files in directory d (made if need be)."""
    os.makedirs(d, exist_ok=True)
    files = {"memory.events": f"low {i * 37}\nhigh {i}\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
             "memory.current": f"{(100 + i) << 20}\n",
             "memory.pressure": f"some avg10=0.00 avg60=0.00 avg300=0.00 total={i * 1234567}\n"
                                f"full avg10=0.00 avg60=0.00 avg300=0.00 total={i * 234567}\n"}
    for name, text in files.items():
        with open(os.path.join(d, name), "w") as f:
            f.write(text)


def remove_node(made: list[str]) -> None:
    for d in sorted(set(made), key=lambda x: -x.count("/")):
        try:
            os.rmdir(d)
        except OSError:
            pass


def files_read(root: str, p, settings: dict) -> list[str]:
    """The files one scrape reads (what the floor reads): memory.events, memory.pressure and
    memory.current of the pod and QoS slices (the pods' with per_pod), memory.events of the
    container scopes (with per_unit)."""
    out = []
    for level, d in cgroup_dirs(root, p):
        if level == "qos" or (level == "pod" and settings["per_pod"]):
            out += [os.path.join(d, f) for f in ("memory.events", "memory.pressure", "memory.current")]
        elif level == "container" and settings["per_pod"] and settings["per_unit"]:
            out.append(os.path.join(d, "memory.events"))
    return out


# ------------------------------------------------------------------ the daemon's side

def serve(args) -> int:
    if args.src:
        sys.path.insert(0, args.src)
    import inspect

    from memqos_systemd.cgroupfs import Cgroupfs
    from memqos_systemd.metrics import Metrics

    settings = json.loads(args.settings)
    room_to_keep_files()
    p = node_plan(args.n)
    m = Metrics()
    fs = Cgroupfs(args.root)
    if "settings" in inspect.signature(m.set_plan).parameters:
        from memqos_systemd.config import MetricsConfig
        m.set_plan(p, fs, MetricsConfig(per_pod=settings["per_pod"], per_unit=settings["per_unit"]))
    else:  # an older tree: containers' memory.events fed by its 15 s thread, once here
        fs.place(p)
        m.set_plan(p, fs)
        from memqos_systemd.cgroupfs import read_memory_events
        for u in p.units:
            if u.level == "container":
                m.throttle_events(u.unit, read_memory_events(fs.dir_of(u.unit)).get("high", 0))
    # What a running daemon has counted by then.
    for method in ("GetAll", "ListUnitsByPatterns", "SetUnitProperties", "GetUnit"):
        m.dbus_call(method, "ok")
    for _ in range(20):
        m.observe_reconcile(0.004, 0)
    m.source_success()
    m.round_state(0, False)
    m.set_ready()
    server = m.serve("127.0.0.1:0")
    print(server.port, flush=True)
    for line in sys.stdin:
        cmd, *rest = line.split()
        if cmd == "cpu":
            print(cpu(), flush=True)
        elif cmd == "render":
            k = int(rest[0])
            t = time.thread_time()
            for _ in range(k):
                m.render()
            print((time.thread_time() - t) / k, flush=True)
    server.close()
    return 0


# ------------------------------------------------------------------ the floor

def room_to_keep_files() -> None:
    """The packaged unit's LimitNOFILE= (units/memqos-systemd.service): room to keep every file open."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < 16384:
        resource.setrlimit(resource.RLIMIT_NOFILE, (16384 if hard == resource.RLIM_INFINITY else min(hard, 16384), hard))


def floor(args) -> int:
    settings = json.loads(args.settings)
    room_to_keep_files()  # for its reading with pread
    paths = files_read(args.root, node_plan(args.n), settings)
    out = socket.socket(fileno=args.sock)
    kept = {}
    print(len(paths), flush=True)
    for line in sys.stdin:
        cmd, k, lines, size = line.split()
        k, lines, size = int(k), int(lines), int(size)
        # Lines as long as the page's on average: `memqos_floor_line{n="i",pad="..."} value`.
        pad = b"x" * max(0, size // lines - len(b'memqos_floor_line{n="1000",pad=""} 1000\n'))
        read_s = write_s = 0.0
        for _ in range(k):
            t0 = time.thread_time()
            raws = []
            if cmd == "pread":  # the same files on descriptors kept open: what the daemon does
                for path in paths:
                    fd = kept.get(path)
                    if fd is None:
                        fd = kept[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                    raws.append(os.pread(fd, 4096, 0))
            else:
                for path in paths:
                    try:
                        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                        try:
                            raws.append(os.read(fd, 4096))
                        finally:
                            os.close(fd)
                    except OSError:
                        raws.append(b"")
            t1 = time.thread_time()
            nr = len(raws)
            page = b"".join([b'memqos_floor_line{n="%d",pad="%s"} %d\n' % (i, pad, len(raws[i % nr]))
                             for i in range(lines)])
            out.sendall(page)
            t2 = time.thread_time()
            read_s += t1 - t0
            write_s += t2 - t1
        print(json.dumps({"read": read_s / k, "write": write_s / k}), flush=True)
    return 0


# ------------------------------------------------------------------ this side: the scraper

class Child:
    def __init__(self, argv, **kw):
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, **kw)
        self.first = self.p.stdout.readline().strip()

    def ask(self, line: str) -> str:
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=60)


def scrape(port: int) -> bytes:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        c.request("GET", "/metrics", headers=HEADERS)
        r = c.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError(f"/metrics answered {r.status}")
        # An older tree (prometheus_client's own app) compresses when asked, as Prometheus asks.
        return gzip.decompress(body) if r.getheader("Content-Encoding") == "gzip" else body
    finally:
        c.close()


def page_stats(page: bytes, n: int) -> dict:
    """Lines, bytes and series of a page: per pod (the series naming one pod), per node (all)."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = [s for f in text_string_to_metric_families(page.decode()) for s in f.samples]
    # A pod's: those naming it, and (metrics.perUnit) its slice's and containers' desired values.
    pod = [s for s in samples if "pod" in s.labels or s.labels.get("level") in ("pod", "container")]
    by_family: dict[str, int] = {}
    for s in samples:
        by_family[s.name] = by_family.get(s.name, 0) + 1
    return {"lines": page.count(b"\n"), "bytes": len(page), "series": len(samples),
            "pod_series": len(pod), "per_pod": len(pod) / n if n else 0.0,
            "node_series": len(samples) - len(pod), "families": by_family}


def measure(root: str, n: int, name: str, settings: dict, k: int, rounds: int, src: str | None,
            stamp=lambda what: None) -> dict:
    extra = ["--src", src] if src else []
    daemon = Child(["--serve", "--root", root, "--n", str(n), "--settings", json.dumps(settings), *extra])
    port = int(daemon.first)
    a, b = socket.socketpair()
    drained = threading.Thread(target=lambda: [None for _ in iter(lambda: a.recv(1 << 20), b"")], daemon=True)
    drained.start()
    fl = Child(["--floor", "--root", root, "--n", str(n), "--settings", json.dumps(settings),
                "--sock", str(b.fileno())], pass_fds=(b.fileno(),))
    b.close()
    try:
        page = scrape(port)
        stats = page_stats(page, n)
        for _ in range(3):  # warm both
            scrape(port)
        shape = f"{stats['lines']} {stats['bytes']}"
        fl.ask(f"run 3 {shape}")
        res = {"scrape_s": [], "floor_read_s": [], "floor_write_s": [], "floor_pread_s": [], "render_s": [],
               "load": []}
        for _ in range(rounds):
            c0 = float(daemon.ask("cpu"))
            for _ in range(k):
                scrape(port)
            res["scrape_s"].append((float(daemon.ask("cpu")) - c0) / k)
            f = json.loads(fl.ask(f"run {k} {shape}"))
            res["floor_read_s"].append(f["read"])
            res["floor_write_s"].append(f["write"])
            res["floor_pread_s"].append(json.loads(fl.ask(f"pread {k} {shape}"))["read"])
            res["render_s"].append(float(daemon.ask(f"render {k}")))
            res["load"].append(os.getloadavg()[0])
        t = time.thread_time()
        for _ in range(10):
            gzip.compress(page)
        res["gzip_s"] = (time.thread_time() - t) / 10
        res["gzip_bytes"] = len(gzip.compress(page))
        res.update(stats, files=int(fl.first), settings=settings, stamp=stamp(f"scrape {name} {n} pods"))
        for key in ("scrape_s", "floor_read_s", "floor_write_s", "floor_pread_s", "render_s"):
            res[key + "_median"] = statistics.median(res[key])
        return res
    finally:
        daemon.close()
        fl.close()
        a.close()


def run(root: str, pods: list[int], configs: list[str], k_per_100: int, rounds: int, real: bool,
        src: str | None = None, stamp=lambda what: None, log=lambda msg: None, saved=lambda out: None) -> dict:
    """Every (pods, config) measured in turn; the node's cgroups made for each pod count and
    removed after; `saved(out)` after each."""
    out = {"real_cgroups": real, "root": root, "results": {}}
    for n in pods:
        p = node_plan(n)
        made = make_node(root, p, real)
        try:
            k = max(5, k_per_100 * 100 // n)
            for name in configs:
                log(f"{n} pods, {name}: {rounds} rounds of {k} scrapes")
                out["results"].setdefault(str(n), {})[name] = measure(root, n, name, CONFIGS[name], k, rounds, src,
                                                                      stamp)
                saved(out)
        finally:
            remove_node(made)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", help="where the node's cgroups are made (a directory; under /sys/fs/cgroup: real ones)")
    ap.add_argument("--pods", default="110,500")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="of: " + ", ".join(CONFIGS))
    ap.add_argument("--scrapes", type=int, default=100, help="scrapes per round at 100 pods (scaled by 100/N)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--src", help="import memqos_systemd from this tree in the daemon's process")
    ap.add_argument("--json")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--floor", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--settings", help=argparse.SUPPRESS)
    ap.add_argument("--sock", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args)
    if args.floor:
        return floor(args)
    root = os.path.abspath(args.root)
    real = root.startswith("/sys/fs/cgroup/")
    r = run(root, [int(x) for x in args.pods.split(",")], args.configs.split(","), args.scrapes, args.rounds, real,
            args.src, log=lambda msg: print(msg, file=sys.stderr, flush=True))
    text = json.dumps(r, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
