#!/usr/bin/python3
"""The kubelet goes away or answers garbage: nothing in the kernel is lowered.

On the sample node (TieredReservation, effective, kubelet polled every second) the kernel holds
the plan; then, each for 4 s (4 poll intervals), with a thread reading every managed unit's
memory.min/low/high every 20 ms: the stand-in stopped (connection refused); a truncated PodList
`{"kind":"PodList","items":`; 4 KiB of random bytes; HTTP 503; an empty PodList while every pod
slice still runs, also across three daemon-reloads. No sample may show a value other than the plan's (no protection lowered, no
MemoryHigh moved), the daemon's memqos_source_errors_total grows by kind, and once the kubelet
answers properly again the values are still the plan's and a real change (a pod leaving) is
applied again."""
# e2e-timeout: 240
import os
import threading
import time

from memqos_e2e import *

need_deb()
MIB = 1 << 20
HOLD = 4.0

pods = sample_pods()
undone = fresh_node()  # a kubelet just started: its QoS slices, no pods yet
log(f"fresh node: undid {undone}")
kubelet_start(pods)
running = [start_pod(p) for p in pods]
memqos_write_config(sample_config())
check(memqos_reload(), "config: TieredReservation, effective, pollInterval 1s")
expected = plan_expected(memqos_plan())
bad, _ = wait_kernel(expected, 20)
check(not bad, f"{len(expected)} units equal plan before the faults {bad}")


class Sampler(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.samples = 0
        self.moved = []

    def run(self):
        while not self.stop.is_set():
            for m in compare_kernel(expected, kernel_memory(expected)):
                if len(self.moved) < 5:
                    self.moved.append(m)
            self.samples += 1
            time.sleep(0.02)


def errors_by_kind():
    return {l.get("kind"): v for l, v in metrics().get("memqos_source_errors_total", [])}


def serve_raw(body):
    with open(PODS_FILE + ".tmp", "wb") as f:
        f.write(body)
    os.replace(PODS_FILE + ".tmp", PODS_FILE)


def fault(what, start, stop):
    cursor = journal_cursor()
    errs0 = errors_by_kind()
    s = Sampler()
    s.start()
    start()
    time.sleep(HOLD)
    errs1 = errors_by_kind()
    stop()
    s.stop.set()
    s.join()
    grew = {k: int(v - errs0.get(k, 0)) for k, v in errs1.items() if v > errs0.get(k, 0)}
    check(not s.moved, f"{what}: nothing lowered or moved over {HOLD:.0f} s ({s.samples} samples of"
                       f" {len(expected)} units) {s.moved}")
    warned = [l for l in journal_since(cursor) if "pod source failed" in l or "holding" in l
              or "no longer listed" in l]
    return grew, warned


grew, warned = fault("kubelet stopped", kubelet_stop, kubelet_start)
check(grew, f"kubelet stopped: source errors counted {grew}; journal {warned[:1]}")

grew, warned = fault("truncated PodList", lambda: serve_raw(b'{"kind":"PodList","items":'),
                     lambda: write_pods(pods))
check(grew, f"truncated PodList: source errors counted {grew}; journal {warned[:1]}")

grew, warned = fault("random bytes", lambda: serve_raw(os.urandom(4096)), lambda: write_pods(pods))
check(grew, f"random bytes: source errors counted {grew}; journal {warned[:1]}")


def set_status(code):
    with open(PODS_FILE + ".status", "w") as f:
        f.write(str(code))


grew, warned = fault("HTTP 503", lambda: set_status(503), lambda: os.unlink(PODS_FILE + ".status"))
check(grew, f"HTTP 503: source errors counted {grew}; journal {warned[:1]}")

grew, warned = fault("empty PodList while the pod slices run", lambda: write_pods([]),
                     lambda: write_pods(pods))
check(True, f"empty PodList: errors {grew or 'none (a valid answer)'}; journal {warned[:2]}")


def empty_then_reloads():
    """The pods are carried over (their slices run); then systemd reloads three times. Each
    daemon-reload announces every unit as removed, then new, before it ends: a pod list taken
    while the daemon's cache was so emptied dropped the carried pods (f311e76)."""
    write_pods([])
    time.sleep(1.5)
    for _ in range(3):
        systemctl("daemon-reload")
        time.sleep(0.7)


# The sampler's check inside fault() is the outcome: believed, the empty list would lower the
# kubepods and QoS slices. (Its "no longer listed" warning is not logged again when the previous
# fault's list was still the last one read.)
grew, warned = fault("empty PodList, then 3 daemon-reloads", empty_then_reloads, lambda: write_pods(pods))
check(True, f"empty PodList, then daemon-reloads: errors {grew or 'none'}; journal {warned[:2]}")

# Back to normal: the plan still holds, and real changes are applied again.
bad, _ = wait_kernel(expected, 10)
check(not bad, f"kubelet healthy again: {len(expected)} units equal plan {bad}")
web = next(p for p in pods if p["metadata"]["name"] == "web")
stop_pod(web)
rest = [p for p in pods if p is not web]
write_pods(rest)
expected = plan_expected(memqos_plan())
bad, took = wait_kernel(expected, 15)
v = kernel_memory(["kubepods-burstable.slice"])["kubepods-burstable.slice"]
check(not bad, f"a pod that really left is applied {took:.1f} s later: burstable memory.low "
               f"{fmt_bytes(v and v['low'])} {bad}")
