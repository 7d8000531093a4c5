"""Properties of the planner over random pods and configs (issue #2, "Done when": a property test
that no child protection ever exceeds what its ancestors hold in `effective` mode).

The unit tree is rebuilt from the unit names as systemd reads them (`a-b-c.slice` lives in
`a-b.slice`) and from each scope's pod, not from the planner's own `parent` field.
"""

from __future__ import annotations

from dataclasses import dataclass

import uuid

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from memqos_systemd.config import parse_config
from memqos_systemd.naming import Naming, container_scope
from memqos_systemd.plan import INFINITY, NodeFacts, Plan, plan
from memqos_systemd.pods import Container, Pod

Mi, Gi = 2**20, 2**30
# No `target` phase: it cost seconds for nothing here (there is no target()).
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])

ROOTS = ["/", "/foo", "/foo.slice/foo-bar.slice", "/a/b"]
BAD_UIDS = ["not-a-uuid", "../../system.slice", "", "x" * 36]
BAD_IDS = ["containerd://XYZ", "rkt://" + "0" * 64, "containerd://../kube.slice"]

sizes = st.one_of(st.integers(0, 4 * Gi), st.sampled_from([0, Mi, 64 * Mi, 512 * Mi, Gi]))


@dataclass
class Case:
    pods: list[Pod]
    keys: dict
    page: int
    bound: int  # an upper bound on the hard protection the pods can ask for
    reserved: int  # kubeReserved + systemReserved


@st.composite
def containers(draw, qos: str, ids) -> list[Container]:
    out = []
    for j in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["app", "app", "sidecar", "init"]))
        if qos == "Guaranteed":
            req = draw(sizes)
            lim = req
        elif qos == "BestEffort":
            req, lim = 0, None
        else:
            req = draw(sizes)
            lim = draw(st.none() | sizes)
        cid = None
        if draw(st.integers(0, 9)) < 8:  # running
            cid = draw(st.sampled_from(BAD_IDS)) if draw(st.integers(0, 19)) == 0 else next(ids)
        out.append(Container(f"c{j}", kind, req, lim, cid))
    return out


@st.composite
def cases(draw) -> Case:
    n = draw(st.integers(0, 10))
    # Distinct, valid IDs without drawing them (their spelling is test_naming's business).
    seed = draw(st.integers(0, 2**32))
    uids = [uuid.UUID(int=(seed * 1_000_003 + i) % 2**128) for i in range(n)]
    runtime = draw(st.sampled_from(["containerd", "cri-o", "docker"]))
    ids = iter(f"{runtime}://{(seed * 7919 + k) % 2**256:064x}" for k in range(10_000))
    pods = []
    bound = 0
    for i, u in enumerate(uids):
        qos = draw(st.sampled_from(["Guaranteed", "Burstable", "BestEffort"]))
        cs = draw(containers(qos, ids))
        pod_request = pod_limit = None
        overhead = 0
        if qos != "BestEffort":
            overhead = draw(st.sampled_from([0, 0, 0, 64 * Mi, 12345]))
            if draw(st.booleans()):
                pod_request = draw(sizes)
                pod_limit = draw(st.none() | sizes) if qos == "Burstable" else pod_request
        uid = draw(st.sampled_from(BAD_UIDS)) if draw(st.integers(0, 19)) == 0 else str(u)
        p = Pod(uid=uid, namespace=f"ns{i % 3}", name=f"pod{i}", qos=qos, containers=tuple(cs),
                overhead=overhead, pod_request=pod_request, pod_limit=pod_limit)
        pods.append(p)
        bound += max(p.request, sum(c.request for c in cs))
    keys = {
        "memoryReservationPolicy": draw(st.sampled_from(["None", "TieredReservation", "HardReservation"])),
        "memoryThrottlingFactor": draw(st.none() | st.sampled_from([0.1, 0.5, 0.9, 1.0])
                                       | st.floats(0.001, 1.0, allow_nan=False)),
        "hierarchy": "effective",
        "cgroupRoot": draw(st.sampled_from(ROOTS)),
        "evictionHard": {"memory.available": draw(st.sampled_from(["0", "100Mi", "5%"]))},
    }
    kube = draw(st.sampled_from([0, 512 * Mi, 2 * Gi]))
    system = draw(st.sampled_from([0, 256 * Mi, Gi]))
    enforce = ["pods"]
    if draw(st.booleans()):
        keys.update(kubeReserved={"memory": str(kube)}, kubeReservedCgroup="/kube.slice")
        enforce.append("kube-reserved")
    if draw(st.booleans()):
        keys.update(systemReserved={"memory": str(system)}, systemReservedCgroup="/system.slice")
        enforce.append("system-reserved")
    keys["enforceNodeAllocatable"] = enforce
    reserved = (kube if "kube-reserved" in enforce else 0) + (system if "system-reserved" in enforce else 0)
    return Case(pods, keys, draw(st.sampled_from([4096, 16384, 65536])), bound, reserved)


def slice_parent(name: str) -> str | None:
    """systemd's parent of a slice: a-b-c.slice -> a-b.slice; a top-level slice -> None (-.slice)."""
    stem = name[: -len(".slice")]
    return f"{stem.rsplit('-', 1)[0]}.slice" if "-" in stem else None


def tree(p: Plan) -> dict[str, list]:
    by_name = p.by_unit()
    pod_slice = {u.pod: u.unit for u in p.units if u.level == "pod"}
    children: dict[str, list] = {u.unit: [] for u in p.units}
    for u in p.units:
        parent = pod_slice[u.pod] if u.level == "container" else slice_parent(u.unit)
        if parent in by_name:
            children[parent].append(u)
            assert u.parent == parent, (u.unit, u.parent, parent)
        else:
            # only the top of what we manage has no planned parent
            assert u.level in ("node", "reserved") and u.parent is None, u
    return children


def naming_for(keys: dict) -> Naming:
    reserved = tuple(keys[k] for k, e in (("kubeReservedCgroup", "kube-reserved"),
                                          ("systemReservedCgroup", "system-reserved"))
                     if e in keys["enforceNodeAllocatable"])
    return Naming(keys["cgroupRoot"], reserved)


# One generated case, three properties (generation is what costs time).
@SETTINGS
@given(case=cases())
def test_effective_plan_properties(case: Case):
    # "enough capacity": the guard cannot fire
    capacity = 2 * (case.bound + case.reserved) + case.reserved + Gi
    p = plan(case.pods, NodeFacts(capacity, case.page), parse_config(case.keys))
    assert not any("capped" in w for w in p.warnings)
    children_never_hold_more_than_their_parent(p)
    every_unit_is_one_of_ours_and_planned_once(case, p)
    memory_high_is_never_zero_nor_below_the_request(case, p)


def children_never_hold_more_than_their_parent(p: Plan):
    children = tree(p)
    for u in p.units:
        kids = children[u.unit]
        assert sum(k.memory_min for k in kids) <= u.memory_min, (u, kids)
        assert sum(k.memory_low for k in kids) <= u.memory_low, (u, kids)
    # the top of the pod tree holds exactly what its children hold, of each kind
    node = p.node_unit()
    assert node.memory_min == sum(k.memory_min for k in children[node.unit])
    assert node.memory_low == sum(k.memory_low for k in children[node.unit])


def every_unit_is_one_of_ours_and_planned_once(case: Case, p: Plan):
    naming = naming_for(case.keys)
    names = [u.unit for u in p.units]
    assert len(names) == len(set(names))
    for u in p.units:
        ref = naming.parse_unit(u.unit)
        assert ref is not None, u.unit
        assert ref.level == u.level, (u.unit, ref, u.level)
    # a bad UID or container ID never shows up, and each is warned about
    bad = sum(1 for pod in case.pods if pod.uid in BAD_UIDS)
    bad += sum(1 for pod in case.pods if pod.uid not in BAD_UIDS for c in pod.containers
               if c.container_id in BAD_IDS and c.kind != "init")
    assert len(p.warnings) >= bad
    assert not any(".." in n or "XYZ" in n for n in names)


def memory_high_is_never_zero_nor_below_the_request(case: Case, p: Plan):
    request: dict[str, int] = {}
    naming = naming_for(case.keys)
    for pod in case.pods:
        if pod.uid in BAD_UIDS:
            continue
        request[naming.pod_slice(pod.qos, pod.uid)] = pod.request
        for c in pod.containers:
            if c.container_id and c.container_id not in BAD_IDS:
                request[container_scope(c.container_id)] = c.request
    for u in p.units:
        assert 0 < u.memory_high <= INFINITY
        if u.memory_high != INFINITY:
            assert u.level in ("pod", "container"), u
            assert u.memory_high > request[u.unit], u
            assert u.memory_high % case.page == 0
        if case.keys["memoryThrottlingFactor"] is None:
            assert u.memory_high == INFINITY


@SETTINGS
@given(case=cases(), slack=st.integers(0, 8 * Gi),
       headroom=st.one_of(st.sampled_from(["5%", "50%", "99%", "0"]), st.integers(0, 16 * Gi).map(str)))
def test_capacity_guard_changes_only_kubepods(case: Case, slack: int, headroom: str):
    # Same node, same pods: without headroom nothing is capped (capacity >= all hard protection);
    # with it, only the node-level units (kubepods.slice and the cgroupRoot slices above it,
    # which mirror it) may lose MemoryMin, and a warning says by how much.
    keys = dict(case.keys, evictionHard={"memory.available": "0"})
    capacity = case.bound + case.reserved + slack + Gi
    node = NodeFacts(capacity, case.page)
    free = plan(case.pods, node, parse_config(dict(keys, protectionHeadroom="0")))
    guarded = plan(case.pods, node, parse_config(dict(keys, protectionHeadroom=headroom)))
    assert not any("capped" in w for w in free.warnings)
    assert [u.unit for u in free.units] == [u.unit for u in guarded.units]
    node_slice = free.node_unit().unit
    for a, b in zip(free.units, guarded.units):
        if a.level != "node":
            assert a == b
            continue
        assert (a.memory_low, a.memory_high) == (b.memory_low, b.memory_high)
        assert b.memory_min <= a.memory_min
        if b.memory_min < a.memory_min:
            by = a.memory_min - b.memory_min
            assert any(node_slice in w and str(by) in w for w in guarded.warnings), guarded.warnings
    if guarded.node_unit().memory_min == free.node_unit().memory_min:
        assert not any("capped" in w for w in guarded.warnings)
    # capped: the top-level hard protection fits in capacity minus the headroom (when it can)
    top = guarded.node_unit().memory_min + sum(u.memory_min for u in guarded.units if u.level == "reserved")
    limit = capacity - parse_config({"protectionHeadroom": headroom}).protection_headroom.resolve(capacity)
    assert top <= max(limit, sum(u.memory_min for u in guarded.units if u.level == "reserved"))
