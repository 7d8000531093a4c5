#!/usr/bin/python3
"""Memory hotplug through the host runner: a 512 MiB pc-dimm added over QMP shows up as memory
blocks with udev 'add' events, stays offline (Debian's default), and counts in MemTotal once
onlined (with 'online' uevents). Numbered 90+ because it leaves the guest with more memory."""
# e2e-timeout: 120
import os

import pyudev

from memqos_e2e import *

BASE = "/sys/devices/system/memory"


def mem_total_kib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1])


def blocks():
    return {e for e in os.listdir(BASE) if e.startswith("memory") and e[6:].isdigit()}


if not os.environ.get("MEMQOS_E2E_CTL"):
    skip("no control port to the host runner")

block_bytes = int(open(os.path.join(BASE, "block_size_bytes")).read().strip(), 16)
before_blocks, before_total = blocks(), mem_total_kib()
monitor = pyudev.Monitor.from_netlink(pyudev.Context())
monitor.filter_by("memory")
monitor.start()

reply = hotplug_memory(512)
check(bool(reply.get("device")), f"host hot-added {reply.get('device')}")
expected_new = (512 << 20) // block_bytes
new = wait_for(lambda: blocks() - before_blocks
               if len(blocks() - before_blocks) >= expected_new else None, 30)
check_eq(len(new or ()), expected_new, f"new memory blocks ({block_bytes >> 20} MiB each)")

events = []
while True:
    dev = monitor.poll(timeout=2)
    if dev is None:
        break
    events.append((dev.action, dev.sys_name))
check(sum(1 for a, n in events if a == "add" and n in (new or ())) == expected_new,
      f"udev add events for the new blocks: {sorted(events)}")
policy = open(os.path.join(BASE, "auto_online_blocks")).read().strip()
check_eq(mem_total_kib(), before_total if policy == "offline" else mem_total_kib(),
         f"MemTotal before onlining (auto_online_blocks={policy})")

onlined = online_memory_blocks()
check(onlined >= (expected_new if policy == "offline" else 0), f"onlined {onlined} blocks")
events = []
while True:
    dev = monitor.poll(timeout=2)
    if dev is None:
        break
    events.append((dev.action, dev.sys_name))
check(any(a == "online" for a, _ in events) or policy != "offline",
      f"udev online events: {sorted(events)}")
grown = wait_for(lambda: mem_total_kib() - before_total >= (500 << 10), 10)
check(grown, f"MemTotal grew by {(mem_total_kib() - before_total) >> 10} MiB")
