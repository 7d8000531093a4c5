"""deploy/kubernetes/ (the DaemonSet route, issue 18) and its uninstall, as Kubernetes objects.

Rendered as `kubectl apply -k` would (tests/manifests.py), checked against the Kubernetes API in
test_deploy_kubernetes_api.py, and tied to the
daemon's own paths and settings, so the manifests cannot drift from the code. podspec (the VM
scenario 18-daemonset's `podman run`) is checked against the same YAML: same mounts, user,
capabilities.
"""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path

import pytest
import yaml

from memqos_systemd import agenda, cgroupfs, config, last_pods, ledger, metrics, node
from memqos_systemd.config import parse_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e" / "guest"))
import manifests  # noqa: E402
import podspec  # noqa: E402


def _repo() -> Path:
    for d in Path(__file__).resolve().parents:
        if (d / "deploy" / "kubernetes").is_dir():
            return d
    pytest.fail("deploy/kubernetes/ not found above tests/ (debian/pybuild.testfiles must copy deploy)")


REPO = _repo()
DEPLOY = REPO / "deploy" / "kubernetes"
UNINSTALL = REPO / "deploy" / "kubernetes-uninstall"
NS = "memqos-system"


@pytest.fixture(scope="module")
def objs():
    return manifests.by_key(manifests.render(DEPLOY))


@pytest.fixture(scope="module")
def pod(objs):
    return objs[("DaemonSet", "memqos-systemd")]["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def ctr(pod):
    assert len(pod["containers"]) == 1
    return pod["containers"][0]


def mounts(container: dict) -> dict[str, dict]:
    return {m["mountPath"]: m for m in container["volumeMounts"]}


def host_paths(pod: dict) -> dict[str, str]:
    return {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}


def test_the_kustomization_makes_the_rbac_without_its_long_lived_token_and_the_daemonset(objs):
    assert set(objs) == {("Namespace", NS), ("ServiceAccount", "memqos-systemd"),
                         ("ClusterRole", "memqos-systemd-pod-reader"),
                         ("ClusterRoleBinding", "memqos-systemd-pod-reader"),
                         ("ConfigMap", "memqos-systemd-config"), ("DaemonSet", "memqos-systemd"),
                         ("Service", "memqos-systemd-metrics")}
    labels = objs[("Namespace", NS)]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"  # hostPath, hostNetwork
    for (kind, _), o in objs.items():
        if kind not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert o["metadata"]["namespace"] == NS, o


def test_the_configmap_is_a_config_the_daemon_accepts_and_matches_the_pod(objs, pod, ctr):
    text = objs[("ConfigMap", "memqos-systemd-config")]["data"]["config.yaml"]
    cfg = parse_config(yaml.safe_load(text))
    m = mounts(ctr)
    # The image's entry point reads DEFAULT_CONFIG_PATH: the ConfigMap is mounted there.
    cfg_dir = str(Path(config.DEFAULT_CONFIG_PATH).parent)
    assert m[cfg_dir]["readOnly"] and Path(config.DEFAULT_CONFIG_PATH).name in \
        objs[("ConfigMap", "memqos-systemd-config")]["data"]
    # The token file is the projected token, mounted read-only with mode 0400.
    token_vol = next(v for v in pod["volumes"] if v["name"] == "kubelet-token")["projected"]
    token_path = next(s["serviceAccountToken"]["path"] for s in token_vol["sources"])
    token_mount = next(k for k, v in m.items() if v["name"] == "kubelet-token")
    assert cfg.kubelet.token_file == f"{token_mount}/{token_path}" and token_vol["defaultMode"] == 0o400
    assert pod["automountServiceAccountToken"] is False
    # The CA file is the node's kubelet.crt, at the same path.
    assert m[cfg.kubelet.ca_file]["readOnly"] and host_paths(pod)["kubelet-ca"] == cfg.kubelet.ca_file
    assert cfg.kubelet.url == "https://127.0.0.1:10250/pods" and pod["hostNetwork"] is True
    # The metrics port is the container's, the probe's and the Service's.
    port = int(cfg.metrics.listen.rpartition(":")[2])
    assert ctr["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    assert ctr["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert ctr["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
    # /livez turns 503 only after the loop missed several beats; the kubelet restarts the daemon
    # within the "about 90 s" its comment says.
    live = ctr["livenessProbe"]
    assert agenda.HEARTBEAT_INTERVAL * 3 <= metrics.LIVENESS_WINDOW
    assert metrics.LIVENESS_WINDOW + live["periodSeconds"] * live["failureThreshold"] <= 90
    svc = objs[("Service", "memqos-systemd-metrics")]["spec"]
    assert svc["ports"][0]["targetPort"] == "metrics" and svc["selector"] == \
        objs[("DaemonSet", "memqos-systemd")]["spec"]["selector"]["matchLabels"]
    monitor = yaml.safe_load((DEPLOY / "podmonitor.yaml").read_text())
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


def test_the_pod_gets_exactly_the_host_access_the_daemon_uses(pod, ctr):
    m = mounts(ctr)
    hp = host_paths(pod)
    by_name = {v["name"]: k for k, v in m.items()}
    # Host path = path in the container, for each host access, at the daemon's own paths.
    expected = {
        node.SYSTEM_BUS_SOCKET: ("Socket", False),
        str(cgroupfs.ROOT): ("Directory", False),  # memory.oom.group is written back (DESIGN)
        "/proc/meminfo": ("File", True),
        str(ledger.DEFAULT_PATH.parent): ("DirectoryOrCreate", False),
        "/var/lib/kubelet/pki/kubelet.crt": ("File", True),
        "/run/udev": ("Directory", True),
        node.BOOTED_DIR: ("Directory", True),  # for `check` in the pod
    }
    assert ledger.DEFAULT_PATH.parent == last_pods.DEFAULT_PATH.parent
    types = podspec.host_path_types(pod)
    assert set(hp.values()) == set(expected)
    for name, path in hp.items():
        assert by_name[name] == path, name
        assert (types[path], bool(m[path].get("readOnly"))) == expected[path], path
    assert set(m) == set(expected) | {"/etc/memqos-systemd", "/var/run/secrets/memqos-systemd"}


def test_uid_0_with_no_capability_not_privileged(ctr):
    sc = ctr["securityContext"]
    assert sc["runAsUser"] == 0 and sc["runAsNonRoot"] is False
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["readOnlyRootFilesystem"] is True


def test_placement_priority_resources_and_rollout(objs, pod, ctr):
    ds = objs[("DaemonSet", "memqos-systemd")]["spec"]
    assert pod["nodeSelector"] == {"memqos-systemd/cgroup-driver": "systemd"}
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["priorityClassName"] == "system-node-critical"
    assert ds["updateStrategy"] == {"type": "RollingUpdate",
                                    "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    # Guaranteed, so that the daemon's own plan gives its pod MemoryMin = request, and node-critical,
    # so that the kubelet gives it oom_score_adj -997 (issue 25: the daemon survives the pressure).
    # docs/BENCHMARKS.md measures RSS 35 MiB with 110 pods: 128Mi with room.
    res = ctr["resources"]
    assert res["requests"] == res["limits"] == {"cpu": "200m", "memory": "128Mi"}
    assert [c for c in pod["containers"] if c["resources"].get("requests") != c["resources"].get("limits")] == []
    assert not pod.get("initContainers")  # an init container without limits would make it Burstable


def test_the_image_is_the_packages_version():
    import memqos_systemd

    text = (DEPLOY / "daemonset.yaml").read_text()
    assert re.findall(r"image: (\S+)", text) == [f"memqos-systemd:{memqos_systemd.__version__}"]


def test_uninstall_rolls_the_same_pod_to_reset_then_sleep(objs):
    u = manifests.by_key(manifests.render(UNINSTALL))
    assert set(u) == set(objs)
    for k in objs:
        if k != ("DaemonSet", "memqos-systemd"):
            assert u[k] == objs[k], k
    before = objs[("DaemonSet", "memqos-systemd")]
    after = u[("DaemonSet", "memqos-systemd")]
    assert {k: v for k, v in after["spec"].items() if k != "template"} == \
        {k: v for k, v in before["spec"].items() if k != "template"}
    spec, old = after["spec"]["template"]["spec"], before["spec"]["template"]["spec"]
    assert {k: v for k, v in spec.items() if k not in ("initContainers", "containers")} == \
        {k: v for k, v in old.items() if k != "containers"}
    init = copy.deepcopy(old["containers"][0])
    init.update(name="reset", command=["memqos-systemd", "reset", "--config", config.DEFAULT_CONFIG_PATH])
    del init["readinessProbe"], init["livenessProbe"], init["ports"]
    assert spec["initContainers"] == [init]
    main = copy.deepcopy(old["containers"][0])
    main["command"] = ["sleep", "infinity"]
    del main["readinessProbe"], main["livenessProbe"]  # sleep serves no probe
    assert spec["containers"] == [main]


def test_podman_runs_the_image_with_the_daemonsets_mounts_user_and_capabilities(pod, ctr):
    provided = {"config": "/run/x/config", "kubelet-token": "/run/x/token"}
    args = podspec.run_args(pod, ctr, "IMAGE", provided)
    assert args[-1] == "IMAGE"  # the image's own entry point: memqos-systemd run --config ...
    vols = sorted(a.split("=", 1)[1] for a in args if a.startswith("--volume="))
    sources = podspec.volume_sources(pod, provided)
    assert vols == sorted(f"{sources[m['name']]}:{m['mountPath']}:{'ro' if m.get('readOnly') else 'rw'}"
                          for m in ctr["volumeMounts"])
    assert {"--network=host", "--uts=host", "--user=0:0", "--cap-drop=all", "--security-opt=no-new-privileges",
            "--read-only", "--read-only-tmpfs=false", "--memory=128m"} <= set(args)
    assert not any(a.startswith(("--privileged", "--cap-add")) for a in args)


@pytest.mark.parametrize("where, change", [
    ("pod", {"hostPID": True}),
    ("container", {"env": [{"name": "X", "value": "1"}]}),
    ("securityContext", {"procMount": "Unmasked"}),
    ("volumeMount", {"subPath": "x"}),
])
def test_podspec_refuses_a_field_it_does_not_map(pod, ctr, where, change):
    p, c = copy.deepcopy(pod), copy.deepcopy(ctr)
    {"pod": p, "container": c, "securityContext": c["securityContext"],
     "volumeMount": c["volumeMounts"][0]}[where].update(change)
    with pytest.raises(podspec.UnknownField):
        podspec.run_args(p, c, "IMAGE", {"config": "/c", "kubelet-token": "/t"})
