#!/usr/bin/python3
"""The DaemonSet route (issue 18): our OCI image (build/image/, made from the .deb by `make
image`) run by Debian's podman exactly as the kubelet would run deploy/kubernetes/daemonset.yaml:
the pod spec rendered as `kubectl apply -k` does (vm.py puts it in the payload as JSON) and
turned into `podman run` arguments by guest/podspec.py, which refuses any field it does not map
(tests/unit/test_deploy_kubernetes.py holds the two together). The service is stopped first
(never both on one node) and the sample node reset to 0/0/max, so the pod does all the work.
  run       the pod's mounts, user and capabilities as podman and /proc see them equal the YAML;
            /readyz turns 200, /livez is 200, `check` in the pod finds no error; every unit of
            the sample node holds `plan` in the kernel's files, read through the kubelet's TLS
            port with the projected token and kubelet.crt; the service started beside the pod
            refuses to run (one daemon per node) and is not restarted
  token     the token file replaced (the kubelet's rotation) and the old token revoked: the pod
            keeps reading /pods, no source error
  restart   `podman restart`: sampled every 20 ms, no value of the plan ever lowered; ready again,
            and the new process had nothing to write
  uninstall deploy/kubernetes-uninstall's pod: its init container runs `reset` (exit 0), its
            container sleeps; every unit at 0/0/max"""
# e2e-timeout: 420
import atexit
import glob
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import yaml

from memqos_e2e import *
from memqos_e2e import GUEST_DIR, TOKENS_FILE

sys.path.insert(0, GUEST_DIR)
import podspec  # noqa: E402

need_deb()
payload = os.environ.get("MEMQOS_E2E_PAYLOAD", "")
images = sorted(glob.glob(os.path.join(payload, "images", "*.oci.tar")))
check(bool(images), "the payload has the DaemonSet's image (make image puts it in build/image/)")
if not images:
    sys.exit(1)
with open(os.path.join(payload, "deploy", "kubernetes.json")) as f:
    install = {(o["kind"], o["metadata"]["name"]): o for o in json.load(f)}
with open(os.path.join(payload, "deploy", "kubernetes-uninstall.json")) as f:
    uninstall = {(o["kind"], o["metadata"]["name"]): o for o in json.load(f)}
POD = install[("DaemonSet", "memqos-systemd")]["spec"]["template"]["spec"]
UPOD = uninstall[("DaemonSet", "memqos-systemd")]["spec"]["template"]["spec"]
CONFIG_TEXT = install[("ConfigMap", "memqos-systemd-config")]["data"]["config.yaml"]
READYZ = "http://127.0.0.1:9759/readyz"
NAME = "memqos-ds"

# --- the node: the sample pods on the TLS kubelet stand-in, the service stopped and reset ------
kubelet_start([], timeout=120)  # run alone, its first start makes kubelet.crt (openssl: 40 s under TCG)
units = start_sample_node(sample_pods())
pause_memqos()
p = subprocess.run(["memqos-systemd", "reset"], capture_output=True, text=True)
check(p.returncode == 0, f"the service stopped and `memqos-systemd reset` (exit {p.returncode}: {p.stderr.strip()[-200:]})")

# What the kubelet would put in the configMap and projected volumes.
kdir = "/run/memqos-e2e-ds"
os.makedirs(f"{kdir}/config", exist_ok=True)
os.makedirs(f"{kdir}/token", exist_ok=True)
with open(f"{kdir}/config/config.yaml", "w") as f:
    f.write(CONFIG_TEXT)
cfg = yaml.safe_load(CONFIG_TEXT)
token_name = os.path.basename(cfg["kubelet"]["tokenFile"])


def put_token(token):
    tmp = f"{kdir}/token/.{token_name}.new"
    with open(tmp, "w") as f:
        f.write(token)
    os.chmod(tmp, 0o400)
    os.replace(tmp, f"{kdir}/token/{token_name}")  # atomically, as the kubelet swaps ..data


put_token(cluster_token())
provided = {"config": f"{kdir}/config", "kubelet-token": f"{kdir}/token"}
for path, kind in podspec.host_path_types(POD).items():
    if kind == "DirectoryOrCreate":
        os.makedirs(path, exist_ok=True)
    check(os.path.exists(path), f"the node has {path} ({kind})")

expected = plan_expected(memqos_plan(config=f"{kdir}/config/config.yaml"))
log(f"plan: {len(expected)} units")


def podman(*args, check_rc=True, timeout=180):
    p = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check_rc and p.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args[:3])}...: exit {p.returncode}: {p.stderr.strip()[-400:]}")
    return p


def readyz(url=READYZ):
    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


atexit.register(lambda: subprocess.run(["podman", "rm", "-f", "-t", "5", NAME, f"{NAME}-sleep", f"{NAME}-reset"],
                                       capture_output=True))

# --- run ---------------------------------------------------------------------------------------
t = time.monotonic()
podman("load", "-q", "-i", images[-1], timeout=300)
image = podman("images", "-q", "--no-trunc").stdout.split()[0].removeprefix("sha256:")
log(f"podman load {os.path.basename(images[-1])}: {time.monotonic() - t:.1f} s, {image[:19]}")
entry = json.loads(podman("image", "inspect", image).stdout)[0]["Config"]["Entrypoint"]
check_eq(entry, ["/usr/bin/memqos-systemd", "run", "--config", "/etc/memqos-systemd/config.yaml"],
         "the image's entry point reads the ConfigMap's mount")
ctr = POD["containers"][0]
args = podspec.run_args(POD, ctr, image, provided)
log("podman run " + " ".join(args))
t = time.monotonic()
podman("run", "-d", "--name", NAME, *args)
ready = wait_for(lambda: readyz() == 200, 60, 0.1)
check(ready, f"/readyz 200 in {time.monotonic() - t:.1f} s after podman run")
check_eq(readyz(READYZ.replace("/readyz", "/livez")), 200, "/livez, the liveness probe's path")
bad, waited = wait_kernel(expected, 20)
check(not bad, f"every unit of the sample node holds plan in the kernel's files ({len(expected)} units): {bad}")

info = json.loads(podman("inspect", NAME).stdout)[0]
seen = sorted((m["Source"], m["Destination"], "ro" if not m.get("RW", True) else "rw")
              for m in info["Mounts"])
sources = podspec.volume_sources(POD, provided)
want = sorted((sources[m["name"]], m["mountPath"], "ro" if m.get("readOnly") else "rw") for m in ctr["volumeMounts"])
check_eq(seen, want, "podman's mounts are the DaemonSet's")
pid = info["State"]["Pid"]
status = dict(line.split(":", 1) for line in read_file(f"/proc/{pid}/status").splitlines() if ":" in line)
check(status["Uid"].split()[0] == "0" and int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0
      and status["NoNewPrivs"].strip() == "1",
      f"the daemon runs as UID 0 with no capability, no new privileges (Uid {status['Uid'].split()[0]},"
      f" CapEff {status['CapEff'].strip()}, NoNewPrivs {status['NoNewPrivs'].strip()})")
check(info["HostConfig"]["NetworkMode"] == "host" and info["HostConfig"]["ReadonlyRootfs"] is True
      and not info["HostConfig"]["Privileged"], "host network, read-only root, not privileged")
check(metric("memqos_source_errors_total") in (None, 0.0), "no pod source error (TLS kubelet, projected token)")
# An operator's `kubectl exec POD -- memqos-systemd check`: it sees systemd as the node's PID 1
# (the node's /run/systemd/system, mounted for it) and names no error.
p = podman("exec", NAME, "memqos-systemd", "check", check_rc=False)
errors = [l for l in p.stdout.splitlines() if l.startswith("error")]
check(p.returncode == 0 and not errors, f"check in the pod: exit {p.returncode}, errors {errors}")

# Never both routes on one node: the service, started while the pod runs, finds the pod's lock
# in the directory they share (/run/memqos-systemd/run.lock), says so, exits 2, is not restarted.
cursor = journal_cursor()
p = systemctl("start", MEMQOS_UNIT)
time.sleep(3)  # RestartSec=2s: a restart would have come by now
said = [l for l in journal_since(cursor) if "another memqos-systemd runs on this node" in l]
status, restarts = service_show("ExecMainStatus"), service_show("NRestarts")
check(p.returncode != 0 and status == "2" and restarts == "0" and len(said) == 1
      and "not started by systemd: the DaemonSet's pod" in said[0],
      f"the service started beside the pod: systemctl start exit {p.returncode}, its exit {status},"
      f" {restarts} restarts; {said[:1]}")
systemctl("reset-failed", MEMQOS_UNIT)
check(readyz() == 200 and not wait_kernel(expected, 5)[0], "the pod still holds the plan")

# --- token -------------------------------------------------------------------------------------
old = cluster_token()
new = f"e2e.rotated.{os.urandom(16).hex()}"
with open(TOKENS_FILE) as f:
    tokens = json.load(f)
tokens[new] = dict(tokens[old])
with open(TOKENS_FILE, "w") as f:
    json.dump(tokens, f)
put_token(new)
# As the kubelet rotates a projected token: the old one stays valid until it expires, so a fetch
# already under way with it still succeeds. Revoked once a fetch has ended after the swap (fetches
# run one at a time: every later one reads the new file). Revoking it at the swap failed a fetch
# in flight now and then (CI of 2026-11-26: one 401), which a real rotation never does.
t0 = time.time()
wait_for(lambda: (metric("memqos_source_last_success_timestamp_seconds") or 0) > t0, 30)
tokens.pop(old)
with open(TOKENS_FILE, "w") as f:
    json.dump(tokens, f)
t1 = time.time()
check(wait_for(lambda: (metric("memqos_source_last_success_timestamp_seconds") or 0) > t1 + 0.5, 30),
      "after the rotation (old token revoked) /pods is read with the new token")
check(metric("memqos_source_errors_total") in (None, 0.0), "no source error across the rotation")
tokens[old] = tokens[new]  # the next scenarios' token again
with open(TOKENS_FILE, "w") as f:
    json.dump(tokens, f)

# --- restart -------------------------------------------------------------------------------------
samples, lowered = 0, []
proc = subprocess.Popen(["podman", "restart", "-t", "30", NAME], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
t = time.monotonic()
while proc.poll() is None or readyz() != 200:
    now = kernel_memory(expected)
    samples += 1
    for u, want in expected.items():
        have = now.get(u)
        if have is None or have["min"] < want["min"] or have["low"] < want["low"]:
            lowered.append((u, have))
    if time.monotonic() - t > 90:
        break
    time.sleep(0.02)
check(proc.wait() == 0 and readyz() == 200, f"podman restart: ready again in {time.monotonic() - t:.1f} s")
check(not lowered, f"{samples} samples at 20 ms across the restart: no protection lowered {lowered[:3]}")
bad, _ = wait_kernel(expected, 10)
check(not bad, f"after the restart every unit holds plan: {bad}")
check((metric("memqos_reconcile_changes_total") or 0) == 0, "the new process had nothing to write")

# --- uninstall ---------------------------------------------------------------------------------
podman("rm", "-f", "-t", "30", NAME)
check_eq(UPOD["containers"][0]["command"], ["sleep", "infinity"], "the uninstall pod's container sleeps")
init = podman("run", "--rm", "--name", f"{NAME}-reset", *podspec.run_args(UPOD, UPOD["initContainers"][0], image, provided),
              check_rc=False)
check(init.returncode == 0, f"the init container's `reset` exits 0 ({init.stderr.strip()[-300:]})")
podman("run", "-d", "--name", f"{NAME}-sleep", *podspec.run_args(UPOD, UPOD["containers"][0], image, provided))
time.sleep(2)
zero = {u: {"min": 0, "low": 0, "high": UINT64_MAX} for u in expected}
bad, _ = wait_kernel(zero, 10)
check(not bad, f"after uninstall's reset every unit is at 0/0/max ({len(zero)} units): {bad}")
podman("rm", "-f", "-t", "5", f"{NAME}-sleep")
