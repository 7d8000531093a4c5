#!/usr/bin/python3
"""Values survive what happens to systemd, the daemon and the kubelet, with no write when nothing
changed. On the sample node (TieredReservation, effective, reserved slices, kubelet polled every
second), for each event a thread reads every managed unit's memory.min/low/high every 20 ms from
just before it until the daemon has settled, and the kernel must hold the plan at every sample:
  systemctl daemon-reload, systemctl daemon-reexec (then: a new pod still gets its properties
  from UnitNew), systemctl kill -s KILL (systemd restarts it: NRestarts +1, READY again, 0
  SetUnitProperties from the new process, no "reconcile:" line; a new pod still works),
  systemctl restart (0 writes), systemctl restart kubelet (the daemon re-reads; 0 writes) and
  the kubelet down for 3 s. After the daemon-reload, at most one GetAll per unit. SetUnitProperties are counted from the daemon's metrics
  (memqos_dbus_calls_total{method="SetUnitProperties"}) and its journal."""
# e2e-timeout: 300
import os
import threading
import time

from memqos_e2e import *

need_deb()
MIB = 1 << 20

pods = sample_pods()
start_sample_node(pods, reserved=True)
memqos_write_config(sample_config())
check(memqos_reload(), "config: TieredReservation, effective, reserved slices, pollInterval 1s")
expected = plan_expected(memqos_plan())
bad, took = wait_kernel(expected, 20)
check(not bad, f"{len(expected)} units equal plan before the events {bad}")


class Sampler(threading.Thread):
    def __init__(self, expected):
        super().__init__(daemon=True)
        self.expected = expected
        self.stop = threading.Event()
        self.samples = 0
        self.moved = []

    def run(self):
        while not self.stop.is_set():
            obs = kernel_memory(self.expected)
            self.samples += 1
            for m in compare_kernel(self.expected, obs):
                if len(self.moved) < 5:
                    self.moved.append(m)
            time.sleep(0.02)


def set_calls():
    return metric("memqos_dbus_calls_total", method="SetUnitProperties")


def repair(what):
    """An earlier step left something wrong (reported there): make the daemon re-read everything
    (a reload does) so the next step measures only itself."""
    if compare_kernel(expected):
        log(f"before {what}: kernel != plan {compare_kernel(expected)}; reloading the daemon")
        memqos_reload()
        bad, _ = wait_kernel(expected, 15)
        if bad:
            log(f"still {bad}")


def event(what, action, settle=3.0, count_writes=True):
    """Run action() with a sampler going; return the journal lines it caused."""
    repair(what)
    cursor = journal_cursor()
    before = set_calls() if count_writes else None
    s = Sampler(expected)
    s.start()
    t0 = time.monotonic()
    detail = action()
    time.sleep(settle)
    s.stop.set()
    s.join()
    lines = journal_since(cursor)
    reconciles = [l for l in lines if l.startswith("reconcile:")]
    check(not s.moved, f"{what}: {s.samples} samples in {time.monotonic() - t0:.1f} s, every unit at its"
                       f" planned min/low/high throughout {s.moved}" + (f"; {detail}" if detail else ""))
    if count_writes:
        after = set_calls()
        writes = None if after is None or before is None else after - before
        check(writes == 0 and not reconciles,
              f"{what}: SetUnitProperties sent: {writes}; reconcile lines: {reconciles}")
    return lines


def new_pod_latency(what):
    """A new Burstable pod, listed, then its slice and scope created back to back (start_pod):
    the slice's memory.low and the scope's memory.high in the kernel within 1 s."""
    global expected
    pod = make_pod(f"new-{int(time.time() * 1000) % 100000}",
                   [{"name": "app", "requests": {"memory": "8Mi"}}])
    pods.append(pod)
    write_pods(pods)
    wait_for(lambda: sum(v for _, v in metrics().get("memqos_pods", [])) == len(pods), 10, 0.2)
    expected = plan_expected(memqos_plan())
    slice_dir = slice_cgroup_dir(pod_slice_name(pod["metadata"]["uid"], "Burstable"))
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("://")[1]
    scope = f"cri-containerd-{cid}.scope"
    files = {os.path.join(slice_dir, "memory.low"): str(8 * MIB),
             os.path.join(slice_dir, scope, "memory.high"): str(expected[scope]["high"])}
    seen, appeared = {}, {}
    t0 = time.monotonic()

    def done():
        for path, want in files.items():
            if path in seen:
                continue
            try:
                with open(path) as f:
                    value = f.read().strip()
                appeared.setdefault(path, time.monotonic())
                if value == want:
                    seen[path] = time.monotonic()
            except OSError:
                pass
        return len(seen) == len(files)

    starter = threading.Thread(target=start_pod, args=(pod,), daemon=True)
    starter.start()
    wait_for(done, 10, 0.005)
    starter.join()  # one D-Bus user at a time
    # Each from its own cgroup's appearance (the scope is started after the slice is active).
    lat = [seen[p] - appeared[p] if p in seen else None for p in files]
    check(all(l is not None and l < 1.0 for l in lat),
          f"{what}: a new pod (slice + scope, back to back): slice memory.low = 8Mi "
          + (f"{lat[0] * 1000:.0f} ms" if lat[0] is not None else "NEVER (10 s)")
          + f" after its cgroup appeared, scope memory.high = {fmt_bytes(int(files[list(files)[1]]))} "
          + (f"{lat[1] * 1000:.0f} ms" if lat[1] is not None else "NEVER (10 s)")
          + f" after its cgroup appeared; {max(seen.values(), default=t0) - t0:.2f} s from the"
          f" slice's StartTransientUnit to both (kernel: {kernel_memory([scope]).get(scope)})")
    bad, _ = wait_kernel(expected, 3)
    check(not bad, f"{what}: {len(expected)} units equal plan again {bad}")


def finished_reloading(lines):
    return [l for l in lines if "finished reloading" in l or "reconnect" in l or "lost" in l]


# --- systemd ---------------------------------------------------------------------------------
# The SIGHUP above re-reads every unit after memqos_reload() returns: count from a round after it.
rounds = metric("memqos_reconcile_duration_seconds_count")
wait_for(lambda: metric("memqos_reconcile_duration_seconds_count") > rounds, 10, 0.1)
reads = metric("memqos_dbus_calls_total", method="GetAll")
lines = event("daemon-reload", lambda: systemctl("daemon-reload").returncode and "failed")
check(finished_reloading(lines), f"daemon-reload: the daemon noticed: {finished_reloading(lines)}")
# systemd announces every unit again (UnitRemoved, UnitNew) before Reloading(false); the re-read
# after it serves those UnitNew: one GetAll per unit, not two (2c46556).
reads = metric("memqos_dbus_calls_total", method="GetAll") - reads
check(reads <= len(expected), f"daemon-reload: {reads:.0f} GetAll for {len(expected)} units (at most one each)")

lines = event("daemon-reexec", lambda: systemctl("daemon-reexec").returncode and "failed", settle=4)
check(True, f"daemon-reexec: the daemon logged {[l[:100] for l in lines][:4]}")
new_pod_latency("after daemon-reexec")

# --- the daemon ------------------------------------------------------------------------------
pid0, nr0 = int(service_show("MainPID")), int(service_show("NRestarts"))


def kill9():
    systemctl("kill", "-s", "KILL", MEMQOS_UNIT)
    back = wait_for(lambda: service_show("ActiveState") == "active" and
                    int(service_show("MainPID") or 0) not in (0, pid0), 60, 0.2)
    return f"back after {'restart' if back else 'NOT restarted'}"


repair("kill -9")
cursor = journal_cursor()
lines = event("kill -9 of the daemon", kill9, settle=4, count_writes=False)
pid1, nr1 = int(service_show("MainPID")), int(service_show("NRestarts"))
check(pid1 != pid0 and nr1 == nr0 + 1, f"systemd restarted it: MainPID {pid0} -> {pid1},"
                                       f" NRestarts {nr0} -> {nr1}")
ready = [l for l in journal_since(cursor) if l.startswith("ready:")]
check(ready, f"READY again: {ready[:1]}")
calls = metrics().get("memqos_dbus_calls_total", [])
sets = sum(v for l, v in calls if l.get("method") == "SetUnitProperties")
reconciles = [l for l in journal_since(cursor) if l.startswith("reconcile:")]
check(sets == 0 and not reconciles,
      f"the restarted daemon sent {sets:.0f} SetUnitProperties (nothing had changed), reconcile "
      f"lines {reconciles}; its D-Bus calls: "
      + ", ".join(f"{l['method']}/{l['result']} {v:.0f}" for l, v in calls))
new_pod_latency("after kill -9 and restart")


def restart():
    systemctl("restart", MEMQOS_UNIT)


repair("systemctl restart")
cursor = journal_cursor()
event("systemctl restart memqos-systemd", restart, settle=3, count_writes=False)
sets = metric("memqos_dbus_calls_total", method="SetUnitProperties")
reconciles = [l for l in journal_since(cursor) if l.startswith("reconcile:")]
check(sets == 0 and not reconciles, f"after systemctl restart: {sets} SetUnitProperties, reconcile"
                                    f" lines {reconciles}")

# --- the kubelet -----------------------------------------------------------------------------
nr2 = int(service_show("NRestarts"))  # a manual restart sets the counter back to 0
lines = event("systemctl restart kubelet", lambda: kubelet_restart())
seen = [l for l in lines if "kubelet.service (re)started" in l]
check(seen, f"systemctl restart kubelet: the daemon re-read units and pods: {seen[:1]}")
lines = event("kubelet down 3 s, then started", lambda: kubelet_restart(down_seconds=3))
check(True, f"kubelet down 3 s: the daemon logged {[l[:120] for l in lines][:4]}")
check_eq(int(service_show("NRestarts")), nr2, "no further restart (no watchdog kill, no crash)")
