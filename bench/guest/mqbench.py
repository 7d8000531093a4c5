"""Guest-side helpers of the VM benchmarks (copied into the payload as bench/; scenarios put it on
sys.path). Raw dbus-next on one connection, so bursts are pipelined; stamps for every figure."""

from __future__ import annotations

import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request

from dbus_next import BusType, Message, MessageType, Variant
from dbus_next.aio import MessageBus

from memqos_e2e import host_request

from flatkv import read_kv  # noqa: F401  (the scenarios take it from here)

SD = "org.freedesktop.systemd1"
SD_PATH = "/org/freedesktop/systemd1"
MGR = "org.freedesktop.systemd1.Manager"
CG = "/sys/fs/cgroup"
UINT64_MAX = (1 << 64) - 1
MIB = 1 << 20
CONFIG = "/etc/memqos-systemd/config.yaml"
DAEMON = "memqos-systemd.service"
METRICS_URL = "http://127.0.0.1:9759/metrics"
KUBELET_UNIT_FILE = "/run/systemd/system/kubelet.service"
PODS_FILE = "/var/lib/memqos-e2e-kubelet/pods.json"
HERE = os.path.dirname(os.path.abspath(__file__))
ARTIFACTS = os.environ.get("MEMQOS_E2E_ARTIFACTS", ".")


# Calls in flight at once on one connection. dbus-next 0.2.3 treats a full socket send buffer
# (EAGAIN) as fatal and drops the connection; ~110 StartTransientUnit calls sent at once fill it
# under TCG. 32 in flight never did, and keeps systemd's queue full all the same.
WINDOW = 32


def say(*a):
    print(*a, file=sys.stderr, flush=True)


def now() -> float:
    return time.monotonic()


def stamp(what: str) -> dict:
    """Host and guest load average at this moment (the host answers over the control port)."""
    try:
        host = host_request("bench-host", timeout=10, what=what)
        host = {k: host[k] for k in ("load", "other_qemu", "t") if k in host}
    except Exception as e:  # the figure is still worth keeping
        host = {"error": str(e)}
    with open("/proc/loadavg") as f:
        guest = [float(x) for x in f.read().split()[:3]]
    return {"what": what, "host": host, "guest": guest}


def percentile(values, q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    v = sorted(values)
    if not v:
        return float("nan")
    k = (len(v) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def summary(values) -> dict:
    return {"n": len(values), "p50": percentile(values, 0.5), "p99": percentile(values, 0.99),
            "max": max(values) if values else float("nan"), "mean": statistics.fmean(values) if values else float("nan")}


def python_loop_ms() -> float:
    """Same loop as bench/vmbench.py runs on the host: the guest/host ratio is the TCG factor."""
    code = "s = 0\nfor i in range(300000):\n    s += i * i\n"
    times = []
    for _ in range(7):
        t = time.perf_counter()
        exec(code, {})
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


# --------------------------------------------------------------------------- D-Bus

def v_props(props: dict) -> list:
    sigs = {"Description": "s", "Slice": "s", "Wants": "as", "DefaultDependencies": "b", "Delegate": "b",
            "MemoryAccounting": "b", "CPUAccounting": "b", "IOAccounting": "b", "TasksAccounting": "b",
            "PIDs": "au", "MemoryMin": "t", "MemoryLow": "t", "MemoryHigh": "t", "MemoryMax": "t",
            "MemorySwapMax": "t"}
    return [[k, Variant(sigs[k], v)] for k, v in props.items()]


class Bus:
    def __init__(self):
        self.bus = None

    async def connect(self):
        self.bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
        return self

    async def call(self, member, sig="", body=(), path=SD_PATH, iface=MGR, dest=SD):
        r = await self.bus.call(Message(destination=dest, path=path, interface=iface, member=member,
                                        signature=sig, body=list(body)))
        if r.message_type == MessageType.ERROR:
            raise RuntimeError(f"{member} {body[:1]}: {r.error_name}: {r.body[0] if r.body else ''}")
        return r.body

    async def many(self, calls, ok_errors=(), window=WINDOW):
        """Pipelined: up to `window` calls in flight on the one connection (see WINDOW)."""
        sem = asyncio.Semaphore(window)

        async def one(c):
            async with sem:
                return await self.call(*c)

        res = await asyncio.gather(*(one(c) for c in calls), return_exceptions=True)
        errs = [r for r in res if isinstance(r, Exception) and not any(e in str(r) for e in ok_errors)]
        if errs:
            raise RuntimeError(f"{len(errs)} of {len(calls)} calls failed, first: {errs[0]}")
        return res

    async def set_props(self, items, runtime=True):
        """items: [(unit, {prop: value})], pipelined."""
        return await self.many([("SetUnitProperties", "sba(sv)", [u, runtime, v_props(p)]) for u, p in items])

    async def list_units(self, patterns, states=()):
        (rows,) = await self.call("ListUnitsByPatterns", "asas", [list(states), list(patterns)])
        return [r[0] for r in rows]

    async def start_slices(self, names):
        calls = []
        for n in names:
            parent = n[: -len(".slice")].rsplit("-", 1)[0] + ".slice"
            props = {"Description": f"libcontainer container {n[:-6]}", "Wants": [parent],
                     "DefaultDependencies": False, "MemoryAccounting": True, "CPUAccounting": True,
                     "IOAccounting": True, "TasksAccounting": True}
            calls.append(("StartTransientUnit", "ssa(sv)a(sa(sv))", [n, "fail", v_props(props), []]))
        return await self.many(calls)

    async def stop_units(self, names):
        await self.many([("StopUnit", "ss", [n, "replace"]) for n in names], ok_errors=("NoSuchUnit", "not loaded"))

    async def wait_active(self, pattern, n, timeout=300):
        deadline = now() + timeout
        while now() < deadline:
            if len(await self.list_units([pattern], ["active"])) >= n:
                return True
            await asyncio.sleep(0.5)
        raise RuntimeError(f"fewer than {n} {pattern} active after {timeout} s")

    async def wait_gone(self, pattern, timeout=300):
        deadline = now() + timeout
        while now() < deadline:
            left = await self.list_units([pattern])
            if not left:
                return
            await asyncio.sleep(0.5)
        raise RuntimeError(f"{len(left)} {pattern} still loaded after {timeout} s")


async def ensure_qos_slices(bus: Bus):
    for name in ("kubepods.slice", "kubepods-burstable.slice", "kubepods-besteffort.slice"):
        if await bus.list_units([name], ["active"]):
            continue
        try:
            await bus.start_slices([name])
        except RuntimeError as e:
            if "exists" not in str(e):
                raise
    await bus.wait_active("kubepods-besteffort.slice", 1, 60)


# --------------------------------------------------------------------------- names and files

def pod_slice(uid: str, qos: str = "Burstable") -> str:
    tier = {"Guaranteed": "", "Burstable": "burstable", "BestEffort": "besteffort"}[qos]
    u = uid.replace("-", "_")
    return f"kubepods-{tier}-pod{u}.slice" if tier else f"kubepods-pod{u}.slice"


def slice_dir(name: str) -> str:
    """cgroup directory of a slice from its name (kubepods-burstable-podX.slice -> .../kubepods.slice/
    kubepods-burstable.slice/kubepods-burstable-podX.slice)."""
    parts = name[: -len(".slice")].split("-")
    path = [("-".join(parts[: i + 1])) + ".slice" for i in range(len(parts))]
    return os.path.join(CG, *path)


def read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            t = f.read().strip()
    except OSError:
        return None
    return UINT64_MAX if t == "max" else int(t)


# --------------------------------------------------------------------------- kubelet stand-in, daemon

def write_pods(pods):
    os.makedirs(os.path.dirname(PODS_FILE), exist_ok=True)
    tmp = PODS_FILE + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": list(pods)}, f)
    os.replace(tmp, PODS_FILE)


def kubelet_unit():
    """The e2e kubelet stand-in as kubelet.service, whose start job ends only once /pods answers
    (so 'kubelet started' is the moment its pods can be read, as for a real kubelet)."""
    stub = os.path.join(os.environ["MEMQOS_E2E_GUEST"], "kubelet_stub.py")
    text = f"""[Unit]
Description=kubelet stand-in (memqos bench)

[Service]
Type=exec
ExecStart=/usr/bin/python3 {stub} --pods-file {PODS_FILE} --address 127.0.0.1 --port 10255
ExecStartPost=/bin/bash -c 'for i in $(seq 1200); do (echo > /dev/tcp/127.0.0.1/10255) 2>/dev/null && exit 0; sleep 0.05; done; exit 1'
KillMode=mixed
"""
    try:
        same = open(KUBELET_UNIT_FILE).read() == text
    except OSError:
        same = False
    if not same:
        with open(KUBELET_UNIT_FILE, "w") as f:
            f.write(text)
        subprocess.run(["systemctl", "daemon-reload"], check=True)


def systemctl(*args, check=True):
    return subprocess.run(["systemctl", *args], check=check, capture_output=True, text=True)


def write_config(**keys):
    """The daemon's config: the .deb's defaults plus `keys` (YAML, flat or one level deep)."""
    lines = ["# written by the memqos benchmark"]
    for k, v in keys.items():
        if isinstance(v, dict):
            lines.append(f"{k}:")
            lines += [f"  {kk}: {vv}" for kk, vv in v.items()]
        else:
            lines.append(f"{k}: {v}")
    with open(CONFIG, "w") as f:
        f.write("\n".join(lines) + "\n")


def daemon_pid() -> int:
    out = systemctl("show", "-p", "MainPID", "--value", DAEMON).stdout.strip()
    return int(out or 0)


def metrics() -> dict:
    """{'name{labels}': value} from the daemon's /metrics."""
    with urllib.request.urlopen(METRICS_URL, timeout=30) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        k, _, v = line.rpartition(" ")
        try:
            out[k] = float(v)
        except ValueError:
            pass
    return out


def metric_sum(m: dict, name: str, **labels) -> float:
    total = 0.0
    for k, v in m.items():
        base, _, rest = k.partition("{")
        if base != name:
            continue
        have = labels_of(k)
        if all(have.get(lk) == lv for lk, lv in labels.items()):
            total += v
    return total


LABEL_RE = re.compile(r'(\w+)="([^"]*)"')


def labels_of(key: str) -> dict:
    return dict(LABEL_RE.findall(key.partition("{")[2]))


def desired(m: dict) -> dict:
    """{(unit, property): bytes (inf for infinity)} from memqos_unit_desired_bytes."""
    out = {}
    for k, v in m.items():
        if k.startswith("memqos_unit_desired_bytes{"):
            lab = labels_of(k)
            out[(lab.get("unit"), lab.get("property"))] = v
    return out


def journal_since(unit: str, since_mono: float) -> list[tuple[float, str]]:
    """(monotonic seconds, message) of the unit's journal entries after since_mono."""
    return journal(["-u", unit], since_mono)


def journal(select: list[str], since_mono: float = 0.0) -> list[tuple[float, str]]:
    """(monotonic seconds, message) of this boot's journal entries that `select` picks (journalctl
    options: ["-u", unit], ["-k"]) after since_mono."""
    p = subprocess.run(["journalctl", "-b", *select, "-o", "json", "--no-pager",
                        "--output-fields=MESSAGE,__MONOTONIC_TIMESTAMP"], capture_output=True, text=True)
    out = []
    for line in p.stdout.splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        t = int(e.get("__MONOTONIC_TIMESTAMP", 0)) / 1e6
        msg = e.get("MESSAGE")
        if isinstance(msg, list):
            msg = bytes(msg).decode(errors="replace")
        if t >= since_mono and isinstance(msg, str):
            out.append((t, msg))
    return out


APPLIED_RE = re.compile(r"reconcile: (\d+) change\(s\) applied")


def save(name: str, data) -> str:
    path = os.path.join(ARTIFACTS, name)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    return path


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict:
    """{"<tid> <comm>": CPU seconds} for every thread of pid."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1: raw.rindex(")")]
        fields = raw.rsplit(")", 1)[1].split()
        out[f"{tid} {comm}"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def pid_of(unit: str) -> int:
    out = systemctl("show", "-p", "MainPID", "--value", unit, check=False).stdout.strip()
    return int(out or 0)


def proc_status(pid: int) -> dict:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if v.strip().endswith(" kB"):
                out[k] = int(v.split()[0]) * 1024
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    out["Pss"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out
