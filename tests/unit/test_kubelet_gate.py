"""kubelet_gate.py: what the kubelet writes itself, from its own configuration, learned from what is
known, most reliable first; its /metrics read strictly (a table of hostile answers, issue 42)."""

import math

import pytest

from memqos_systemd.config import kubelet_file
from memqos_systemd.config_schema import KubeletFile
from memqos_systemd.kubelet_gate import (
    INFINITY, Gate, KubeletFacts, Writes, companion_mode, could_write, kubelet_facts, kubelets_write, moment_writes,
    parse_kubelet_metrics, parse_version, start_resets, who_writes_what, writes,
)

METRICS_137 = """\
# HELP kubernetes_build_info [ALPHA] A metric with a constant '1' value labeled by major, minor, git version, ...
# TYPE kubernetes_build_info gauge
kubernetes_build_info{build_date="2026-08-26T12:00:00Z",compiler="gc",git_commit="abc",git_tree_state="clean",git_version="v1.37.1",go_version="go1.25.1",major="1",minor="37",platform="linux/amd64"} 1
# HELP kubernetes_feature_enabled [BETA] This metric records the data about the stage and enablement of a k8s feature.
# TYPE kubernetes_feature_enabled gauge
kubernetes_feature_enabled{name="KubeletFineGrainedAuthz",stage=""} 1
kubernetes_feature_enabled{name="MemoryQoS",stage="BETA"} 1
kubernetes_feature_enabled{name="InPlacePodVerticalScaling",stage=""} 1
kubelet_memory_qos_node_memory_min_bytes 0
"""


def test_the_kubelets_metrics_give_its_gates_and_version():
    m = parse_kubelet_metrics(METRICS_137)
    assert m.gates["MemoryQoS"] is True and m.gates["KubeletFineGrainedAuthz"] is True
    assert m.version == "v1.37.1" and m.problems == ()
    off = parse_kubelet_metrics(METRICS_137.replace('"MemoryQoS",stage="BETA"} 1', '"MemoryQoS",stage="BETA"} 0'))
    assert off.gates["MemoryQoS"] is False


GATE = 'kubernetes_feature_enabled{name="MemoryQoS",stage="BETA"} '


# The hostile answers: every one gives a named outcome. (on, what the reason says) where `on` is the
# gate as /metrics gives it (None: not known, and the reason says why; "" for a silent None: never).
@pytest.mark.parametrize("text, on, why", [
    (GATE + "1", True, None),
    (GATE + "0", False, None),
    (GATE + "-0", False, None),
    (GATE + "1.0", True, None),
    (GATE + "1e0", True, None),  # what Go's ParseFloat reads, Prometheus with it
    (GATE + "0x1p0", True, None),
    (GATE + "1 1700000000000", True, None),  # a timestamp (milliseconds)
    (GATE + "1 -5", True, None),
    (GATE + "1\r", True, None),  # CRLF line ends
    ('kubernetes_feature_enabled{stage="BE\\"TA, name=\\"x\\"",name="MemoryQoS"} 1', True, None),  # escapes
    ('kubernetes_feature_enabled{stage="a\\\\",name="MemoryQoS"} 0', False, None),
    ('kubernetes_feature_enabled { name = "MemoryQoS" , stage="BETA", } 1', True, None),  # blanks, a trailing comma
    ('kubernetes_feature_enabled{name="MemoryQoS"}\t1', True, None),
    (GATE + "1\n" + GATE + "1", True, None),  # the same twice: agrees
    (GATE + "2", None, "is 2, neither 0 (off) nor 1 (on)"),
    (GATE + "-1", None, "is -1, neither 0 (off) nor 1 (on)"),
    (GATE + "0.5", None, "is 0.5, neither"),
    (GATE + "NaN", None, "is NaN, neither"),
    (GATE + "+Inf", None, "is +Inf, neither"),
    (GATE + "-Inf", None, "is -Inf, neither"),
    (GATE + "Inf", None, "is +Inf, neither"),
    (GATE + "1\n" + GATE + "0", None, "is given on 2 lines that disagree (1 on line 1, 0 on line 2)"),
    ('kubernetes_feature_enabled{name="MemoryQoS",stage="BETA"} 1\nkubernetes_feature_enabled{name="MemoryQoS",'
     'stage="GA"} 0', None, "disagree"),
    (GATE + "yes", None, "line 1 of kubernetes_feature_enabled is not valid Prometheus text ('yes' is not a number)"),
    (GATE + "1e400", None, "is out of a float64's range"),
    (GATE, None, "no value"),
    (GATE + "1 2 3", None, "more than a value and a timestamp"),
    (GATE + "1 1.5", None, "is not an integer of milliseconds"),
    ('kubernetes_feature_enabled{name="MemoryQoS} 1', None, "no closing quote"),
    ('kubernetes_feature_enabled{name="Memory\\QoS"} 1', None, "invalid escape"),
    ('kubernetes_feature_enabled{name="MemoryQoS",name="MemoryQoS"} 1', None, "is given twice"),
    ('kubernetes_feature_enabled{name=MemoryQoS} 1', None, "has no quoted value"),  # it could be any gate
    (GATE + "1\n" + GATE + "oops", None, "line 2 of kubernetes_feature_enabled is not valid"),
    ("", None, None),  # nothing at all: not the kubelet's metrics (ask_kubelet names it)
    ('kubernetes_feature_enabled{name="Other"} 1', None, None),  # lists no MemoryQoS: kubelet_facts names it
])
def test_a_table_of_hostile_answers(text, on, why):
    m = parse_kubelet_metrics(text)
    got, reason = m.gate("MemoryQoS")
    assert got is on
    if why is None:
        assert reason is None
    else:
        assert reason is not None and why in reason, reason
        # and kubelet_facts takes none of it, and says why (a named warning, the gate's `how`)
        facts = kubelet_facts(metrics=m)
        assert facts.gate.on is None and any(why in w for w in facts.warnings) and why in facts.gate.how


def test_lines_of_other_families_are_not_ours_to_judge():
    m = parse_kubelet_metrics("garbage {{\nfoo{a=\"1} x\n" + GATE + "1\n# HELP x \xff\n")
    assert m.gates == {"MemoryQoS": True} and m.problems == ()


def test_a_gate_absent_or_not_asked_is_said_where_it_came_from():
    facts = kubelet_facts(metrics=parse_kubelet_metrics('kubernetes_feature_enabled{name="Other"} 1'))
    assert facts.gate.on is None and "lists no MemoryQoS gate" in facts.gate.how
    facts = kubelet_facts(unasked="kubelet https://127.0.0.1:10250/metrics: HTTP 403 Forbidden")
    assert facts.gate.on is None and "HTTP 403 Forbidden" in facts.gate.how


@pytest.mark.parametrize("text, version", [("v1.37.2", (1, 37)), ("1.36", (1, 36)), ("v1.38.0-rc.1+abc", (1, 38)),
                                           ("", None), (None, None), ("latest", None)])
def test_parse_version(text, version):
    assert parse_version(text) == version


def metrics(on=None, version=None) -> object:
    lines = [f'kubernetes_build_info{{git_version="{version}"}} 1'] if version else []
    lines += [GATE + str(int(on))] if on is not None else ['kubernetes_feature_enabled{name="Other"} 1']
    return parse_kubelet_metrics("\n".join(lines))


FILE = "/var/lib/kubelet/config.yaml"


def kfile(**doc) -> KubeletFile:
    return kubelet_file(doc, FILE)


CONFIGZ = "kubelet https://127.0.0.1:10250/configz"


def configz(**doc) -> KubeletFile:
    return kubelet_file(doc, CONFIGZ)


@pytest.mark.parametrize("known, on, how", [
    # What the running kubelet reports wins over its config file, which wins over its version's default.
    ({"metrics": metrics(False, "v1.37.0"), "file": kfile(featureGates={"MemoryQoS": True})}, False,
     "the kubelet's /metrics"),
    ({"metrics": metrics(True)}, True, "the kubelet's /metrics"),
    ({"configz": configz(featureGates={"MemoryQoS": False}), "file": kfile(featureGates={"MemoryQoS": True})}, False,
     f"featureGates in {CONFIGZ}"),
    ({"metrics": metrics(None, "v1.37.0"), "file": kfile(featureGates={"MemoryQoS": False})}, False,
     f"featureGates in {FILE}"),
    ({"file": kfile(featureGates={"MemoryQoS": True}), "version": "v1.36.4"}, True, "featureGates in"),
    ({"metrics": metrics(None, "v1.37.0")}, True, "the default of kubelet v1.37.0"),  # Beta, on by default
    ({"metrics": metrics(None, "v1.36.9")}, False, "the default of kubelet v1.36.9"),
    # TieredReservation is refused by a kubelet whose gate is off: its file says the gate is on.
    ({"file": kfile(memoryReservationPolicy="TieredReservation")}, True, "which the kubelet takes only with"),
    ({}, None, "not known"),
    # After the kubelet's start its file (it has just read it) comes before its last process's answers.
    ({"metrics": metrics(True), "file": kfile(featureGates={"MemoryQoS": False}), "stale": True}, False,
     f"featureGates in {FILE}"),
    ({"metrics": metrics(True), "file": kfile(), "stale": True}, True, "/metrics (kubernetes_feature_enabled) (the"
     " kubelet's last start)"),
])
def test_the_gate_from_what_is_known(known, on, how):
    gate = kubelet_facts(**known).gate
    assert isinstance(gate, Gate) and gate.on is on and how in gate.how, gate


@pytest.mark.parametrize("known, policy, factor, said, how", [
    ({}, "None", None, False, "neither its config file (kubeletConfigFile) nor its /configz was read"),
    ({"file": kfile()}, "None", None, True, f"its default: {FILE} sets none"),
    ({"file": kfile(memoryReservationPolicy="TieredReservation", memoryThrottlingFactor=0.8)},
     "TieredReservation", 0.8, True, f"in {FILE}"),
    # /configz is the configuration it runs, defaults filled in: a factor it does not list is none.
    ({"configz": configz(memoryReservationPolicy="None"), "file": kfile(memoryReservationPolicy="TieredReservation",
                                                                          memoryThrottlingFactor=0.8)},
     "None", None, True, CONFIGZ),
    ({"configz": configz(memoryReservationPolicy="TieredReservation", memoryThrottlingFactor=0.7)},
     "TieredReservation", 0.7, True, CONFIGZ),
    ({"configz": configz(memoryReservationPolicy="TieredReservation"), "file": kfile(), "stale": True},
     "TieredReservation", None, True, CONFIGZ),  # the file says nothing: the last answer stands
    ({"configz": configz(memoryReservationPolicy="TieredReservation"), "stale": True,
      "file": kfile(memoryReservationPolicy="None")}, "None", None, True, FILE),
    ({"file": kfile(memoryReservationPolicy="Hard")}, "Hard", None, True, FILE),  # v1.38's, perhaps
    ({"metrics": metrics(True, "v1.36.1")}, "None", 0.9, False, "its default"),  # 0.9 by default before v1.37
])
def test_the_policy_and_factor_from_what_is_known(known, policy, factor, said, how):
    facts = kubelet_facts(**known)
    assert (facts.policy, facts.factor, facts.policy_said) == (policy, factor, said)
    assert how in facts.policy_how, facts


def test_a_file_of_the_wrong_shape_is_a_named_warning():
    facts = kubelet_facts(file=kfile(featureGates="MemoryQoS=true"), metrics=metrics(None, "v1.37.2"))
    assert facts.gate == Gate(True, "the default of kubelet v1.37.2")
    assert facts.warnings == (f"{FILE}: featureGates: 'MemoryQoS=true' is a string, not a map of gate: true|false (the"
                              f" kubelet refuses it): no gate is known from this file",)


T = Gate(True, "t")
PROT = frozenset({"MemoryMin", "MemoryLow"})
MIN = frozenset({"MemoryMin"})
PROT_HIGH = PROT | {"MemoryHigh"}


# What the kubelet of v1.37.2 holds as its own, by its configuration (kubelet_gate's table, from
# its source: qos_container_manager_linux.go, helpers_linux.go, node_container_manager_linux.go,
# kuberuntime_container_linux.go).
@pytest.mark.parametrize("gate, policy, factor, levels", [
    (T, "None", None, {"reserved": MIN}),  # its defaults: nothing of the pods'
    (T, "TieredReservation", None, {lv: PROT for lv in ("node", "qos", "pod", "container")} | {"reserved": MIN}),
    (T, "TieredReservation", 0.9, {"node": PROT, "qos": PROT, "pod": PROT_HIGH, "container": PROT_HIGH,
                                   "reserved": MIN}),
    (T, "None", 0.8, {"pod": frozenset({"MemoryHigh"}), "container": frozenset({"MemoryHigh"}), "reserved": MIN}),
    (T, "Hard", None, {lv: PROT for lv in ("node", "qos", "pod", "container")} | {"reserved": MIN}),  # left to it
    (Gate(False, "t"), "None", None, {}),
    (Gate(None, "t"), "None", None, {}),  # not known: every value ours
])
def test_what_the_kubelet_writes_as_its_own(gate, policy, factor, levels):
    w = writes(KubeletFacts(gate, policy, factor=factor))
    assert {lv: p for lv, p in w.levels.items() if p} == levels
    assert w.protects == ("pod" in levels and "MemoryLow" in levels["pod"])
    assert w.factor == factor and w.policy == ("TieredReservation" if policy == "Hard" else policy)


def test_an_older_kubelet_is_planned_with_its_layout():
    assert writes(KubeletFacts(T, "TieredReservation", version=(1, 36))).layout == "kubelet-1.36"
    assert writes(KubeletFacts(T, "TieredReservation", version=(1, 37))).layout == "kubelet"


@pytest.mark.parametrize("gate, policy, resets, moment", [
    (T, "None", {"node": PROT, "qos": frozenset({"MemoryLow"})}, {"MemoryMin": 0, "MemoryLow": 0}),
    (T, "TieredReservation", {}, {}),
    (Gate(False, "t"), "None", {"node": PROT, "qos": frozenset({"MemoryLow"})}, {"MemoryHigh": INFINITY}),
    (Gate(None, "t"), "None", {"node": PROT, "qos": frozenset({"MemoryLow"})}, {}),
])
def test_what_its_moments_write(gate, policy, resets, moment):
    facts = KubeletFacts(gate, policy)
    assert dict(start_resets(facts)) == resets and dict(moment_writes(facts)) == moment


WAS = {"MemoryMin": 64 << 20, "MemoryLow": 48 << 20, "MemoryHigh": 1 << 30}
DEFAULTS_137 = KubeletFacts(T, "None")
GATE_OFF = KubeletFacts(Gate(False, "t"), "None")


@pytest.mark.parametrize("level, now, facts, starting, deciding, kind", [
    # its start's reset, just after its start: the kubelet's, put back
    ("node", {"MemoryMin": 0, "MemoryLow": 0}, DEFAULTS_137, True, False, "start"),
    ("qos", {"MemoryLow": 0}, GATE_OFF, True, True, "start"),
    ("node", {"MemoryMin": 0}, DEFAULTS_137, False, False, None),  # long after its start: someone else's
    ("node", {"MemoryMin": 0}, KubeletFacts(T, "TieredReservation"), True, False, None),  # it resets nothing
    ("reserved", {"MemoryMin": 0}, DEFAULTS_137, True, False, None),
    # a container's values at its creation or resize
    ("container", {"MemoryMin": 0, "MemoryLow": 0}, DEFAULTS_137, False, False, "create"),
    ("container", {"MemoryLow": 0}, DEFAULTS_137, False, False, "create"),
    ("container", {"MemoryHigh": INFINITY}, GATE_OFF, False, False, "create"),
    ("container", {"MemoryHigh": INFINITY}, DEFAULTS_137, False, False, None),
    ("container", {"MemoryLow": 1}, DEFAULTS_137, False, False, None),
    ("pod", {"MemoryLow": 0}, DEFAULTS_137, False, False, None),
    # while its mode is decided: what it could write under another configuration is held for it
    ("node", {"MemoryMin": 128 << 20, "MemoryLow": 96 << 20}, GATE_OFF, True, True, "held"),
    ("pod", {"MemoryHigh": 2 << 30}, GATE_OFF, True, True, "held"),
    ("reserved", {"MemoryLow": 1 << 20}, GATE_OFF, True, True, None),  # it never writes that
    ("node", {"MemoryMin": 128 << 20}, GATE_OFF, True, False, None),  # decided: someone else's
])
def test_whose_write_it_is(level, now, facts, starting, deciding, kind):
    assert kubelets_write(level, WAS, {**WAS, **now}, facts, starting=starting, deciding=deciding) == kind


def test_could_write_covers_every_write_of_every_configuration():
    for gate in (T, Gate(False, "t")):
        for policy in ("None", "TieredReservation", "Hard"):
            for factor in (None, 0.9):
                w = writes(KubeletFacts(gate, policy, factor=factor))
                assert all(w.at(lv) <= could_write(lv) for lv in ("node", "qos", "pod", "container", "reserved"))


@pytest.mark.parametrize("setting, facts, companion, says", [
    ("auto", KubeletFacts(Gate(True, "its /metrics")), True, "the kubelet's own Memory QoS is on (its /metrics)"),
    ("auto", KubeletFacts(Gate(False, "its /metrics")), False, "the kubelet's own Memory QoS is off (its /metrics)"),
    ("auto", KubeletFacts(Gate(None, "not known")), False, "is not known (not known); set companion: on or off"),
    ("on", KubeletFacts(Gate(False, "its /metrics")), True, "companion: on in the config"),
    ("on", KubeletFacts(Gate(None, "not known")), True, "companion: on in the config"),
    ("off", KubeletFacts(Gate(True, "its /metrics"), "TieredReservation"), False, "companion: off in the config"),
])
def test_the_mode_follows_the_kubelet_unless_the_config_forces_it(setting, facts, companion, says):
    mode = companion_mode(setting, facts)
    assert mode.companion is companion and says in mode.why
    assert bool(mode.writes) is companion  # gate on: at least the reserved slices' MemoryMin


@pytest.mark.parametrize("facts, ours, level, says", [
    (KubeletFacts(T, "None"), "TieredReservation", "ok", "the kubelet's Memory QoS protects no pod, the service does"),
    (KubeletFacts(T, "TieredReservation"), "None", "ok", "the kubelet protects the pods"),
    (KubeletFacts(T, "None", "its default"), "None", "error",
     "nothing protects the pods: the kubelet's memoryReservationPolicy is None (its default), and this service's is"
     " None; fix one: memoryReservationPolicy: TieredReservation in the kubelet's config, then restart the kubelet"),
    (KubeletFacts(Gate(False, "t")), "None", "error", "nothing protects the pods: the kubelet's Memory QoS is not on"),
    (KubeletFacts(Gate(None, "t")), "None", "error", "nothing protects the pods: whether the kubelet's Memory QoS is"
     " on is not known, and the service writes every value, and this service's is None"),
    (KubeletFacts(Gate(False, "t")), "HardReservation", "ok", "every value the service's"),
])
def test_check_says_who_writes_what_and_fails_when_nothing_protects(facts, ours, level, says):
    got, text = who_writes_what(companion_mode("auto", facts), ours, None)
    assert got == level and says in text, text
    if level == "error":
        assert "memoryReservationPolicy: TieredReservation in /etc/memqos-systemd/config.yaml" in text


def test_writes_hold_single_units_while_deciding():
    w = writes(DEFAULTS_137).holding({"kubepods.slice": frozenset({"MemoryMin"}), "x": frozenset()})
    assert w.of("kubepods.slice", "node") == {"MemoryMin"} and w.of("kubepods-burstable.slice", "qos") == frozenset()
    assert w.of("kube.slice", "reserved") == MIN and "x" not in w.held
    assert not Writes() and not math.isnan(0.0)


# ---- writes behind our back: the journal's lines and fights (issue 29) -----------------------------
from memqos_systemd.drift import (  # noqa: E402
    FIGHT_WINDOW, FIGHT_WRITES, FOREIGN_LOG_EVERY, ForeignWrites, fight_line, foreign_write_line,
)
from memqos_systemd.kubelet_gate import likely_writer, parse_labels, who_writes  # noqa: E402
from memqos_systemd.naming import Naming  # noqa: E402

NAMING = Naming("/")
MI = 1 << 20
OURS = {"MemoryMin": 512 * MI, "MemoryLow": 256 * MI, "MemoryHigh": 2**64 - 1}


@pytest.mark.parametrize("unit, changed, writer, says", [
    ("kubepods.slice", ["MemoryMin"], "systemd", "likely the kubelet's own Memory QoS"),
    ("kubepods-burstable.slice", ["MemoryLow"], "systemd", "likely the kubelet's own Memory QoS"),
    ("kubepods-burstable.slice", ["MemoryMin"], "systemd", "another writer (systemctl set-property"),  # not its pattern
    ("kube.slice", ["MemoryMin"], "systemd", "another writer (systemctl set-property"),
    ("kubepods.slice", ["MemoryMin"], "cgroupfs", "a cgroupfs writer (systemd still holds ours"),
])
def test_likely_writer(unit, changed, writer, says):
    assert likely_writer(unit, changed, writer, NAMING).startswith(says)


def test_the_journals_line_names_the_values_where_and_who():
    line = foreign_write_line("kubepods.slice", OURS, {**OURS, "MemoryMin": 0}, "cgroupfs", NAMING)
    assert line.startswith("kubepods.slice: MemoryMin 536870912 -> 0 changed without us in its cgroup file, around"
                           " systemd: a cgroupfs writer")
    assert line.endswith("putting ours back through systemd (logged once an hour per unit and kind; memqos_foreign_writes_total"
                         " counts each time)")
    line = foreign_write_line("kubepods.slice", OURS, {**OURS, "MemoryMin": 0}, "systemd", NAMING)
    assert "changed without us through systemd: likely the kubelet's own Memory QoS" in line
    assert "companion: auto" in line


@pytest.mark.parametrize("level, writer, gate, reserved, says", [
    ("node", "systemd", True, None, "the kubelet's MemoryQoS gate (under TieredReservation it rewrites"),
    ("qos", "systemd", None, None, "the kubelet's MemoryQoS gate, if it is on"),
    ("qos", "systemd", False, None, "another writer through systemd"),
    ("qos", "systemd", False, True, "the kubelet's QOSReserved"),
    ("qos", "systemd", True, True, "the kubelet's MemoryQoS gate (under"),  # then " or the kubelet's QOSReserved"
    ("pod", "systemd", True, None, "another writer through systemd"),  # the gate writes no pod slice after its start
    ("pod", "cgroupfs", True, None, "a cgroupfs writer"),
    ("node", "cgroupfs", True, True, "a cgroupfs writer"),
])
def test_who_writes_as_check_can_tell(level, writer, gate, reserved, says):
    assert who_writes(level, writer, gate, reserved).startswith(says)


def test_each_write_is_counted_but_a_unit_is_logged_once_an_hour():
    w = ForeignWrites()
    logged = [w.seen("kubepods.slice", "node", "systemd", OURS, {**OURS, "MemoryMin": 0}, t)[0]
              for t in (0.0, 60.0, 120.0, FOREIGN_LOG_EVERY - 1, FOREIGN_LOG_EVERY + 1)]
    assert logged == [True, False, False, False, True]
    assert w.seen("kube.slice", "reserved", "systemd", OURS, OURS, 130.0)[0]  # another unit: its own hour
    assert w.seen("kubepods.slice", "node", "cgroupfs", OURS, OURS, 140.0)[0]  # another kind of writer: its own


def test_more_than_fight_writes_in_the_window_is_a_fight_said_once():
    """A writer every 10 s: a fight at its (FIGHT_WRITES + 1)-th write, said once; every later write
    counts into it; it is over once FIGHT_WINDOW passes without one."""
    w = ForeignWrites()
    began = [w.seen("kubepods.slice", "node", "cgroupfs", OURS, {**OURS, "MemoryMin": 0}, 10.0 * i)[1]
             for i in range(FIGHT_WRITES + 3)]
    assert [b is not None for b in began] == [False] * FIGHT_WRITES + [True, False, False]
    fight = w.fights["kubepods.slice"]
    assert (fight.writes, fight.since, fight.last, fight.writers) == (FIGHT_WRITES + 3, 0.0, 50.0, {"cgroupfs"})
    assert fight.changed == ("MemoryMin",)
    w.seen("kubepods.slice", "node", "systemd", OURS, {**OURS, "MemoryMin": 0}, 55.0)  # the D-Bus half
    assert w.fights["kubepods.slice"].writers == {"cgroupfs", "systemd"}
    w.seen("kube.slice", "reserved", "systemd", OURS, OURS, 55.0 + FIGHT_WINDOW)  # the window passed
    assert "kubepods.slice" not in w.fights


def test_writes_spread_wider_than_the_window_are_no_fight():
    w = ForeignWrites()
    gap = FIGHT_WINDOW / FIGHT_WRITES + 1  # a person, now and then
    assert all(w.seen("kubepods.slice", "node", "systemd", OURS, OURS, gap * i)[1] is None for i in range(20))
    assert w.fights == {}


def test_the_fight_line():
    w = ForeignWrites()
    for i in range(FIGHT_WRITES + 1):
        _, began = w.seen("kubepods-burstable.slice", "qos", "systemd", OURS, {**OURS, "MemoryLow": 0}, 60.0 * i)
    line = fight_line(began, NAMING)
    assert line.startswith(f"kubepods-burstable.slice: written behind our back {FIGHT_WRITES + 1} times in"
                           f" {60 * FIGHT_WRITES} s (through systemd): likely the kubelet's own Memory QoS")
    assert "two writers are fighting: memqos-systemd keeps putting its values back every time" in line


def test_parse_labels():
    assert parse_labels('level="node",writer="cgroupfs"') == {"level": "node", "writer": "cgroupfs"}
    assert parse_labels('a="x\\"y"') == {"a": 'x"y'}  # unescaped, as Prometheus reads it
    assert parse_labels('a=1') == {}


@pytest.mark.parametrize("known, on, how", [
    # The gate: /metrics, else the config file, else off (alpha); the memory reserve: the config file.
    ({"reported": True, "memory": "100%", "config_file": "/k.yaml"}, True,
     "its QOSReserved gate from the kubelet's /metrics; qosReserved.memory 100% in /k.yaml"),
    ({"reported": False, "configured": True, "memory": "100%", "config_file": "/k.yaml"}, False, "/metrics"),
    ({"configured": True, "memory": "50%", "config_file": "/k.yaml"}, True, "gate in /k.yaml; qosReserved.memory 50%"),
    ({"configured": True, "config_file": "/k.yaml"}, False, "but no qosReserved.memory in /k.yaml"),
    ({"reported": True}, None, "set kubeletConfigFile"),  # on, reserve not known
    ({"memory": "100%", "config_file": "/k.yaml"}, False, "alpha, off by default"),
    ({}, False, "alpha, off by default"),
])
def test_qos_reserved_from_what_is_known(known, on, how):
    from memqos_systemd.kubelet_gate import qos_reserved
    gate = qos_reserved(**known)
    assert gate.on is on and how in gate.how, gate


def test_qos_reserved_gate_in_the_metrics():
    m = parse_kubelet_metrics('kubernetes_feature_enabled{name="QOSReserved",stage="ALPHA"} 1\n')
    assert m.gates == {"QOSReserved": True}
