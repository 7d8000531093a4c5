#!/usr/bin/python3
"""Boot ordering: with the package installed and a kubelet.service enabled, a reboot starts
memqos-systemd first and the kubelet only once the daemon is ready (its unit has
Before=kubelet.service and sends READY=1 without waiting for the kubelet), the boot does not
stall on the missing kubelet (TimeoutStartSec=60s), and the daemon re-reads when the kubelet
comes up after it. docs/PACKAGING.md item 7. Reboots once (about 30 s); the hot-added memory of
75-hotplug is gone afterwards."""
# e2e-timeout: 240
import json
import subprocess

from memqos_e2e import *

need_deb()

if boot_number() == 1:
    memqos_restore_config(reload=True)  # the shipped config, as after an install
    kubelet_enable(sample_pods())
    check_eq(systemctl("is-enabled", KUBELET_UNIT).stdout.strip(), "enabled", "kubelet.service enabled")
    check_eq(systemctl("is-enabled", MEMQOS_UNIT).stdout.strip(), "enabled", "memqos-systemd enabled")
    reboot()


def mono(unit, prop):
    return int(service_show(prop, unit) or 0) / 1e6


check(wait_for(lambda: systemctl("is-active", "-q", KUBELET_UNIT).returncode == 0, 60),
      "boot 2: kubelet.service came up")
check_eq(systemctl("is-active", MEMQOS_UNIT).stdout.strip(), "active", "boot 2: memqos-systemd active")
m_start = mono(MEMQOS_UNIT, "InactiveExitTimestampMonotonic")
m_ready = mono(MEMQOS_UNIT, "ActiveEnterTimestampMonotonic")
k_start = mono(KUBELET_UNIT, "InactiveExitTimestampMonotonic")
check(0 < m_ready <= k_start,
      f"memqos-systemd started at {m_start:.2f} s, READY (active) at {m_ready:.2f} s;"
      f" kubelet.service started at {k_start:.2f} s (after READY)")
check(m_ready - m_start < 30, f"the daemon's start took {m_ready - m_start:.2f} s with no kubelet"
                              " yet (no stall towards TimeoutStartSec=60s)")

# The same order in the journal: "ready:" before the kubelet's start job, and a re-read after it.
out = subprocess.run(["journalctl", "-b", "-o", "json", "--no-pager", "-u", MEMQOS_UNIT,
                      "-u", KUBELET_UNIT], capture_output=True, text=True).stdout
events = []
for line in out.splitlines():
    try:
        e = json.loads(line)
    except ValueError:
        continue
    msg = e.get("MESSAGE")
    if isinstance(msg, str):
        events.append((int(e["__MONOTONIC_TIMESTAMP"]) / 1e6, e.get("SYSLOG_IDENTIFIER", ""), msg))
ready = [t for t, who, m in events if who == "memqos-systemd" and m.startswith("ready:")]
# A Type=simple unit is "Started" at once; systemd logs no "Starting" line for it.
k_starting = [t for t, who, m in events if who == "systemd"
              and m.startswith(("Starting kubelet", "Started kubelet"))]
reread = [t for t, who, m in events if who == "memqos-systemd" and "kubelet.service (re)started" in m]
check(ready and k_starting and ready[0] < k_starting[0],
      f"journal: 'ready:' at {ready[:1]} s, kubelet.service started at {k_starting[:1]} s")
check(reread and k_starting and reread[0] > k_starting[0],
      f"journal: the daemon re-read units and pods after the kubelet started, at {reread[:1]} s")
p = subprocess.run(["systemd-analyze", "critical-chain", "--no-pager", KUBELET_UNIT],
                   capture_output=True, text=True)
log(p.stdout)
kubelet_disable()
