#!/usr/bin/python3
"""The harness's own Python helpers: pods served by the kubelet stand-in, kubelet restarts,
start_pod/stop_pod, and a request to the host runner (QMP) over the control port."""
# e2e-timeout: 180
import json
import os

from memqos_e2e import *

pause_memqos()  # the pod slice properties below must not race the daemon's

pod = make_pod("web", [{"name": "app", "requests": {"memory": "100Mi"},
                        "limits": {"memory": "200Mi"}}])
check_eq(pod["status"]["qosClass"], "Burstable", "make_pod derives QoS")
be = make_pod("batch", [{"name": "job"}])
check_eq(be["status"]["qosClass"], "BestEffort", "make_pod derives BestEffort")

kubelet_start([pod, be])
check_eq(active_state(KUBELET_UNIT), "active", "kubelet.service is running")
served = kubelet_get_pods()
check_eq([p["metadata"]["uid"] for p in served["items"]],
         [pod["metadata"]["uid"], be["metadata"]["uid"]], "/pods serves the written pods")

units = start_pod(pod)
cg = cgroup_path(units["scopes"][0])
check(cg.startswith("/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"),
      f"start_pod scope cgroup {cg}")
check(str(units["pids"][0]) in open(os.path.join(cg, "cgroup.procs")).read().split(),
      "container process is in its scope")

pid_before = unit_property(KUBELET_UNIT, "MainPID", "org.freedesktop.systemd1.Service")
kubelet_restart()
pid_after = unit_property(KUBELET_UNIT, "MainPID", "org.freedesktop.systemd1.Service")
check(pid_before != pid_after and pid_after > 0, f"kubelet restarted ({pid_before} -> {pid_after})")
write_pods([be])
check_eq(len(kubelet_get_pods()["items"]), 1, "/pods follows the pods file after restart")
kubelet_restart(down_seconds=0.5)
check_eq(len(kubelet_get_pods()["items"]), 1, "kubelet back after a stop/start restart")

with open(PODS_FILE + ".status", "w") as f:
    f.write("503")
try:
    kubelet_get_pods()
    check(False, "kubelet error mode")
except Exception as err:
    check("503" in str(err), f"kubelet error mode answers 503 ({err})")
os.unlink(PODS_FILE + ".status")

set_unit_properties(units["slice"], MemoryMin=10 << 20, MemoryLow=20 << 20)
mem = read_memory(units["slice"])
check_eq((mem["min"], mem["low"]), (10 << 20, 20 << 20), "set_unit_properties on the pod slice")

stop_pod(pod)
check(wait_for(lambda: not os.path.exists(cg), 10), "stop_pod removes the scope cgroup")

if os.environ.get("MEMQOS_E2E_CTL"):
    status = host_qmp("query-status")
    check_eq(status.get("status"), "running", "host answers a QMP request over the control port")
else:
    check(False, "control port present")
