"""A DaemonSet's pod spec as `podman run` arguments: what the kubelet would give the container,
so the e2e VM runs the image exactly as deploy/kubernetes/daemonset.yaml says.

Strict: a field of the pod spec, container, securityContext or volume that is not mapped here
raises UnknownField, so a new field in the YAML fails the tests (tests/unit/
test_deploy_kubernetes.py) until this mapping, and with it the VM scenario 18-daemonset, follows.
Fields that only the scheduler or the API server use are accepted and say why.
"""

from __future__ import annotations

# Fields podman has no part in (placement, identity, probes run by the kubelet, ports that
# hostNetwork makes the node's anyway), each accepted on purpose.
POD_IGNORED = {"nodeSelector", "tolerations", "priorityClassName", "serviceAccountName",
               "automountServiceAccountToken", "dnsPolicy"}
CONTAINER_IGNORED = {"name", "image", "imagePullPolicy", "ports", "readinessProbe", "livenessProbe"}
POD_KNOWN = POD_IGNORED | {"hostNetwork", "terminationGracePeriodSeconds", "containers",
                           "initContainers", "volumes"}
CONTAINER_KNOWN = CONTAINER_IGNORED | {"command", "args", "resources", "securityContext", "volumeMounts"}
SECURITY_KNOWN = {"runAsUser", "runAsGroup", "runAsNonRoot", "privileged", "allowPrivilegeEscalation",
                  "readOnlyRootFilesystem", "capabilities", "seccompProfile"}


class UnknownField(ValueError):
    pass


def _only(d: dict, known: set, where: str) -> None:
    unknown = set(d) - known
    if unknown:
        raise UnknownField(f"{where}: {sorted(unknown)} not mapped to podman (tests/e2e/guest/podspec.py)")


def _memory(q: str) -> str:
    units = {"Ki": "k", "Mi": "m", "Gi": "g"}
    for suffix, p in units.items():
        if q.endswith(suffix):
            return q[: -len(suffix)] + p
    raise UnknownField(f"memory quantity {q!r}")


def volume_sources(pod: dict, provided: dict[str, str]) -> dict[str, str]:
    """{volume name: host path to bind}: hostPath volumes as they are; configMap and projected
    volumes from `provided` (directories the caller filled as the kubelet would)."""
    out = {}
    for v in pod.get("volumes", []):
        _only(v, {"name", "hostPath", "configMap", "projected"}, f"volume {v.get('name')}")
        if "hostPath" in v:
            _only(v["hostPath"], {"path", "type"}, f"volume {v['name']}.hostPath")
            out[v["name"]] = v["hostPath"]["path"]
        elif v["name"] in provided:
            out[v["name"]] = provided[v["name"]]
        else:
            raise UnknownField(f"volume {v['name']}: a configMap/projected volume the caller did not provide")
    return out


def host_path_types(pod: dict) -> dict[str, str]:
    """{host path: hostPath type} (the caller makes DirectoryOrCreate ones, as the kubelet does)."""
    return {v["hostPath"]["path"]: v["hostPath"].get("type", "") for v in pod.get("volumes", [])
            if "hostPath" in v}


def run_args(pod: dict, container: dict, image: str, provided: dict[str, str]) -> list[str]:
    """`podman run` arguments (without `podman run` and without -d/--rm/--name) for `container`
    of pod spec `pod`; `provided`: see volume_sources."""
    _only(pod, POD_KNOWN, "pod spec")
    _only(container, CONTAINER_KNOWN, f"container {container.get('name')}")
    sources = volume_sources(pod, provided)
    args = []
    if pod.get("hostNetwork"):
        # The node's network and, as the CRI runtimes give a hostNetwork pod, its UTS namespace:
        # the node's hostname (the name the kubelet's self-signed certificate holds).
        args += ["--network=host", "--uts=host"]
    if "terminationGracePeriodSeconds" in pod:
        args.append(f"--stop-timeout={pod['terminationGracePeriodSeconds']}")
    sc = container.get("securityContext", {})
    _only(sc, SECURITY_KNOWN, f"container {container['name']}.securityContext")
    if sc.get("privileged"):
        args.append("--privileged")
    args.append(f"--user={sc.get('runAsUser', 0)}:{sc.get('runAsGroup', 0)}")
    caps = sc.get("capabilities", {})
    _only(caps, {"drop", "add"}, "capabilities")
    for c in caps.get("drop", []):
        args.append(f"--cap-drop={c.lower()}")
    for c in caps.get("add", []):
        args.append(f"--cap-add={c.lower()}")
    if sc.get("allowPrivilegeEscalation") is False:
        args.append("--security-opt=no-new-privileges")
    seccomp = sc.get("seccompProfile", {}).get("type", "RuntimeDefault")
    if seccomp != "RuntimeDefault":  # podman's default profile is the runtime's default
        raise UnknownField(f"seccompProfile {seccomp}")
    if sc.get("readOnlyRootFilesystem"):
        # As the kubelet: a read-only root and no tmpfs podman would add on /run, /tmp.
        args += ["--read-only", "--read-only-tmpfs=false"]
    res = container.get("resources", {})
    _only(res, {"requests", "limits"}, "resources")
    _only(res.get("limits", {}), {"memory", "cpu"}, "resources.limits")
    if "memory" in res.get("limits", {}):
        args.append(f"--memory={_memory(res['limits']['memory'])}")
    # A CPU limit is left out on purpose: under TCG the guest's CPU is 10-20x slower than a real
    # one (docs/BENCHMARKS.md), so the DaemonSet's 200m would throttle the daemon as 1-2 % of a
    # real core would. What the VM checks of the resources is the memory side.
    for m in container.get("volumeMounts", []):
        _only(m, {"name", "mountPath", "readOnly"}, f"volumeMount {m.get('name')}")
        opts = "ro" if m.get("readOnly") else "rw"
        args.append(f"--volume={sources[m['name']]}:{m['mountPath']}:{opts}")
    if "command" in container:
        args.append(f"--entrypoint={container['command'][0]}")
    args.append(image)
    if "command" in container:
        args += container["command"][1:]
    args += container.get("args", [])
    return args
