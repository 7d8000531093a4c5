"""What the kubelet writes itself, from its own configuration; who writes our units behind our back.
Pure.

**What the kubelet writes is a function of its configuration** (`writes`, table-tested): its
`MemoryQoS` gate, its `memoryReservationPolicy`, its `memoryThrottlingFactor` and the defaults of
its version. Read from kubelet v1.37.2 (pkg/kubelet/cm: qos_container_manager_linux.go,
helpers_linux.go, pod_container_manager_linux.go, node_container_manager_linux.go;
pkg/kubelet/kuberuntime/kuberuntime_container_linux.go; docs/DESIGN.md, "Companion mode"):

| its configuration | what it holds as its own | what it writes at a moment, and we put back |
|---|---|---|
| gate on, TieredReservation | MemoryMin, MemoryLow of kubepods.slice, the QoS slices (every minute), the pod slices and container scopes (at creation and resize); a reserved slice's MemoryMin | at its start the same zeros as under None (measured): its own properties there, so its own values are put back until its first round counts the pods (companion.Companion.bridge; docs/DESIGN.md, "Handing over") |
| gate on, None (its v1.37 default) | a reserved slice's MemoryMin | at its start: kubepods.slice MemoryMin and MemoryLow, the Burstable slice's MemoryLow to 0; at a container's creation and resize: its MemoryMin and MemoryLow to 0 |
| gate on, a policy this version does not know (v1.38 may add Hard, Soft) | as TieredReservation: left to it | - |
| with a throttling factor (nil by default from v1.37) | also MemoryHigh of the pod slices (pod-level limits) and container scopes | - |
| gate off | nothing | at its start the same zeros as under None; at a container's creation and resize, its MemoryHigh to max |

Everything it does not hold is the service's, planned by our own policy (plan.py). Every minute at
its defaults it writes no memory value at all ("to avoid unnecessary systemd SetUnitProperties
calls", its QoS manager's UpdateCgroups).

**How we learn its configuration** (`kubelet_facts`), most reliable first, without spawning anything:
1. **The running kubelet says so.** Its `/metrics` (the same port and credentials as `/pods`, RBAC
   `nodes/metrics` get): `kubernetes_feature_enabled{name="MemoryQoS"}` 1 or 0, the gate as it
   resolved it, defaults included, and `kubernetes_build_info{git_version}`; read strictly
   (`parse_kubelet_metrics`: any other value, conflicting lines or a line that is not valid
   Prometheus text say "not known", and why). Its `/configz` (RBAC `nodes/configz` get): the
   configuration it runs, defaults filled in: memoryReservationPolicy, memoryThrottlingFactor and
   the feature gates set.
2. **Its config file** (`kubeletConfigFile`), which it reads as it starts: read again at each
   start of the kubelet (and at ours). A key of the wrong type is a named warning
   (config.kubelet_file), never "unset".
3. **Its version's defaults**: the gate on from v1.37; policy None; no factor from v1.37 (0.9 before).
At a kubelet's start what its last process said is stale: its config file, read again then, comes
first until the new process answers.

The same goes for the kubelet's **QOSReserved** (`qos_reserved`): with that alpha gate on (off by
default) and `qosReserved: {memory: N%}` in its config, the kubelet sets MemoryMax on
kubepods-burstable.slice and kubepods-besteffort.slice itself every minute (its QoS manager's
setMemoryReserve), the very MemoryMax the plan may set on the BestEffort QoS slice (plan.py).

**Its moments** (`kubelets_write`): a write found just after the kubelet's start (its reset), or a
container's values at its creation or resize, is the kubelet's and not a fight: counted apart and
put back when ours. While the mode is being decided after its start (its port answers seconds
later), a write it could make under another configuration is held for it, never taken back.

A write found behind our back otherwise (drift.judge) is one of two kinds (drift.WRITERS): through
systemd (another agent, `systemctl set-property`, libcontainer's `SetUnitProperties`), or to the
cgroup file alone (`cgroupfs`: koordlet, libcontainer's file write after its D-Bus call, a
person's `echo`). Either way ours is put back through systemd. Who most likely wrote it is said
here (`likely_writer`, `who_writes`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping

from . import promtext
from .config_schema import KubeletFile
from .naming import Naming

__all__ = ["Gate", "DEFAULT_ON_FROM", "KubeletMetrics", "parse_kubelet_metrics", "parse_version", "parse_labels",
           "KubeletFacts", "kubelet_facts", "Writes", "writes", "start_resets", "moment_writes", "could_write",
           "kubelets_write", "Mode", "companion_mode", "KNOWN_POLICIES", "qos_reserved", "likely_writer",
           "GATE_FIX", "who_writes", "written_how", "INFINITY", "who_writes_what", "properties_where", "ours",
           "protects", "POLICY_FIX"]

DEFAULT_ON_FROM = (1, 37)  # the MemoryQoS gate: Beta and on by default from v1.37
FACTOR_NIL_FROM = (1, 37)  # memoryThrottlingFactor: nil by default from v1.37 (0.9 before)
KNOWN_POLICIES = ("None", "TieredReservation")  # what a v1.37 kubelet's validation takes
INFINITY = 2**64 - 1  # systemd's infinity (plan.INFINITY)
_FEATURE = "kubernetes_feature_enabled"
_BUILD = "kubernetes_build_info"
_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?")
_UPPER = ("node", "qos", "pod", "container")  # the kubepods tree
_PROTECTION = frozenset({"MemoryMin", "MemoryLow"})
_HIGH = frozenset({"MemoryHigh"})
_EMPTY: Mapping = MappingProxyType({})


@dataclass(frozen=True)
class Gate:
    on: bool | None  # None: not known
    how: str  # where that came from, for people


def parse_version(text: str | None) -> tuple[int, int] | None:
    """"v1.37.2" (or "1.37", "v1.37.0-rc.1+abc") -> (1, 37); None for anything else."""
    m = _VERSION.match(text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def parse_labels(text: str) -> dict[str, str]:
    """The labels of one sample in the Prometheus text format (`a="1",b="x"`) -> {"a": "1", "b": "x"},
    unescaped as Prometheus does; {} when they do not parse."""
    try:
        return dict(promtext.parse_line(f"x{{{text}}} 0").labels)
    except promtext.BadLine:
        return {}


# ---- what the kubelet says of itself: /metrics ------------------------------------------------------
@dataclass(frozen=True)
class KubeletMetrics:
    """What the kubelet's /metrics says of itself, read strictly (`parse_kubelet_metrics`)."""

    gates: Mapping[str, bool] = field(default_factory=lambda: _EMPTY)  # the gates it reports as 1 (on) or 0 (off)
    unknown: Mapping[str, str] = field(default_factory=lambda: _EMPTY)  # gate -> why what it reports is not known
    version: str | None = None  # kubernetes_build_info{git_version}
    problems: tuple[str, ...] = ()  # lines of those families that are not valid Prometheus text

    def gate(self, name: str) -> tuple[bool | None, str | None]:
        """(whether the kubelet reports `name` on; None: not known), and why not when not known."""
        if name in self.gates:
            return self.gates[name], None
        return None, self.unknown.get(name)


def _shown_value(value: float) -> str:
    return "NaN" if math.isnan(value) else "+Inf" if value == math.inf else "-Inf" if value == -math.inf else f"{value:g}"


def parse_kubelet_metrics(text: str) -> KubeletMetrics:
    """The feature gates and the git version out of the kubelet's /metrics text, parsed as
    Prometheus parses it (promtext: NaN, ±Inf, timestamps, escaped labels). A gate is known only
    from lines that agree and say 1 or 0: any other value (2, -1, 0.5, NaN), two lines that
    disagree, or a line naming it that is not valid text make it not known, and `unknown` says why.
    Lines of other families are not ours to judge."""
    parsed = promtext.samples(text, (_FEATURE, _BUILD))
    seen: dict[str, list[promtext.Sample]] = {}
    version = None
    for s in parsed.samples:
        if s.name == _BUILD:
            version = version or s.labels.get("git_version") or None
        elif "name" in s.labels:
            seen.setdefault(s.labels["name"], []).append(s)
    gates, unknown = {}, {}
    for name, lines in seen.items():
        values = {_shown_value(s.value) for s in lines}
        if len(values) > 1:
            unknown[name] = (f"{_FEATURE}{{name={name!r}}} is given on {len(lines)} lines that disagree ("
                             + ", ".join(f"{_shown_value(s.value)} on line {s.line}" for s in lines) + ")")
        elif lines[0].value in (0.0, 1.0):
            gates[name] = lines[0].value == 1.0
        else:
            unknown[name] = f"{_FEATURE}{{name={name!r}}} is {values.pop()}, neither 0 (off) nor 1 (on)"
    for number, line, why in parsed.bad:
        if not line.startswith(_FEATURE):
            continue
        # The gates it seems to name (as written, and without its backslashes: an escape it got
        # wrong), else any of them.
        named = re.findall(r'(?<![A-Za-z0-9_])name\s*=\s*"((?:[^"\\]|\\.)*)"', line)
        for key in {k for name in named for k in (name, name.replace("\\", ""))} or {"*"}:
            if key not in unknown:
                gates.pop(key, None)
                unknown[key] = f"line {number} of {_FEATURE} is not valid Prometheus text ({why})"
    if "*" in unknown:  # a line that names no gate we can read: it could be any of them
        why = unknown.pop("*")
        for name in list(gates):
            unknown[name] = why
        gates = {}
        unknown.setdefault("MemoryQoS", why)
    return KubeletMetrics(MappingProxyType(gates), MappingProxyType(unknown), version, parsed.problems)


# ---- what the kubelet's configuration is, as far as known -----------------------------------------
@dataclass(frozen=True)
class KubeletFacts:
    """The kubelet's configuration as far as it decides what it writes, each value with where it
    came from (for people)."""

    gate: Gate  # MemoryQoS (on None: not known)
    policy: str = "None"  # memoryReservationPolicy in force (its default when nothing says)
    policy_how: str = "the kubelet's default"
    factor: float | None = None  # memoryThrottlingFactor in force; None: none (no memory.high)
    factor_how: str = "the kubelet's default"
    version: tuple[int, int] | None = None
    policy_said: bool = False  # policy from its configuration (file or /configz), not from a default
    warnings: tuple[str, ...] = ()  # what was read and could not be taken (one line each)

    @property
    def policy_known(self) -> bool:
        return self.policy in KNOWN_POLICIES

    def describe(self) -> str:
        """"MemoryQoS on (how), memoryReservationPolicy None (how), no memoryThrottlingFactor (how)"."""
        gate = {True: "on", False: "off", None: "not known"}[self.gate.on]
        factor = "no memoryThrottlingFactor" if self.factor is None else f"memoryThrottlingFactor {self.factor:g}"
        return (f"MemoryQoS {gate} ({self.gate.how}), memoryReservationPolicy {self.policy} ({self.policy_how}),"
                f" {factor} ({self.factor_how})")


def kubelet_facts(*, metrics: KubeletMetrics | None = None, metrics_how: str = "the kubelet's /metrics",
                  configz: KubeletFile | None = None, file: KubeletFile | None = None, stale: bool = False,
                  unasked: str | None = None, version: str | None = None) -> KubeletFacts:
    """The kubelet's configuration from what is known (see the module's docstring): what the
    running kubelet answered (`metrics`, `configz`), its config file (`file`), its version's
    defaults. `stale`: the answers are those of the kubelet's last process (it has restarted since):
    its config file, which it has just read, comes before them. `unasked`: why the running kubelet
    was not asked, or did not answer (for people). `version`: the kubelet's, when known otherwise."""
    version = (metrics.version if metrics is not None and metrics.version else None) or version
    parsed_version = parse_version(version)
    warnings = [*(file.problems if file else ()), *(configz.problems if configz else ())]
    notes = []  # why a more reliable source did not say, for the `how` of a less reliable one
    reported, why_not = metrics.gate("MemoryQoS") if metrics is not None else (None, None)
    if why_not:
        warnings.append(f"{metrics_how}: {why_not}: not taken")
        notes.append(f"{metrics_how}: {why_not}")
    elif metrics is not None and reported is None:
        notes.append(f"{metrics_how} lists no MemoryQoS gate")
    elif metrics is None and unasked:
        notes.append(unasked)
    answers = [(reported, f"{metrics_how} (kubernetes_feature_enabled)"),
               (configz.gate("MemoryQoS") if configz else None, f"featureGates in {configz.source}" if configz else "")]
    said = [(file.gate("MemoryQoS") if file else None, f"featureGates in {file.source}" if file else "")]
    ordered = said + answers if stale else answers + said
    gate = next((Gate(on, how + (" (the kubelet's last start)" if stale and (on, how) in answers else ""))
                 for on, how in ordered if on is not None), None)
    tiered = next((f for f in (configz, file) if f is not None and f.policy == "TieredReservation"), None)
    if gate is None and tiered is not None:
        # Its validation refuses TieredReservation unless the gate is on: a kubelet that runs it has it on.
        gate = Gate(True, f"memoryReservationPolicy TieredReservation in {tiered.source}, which the kubelet takes"
                          f" only with its MemoryQoS gate on")
    if gate is None:
        if parsed_version is not None:
            gate = Gate(parsed_version >= DEFAULT_ON_FROM, f"the default of kubelet {version}")
        else:
            gate = Gate(None, "not known: " + "; ".join(notes or ["nothing says"])
                        + (f", and {file.source} sets no MemoryQoS gate" if file is not None
                           else ", and no config file of its is read (kubeletConfigFile)"))
    # memoryReservationPolicy and memoryThrottlingFactor: /configz (its config with defaults filled
    # in: a factor it does not list is none), else the config file, else the defaults.
    fresh_z, file_z = (None, configz) if stale else (configz, None)
    if fresh_z is not None:
        policy, policy_how, policy_said = fresh_z.policy or "None", f"{fresh_z.source}", True
        factor, factor_how = fresh_z.factor, f"{fresh_z.source}"
    else:
        source = next((f for f in (file, file_z) if f is not None and f.policy is not None), None)
        # A config file read that sets none says its default (the policy has no command-line flag).
        policy, policy_how, policy_said = (source.policy, f"in {source.source}", True) if source else (
            "None", f"its default: {file.source} sets none" if file else
            "its default, taken as in force: neither its config file (kubeletConfigFile) nor its /configz was read",
            file is not None)
        source = next((f for f in (file, file_z) if f is not None and f.factor is not None), None)
        if source is not None:
            factor, factor_how = source.factor, f"in {source.source}"
        elif parsed_version is not None and parsed_version < FACTOR_NIL_FROM:
            factor, factor_how = 0.9, f"the default of kubelet {version}"
        else:
            factor, factor_how = None, "its default from v1.37"
    return KubeletFacts(gate, policy, policy_how, factor, factor_how, parsed_version, policy_said, tuple(warnings))


# ---- what it writes ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Writes:
    """What the kubelet writes as its own, as its configuration makes it (`writes`): by level, and on
    single units while its mode is being decided (`held`: a write of its found then, never taken
    back). `policy`, `factor` and `layout` are those it computes its values with (plan.py shows
    them as its own, never sends them)."""

    levels: Mapping[str, frozenset[str]] = field(default_factory=lambda: _EMPTY)
    policy: str = "None"
    factor: float | None = None
    layout: str = "kubelet"  # plan's hierarchy for its values: "kubelet" (v1.37) or "kubelet-1.36"
    held: Mapping[str, frozenset[str]] = field(default_factory=lambda: _EMPTY)

    def at(self, level: str) -> frozenset[str]:
        """The properties it writes on every unit of `level`."""
        return self.levels.get(level, frozenset())

    def of(self, unit: str, level: str) -> frozenset[str]:
        """The properties of `unit` (of `level`) that are the kubelet's now."""
        mine = self.levels.get(level, frozenset())
        return mine | self.held[unit] if unit in self.held else mine

    def __bool__(self) -> bool:
        return any(self.levels.values()) or bool(self.held)

    @property
    def protects(self) -> bool:
        """It writes the pods' protection (MemoryMin and MemoryLow of the kubepods tree)."""
        return bool(self.at("pod") & _PROTECTION)

    def holding(self, held: Mapping[str, frozenset[str]]) -> Writes:
        return replace(self, held=MappingProxyType({u: frozenset(p) for u, p in held.items() if p}))

    def without(self, levels: frozenset[str]) -> Writes:
        """The same, with nothing of its at `levels` (bridged: its values written there by us)."""
        return replace(self, levels=MappingProxyType({lv: p for lv, p in self.levels.items() if lv not in levels}))


def writes(facts: KubeletFacts) -> Writes:
    """What the kubelet of `facts` holds as its own (the table in the module's docstring)."""
    if not facts.gate.on:
        return Writes()
    levels = {"reserved": frozenset({"MemoryMin"})}
    if facts.policy != "None":  # TieredReservation, or a policy we do not know: left to it
        for level in _UPPER:
            levels[level] = _PROTECTION
    if facts.factor is not None:
        for level in ("pod", "container"):
            levels[level] = levels.get(level, frozenset()) | _HIGH
    layout = "kubelet-1.36" if facts.version is not None and facts.version < DEFAULT_ON_FROM else "kubelet"
    return Writes(MappingProxyType(levels), facts.policy if facts.policy_known else "TieredReservation",
                  facts.factor, layout)


def start_resets(facts: KubeletFacts) -> Mapping[str, frozenset[str]]:
    """What the kubelet's start sets to 0 over values of ours, by level: with its gate off or a
    policy other than TieredReservation, kubepods.slice MemoryMin and MemoryLow and the Burstable
    slice's MemoryLow (its QoS manager's Start; with the gate off its node-allocatable enforcement
    too). Under TieredReservation its start sets the same zeros (e2e 59-real-kubelet-beside), but
    on properties that are its own then: bridged with its own values (companion.Companion.bridge),
    not here. A start that does not know the gate is taken to reset (the safe side: ours goes back
    at once)."""
    if facts.gate.on and facts.policy == "TieredReservation":
        return _EMPTY
    return MappingProxyType({"node": _PROTECTION, "qos": frozenset({"MemoryLow"})})


def moment_writes(facts: KubeletFacts) -> Mapping[str, int]:
    """What the kubelet writes to a container scope at its creation and at each resize (through the
    runtime's CRI Unified map) that is not a value it holds: with its gate on and a policy other
    than TieredReservation an explicit memory.min 0 and memory.low 0; with the gate off memory.high
    max."""
    if facts.gate.on is None:
        return _EMPTY
    if not facts.gate.on:
        return MappingProxyType({"MemoryHigh": INFINITY})
    if facts.policy == "None":
        return MappingProxyType({"MemoryMin": 0, "MemoryLow": 0})
    return _EMPTY


def could_write(level: str) -> frozenset[str]:
    """What a kubelet writes on a unit of `level` under some configuration (a write found while its
    mode is being decided may be any of these)."""
    return {"node": _PROTECTION, "qos": _PROTECTION, "pod": _PROTECTION | _HIGH, "container": _PROTECTION | _HIGH,
            "reserved": frozenset({"MemoryMin"})}.get(level, frozenset())


def kubelets_write(level: str, before: Mapping[str, int], now: Mapping[str, int], facts: KubeletFacts, *,
                   starting: bool, deciding: bool) -> str | None:
    """Whether a write found on a unit of `level` (what it held: `before`, holds: `now`) is the
    kubelet's at one of its moments, and which:
    * "start": `starting` (just after its start) and what its start resets (start_resets) set to 0;
    * "create": a container's values as the kubelet writes them at its creation and resize
      (moment_writes);
    * "held": `deciding` (its mode is being decided after its start) and only what it could write
      under another configuration (could_write): left to it until its configuration is known;
    * None: someone else's (a foreign write; the kubelet's fights with `companion: off` among them).
    The first two are put back when ours, counted apart from the foreign writes, never a fight."""
    changed = {p: v for p, v in now.items() if before.get(p) != v}
    if not changed:
        return None
    resets = start_resets(facts).get(level, frozenset())
    if starting and changed.keys() <= resets and not any(changed.values()):
        return "start"
    moment = moment_writes(facts) if level == "container" else _EMPTY
    if moment and changed.keys() <= moment.keys() and all(moment[p] == v for p, v in changed.items()):
        return "create"
    if deciding and changed.keys() <= could_write(level):
        return "held"
    return None


# ---- the mode ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Mode:
    """Beside the kubelet's own Memory QoS (`companion`: its gate on, or `companion: on`) or not,
    why (for people), and what it writes as its own then (`writes`; empty: every value ours)."""

    companion: bool
    why: str
    writes: Writes = field(default_factory=Writes)
    facts: KubeletFacts | None = None

    @property
    def name(self) -> str:
        """The mode in a few words (status, check, the journal)."""
        if not self.companion:
            return "every value the service's"
        if self.writes.protects:
            return "companion: the kubelet protects the pods"
        return "companion: the kubelet's Memory QoS protects no pod, the service does"


def companion_mode(setting: str, facts: KubeletFacts) -> Mode:
    """The mode from the `companion:` setting ("auto", "on", "off") and the kubelet's
    configuration. "auto" follows its gate; a gate not known owns every value (as a node whose
    kubelet has no Memory QoS: a protection nobody writes is worse than a fight, which is counted
    and shown). "on" takes the gate as on, with the policy and factor known."""
    if setting == "off":
        return Mode(False, "companion: off in the config", Writes(), facts)
    if setting == "on":
        forced = replace(facts, gate=Gate(True, "companion: on in the config"))
        return Mode(True, "companion: on in the config", writes(forced), forced)
    if facts.gate.on:
        return Mode(True, f"the kubelet's own Memory QoS is on ({facts.gate.how})", writes(facts), facts)
    if facts.gate.on is False:
        return Mode(False, f"the kubelet's own Memory QoS is off ({facts.gate.how})", Writes(), facts)
    return Mode(False, f"whether the kubelet's own Memory QoS is on is not known ({facts.gate.how}); set companion:"
                       f" on or off to say", Writes(), facts)


# ---- who writes what, for people ------------------------------------------------------------------
LEVELS = ("node", "qos", "pod", "container", "reserved")
PROPERTIES = ("MemoryMin", "MemoryLow", "MemoryHigh")
_WHERE = {"node": "kubepods.slice", "qos": "the QoS slices", "pod": "the pod slices", "container": "the containers",
          "reserved": "the reserved slices"}
POLICY_FIX = "memoryReservationPolicy: TieredReservation"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def properties_where(levels: Mapping[str, frozenset[str]]) -> str:
    """"MemoryMin and MemoryLow of kubepods.slice and the pod slices; MemoryHigh of the containers":
    properties by level, grouped, for people; "" when none."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for level in LEVELS:
        props = tuple(p for p in PROPERTIES if p in levels.get(level, frozenset()))
        if props:
            groups.setdefault(props, []).append(_WHERE[level])
    return "; ".join(f"{_and(list(props))} of {_and(where)}" for props, where in groups.items())


def ours(writes: Writes) -> dict[str, frozenset[str]]:
    """What the service writes, by level: every property the kubelet does not write as its own."""
    return {level: frozenset(PROPERTIES) - writes.at(level) for level in LEVELS}


def protects(mode: Mode, policy: str) -> bool:
    """Whether anyone protects the pods: the kubelet (its MemoryMin and MemoryLow), or the service with
    a policy other than None where the kubelet does not."""
    return mode.writes.protects or ("MemoryLow" in ours(mode.writes)["pod"] and policy != "None")


def who_writes_what(mode: Mode, policy: str, factor: float | None, adds: tuple[str, ...] = ()) -> tuple[str, str]:
    """check's line on who writes what, (level, text): an error when nothing protects the pods, with
    the two fixes (the kubelet's memoryReservationPolicy: TieredReservation, or the service's)."""
    theirs = properties_where(mode.writes.levels)
    mine = ours(mode.writes)
    parts = []
    if "MemoryLow" in mine["pod"]:
        parts.append(f"the pods' MemoryMin and MemoryLow by its memoryReservationPolicy {policy}")
    if "MemoryHigh" in mine["container"]:
        parts.append(f"MemoryHigh by its memoryThrottlingFactor {factor:g}" if factor is not None
                     else "no MemoryHigh (its memoryThrottlingFactor is null)")
    text = (f"{mode.name} ({mode.why}): " + (f"the kubelet writes {theirs}" if theirs else "the kubelet writes none")
            + f"; memqos-systemd writes the rest: {_and(parts)}" if parts else "")
    text = text or f"{mode.name} ({mode.why}): the kubelet writes {theirs}"
    if adds:
        text += f", and adds {_and(list(adds))}"
    facts = mode.facts
    if facts is not None and facts.gate.on is not None:
        resets = start_resets(facts).get("node", frozenset()) & mine["node"]
        moment = {p: v for p, v in moment_writes(facts).items() if p in mine["container"]}
        said = (["its start sets kubepods.slice's MemoryMin and MemoryLow and the Burstable slice's MemoryLow to 0"]
                if resets else [])
        said += [f"a container's creation or resize sets its {_and(sorted(moment, reverse=True))} to"
                 f" {'max' if any(moment.values()) else '0'}"] if moment else []
        if said:
            text += f"; the kubelet's own moments, each put back at once and counted apart: {'; '.join(said)}"
    if protects(mode, policy):
        return "ok", text
    who = (f"the kubelet's memoryReservationPolicy is {facts.policy} ({facts.policy_how})"
           if facts is not None and mode.companion else
           "whether the kubelet's Memory QoS is on is not known, and the service writes every value"
           if facts is not None and facts.gate.on is None else "the kubelet's Memory QoS is not on")
    return "error", (f"nothing protects the pods: {who}, and this service's is {policy}; fix one: {POLICY_FIX} in the"
                     f" kubelet's config, then restart the kubelet (it then writes them itself), or {POLICY_FIX} in"
                     f" /etc/memqos-systemd/config.yaml, then systemctl reload memqos-systemd; {text}")


# ---- writes behind our back -------------------------------------------------------------------------
GATE_FIX = ("leave its values to it: companion: auto (the default) or on in /etc/memqos-systemd/config.yaml, then"
            " systemctl reload memqos-systemd (the service then writes none of them, and keeps its own)")
_CGROUPFS_WRITER = ("a cgroupfs writer (systemd still holds ours; something wrote the cgroup file around it: an"
                    " agent that writes cgroupfs for its own Memory QoS such as koordlet, a runtime's file write"
                    " after its D-Bus call, a person)")


def likely_writer(unit: str, changed: tuple[str, ...] | list[str], writer: str, naming: Naming) -> str:
    """Who most likely wrote `changed` of `unit`, for people: the kubelet's own Memory QoS (with the
    fix) when it is its pattern (kubepods.slice MemoryMin, kubepods-burstable.slice MemoryLow,
    through systemd), a cgroupfs writer, or another writer through systemd."""
    if writer == "cgroupfs":
        return _CGROUPFS_WRITER
    kubelets = {naming.node_slice(): "MemoryMin", naming.qos_slice("Burstable"): "MemoryLow"}
    if kubelets.get(unit) in changed:
        return ("likely the kubelet's own Memory QoS (with its MemoryQoS gate on, on by default from v1.37, and"
                " memoryReservationPolicy: TieredReservation it rewrites kubepods.slice MemoryMin and"
                f" kubepods-burstable.slice MemoryLow every minute); the fix: {GATE_FIX}")
    return "another writer (systemctl set-property, another agent)"


def who_writes(level: str, writer: str, gate_on: bool | None, qos_reserved: bool | None = None) -> str:
    """Who most likely writes units of `level` behind our back, as `check` can tell from the kind of
    writer (`writer`), whether the kubelet's MemoryQoS gate is on (`gate_on`, None: not known) and
    whether its QOSReserved is (`qos_reserved`)."""
    if writer == "cgroupfs":
        return _CGROUPFS_WRITER
    named = []
    if level in ("node", "qos") and gate_on is not False:
        named.append(("the kubelet's MemoryQoS gate" if gate_on else "the kubelet's MemoryQoS gate, if it is on")
                     + f" (under TieredReservation it rewrites kubepods.slice and kubepods-burstable.slice every"
                       f" minute; fix: {GATE_FIX})")
    if level == "qos" and qos_reserved:
        named.append("the kubelet's QOSReserved (it rewrites the QoS slices' memory limits every minute)")
    return " or ".join(named) or "another writer through systemd (systemctl set-property, another agent)"


def qos_reserved(*, reported: bool | None = None, configured: bool | None = None, memory: str | None = None,
                 config_file: str | None = None) -> Gate:
    """Whether the kubelet caps the QoS slices' MemoryMax itself: its QOSReserved gate (`reported`
    by its /metrics, else `configured` in its config file, else off: alpha, off by default) and
    qosReserved.memory (`memory`, from its config file). `on` is None when the gate is on and the
    reserve is not known (no kubelet config file read)."""
    if reported is not None:
        gate, how = reported, "its QOSReserved gate from the kubelet's /metrics"
    elif configured is not None:
        gate, how = configured, f"its QOSReserved gate in {config_file or 'the kubelet config'}"
    else:
        gate, how = False, "its QOSReserved gate: alpha, off by default, and not turned on in what we can read"
    if not gate:
        return Gate(False, how)
    if memory is not None:
        return Gate(True, f"{how}; qosReserved.memory {memory} in {config_file or 'the kubelet config'}")
    if config_file is not None:
        return Gate(False, f"{how}, but no qosReserved.memory in {config_file}")
    return Gate(None, f"{how}; whether qosReserved sets memory is in the kubelet's config file, which is not read"
                      f" (set kubeletConfigFile)")


def written_how(writers) -> str:
    """How someone wrote behind our back: "through systemd", "in its cgroup file", or both."""
    return " and ".join("through systemd" if w == "systemd" else "in its cgroup file"
                        for w in sorted(writers, reverse=True))
