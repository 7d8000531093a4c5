"""The kubelet's `/pods` JSON (a PodList, a Pod, or a list of Pods) -> Pod records.

Only what the planner needs is kept: memory requests and limits per container
(with the API server's defaulting), the QoS class, and the IDs of running
containers. Malformed pods are dropped one by one with a warning that names
the pod and the field; a malformed document as a whole raises `PodsError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Iterable

from .quantity import QuantityError, parse_quantity, to_bytes

__all__ = ["PodsError", "Container", "Pod", "parse_pods", "pod_request", "qos_class"]

QOS_CLASSES = ("Guaranteed", "Burstable", "BestEffort")
_DONE_PHASES = ("Succeeded", "Failed")
# A node runs at most a few hundred pods; far more is garbage, not a node.
MAX_PODS = 20000
MAX_CONTAINERS = 1000


class PodsError(ValueError):
    """The pods document as a whole is unusable (the message says why)."""


class _BadPod(ValueError):
    pass


@dataclass(frozen=True)
class Container:
    name: str
    kind: str  # "app" | "init" | "sidecar" (restartable init container)
    request: int  # memory request in bytes after defaulting (0 when none)
    limit: int | None  # memory limit in bytes, None when unlimited
    container_id: str | None = None  # raw status containerID when running, e.g. containerd://...


@dataclass(frozen=True)
class Pod:
    uid: str
    namespace: str
    name: str
    qos: str
    containers: tuple[Container, ...]
    overhead: int = 0
    pod_request: int | None = None  # spec.resources.requests.memory (pod-level resources)
    pod_limit: int | None = None  # spec.resources.limits.memory

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def display(self) -> str:
        """The key as it may appear in a log line: one line, bounded."""
        return one_line(self.key)

    @property
    def request(self) -> int:
        return pod_request(self)


def one_line(text: str, limit: int = 160) -> str:
    """Untrusted text for a log line: control characters escaped, at most `limit` characters."""
    shown = repr(text[: limit + 1])[1:-1]
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def pod_request(pod: Pod) -> int:
    """The pod's memory request as the kubelet computes it (PodRequests).

    max(sum of app + sidecar requests, max over init containers of (its
    request + sidecars declared before it)) + overhead; a pod-level request
    replaces the container part.
    """
    if pod.pod_request is not None:
        return pod.pod_request + pod.overhead
    app = sum(c.request for c in pod.containers if c.kind == "app")
    sidecars = 0
    init_peak = 0
    for c in pod.containers:
        if c.kind == "sidecar":
            sidecars += c.request
            init_peak = max(init_peak, sidecars)
        elif c.kind == "init":
            init_peak = max(init_peak, c.request + sidecars)
    return max(app + sidecars, init_peak) + pod.overhead


def _get(obj: Any, key: str, kind: type | tuple, default: Any, where: str) -> Any:
    value = obj.get(key, default) if isinstance(obj, dict) else default
    if value is None:
        return default
    if not isinstance(value, kind) or isinstance(value, bool):
        raise _BadPod(f"{where}{key}: expected {_kind_name(kind)}, got {type(value).__name__}")
    return value


def _kind_name(kind) -> str:
    names = {dict: "a map", list: "a list", str: "a string"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _quantity(rl: dict, name: str, where: str) -> Fraction | None:
    if name not in rl or rl[name] is None:
        return None
    try:
        q = parse_quantity(rl[name])
    except QuantityError:
        raise _BadPod(f"{where}{name}: {one_line(repr(rl[name]), 80)} is not a quantity") from None
    if q < 0:
        raise _BadPod(f"{where}{name}: {one_line(repr(rl[name]), 80)} is negative")
    return q


def _bytes(q: Fraction | None, where: str) -> int | None:
    if q is None:
        return None
    try:
        return to_bytes(q, where)
    except QuantityError as e:
        raise _BadPod(str(e)) from None


def _resources(c: dict, where: str) -> tuple[dict, dict]:
    res = _get(c, "resources", dict, {}, where)
    req = _get(res, "requests", dict, {}, f"{where}resources.")
    lim = _get(res, "limits", dict, {}, f"{where}resources.")
    # The API server defaults a request to the limit when only the limit is set.
    requests = {}
    limits = {}
    for name in ("cpu", "memory"):
        r = _quantity(req, name, f"{where}resources.requests.")
        l_ = _quantity(lim, name, f"{where}resources.limits.")
        if r is None and l_ is not None:
            r = l_
        if r is not None:
            requests[name] = r
        if l_ is not None:
            limits[name] = l_
    return requests, limits


def qos_class(specs: Iterable[tuple[dict, dict]], pod_level: tuple[dict, dict] | None = None) -> str:
    """The kubelet's QoS rules (GetPodQOS) over (requests, limits) of cpu and memory.

    `specs` covers init and app containers; `pod_level` replaces them when the pod
    sets spec.resources.
    """
    if pod_level is not None and (pod_level[0] or pod_level[1]):
        specs = [pod_level]
    req_sum: dict[str, Fraction] = {}
    lim_sum: dict[str, Fraction] = {}
    guaranteed = True
    for requests, limits in specs:
        for name, q in requests.items():
            if q > 0:
                req_sum[name] = req_sum.get(name, Fraction(0)) + q
        found = set()
        for name, q in limits.items():
            if q > 0:
                found.add(name)
                lim_sum[name] = lim_sum.get(name, Fraction(0)) + q
        if found != {"cpu", "memory"}:
            guaranteed = False
    if not req_sum and not lim_sum:
        return "BestEffort"
    if guaranteed:
        for name, q in req_sum.items():
            if lim_sum.get(name) != q:
                guaranteed = False
                break
    if guaranteed and len(req_sum) == len(lim_sum):
        return "Guaranteed"
    return "Burstable"


def _running_ids(status: dict, key: str, where: str) -> dict[str, str]:
    out = {}
    for i, cs in enumerate(_get(status, key, list, [], where)):
        w = f"{where}{key}[{i}]."
        if not isinstance(cs, dict):
            raise _BadPod(f"{w[:-1]}: expected a map")
        state = _get(cs, "state", dict, {}, w)
        cid = cs.get("containerID")
        name = cs.get("name")
        if "running" in state and isinstance(cid, str) and cid and isinstance(name, str):
            out[name] = cid
    return out


def _parse_pod(obj: Any, index: int) -> Pod | None:
    """One Pod; None for finished pods. Raises _BadPod naming the field."""
    if not isinstance(obj, dict):
        raise _BadPod(f"item {index}: expected a Pod object, got {type(obj).__name__}")
    meta = _get(obj, "metadata", dict, {}, "")
    ns = _get(meta, "namespace", str, "default", "metadata.")
    name = _get(meta, "name", str, "", "metadata.")
    uid = _get(meta, "uid", str, "", "metadata.")
    if not name:
        raise _BadPod("metadata.name: missing")
    if not uid:
        raise _BadPod("metadata.uid: missing")
    spec = _get(obj, "spec", dict, None, "")
    if spec is None:
        raise _BadPod("spec: missing")
    status = _get(obj, "status", dict, {}, "")
    if _get(status, "phase", str, "", "status.") in _DONE_PHASES:
        return None

    running = _running_ids(status, "containerStatuses", "status.")
    running_init = _running_ids(status, "initContainerStatuses", "status.")
    containers: list[Container] = []
    qos_specs: list[tuple[dict, dict]] = []
    for key, default_kind in (("initContainers", "init"), ("containers", "app")):
        items = _get(spec, key, list, [], "spec.")
        if len(items) > MAX_CONTAINERS:
            raise _BadPod(f"spec.{key}: more than {MAX_CONTAINERS} containers")
        for i, c in enumerate(items):
            where = f"spec.{key}[{i}]."
            if not isinstance(c, dict):
                raise _BadPod(f"{where[:-1]}: expected a map, got {type(c).__name__}")
            cname = _get(c, "name", str, "", where)
            if not cname:
                raise _BadPod(f"{where}name: missing")
            kind = default_kind
            if kind == "init" and c.get("restartPolicy") == "Always":
                kind = "sidecar"
            requests, limits = _resources(c, where)
            qos_specs.append((requests, limits))
            cid = (running_init if key == "initContainers" else running).get(cname)
            containers.append(Container(
                name=cname, kind=kind,
                request=_bytes(requests.get("memory"), f"{where}resources.requests.memory") or 0,
                limit=_bytes(limits.get("memory"), f"{where}resources.limits.memory"),
                container_id=cid if kind in ("app", "sidecar") else None,
            ))
    pod_level = None
    pod_req = pod_lim = None
    if "resources" in spec:
        preq, plim = _resources(spec, "spec.")
        pod_level = (preq, plim)
        pod_req = _bytes(preq.get("memory"), "spec.resources.requests.memory")
        pod_lim = _bytes(plim.get("memory"), "spec.resources.limits.memory")
    overhead_rl = _get(spec, "overhead", dict, {}, "spec.")
    overhead = _bytes(_quantity(overhead_rl, "memory", "spec.overhead."), "spec.overhead.memory") or 0

    qos = _get(status, "qosClass", str, "", "status.")
    if qos and qos not in QOS_CLASSES:
        raise _BadPod(f"status.qosClass: {qos!r} is not one of {', '.join(QOS_CLASSES)}")
    if not qos:
        qos = qos_class(qos_specs, pod_level)
    return Pod(uid=uid, namespace=ns, name=name, qos=qos, containers=tuple(containers),
               overhead=overhead, pod_request=pod_req, pod_limit=pod_lim)


def _items(doc: Any) -> list:
    if isinstance(doc, list):
        return doc
    if isinstance(doc, dict):
        kind = doc.get("kind")
        if kind == "Pod" or (kind is None and "spec" in doc and "metadata" in doc):
            return [doc]
        if kind in ("PodList", "List") or (kind is None and "items" in doc):
            items = doc.get("items")
            if items is None:
                return []
            if not isinstance(items, list):
                raise PodsError(f"items: expected a list, got {type(items).__name__}")
            return items
        raise PodsError(f"kind: {kind!r} is not PodList, Pod or a list of Pods")
    raise PodsError(f"expected a PodList, a Pod or a list of Pods, got {type(doc).__name__}")


def parse_pods(doc: Any) -> tuple[list[Pod], list[str]]:
    """Parse a pods document. Returns (pods, warnings); bad pods are skipped with a warning."""
    items = _items(doc)
    if len(items) > MAX_PODS:
        raise PodsError(f"items: {len(items)} pods is more than {MAX_PODS}; this is not a node's pod list")
    pods: list[Pod] = []
    warnings: list[str] = []
    seen: set[str] = set()
    for i, obj in enumerate(items):
        try:
            pod = _parse_pod(obj, i)
        except _BadPod as e:
            warnings.append(f"pod {_ident(obj, i)}: {e}; pod skipped")
            continue
        except RecursionError:
            warnings.append(f"pod {_ident(obj, i)}: nested too deeply; pod skipped")
            continue
        if pod is None:
            continue
        if pod.uid in seen:
            warnings.append(f"pod {pod.display}: metadata.uid {one_line(pod.uid)!r} appears twice; later copy skipped")
            continue
        seen.add(pod.uid)
        pods.append(pod)
    return pods, warnings


def _ident(obj: Any, i: int) -> str:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if isinstance(meta, dict) and isinstance(meta.get("name"), str):
        ns = meta.get("namespace") if isinstance(meta.get("namespace"), str) else "default"
        return repr(f"{ns}/{meta['name']}"[:120])
    return f"#{i}"
