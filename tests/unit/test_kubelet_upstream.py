"""The kubelet's own Memory QoS tests, ported to `plan` with `hierarchy: kubelet` (issue 36).

Every row names the upstream test it comes from as `file:TestName/"case"`. The inputs and the
expected values are our translation of what each case builds and asserts (the Go was read, not
copied; docs/DESIGN.md "hierarchy: kubelet is the kubelet of v1.37" names the versions read).
Where an upstream case asserts only some values (say, the pod slice's memory.low), the row checks
only those; everything else the plan holds is checked by the rest of the suite.

Files, as the index had them (pkg/kubelet is abbreviated `kl/`):

  QOS   kl/cm/qos_container_manager_linux_test.go      (the version with TestQOSCgroupsWithSystemPartition)
  HLP   kl/cm/helpers_linux_test.go                    (the version with TestApplyPodLevelMemoryHigh)
  PCM   kl/cm/pod_container_manager_linux_test.go      (the version with TestEnsureExists)
  RSZ   kl/kuberuntime, the resize test file           (TestDoPodResizeAction...UpdatesPodMemoryLow)
  KRT   kl/kuberuntime/kuberuntime_container_linux_test.go, with the BestEffort case of
        kubernetes/kubernetes#137685
  E2E   test/e2e_node, the SIGDescribe("MemoryQoS") suite (the index showed its text, not its path)

Cases that `plan` cannot take as input are in NOT_MODELLED, each with the reason; the counts at
the bottom are asserted so that a case cannot silently move from one list to the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from memqos_systemd.config import parse_config
from memqos_systemd.plan import INFINITY, NodeFacts, plan
from memqos_systemd.pods import Container, Pod

Mi, Gi = 2**20, 2**30
INF = INFINITY
PAGE = 4096  # os.Getpagesize() on the machines the upstream tests run on

QOS = "pkg/kubelet/cm/qos_container_manager_linux_test.go"
HLP = "pkg/kubelet/cm/helpers_linux_test.go"
PCM = "pkg/kubelet/cm/pod_container_manager_linux_test.go"
RSZ = "pkg/kubelet/kuberuntime (resize test)"
KRT = "pkg/kubelet/kuberuntime/kuberuntime_container_linux_test.go"
E2E = "test/e2e_node MemoryQoS suite"

NODE = "kubepods.slice"
BURSTABLE = "kubepods-burstable.slice"


def uid(n: int) -> str:
    return f"00000000-0000-0000-0000-{n:012d}"


def pod_slice(n: int, qos: str) -> str:
    middle = {"Guaranteed": "kubepods", "Burstable": "kubepods-burstable", "BestEffort": "kubepods-besteffort"}[qos]
    return f"{middle}-pod00000000_0000_0000_0000_{n:012d}.slice"


def scope(n: int) -> str:
    return f"cri-containerd-{n:064x}.scope"


def C(n: int, req: int = 0, lim: int | None = None, kind: str = "app") -> Container:
    """Container `n` (its scope is scope(n)); `req` already defaulted to `lim` as the API server does."""
    return Container(f"c{n}", kind, req, lim, f"containerd://{n:064x}")


def P(n: int, qos: str, *containers: Container, **kw) -> Pod:
    return Pod(uid=uid(n), namespace="test", name=f"pod{n}", qos=qos, containers=tuple(containers), **kw)


def high(req: int, ceiling: int, factor: float) -> int:
    """The e2e suite's own expectation (memqosExpectedMemoryHigh), written out independently of
    plan.py: floor((req + factor * (ceiling - req)) / page) * page in float64."""
    return int((req + factor * (ceiling - req)) // PAGE) * PAGE


@dataclass(frozen=True)
class Case:
    source: str  # file:TestName/"case"
    pods: tuple[Pod, ...]
    expect: dict[str, dict[str, int]]  # unit -> {"min"|"low"|"high": value} the upstream case asserts
    keys: dict = field(default_factory=dict)  # our config keys (hierarchy: kubelet is added)
    allocatable: int = 16 * Gi  # node allocatable; the node's capacity, with no reserve or eviction
    note: str = ""  # what of the upstream case this row does not compare, and why


TIERED = {"memoryReservationPolicy": "TieredReservation"}


def tiered(factor: float | None = None) -> dict:
    return {**TIERED, "memoryThrottlingFactor": factor}


# ------------------------------------------------------------ QoS level (setMemoryQoS)

# activeTestPods(): a Guaranteed pod 128Mi/128Mi, a Burstable one 128Mi/256Mi, a Burstable one 256Mi
# without a limit. ΣG = 128Mi, ΣB = 384Mi.
ACTIVE = (P(1, "Guaranteed", C(1, 128 * Mi, 128 * Mi)), P(2, "Burstable", C(2, 128 * Mi, 256 * Mi)),
          P(3, "Burstable", C(3, 256 * Mi)))

# TestQOSCgroupsWithSystemPartition's node: Guaranteed 1024Mi (default) and 128Mi (kube-system);
# Burstable 256Mi (default) and 64Mi (kube-system), limits twice the requests; two BestEffort.
PARTITION_PODS = (
    P(11, "Guaranteed", C(11, 1024 * Mi, 1024 * Mi)), P(12, "Guaranteed", C(12, 128 * Mi, 128 * Mi)),
    P(13, "Burstable", C(13, 256 * Mi, 512 * Mi)), P(14, "Burstable", C(14, 64 * Mi, 128 * Mi)),
    P(15, "BestEffort", C(15)), P(16, "BestEffort", C(16)),
)

QOS_CASES = [
    Case(f'{QOS}:TestQoSContainerCgroup/"writes aggregated memory min"', ACTIVE,
         {NODE: {"min": 512 * Mi}, BURSTABLE: {"low": 384 * Mi}}, TIERED),
    Case(f'{QOS}:TestQoSContainerCgroup/"writes zero memory min for best effort pod"',
         (P(4, "BestEffort", C(4)),), {NODE: {"min": 0}, BURSTABLE: {"low": 0}}, TIERED),
    Case(f'{QOS}:TestQoSContainerCgroup/"writes zero memory min for burstable pod without memory request"',
         (P(5, "Burstable", C(5)),), {NODE: {"min": 0}, BURSTABLE: {"low": 0}}, TIERED,
         note="the pod is Burstable by its CPU request, which plan takes as its QoS class"),
    Case(f'{QOS}:TestQoSContainerCgroup/"clears stale memory min when all pods removed"', (),
         {NODE: {"min": 0}, BURSTABLE: {"low": 0}}, TIERED,
         note="the stale values it starts from do not matter to a plan, which says what to hold"),
    Case(f'{QOS}:TestQoSContainerCgroup/"writes zero memory min for best effort pod with DRA"',
         (P(6, "BestEffort", C(6)),), {NODE: {"min": 0}, BURSTABLE: {"low": 0}}, TIERED,
         note="its DRA claim does not count for a BestEffort pod, so the pod is a plain BestEffort one"),
    Case(f'{QOS}:TestQoSContainerCgroup/"writes memory min with pod-level resources"',
         (P(1, "Guaranteed", C(1, 128 * Mi, 128 * Mi)),
          P(7, "Burstable", C(7, 128 * Mi, 256 * Mi), pod_request=512 * Mi)),
         {NODE: {"min": 640 * Mi}, BURSTABLE: {"low": 512 * Mi}}, TIERED,
         note="with a pod-level request its DRA claim is not added (the upstream expectation), so it is left out"),
    Case(f'{QOS}:TestQoSContainerCgroupWithMemoryReservationPolicyNone', ACTIVE,
         {NODE: {"min": 0}, BURSTABLE: {"low": 0}}, {"memoryReservationPolicy": "None"}),
    Case(f'{QOS}:TestQOSCgroupsWithSystemPartition/"a node without a partition reports the node-wide metrics"',
         PARTITION_PODS,
         {NODE: {"min": (1024 + 128 + 256 + 64) * Mi, "low": (256 + 64) * Mi},
          BURSTABLE: {"low": (256 + 64) * Mi}},
         TIERED, allocatable=8192 * Mi,
         note="its QOSReserved MemoryMax, CPU shares and metrics are not Memory QoS values of a unit we plan"),
]

# ------------------------------------------------------------ pod level (ResourceConfigForPod, EnsureExists)

POD_CASES = []
for name, containers, qos, kind, amount in [
    ("besteffort", [(0, None)], "BestEffort", "low", 0),
    ("burstable-no-limits", [(100 * Mi, None)], "Burstable", "low", 100 * Mi),
    ("burstable-with-limits", [(100 * Mi, 200 * Mi)], "Burstable", "low", 100 * Mi),
    ("burstable-with-limits-no-cpu-enforcement", [(100 * Mi, 200 * Mi)], "Burstable", "low", 100 * Mi),
    ("burstable-partial-limits", [(100 * Mi, 200 * Mi), (100 * Mi, None)], "Burstable", "low", 200 * Mi),
    ("burstable-with-limits-with-tuned-quota", [(100 * Mi, 200 * Mi)], "Burstable", "low", 100 * Mi),
    ("burstable-with-limits-no-cpu-enforcement-with-tuned-quota", [(100 * Mi, 200 * Mi)], "Burstable", "low",
     100 * Mi),
    ("burstable-partial-limits-with-tuned-quota", [(100 * Mi, 200 * Mi), (100 * Mi, None)], "Burstable", "low",
     200 * Mi),
    ("guaranteed", [(100 * Mi, 100 * Mi)], "Guaranteed", "min", 100 * Mi),
    ("guaranteed-no-cpu-enforcement", [(100 * Mi, 100 * Mi)], "Guaranteed", "min", 100 * Mi),
    ("guaranteed-with-tuned-quota", [(100 * Mi, 100 * Mi)], "Guaranteed", "min", 100 * Mi),
    ("guaranteed-no-cpu-enforcement-with-tuned-quota", [(100 * Mi, 100 * Mi)], "Guaranteed", "min", 100 * Mi),
]:
    cs = [C(20 + i, r, lim) for i, (r, lim) in enumerate(containers)]
    other = "min" if kind == "low" else "low"
    POD_CASES.append(Case(
        f'{HLP}:TestResourceConfigForPodWithEnforceMemoryQoS/"{name}"', (P(20, qos, *cs),),
        {pod_slice(20, qos): {kind: amount, other: 0}}, TIERED,
        note="CPU quota and period are not ours; only the Unified memory values are compared"))

POD_CASES += [
    Case(f'{HLP}:TestApplyPodLevelMemoryHigh/"cpu-only pod-level resources does not set memory.high"',
         (P(30, "Burstable", C(30, 100 * Mi)),), {pod_slice(30, "Burstable"): {"high": INF}}, tiered(0.9)),
    # 128Mi requested, 256Mi limit, 64Mi overhead, factor 0.9, as whole pages:
    # with overhead    192Mi + 0.9 * 128Mi = 307.2Mi -> floor to 4Ki
    # without overhead 128Mi + 0.9 * 128Mi = 243.2Mi -> floor to 4Ki (the upstream case asserts only ">")
    Case(f'{HLP}:TestApplyPodLevelMemoryHigh/"pod overhead is included in memory.high calculation"',
         (P(31, "Burstable", C(31, 128 * Mi, 256 * Mi), pod_request=128 * Mi, pod_limit=256 * Mi,
            overhead=64 * Mi),),
         {pod_slice(31, "Burstable"): {"high": high(192 * Mi, 320 * Mi, 0.9)}}, tiered(0.9),
         note="upstream asserts with > without overhead; the row also holds the value, and"
              " test_pod_overhead_raises_pod_memory_high the inequality"),
    Case(f'{HLP}:TestApplyPodLevelMemoryHigh/"mixed declared/undeclared memory limits does not set memory.high"',
         (P(32, "Burstable", C(32, 100 * Mi, 200 * Mi), C(33, 100 * Mi)),),
         {pod_slice(32, "Burstable"): {"high": INF}}, tiered(0.9)),
]
for name in ("preserves existing resource settings with writable cgroups",
             "omits writable cgroup limits with CgroupOptions disabled",
             "omits writable cgroup limits for a read-only mount"):
    POD_CASES.append(Case(
        f'{PCM}:TestEnsureExists/"{name}"', (P(40, "Burstable", C(40, 128 * Mi, 256 * Mi)),),
        {pod_slice(40, "Burstable"): {"low": 134217728, "min": 0, "high": INF}}, tiered(None),
        note="the writable-cgroup limits (max descendants, depth) are not Memory QoS"))

# A request-only resize 256Mi -> 400Mi of foo1 (limit 512Mi) in makeBasePodAndStatus's pod (foo2 and
# foo3 request nothing): the allocated request is what the pod slice holds.
POD_CASES.append(Case(
    f'{RSZ}:TestDoPodResizeActionRequestOnlyMemoryResizeUpdatesPodMemoryLow',
    (P(50, "Burstable", C(50, 400 * Mi, 512 * Mi), C(51), C(52)),),
    {pod_slice(50, "Burstable"): {"low": 419430400}}, tiered(0.9),
    note="the order of its writes (sandbox first, then the pod cgroup) is not a value"))

# ------------------------------------------------------------ container level (CRI Unified)

ALLOC_32 = 32 * Gi  # fakeNodeAllocatableMemory
CONTAINER_CASES = [
    Case(f'{KRT}:TestGenerateContainerConfigWithMemoryQoSEnforced/"Request128MBLimit256MB"',
         (P(60, "Burstable", C(60, 128 * Mi, 256 * Mi)),),
         {scope(60): {"low": 128 * Mi, "high": high(128 * Mi, 256 * Mi, 0.9)}}, tiered(0.9), allocatable=ALLOC_32),
    Case(f'{KRT}:TestGenerateContainerConfigWithMemoryQoSEnforced/"Request128MBWithoutLimit"',
         (P(61, "Burstable", C(61, 128 * Mi)),),
         {scope(61): {"low": 128 * Mi, "high": high(128 * Mi, ALLOC_32, 0.9)}}, tiered(0.9), allocatable=ALLOC_32),
    Case(f'{KRT}:TestGenerateContainerConfigWithMemoryQoSEnforced/"BestEffortUsesNodeAllocatableForMemoryHigh"',
         (P(62, "BestEffort", C(62)),),
         {scope(62): {"low": 0, "high": high(0, ALLOC_32, 0.9)}}, tiered(0.9), allocatable=ALLOC_32),
]

# ------------------------------------------------------------ the node e2e suite

B256 = (P(70, "Burstable", C(70, 256 * Mi, 512 * Mi)),)
B128 = (P(71, "Burstable", C(71, 128 * Mi, 256 * Mi)),)
G256 = (P(72, "Guaranteed", C(72, 256 * Mi, 256 * Mi)),)
B200 = (P(73, "Burstable", C(73, 200 * Mi, 400 * Mi)),)
POLICY_NONE = {"memoryReservationPolicy": "None", "memoryThrottlingFactor": 0.9}
TIERED_09 = tiered(0.9)
E2E_CASES = [
    Case(f'{E2E}:memory protection/"should set memory.low = requests.memory for Burstable pod containers"', B256,
         {pod_slice(70, "Burstable"): {"low": 256 * Mi}, scope(70): {"low": 256 * Mi}}, TIERED_09),
    Case(f'{E2E}:memory protection/"should set memory.min for Guaranteed pod containers"', G256,
         {pod_slice(72, "Guaranteed"): {"min": 256 * Mi}}, TIERED_09),
    Case(f'{E2E}:memory protection/"should NOT set memory.min for BestEffort pod"', (P(74, "BestEffort", C(74)),),
         {pod_slice(74, "BestEffort"): {"min": 0}}, TIERED_09),
    Case(f'{E2E}:memory protection/"should set pod-level memory.low = sum(container requests) for multi-container pod"',
         (P(75, "Burstable", C(75, 128 * Mi, 512 * Mi), C(76, 256 * Mi, 512 * Mi)),),
         {pod_slice(75, "Burstable"): {"low": 384 * Mi}}, TIERED_09),
    Case(f'{E2E}:memory protection/"should propagate memory protection through QoS cgroup hierarchy"', B128,
         {NODE: {"min": 128 * Mi}, BURSTABLE: {"low": 128 * Mi}}, TIERED_09,
         note="upstream asserts > 0 on a node that may run other pods; alone, the values are the request"),
    Case(f'{E2E}:memory.high throttling/"should set memory.high for Burstable pod using formula"', B256,
         {scope(70): {"high": high(256 * Mi, 512 * Mi, 0.9)}}, POLICY_NONE),
    Case(f'{E2E}:memory.high throttling/"should NOT set memory.high for Guaranteed pod"', G256,
         {scope(72): {"high": INF}}, POLICY_NONE),
    Case(f'{E2E}:memory.high throttling/"should NOT set memory.high on pod-level cgroup"', B128,
         {pod_slice(71, "Burstable"): {"high": INF}}, POLICY_NONE),
    Case(f'{E2E}:memory.high throttling/"should set memory.high = limit when memoryThrottlingFactor=1.0"', B256,
         {scope(70): {"high": 512 * Mi}}, {"memoryReservationPolicy": "None", "memoryThrottlingFactor": 1.0}),
    Case(f'{E2E}:memory.high throttling/"should set memory.high using node allocatable when no limit is set"',
         (P(77, "Burstable", C(77, 128 * Mi)),), {scope(77): {"high": high(128 * Mi, 16 * Gi, 0.9)}}, POLICY_NONE,
         note="upstream asserts > request and not max on its node; with 16Gi allocatable this is the value"),
    *[Case(f'{E2E}:memory.high formula verification across request/limit ratios/"{name}"',
           (P(78, "Burstable", C(78, r * Mi, 512 * Mi)),),
           {scope(78): {"high": INF if r == 512 else high(r * Mi, 512 * Mi, 0.9)}}, POLICY_NONE)
      for name, r in (("low-request", 64), ("half-request", 256), ("high-request", 480), ("equal-req-limit", 512))],
    Case(f'{E2E}:memoryReservationPolicy/"should NOT set memory protection when policy is None"', B256,
         {pod_slice(70, "Burstable"): {"low": 0}, scope(70): {"low": 0}}, POLICY_NONE),
    Case(f'{E2E}:memoryReservationPolicy/"should set memory.high independent of memoryReservationPolicy"', B256,
         {scope(70): {"high": high(256 * Mi, 512 * Mi, 0.9)}}, POLICY_NONE),
    Case(f'{E2E}:memoryReservationPolicy/"should set memory protection when policy is TieredReservation"', B256,
         {pod_slice(70, "Burstable"): {"low": 256 * Mi}}, TIERED_09),
    Case(f'{E2E}:memoryReservationPolicy/"should clear memory protection at QoS level when switching from'
         f' TieredReservation to None"', B128, {BURSTABLE: {"low": 0}}, POLICY_NONE,
         note="the state after the switch; the minute it takes is the kubelet's period"),
    Case(f'{E2E}:tiered protection edge cases/"should use memory.low for Burstable pod where memory req == limit'
         f' but CPU differs"', (P(79, "Burstable", C(79, 128 * Mi, 128 * Mi)),),
         {scope(79): {"low": 128 * Mi, "min": 0}}, TIERED_09),
    Case(f'{E2E}:tiered protection edge cases/"should include burstable requests in kubepods root memory.min"',
         B200, {NODE: {"min": 200 * Mi}}, TIERED_09, note="upstream asserts >= the request"),
    Case(f'{E2E}:tiered protection edge cases/"should remove burstable memory.low contribution when pod is deleted"',
         B200, {BURSTABLE: {"low": 200 * Mi}}, TIERED_09,
         note="with the pod; test_deleted_pod_leaves_no_burstable_low checks the plan without it"),
]

CASES = QOS_CASES + POD_CASES + CONTAINER_CASES + E2E_CASES

# Upstream Memory QoS cases `plan` cannot take as input, and why. (Tests of CPU shares alone, of
# QoS manager start-up, and of kernel behaviour are not Memory QoS values and are not counted.)
NOT_MODELLED = {
    f'{QOS}:TestQoSContainerCgroup/"writes memory min including DRA allocations"':
        "memory a DRA claim maps onto node allocatable (status.nodeAllocatableResourceClaimStatuses) is added to"
        " the pod's request; pods.py does not read those statuses, so no Pod record carries it",
    f'{QOS}:TestQOSCgroupsWithSystemPartition/"the default partition sizes its QoS cgroups by its own pods and its'
    f' root by all pods"':
        "the system partition (kubepods-system.slice and its own QoS slices for the configured namespaces) is a"
        " layout our naming does not know, and no config key names its namespaces",
    f'{QOS}:TestQOSCgroupsWithSystemPartition/"the system partition sizes its QoS cgroups by its own pods and'
    f' memory limit"': "the same: the partition's units are not in our layout",
    f'{PCM}:TestEnsureExists/"sets writable cgroup limits with MemoryQoS disabled"':
        "the kubelet's MemoryQoS gate off: it writes no memory value at all, and `hierarchy: kubelet` is the"
        " kubelet with its gate on (a plan always holds a value)",
    f'{E2E}:feature rollback/"should reset memory protection to 0 when MemoryQoS is disabled"':
        "the gate turned off and the zeros a kubelet writes at its start: a transition between two writers'"
        " states, not a plan (companion mode's subject, issue 36 item 3)",
    f'{E2E}:feature rollback/"should not clobber other cgroup values when clearing stale memory protection at'
    f' startup"': "cpu.max and memory.max kept across a restart: not values we plan",
    f'{E2E}:tiered protection edge cases/"should persist container-level memory.low after rollback [known'
    f' limitation]"': "the gate turned off, and what the kubelet then leaves in place",
    f'{E2E}:memory.events observability/"should have memory.events file with expected counters"':
        "a kernel counter, not a value anyone writes",
    f'{E2E}:memory.high throttling behavior/"should increment memory.events high counter when usage exceeds'
    f' memory.high"': "the kernel's throttling under load",
    f'{E2E}:memory.high throttling behavior/"should OOM kill container when memory usage exceeds memory.max"':
        "the kernel's OOM kill at memory.max",
}


def _run(case: Case):
    keys = {"hierarchy": "kubelet", "evictionHard": {"memory.available": "0"}, "protectionHeadroom": "0", **case.keys}
    return plan(list(case.pods), NodeFacts(case.allocatable, PAGE), parse_config(keys))


@pytest.mark.parametrize("case", CASES, ids=[c.source for c in CASES])
def test_upstream_case(case: Case):
    p = _run(case)
    assert p.allocatable == case.allocatable
    got = {u.unit: {"min": u.memory_min, "low": u.memory_low, "high": u.memory_high} for u in p.units}
    for unit, want in case.expect.items():
        assert unit in got, f"{unit} is not planned"
        assert {k: got[unit][k] for k in want} == want, unit


def test_every_case_named_once():
    sources = [c.source for c in CASES]
    assert len(sources) == len(set(sources))
    assert not set(sources) & set(NOT_MODELLED)


def test_counts():
    # Ported and reproduced: every row above passes; not modellable: the list, each with its reason.
    assert len(CASES) == 51
    assert len(NOT_MODELLED) == 10
    assert all(reason for reason in NOT_MODELLED.values())


def test_pod_overhead_raises_pod_memory_high():
    # HLP:TestApplyPodLevelMemoryHigh/"pod overhead is included...": its assertion, > without overhead.
    with_overhead = _run(POD_CASES[13]).by_unit()[pod_slice(31, "Burstable")].memory_high
    bare = Case("", (P(31, "Burstable", C(31, 128 * Mi, 256 * Mi), pod_request=128 * Mi, pod_limit=256 * Mi),),
                {}, tiered(0.9))
    without = _run(bare).by_unit()[pod_slice(31, "Burstable")].memory_high
    assert INF > with_overhead > without == high(128 * Mi, 256 * Mi, 0.9)


def test_deleted_pod_leaves_no_burstable_low():
    # E2E "should remove burstable memory.low contribution when pod is deleted", after the delete.
    p = _run(Case("", (), {}, TIERED_09))
    assert (p.by_unit()[BURSTABLE].memory_low, p.by_unit()[NODE].memory_low) == (0, 0)


def test_node_slice_low_is_the_burstable_requests():
    # kubernetes/kubernetes#140267, as TestQOSCgroupsWithSystemPartition asserts it for kubepods:
    # memory.low = ΣB next to memory.min = ΣG + ΣB; and the kubelet of v1.36 without it.
    today = _run(Case("", ACTIVE, {}, TIERED)).by_unit()[NODE]
    assert (today.memory_min, today.memory_low) == (512 * Mi, 384 * Mi)
    before = _run(Case("", ACTIVE, {}, {**TIERED, "hierarchy": "kubelet-1.36"})).by_unit()[NODE]
    assert (before.memory_min, before.memory_low) == (512 * Mi, 0)


@pytest.mark.parametrize("policy", ["None", "TieredReservation"])
def test_reserved_slices_hold_their_reservation_whatever_the_policy(policy):
    # node_container_manager_linux.go (enforceExistingCgroup): with the MemoryQoS gate on, a reserved
    # cgroup's memory.min is its reservation; the policy is not consulted.
    keys = {"memoryReservationPolicy": policy, "kubeReserved": {"memory": "1Gi"}, "systemReserved": {"memory": "512Mi"},
            "kubeReservedCgroup": "/kube.slice", "systemReservedCgroup": "/system.slice",
            "enforceNodeAllocatable": ["pods", "kube-reserved", "system-reserved"]}
    p = _run(Case("", (), {}, keys, allocatable=8 * Gi))
    got = {u.unit: u.memory_min for u in p.units if u.level == "reserved"}
    assert got == {"kube.slice": Gi, "system.slice": 512 * Mi}


def test_memory_high_in_the_kubelets_float_arithmetic():
    # kuberuntime computes memory.high in float64. 0.7 * 360Ki is 252Ki exactly, a page boundary,
    # but float64(0.7) is a little below 0.7: the kubelet writes 248Ki. `effective` keeps the exact
    # value; `kubelet` holds what the kubelet writes.
    pod = (P(90, "Burstable", C(90, 0, 360 * 1024)),)
    keys = {"memoryReservationPolicy": "None", "memoryThrottlingFactor": 0.7}
    assert _run(Case("", pod, {}, keys)).by_unit()[scope(90)].memory_high == 248 * 1024
    assert _run(Case("", pod, {}, {**keys, "hierarchy": "effective"})).by_unit()[scope(90)].memory_high == 252 * 1024
