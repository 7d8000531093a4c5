"""The kubelet's `/pods` JSON (a PodList, a Pod, or a list of Pods) -> Pod records.

Only what the planner needs is kept: memory requests and limits per container
(with the API server's defaulting), the QoS class, and the IDs of running
containers. Malformed pods are dropped one by one with a warning that names
the pod and the field; a malformed document as a whole raises `PodsError`.

Requests and limits are those the kubelet has *allocated* (in-place resize):
the kubelet sizes a pod's cgroups from its allocation (`allocation.Manager`
`UpdatePodFromAllocation`, then `ResourceConfigForPod` of that pod), not from
the spec, which may ask for a resize the kubelet has not admitted. Which
status field says what, and where each rule comes from: `_allocated` below and
docs/DESIGN.md "Where the numbers come from".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Iterable

from .quantity import QuantityError, format_bytes, parse_quantity, to_bytes

__all__ = ["PodsError", "Container", "Pod", "parse_pods", "pod_request", "containers_peak", "qos_class"]

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
    pod_request: int | None = None  # pod-level resources.requests.memory, as allocated
    pod_limit: int | None = None  # pod-level resources.limits.memory, as allocated
    # The kubelet reports a resize it has not allocated (PodResizePending's reason: Deferred,
    # Infeasible; or the older status.resize): the values above are what it did allocate.
    resize_pending: str | None = None

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
    return containers_peak(pod, lambda c: c.request) + pod.overhead


def containers_peak(pod: Pod, amount: Callable[[Container], int]) -> int:
    """The most the pod's containers hold at once of `amount` (a request, a limit): app containers
    and sidecars together, or an init container with the sidecars declared before it."""
    app = sum(amount(c) for c in pod.containers if c.kind == "app")
    sidecars = 0
    init_peak = 0
    for c in pod.containers:
        if c.kind == "sidecar":
            sidecars += amount(c)
            init_peak = max(init_peak, sidecars)
        elif c.kind == "init":
            init_peak = max(init_peak, amount(c) + sidecars)
    return max(app + sidecars, init_peak)


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


@dataclass(frozen=True)
class _Reported:
    """What the kubelet reports of one container (an entry of status.containerStatuses or
    status.initContainerStatuses, matched to the spec by name)."""
    container_id: str | None  # the containerID while it runs
    allocated: dict | None  # allocatedResources: the requests it allocated ({"cpu": q, "memory": q})
    enacted: tuple[dict, dict] | None  # resources: (requests, limits) enacted on the container


def _statuses(status: dict, key: str) -> dict[str, _Reported]:
    """status.<key> by container name. The kubelet fills both resource fields in
    `Kubelet.convertToAPIContainerStatuses` (pkg/kubelet/kubelet_pods.go), only for a container
    the runtime knows: `allocatedResources` = the allocated container's requests (no limits);
    `resources` = the allocated requests and limits, with what the runtime reports enacted
    (its memory limit) in place of the allocated value while it runs."""
    out: dict[str, _Reported] = {}
    for i, cs in enumerate(_get(status, key, list, [], "status.")):
        w = f"status.{key}[{i}]."
        if not isinstance(cs, dict):
            raise _BadPod(f"{w[:-1]}: expected a map")
        name = cs.get("name")
        if not isinstance(name, str):
            continue  # matches no container of the spec
        state = _get(cs, "state", dict, {}, w)
        cid = cs.get("containerID")
        running = cid if "running" in state and isinstance(cid, str) and cid else None
        allocated = None
        if cs.get("allocatedResources") is not None:
            allocated = _resource_list(cs, "allocatedResources", w)
        enacted = _status_resources(cs, w)
        seen = out.get(name)
        if seen is not None and (seen.allocated, seen.enacted) != (allocated, enacted):
            # The API leaves statuses that share a name undefined; which one is allocated is unknowable.
            raise _BadPod(f"{w}name: {one_line(repr(name), 80)} is reported twice with different resources")
        out[name] = _Reported(running or (seen.container_id if seen else None), allocated, enacted)
    return out


def _resource_list(obj: dict, key: str, where: str) -> dict[str, Fraction]:
    """A ResourceList of the status: its cpu and memory, each checked as the spec's are."""
    rl = _get(obj, key, dict, {}, where)
    out = {n: q for n in ("cpu", "memory") if (q := _quantity(rl, n, f"{where}{key}.")) is not None}
    _bytes(out.get("memory"), f"{where}{key}.memory")
    return out


def _status_resources(obj: dict, where: str) -> tuple[dict, dict] | None:
    """A ResourceRequirements of the status (`resources`), or None when it has none."""
    if obj.get("resources") is None:
        return None
    requests, limits = _resources(obj, where)
    _bytes(requests.get("memory"), f"{where}resources.requests.memory")
    _bytes(limits.get("memory"), f"{where}resources.limits.memory")
    return requests, limits


# status.resize (deprecated since v1.33 for the two conditions, still in the API types): these
# values say the spec is not allocated ("Proposed": the kubelet has not looked at it yet).
_LEGACY_PENDING = ("Proposed", "Deferred", "Infeasible")


def _resize_pending(status: dict) -> str | None:
    """The reason the kubelet gives for not having allocated the spec, or None.

    The `PodResizePending` condition "indicates that the pod has been resized, but kubelet has
    not yet allocated the resources" (reason Deferred: fits the node, not now; Infeasible: does
    not fit, not retried). It may stand beside `PodResizeInProgress` (an earlier resize being
    enacted). Set by the kubelet's `allocation.manager.handlePodResourcesResize`; read as the
    scheduler's helpers do (component-helpers `resource.IsPodResizeInfeasible`), an explicit
    status "False" aside. Before v1.33 the same was the `status.resize` field.
    """
    reason = None
    for i, cond in enumerate(_get(status, "conditions", list, [], "status.")):
        w = f"status.conditions[{i}]."
        if not isinstance(cond, dict):
            raise _BadPod(f"{w[:-1]}: expected a map, got {type(cond).__name__}")
        if _get(cond, "type", str, "", w) == "PodResizePending" and _get(cond, "status", str, "", w) != "False":
            given = _get(cond, "reason", str, "", w)
            reason = reason or one_line(given, 40) or "no reason given"
    legacy = _get(status, "resize", str, "", "status.")
    return reason or (legacy if legacy in _LEGACY_PENDING else None)


def _allocated(spec: tuple[dict, dict], seen: _Reported | None, pending: bool) \
        -> tuple[Fraction | None, Fraction | None, bool]:
    """(memory request, memory limit) the kubelet allocated to one container, and whether
    neither is known (a resize pending, and nothing reported for the container).

    1. `allocatedResources` when reported: the allocated requests themselves.
    2. else, while a resize is pending, `resources`: the spec is not allocated, and with
       nothing in progress what is enacted is what was allocated.
    3. else the spec: with nothing pending it is what the kubelet allocated, also while a
       resize is in progress (its `resources` still show the old values).
    Limits are not in `allocatedResources`: the spec's, or `resources`' when the spec is known
    not to be allocated (pending, or its requests differ from `allocatedResources`).
    """
    spec_req, spec_lim = spec
    allocated = seen.allocated if seen else None
    enacted = seen.enacted if seen else None
    unallocated = pending or (allocated is not None and any(
        q != spec_req.get(name) for name, q in allocated.items()))
    if unallocated and enacted is not None:
        limit = enacted[1].get("memory")
    elif pending:
        limit = None
    else:
        limit = spec_lim.get("memory")
    if allocated is not None:
        request = allocated.get("memory")
    elif pending:
        request = enacted[0].get("memory") if enacted is not None else None
    else:
        request = spec_req.get("memory")
    if request is None and limit is not None:
        request = limit  # the API server's defaulting, as for the spec
    return request, limit, pending and allocated is None and enacted is None


def _pod_allocated(spec: tuple[dict, dict], status: dict, pending: bool, overhead: Fraction) \
        -> tuple[Fraction | None, Fraction | None]:
    """Pod-level (memory request, memory limit) as allocated; None where the pod sets none (or,
    while a resize is pending, where the kubelet reports none).

    The kubelet reports them with InPlacePodLevelResourcesVerticalScaling
    (`Kubelet.convertStatusToAPIStatus`): `status.allocatedResources` = `PodRequests` of the
    allocated pod (overhead included), `status.resources` = its requests and the pod cgroup's
    limits (overhead included; `convertToAPIPodLevelResourcesStatus`). Same order as
    `_allocated`; the overhead is taken off, as Pod holds it apart.
    """
    spec_req, spec_lim = spec[0].get("memory"), spec[1].get("memory")
    total = _resource_list(status, "allocatedResources", "status.").get("memory")
    enacted = _status_resources(status, "status.")
    request = spec_req
    if spec_req is not None and total is not None:
        request = max(total - overhead, Fraction(0))
    elif spec_req is not None and pending:
        request = enacted[0].get("memory") if enacted is not None else None
        request = None if request is None else max(request - overhead, Fraction(0))
    unallocated = pending or (spec_req is not None and request != spec_req)
    limit = spec_lim
    if spec_lim is not None and unallocated:
        limit = enacted[1].get("memory") if enacted is not None else None
        limit = None if limit is None else max(limit - overhead, Fraction(0))
    return request, limit


def _parse_pod(obj: Any, index: int) -> tuple[Pod | None, str | None]:
    """One Pod (None for finished pods) and a notice of a pending resize. Raises _BadPod naming
    the field."""
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
        return None, None

    pending = _resize_pending(status)
    reported = {"containers": _statuses(status, "containerStatuses"),
                "initContainers": _statuses(status, "initContainerStatuses")}
    containers: list[Container] = []
    asked: list[Container] = []  # the same from the spec alone, to say what a pending resize asks
    unknown: list[str] = []
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
            # The QoS class comes from the spec and never changes on resize (the API server
            # refuses a resize that would change it), so it is never taken from the status.
            qos_specs.append((requests, limits))
            seen = reported[key].get(cname)
            request, limit, not_known = _allocated((requests, limits), seen, pending is not None)
            if not_known:
                unknown.append(cname)
            cid = seen.container_id if seen and kind in ("app", "sidecar") else None
            what = f"{where}resources.requests.memory"
            containers.append(Container(name=cname, kind=kind, request=_bytes(request, what) or 0,
                                        limit=_bytes(limit, f"{where}resources.limits.memory"), container_id=cid))
            asked.append(Container(name=cname, kind=kind, request=_bytes(requests.get("memory"), what) or 0,
                                   limit=None))
    overhead_rl = _get(spec, "overhead", dict, {}, "spec.")
    overhead_q = _quantity(overhead_rl, "memory", "spec.overhead.") or Fraction(0)
    overhead = _bytes(overhead_q, "spec.overhead.memory")
    pod_level = None
    pod_req = pod_lim = spec_pod_req = None
    if "resources" in spec:
        pod_level = _resources(spec, "spec.")
        spec_pod_req = _bytes(pod_level[0].get("memory"), "spec.resources.requests.memory")
        preq, plim = _pod_allocated(pod_level, status, pending is not None, overhead_q)
        pod_req = _bytes(preq, "spec.resources.requests.memory")
        pod_lim = _bytes(plim, "spec.resources.limits.memory")

    qos = _get(status, "qosClass", str, "", "status.")
    if qos and qos not in QOS_CLASSES:
        raise _BadPod(f"status.qosClass: {qos!r} is not one of {', '.join(QOS_CLASSES)}")
    if not qos:
        qos = qos_class(qos_specs, pod_level)
    pod = Pod(uid=uid, namespace=ns, name=name, qos=qos, containers=tuple(containers),
              overhead=overhead, pod_request=pod_req, pod_limit=pod_lim, resize_pending=pending)
    if pending is None:
        return pod, None
    spec_pod = dataclasses.replace(pod, containers=tuple(asked), pod_request=spec_pod_req)
    return pod, _pending_notice(pod, pod_request(spec_pod), unknown)


def _pending_notice(pod: Pod, asked: int, unknown: list[str]) -> str:
    """One line, the same on every poll while the resize stays pending (logged once)."""
    used = pod.request
    note = (f"pod {pod.display}: resize pending ({pod.resize_pending}): the kubelet has not allocated the"
            f" spec's resources; planned from what it allocated: memory request {format_bytes(used)}")
    note += f" (the spec asks {format_bytes(asked)})" if asked != used else ", as in the spec"
    if unknown:
        names = ", ".join(repr(one_line(n, 40)) for n in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
        note += f"; nothing allocated is reported for container {names}: counted as 0 until it is"
    return note


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
            pod, notice = _parse_pod(obj, i)
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
        if notice:
            warnings.append(notice)
    return pods, warnings


def count_finished(doc: Any) -> int:
    """How many pods of a pods document have finished (phase Succeeded or Failed): they hold no
    memory and get nothing; `plan` says how many it left out. 0 for a document parse_pods refuses."""
    try:
        items = _items(doc)
    except PodsError:
        return 0
    return sum(1 for obj in items if isinstance(obj, dict) and isinstance(obj.get("status"), dict)
               and obj["status"].get("phase") in _DONE_PHASES)


def _ident(obj: Any, i: int) -> str:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if isinstance(meta, dict) and isinstance(meta.get("name"), str):
        ns = meta.get("namespace") if isinstance(meta.get("namespace"), str) else "default"
        return one_line(f"{ns}/{meta['name']}", 120)  # as Pod.display writes it: unquoted
    return f"#{i}"
