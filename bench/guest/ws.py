#!/usr/bin/python3
"""A container's workload for the protection benchmark: hold a working set, re-use it on demand.

    ws.py --ctl DIR --name NAME [--anon MIB] [--file PATH] [--oom-score-adj N]
    ws.py --ctl DIR --name NAME --hog-anon MIB [--hold S]           (a neighbour that allocates)
    ws.py --ctl DIR --name NAME --high-test MIB                     (allocate past MemoryHigh)

Waits for DIR/go (--go; so it is in its scope before it touches memory), then: allocates MIB of
anonymous memory (every page written) and reads PATH through the page cache, writes
DIR/NAME.ready, waits for DIR/reuse, then times re-touching its anonymous memory and re-reading
the file (a page cache miss is a disk read) and writes DIR/NAME.json; then sleeps.
The oom_score_adj is set as the kubelet sets it for the pod's QoS class.
"""
import argparse
import json
import mmap
import os
import sys
import time

PAGE = mmap.PAGESIZE
MIB = 1 << 20


def wait_file(path):
    while not os.path.exists(path):
        time.sleep(0.05)


def write_json(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def anon_map(size):
    # Private: Python's default (MAP_SHARED) would be shmem, counted as "file" in memory.stat.
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def touch(mm, size):
    for off in range(0, size, PAGE):
        mm[off] = 1


def read_file(path):
    n = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(MIB)
            if not b:
                return n
            n += len(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctl", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--anon", type=int, default=0)
    ap.add_argument("--file")
    ap.add_argument("--oom-score-adj", type=int)
    ap.add_argument("--hog-anon", type=int, default=0)
    ap.add_argument("--hold", type=float, default=3.0)
    ap.add_argument("--high-test", type=int, default=0)
    ap.add_argument("--go", default="go", help="the file in --ctl to wait for")
    a = ap.parse_args()
    if a.oom_score_adj is not None:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(a.oom_score_adj))
    wait_file(os.path.join(a.ctl, a.go))
    out = os.path.join(a.ctl, a.name + ".json")

    if a.hog_anon:
        # Allocate in 32 MiB chunks up to the target, then hold; progress is written as it goes
        # (the OOM killer may end us at any point).
        chunks, t0 = [], time.monotonic()
        for i in range(a.hog_anon // 32):
            mm = anon_map(32 * MIB)
            touch(mm, 32 * MIB)
            chunks.append(mm)
            write_json(out, {"allocated_mib": 32 * (i + 1), "s": time.monotonic() - t0})
        time.sleep(a.hold)
        write_json(out, {"allocated_mib": 32 * len(chunks), "s": time.monotonic() - t0, "done": True})
        return

    if a.high_test:
        # 1 MiB steps up to the target; each step's time shows where memory.high throttles.
        steps, t0, chunks = [], time.monotonic(), []
        for i in range(a.high_test):
            t = time.monotonic()
            mm = anon_map(MIB)
            touch(mm, MIB)
            chunks.append(mm)
            steps.append(round(time.monotonic() - t, 4))
            if i % 8 == 7 or i == a.high_test - 1:
                write_json(out, {"steps_s": steps, "s": time.monotonic() - t0})
        write_json(out, {"steps_s": steps, "s": time.monotonic() - t0, "done": True})
        time.sleep(3600)
        return

    t0 = time.monotonic()
    mm = None
    if a.anon:
        mm = anon_map(a.anon * MIB)
        touch(mm, a.anon * MIB)
    nbytes = read_file(a.file) if a.file else 0
    fill_s = time.monotonic() - t0
    with open(os.path.join(a.ctl, a.name + ".ready"), "w") as f:
        f.write(str(fill_s))
    wait_file(os.path.join(a.ctl, "reuse"))
    r = {"fill_s": fill_s, "file_bytes": nbytes}
    if mm is not None:
        t = time.monotonic()
        touch(mm, a.anon * MIB)
        r["anon_retouch_s"] = time.monotonic() - t
    if a.file:
        t = time.monotonic()
        read_file(a.file)
        r["file_reread_s"] = time.monotonic() - t
    write_json(out, r)
    time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
