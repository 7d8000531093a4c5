#!/usr/bin/python3
"""Guest side of bench/scrape_cost.py --vm: what a scrape of /metrics costs next to its floor, on
real cgroups (kernfs) under the guest's kernel, at 110 and 500 pods, in one boot
(bench/guest/scrape_cost.py does the measuring). Writes scrape.json (artifacts).

First, what the daemon's kept descriptors rely on, on this kernel: a cgroup whose memory.events
is held open is removed all the same (rmdir succeeds), the held descriptor then fails (the
daemon drops it: no series), and a cgroup made again at the same place is read afresh."""
# e2e-timeout: 2400
import json
import os
import sys

sys.path.insert(0, os.path.join(os.environ["MEMQOS_E2E_PAYLOAD"], "bench"))
from mqbench import DAEMON, python_loop_ms, save, say, stamp, systemctl  # noqa: E402
from memqos_e2e import check, need_deb  # noqa: E402

import scrape_cost  # noqa: E402

need_deb()
P = json.load(open(os.path.join(os.environ["MEMQOS_E2E_PAYLOAD"], "bench", "params.json")))
ROOT = "/sys/fs/cgroup/memqos-bench"
OUT = {"params": P}

systemctl("stop", DAEMON)  # the installed service: nothing else of ours runs meanwhile

# ---- kept descriptors on kernfs -------------------------------------------------------------------
from memqos_systemd.cgroupfs import KeptFiles  # noqa: E402

probe = os.path.join(ROOT + "-probe")
os.makedirs(probe, exist_ok=True)
files = KeptFiles()
first = files.read(os.path.join(probe, "memory.events"))
held = len(files)
os.rmdir(probe)  # while its memory.events is open
gone = files.read(os.path.join(probe, "memory.events"))
os.makedirs(probe)
again = files.read(os.path.join(probe, "memory.events"))
os.rmdir(probe)
OUT["kept_descriptors"] = {"first": (first or b"").decode(), "held": held, "after_rmdir": gone is None,
                           "made_again": (again or b"").decode()}
check(first is not None and first.startswith(b"low ") and held == 1,
      f"kernfs: memory.events read and its descriptor kept ({held})")
check(gone is None and not os.path.exists(probe),
      "kernfs: rmdir of a cgroup whose memory.events is held open succeeds, and the held descriptor then fails")
check(again is not None and again.startswith(b"low "), "kernfs: a cgroup made again at the same place is read afresh")

# ---- the scrapes ----------------------------------------------------------------------------------
OUT["python_loop_ms"] = python_loop_ms()  # against the host's: the TCG factor
OUT.update(scrape_cost.run(ROOT, P["pods"], P["configs"], P["scrapes"], P["rounds"], True, stamp=stamp, log=say,
                           saved=lambda out: save("scrape.json", {**OUT, **out})))
save("scrape.json", OUT)
for n, configs in OUT["results"].items():
    r = configs["default"]
    say(f"{n} pods: scrape {r['scrape_s_median'] * 1e3:.1f} ms, floor read {r['floor_read_s_median'] * 1e3:.1f} ms"
        f" + write {r['floor_write_s_median'] * 1e3:.1f} ms; {r['per_pod']:.0f} series a pod")
    check(r["per_pod"] <= 12, f"{n} pods: {r['per_pod']:.0f} series a pod (at most 12)")
