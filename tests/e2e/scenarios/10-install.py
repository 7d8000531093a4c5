#!/usr/bin/python3
"""The .deb as an operator installs it (the driver ran `apt-get install ./memqos-systemd_*.deb`
before the first scenario): enabled and active, so READY=1 arrived (Type=notify); its status
text, watchdog and sandbox (systemd-analyze security/verify); a clean journal; metrics; `check`;
`systemctl reload` (same PID) and `restart` (a new PID, READY again); a reload to a config it
refuses (a kubelet URL it cannot take apart) keeps the process and the old config, in one journal
line; such a config, or one with an unknown key, fails the unit at start with exit 2 and it is not
restarted; an upgrade (the same .deb again) restarts
it. Issue 4's "Done when" and docs/PACKAGING.md's list, items 1-6."""
# e2e-timeout: 240
import os
import re
import subprocess
import time

from memqos_e2e import *

need_deb()

BAD_WORDS = ("Permission denied", "Operation not permitted", "Read-only file system",
             "Access denied", "Traceback", "cannot watch udev")


def main_pid():
    return int(service_show("MainPID") or 0)


def wait_ready_line(cursor, timeout=60):
    return wait_for(lambda: [l for l in journal_since(cursor) if l.startswith("ready:")], timeout)


# --- install ---------------------------------------------------------------------------------
status = subprocess.run(["dpkg-query", "-W", "-f", "${Status} ${Version}", "memqos-systemd"],
                        capture_output=True, text=True).stdout
check(status.startswith("install ok installed"), f"dpkg: memqos-systemd {status}")
check_eq(systemctl("is-enabled", MEMQOS_UNIT).stdout.strip(), "enabled", "is-enabled")
check_eq(systemctl("is-active", MEMQOS_UNIT).stdout.strip(), "active",
         "is-active after install (Type=notify: READY=1 received)")
check_eq(service_show("Type"), "notify", "Type")
check_eq(service_show("NRestarts"), "0", "NRestarts")
check_eq(service_show("WatchdogUSec"), "30s", "WatchdogUSec")
# Its own protection (issue 25), in effect: its slice under the root, the kernel's memory.min of
# both cgroups, and the OOM score of its process.
check_eq(service_show("ControlGroup"), "/memqos.slice/memqos-systemd.service", "ControlGroup")
check_eq([open(f"/sys/fs/cgroup/{d}/memory.min").read().strip() for d in ("memqos.slice", "memqos.slice/memqos-systemd.service")],
         [str(64 << 20)] * 2, "memory.min of memqos.slice and of the service (64M)")
check_eq(open(f"/proc/{main_pid()}/oom_score_adj").read().strip(), "-900", "the daemon's oom_score_adj")
status_text = service_show("StatusText")
check(re.match(r"\d+ pods, kubepods min \d+ low \d+", status_text), f"StatusText {status_text!r}")
ready = [l for l in journal_since(None) if l.startswith("ready:")]
check(len(ready) >= 1, f"journal has the daemon's ready line: {ready[:1]}")
t = service_show("ExecMainStartTimestampMonotonic"), service_show("ActiveEnterTimestampMonotonic")
check(int(t[1]) - int(t[0]) < 30_000_000,
      f"start to READY took {(int(t[1]) - int(t[0])) / 1e6:.2f} s (TimeoutStartSec=60s)")

# --- sandbox ---------------------------------------------------------------------------------
p = subprocess.run(["systemd-analyze", "security", "--no-pager", MEMQOS_UNIT],
                   capture_output=True, text=True)
m = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\S+)", p.stdout + p.stderr)
exposure = float(m.group(1)) if m else None
check(exposure is not None and exposure <= 3.0,
      f"systemd-analyze security exposure {exposure} {m.group(2) if m else p.stderr[-200:]} (<= 3.0)")
p = subprocess.run(["systemd-analyze", "verify", "--man=no",
                    "/lib/systemd/system/memqos-systemd.service"], capture_output=True, text=True)
check(p.returncode == 0 and not (p.stdout + p.stderr).strip(),
      f"systemd-analyze verify: exit {p.returncode}, output {(p.stdout + p.stderr).strip()[:300]!r}")

journal = journal_since(None)
bad = [l for l in journal if any(w in l for w in BAD_WORDS)]
check(not bad, f"no sandbox denial, traceback or udev warning in the unit's journal: {bad[:3]}")

ledger_file = "/run/memqos-systemd/reserved-slices"
check(os.path.isfile(ledger_file) and not any("reserved-slice ledger" in l for l in journal),
      f"the sandbox lets it keep its ledger of reserved slices in {ledger_file}:"
      f" {open(ledger_file).read().split() if os.path.isfile(ledger_file) else 'absent'}")

m = metrics()
check(m.get("memqos_build_info"), f"metrics on {METRICS_URL}: build {m.get('memqos_build_info')}")

# `check` with a kubelet answering (the stand-in, no pods).
kubelet_start([])
p = subprocess.run(["memqos-systemd", "check"], capture_output=True, text=True)
lines = [" ".join(l.split()) for l in p.stdout.splitlines()]
errors = [l for l in lines if l.startswith("error")]
check(p.returncode == 0 and not errors,
      f"memqos-systemd check exit {p.returncode}: {len(lines)} findings, errors {errors}, "
      f"warnings {[l for l in lines if l.startswith('warn')]}")

# The pods of its last snapshot, for the first pod list after a restart (last_pods.py), next to
# the ledger: written once it has a snapshot, which a kubelet answering (with no pods) gives it.
last_pods_file = "/run/memqos-systemd/last-pods.json"
wait_for(lambda: os.path.isfile(last_pods_file), timeout=30.0)
journal = journal_since(None)
check(os.path.isfile(last_pods_file) and not any("cannot remember the pods" in l for l in journal),
      f"the sandbox lets it keep the pods of its last snapshot in {last_pods_file}:"
      f" {open(last_pods_file).read()[:80] if os.path.isfile(last_pods_file) else 'absent'}"
      f" (mode {oct(os.stat(last_pods_file).st_mode & 0o777) if os.path.isfile(last_pods_file) else '-'})")

# --- reload ----------------------------------------------------------------------------------
pid = main_pid()
cursor = journal_cursor()
check(memqos_reload(), "systemctl reload: the daemon counted the reload (memqos_config_reloads_total)")
check_eq(main_pid(), pid, "reload keeps MainPID")
reloaded = [l for l in journal_since(cursor) if l.startswith("config reloaded")]
check(reloaded, f"journal after reload: {reloaded[:1]}")

# --- a reload to a config it refuses: the old one stays in force, the daemon lives ------------
# issue 26: a kubelet URL the config let through killed the daemon on reload, then at every restart.
with open(MEMQOS_CONFIG) as f:
    shipped = f.read()
BAD_URL = "https://[::1/pods"


def with_kubelet_url(url: str) -> dict:
    """The shipped config with its kubelet block's URL changed (a second `kubelet:` key would be
    refused for the duplicate key, not for the URL)."""
    import yaml

    doc = yaml.safe_load(shipped)
    doc["kubelet"] = {**(doc.get("kubelet") or {}), "url": url}
    return doc


memqos_write_config(with_kubelet_url(BAD_URL))
cursor = journal_cursor()
refused = metric("memqos_config_reloads_total", result="refused")
check(memqos_reload(), "systemctl reload to a kubelet URL it cannot take apart: the daemon counted it")
check_eq(metric("memqos_config_reloads_total", result="refused"), refused + 1, "counted as refused")
check_eq((main_pid(), service_show("NRestarts"), systemctl("is-active", MEMQOS_UNIT).stdout.strip()),
         (pid, "0", "active"), "the same process goes on (MainPID, NRestarts, state)")
said = [l for l in journal_since(cursor) if "reload refused" in l]
check(len(said) == 1 and "kubelet.url" in said[0] and BAD_URL in said[0],
      f"one journal line naming the key and the value: {said}")

# --- restart ---------------------------------------------------------------------------------
memqos_restore_config(reload=False)
cursor = journal_cursor()
t0 = time.monotonic()
p = systemctl("restart", MEMQOS_UNIT)
took = time.monotonic() - t0
check(p.returncode == 0, f"systemctl restart returned {p.returncode} after {took:.1f} s {p.stderr.strip()}")
check_eq(systemctl("is-active", MEMQOS_UNIT).stdout.strip(), "active", "active after restart")
new_pid = main_pid()
check(new_pid not in (0, pid), f"restart started a new process ({pid} -> {new_pid})")
ready = wait_ready_line(cursor, 5)
check(ready, f"READY again after restart: {ready[:1] if ready else None}")
check_eq(service_show("NRestarts"), "0", "NRestarts after a manual restart")
stopped = [l for l in journal_since(cursor) if "protections left in place" in l]
check(stopped, f"SIGTERM left protections in place: {stopped[:1]}")

# --- a config it refuses at start: exit 2, failed, not restarted ----------------------------------
# An unknown key, and the URL that used to loop the unit every 2 s (issue 26).
memqos_write_config(shipped + "\nnoSuchKey: 1\n")
cursor = journal_cursor()
systemctl("restart", MEMQOS_UNIT)
failed = wait_for(lambda: systemctl("is-active", MEMQOS_UNIT).stdout.strip() == "failed", 30)
check(failed, f"unknown config key: unit {systemctl('is-active', MEMQOS_UNIT).stdout.strip()}")
check_eq(service_show("ExecMainStatus"), "2", "ExecMainStatus with an unknown key")
msg = [l for l in journal_since(cursor) if "noSuchKey" in l]
check(msg, f"the error names the key: {msg[:1]}")
memqos_write_config(with_kubelet_url(BAD_URL))
cursor = journal_cursor()
systemctl("reset-failed", MEMQOS_UNIT)
systemctl("start", MEMQOS_UNIT)
failed = wait_for(lambda: systemctl("is-active", MEMQOS_UNIT).stdout.strip() == "failed", 30)
check(failed and service_show("ExecMainStatus") == "2",
      f"the kubelet URL it cannot take apart: unit {systemctl('is-active', MEMQOS_UNIT).stdout.strip()},"
      f" exit {service_show('ExecMainStatus')}")
time.sleep(3)  # RestartSec=2s: would have restarted by now
check_eq(service_show("NRestarts"), "0", "not restarted (RestartPreventExitStatus=2)")
msg = [l for l in journal_since(cursor) if BAD_URL in l and "Traceback" not in l]
check(len(msg) == 1 and "kubelet.url" in msg[0], f"one line names the key and the value: {msg}")
memqos_restore_config(reload=False)
systemctl("reset-failed", MEMQOS_UNIT)
check(systemctl("start", MEMQOS_UNIT).returncode == 0, "started again with the shipped config")

# --- upgrade: the same .deb again ------------------------------------------------------------
deb = deb_path()
if deb:
    pid = main_pid()
    cursor = journal_cursor()
    t0 = time.monotonic()
    p = subprocess.run(["dpkg", "-i", deb], capture_output=True, text=True,
                       env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    took = time.monotonic() - t0
    check(p.returncode == 0, f"dpkg -i of the same .deb (upgrade path) exit {p.returncode} in {took:.0f} s")
    new_pid = main_pid()
    check(systemctl("is-active", MEMQOS_UNIT).stdout.strip() == "active" and new_pid != pid,
          f"upgrade restarted the service ({pid} -> {new_pid})")
    check(wait_ready_line(cursor, 10), "READY after the upgrade")
    with open(MEMQOS_CONFIG) as f:
        check(f.read() == shipped, "upgrade kept the conffile")
else:
    check(False, "the staged .deb in /var/cache/memqos-e2e-debs")
