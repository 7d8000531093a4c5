"""Pods from the kubelet's /pods (issue #2, command contract and Rules).

- Input: a PodList, a single Pod, or a list of Pods (JSON or YAML).
- Container request = requests.memory; only limits.memory -> the request defaults to the limit.
  (As the kubelet allocated it, during an in-place resize: tests/unit/test_resize.py.)
- Pod request = max(sum app + sum sidecars, max over init of (its request + sidecars declared
  before it)) + overhead.memory; pod-level spec.resources.requests.memory replaces the
  container part.
- QoS: status.qosClass when present, else the kubelet's rules (cpu and memory, init included).
- Succeeded/Failed pods are ignored. Scopes only for running app containers and sidecars.
- A bad pod is skipped with a warning naming it and the field; the others survive.
"""

from __future__ import annotations

import json
import uuid

import pytest
import yaml

from memqos_systemd.pods import Container, Pod, PodsError, parse_pods, pod_request

Mi, Gi = 2**20, 2**30
HEX = "0123456789abcdef" * 4


def uid(n: int) -> str:
    return str(uuid.UUID(int=n + 1))


def ctr(name: str, req=None, lim=None, cpu_req=None, cpu_lim=None, sidecar=False) -> dict:
    res: dict = {}
    if req is not None or cpu_req is not None:
        res["requests"] = {k: v for k, v in (("memory", req), ("cpu", cpu_req)) if v is not None}
    if lim is not None or cpu_lim is not None:
        res["limits"] = {k: v for k, v in (("memory", lim), ("cpu", cpu_lim)) if v is not None}
    c = {"name": name, "image": "x", "resources": res}
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


def guaranteed(name: str, mem="1Gi", cpu="1") -> dict:
    return ctr(name, req=mem, lim=mem, cpu_req=cpu, cpu_lim=cpu)


def running(name: str, cid: str | None = None) -> dict:
    return {"name": name, "containerID": cid or f"containerd://{HEX}", "state": {"running": {"startedAt": "x"}}}


def mkpod(name="p", ns="default", n=0, containers=None, init=None, phase="Running", qos=None,
          statuses=None, init_statuses=None, overhead=None, resources=None) -> dict:
    spec: dict = {"containers": containers if containers is not None else [ctr("app")]}
    if init is not None:
        spec["initContainers"] = init
    if overhead is not None:
        spec["overhead"] = {"memory": overhead}
    if resources is not None:
        spec["resources"] = resources
    status: dict = {"phase": phase}
    if qos is not None:
        status["qosClass"] = qos
    if statuses is not None:
        status["containerStatuses"] = statuses
    if init_statuses is not None:
        status["initContainerStatuses"] = init_statuses
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": uid(n)}, "spec": spec, "status": status}


def one(p: dict) -> Pod:
    pods, warnings = parse_pods({"kind": "PodList", "items": [p]})
    assert warnings == []
    assert len(pods) == 1
    return pods[0]


# ------------------------------------------------------------------ document shapes

def test_podlist_pod_and_list():
    a, b = mkpod("a", n=1), mkpod("b", n=2)
    for doc in ({"kind": "PodList", "apiVersion": "v1", "items": [a, b]},
                {"kind": "List", "items": [a, b]},
                {"items": [a, b]},
                [a, b]):
        pods, warnings = parse_pods(doc)
        assert [p.key for p in pods] == ["default/a", "default/b"] and warnings == []
    for doc in (a, {k: v for k, v in a.items() if k not in ("kind", "apiVersion")}):
        pods, _ = parse_pods(doc)
        assert [p.key for p in pods] == ["default/a"]


def test_same_document_as_json_and_yaml():
    doc = {"kind": "PodList", "items": [mkpod("a", n=1, containers=[ctr("c", req="1.5Gi", lim="2Gi")])]}
    from_json = parse_pods(json.loads(json.dumps(doc)))
    from_yaml = parse_pods(yaml.safe_load(yaml.safe_dump(doc)))
    assert from_json == from_yaml
    assert from_json[0][0].containers[0].request == 3 * Gi // 2


def test_yaml_list_of_pods():
    text = """
- metadata: {name: web, namespace: shop, uid: 00000000-0000-0000-0000-000000000001}
  spec:
    containers:
    - name: nginx
      resources: {requests: {memory: 128Mi}, limits: {memory: 256Mi}}
- kind: Pod
  metadata: {name: cache, uid: 00000000-0000-0000-0000-000000000002}
  spec: {containers: [{name: redis}]}
"""
    pods, warnings = parse_pods(yaml.safe_load(text))
    assert warnings == []
    assert [(p.key, p.qos, p.request) for p in pods] == [("shop/web", "Burstable", 128 * Mi),
                                                         ("default/cache", "BestEffort", 0)]


@pytest.mark.parametrize("doc", [{"kind": "PodList", "items": None}, {"kind": "PodList", "items": []}, []])
def test_empty(doc):
    assert parse_pods(doc) == ([], [])


@pytest.mark.parametrize("doc", [{"kind": "Deployment", "spec": {}}, "pods", 5, None, {"kind": "PodList", "items": {}},
                                 {"foo": "bar"}])
def test_not_a_pod_document(doc):
    with pytest.raises(PodsError):
        parse_pods(doc)


# ------------------------------------------------------------------ requests and limits

@pytest.mark.parametrize("c, req, limit", [
    (ctr("c", req="256Mi", lim="1Gi"), 256 * Mi, Gi),
    (ctr("c", req="256Mi"), 256 * Mi, None),
    (ctr("c", lim="1Gi"), Gi, Gi),  # only the limit: the API server defaults the request to it
    (ctr("c"), 0, None),
    (ctr("c", cpu_req="1"), 0, None),
    (ctr("c", req="0", lim="1Gi"), 0, Gi),  # an explicit 0 request stays 0
    (ctr("c", req="1.5Gi", lim="2Gi"), 3 * Gi // 2, 2 * Gi),
    (ctr("c", req="500m"), 1, None),  # fractional bytes round up
    (ctr("c", req=134217728), 128 * Mi, None),  # a bare number from YAML
    (ctr("c", req="129e6"), 129_000_000, None),
    ({"name": "c"}, 0, None),  # no resources at all
    ({"name": "c", "resources": None}, 0, None),
    ({"name": "c", "resources": {"requests": None, "limits": {"memory": None}}}, 0, None),
])
def test_container_request_and_limit(c, req, limit):
    got = one(mkpod(containers=[c])).containers[0]
    assert (got.request, got.limit) == (req, limit)


@pytest.mark.parametrize("init, containers, overhead, expected", [
    ([], [ctr("a", req="100Mi"), ctr("b", req="200Mi")], None, 300 * Mi),
    ([], [ctr("a", req="100Mi"), ctr("b", lim="200Mi")], None, 300 * Mi),  # b: request from limit
    ([ctr("i", req="500Mi")], [ctr("a", req="100Mi"), ctr("b", req="200Mi")], None, 500 * Mi),
    ([ctr("i", req="100Mi")], [ctr("a", req="300Mi")], None, 300 * Mi),
    ([ctr("i1", req="400Mi"), ctr("i2", req="600Mi")], [ctr("a", req="100Mi")], None, 600 * Mi),
    # sidecars run with the app containers
    ([ctr("s", req="50Mi", sidecar=True)], [ctr("a", req="100Mi")], None, 150 * Mi),
    # an init container runs next to the sidecars declared before it ...
    ([ctr("s", req="50Mi", sidecar=True), ctr("i", req="200Mi")], [ctr("a", req="100Mi")], None, 250 * Mi),
    # ... but not next to those declared after it
    ([ctr("i", req="200Mi"), ctr("s", req="50Mi", sidecar=True)], [ctr("a", req="100Mi")], None, 200 * Mi),
    ([ctr("s1", req="100Mi", sidecar=True), ctr("s2", req="100Mi", sidecar=True), ctr("i", req="300Mi")],
     [ctr("a", req="50Mi")], None, 500 * Mi),
    ([ctr("s1", req="100Mi", sidecar=True), ctr("i", req="300Mi"), ctr("s2", req="100Mi", sidecar=True)],
     [ctr("a", req="50Mi")], None, 400 * Mi),
    # a sidecar's own start: itself plus the sidecars before it (never the larger term here)
    ([ctr("s1", req="300Mi", sidecar=True), ctr("s2", req="300Mi", sidecar=True)], [], None, 600 * Mi),
    # overhead is added on top
    ([], [ctr("a", req="100Mi")], "10Mi", 110 * Mi),
    ([ctr("i", req="500Mi")], [ctr("a", req="100Mi")], "64Mi", 564 * Mi),
    ([], [ctr("a")], "64Mi", 64 * Mi),
])
def test_pod_request(init, containers, overhead, expected):
    p = one(mkpod(init=init, containers=containers, overhead=overhead))
    assert p.request == expected == pod_request(p)


@pytest.mark.parametrize("resources, overhead, req, limit", [
    ({"requests": {"memory": "1Gi"}}, None, Gi, None),
    ({"requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi"}}, None, Gi, 2 * Gi),
    ({"requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi"}}, "100Mi", Gi + 100 * Mi, 2 * Gi),
    # pod-level limit only: the request defaults to it (the API server's pod-level defaulting)
    ({"limits": {"memory": "2Gi"}}, None, 2 * Gi, 2 * Gi),
    # pod-level cpu only: the container sum still counts for memory
    ({"requests": {"cpu": "1"}}, None, 300 * Mi, None),
    ({}, None, 300 * Mi, None),
])
def test_pod_level_resources(resources, overhead, req, limit):
    p = one(mkpod(containers=[ctr("a", req="100Mi"), ctr("b", req="200Mi", lim="1Gi")], resources=resources,
                  overhead=overhead))
    assert p.request == req
    assert p.pod_limit == limit


# ------------------------------------------------------------------ QoS class

@pytest.mark.parametrize("init, containers, resources, qos", [
    ([], [ctr("a")], None, "BestEffort"),
    ([], [ctr("a"), ctr("b")], None, "BestEffort"),
    ([], [ctr("a", req="0", cpu_req="0")], None, "BestEffort"),  # zero requests do not count
    ([], [guaranteed("a")], None, "Guaranteed"),
    ([], [guaranteed("a"), guaranteed("b", "2Gi", "500m")], None, "Guaranteed"),
    ([], [ctr("a", lim="1Gi", cpu_lim="1")], None, "Guaranteed"),  # requests default to limits
    ([], [ctr("a", req="1Gi", lim="1Gi")], None, "Burstable"),  # memory only: cpu counts too
    ([], [ctr("a", cpu_req="1", cpu_lim="1")], None, "Burstable"),
    ([], [ctr("a", req="512Mi", lim="1Gi", cpu_req="1", cpu_lim="1")], None, "Burstable"),
    ([], [ctr("a", req="1Gi", lim="1Gi", cpu_req="500m", cpu_lim="1")], None, "Burstable"),
    ([], [ctr("a", req="1Gi")], None, "Burstable"),
    ([], [ctr("a", cpu_req="100m")], None, "Burstable"),  # cpu alone makes a pod Burstable
    ([], [guaranteed("a"), ctr("b")], None, "Burstable"),
    ([], [guaranteed("a"), ctr("b", req="1Gi")], None, "Burstable"),
    # init containers are included
    ([ctr("i")], [guaranteed("a")], None, "Burstable"),
    ([guaranteed("i")], [ctr("a")], None, "Burstable"),
    ([guaranteed("i", "2Gi")], [guaranteed("a")], None, "Guaranteed"),
    ([ctr("i", cpu_req="1")], [ctr("a")], None, "Burstable"),
    ([ctr("s", req="64Mi", sidecar=True)], [guaranteed("a")], None, "Burstable"),
    # pod-level resources decide when set
    ([], [ctr("a")], {"requests": {"memory": "1Gi", "cpu": "1"}, "limits": {"memory": "1Gi", "cpu": "1"}},
     "Guaranteed"),
    ([], [ctr("a")], {"limits": {"memory": "1Gi", "cpu": "1"}}, "Guaranteed"),
    ([], [ctr("a")], {"limits": {"memory": "1Gi"}}, "Burstable"),
    ([], [ctr("a", req="100Mi")], {"requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi", "cpu": "1"}},
     "Burstable"),
])
def test_qos_class_by_the_kubelets_rules(init, containers, resources, qos):
    assert one(mkpod(init=init, containers=containers, resources=resources)).qos == qos


@pytest.mark.parametrize("status_qos, containers", [
    ("BestEffort", [guaranteed("a")]),
    ("Guaranteed", [ctr("a")]),
    ("Burstable", [guaranteed("a")]),
])
def test_status_qos_class_wins(status_qos, containers):
    assert one(mkpod(containers=containers, qos=status_qos)).qos == status_qos


# ------------------------------------------------------------------ phases and containers

@pytest.mark.parametrize("phase, kept", [("Running", True), ("Pending", True), ("Unknown", True), ("", True),
                                         ("Succeeded", False), ("Failed", False)])
def test_finished_pods_are_ignored(phase, kept):
    pods, warnings = parse_pods([mkpod(phase=phase)])
    assert (len(pods) == 1) is kept
    assert warnings == []


def test_running_container_ids_only():
    ids = {n: f"containerd://{c * 64}" for n, c in zip("abcdefgh", "0123456789")}
    p = one(mkpod(
        init=[ctr("init"), ctr("side", req="64Mi", sidecar=True)],
        containers=[ctr("a"), ctr("b"), ctr("c"), ctr("d"), ctr("e")],
        statuses=[
            running("a", ids["a"]),
            {"name": "b", "containerID": ids["b"], "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
            {"name": "c", "containerID": ids["c"], "state": {"terminated": {"exitCode": 0}}},
            {"name": "d", "state": {"waiting": {}}},  # never started: no ID
            {"name": "e", "containerID": "", "state": {"running": {}}},
        ],
        init_statuses=[running("init", ids["g"]), running("side", ids["h"])],
    ))
    got = {c.name: (c.kind, c.container_id) for c in p.containers}
    assert got == {
        "init": ("init", None),  # a (non-restartable) init container is never planned
        "side": ("sidecar", ids["h"]),
        "a": ("app", ids["a"]),
        "b": ("app", None), "c": ("app", None), "d": ("app", None), "e": ("app", None),
    }


def test_no_status_means_no_container_ids():
    p = one({"metadata": {"name": "p", "uid": uid(1)}, "spec": {"containers": [ctr("a")]}})
    assert p.containers[0].container_id is None
    assert p.namespace == "default"


def test_ephemeral_containers_are_not_planned():
    doc = mkpod(containers=[ctr("a")], statuses=[running("a")])
    doc["spec"]["ephemeralContainers"] = [{"name": "debug"}]
    doc["status"]["ephemeralContainerStatuses"] = [running("debug", f"containerd://{'f' * 64}")]
    p = one(doc)
    assert [c.name for c in p.containers] == ["a"]


def test_container_ids_are_kept_raw_for_the_planner_to_check():
    # Validation of the ID (hex, runtime) is the naming's job; the planner warns about it.
    p = one(mkpod(containers=[ctr("a")], statuses=[running("a", "containerd://XYZ")]))
    assert p.containers[0].container_id == "containerd://XYZ"


# ------------------------------------------------------------------ bad pods

GOOD = mkpod("good", ns="ok", n=99, containers=[ctr("a", req="1Gi")])


def bad_with(mutate) -> dict:
    doc = json.loads(json.dumps(mkpod("bad", ns="team", n=7, containers=[ctr("a", req="1Gi", lim="2Gi")])))
    mutate(doc)
    return doc


def _set(path, value):
    def mutate(doc):
        obj = doc
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
    return mutate


@pytest.mark.parametrize("mutate, field", [
    (_set(["spec", "containers", 0, "resources", "requests", "memory"], "lots"),
     "spec.containers[0].resources.requests.memory"),
    (_set(["spec", "containers", 0, "resources", "limits", "memory"], "2GB"),
     "spec.containers[0].resources.limits.memory"),
    (_set(["spec", "containers", 0, "resources", "requests", "memory"], "-1Gi"),
     "spec.containers[0].resources.requests.memory"),
    (_set(["spec", "containers", 0, "resources", "requests", "memory"], True),
     "spec.containers[0].resources.requests.memory"),
    (_set(["spec", "containers", 0, "resources", "requests", "cpu"], "fast"),
     "spec.containers[0].resources.requests.cpu"),
    (_set(["spec", "containers", 0, "resources", "requests", "memory"], "100Ei"),
     "spec.containers[0].resources.requests.memory"),
    (_set(["spec", "containers", 0, "resources"], "big"), "spec.containers[0].resources"),
    (_set(["spec", "containers", 0, "resources", "requests"], ["memory"]), "spec.containers[0].resources.requests"),
    (_set(["spec", "containers", 0], "nginx"), "spec.containers[0]"),
    (_set(["spec", "containers", 0, "name"], ""), "spec.containers[0].name"),
    (_set(["spec", "containers", 0, "name"], 5), "spec.containers[0].name"),
    (_set(["spec", "containers"], {"a": 1}), "spec.containers"),
    (_set(["spec", "initContainers"], "x"), "spec.initContainers"),
    (_set(["spec", "overhead"], {"memory": "much"}), "spec.overhead.memory"),
    (_set(["spec", "resources"], {"requests": {"memory": "x"}}), "spec.resources.requests.memory"),
    (_set(["spec"], None), "spec"),
    (_set(["spec"], "x"), "spec"),
    (_set(["metadata", "uid"], ""), "metadata.uid"),
    (_set(["metadata", "uid"], 5), "metadata.uid"),
    (_set(["status", "qosClass"], "Gold"), "status.qosClass"),
    (_set(["status", "phase"], 3), "status.phase"),
    (_set(["status", "containerStatuses"], "running"), "status.containerStatuses"),
    (_set(["status", "containerStatuses"], ["x"]), "status.containerStatuses[0]"),
    (_set(["status"], "Running"), "status"),
])
def test_bad_pod_is_skipped_with_a_warning_naming_pod_and_field(mutate, field):
    pods, warnings = parse_pods({"kind": "PodList", "items": [GOOD, bad_with(mutate), GOOD | {
        "metadata": {"name": "good2", "namespace": "ok", "uid": uid(100)}}]})
    assert [p.key for p in pods] == ["ok/good", "ok/good2"]
    assert len(warnings) == 1
    assert "team/bad" in warnings[0] and field in warnings[0], warnings
    assert "\n" not in warnings[0]


@pytest.mark.parametrize("item", ["pod", 5, None, ["x"], {"metadata": "x", "spec": {}},
                                  {"metadata": {"namespace": "ns"}, "spec": {"containers": []}}])
def test_unidentifiable_items_are_skipped_by_position(item):
    pods, warnings = parse_pods([GOOD, item])
    assert [p.key for p in pods] == ["ok/good"]
    assert len(warnings) == 1 and "#1" in warnings[0]


def test_duplicate_uid_keeps_the_first():
    a = mkpod("a", n=5)
    b = mkpod("b", n=5)
    pods, warnings = parse_pods([a, b])
    assert [p.key for p in pods] == ["default/a"]
    assert len(warnings) == 1 and "default/b" in warnings[0]


def test_an_invalid_uid_is_left_for_the_planner():
    # pods.py only needs a UID; whether it names a unit of ours is checked (and warned about)
    # by the planner, which never plans it.
    doc = mkpod()
    doc["metadata"]["uid"] = "not-a-uuid"
    pods, warnings = parse_pods([doc])
    assert pods[0].uid == "not-a-uuid" and warnings == []


def test_warning_names_are_bounded():
    doc = mkpod("x" * 10_000)
    doc["spec"]["containers"] = "bad"
    _, warnings = parse_pods([doc])
    assert len(warnings[0]) < 400


def test_pod_dataclass_request_property():
    p = Pod(uid=uid(1), namespace="n", name="p", qos="Burstable",
            containers=(Container("a", "app", 100, None), Container("i", "init", 300, None),
                        Container("s", "sidecar", 50, None)), overhead=7)
    # sidecar declared after the init container: max(100 + 50, 300) + 7
    assert p.request == 307
    assert p.key == "n/p"
