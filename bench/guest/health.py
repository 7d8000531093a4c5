#!/usr/bin/python3
"""The daemon's health while a neighbour presses (bench/scenarios/60-protection.py), sampled by a
small process whose memory is locked, so that its samples are not delayed by the very reclaim
they measure (mlockall with MCL_ONFAULT: only the pages it touches, a few MiB; plain sockets,
no urllib, so as not to load more than it needs).

    health.py --out FILE [--interval 1] [--port 9759] [--unit memqos-systemd.service]

Two loops, so that one that waits does not hold up the other, each one JSON line a sample:
  kind "http", every --interval, the next one at once if a request took longer:
    t          CLOCK_MONOTONIC when it began (the journal's clock)
    metrics_s  how long GET /metrics took to its last byte (null: it failed; metrics_err why)
    loop_age   what GET /livez said: how long ago the daemon's loop last beat (every 10 s), by
               the daemon's own clock; its largest value is how late the loop ran
    livez_s    how long GET /livez took (the same server, nothing collected)
  kind "unit", every --interval (a busctl call waits for PID 1, which stalls under pressure):
    wd         the unit's WatchdogTimestampMonotonic (µs): when PID 1 took its last WATCHDOG=1
    pid        its MainPID
    cur, low   the service cgroup's memory.current and memory.events `low`
    refault    its memory.stat workingset_refault_file (its own file pages read back in)
    took_s     how long the sample took
"""
import argparse
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

from flatkv import read_kv

MCL_CURRENT, MCL_FUTURE, MCL_ONFAULT = 1, 2, 4
UNIT_PATH = "/org/freedesktop/systemd1/unit/"


def bus_path(unit: str) -> str:
    return UNIT_PATH + "".join(c if c.isalnum() else f"_{ord(c):02x}" for c in unit)


def props(unit: str, *names: str) -> list:
    """The unit's org.freedesktop.systemd1.Service properties, in one busctl call."""
    p = subprocess.run(["busctl", "get-property", "org.freedesktop.systemd1", bus_path(unit),
                        "org.freedesktop.systemd1.Service", *names], capture_output=True, text=True, timeout=60)
    out = []
    for line in p.stdout.splitlines():
        sig, _, v = line.partition(" ")
        out.append(v.strip().strip('"') if sig == "s" else int(v))
    return out + [None] * (len(names) - len(out))


def get(port: int, path: str, timeout: float) -> tuple[int, bytes]:
    """HTTP/1.0 GET on 127.0.0.1: (status, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
        chunks = []
        while True:
            b = s.recv(65536)
            if not b:
                break
            chunks.append(b)
    raw = b"".join(chunks)
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--port", type=int, default=9759)
    ap.add_argument("--unit", default="memqos-systemd.service")
    ap.add_argument("--timeout", type=float, default=10.0)
    a = ap.parse_args()
    threading.stack_size(256 * 1024)  # a locked process: small stacks
    libc = ctypes.CDLL(None, use_errno=True)
    locked = libc.mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT) == 0
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("-1000")
    except OSError:  # not root (a test run on a workstation): the samples are still worth having
        pass
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    out = open(a.out, "a", buffering=1)
    lock = threading.Lock()
    (cg,) = props(a.unit, "ControlGroup")
    cgdir = "/sys/fs/cgroup" + cg if cg else None

    def emit(row):
        with lock:
            out.write(json.dumps(row) + "\n")

    def http_loop():
        while not stop.is_set():
            t = time.monotonic()
            row = {"t": t, "kind": "http"}
            try:
                status, _ = get(a.port, "/metrics", a.timeout)
                row["metrics_s"] = round(time.monotonic() - t, 4) if status == 200 else None
                if status != 200:
                    row["metrics_err"] = f"HTTP {status}"
            except (OSError, ValueError, IndexError) as e:
                row["metrics_s"] = None
                row["metrics_err"] = f"{type(e).__name__}: {e}"[:120]
                row["after_s"] = round(time.monotonic() - t, 4)
            t1 = time.monotonic()
            try:
                _, body = get(a.port, "/livez", a.timeout)
                m = re.search(rb"last ran ([0-9.]+) s ago", body)
                row["loop_age"] = float(m.group(1)) if m else None
                # the same server, no collection: a slow /metrics with a quick /livez is the
                # collection's cost, both slow is the process (or the guest) not running
                row["livez_s"] = round(time.monotonic() - t1, 4)
            except (OSError, ValueError, IndexError):
                row["loop_age"] = None
            emit(row)
            stop.wait(max(0.0, a.interval - (time.monotonic() - t)))

    def unit_loop():
        while not stop.is_set():
            t = time.monotonic()
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

    emit({"t": time.monotonic(), "kind": "start", "mlockall": locked, "cgroup": cg})
    loops = [threading.Thread(target=f, daemon=True) for f in (http_loop, unit_loop)]
    for th in loops:
        th.start()
    while not stop.is_set():
        stop.wait(1.0)
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmLck", "VmRSS"):
                status[k] = int(v.split()[0]) * 1024
    emit({"t": time.monotonic(), "kind": "stop", **status})


if __name__ == "__main__":
    main()
