#!/usr/bin/python3
"""Memory hotplug: capacity and allocatable-based MemoryHigh follow.

On the sample node (TieredReservation; kubeReserved 64Mi, systemReserved 96Mi, evictionHard
100Mi, so allocatable = MemTotal - 260Mi) the Burstable pod's unlimited sidecar has
memory.high = request + 0.9 * (allocatable - request). The host hot-adds a 512 MiB DIMM (QMP
device_add pc-dimm); Debian leaves its blocks offline, and MemTotal (what the daemon plans with)
only grows once they are onlined. Checked: nothing moves while the blocks are offline; after
onlining, the daemon's memqos_node_capacity_bytes is the new MemTotal, the sidecar's memory.high
in the kernel is the new value (latency measured from the end of onlining), the daemon logged the
change, and every unit equals `memqos-systemd plan` at the new MemTotal. Numbered below 80 but it
leaves the guest with the extra memory (a later reboot drops it; 90-harness-hotplug has a slot)."""
# e2e-timeout: 180
import os
import time

from memqos_e2e import *

need_deb()
if not os.environ.get("MEMQOS_E2E_CTL"):
    skip("no control port to the host runner (hot-add needs QMP)")
MIB = 1 << 20
BASE = "/sys/devices/system/memory"

cfg = pods_only_config()
pods = sample_pods()
undone = fresh_node()  # a kubelet just started: its QoS slices, no pods yet
log(f"fresh node: undid {undone}")
kubelet_start(pods)
web = None
for p in pods:
    u = start_pod(p)
    if p["metadata"]["name"] == "web":
        web = u
sidecar = web["scopes"][1]
memqos_write_config(cfg)
check(memqos_reload(), "config: TieredReservation, kubeReserved 64Mi, systemReserved 96Mi")


def want_high(capacity):
    alloc = capacity - 64 * MIB - 96 * MIB - 100 * MIB
    return (16 * MIB + 9 * (alloc - 16 * MIB) // 10) // PAGE_SIZE * PAGE_SIZE


before = mem_total_bytes()
expected = plan_expected(memqos_plan(node_memory=before))
bad, _ = wait_kernel(expected, 20)
check(not bad, f"before: {len(expected)} units equal plan at MemTotal {before} {bad}")
high0 = kernel_memory([sidecar])[sidecar]["high"]
check_eq(high0, want_high(before), "before: unlimited sidecar memory.high")
check_eq(metric("memqos_node_capacity_bytes"), float(before), "before: memqos_node_capacity_bytes")

cursor = journal_cursor()
blocks = lambda: {e for e in os.listdir(BASE) if e.startswith("memory") and e[6:].isdigit()}
old_blocks = blocks()
reply = hotplug_memory(512)
block = int(open(os.path.join(BASE, "block_size_bytes")).read().strip(), 16)
new = wait_for(lambda: blocks() - old_blocks if len(blocks() - old_blocks) >= (512 * MIB) // block
               else None, 30)
check(new, f"host hot-added {reply.get('device')}: {len(new or ())} new blocks of {block >> 20} MiB")
time.sleep(2)
check_eq(kernel_memory([sidecar])[sidecar]["high"], high0,
         f"blocks offline (MemTotal {mem_total_bytes()}): sidecar memory.high unchanged")

n = online_memory_blocks()
t_online = time.monotonic()
after = mem_total_bytes()
check(after - before >= 500 * MIB, f"onlined {n} blocks: MemTotal {before} -> {after}"
                                   f" (+{(after - before) >> 20} MiB)")
target = want_high(after)
got = wait_for(lambda: kernel_memory([sidecar])[sidecar]["high"] == target, 30, 0.02)
lat = time.monotonic() - t_online
check(got, f"after onlining: sidecar memory.high {fmt_bytes(kernel_memory([sidecar])[sidecar]['high'])}"
           f" = {target} (was {high0}) {lat:.2f} s after the blocks were online")
check_eq(metric("memqos_node_capacity_bytes"), float(after), "after: memqos_node_capacity_bytes")
check_eq(metric("memqos_node_allocatable_bytes"), float(after - 260 * MIB),
         "after: memqos_node_allocatable_bytes = MemTotal - 260Mi")
changed = [l for l in journal_since(cursor) if "node memory changed" in l]
check(changed, f"journal: {changed[:1]}")
expected = plan_expected(memqos_plan(node_memory=after))
bad, _ = wait_kernel(expected, 10)
check(not bad, f"after: {len(expected)} units equal plan at MemTotal {after} {bad}")
