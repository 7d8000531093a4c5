"""In-place resize (issue 16): protection is sized from what the kubelet has allocated.

The kubelet sizes a pod's cgroups from its allocation, never from a spec it has not admitted.
Per container the request and limit come from:
1. `status.containerStatuses[]/initContainerStatuses[].allocatedResources` when reported;
2. else, while a resize is pending (`PodResizePending`, Deferred or Infeasible; before v1.33
   `status.resize`), what the kubelet reports as enacted (`...Statuses[].resources`);
3. else the spec (nothing pending: the spec is what was allocated, also while a resize is in
   progress and `resources` still shows the old values).
Pod-level resources the same, from `status.allocatedResources` / `status.resources`. The QoS
class is never recomputed from the new values.

The pods in every state are real `/pods` answers (tests/unit/data): a v1.35 kubelet (conditions,
allocatedResources) and a v1.32 kubelet with InPlacePodVerticalScaling on (`status.resize`, no
allocatedResources). Every expected number is worked out by hand from the documents.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memqos_systemd.config import parse_config
from memqos_systemd.notify import WarnOnce
from memqos_systemd.plan import NodeFacts, memory_high, plan
from memqos_systemd.pods import parse_pods

Mi, Gi = 2**20, 2**30
DATA = Path(__file__).parent / "data"


def load(version: str) -> dict:
    with open(DATA / f"kubelet-pods-resize-{version}.json") as f:
        return json.load(f)


def parsed(version: str) -> tuple[dict, list[str]]:
    pods, warnings = parse_pods(load(version))
    return {p.name: p for p in pods}, warnings


# (kubelet, pod): pending reason, pod request, {container: (request, limit)}, the spec's request
# when a pending resize asks for another one.
TABLE = [
    # The kubelet has not started a container: nothing in the status, the spec is the allocation.
    ("v1.35", "no-status", None, 512 * Mi, {"api": (512 * Mi, Gi)}, None),
    ("v1.35", "running", None, 512 * Mi, {"api": (512 * Mi, Gi)}, None),
    # 512Mi/1Gi -> 768Mi/1536Mi that does not fit now: allocatedResources still 512Mi, the limit
    # from resources (1Gi).
    ("v1.35", "deferred", "Deferred", 512 * Mi, {"api": (512 * Mi, Gi)}, 768 * Mi),
    ("v1.35", "infeasible", "Infeasible", 512 * Mi, {"api": (512 * Mi, Gi)}, 64 * Gi),
    # Allocated, not yet enacted (resources still 512Mi/1Gi): the new values, from the spec.
    ("v1.35", "in-progress", None, 768 * Mi, {"api": (768 * Mi, 1536 * Mi)}, None),
    ("v1.35", "done", None, 768 * Mi, {"api": (768 * Mi, 1536 * Mi)}, None),
    # 64Gi asked while 768Mi is being enacted: allocatedResources 768Mi, the limit enacted (1Gi).
    ("v1.35", "pending-in-progress", "Infeasible", 768 * Mi, {"api": (768 * Mi, Gi)}, 64 * Gi),
    # The sidecar grown 128Mi -> 256Mi and allocated: pod = 512Mi + 256Mi.
    ("v1.35", "sidecar", None, 768 * Mi, {"log-shipper": (256 * Mi, 512 * Mi), "api": (512 * Mi, Gi)}, None),
    ("v1.35", "sidecar-deferred", "Deferred", 640 * Mi,
     {"log-shipper": (128 * Mi, 256 * Mi), "api": (512 * Mi, Gi)}, 768 * Mi),
    # Pod-level 1Gi/2Gi (+160Mi overhead) asked to become 24Gi/32Gi: status.allocatedResources
    # 1184Mi = 1Gi + 160Mi; status.resources limit 2208Mi = 2Gi + 160Mi.
    ("v1.35", "pod-level", "Infeasible", 1184 * Mi, {"api": (0, None)}, 24 * Gi + 160 * Mi),
    ("v1.32", "running", None, 512 * Mi, {"api": (512 * Mi, Gi)}, None),
    # status.resize Proposed: the kubelet has not looked at the new spec yet.
    ("v1.32", "proposed", "Proposed", 512 * Mi, {"api": (512 * Mi, Gi)}, 768 * Mi),
    ("v1.32", "deferred", "Deferred", 512 * Mi, {"api": (512 * Mi, Gi)}, 768 * Mi),
    ("v1.32", "infeasible", "Infeasible", 512 * Mi, {"api": (512 * Mi, Gi)}, 64 * Gi),
    ("v1.32", "in-progress", None, 768 * Mi, {"api": (768 * Mi, 1536 * Mi)}, None),
    # The sidecar asked for 32Gi: 512Mi + 128Mi from resources; the spec asks 512Mi + 32Gi.
    ("v1.32", "sidecar-infeasible", "Infeasible", 640 * Mi,
     {"log-shipper": (128 * Mi, 256 * Mi), "api": (512 * Mi, Gi)}, 32 * Gi + 512 * Mi),
]


@pytest.mark.parametrize("version, name, pending, pod_request, containers, asked", TABLE,
                         ids=[f"{v}-{n}" for v, n, *_ in TABLE])
def test_every_resize_state_of_a_real_pod_list(version, name, pending, pod_request, containers, asked):
    pods, warnings = parsed(version)
    pod = pods[name]
    assert pod.qos == "Burstable"  # status.qosClass, in every state
    assert pod.resize_pending == pending
    assert pod.request == pod_request
    assert {c.name: (c.request, c.limit) for c in pod.containers} == containers
    notices = [w for w in warnings if f"resize/{name}:" in w]
    if pending is None:
        assert notices == []
        return
    assert len(notices) == 1
    assert notices[0] == (f"pod resize/{name}: resize pending ({pending}): the kubelet has not allocated the"
                          f" spec's resources; planned from what it allocated: memory request"
                          f" {_short(pod_request)} (the spec asks {_short(asked)})")


def _short(n: int) -> str:
    from memqos_systemd.quantity import format_bytes
    return format_bytes(n)


def test_running_containers_keep_their_scopes_while_resized():
    pods, _ = parsed("v1.35")
    for name in ("deferred", "in-progress", "sidecar", "sidecar-deferred"):
        assert all(c.container_id and c.container_id.startswith("containerd://") for c in pods[name].containers)
    assert [c.kind for c in pods["sidecar"].containers] == ["sidecar", "app"]
    assert pods["no-status"].containers[0].container_id is None


def test_pod_level_resources_as_allocated():
    pod = parsed("v1.35")[0]["pod-level"]
    assert (pod.overhead, pod.pod_request, pod.pod_limit) == (160 * Mi, Gi, 2 * Gi)


# ------------------------------------------------------------------ the rules, one by one

APP_ID = "containerd://" + "a" * 64


def item(spec_req="512Mi", spec_lim="1Gi", *, allocated=None, enacted=None, conditions=(), resize=None,
         qos="Burstable", status=True, cpu=("250m", "500m")) -> dict:
    c = {"name": "app", "resources": {"requests": {"cpu": cpu[0], "memory": spec_req},
                                      "limits": {"cpu": cpu[1], "memory": spec_lim}}}
    doc = {"metadata": {"name": "p", "namespace": "ns", "uid": "0e3c9f62-0000-4000-8000-000000000001"},
           "spec": {"containers": [c]}}
    if not status:
        return doc
    cs = {"name": "app", "containerID": APP_ID, "state": {"running": {}}}
    if allocated is not None:
        cs["allocatedResources"] = allocated
    if enacted is not None:
        cs["resources"] = enacted
    doc["status"] = {"phase": "Running", "conditions": list(conditions), "containerStatuses": [cs]}
    if qos:
        doc["status"]["qosClass"] = qos
    if resize is not None:
        doc["status"]["resize"] = resize
    return doc


def rr(req, lim, cpu=("250m", "500m")) -> dict:
    return {"requests": {"cpu": cpu[0], "memory": req}, "limits": {"cpu": cpu[1], "memory": lim}}


def pending(reason="Infeasible", status="True") -> dict:
    return {"type": "PodResizePending", "status": status, "reason": reason, "message": "no"}


IN_PROGRESS = {"type": "PodResizeInProgress", "status": "True"}


def one(doc):
    pods, warnings = parse_pods([doc])
    assert len(pods) == 1, warnings
    c = pods[0].containers[0]
    return pods[0], (c.request, c.limit), warnings


def test_no_status_at_all_is_the_spec():
    pod, values, warnings = one(item(status=False))
    assert values == (512 * Mi, Gi) and pod.resize_pending is None and warnings == []


def test_allocated_resources_win_over_the_spec_before_the_kubelet_says_anything():
    # The kubelet has not handled the new spec yet (no condition), but its allocation is there:
    # the request from allocatedResources, and the limit from resources, as the spec is known
    # not to be allocated (its requests differ).
    _, values, warnings = one(item("2Gi", "3Gi", allocated={"cpu": "250m", "memory": "512Mi"},
                                   enacted=rr("512Mi", "1Gi")))
    assert values == (512 * Mi, Gi) and warnings == []


def test_a_spec_equal_to_its_allocation_keeps_the_spec_limit():
    _, values, _ = one(item("512Mi", "2Gi", allocated={"cpu": "250m", "memory": "512Mi"}, enacted=rr("512Mi", "1Gi")))
    assert values == (512 * Mi, 2 * Gi)  # allocated 2Gi, being enacted (resources still 1Gi)


def test_pending_without_allocated_resources_takes_what_is_enacted():
    for doc in (item("4Gi", "8Gi", enacted=rr("512Mi", "1Gi"), conditions=[pending("Deferred")]),
                item("4Gi", "8Gi", enacted=rr("512Mi", "1Gi"), resize="Infeasible")):
        pod, values, _ = one(doc)
        assert values == (512 * Mi, Gi) and pod.resize_pending in ("Deferred", "Infeasible")


def test_in_progress_takes_the_spec_over_the_old_enacted_values():
    for doc in (item("768Mi", "1536Mi", enacted=rr("512Mi", "1Gi"), conditions=[IN_PROGRESS]),
                item("768Mi", "1536Mi", enacted=rr("512Mi", "1Gi"), resize="InProgress")):
        pod, values, warnings = one(doc)
        assert values == (768 * Mi, 1536 * Mi) and pod.resize_pending is None and warnings == []


def test_a_false_pending_condition_is_not_pending():
    pod, values, _ = one(item("768Mi", "1536Mi", enacted=rr("512Mi", "1Gi"), conditions=[pending(status="False")]))
    assert values == (768 * Mi, 1536 * Mi) and pod.resize_pending is None


def test_an_unknown_reason_is_still_pending_and_shown_on_one_line():
    pod, values, warnings = one(item("4Gi", "8Gi", enacted=rr("512Mi", "1Gi"),
                                     conditions=[pending("Something\nnew" + "x" * 100)]))
    assert values == (512 * Mi, Gi)
    assert pod.resize_pending.startswith("Something\\nnew") and len(pod.resize_pending) <= 40
    assert len(warnings) == 1 and "\n" not in warnings[0]
    pod, _, _ = one(item("4Gi", "8Gi", enacted=rr("512Mi", "1Gi"), conditions=[pending("")]))
    assert pod.resize_pending == "no reason given"


def test_a_container_with_nothing_reported_while_pending_counts_as_zero():
    # Which containers the pending resize touches is not said; one the runtime never started has
    # neither allocatedResources nor resources: nothing it was allocated is known.
    doc = item("4Gi", "8Gi", enacted=rr("512Mi", "1Gi"), conditions=[pending()])
    doc["spec"]["containers"].append({"name": "late", "resources": {"requests": {"memory": "1Gi"}}})
    pods, warnings = parse_pods([doc])
    assert [(c.name, c.request, c.limit) for c in pods[0].containers] == [("app", 512 * Mi, Gi), ("late", 0, None)]
    assert pods[0].request == 512 * Mi
    assert warnings == ["pod ns/p: resize pending (Infeasible): the kubelet has not allocated the spec's resources;"
                        " planned from what it allocated: memory request 512Mi (the spec asks 5Gi); nothing"
                        " allocated is reported for container 'late': counted as 0 until it is"]


def test_a_pending_cpu_resize_says_memory_is_as_in_the_spec():
    _, values, warnings = one(item(enacted=rr("512Mi", "1Gi", cpu=("100m", "500m")), conditions=[pending("Deferred")]))
    assert values == (512 * Mi, Gi)
    assert warnings[0].endswith("planned from what it allocated: memory request 512Mi, as in the spec")


def test_the_qos_class_is_never_taken_from_the_new_values():
    # Hand-made (the API server refuses a resize that changes the class): the spec is Burstable,
    # what was allocated would look Guaranteed. With no status.qosClass it comes from the spec.
    doc = item("768Mi", "1Gi", allocated={"cpu": "1", "memory": "1Gi"}, enacted=rr("1Gi", "1Gi", ("1", "1")),
               qos=None, cpu=("1", "1"))
    pod, values, _ = one(doc)
    assert pod.qos == "Burstable" and values == (Gi, Gi)
    # status.qosClass wins, whatever the values say.
    doc = item("1Gi", "1Gi", allocated={"cpu": "1", "memory": "1Gi"}, enacted=rr("1Gi", "1Gi", ("1", "1")),
               qos="Burstable", cpu=("1", "1"))
    assert one(doc)[0].qos == "Burstable"


def test_a_guaranteed_pod_resized_stays_guaranteed():
    doc = item("2Gi", "2Gi", enacted=rr("1Gi", "1Gi", ("1", "1")), conditions=[pending()], qos=None, cpu=("1", "1"))
    pod, values, _ = one(doc)
    assert pod.qos == "Guaranteed" and values == (Gi, Gi)


def test_pod_level_in_progress_takes_the_allocation():
    doc = item(status=True)
    doc["spec"]["resources"] = rr("2Gi", "4Gi")
    doc["status"]["allocatedResources"] = {"cpu": "250m", "memory": "2Gi"}
    doc["status"]["resources"] = rr("1Gi", "2Gi")  # not enacted yet
    doc["status"]["conditions"] = [IN_PROGRESS]
    pod, _, _ = one(doc)
    assert (pod.pod_request, pod.pod_limit, pod.request) == (2 * Gi, 4 * Gi, 2 * Gi)


def test_pod_level_pending_with_nothing_reported_falls_back_to_the_containers():
    doc = item("512Mi", "1Gi", enacted=rr("512Mi", "1Gi"), conditions=[pending()])
    doc["spec"]["resources"] = rr("8Gi", "16Gi")
    pod, _, _ = one(doc)
    assert (pod.pod_request, pod.pod_limit, pod.request) == (None, None, 512 * Mi)


# ------------------------------------------------------------------ malformed status fields

def _with(path: list, value):
    doc = item(allocated={"cpu": "250m", "memory": "512Mi"}, enacted=rr("512Mi", "1Gi"), conditions=[pending()])
    doc["spec"]["resources"] = rr("1Gi", "2Gi")
    doc["status"]["allocatedResources"] = {"memory": "1Gi"}
    doc["status"]["resources"] = rr("1Gi", "2Gi")
    obj = doc
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value
    return doc


CS = ["status", "containerStatuses", 0]


@pytest.mark.parametrize("doc, field", [
    (_with(CS + ["allocatedResources"], "lots"), "status.containerStatuses[0].allocatedResources"),
    (_with(CS + ["allocatedResources", "memory"], "x"), "status.containerStatuses[0].allocatedResources.memory"),
    (_with(CS + ["allocatedResources", "memory"], "-1Gi"), "status.containerStatuses[0].allocatedResources.memory"),
    (_with(CS + ["allocatedResources", "memory"], "100Ei"), "status.containerStatuses[0].allocatedResources.memory"),
    (_with(CS + ["allocatedResources", "cpu"], True), "status.containerStatuses[0].allocatedResources.cpu"),
    (_with(CS + ["resources"], ["x"]), "status.containerStatuses[0].resources"),
    (_with(CS + ["resources", "limits"], "2Gi"), "status.containerStatuses[0].resources.limits"),
    (_with(CS + ["resources", "limits", "memory"], "2GB"), "status.containerStatuses[0].resources.limits.memory"),
    (_with(CS + ["resources", "requests", "memory"], "100Ei"),
     "status.containerStatuses[0].resources.requests.memory"),
    (_with(["status", "conditions"], "Infeasible"), "status.conditions"),
    (_with(["status", "conditions", 0], "PodResizePending"), "status.conditions[0]"),
    (_with(["status", "conditions", 0, "type"], 5), "status.conditions[0].type"),
    (_with(["status", "conditions", 0, "reason"], ["Infeasible"]), "status.conditions[0].reason"),
    (_with(["status", "conditions", 0, "status"], True), "status.conditions[0].status"),
    (_with(["status", "resize"], 1), "status.resize"),
    (_with(["status", "allocatedResources"], "1Gi"), "status.allocatedResources"),
    (_with(["status", "allocatedResources", "memory"], "much"), "status.allocatedResources.memory"),
    (_with(["status", "resources", "limits", "memory"], -5), "status.resources.limits.memory"),
    (_with(["status", "containerStatuses"], [{"name": "app", "allocatedResources": {"memory": "1Gi"}},
                                             {"name": "app", "allocatedResources": {"memory": "2Gi"}}]),
     "status.containerStatuses[1].name"),
])
def test_a_malformed_status_field_skips_the_pod_with_a_warning_naming_pod_and_field(doc, field):
    good = item()
    good["metadata"] = {"name": "good", "namespace": "ok", "uid": "0e3c9f62-0000-4000-8000-000000000002"}
    pods, warnings = parse_pods([doc, good])
    assert [p.key for p in pods] == ["ok/good"]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"pod ns/p: {field}:") or warnings[0].startswith(f"pod ns/p: {field} is"), \
        warnings
    assert warnings[0].endswith("; pod skipped") and "\n" not in warnings[0]


def test_statuses_that_share_a_name_and_agree_are_fine():
    doc = item(allocated={"memory": "512Mi"})
    doc["status"]["containerStatuses"].append({"name": "app", "allocatedResources": {"memory": "512Mi"}})
    pod, values, warnings = one(doc)
    assert values == (512 * Mi, Gi) and warnings == [] and pod.containers[0].container_id == APP_ID


# ------------------------------------------------------------------ logged once per pod

def test_a_pending_resize_is_logged_once_while_it_lasts(caplog):
    caplog.set_level(logging.WARNING, logger="resize-test")
    warn_once = WarnOnce(logging.getLogger("resize-test"))
    doc = load("v1.35")
    by_name = {i["metadata"]["name"]: i for i in doc["items"]}
    for _ in range(3):  # three polls of the same answer, as the daemon does ("pods" warnings)
        warn_once("pods", parse_pods(doc)[1])
    pending_lines = [r.getMessage() for r in caplog.records if "resize pending" in r.getMessage()]
    assert len(pending_lines) == 5  # deferred, infeasible, pending-in-progress, sidecar-deferred, pod-level
    assert len(set(pending_lines)) == 5
    # The infeasible pod's resize is withdrawn (its spec back to what was allocated): forgotten,
    # and logged again if it comes back.
    caplog.clear()
    fixed = copy.deepcopy(doc)
    pod = next(i for i in fixed["items"] if i["metadata"]["name"] == "infeasible")
    pod["spec"]["containers"][0]["resources"] = by_name["running"]["spec"]["containers"][0]["resources"]
    pod["status"]["conditions"] = [c for c in pod["status"]["conditions"] if c["type"] != "PodResizePending"]
    warn_once("pods", parse_pods(fixed)[1])
    assert not caplog.records
    warn_once("pods", parse_pods(doc)[1])
    assert [r.getMessage() for r in caplog.records] == [
        next(w for w in parse_pods(doc)[1] if "resize/infeasible:" in w)]


# ------------------------------------------------------------------ the property

CONFIG = parse_config({"memoryReservationPolicy": "TieredReservation"})
NODE = NodeFacts(capacity=4096 * Gi, page_size=4096)
sizes = st.integers(1, 64).map(lambda n: n * 16 * Mi)


@st.composite
def resized_containers(draw, j: int):
    """One container: what the kubelet allocated, what the spec asks (a resize when they
    differ), and how the kubelet reports it (the three ways the API has)."""
    allocated = draw(sizes)
    asked = draw(st.one_of(st.just(allocated), sizes))
    how = draw(st.sampled_from(["allocatedResources", "pending", "spec"]))
    if how == "spec":
        asked = allocated  # with nothing pending and no allocatedResources, the spec is the allocation
    old = draw(sizes)  # what is still enacted while a resize is in progress
    status = {"name": f"c{j}", "containerID": f"containerd://{j + 1:064x}", "state": {"running": {}}}
    if how == "allocatedResources":
        status["allocatedResources"] = {"memory": str(allocated)}
        status["resources"] = {"requests": {"memory": str(draw(st.sampled_from([old, allocated])))}}
    elif how == "pending":
        status["resources"] = {"requests": {"memory": str(allocated)}}  # nothing in progress: enacted = allocated
    else:
        status["resources"] = {"requests": {"memory": str(draw(st.sampled_from([old, allocated])))}}
    spec = {"name": f"c{j}", "resources": {"requests": {"memory": str(asked)}}}
    if draw(st.booleans()):
        spec["restartPolicy"] = "Always"  # a sidecar
    return allocated, asked, how, spec, status


@st.composite
def resized_pods(draw, n: int):
    parts = draw(st.lists(resized_containers(0), min_size=1, max_size=4))
    conditions = []
    if any(how == "pending" for _, _, how, _, _ in parts) or draw(st.booleans()):
        conditions.append({"type": "PodResizePending", "status": "True",
                           "reason": draw(st.sampled_from(["Deferred", "Infeasible"]))})
    if draw(st.booleans()):
        conditions.append(IN_PROGRESS)  # an earlier resize still being enacted
    containers = []
    for j, (allocated, asked, how, spec, status) in enumerate(parts):
        if conditions and conditions[0]["type"] == "PodResizePending" and how == "spec":
            # Pending, a container the kubelet reports nothing allocated for would be unknown
            # (counted 0): report it as a real kubelet does, enacted = allocated.
            status = {**status, "resources": {"requests": {"memory": str(allocated)}}}
        cid = f"containerd://{n * 16 + j + 1:064x}"
        containers.append((allocated, {**spec, "name": f"c{j}"}, {**status, "name": f"c{j}", "containerID": cid}))
    sidecars = [c for c in containers if "restartPolicy" in c[1]]
    apps = [c for c in containers if "restartPolicy" not in c[1]]
    doc = {"metadata": {"name": f"p{n}", "namespace": "ns", "uid": f"0e3c9f62-0000-4000-8000-{n:012d}"},
           "spec": {"initContainers": [c[1] for c in sidecars], "containers": [c[1] for c in apps]},
           "status": {"phase": "Running", "qosClass": "Burstable", "conditions": conditions,
                      "initContainerStatuses": [c[2] for c in sidecars],
                      "containerStatuses": [c[2] for c in apps]}}
    return doc, {c[2]["containerID"]: c[0] for c in containers}, sum(c[0] for c in containers)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 4).flatmap(lambda k: st.tuples(*[resized_pods(n) for n in range(k)])))
def test_a_plan_never_uses_a_request_the_kubelet_has_not_allocated(cases):
    pods, _ = parse_pods([doc for doc, _, _ in cases])
    p = plan(pods, NODE, CONFIG)
    by_unit = p.by_unit()
    total = 0
    for (doc, allocated, pod_total), pod in zip(cases, sorted(pods, key=lambda x: x.name)):
        assert pod.request == pod_total  # apps and sidecars: sum of what was allocated
        pod_unit = [u for u in p.units if u.level == "pod" and u.pod == pod.key][0]
        assert (pod_unit.memory_min, pod_unit.memory_low) == (0, pod_total)
        for cid, request in allocated.items():
            scope = by_unit["cri-containerd-" + cid.removeprefix("containerd://") + ".scope"]
            assert (scope.memory_min, scope.memory_low) == (0, request)
            assert scope.memory_high == memory_high(request, None, p.allocatable, 0.9, 4096)
        total += pod_total
    assert p.node_unit().memory_low == total
    assert by_unit["kubepods-burstable.slice"].memory_low == total
