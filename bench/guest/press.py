#!/usr/bin/python3
"""Outside pressure for the lent-protection benchmark (bench/scenarios/61-lent.py): run in a
transient service in system.slice, outside kubepods. Allocates anonymous memory (touched) in
CHUNK steps until kubepods.slice's memory.events `low` counter rises (the kernel reclaimed a
cgroup under kubepods below its effective memory.low: protection breached) or until it holds
`cap` MiB; after every step it notes each watched cgroup's page cache (memory.stat `file`).
Writes the trace to `out` and then holds its memory until stopped.

    press.py OUT CAP_MIB WATCH_JSON    WATCH_JSON: {"label": "/sys/fs/cgroup/...", ...}
"""
import json
import os
import sys
import time

CHUNK = 4 << 20
out, cap, watch = sys.argv[1], int(sys.argv[2]) << 20, json.loads(sys.argv[3])
EVENTS = "/sys/fs/cgroup/kubepods.slice/memory.events"


def low():
    with open(EVENTS) as f:
        return next(int(line.split()[1]) for line in f if line.startswith("low "))


def files():
    got = {}
    for label, path in watch.items():
        with open(os.path.join(path, "memory.stat")) as f:
            got[label] = next(int(line.split()[1]) for line in f if line.startswith("file "))
    return got


def save(trace, why):
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"trace": trace, "stopped": why}, f)
    os.replace(tmp, out)


held, trace = [], []
start = low()
t0 = time.monotonic()
why = "cap"
while len(held) * CHUNK < cap:
    held.append(bytearray(b"\x01") * CHUNK)
    step = {"alloc_mib": len(held) * CHUNK >> 20, "t": round(time.monotonic() - t0, 2), "low": low() - start}
    step.update(files())
    trace.append(step)
    if len(held) % 8 == 0:
        save(trace, "running")
    if step["low"] > 0:
        why = "low event under kubepods.slice"
        break
save(trace, why)
while True:
    time.sleep(3600)
