#!/usr/bin/python3
"""The daemon's health while a neighbour presses (bench/scenarios/60-protection.py), sampled by a
process whose own memory is locked, so that its samples are not delayed by the very reclaim they
measure.

    health.py --out FILE [--interval 1] [--url URL] [--unit memqos-systemd.service]

Every --interval until SIGTERM, one JSON line per sample:
  t            CLOCK_MONOTONIC when the sample began (the journal's clock)
  metrics_s    how long GET URL took (null: it failed), metrics_err the failure
  loop_age     what /livez says: how long ago the daemon's loop last beat (every 10 s), by the
               daemon's own clock; its largest value is how late the loop ran
  wd           the unit's WatchdogTimestampMonotonic (µs): when PID 1 took its last WATCHDOG=1
  pid          its MainPID
  cur, low     the service cgroup's memory.current and memory.events `low`
  refault      its memory.stat workingset_refault_file (its own file pages read back in)
Each request runs in a thread of its own, so a slow /metrics does not delay the other samples.
"""
import argparse
import ctypes
import re
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

MCL_CURRENT, MCL_FUTURE = 1, 2
UNIT_PATH = "/org/freedesktop/systemd1/unit/"


def bus_path(unit: str) -> str:
    return UNIT_PATH + "".join(c if c.isalnum() else f"_{ord(c):02x}" for c in unit)


def props(unit: str, *names: str) -> list:
    """The unit's org.freedesktop.systemd1.Service properties, in one busctl call."""
    p = subprocess.run(["busctl", "get-property", "org.freedesktop.systemd1", bus_path(unit),
                        "org.freedesktop.systemd1.Service", *names], capture_output=True, text=True, timeout=20)
    out = []
    for line in p.stdout.splitlines():
        sig, _, v = line.partition(" ")
        out.append(v.strip().strip('"') if sig == "s" else int(v))
    return out + [None] * (len(names) - len(out))


def read_kv(path: str) -> dict:
    out = {}
    try:
        with open(path) as f:
            for line in f:
                k, _, v = line.partition(" ")
                if v.strip().isdigit():
                    out[k] = int(v)
    except OSError:
        pass
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--url", default="http://127.0.0.1:9759/metrics")
    ap.add_argument("--unit", default="memqos-systemd.service")
    ap.add_argument("--timeout", type=float, default=10.0)
    a = ap.parse_args()
    libc = ctypes.CDLL(None, use_errno=True)
    locked = libc.mlockall(MCL_CURRENT | MCL_FUTURE) == 0
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("-1000")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    out = open(a.out, "a", buffering=1)
    lock = threading.Lock()
    threading.stack_size(256 * 1024)  # every stack is locked too (MCL_FUTURE)
    (cg,) = props(a.unit, "ControlGroup")
    cgdir = "/sys/fs/cgroup" + cg if cg else None

    def emit(row):
        with lock:
            out.write(json.dumps(row) + "\n")

    livez = a.url.rsplit("/", 1)[0] + "/livez"

    def scrape(t):
        t0 = time.monotonic()
        row = {"t": t, "kind": "metrics"}
        try:
            with urllib.request.urlopen(a.url, timeout=a.timeout) as r:
                r.read()
            row["metrics_s"] = round(time.monotonic() - t0, 4)
        except Exception as e:  # a refused or timed-out scrape is what we count
            row["metrics_s"] = None
            row["metrics_err"] = f"{type(e).__name__}: {e}"[:120]
            row["after_s"] = round(time.monotonic() - t0, 4)
        try:
            with urllib.request.urlopen(livez, timeout=a.timeout) as r:
                text = r.read().decode()
        except urllib.error.HTTPError as e:  # 503: the loop has not run for a minute
            text = e.read().decode()
        except Exception:
            text = ""
        m = re.search(r"last ran ([0-9.]+) s ago", text)
        row["loop_age"] = float(m.group(1)) if m else None
        emit(row)

    emit({"t": time.monotonic(), "kind": "start", "mlockall": locked, "cgroup": cg})
    while not stop.is_set():
        t = time.monotonic()
        threading.Thread(target=scrape, args=(t,), daemon=True).start()
        row = {"t": t, "kind": "unit"}
        try:
            row["wd"], row["pid"] = props(a.unit, "WatchdogTimestampMonotonic", "MainPID")
        except (subprocess.TimeoutExpired, ValueError):
            pass
        if cgdir:
            try:
                with open(os.path.join(cgdir, "memory.current")) as f:
                    row["cur"] = int(f.read())
            except (OSError, ValueError):
                pass
            row["low"] = read_kv(os.path.join(cgdir, "memory.events")).get("low")
            row["refault"] = read_kv(os.path.join(cgdir, "memory.stat")).get("workingset_refault_file")
        row["took_s"] = round(time.monotonic() - t, 4)
        emit(row)
        stop.wait(max(0.0, a.interval - (time.monotonic() - t)))
    emit({"t": time.monotonic(), "kind": "stop"})


if __name__ == "__main__":
    main()
