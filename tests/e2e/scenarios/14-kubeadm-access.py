#!/usr/bin/python3
"""Issue 15's "done when": the shipped config plus README's token step protects the sample node,
with no other edit, against a kubelet stand-in that serves TLS as a kubeadm node's kubelet does
(its self-signed /var/lib/kubelet/pki/kubelet.crt names only the hostname, never 127.0.0.1)
and checks the bearer token and the RBAC behind it.

Before the token step, `memqos-systemd check` says why no pod source answers, in one line with
the fix, and exits 1: the token file missing, a token the cluster does not know (401), a token
whose user lacks `get` on `nodes/pods` (403). The service's journal names the first cause with
its fix at its next poll, and each later cause once (not at every poll; which of them it sees
depends on where its 5 s polls fall between the steps). Then
`... | install -m 0600 /dev/stdin /etc/memqos-systemd/kubelet-token` (README's step, minus the
ssh): `check` exits 0, and every unit of the sample node holds `plan` in the kernel's files,
read by the daemon through port 10250 as the ServiceAccount (the stand-in's log says so)."""
# e2e-timeout: 240
import os
import re
import subprocess
import time

import yaml

from memqos_e2e import *

need_deb()
NO_SOURCE = "pods: no pod source answers: the service protects no pod until one does"

# --- the shipped config, untouched -----------------------------------------------------------
memqos_restore_config(reload=True)
verify = subprocess.run(["dpkg", "--verify", "memqos-systemd"], capture_output=True, text=True).stdout
check(MEMQOS_CONFIG not in verify, f"{MEMQOS_CONFIG} as the package ships it (dpkg --verify: {verify.strip()!r})")
with open(MEMQOS_CONFIG) as f:
    kubelet_block = yaml.safe_load(f)["kubelet"]
check_eq(kubelet_block, {"url": "https://127.0.0.1:10250/pods", "tokenFile": KUBELET_TOKEN,
                         "caFile": f"{KUBELET_CERT_DIR}/kubelet.crt"}, "the shipped config's kubelet block")

# --- the kubelet of a kubeadm node: its own certificate, for its hostname ---------------------
t0 = time.time()
kubelet_start([])  # (puts the ServiceAccount's token in place: the service starts from a good read)
check(wait_for(lambda: (metric("memqos_source_last_success_timestamp_seconds") or 0) > t0, 30),
      "the service reads the stand-in with the token kubelet_start put in place")
cursor = journal_cursor()
os.unlink(KUBELET_TOKEN)  # as right after `apt install`: the operator has not put it there yet
crt = f"{KUBELET_CERT_DIR}/kubelet.crt"
with open(crt) as f:
    n_certs = f.read().count("BEGIN CERTIFICATE")
san = subprocess.run(["openssl", "x509", "-in", crt, "-noout", "-ext", "subjectAltName"],
                     capture_output=True, text=True).stdout.split("\n", 1)[-1].strip()
check(n_certs == 2 and san == f"DNS:{os.uname().nodename.lower()}",
      f"{crt} as a kubelet makes it for itself: {n_certs} certificates (leaf and its CA), the leaf"
      f" names only {san}")


def run_check():
    p = subprocess.run(["memqos-systemd", "check"], capture_output=True, text=True)
    errors = [text for level, text in check_findings(p.stdout) if level == "error"]
    return p.returncode, errors, p.stderr


def check_refused(what, *needles):
    rc, errors, stderr = run_check()
    line = errors[0] if errors else ""
    ok = rc == 1 and errors == [line, NO_SOURCE] and line.startswith("pods: kubelet https://127.0.0.1:10250/pods: ") \
        and all(n in line for n in needles) and "Traceback" not in stderr
    check(ok, f"check with {what}: exit {rc}, {errors}")


check_refused("no token file", f"tokenFile {KUBELET_TOKEN}: cannot read: No such file or directory",
              "memqos-system/memqos-systemd", "mode 0600")
said = wait_for(lambda: [m for m in journal_since(cursor) if m.startswith("pod source failed:")], 15)
check(said and f"tokenFile {KUBELET_TOKEN}: cannot read" in said[0] and "mode 0600" in said[0],
      f"the service's journal names the cause and its fix at its next poll: {said[:1] if said else None}")
install_kubelet_token("a-token-this-cluster-never-issued")
check_refused("a token the cluster does not know", "HTTP 401 Unauthorized: the kubelet did not accept the token",
              "(missing, expired or wrong)")
install_kubelet_token(cluster_token(user="system:serviceaccount:memqos-system:no-rbac", allow=()))
check_refused("a token without the RBAC rule", "HTTP 403 Forbidden (user=system:serviceaccount:memqos-system:no-rbac,"
              " verb=get, resource=nodes, subresource=pods)", "ClusterRole memqos-systemd-pod-reader")
time.sleep(6)  # at least one more poll of the service (pollInterval 5s) while it keeps failing
failed = [m for m in journal_since(cursor) if m.startswith("pod source failed:")]
check(1 <= len(failed) <= 3 and len(set(failed)) == len(failed),
      f"the service's journal said each cause once, not at every poll ({len(failed)} lines: "
      f"{[m.split(': ', 2)[-1][:60] for m in failed]})")

# --- README's step: the ServiceAccount's token, mode 0600 ---------------------------------------
cursor = journal_cursor()
install_kubelet_token()
mode = oct(os.stat(KUBELET_TOKEN).st_mode & 0o777)
rc, errors, _ = run_check()
check(rc == 0 and not errors and mode == "0o600", f"check after the token step: exit {rc}, errors {errors},"
                                                  f" token file mode {mode}")
recovered = wait_for(lambda: [m for m in journal_since(cursor) if m.startswith("pod source recovered")], 15)
check(recovered, f"the service took the new token without a restart: {recovered[:1] if recovered else None}")

# --- the sample node, protected ---------------------------------------------------------------
pods = sample_pods()
start_sample_node(pods)
expected = plan_expected(memqos_plan())
protected = sorted(u for u, v in expected.items() if v["min"] or v["low"])
bad, took = wait_kernel(expected, 30)
check(not bad and len(protected) >= 4,
      f"the shipped config and the token protect the sample node: {len(expected)} units equal plan in the"
      f" kernel after {took:.1f} s, {len(protected)} with memory.min or memory.low {bad}")
stub_log = journal_since(None, unit=KUBELET_UNIT)
as_sa = [m for m in stub_log if re.search(r'"GET /pods HTTP/1.1" 200 - user=' + re.escape(SERVICE_ACCOUNT) + "$", m)]
check(as_sa, f"the daemon read /pods on port 10250 as {SERVICE_ACCOUNT}: {len(as_sa)} requests")
