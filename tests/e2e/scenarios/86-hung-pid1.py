#!/usr/bin/python3
"""A hung PID 1 (issue 7): a systemd call that never answers is timed out, not waited on.

`kill -STOP 1` cannot freeze systemd: the kernel drops SIGSTOP and SIGKILL sent to the global init
(kernel/signal.c, sig_task_ignored), which the first check shows. So PID 1 is frozen the way a
debugger does it: PTRACE_SEIZE + PTRACE_INTERRUPT of each of its threads (state `t`, tracing
stop), released with PTRACE_DETACH in a `finally`; if this scenario dies meanwhile the kernel
detaches it anyway, so the guest cannot be left with a frozen PID 1.

On the steady node (three pods, TieredReservation, effective, kubelet polled every second):
a new pod's slice and scope are started, PID 1 is frozen, and only then is the pod listed in
/pods (the stand-in does not need systemd), so the daemon's next calls go to a systemd that does
not answer. The daemon's D-Bus call timeout is 10 s (commands.CALL_TIMEOUT, Systemd._call).
  40 s freeze: longer than the call timeout and than WatchdogSec=30s: the daemon times calls out
  and retries, and systemd does not kill it for the watchdog on resuming. (A 15 s freeze, shorter
  than WatchdogSec, passed the same checks in three VM runs; it was dropped to keep the suite
  under its time budget.)
During each freeze the metrics endpoint must keep answering (the daemon is not blocked) and count
the timed-out call; afterwards the journal must hold the timeout, logged while PID 1 was frozen,
the daemon must be the same process (no watchdog kill, no restart), and the kernel must reach the
plan with the new pod. A thread reads every unit's memory.min/low/high every 50 ms from before
the freeze until convergence: no value may go below what it was before (nothing lowered), no
MemoryHigh may move, and no child may hold more memory.min/low than its parent."""
# e2e-timeout: 300
import ctypes
import os
import signal
import threading
import time

from memqos_e2e import *

need_deb()
MIB = 1 << 20
CALL_TIMEOUT = 10.0  # memqos_systemd.commands.CALL_TIMEOUT, the service's D-Bus call timeout
WATCHDOG = 30.0  # WatchdogSec= in units/memqos-systemd.service

libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
PTRACE_DETACH, PTRACE_SEIZE, PTRACE_INTERRUPT = 17, 0x4206, 0x4207
PTRACE_EVENT_STOP = 128
WALL = 0x40000000


def pid1_state():
    with open("/proc/1/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


class FrozenPid1:
    """with FrozenPid1(): PID 1 stopped (ptrace), every thread; always released on exit."""

    def __enter__(self):
        self.attached = {}  # tid -> signal to give back on detach
        try:
            for tid in sorted(int(t) for t in os.listdir("/proc/1/task")):
                if libc.ptrace(PTRACE_SEIZE, tid, None, None) != 0:
                    raise OSError(ctypes.get_errno(), f"PTRACE_SEIZE {tid}: {os.strerror(ctypes.get_errno())}")
                self.attached[tid] = 0
                if libc.ptrace(PTRACE_INTERRUPT, tid, None, None) != 0:
                    raise OSError(ctypes.get_errno(), f"PTRACE_INTERRUPT {tid}")
            for tid in self.attached:
                _, status = os.waitpid(tid, WALL)
                if os.WIFSTOPPED(status) and status >> 16 != PTRACE_EVENT_STOP:
                    # A signal-delivery-stop came first: hand the signal back on detach.
                    self.attached[tid] = os.WSTOPSIG(status)
        except BaseException:
            self.release()
            raise
        return self

    def release(self):
        for tid, sig in self.attached.items():
            libc.ptrace(PTRACE_DETACH, tid, None, ctypes.c_void_p(sig))
        self.attached = {}
        os.kill(1, signal.SIGCONT)

    def __exit__(self, *exc):
        self.release()
        return False


# --- the premise: kill -STOP 1 does not stop systemd -----------------------------------------
try:
    os.kill(1, signal.SIGSTOP)
    time.sleep(0.3)
    state = pid1_state()
finally:
    os.kill(1, signal.SIGCONT)
check(state != "T", f"kill -STOP 1 leaves PID 1 running (state {state}): the kernel drops SIGSTOP"
                    f" to init, so the freeze below uses ptrace")

start_empty_node(pods_only_config(), "config: TieredReservation, effective, pollInterval 1s")
pods = sample_pods()
write_pods(pods)
units = {}  # unit -> cgroup dir (no D-Bus needed to read them while PID 1 is frozen)
parent_of = {}


def add_units(pod):
    s = pod_slice_name(pod["metadata"]["uid"], pod["status"]["qosClass"])
    units[s] = slice_cgroup_dir(s)
    parent_of[s] = s[: -len(".slice")].rsplit("-", 1)[0] + ".slice"
    for st in pod["status"]["containerStatuses"]:
        scope = f"cri-containerd-{st['containerID'].split('://')[1]}.scope"
        units[scope] = os.path.join(units[s], scope)
        parent_of[scope] = s


for name in ("kubepods.slice", "kubepods-burstable.slice", "kubepods-besteffort.slice"):
    units[name] = slice_cgroup_dir(name)
parent_of["kubepods-burstable.slice"] = parent_of["kubepods-besteffort.slice"] = "kubepods.slice"
for p in pods:
    start_pod(p)
    add_units(p)
expected = plan_expected(memqos_plan())
bad, _ = wait_kernel(expected, 30)
check(not bad, f"before: {len(expected)} units equal plan {bad}")
pid0, nr0 = int(service_show("MainPID")), int(service_show("NRestarts"))


def read_order():
    """Scopes, then pod slices, then the QoS slices, then kubepods.slice: children before parents."""
    return sorted(units, key=lambda u: (u.endswith(".slice"), "-pod" not in u, u == "kubepods.slice"))


def read_all():
    out = {}
    for u in read_order():
        d = units[u]
        try:
            vals = []
            for k in ("min", "low", "high"):
                with open(f"{d}/memory.{k}") as f:
                    t = f.read().strip()
                vals.append(UINT64_MAX if t == "max" else int(t))
            out[u] = tuple(vals)
        except (OSError, ValueError):
            out[u] = None
    return out


class Sampler(threading.Thread):
    """Every 50 ms: nothing below its value at the start, no MemoryHigh moved, no child above
    its parent (children read before parents, see 85-churn)."""

    def __init__(self, before, fresh):
        super().__init__(daemon=True)
        self.before = before
        self.fresh = fresh  # the new pod's units: their MemoryHigh is set for the first time
        self.stop = threading.Event()
        self.samples = 0
        self.bad = []

    def run(self):
        while not self.stop.is_set():
            now = read_all()
            self.samples += 1
            for u, v in now.items():
                b = self.before.get(u)
                if v is None:
                    continue
                if b is not None and (v[0] < b[0] or v[1] < b[1] or (v[2] != b[2] and u not in self.fresh)):
                    self.note(f"{u} min/low/high {tuple(map(fmt_bytes, b))} -> {tuple(map(fmt_bytes, v))}")
                p = now.get(parent_of.get(u))
                if p is not None and (v[0] > p[0] or v[1] > p[1]):
                    self.note(f"{u} min/low {fmt_bytes(v[0])}/{fmt_bytes(v[1])} above"
                              f" {parent_of[u]} {fmt_bytes(p[0])}/{fmt_bytes(p[1])}")
            time.sleep(0.05)

    def note(self, what):
        if len(self.bad) < 5 and what not in self.bad:
            self.bad.append(what)


def journal_entries(mark, unit=MEMQOS_UNIT):
    """(monotonic seconds, message) of the unit's journal entries logged at or after mark."""
    import json
    import subprocess

    subprocess.run(["journalctl", "--sync"], capture_output=True)
    out = []
    p = subprocess.run(["journalctl", "--no-pager", "-b", "-o", "json", "--output-fields",
                        "MESSAGE,__MONOTONIC_TIMESTAMP", "-u", unit], capture_output=True, text=True)
    for line in p.stdout.splitlines():
        try:
            e = json.loads(line)
            t = int(e["__MONOTONIC_TIMESTAMP"]) / 1e6
        except (ValueError, KeyError):
            continue
        if t >= mark and isinstance(e.get("MESSAGE"), str):
            out.append((t, e["MESSAGE"]))
    return out


def errors_total():
    return sum(v for l, v in metrics().get("memqos_dbus_calls_total", []) if l.get("result") == "error")


def freeze(label, seconds, request, name):
    global expected
    new = make_pod(name, [{"name": "app", "requests": {"memory": request},
                                      "limits": {"memory": "256Mi"}}])
    start_pod(new)  # running, not listed yet: the daemon knows the units, not the pod
    known = set(units)
    add_units(new)
    time.sleep(2)  # past the daemon's reading of the new units
    before = read_all()
    sampler = Sampler(before, set(units) - known)
    sampler.start()
    cursor = journal_cursor()
    errs0 = errors_total()
    answers, first_error = [], None
    with FrozenPid1() as frozen:
        t0 = time.monotonic()
        state = pid1_state()
        pods.append(new)
        write_pods(pods)
        while time.monotonic() - t0 < seconds:
            try:
                e = errors_total()
                answers.append(time.monotonic())
                if first_error is None and e > errs0:
                    first_error = time.monotonic() - t0
            except OSError:
                pass
            time.sleep(0.5)
        t1 = time.monotonic()
        threads = len(frozen.attached)
    thawed = time.monotonic()
    log(f"{label}: PID 1 frozen {t1 - t0:.1f} s ({threads} threads, state {state})")
    check(state == "t", f"{label}: PID 1 frozen for {t1 - t0:.1f} s (state {state}: tracing stop,"
                        f" {threads} thread(s))")
    gap = max(b - a for a, b in zip([t0, *answers], [*answers, t1]))
    check(gap < 3.0 and first_error is not None,
          f"{label}: the daemon kept answering on its metrics endpoint while PID 1 was frozen"
          f" ({len(answers)} answers, 0.5 s apart, longest gap {gap:.1f} s) and counted a failed"
          f" D-Bus call "
          + (f"{first_error:.1f} s into the freeze" if first_error is not None else "NEVER"))
    expected = plan_expected(memqos_plan())
    bad, took = wait_kernel(expected, 60, 0.05)
    conv = time.monotonic() - thawed
    sampler.stop.set()
    sampler.join()
    check(not bad, f"{label}: converged {conv:.1f} s after PID 1 resumed: {len(expected)} units equal"
                   f" plan with the new pod {bad}")
    check(not sampler.bad, f"{label}: nothing lowered, no MemoryHigh moved, no child above its parent"
                           f" ({sampler.samples} samples of {len(units)} units, 50 ms apart) {sampler.bad}")
    entries = journal_entries(cursor)
    lines = [m for _, m in entries]
    timeouts = [(t, m) for t, m in entries if "did not answer within" in m]
    during = [(t, m) for t, m in timeouts if t0 <= t <= t1]
    check(during, f"{label}: the daemon logged {len(during)} timeout(s) while PID 1 was frozen"
                  f" (at {', '.join(f'{t - t0:.1f}' for t, _ in during)} s), {len(timeouts)} in all:"
                  f" {[m[:160] for _, m in timeouts[:2]]}")
    pid, nr = int(service_show("MainPID")), int(service_show("NRestarts"))
    wd = [l for l in journal_since(cursor, identifier="systemd") if "memqos" in l and "atchdog" in l]
    check(pid == pid0 and nr == nr0 and not wd,
          f"{label}: the same daemon process (MainPID {pid0} -> {pid}, NRestarts {nr0} -> {nr}),"
          f" no watchdog action by systemd {wd[:2]}")
    return lines, thawed


lines, thawed = freeze("40 s freeze", WATCHDOG + CALL_TIMEOUT, "24Mi", "late-b")
wd_ts = service_show("WatchdogTimestampMonotonic")
check(True, f"after the 40 s freeze: systemd took a watchdog ping from the daemon at monotonic"
            f" {int(wd_ts) / 1e6 if wd_ts.isdigit() else wd_ts} s, PID 1 resumed at {thawed:.1f} s"
            f" (a ping queued in the notify socket is read before the watchdog timer fires);"
            f" the daemon logged"
            f" {[l[:120] for l in lines if 'retrying' in l or 'systemd' in l][:4]}")
