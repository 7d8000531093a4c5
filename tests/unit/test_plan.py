"""The pure planner, table by table (issue #2 Rules; KEP-2570 v1.36; the v1.36 blog; Node Allocatable).

Every expected number below was worked out by hand from the rules, with the arithmetic in a
comment; none is computed by the code under test.
"""

from __future__ import annotations

import pytest
import yaml

from memqos_systemd.config import parse_config
from memqos_systemd.naming import Naming
from memqos_systemd.features import plan_all
from memqos_systemd.plan import INFINITY, NodeFacts, Plan, PlanError, allocatable, memory_high, plan
from memqos_systemd.pods import Container, Pod, parse_pods

Ki, Mi, Gi = 2**10, 2**20, 2**30
INF = INFINITY
assert INF == 2**64 - 1  # systemd's "infinity" for a `t` property


def uid(n: int) -> str:
    return f"00000000-0000-0000-0000-{n:012d}"


def pod_unit(n: int, qos: str = "Burstable", root: str = "kubepods") -> str:
    middle = {"Guaranteed": root, "Burstable": f"{root}-burstable", "BestEffort": f"{root}-besteffort"}[qos]
    return f"{middle}-pod00000000_0000_0000_0000_{n:012d}.slice"


def cid(n: int, runtime: str = "containerd") -> str:
    return f"{runtime}://{n:064x}"


def scope(n: int) -> str:
    return f"cri-containerd-{n:064x}.scope"


def C(name: str, req: int = 0, lim: int | None = None, id_: int | None = None, kind: str = "app") -> Container:
    return Container(name, kind, req, lim, cid(id_) if id_ is not None else None)


def P(name: str, qos: str, n: int, *containers: Container, ns: str = "default", **kw) -> Pod:
    return Pod(uid=uid(n), namespace=ns, name=name, qos=qos, containers=tuple(containers), **kw)


def cfg(**keys):
    return parse_config(keys)


def run(pods, capacity=16 * Gi, page=4096, **keys) -> Plan:
    # as the service plans: plan.plan, then each feature's step (the ceiling's and the lever's)
    return plan_all(list(pods), NodeFacts(capacity, page), cfg(**keys))


def props(p: Plan) -> dict[str, tuple[int, int, int]]:
    return {u.unit: (u.memory_min, u.memory_low, u.memory_high) for u in p.units}


def check_order(p: Plan) -> None:
    seen: set[str] = set()
    for u in p.units:
        assert u.parent is None or u.parent in seen, f"{u.unit} comes before its parent {u.parent}"
        seen.add(u.unit)
    assert len(seen) == len(p.units), "a unit is planned twice"


# ================================================================== memory.high

# KEP-2570 Alpha v1.27 table: limit 1000, factor 0.9, 1Mi page: request 0 ... 1000 -> 900 ... 1000.
# The last row's formula value (1000) equals the request; the issue's rule ("infinity when that is
# not above the request", and the KEP's own mapping rule 3 "if memory.high > memory.min") makes it
# infinity: memory.max already is 1000Mi, so nothing is lost.
KEP_V127 = [(0, 900), (100, 910), (200, 920), (300, 930), (400, 940), (500, 950), (600, 960), (700, 970),
            (800, 980), (900, 990), (1000, None)]


@pytest.mark.parametrize("request_mi, high_mi", KEP_V127)
def test_kep_v127_table(request_mi, high_mi):
    got = memory_high(request_mi * Mi, 1000 * Mi, 64 * Gi, 0.9, Mi)
    assert got == (INF if high_mi is None else high_mi * Mi)


def test_kep_v127_table_through_the_planner():
    containers = [C(f"c{r}", r * Mi, 1000 * Mi, id_=10 + i) for i, (r, _) in enumerate(KEP_V127)]
    p = run([P("table", "Burstable", 1, *containers)], capacity=64 * Gi, page=Mi)
    got = props(p)
    for i, (_, high_mi) in enumerate(KEP_V127):
        assert got[scope(10 + i)][2] == (INF if high_mi is None else high_mi * Mi)


# KEP-2570 "compare memory.high using Alpha v1.22 and Alpha v1.27", the v1.27 column (limit 1000Mi).
@pytest.mark.parametrize("request_mi, factor, high_mi", [
    (500, 0.6, 800),    # 500 + 0.6 * 500
    (800, 0.6, 920),    # 800 + 0.6 * 200
    (1000, 0.6, None),  # "max"
    (500, 0.8, 900),    # 500 + 0.8 * 500
    (850, 0.8, 970),    # 850 + 0.8 * 150
    (500, 0.4, 700),    # 500 + 0.4 * 500
])
def test_kep_comparison_table_v127_column(request_mi, factor, high_mi):
    assert memory_high(request_mi * Mi, 1000 * Mi, 64 * Gi, factor, Mi) == (INF if high_mi is None else high_mi * Mi)


@pytest.mark.parametrize("req, lim, alloc, factor, page, expected", [
    # Case I: request and limit
    (512 * Mi, Gi, 8 * Gi, 0.9, 4096, 1020051456),  # 972.8Mi = 1020054732.8 -> floor to 4Ki
    # Case II: request, no limit -> allocatable: 1Gi + 0.9 * 7Gi = 7.3Gi = 7838315315.2 -> 7838314496
    (Gi, None, 8 * Gi, 0.9, 4096, 7838314496),
    # BestEffort: request 0, no limit: 0.9 * 8Gi = 7730941132.8 -> 7730937856
    (0, None, 8 * Gi, 0.9, 4096, 7730937856),
    # factor 1: the limit itself (when above the request) / allocatable
    (500 * Mi, 1000 * Mi, 8 * Gi, 1.0, 4096, 1000 * Mi),
    (0, None, 8 * Gi, 1.0, 4096, 8 * Gi),
    # page rounding: 0.9 * 10000 = 9000 -> 8192 with 4Ki pages
    (0, 10000, 8 * Gi, 0.9, 4096, 8192),
    # rounding down to the request (8192 + 3686.4 -> 8192) is not above it: infinity
    (8192, 12288, 8 * Gi, 0.9, 4096, INF),
    # a value below one page is 0: infinity, never 0 (systemd refuses MemoryHigh=0)
    (0, 4000, 8 * Gi, 0.9, 4096, INF),
    # the limit below the request (impossible in the API, but never throttle below the request)
    (Gi, 512 * Mi, 8 * Gi, 0.9, 4096, INF),
    # no factor: no MemoryHigh
    (512 * Mi, Gi, 8 * Gi, None, 4096, INF),
    (0, None, 8 * Gi, None, 4096, INF),
    # 64Ki pages (arm64)
    (0, Gi, 8 * Gi, 0.9, 64 * Ki, 966328320),  # 966367641.6 -> 14745 * 65536
    # exact decimal factor: 0.1 * 10Gi is exactly 1Gi, not a byte less
    (0, 10 * Gi, 64 * Gi, 0.1, 4096, Gi),
    # a ceiling past 2**64 (found by test_hostile_input: a node of 2**64 + 1.6Gi): throttles
    # nothing, and systemd takes no value above 2**64-1: infinity
    (0, None, 2**64 + 1600 * Mi, 1.0, 4096, INF),
    (0, None, 2**64 - 1, 1.0, 4096, 2**64 - 4096),
])
def test_memory_high_formula(req, lim, alloc, factor, page, expected):
    assert memory_high(req, lim, alloc, factor, page) == expected


def test_kep_case_iii_limit_only_follows_the_issue_not_the_kep():
    # KEP Case III sets request = 0 for a container with only limits.memory (-> 0.9 * limit).
    # The issue overrides it: the request defaults to the limit as the API server does, so
    # the formula gives the limit itself, which is not above the request: infinity.
    pods, warnings = parse_pods([{
        "metadata": {"name": "only-limit", "namespace": "default", "uid": uid(1)},
        "spec": {"containers": [
            {"name": "a", "resources": {"limits": {"memory": "1Gi"}}},
            {"name": "b", "resources": {"requests": {"cpu": "100m"}}},
        ]},
        "status": {"phase": "Running", "containerStatuses": [
            {"name": "a", "containerID": cid(1), "state": {"running": {}}},
            {"name": "b", "containerID": cid(2), "state": {"running": {}}},
        ]},
    }])
    assert warnings == [] and pods[0].qos == "Burstable"
    p = plan(pods, NodeFacts(8 * Gi), cfg(memoryReservationPolicy="TieredReservation"))
    got = props(p)
    assert got[scope(1)] == (0, Gi, INF)
    # b has no memory request or limit: 0.9 * (8Gi - 100Mi) = 7636568473.6 -> 7636566016
    assert got[scope(2)] == (0, 0, 7636566016)
    assert got[pod_unit(1)] == (0, Gi, INF)


# ================================================================== a node with all three classes

# capacity 16Gi, evictionHard default 100Mi -> allocatable 16284Mi = 17075011584, 4Ki pages.
#   db     Guaranteed  container db: 1Gi/1Gi                         pod request 1Gi
#   web    Burstable   a: 512Mi/1Gi, b: 256Mi/none                   pod request 768Mi
#   batch  Burstable   c: 512Mi/2Gi, overhead 64Mi                   pod request 576Mi
#   cache  BestEffort  d: none                                       pod request 0
# ΣG = 1Gi, ΣB = 1344Mi, ΣG + ΣB = 2368Mi.
NODE_PODS = [
    P("db", "Guaranteed", 1, C("db", Gi, Gi, id_=1), ns="data"),
    P("web", "Burstable", 2, C("a", 512 * Mi, Gi, id_=2), C("b", 256 * Mi, None, id_=3), ns="shop"),
    P("batch", "Burstable", 3, C("c", 512 * Mi, 2 * Gi, id_=4), ns="jobs", overhead=64 * Mi),
    P("cache", "BestEffort", 4, C("d", 0, None, id_=5), ns="shop"),
]
HIGH = {
    scope(1): INF,          # Guaranteed: never throttled
    scope(2): 1020051456,   # 512Mi + 0.9 * 512Mi = 972.8Mi = 1020054732.8 -> floor to 4Ki
    scope(3): 15394353152,  # 256Mi + 0.9 * (16284Mi - 256Mi) = 14681.2Mi = 15394356428.8 -> floor
    scope(4): 1986420736,   # 512Mi + 0.9 * 1536Mi = 1894.4Mi = 1986422374.4 -> floor
    scope(5): 15367507968,  # 0.9 * 16284Mi = 14655.6Mi = 15367510425.6 -> floor
}
G, B, BE = pod_unit(1, "Guaranteed"), pod_unit(2), pod_unit(3)
E = pod_unit(4, "BestEffort")
ZERO = {u: (0, 0) for u in ["kubepods.slice", "kubepods-burstable.slice", "kubepods-besteffort.slice", G, B, BE, E,
                            *HIGH]}
EXPECTED = {
    ("None", "effective"): ZERO,
    ("None", "kubelet"): ZERO,
    ("TieredReservation", "effective"): {
        "kubepods.slice": (Gi, 1344 * Mi),  # min: ΣG; low: Σ of the children's low = ΣB
        "kubepods-burstable.slice": (0, 1344 * Mi), "kubepods-besteffort.slice": (0, 0),
        G: (Gi, 0), scope(1): (Gi, 0),
        B: (0, 768 * Mi), scope(2): (0, 512 * Mi), scope(3): (0, 256 * Mi),
        BE: (0, 576 * Mi), scope(4): (0, 512 * Mi),
        E: (0, 0), scope(5): (0, 0),
    },
    ("TieredReservation", "kubelet"): {
        # the kubelet of v1.37: min ΣG + ΣB, low ΣB (kubernetes/kubernetes#140267)
        "kubepods.slice": (2368 * Mi, 1344 * Mi),
        "kubepods-burstable.slice": (0, 1344 * Mi), "kubepods-besteffort.slice": (0, 0),
        G: (Gi, 0), scope(1): (Gi, 0),
        B: (0, 768 * Mi), scope(2): (0, 512 * Mi), scope(3): (0, 256 * Mi),
        BE: (0, 576 * Mi), scope(4): (0, 512 * Mi),
        E: (0, 0), scope(5): (0, 0),
    },
}
# the kubelet before #140267: the node slice's memory.low 0, all else as today's
EXPECTED[("TieredReservation", "kubelet-1.36")] = {**EXPECTED[("TieredReservation", "kubelet")],
                                                   "kubepods.slice": (2368 * Mi, 0)}
EXPECTED[("HardReservation", "effective")] = EXPECTED[("HardReservation", "kubelet")] = {
    "kubepods.slice": (2368 * Mi, 0),
    "kubepods-burstable.slice": (1344 * Mi, 0), "kubepods-besteffort.slice": (0, 0),
    G: (Gi, 0), scope(1): (Gi, 0),
    B: (768 * Mi, 0), scope(2): (512 * Mi, 0), scope(3): (256 * Mi, 0),
    BE: (576 * Mi, 0), scope(4): (512 * Mi, 0),
    E: (0, 0), scope(5): (0, 0),
}


@pytest.mark.parametrize("policy, hierarchy", sorted(EXPECTED))
def test_policy_by_hierarchy(policy, hierarchy):
    p = run(NODE_PODS, memoryReservationPolicy=policy, hierarchy=hierarchy)
    assert p.capacity == 16 * Gi and p.allocatable == 17075011584
    want = {u: (mn, lw, HIGH.get(u, INF)) for u, (mn, lw) in EXPECTED[(policy, hierarchy)].items()}
    assert props(p) == want
    assert p.warnings == ()
    check_order(p)
    levels = {u.unit: u.level for u in p.units}
    assert levels["kubepods.slice"] == "node"
    assert levels["kubepods-burstable.slice"] == levels["kubepods-besteffort.slice"] == "qos"
    assert {levels[u] for u in (G, B, BE, E)} == {"pod"}
    assert {levels[u] for u in HIGH} == {"container"}
    pods = {u.unit: u.pod for u in p.units}
    assert pods[G] == pods[scope(1)] == "data/db"
    assert pods[B] == pods[scope(3)] == "shop/web"
    assert pods["kubepods.slice"] is None and pods["kubepods-burstable.slice"] is None
    assert p.units[0].unit == "kubepods.slice"


def test_properties_names():
    u = run(NODE_PODS).units[0]
    assert u.properties() == {"MemoryMin": 0, "MemoryLow": 0, "MemoryHigh": INF}


def test_factor_null_means_infinity_everywhere():
    p = run(NODE_PODS, memoryThrottlingFactor=None, memoryReservationPolicy="TieredReservation")
    assert {u.memory_high for u in p.units} == {INF}
    pl = run([P("p", "Burstable", 9, C("a", Mi, None, id_=9), pod_request=Mi, pod_limit=Gi)],
             memoryThrottlingFactor=None)
    assert {u.memory_high for u in pl.units} == {INF}


def test_factor_one_throttles_only_at_the_limit():
    p = run(NODE_PODS, memoryThrottlingFactor=1)
    got = props(p)
    assert got[scope(2)][2] == Gi and got[scope(4)][2] == 2 * Gi
    assert got[scope(3)][2] == got[scope(5)][2] == 17075011584  # allocatable, a multiple of 4Ki


def test_empty_node():
    p = run([], memoryReservationPolicy="HardReservation")
    assert props(p) == {"kubepods.slice": (0, 0, INF), "kubepods-burstable.slice": (0, 0, INF),
                        "kubepods-besteffort.slice": (0, 0, INF)}


# ================================================================== the v1.36 blog's examples

def test_blog_tiered_examples_512mi():
    g = Pod(uid="6a4f2e3b-1c9d-4a5e-8f7b-2d3e4f5a6b7c", namespace="d", name="g", qos="Guaranteed",
            containers=(C("c", 512 * Mi, 512 * Mi, id_=1),))
    b = Pod(uid="8b3c7d2e-4f5a-6b7c-9d1e-3f4a5b6c7d8e", namespace="d", name="b", qos="Burstable",
            containers=(C("c", 512 * Mi, None, id_=2),))
    e = P("e", "BestEffort", 3, C("c", id_=3))
    got = props(run([g, b, e], memoryReservationPolicy="TieredReservation"))
    # /sys/fs/cgroup/kubepods.slice/kubepods-pod6a4f2e3b_....slice/memory.min = 536870912
    assert got["kubepods-pod6a4f2e3b_1c9d_4a5e_8f7b_2d3e4f5a6b7c.slice"][:2] == (536870912, 0)
    # .../kubepods-burstable.slice/kubepods-burstable-pod8b3c7d2e_....slice/memory.low = 536870912
    assert got["kubepods-burstable-pod8b3c7d2e_4f5a_6b7c_9d1e_3f4a5b6c7d8e.slice"][:2] == (0, 536870912)
    # BestEffort: neither
    assert got[pod_unit(3, "BestEffort")][:2] == (0, 0)


@pytest.mark.parametrize("policy, hierarchy, node_min, node_low", [
    # v1.27-like hard reservation: the 7GiB is locked as memory.min at the top
    ("HardReservation", "effective", 7 * Gi, 0),
    # tiered, as the kernel honours it: no hard reservation, 7GiB of soft protection
    ("TieredReservation", "effective", 0, 7 * Gi),
    # tiered as the kubelet of v1.37 writes it: ΣG + ΣB as min, ΣB as low
    ("TieredReservation", "kubelet", 7 * Gi, 7 * Gi),
    # and as the kubelet of v1.36 did: no memory.low at the top
    ("TieredReservation", "kubelet-1.36", 7 * Gi, 0),
    ("None", "effective", 0, 0),
])
def test_blog_8gib_node_with_7gib_burstable(policy, hierarchy, node_min, node_low):
    pods = [P(f"b{i}", "Burstable", i, C("c", Gi, 2 * Gi, id_=i)) for i in range(1, 8)]
    p = run(pods, capacity=8 * Gi, memoryReservationPolicy=policy, hierarchy=hierarchy)
    node = p.node_unit()
    assert node.unit == "kubepods.slice"
    # 8Gi - 5% default headroom = 7.6Gi: 7Gi fits, no cap
    assert (node.memory_min, node.memory_low) == (node_min, node_low)
    assert p.warnings == ()


# ================================================================== allocatable

def test_node_allocatable_doc_example():
    # 32Gi capacity, kube-reserved 2Gi, system-reserved 1Gi, eviction-hard 100Mi -> "28.9Gi"
    c = cfg(kubeReserved={"memory": "2Gi"}, systemReserved={"memory": "1Gi"},
            evictionHard={"memory.available": "100Mi"})
    alloc = allocatable(c, 32 * Gi)
    assert alloc == 32 * Gi - 2 * Gi - Gi - 100 * Mi == 31033655296
    assert round(alloc / Gi, 1) == 28.9
    p = plan([], NodeFacts(32 * Gi), c)
    assert (p.capacity, p.allocatable) == (32 * Gi, 31033655296)


@pytest.mark.parametrize("keys, capacity, expected", [
    ({}, 8 * Gi, 8 * Gi - 100 * Mi),                                   # the default eviction threshold
    ({"evictionHard": {"memory.available": "25%"}}, 8 * Gi, 6 * Gi),   # a percentage of capacity
    ({"evictionHard": {"memory.available": "10%"}}, 10 * Gi, 9 * Gi),
    ({"evictionHard": {"memory.available": "0"}}, 8 * Gi, 8 * Gi),
    ({"evictionHard": {"nodefs.available": "10%"}}, 8 * Gi, 8 * Gi),   # a map without memory: 0
    ({"kubeReserved": {"memory": "1Gi"}, "evictionHard": {"memory.available": "5%"}}, 20 * Gi, 18 * Gi),
    ({"systemReserved": {"memory": "1.5Gi"}, "evictionHard": {"memory.available": "500Mi"}}, 4 * Gi,
     4 * Gi - 1536 * Mi - 500 * Mi),
    ({"kubeReserved": {"memory": "8Gi"}, "evictionHard": {"memory.available": "0"}}, 8 * Gi, 0),
])
def test_allocatable(keys, capacity, expected):
    assert allocatable(cfg(**keys), capacity) == expected


def test_allocatable_is_what_memory_high_uses():
    # 25% eviction on 8Gi: allocatable 6Gi; a BestEffort container: 0.9 * 6Gi = 5798205849.6 -> 5798203392
    p = run([P("e", "BestEffort", 1, C("c", id_=1))], capacity=8 * Gi, evictionHard={"memory.available": "25%"})
    assert p.allocatable == 6 * Gi
    assert props(p)[scope(1)][2] == 5798203392


def test_negative_allocatable_is_an_error():
    with pytest.raises(PlanError, match="allocatable"):
        run([], capacity=2 * Gi, kubeReserved={"memory": "2Gi"})


@pytest.mark.parametrize("capacity, page", [(0, 4096), (-1, 4096), (Gi, 0), (Gi, 3000), (Gi, -4096)])
def test_impossible_node_facts(capacity, page):
    with pytest.raises(PlanError):
        run([], capacity=capacity, page=page)


# ================================================================== reserved slices

RESERVED = dict(kubeReserved={"memory": "1Gi"}, systemReserved={"memory": "512Mi"},
                kubeReservedCgroup="/kube.slice", systemReservedCgroup="/system.slice")


@pytest.mark.parametrize("policy, enforce, expected", [
    ("HardReservation", ["pods", "kube-reserved", "system-reserved"],
     {"kube.slice": (Gi, 0, INF), "system.slice": (512 * Mi, 0, INF)}),
    ("TieredReservation", ["pods", "kube-reserved", "system-reserved"],
     {"kube.slice": (Gi, 0, INF), "system.slice": (512 * Mi, 0, INF)}),
    ("TieredReservation", ["pods", "kube-reserved"], {"kube.slice": (Gi, 0, INF)}),
    ("TieredReservation", ["system-reserved"], {"system.slice": (512 * Mi, 0, INF)}),
    # policy None: still listed, at 0
    ("None", ["pods", "kube-reserved", "system-reserved"], {"kube.slice": (0, 0, INF), "system.slice": (0, 0, INF)}),
    # not enforced: not ours, not planned (spec: "Otherwise 0"; see the note in the report)
    ("HardReservation", ["pods"], {}),
    ("HardReservation", [], {}),
])
def test_reserved_slices(policy, enforce, expected):
    p = run(NODE_PODS, memoryReservationPolicy=policy, enforceNodeAllocatable=enforce, **RESERVED)
    reserved = {u.unit: (u.memory_min, u.memory_low, u.memory_high) for u in p.units if u.level == "reserved"}
    assert reserved == expected
    # reserved memory always comes off allocatable, enforced or not
    assert p.allocatable == 16 * Gi - Gi - 512 * Mi - 100 * Mi
    # and the pods' numbers do not change because of it
    pods_only = run(NODE_PODS, memoryReservationPolicy=policy, enforceNodeAllocatable=["pods"], **RESERVED)
    assert {k: v for k, v in props(p).items() if k not in expected} == props(pods_only)
    check_order(p)
    names = Naming("/", tuple(c for c in ("/kube.slice", "/system.slice")))
    for u in p.units:
        assert names.parse_unit(u.unit) is not None


def test_reserved_slice_is_the_last_element():
    p = run([], memoryReservationPolicy="HardReservation", enforceNodeAllocatable=["kube-reserved"],
            kubeReserved={"memory": "1Gi"}, kubeReservedCgroup="/runtime.slice/runtime-kube.slice")
    assert [u.unit for u in p.units if u.level == "reserved"] == ["runtime-kube.slice"]


def test_reserved_cgroup_that_is_a_pod_slice_is_refused():
    with pytest.raises(PlanError):
        run([], memoryReservationPolicy="HardReservation", enforceNodeAllocatable=["kube-reserved"],
            kubeReserved={"memory": "1Gi"}, kubeReservedCgroup="/kubepods.slice")


# ================================================================== pod-level resources

def test_pod_level_limit_on_a_burstable_pod():
    # pod request 1Gi, pod limit 2Gi: 1Gi + 0.9 * 1Gi = 1.9Gi = 2040109465.6 -> 2040107008
    pods = [P("p", "Burstable", 1, C("a", 256 * Mi, None, id_=1), C("b", 256 * Mi, Gi, id_=2),
              pod_request=Gi, pod_limit=2 * Gi)]
    got = props(run(pods, memoryReservationPolicy="TieredReservation"))
    assert got[pod_unit(1)] == (0, Gi, 2040107008)
    # containers keep their own formula: a has no limit -> allocatable; b: 256Mi + 0.9 * 768Mi
    assert got[scope(1)] == (0, 256 * Mi, 15394353152)
    assert got[scope(2)] == (0, 256 * Mi, 993210368)  # 947.2Mi = 993211187.2 -> floor to 4Ki
    assert got["kubepods-burstable.slice"] == (0, Gi, INF)


def test_pod_level_limit_equal_to_request_is_not_throttled():
    pods = [P("p", "Burstable", 1, C("a", id_=1), pod_request=Gi, pod_limit=Gi)]
    assert props(run(pods))[pod_unit(1)][2] == INF


def test_pod_level_limit_on_a_guaranteed_pod_is_ignored():
    pods = [P("p", "Guaranteed", 1, C("a", Gi, Gi, id_=1), pod_request=Gi, pod_limit=2 * Gi)]
    assert props(run(pods))[pod_unit(1, "Guaranteed")][2] == INF


def test_pod_level_limit_with_overhead():
    # Spec silent on overhead here. The code follows the kubelet, whose pod cgroup limit is
    # the pod limit + overhead (the request includes the overhead too):
    # request 1Gi + 100Mi, ceiling 2Gi + 100Mi: 1124Mi + 0.9 * 1Gi = 2045.6Mi = 2144967065.6 -> 2144964608
    pods = [P("p", "Burstable", 1, C("a", id_=1), pod_request=Gi, pod_limit=2 * Gi, overhead=100 * Mi)]
    assert props(run(pods))[pod_unit(1)][2] == 2144964608


def test_pod_level_request_replaces_the_container_sum():
    pods = [P("p", "Burstable", 1, C("a", 100 * Mi, None, id_=1), pod_request=Gi)]
    got = props(run(pods, memoryReservationPolicy="HardReservation"))
    assert got[pod_unit(1)][:2] == (Gi, 0)
    assert got[scope(1)][:2] == (100 * Mi, 0)
    assert got["kubepods.slice"][:2] == (Gi, 0)


def test_effective_pod_slice_covers_its_containers():
    # A pod-level request below its containers' (the API would refuse it): in `effective`
    # the pod slice is raised so its containers' protection is real, with a warning.
    pods = [P("p", "Burstable", 1, C("a", 300 * Mi, None, id_=1), pod_request=100 * Mi)]
    p = run(pods, memoryReservationPolicy="TieredReservation")
    assert props(p)[pod_unit(1)][:2] == (0, 300 * Mi)
    assert props(p)["kubepods.slice"][:2] == (0, 300 * Mi)
    assert any("default/p" in w for w in p.warnings)


# ================================================================== containers

def test_sidecars_are_planned_init_containers_are_not():
    pods = [P("p", "Burstable", 1, C("init", 2 * Gi, None, id_=1, kind="init"),
              C("side", 64 * Mi, 128 * Mi, id_=2, kind="sidecar"), C("app", 256 * Mi, None, id_=3),
              C("stopped", 64 * Mi, None, id_=None))]
    got = props(run(pods, memoryReservationPolicy="HardReservation"))
    assert scope(1) not in got
    # sidecar 64Mi + 0.9 * 64Mi = 121.6Mi = 127506841.6 -> 127504384
    assert got[scope(2)] == (64 * Mi, 0, 127504384)
    assert got[scope(3)][0] == 256 * Mi
    # pod request: max(256Mi + 64Mi + 64Mi, 2Gi + 0) = 2Gi
    assert got[pod_unit(1)][0] == 2 * Gi
    assert len([u for u in got if u.endswith(".scope")]) == 2


@pytest.mark.parametrize("runtime, name", [("containerd", "cri-containerd"), ("cri-o", "crio"),
                                           ("docker", "docker")])
def test_scope_per_runtime(runtime, name):
    pods = [P("p", "BestEffort", 1, Container("c", "app", 0, None, cid(7, runtime)))]
    assert f"{name}-{7:064x}.scope" in props(run(pods))


def test_guaranteed_containers_are_never_throttled():
    # status.qosClass says Guaranteed even though the numbers would allow a MemoryHigh
    pods = [P("p", "Guaranteed", 1, C("a", 512 * Mi, Gi, id_=1), C("b", 0, None, id_=2))]
    got = props(run(pods))
    assert got[scope(1)][2] == got[scope(2)][2] == INF


# ================================================================== capacity guard

def test_capacity_guard_caps_kubepods_and_says_by_how_much():
    # 4Gi node, default headroom 5% = 214748364.8 -> 214748365 bytes: at most 4080218931 of MemoryMin.
    # Two Guaranteed pods of 2Gi (more than allocatable, e.g. after the node shrank) want 4Gi.
    pods = [P(f"g{i}", "Guaranteed", i, C("c", 2 * Gi, 2 * Gi, id_=i)) for i in (1, 2)]
    p = run(pods, capacity=4 * Gi, memoryReservationPolicy="HardReservation")
    got = props(p)
    assert got["kubepods.slice"] == (4080218931, 0, INF)
    assert got[pod_unit(1, "Guaranteed")][0] == got[pod_unit(2, "Guaranteed")][0] == 2 * Gi
    # Both said: the requests above allocatable (naming the largest pod), and the cap.
    assert len(p.warnings) == 2
    assert p.warnings[0] == ("pods request 4Gi in total, more than the node's allocatable 3.9Gi (capacity 4Gi);"
                             " the largest: pod default/g1 with 2Gi")
    w = p.warnings[1]
    assert "kubepods.slice" in w and "4294967296" in w and "4080218931" in w
    assert "214748365" in w  # by how much, in bytes


def test_capacity_guard_counts_reserved_slices():
    # 8Gi, headroom 1Gi: top-level MemoryMin at most 7Gi; kube.slice holds 2Gi, so kubepods <= 5Gi.
    pods = [P(f"g{i}", "Guaranteed", i, C("c", Gi, Gi, id_=i)) for i in range(1, 7)]  # 6Gi
    p = run(pods, capacity=8 * Gi, memoryReservationPolicy="HardReservation", protectionHeadroom="1Gi",
            enforceNodeAllocatable=["pods", "kube-reserved"], kubeReserved={"memory": "2Gi"},
            kubeReservedCgroup="/kube.slice", evictionHard={"memory.available": "0"})
    got = props(p)
    assert got["kubepods.slice"][0] == 5 * Gi
    assert got["kube.slice"][0] == 2 * Gi
    assert any("kubepods.slice" in w and str(Gi) in w for w in p.warnings)


def test_capacity_guard_is_quiet_below_the_limit():
    pods = [P(f"g{i}", "Guaranteed", i, C("c", Gi, Gi, id_=i)) for i in range(1, 8)]  # 7Gi of 8Gi, headroom 1Gi
    p = run(pods, capacity=8 * Gi, memoryReservationPolicy="HardReservation", protectionHeadroom="1Gi",
            evictionHard={"memory.available": "0"})
    assert props(p)["kubepods.slice"][0] == 7 * Gi and p.warnings == ()


def test_capacity_guard_only_looks_at_hard_protection():
    # Tiered: 7.5Gi of Burstable requests on 8Gi is MemoryLow, not hard protection.
    pods = [P("b", "Burstable", 1, C("c", 7680 * Mi, None, id_=1))]
    p = run(pods, capacity=8 * Gi, memoryReservationPolicy="TieredReservation", evictionHard={"memory.available": "0"})
    assert props(p)["kubepods.slice"][:2] == (0, 7680 * Mi) and p.warnings == ()


def test_capacity_guard_with_zero_headroom():
    pods = [P("g", "Guaranteed", 1, C("c", 8 * Gi, 8 * Gi, id_=1))]
    p = run(pods, capacity=8 * Gi, memoryReservationPolicy="HardReservation", protectionHeadroom="0",
            evictionHard={"memory.available": "0"})
    assert props(p)["kubepods.slice"][0] == 8 * Gi and p.warnings == ()


def test_capacity_guard_in_kubelet_mode_too():
    pods = [P(f"b{i}", "Burstable", i, C("c", 2 * Gi, None, id_=i)) for i in (1, 2)]
    p = run(pods, capacity=4 * Gi, memoryReservationPolicy="TieredReservation", hierarchy="kubelet")
    assert props(p)["kubepods.slice"][:2] == (4080218931, 4 * Gi)
    assert props(p)["kubepods-burstable.slice"][:2] == (0, 4 * Gi)
    assert len(p.warnings) == 2 and p.warnings[0].startswith("pods request 4Gi in total")
    assert "kubepods.slice" in p.warnings[1]


def test_requests_within_allocatable_say_nothing_and_above_it_name_the_largest_pod():
    pods = [P("small", "Burstable", 1, C("c", Gi, None, id_=1)), P("big", "Burstable", 2, C("c", 3 * Gi, None, id_=2))]
    assert run(pods[:1], capacity=4 * Gi).warnings == ()
    assert run(pods, capacity=4 * Gi).warnings == (
        "pods request 4Gi in total, more than the node's allocatable 3.9Gi (capacity 4Gi); the largest: pod default/big"
        " with 3Gi",)


def test_a_request_above_its_own_limit_warns_naming_pod_and_container():
    p = run([P("odd", "Burstable", 1, C("c", 2 * Gi, Gi, id_=1))], capacity=16 * Gi)
    assert p.warnings == ("pod default/odd container 'c': request 2Gi is above its limit 1Gi; planned from the"
                          " request, not throttled",)


# ================================================================== what is never planned

def test_invalid_uids_are_warned_about_and_never_planned():
    good = P("good", "Burstable", 1, C("c", Mi, None, id_=1))
    bad = [Pod(uid=u, namespace="evil", name=f"bad{i}", qos="Burstable", containers=(C("c", Gi, None, id_=10 + i),))
           for i, u in enumerate(["not-a-uuid", "../../system", "00000000-0000-0000-0000-00000000000G",
                                  uid(2).upper().replace("0", "A"), "x" * 32, ""])]
    p = run([good, *bad], memoryReservationPolicy="HardReservation")
    names = [u.unit for u in p.units]
    assert pod_unit(1) in names and scope(1) in names
    assert all(scope(10 + i) not in names for i in range(len(bad)))
    assert len(names) == 3 + 2
    assert len(p.warnings) == len(bad)
    for i, w in enumerate(p.warnings):
        assert f"evil/bad{i}" in w
    # the bad pods' requests are not counted anywhere
    assert props(p)["kubepods-burstable.slice"][0] == Mi


@pytest.mark.parametrize("raw", ["containerd://XYZ", f"containerd://{'A' * 64}", f"containerd://{'0' * 63}",
                                 f"rkt://{'0' * 64}", "containerd://../../../system.slice", "garbage", ""])
def test_invalid_container_ids_are_warned_about_and_never_planned(raw):
    pods = [P("p", "Burstable", 1, Container("bad", "app", Mi, None, raw), C("good", Mi, None, id_=1))]
    p = run(pods, memoryReservationPolicy="HardReservation")
    assert [u.unit for u in p.units if u.level == "container"] == [scope(1)]
    assert len(p.warnings) == 1 and "default/p" in p.warnings[0] and "bad" in p.warnings[0]
    # the pod itself is still planned, with its whole request
    assert props(p)[pod_unit(1)][0] == 2 * Mi


def test_a_container_id_claimed_twice_is_planned_once():
    pods = [P("a", "Burstable", 1, C("c", Mi, None, id_=5)), P("b", "Burstable", 2, C("c", Mi, None, id_=5))]
    p = run(pods)
    assert [u.unit for u in p.units].count(scope(5)) == 1
    assert len(p.warnings) == 1 and "default/b" in p.warnings[0]


def test_a_pod_uid_given_twice_is_planned_once():
    pods = [P("a", "Burstable", 1, C("c", Mi, None, id_=5)), P("b", "Burstable", 1, C("c", Mi, None, id_=6))]
    p = run(pods, memoryReservationPolicy="HardReservation")
    names = [u.unit for u in p.units]
    assert names.count(pod_unit(1)) == 1
    assert scope(6) not in names
    assert len(p.warnings) == 1 and "default/b" in p.warnings[0]
    assert props(p)["kubepods-burstable.slice"][0] == Mi
    check_order(p)


# ================================================================== cgroupRoot and order

@pytest.mark.parametrize("root, prefix, roots", [("/foo", "foo-kubepods", ["foo.slice"]),
                                                 ("/foo.slice", "foo-kubepods", ["foo.slice"]),
                                                 ("/a/b", "a-b-kubepods", ["a.slice", "a-b.slice"])])
def test_cgroup_root_effective_backs_every_ancestor(root, prefix, roots):
    p = run(NODE_PODS, memoryReservationPolicy="TieredReservation", cgroupRoot=root)
    got = props(p)
    assert [u.unit for u in p.units][: len(roots) + 1] == [*roots, f"{prefix}.slice"]
    for r in roots:
        assert got[r] == (Gi, 1344 * Mi, INF)
    assert got[f"{prefix}.slice"] == (Gi, 1344 * Mi, INF)
    assert got[f"{prefix}-burstable.slice"] == (0, 1344 * Mi, INF)
    assert got[pod_unit(2, root=prefix)] == (0, 768 * Mi, INF)
    assert p.node_unit().unit == f"{prefix}.slice"
    check_order(p)


def test_cgroup_root_kubelet_mode_plans_only_kubepods():
    p = run(NODE_PODS, memoryReservationPolicy="TieredReservation", cgroupRoot="/foo", hierarchy="kubelet")
    assert "foo.slice" not in props(p)
    assert props(p)["foo-kubepods.slice"] == (2368 * Mi, 1344 * Mi, INF)


def test_bad_cgroup_root_is_a_plan_error():
    with pytest.raises(PlanError):
        run([], cgroupRoot="/..")


def test_units_are_ordered_parents_before_children():
    p = run(list(reversed(NODE_PODS)), memoryReservationPolicy="HardReservation", cgroupRoot="/a/b",
            enforceNodeAllocatable=["pods", "kube-reserved"], kubeReserved={"memory": "1Gi"},
            kubeReservedCgroup="/kube.slice")
    check_order(p)
    order = {u.unit: i for i, u in enumerate(p.units)}
    rank = {"node": 0, "reserved": 1, "qos": 2, "pod": 3, "container": 4}
    levels = [rank[u.level] for u in p.units]
    assert levels == sorted(levels)
    # parents by name, independently of the `parent` field
    assert order["a.slice"] < order["a-b.slice"] < order["a-b-kubepods.slice"] < order["a-b-kubepods-burstable.slice"]
    assert order["a-b-kubepods-burstable.slice"] < order[pod_unit(2, root="a-b-kubepods")] < order[scope(2)]
    assert order["a-b-kubepods.slice"] < order[pod_unit(1, "Guaranteed", root="a-b-kubepods")] < order[scope(1)]


def test_plan_is_deterministic():
    a = run(NODE_PODS, memoryReservationPolicy="TieredReservation")
    b = run(list(reversed(NODE_PODS)), memoryReservationPolicy="TieredReservation")
    assert a == b


def test_plan_from_a_pods_document_and_a_config_file():
    # The whole path with the issue's input shapes: a kubelet /pods PodList and a YAML config.
    doc = yaml.safe_load(f"""
kind: PodList
items:
- metadata: {{name: web, namespace: shop, uid: {uid(2)}}}
  spec:
    containers:
    - name: app
      resources: {{requests: {{memory: 512Mi, cpu: 100m}}, limits: {{memory: 1Gi}}}}
  status:
    phase: Running
    qosClass: Burstable
    containerStatuses:
    - {{name: app, containerID: "{cid(2)}", state: {{running: {{}}}}}}
- metadata: {{name: done, namespace: shop, uid: {uid(3)}}}
  spec: {{containers: [{{name: app, resources: {{requests: {{memory: 4Gi}}}}}}]}}
  status: {{phase: Succeeded}}
""")
    pods, warnings = parse_pods(doc)
    config = parse_config(yaml.safe_load("memoryReservationPolicy: TieredReservation\n"))
    p = plan(pods, NodeFacts(16 * Gi), config)
    assert warnings == [] and p.warnings == ()
    got = props(p)
    assert got[pod_unit(2)] == (0, 512 * Mi, INF)
    assert got[scope(2)] == (0, 512 * Mi, 1020051456)
    assert pod_unit(3) not in got


# ---- the BestEffort ceiling (issue 25) --------------------------------------------------------
BE_SLICE = "kubepods-besteffort.slice"


@pytest.mark.parametrize("alloc, requests, headroom, minimum, page, expected", [
    # allocatable - requests - headroom, down to a page
    (8 * Gi, 3 * Gi, 256 * Mi, 64 * Mi, 4096, 5 * Gi - 256 * Mi),
    (8 * Gi, 3 * Gi + 1, 256 * Mi, 64 * Mi, 4096, 5 * Gi - 256 * Mi - 4096),  # 1 byte more: a page less
    (8 * Gi, 0, 0, 64 * Mi, 4096, 8 * Gi),  # no requests, no headroom: all of allocatable
    # never below the minimum: requests fill the node, or overfill it (the sum is negative)
    (8 * Gi, 8 * Gi - 300 * Mi, 256 * Mi, 64 * Mi, 4096, 64 * Mi),
    (8 * Gi, 12 * Gi, 256 * Mi, 64 * Mi, 4096, 64 * Mi),
    (8 * Gi, 8 * Gi - 300 * Mi, 256 * Mi, 44 * Mi, 4096, 44 * Mi),  # 300 - 256 = 44Mi: equal either way
    # a minimum that is no whole page is rounded up to one (the kernel keeps pages, rounded down)
    (8 * Gi, 8 * Gi, 0, 10**6, 4096, 245 * 4096),  # 1000000 / 4096 = 244.1
    (8 * Gi, 3 * Gi, 256 * Mi, 64 * Mi, 2 * Mi, 5 * Gi - 256 * Mi),  # 2 MiB pages: already whole
    (8 * Gi + Mi, 3 * Gi, 256 * Mi, 64 * Mi, 2 * Mi, 5 * Gi - 256 * Mi),  # down to a 2 MiB page
])
def test_besteffort_ceiling_formula(alloc, requests, headroom, minimum, page, expected):
    from memqos_systemd.plan import besteffort_ceiling
    assert besteffort_ceiling(alloc, requests, headroom, minimum, page) == expected


def ceiling_plan(pods, **keys) -> Plan:
    return run(pods, capacity=16 * Gi, bestEffortCeiling={"enabled": True, **keys.pop("ceiling", {})}, **keys)


def test_ceiling_counts_guaranteed_and_burstable_requests_with_overhead_and_not_besteffort():
    pods = [P("g", "Guaranteed", 1, C("c", 2 * Gi, 2 * Gi, 1)),
            P("b", "Burstable", 2, C("c", 1 * Gi, None, 2), overhead=64 * Mi),
            P("be", "BestEffort", 3, C("c", 0, None, 3))]
    p = ceiling_plan(pods)
    alloc = 16 * Gi - 100 * Mi
    want = alloc - (2 * Gi + 1 * Gi + 64 * Mi) - 256 * Mi  # the default headroom
    assert p.by_unit()[BE_SLICE].memory_max == want
    assert p.ceiling.requests == 3 * Gi + 64 * Mi and p.ceiling.unit == BE_SLICE
    assert p.by_unit()[BE_SLICE].properties() == {"MemoryMin": 0, "MemoryLow": 0, "MemoryHigh": INF, "MemoryMax": want}
    # no other unit gets a MemoryMax from us: none of them carries the property
    assert [u.unit for u in p.units if "MemoryMax" in u.properties()] == [BE_SLICE]


@pytest.mark.parametrize("policy", ["None", "TieredReservation", "HardReservation"])
@pytest.mark.parametrize("hierarchy", ["effective", "kubelet"])
def test_ceiling_does_not_depend_on_the_reservation_policy(policy, hierarchy):
    pods = [P("g", "Guaranteed", 1, C("c", 2 * Gi, 2 * Gi, 1)), P("b", "Burstable", 2, C("c", 1 * Gi, None, 2))]
    p = ceiling_plan(pods, memoryReservationPolicy=policy, hierarchy=hierarchy, ceiling={"headroom": "1Gi"})
    assert p.by_unit()[BE_SLICE].memory_max == 16 * Gi - 100 * Mi - 3 * Gi - 1 * Gi


def test_ceiling_off_plans_no_memorymax_anywhere():
    p = run([P("be", "BestEffort", 3, C("c", 0, None, 3))])
    assert p.ceiling is None and all("MemoryMax" not in u.properties() for u in p.units)


def test_ceiling_follows_cgroup_root_and_reservations():
    p = ceiling_plan([], cgroupRoot="/foo", kubeReserved={"memory": "1Gi"}, ceiling={"minimum": "128Mi"})
    assert p.ceiling.unit == "foo-kubepods-besteffort.slice"
    assert p.by_unit()["foo-kubepods-besteffort.slice"].memory_max == 16 * Gi - 1 * Gi - 100 * Mi - 256 * Mi


def test_ceiling_is_left_to_a_kubelet_whose_config_turns_on_qosreserved_for_memory():
    from memqos_systemd.config import parse_config as parse
    keys = {"bestEffortCeiling": {"enabled": True}, "kubeletConfigFile": "/var/lib/kubelet/config.yaml"}
    for gates, reserved, planned in ((
            {"QOSReserved": True}, {"memory": "100%"}, False),
            ({"QOSReserved": False}, {"memory": "100%"}, True),  # the gate off: the kubelet ignores qosReserved
            ({}, {"memory": "100%"}, True),  # alpha, off by default (a command-line gate: found at run time)
            ({"QOSReserved": True}, {}, True)):  # on, but nothing reserved for memory
        c = parse(keys, "config.yaml", {"kind": "KubeletConfiguration", "featureGates": gates, "qosReserved": reserved},
                  "/var/lib/kubelet/config.yaml")
        p = plan_all([], NodeFacts(16 * Gi, 4096), c)
        assert (p.ceiling is not None) is planned, (gates, reserved)
        if not planned:
            assert p.by_unit()[BE_SLICE].memory_max is None
            assert p.warnings == ("bestEffortCeiling: not planned: the kubelet's QOSReserved is on with qosReserved.memory"
                                  " 100% (/var/lib/kubelet/config.yaml), and it sets kubepods-besteffort.slice's"
                                  " MemoryMax itself every minute; turn one of the two off",)


# ---- ceiling values that make no sense for the node (issue 33) ------------------------------------
# capacity 8Gi - evictionHard 100Mi = allocatable 8092Mi ("7.9Gi").
HEADROOM_SQUEEZES = ("bestEffortCeiling.headroom: {h} leaves less than bestEffortCeiling.minimum {m} of allocatable"
                     " 7.9Gi even with no requests: every BestEffort pod together gets the minimum, whatever the"
                     " others request")
MINIMUM_IDLE = ("bestEffortCeiling.minimum: {m} is at or above allocatable 7.9Gi: the ceiling never caps BestEffort"
                " pods below what the node has, so it does nothing")


@pytest.mark.parametrize("ceiling, warning, memory_max", [
    ({}, None, 8092 * Mi - 256 * Mi),  # the defaults: fine
    ({"headroom": "100Gi"}, HEADROOM_SQUEEZES.format(h="100Gi", m="64Mi"), 64 * Mi),
    ({"headroom": "8092Mi"}, HEADROOM_SQUEEZES.format(h="7.9Gi", m="64Mi"), 64 * Mi),  # all of allocatable
    ({"headroom": "8028Mi"}, None, 64 * Mi),  # leaves exactly the minimum: the formula still decides
    ({"headroom": "8029Mi"}, HEADROOM_SQUEEZES.format(h="7.84Gi", m="64Mi"), 64 * Mi),
    ({"headroom": "1Gi", "minimum": "7.5Gi"}, HEADROOM_SQUEEZES.format(h="1Gi", m="7.5Gi"), 7.5 * Gi),
    ({"minimum": "100Gi"}, MINIMUM_IDLE.format(m="100Gi"), 100 * Gi),
    ({"minimum": "8092Mi"}, MINIMUM_IDLE.format(m="7.9Gi"), 8092 * Mi),  # allocatable itself caps nothing
    ({"minimum": "100Gi", "headroom": "100Gi"}, MINIMUM_IDLE.format(m="100Gi"), 100 * Gi),  # one line, the worse
    # headroom as a percentage of allocatable (as protectionHeadroom takes one, of capacity)
    ({"headroom": "50%"}, None, 4046 * Mi),
    ({"headroom": "99.5%"}, HEADROOM_SQUEEZES.format(h="99.5% (7.86Gi)", m="64Mi"), 64 * Mi),
])
def test_ceiling_values_that_make_no_sense_for_the_node_are_warned(ceiling, warning, memory_max):
    p = run([], capacity=8 * Gi, bestEffortCeiling={"enabled": True, **ceiling})
    ours = [w for w in p.warnings if w.startswith("bestEffortCeiling.")]
    assert ours == ([warning] if warning else [])
    assert p.ceiling.memory_max == memory_max


def test_ceiling_warnings_do_not_depend_on_the_pods():
    """Requests filling the node pin the ceiling to its minimum too: that is the ceiling at work,
    not a misfit of its values, and no warning of ours."""
    pods = [P("g", "Guaranteed", 1, C("c", 8000 * Mi, 8000 * Mi, 1))]
    p = run(pods, capacity=8 * Gi, bestEffortCeiling={"enabled": True})
    assert p.ceiling.memory_max == 64 * Mi
    assert not [w for w in p.warnings if w.startswith("bestEffortCeiling.")]
