"""Who writes our units behind our back: the kubelet's own Memory QoS gate, and how we know it is
on; what the journal says of each write found, and when a writer is fought over. Pure.

The kubelet writes kubepods.slice MemoryMin and kubepods-burstable.slice MemoryLow itself when its
`MemoryQoS` feature gate is on: every minute (its QoS manager's UpdateCgroups), explicit zeros
under its default policy. That gate is Beta and **on by default from v1.37**
(its feature-gate table, pkg/features/kube_features.go), so a kubelet config that says nothing means "on" there. Two
writers would fight; so with the gate on the service stands beside the kubelet (companion mode,
`companion_mode`): it writes none of what the kubelet writes (`KUBELET_OWNS`) and keeps the rest.
Forced to own every value (`companion: off`) it puts its own back within about a second
(daemon.py's watch, e2e 55-foreign-writer), and the two fight every minute.

How we learn it, most reliable first, without spawning anything:
1. **The kubelet says so.** Its `/metrics` (the same port and credentials as `/pods`, RBAC
   `nodes/metrics` get) has `kubernetes_feature_enabled{name="MemoryQoS"}` 1 or 0: the gate as
   the running kubelet resolved it, defaults included, and `kubernetes_build_info{git_version}`.
2. **Its config file** (`kubeletConfigFile`) sets `featureGates: {MemoryQoS: true|false}`.
3. **Its version's default**: on from v1.37, off before.
Nothing else is known for sure: the version alone needs the metrics too (the read-only /pods does
not carry it, and the binary is not ours to run).

The same goes for the kubelet's **QOSReserved** (`qos_reserved`): with that alpha gate on (off by
default) and `qosReserved: {memory: N%}` in its config, the kubelet sets MemoryMax on
kubepods-burstable.slice and kubepods-besteffort.slice itself every minute (its QoS manager's
setMemoryReserve), the very MemoryMax the plan may set on the BestEffort QoS slice (plan.py). The gate
comes from the same /metrics, else its config file; the reserve only from its config file.

A write found behind our back (drift.judge) is one of two kinds (drift.WRITERS): through systemd
(systemd holds other values than ours: the kubelet, `systemctl set-property`, libcontainer's
`SetUnitProperties`), or to the cgroup file alone (`cgroupfs`: the kernel shows less than systemd
holds: an agent that writes cgroupfs for its own Memory QoS such as koordlet, libcontainer's file
write after its D-Bus call, a person's `echo`). Either way ours is put back through systemd.
Who most likely wrote it is said here (`likely_writer`, `who_writes`); when to tell the journal and
when a unit is fought over is drift.py's (drift.ForeignWrites), and fights.py keeps the fights in
/run for `status` and `check`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from .naming import Naming

__all__ = ["Gate", "DEFAULT_ON_FROM", "memory_qos_gate", "qos_reserved", "parse_kubelet_metrics", "parse_version",
           "likely_writer", "GATE_FIX", "parse_labels", "who_writes", "written_how", "Mode",
           "companion_mode", "KUBELET_OWNS", "kubelet_owns"]

DEFAULT_ON_FROM = (1, 37)
_FEATURE = re.compile(r'^kubernetes_feature_enabled\{([^}]*)\}\s+([0-9.eE+-]+)\s*$')
_BUILD = re.compile(r'^kubernetes_build_info\{([^}]*)\}\s+')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?")


@dataclass(frozen=True)
class Gate:
    on: bool | None  # None: not known
    how: str  # where that came from, for people


def parse_version(text: str | None) -> tuple[int, int] | None:
    """"v1.37.2" (or "1.37", "v1.37.0-rc.1+abc") -> (1, 37); None for anything else."""
    m = _VERSION.match(text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def parse_kubelet_metrics(text: str) -> tuple[dict[str, bool], str | None]:
    """({feature gate: enabled}, the kubelet's git version) out of its /metrics text. Lines that
    do not parse are skipped: the rest of a large exposition is not ours to judge."""
    gates: dict[str, bool] = {}
    version = None
    for line in text.splitlines():
        if line.startswith("kubernetes_feature_enabled{"):
            m = _FEATURE.match(line)
            if m:
                labels = parse_labels(m.group(1))
                try:
                    gates[labels["name"]] = float(m.group(2)) != 0
                except (KeyError, ValueError):
                    continue
        elif line.startswith("kubernetes_build_info{") and version is None:
            m = _BUILD.match(line)
            if m:
                version = parse_labels(m.group(1)).get("git_version")
    return gates, version


def parse_labels(text: str) -> dict[str, str]:
    """The labels of one sample in the Prometheus text format (`a="1",b="x"`) -> {"a": "1", "b": "x"}."""
    return dict(_LABEL.findall(text))


def memory_qos_gate(*, reported: bool | None = None, version: str | None = None, configured: bool | None = None,
                    config_file: str | None = None) -> Gate:
    """The gate from what is known: `reported` by the kubelet's /metrics, `configured` in its
    config file, the `version` it reported."""
    if reported is not None:
        return Gate(reported, "the kubelet's /metrics (kubernetes_feature_enabled)")
    if configured is not None:
        return Gate(configured, f"featureGates in {config_file or 'the kubelet config'}")
    parsed = parse_version(version)
    if parsed is not None:
        return Gate(parsed >= DEFAULT_ON_FROM, f"the default of kubelet {version}")
    return Gate(None, "not known: the kubelet's /metrics did not say, and its config file sets no MemoryQoS gate")


# ---- companion mode: beside the kubelet's own Memory QoS -------------------------------------------
# What the kubelet writes itself when its MemoryQoS gate is on (the kubelet of v1.37: its QoS
# manager every minute, the pod's at creation and resize, the container's through the runtime's CRI
# Unified map, an enforced reserved cgroup's memory.min as it enforces it; docs/DESIGN.md
# "Companion mode"), by level: none of it is ours to write then, nor the MemoryLow and MemoryHigh
# beside it, which ours would only pin to their defaults. A MemoryMax we plan (a feature's,
# features.py) stays ours.
KUBELET_OWNS: Mapping[str, frozenset[str]] = {
    level: frozenset({"MemoryMin", "MemoryLow", "MemoryHigh"})
    for level in ("node", "reserved", "qos", "pod", "container")}


def kubelet_owns(level: str) -> frozenset[str]:
    """The properties of a unit of `level` the kubelet writes in companion mode."""
    return KUBELET_OWNS.get(level, frozenset())


@dataclass(frozen=True)
class Mode:
    """Whether we stand beside the kubelet's own Memory QoS (`companion`), and why, for people."""

    companion: bool
    why: str


def companion_mode(setting: str, gate: Gate) -> Mode:
    """The mode from the `companion:` setting ("auto", "on", "off") and the kubelet's gate. "auto"
    follows the gate; a gate not known owns every value (as a node whose kubelet has no Memory QoS:
    a protection nobody writes is worse than a fight, which is counted and shown)."""
    if setting == "on":
        return Mode(True, "companion: on in the config")
    if setting == "off":
        return Mode(False, "companion: off in the config")
    if gate.on:
        return Mode(True, f"the kubelet's own Memory QoS is on ({gate.how})")
    if gate.on is False:
        return Mode(False, f"the kubelet's own Memory QoS is off ({gate.how})")
    return Mode(False, f"whether the kubelet's own Memory QoS is on is not known ({gate.how}); set companion: on"
                       f" or off to say")


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
        return ("likely the kubelet's own Memory QoS (its MemoryQoS feature gate, on by default from v1.37,"
                " rewrites kubepods.slice MemoryMin and kubepods-burstable.slice MemoryLow every minute);"
                f" the fix: {GATE_FIX}")
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
                     + f" (it rewrites kubepods.slice and kubepods-burstable.slice every minute; fix: {GATE_FIX})")
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


