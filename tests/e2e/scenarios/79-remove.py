#!/usr/bin/python3
"""`apt remove memqos-systemd` leaves the node as the kubelet alone would; `apt purge` removes the
config; installing the .deb again brings the service back (and this scenario leaves it so).

On the sample node with TieredReservation, kube.slice and system.slice reserved (both running),
every managed unit holds the plan. After `apt-get remove`: the service is stopped and its unit
gone, every unit it managed (kubepods, QoS, pod, container and reserved slices) reads
memory.min 0, memory.low 0, memory.high max in the kernel, the conffile is kept, nothing of the
package is left under /usr (no __pycache__), and a container run by runc keeps the
memory.swap.max runc set (issue 21; its memory.oom.group is recorded: dpkg's daemon-reload
resets it after the reset put it back, as on any node without the daemon), and the BestEffort
ceiling (issue 25, on in this config) is gone: kubepods-besteffort.slice's memory.max is max
again. After `apt-get purge`: /etc/memqos-systemd is
gone, the kubelet token in it too. Then `apt-get install` of the same .deb and README's token
step: active again, protecting the pods with the shipped config. Last of the daemon scenarios: docs/PACKAGING.md items 8 and 9."""
# e2e-timeout: 300
import os
import subprocess
import time

from memqos_e2e import *

need_deb()
deb = deb_path()
ENV = dict(os.environ, DEBIAN_FRONTEND="noninteractive")

pods = sample_pods()
start_sample_node(pods, reserved=True)
# And a pod whose containers the real runtime runs (runc, as containerd does: 15-runc).
runc_web, runc_units = runc_pod("runc-web", 32, 96)
write_pods([*pods, runc_web])
set_by_runc = {f: read_cgroup_file(runc_units["app"], f) for f in ("memory.oom.group", "memory.swap.max")}
memqos_write_config(sample_config(bestEffortCeiling={"enabled": True}))
check(memqos_reload(), "config: TieredReservation, reserved kube.slice and system.slice, the BestEffort ceiling on")
expected = plan_expected(memqos_plan())
bad, _ = wait_kernel(expected, 20)
protected = {u: v for u, v in expected.items() if v["min"] or v["low"] or v["high"] != UINT64_MAX}
check(not bad, f"before: {len(expected)} units equal plan, {len(protected)} of them with a value"
               f" other than 0/0/max {bad}")
BE = "kubepods-besteffort.slice"
ceiling = next(u["MemoryMax"] for u in memqos_plan()["units"] if u["unit"] == BE)
check(wait_for(lambda: read_cgroup_file(BE, "memory.max") == str(ceiling), 10, 0.05),
      f"before: {BE} memory.max is the planned ceiling {fmt_bytes(ceiling)}")


def apt(*args):
    t0 = time.monotonic()
    p = subprocess.run(["apt-get", "-y", *args], capture_output=True, text=True, env=ENV)
    return p, time.monotonic() - t0


# --- remove ----------------------------------------------------------------------------------
p, took = apt("remove", "memqos-systemd")
warnings = [l for l in (p.stdout + p.stderr).splitlines() if "memqos-systemd: warning" in l]
check(p.returncode == 0, f"apt-get remove: exit {p.returncode} in {took:.0f} s {p.stderr[-300:]}")
check(not warnings, f"prerm printed no warning {warnings}")
reset_line = [l for l in (p.stdout + p.stderr).splitlines() if l.startswith("reset:")]
check(reset_line, f"prerm ran memqos-systemd reset: {reset_line}")
check_eq(systemctl("is-active", MEMQOS_UNIT).stdout.strip(), "inactive", "service after remove")
check_eq(service_show("LoadState"), "not-found", "unit file after remove")
observed = kernel_memory(expected)
defaults = {"min": 0, "low": 0, "high": UINT64_MAX}
not_reset = [f"{u}: {v}" for u, v in observed.items() if v != defaults]
check(not not_reset, f"every managed unit ({len(observed)}: kubepods, QoS, pods, containers, kube.slice,"
                     f" system.slice) at memory.min 0, memory.low 0, memory.high max {not_reset}")
check_eq(read_cgroup_file(BE, "memory.max"), "max", f"the BestEffort ceiling taken back: {BE} memory.max")
after = {f: read_cgroup_file(runc_units["app"], f) for f in set_by_runc}
check(after["memory.swap.max"] == set_by_runc["memory.swap.max"],
      f"the runc container's memory.swap.max is what runc set ({after['memory.swap.max']}): systemd holds it")
check(True, f"its memory.oom.group after apt remove: {after['memory.oom.group']} (runc set"
            f" {set_by_runc['memory.oom.group']}; the reset put it back, then dpkg's daemon-reload reset it, as on"
            f" any node without the daemon: docs/DESIGN.md)")
kept = {}
for base in ("/run/systemd/system.control", "/run/systemd/transient"):
    d = f"{base}/kubepods.slice.d"
    for f in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        kept[f"{d}/{f}"] = " ".join(l.strip() for l in open(f"{d}/{f}") if "=" in l)
check(True, f"kubepods.slice drop-ins left after the reset: {kept or 'none'}")
systemctl("daemon-reload")
again = [f"{u}: {v}" for u, v in kernel_memory(expected).items() if v != defaults]
check(not again, f"still 0/0/max after another daemon-reload {again}")
check(os.path.exists(MEMQOS_CONFIG), f"conffile kept: {MEMQOS_CONFIG}")
left = [x for x in ("/usr/bin/memqos-systemd", "/usr/lib/python3/dist-packages/memqos_systemd",
                    "/lib/systemd/system/memqos-systemd.service") if os.path.exists(x)]
check(not left, f"nothing of the package left under /usr and /lib {left}")
st = subprocess.run(["dpkg-query", "-W", "-f", "${Status}", "memqos-systemd"], capture_output=True,
                    text=True).stdout
check_eq(st, "deinstall ok config-files", "dpkg status after remove")
check(all(unit_exists(u) for u in expected if not u.startswith(("kube.", "system."))),
      "the pods' slices and scopes still run")

# --- purge -----------------------------------------------------------------------------------
p, took = apt("purge", "memqos-systemd")
check(p.returncode == 0, f"apt-get purge: exit {p.returncode} in {took:.0f} s")
check(not os.path.exists(os.path.dirname(MEMQOS_CONFIG)),
      f"{os.path.dirname(MEMQOS_CONFIG)} gone, with the kubelet token the operator put there")

# --- install again (leaves the guest as the driver installed it) -------------------------------
p, took = apt("install", "--no-install-recommends", deb)
check(p.returncode == 0, f"apt-get install {os.path.basename(deb)} again: exit {p.returncode}"
                         f" in {took:.0f} s")
check_eq(systemctl("is-active", MEMQOS_UNIT).stdout.strip(), "active", "service after reinstall")
check(os.path.exists(MEMQOS_CONFIG), "a fresh conffile")
install_kubelet_token()  # README's token step again: the purge took it
expected = plan_expected(memqos_plan())
bad, took = wait_kernel(expected, 20)
check(not bad, f"the reinstalled service protects the pods with the shipped config:"
               f" {len(expected)} units equal plan {bad}")
