"""The Burstable lever (burstableHigh, plan.burstable_high): a MemoryHigh on each Burstable pod
slice that leaves every other Guaranteed and Burstable pod's request alone. Every expected value
is worked out by hand; the node is 16Gi with the default evictionHard 100Mi: allocatable 16284Mi."""

from __future__ import annotations

from fractions import Fraction

import pytest
import yaml

from memqos_systemd.config import BurstableHighSettings, ConfigError, parse_config
from memqos_systemd.config_schema import Reserve
from memqos_systemd.kubelet_gate import Gate, KubeletFacts, Writes, writes
from memqos_systemd.naming import Naming
from memqos_systemd.features import plan_all
from memqos_systemd.plan import INFINITY, Lever, NodeFacts, burstable_high, plan
from memqos_systemd.quantity import format_bytes
from memqos_systemd.reconcile import DEFAULTS, diff, reset_plan

from test_plan import C, Gi, Mi, P, pod_unit, props, scope

INF = INFINITY
ALLOC = 16284 * Mi
ON = {"burstableHigh": {"enabled": True}}


# Beside a kubelet with its gate on and TieredReservation, with a throttling factor (the pod slices'
# MemoryHigh is then its own) or without one (its v1.37 default: the pod slices' MemoryHigh is ours).
KUBELET = {"factor": writes(KubeletFacts(Gate(True, "t"), "TieredReservation", factor=0.9)),
           "tiered": writes(KubeletFacts(Gate(True, "t"), "TieredReservation"))}


def run(pods, capacity=16 * Gi, page=4096, companion=None, **keys):
    # as the service plans: plan.plan, then each feature's step (the lever's is one)
    return plan_all(list(pods), NodeFacts(capacity, page, KUBELET[companion] if companion else Writes()),
                    parse_config(keys))


def highs(p):
    return {u: v[2] for u, v in props(p).items()}


NODE = [
    P("g", "Guaranteed", 1, C("a", 2 * Gi, 2 * Gi, id_=1)),
    P("b1", "Burstable", 2, C("a", Gi, None, id_=2)),  # no limit: the lever's
    P("b2", "Burstable", 3, C("a", 512 * Mi, None, id_=3), C("side", 0, 64 * Mi, id_=4)),  # one container unlimited
    P("capped", "Burstable", 4, C("a", 100 * Mi, 200 * Mi, id_=5)),  # every container limited, below the lever
    P("be", "BestEffort", 5, C("a", id_=6)),
]
# every G and B request: 2Gi + 1Gi + 512Mi + 100Mi = 3684Mi


@pytest.mark.parametrize("n, expected", [
    (2, ALLOC - (3684 - 1024) * Mi),  # b1: 16284 - (2048 + 512 + 100) = 13624Mi
    (3, ALLOC - (3684 - 512) * Mi),  # b2: 16284 - (2048 + 1024 + 100) = 13112Mi
    (4, INF),  # capped at 200Mi by its containers' limits: left alone
])
def test_several_pods(n, expected):
    assert highs(run(NODE, **ON))[pod_unit(n)] == expected


def test_off_by_default_and_nothing_else_moves():
    off, on = run(NODE), run(NODE, **ON)
    assert off.levers == () and all(v == INF for u, v in highs(off).items() if "-pod" in u)
    changed = {u for u in props(on) if props(on)[u] != props(off)[u]}
    assert changed == {pod_unit(2), pod_unit(3)}  # containers keep the KEP's formula, G and BE untouched
    assert highs(on)[scope(2)] == highs(off)[scope(2)] < INF
    assert highs(on)[pod_unit(1, "Guaranteed")] == INF and highs(on)[pod_unit(5, "BestEffort")] == INF


def test_the_record_says_how():
    p = run(NODE, burstableHigh={"enabled": True, "headroom": "100Mi"})
    assert p.levers == (
        Lever(pod_unit(2), "default/b1", 13524 * Mi, 2660 * Mi, 100 * Mi, Gi, False),
        Lever(pod_unit(3), "default/b2", 13012 * Mi, 3172 * Mi, 100 * Mi, 512 * Mi, False),
    )
    assert p.lever_of(pod_unit(2)).formula(p.allocatable) == (
        "MemoryHigh 13.21Gi = allocatable 15.9Gi - others' requests 2.6Gi - headroom 100Mi",)
    assert p.lever_of(pod_unit(4)) is None
    assert run(NODE, **ON).levers[0].formula(ALLOC) == ("MemoryHigh 13.3Gi = allocatable 15.9Gi - others' requests 2.6Gi",)


def test_a_lone_pod_gets_allocatable():
    assert highs(run([P("b", "Burstable", 1, C("a", Gi, id_=1))], **ON))[pod_unit(1)] == ALLOC


def test_pod_level_limit_below_the_lever_is_left_alone_above_it_lowered():
    g = P("g", "Guaranteed", 1, C("a", 8 * Gi, 8 * Gi, id_=1))
    below = P("below", "Burstable", 2, C("a", id_=2), pod_request=Gi, pod_limit=4 * Gi)
    above = P("above", "Burstable", 3, C("a", id_=3), pod_request=Gi, pod_limit=15 * Gi)
    got = highs(run([g, below, above], memoryThrottlingFactor=None, **ON))
    # below: capped at 4Gi by its limit, under 16284 - 9216 = 7068Mi: its own (infinity with no factor)
    assert got[pod_unit(2)] == INF
    # above: 15Gi limit; lever 16284 - 8192 - 1024 = 7068Mi
    assert got[pod_unit(3)] == 7068 * Mi
    # with the factor the KEP's pod MemoryHigh of `below` (1Gi + 0.9 * 3Gi = 3.7Gi) stays; `above`
    # gets the lower of the KEP's (1Gi + 0.9 * 14Gi = 13.6Gi) and the lever's
    got = highs(run([g, below, above], **ON))
    assert got[pod_unit(2)] == highs(run([g, below, above]))[pod_unit(2)] < 4 * Gi
    assert got[pod_unit(3)] == 7068 * Mi


def test_a_kep_pod_high_already_below_the_lever_stays():
    # pod limit 15Gi, request 14Gi: KEP 14Gi + 0.9 * 1Gi = 15257.6Mi; lever alone: allocatable 16284Mi
    pod = P("b", "Burstable", 1, C("a", id_=1), pod_request=14 * Gi, pod_limit=15 * Gi)
    p = run([pod], **ON)
    assert highs(p)[pod_unit(1)] == highs(run([pod]))[pod_unit(1)] < ALLOC and p.levers == ()


def test_overhead_counts_in_the_request_and_in_the_others():
    a = P("a", "Burstable", 1, C("x", Gi, id_=1), overhead=100 * Mi)  # request 1124Mi
    b = P("b", "Burstable", 2, C("x", Gi, id_=2))
    got = run([a, b], **ON)
    assert highs(got)[pod_unit(1)] == ALLOC - Gi
    assert highs(got)[pod_unit(2)] == ALLOC - 1124 * Mi
    # a pod-level limit counts with the overhead: 15900Mi + 100Mi is not below 16284 - 1024 = 15260Mi
    c = P("c", "Burstable", 3, C("x", id_=3), pod_request=Gi, pod_limit=15900 * Mi, overhead=100 * Mi)
    assert highs(run([c, b], memoryThrottlingFactor=None, **ON))[pod_unit(3)] == ALLOC - Gi


def test_init_and_sidecar_limits_cap_like_requests():
    # every container limited: init 300Mi (before the sidecar), sidecar 50Mi + app 100Mi = 150Mi:
    # capped at 300Mi, below any lever here
    pod = P("p", "Burstable", 1, C("init", 10 * Mi, 300 * Mi, kind="init"), C("s", 10 * Mi, 50 * Mi, id_=2, kind="sidecar"),
            C("a", 10 * Mi, 100 * Mi, id_=3))
    assert run([pod], **ON).levers == ()
    # the init container unlimited: nothing caps the pod
    pod = P("p", "Burstable", 1, C("init", 10 * Mi, None, kind="init"), C("a", 10 * Mi, 100 * Mi, id_=3))
    assert highs(run([pod], **ON))[pod_unit(1)] == ALLOC


def test_a_pod_whose_request_exceeds_the_room_is_held_at_request_plus_a_page():
    g = P("g", "Guaranteed", 1, C("a", 15 * Gi, 15 * Gi, id_=1))
    b = P("b", "Burstable", 2, C("a", Gi, id_=2))  # room 16284 - 15360 = 924Mi < its 1024Mi
    p = run([g, b], **ON)
    assert highs(p)[pod_unit(2)] == Gi + 4096
    assert p.levers[0].floored and p.levers[0].describe(p.allocatable) == (
        "MemoryHigh 1Gi = its request 1Gi + a page, held there: allocatable 15.9Gi - others' requests 15Gi leaves less")
    assert [w for w in p.warnings if w.startswith("burstableHigh:")] == [
        "burstableHigh: the Guaranteed and Burstable pods request 16Gi, not less than allocatable 15.9Gi:"
        " every Burstable pod without a limit is held at its request + a page"]


def test_all_requests_above_allocatable_warns_once():
    pods = [P(f"b{n}", "Burstable", n, C("a", 6 * Gi, id_=n)) for n in (1, 2, 3)]
    p = run(pods, burstableHigh={"enabled": True, "headroom": "1Gi"})
    assert {highs(p)[pod_unit(n)] for n in (1, 2, 3)} == {6 * Gi + 4096}
    assert sum(w.startswith("burstableHigh:") for w in p.warnings) == 1
    assert "(+ headroom 1Gi)" in [w for w in p.warnings if w.startswith("burstableHigh:")][0]
    # the headroom alone can tip it: 16284Mi - 15Gi = 924Mi; headroom 924Mi leaves nothing
    pods = [P("b", "Burstable", 1, C("a", 15 * Gi, id_=1))]
    assert not [w for w in run(pods, **ON).warnings if w.startswith("burstableHigh:")]
    p = run(pods, burstableHigh={"enabled": True, "headroom": "924Mi"})
    assert [w for w in p.warnings if w.startswith("burstableHigh:")] and highs(p)[pod_unit(1)] == 15 * Gi + 4096


@pytest.mark.parametrize("alloc, others, headroom, req, page, expected", [
    (100 * Mi, 0, 0, 0, 4096, 100 * Mi),
    (100 * Mi, 10 * Mi, 1, 0, 4096, 90 * Mi - 4096),  # one byte of headroom: a page lower
    (100 * Mi + 4095, 0, 0, 0, 4096, 100 * Mi),  # down to a page
    (100 * Mi + 65535, 0, 0, 0, 65536, 100 * Mi),
    (100 * Mi, 99 * Mi, 0, Mi, 4096, Mi + 4096),  # room == request: request + a page
    (100 * Mi, 99 * Mi, 0, Mi - 1, 4096, Mi),  # room above the request by a byte: a page boundary above it
    (100 * Mi, 99 * Mi, 0, Mi + 1, 4096, Mi + 4096),  # request not on a page: the page above it
    (100 * Mi, 99 * Mi, 0, Mi + 1, 65536, Mi + 65536),
    (100 * Mi, 200 * Mi, 0, 0, 4096, 4096),  # nothing left: one page above a zero request
])
def test_burstable_high_formula(alloc, others, headroom, req, page, expected):
    assert burstable_high(alloc, others, headroom, req, page) == expected


def test_page_rounding_through_the_planner():
    # 64Ki pages; headroom 1 byte: 16284Mi - 1 rounds down to 16284Mi - 64Ki
    p = run([P("b", "Burstable", 1, C("a", Gi, id_=1))], page=65536, burstableHigh={"enabled": True, "headroom": 1})
    assert highs(p)[pod_unit(1)] == ALLOC - 65536


def test_with_the_ceiling_on_too():
    both = run(NODE, bestEffortCeiling={"enabled": True}, **ON)
    assert highs(both)[pod_unit(2)] == highs(run(NODE, **ON))[pod_unit(2)]
    # the ceiling is planned as without the lever: 16284 - 3684 - 256 = 12344Mi
    assert both.ceiling.memory_max == run(NODE, bestEffortCeiling={"enabled": True}).ceiling.memory_max == 12344 * Mi
    assert both.by_unit()["kubepods-besteffort.slice"].memory_max == 12344 * Mi


@pytest.mark.parametrize("policy", ["None", "TieredReservation", "HardReservation"])
@pytest.mark.parametrize("hierarchy", ["effective", "kubelet", "kubelet-1.36"])
def test_every_policy_and_hierarchy(policy, hierarchy):
    p = run(NODE, memoryReservationPolicy=policy, hierarchy=hierarchy, **ON)
    assert highs(p)[pod_unit(2)] == 13624 * Mi
    # protection is what it is without the lever
    off = run(NODE, memoryReservationPolicy=policy, hierarchy=hierarchy)
    assert {u: v[:2] for u, v in props(p).items()} == {u: v[:2] for u, v in props(off).items()}


def test_not_planned_when_the_kubelet_writes_the_pod_slices_memory_high():
    p = run(NODE, companion="factor", **ON)
    assert p.levers == () and highs(p) == highs(run(NODE, companion="factor"))
    assert any(w.startswith("burstableHigh: not planned: the kubelet writes the pod slices' MemoryHigh itself")
               for w in p.warnings)


def test_planned_beside_a_kubelet_that_protects_without_a_factor():
    """Issue 42: beside TieredReservation with no throttling factor (its v1.37 default) the pod
    slices' MemoryHigh is ours, and the lever with it; the protection is the kubelet's."""
    p, alone = run(NODE, companion="tiered", **ON), run(NODE, **ON)
    assert p.levers == alone.levers and highs(p)[pod_unit(2)] == highs(alone)[pod_unit(2)] < INF
    assert all("MemoryHigh" not in u.kubelet and "MemoryLow" in u.kubelet for u in p.units if u.level == "pod")


def test_turning_it_off_raises_the_pod_high_back():
    on, off = run(NODE, **ON), run(NODE)
    held = {u.unit: dict(props) for u in on.units for props in [u.properties()]}
    changes = diff(off, held, Naming.for_config(parse_config({})))
    assert [(c.unit, dict(c.props), c.direction) for c in changes] == [
        (pod_unit(2), {"MemoryHigh": INF}, "grow"), (pod_unit(3), {"MemoryHigh": INF}, "grow")]
    # and turning it on lowers them (the shrink pass)
    held = {u.unit: dict(u.properties()) for u in off.units}
    changes = diff(on, held, Naming.for_config(parse_config({})))
    assert [(c.unit, dict(c.props), c.direction) for c in changes] == [
        (pod_unit(3), {"MemoryHigh": 13112 * Mi}, "shrink"), (pod_unit(2), {"MemoryHigh": 13624 * Mi}, "shrink")]


def test_reset_takes_it_back():
    on = run(NODE, **ON)
    held = {u.unit: dict(u.properties()) for u in on.units}
    changes = {c.unit: dict(c.props) for c in reset_plan(held, Naming.for_config(parse_config({})))}
    assert changes[pod_unit(2)]["MemoryHigh"] == DEFAULTS["MemoryHigh"] == INF
    assert changes[pod_unit(3)]["MemoryHigh"] == INF


# ---- the config key ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("", BurstableHighSettings()),
    ("burstableHigh:", BurstableHighSettings()),
    ("burstableHigh: {}", BurstableHighSettings()),
    ("burstableHigh: {enabled: true}", BurstableHighSettings(True)),
    ("burstableHigh: {enabled: on, headroom: 256Mi}", BurstableHighSettings(True, Reserve(256 * Mi))),
    ("burstableHigh: {enabled: off}", BurstableHighSettings(False)),
    ("burstableHigh: on", BurstableHighSettings(True)),
    ("burstableHigh: off", BurstableHighSettings(False)),
    ("burstableHigh: {headroom: 1073741824}", BurstableHighSettings(False, Reserve(Gi))),
    # issue 43: a percentage of allocatable, as bestEffortCeiling.headroom takes
    ("burstableHigh: {enabled: true, headroom: 10%}", BurstableHighSettings(True, Reserve(fraction=Fraction(1, 10)))),
    ("burstableHigh: {enabled: true, headroom: 2.5%}", BurstableHighSettings(True, Reserve(fraction=Fraction(1, 40)))),
])
def test_config(text, expected):
    assert parse_config(yaml.safe_load(text)).burstable_high == expected


@pytest.mark.parametrize("value, message", [
    ({"enabled": "maybe"}, "config: burstableHigh.enabled: 'maybe' must be true or false"),
    ({"headroom": "lots"}, "config: burstableHigh.headroom: 'lots' is not a memory quantity"),
    ({"headroom": "-1Mi"}, "config: burstableHigh.headroom: '-1Mi' "),
    ({"minimum": "1Mi"}, "config: burstableHigh.minimum: '1Mi' is not a known key (known: enabled, headroom)"),
    (3, "config: burstableHigh: 3 must be a map (enabled, headroom), true/false, or null"),
    ("yes please", "config: burstableHigh: 'yes please' must be a map"),
])
def test_config_errors_name_field_and_value(value, message):
    with pytest.raises(ConfigError) as e:
        parse_config({"burstableHigh": value})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


# ---- how `plan` shows it -------------------------------------------------------------------------

def test_plan_table_says_how_each_pod_was_lowered_within_100_columns():
    from memqos_systemd.cli import plan_to_table
    keys = {"burstableHigh": {"enabled": True, "headroom": "100Mi"}}
    long = P("x" * 120, "Burstable", 9, C("a", Gi, id_=9), ns="n" * 60)
    p = run([*NODE, long], **keys)
    text = plan_to_table(p, parse_config(keys))
    # (the tree's rows are as wide as its longest name: `plan` fits 100 columns for ordinary names)
    at = text.splitlines().index("Burstable lever (burstableHigh) on 3 pod slice(s): none may grow into the"
                                 " others' requests")
    legend = next(i for i, line in enumerate(text.splitlines()) if line.startswith("legend:"))
    assert legend < at and max(len(line) for line in text.splitlines()[legend:]) <= 100
    assert "        a Burstable pod's MemoryHigh may be burstableHigh's: what the others' requests leave" in text
    lines = text.splitlines()
    at = lines.index("Burstable lever (burstableHigh) on 3 pod slice(s): none may grow into the others' requests")
    assert lines[at + 1:at + 3] == ["  default/b1", "      " + p.lever_of(pod_unit(2)).describe(p.allocatable)]
    # off: no word of it
    assert "burstableHigh" not in plan_to_table(run(NODE), parse_config({}))


def test_plan_table_says_when_a_pod_is_held_at_its_request():
    from memqos_systemd.cli import plan_to_table
    pods = [P("g", "Guaranteed", 1, C("a", 15 * Gi, 15 * Gi, id_=1)), P("b", "Burstable", 2, C("a", Gi, id_=2))]
    text = plan_to_table(run(pods, **ON), parse_config(ON))
    lines = text.splitlines()
    at = lines.index("  default/b")
    assert lines[at + 1:at + 3] == ["      MemoryHigh 1Gi = its request 1Gi + a page,",
                                      "      held there: allocatable 15.9Gi - others' requests 15Gi leaves less"]


def test_a_percentage_headroom_is_of_allocatable():
    p = run(NODE, burstableHigh={"enabled": True, "headroom": "10%"})
    lever = p.lever_of(pod_unit(2))
    assert lever.headroom == -(-p.allocatable // 10)
    assert p.by_unit()[pod_unit(2)].memory_high == burstable_high(p.allocatable, lever.others, lever.headroom,
                                                                  lever.request, 4096)


def test_a_headroom_past_allocatable_prints_no_false_arithmetic():
    """Issue 43: with headroom 1Ei the line said "MemoryHigh 100Mi = allocatable 14.4Gi - others'
    requests 4.81Gi - headroom 1Ei". A value held at the request says so on the line itself."""
    keys = {"burstableHigh": {"enabled": True, "headroom": "1Ei"}}
    p = run(NODE, **keys)
    assert p.levers and all(lever.floored for lever in p.levers)
    for lever in p.levers:
        first, why = lever.formula(p.allocatable)
        assert first == f"MemoryHigh {format_bytes(lever.memory_high)} = its request {format_bytes(lever.request)} + a page,"
        assert why.startswith("held there: allocatable ") and why.endswith(" - headroom 1Ei leaves less")
        assert lever.describe(p.allocatable) == f"{first} {why}"


def test_plan_json_says_how_on_the_pods_it_lowered():
    from memqos_systemd.cli import plan_to_json
    doc = plan_to_json(run(NODE, burstableHigh={"enabled": True, "headroom": "100Mi"}))
    by = {u["unit"]: u for u in doc["units"]}
    assert by[pod_unit(2)]["MemoryHigh"] == 13524 * Mi
    assert by[pod_unit(2)]["burstableHigh"] == {"othersRequestsBytes": 2660 * Mi, "headroomBytes": 100 * Mi,
                                                "requestBytes": Gi, "heldAtRequest": False}
    assert "burstableHigh" not in by[pod_unit(4)] and "burstableHigh" not in by[scope(2)]
    assert not any("burstableHigh" in u for u in plan_to_json(run(NODE))["units"])


# ---- how `status` shows it -----------------------------------------------------------------------

def _status_doc(p, keys, name="b1"):
    from memqos_systemd.burstable_lever import BurstableLever
    lever = BurstableLever()
    unit = pod_unit(2)
    pod = {"namespace": "default", "pod": name, "qosClass": "Burstable", "unit": unit, "requestBytes": Gi,
           "MemoryMin": 0, "MemoryLow": Gi, "MemoryHigh": p.by_unit()[unit].memory_high,
           "burstableHigh": lever.pod_doc(p, unit), "usageBytes": Gi // 2, "events": {"low": 0, "oom_kill": 0},
           "pressureFullAvg10": 0.0, "drift": None, "containers": []}
    return {"node": {"capacityBytes": 16 * Gi, "allocatableBytes": p.allocatable, "MemoryMin": 0, "MemoryLow": 0},
            "holding": None, "podSource": None, "drift": 0, "units": [], "pods": [pod],
            "burstableHigh": lever.status_doc(p, {}, None, parse_config(keys))}


def test_status_shows_the_lever_on_the_pods_it_lowers():
    from memqos_systemd.status_view import WIDTH, status_lines
    keys = {"burstableHigh": {"enabled": True, "headroom": "100Mi"}}
    p = run(NODE, **keys)
    doc = _status_doc(p, keys)
    assert doc["burstableHigh"] == {"enabled": True, "headroomBytes": 100 * Mi, "companion": False, "pods": 2}
    assert doc["pods"][0]["burstableHigh"] == {
        "MemoryHigh": 13524 * Mi, "othersRequestsBytes": 2660 * Mi, "headroomBytes": 100 * Mi, "heldAtRequest": False,
        "lentBytes": None, "formula": "MemoryHigh 13.21Gi = allocatable 15.9Gi - others' requests 2.6Gi - headroom 100Mi"}
    lines = status_lines(doc)
    at = lines.index("Burstable lever (burstableHigh): MemoryHigh on 2 pod slice(s), none grows into"
                     " others' requests")
    assert lines[at + 1:at + 3] == [
        "  default/b1: MemoryHigh 13.21Gi = allocatable 15.9Gi - others' requests 2.6Gi - headroom 100Mi",
        "  above it the kernel reclaims from that pod alone, then throttles it (never kills)"]
    # a long name is cut, the formula kept whole
    lines = status_lines(_status_doc(p, keys, name="x" * 200))
    assert all(len(line) <= WIDTH for line in lines)
    assert any(line.endswith("others' requests 2.6Gi - headroom 100Mi") and "xxx" in line for line in lines)
    assert any("x" * 200 in line for line in status_lines(_status_doc(p, keys, name="x" * 200), wide=True))


def test_status_says_nothing_of_it_when_off_and_why_in_companion_mode():
    from memqos_systemd.status_view import status_lines
    doc = _status_doc(run(NODE), {})
    assert doc["burstableHigh"] is None and doc["pods"][0]["burstableHigh"] is None
    assert not any("burstableHigh" in line for line in status_lines(doc))
    doc = _status_doc(run(NODE, companion="factor", **ON), ON)
    assert ("Burstable lever (burstableHigh): not planned: the kubelet writes the pods' MemoryHigh (its factor)"
            in status_lines(doc))
