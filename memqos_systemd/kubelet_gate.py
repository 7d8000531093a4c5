"""Whether the kubelet's own Memory QoS is on, and how we know. Pure.

The kubelet writes kubepods.slice MemoryMin and kubepods-burstable.slice MemoryLow itself when its
`MemoryQoS` feature gate is on: every minute (its QoS manager's UpdateCgroups), explicit zeros
under its default policy. That gate is Beta and **on by default from v1.37**
(../shared/notes/kubelet-2026.md), so a kubelet config that says nothing means "on" there. Two
writers then fight; memqos-systemd puts its values back within about a second (daemon.py's watch,
e2e 55-foreign-writer), but the fix is to turn the kubelet's off.

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
setMemoryReserve), the very MemoryMax of the BestEffort ceiling (plan.besteffort_ceiling). The gate
comes from the same /metrics, else its config file; the reserve only from its config file.

When a write is found anyway, `foreign_write_line` is the journal's line for it: what changed, and
the likely writer (the kubelet's pattern named, with the fix).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from .quantity import show_value

__all__ = ["Gate", "DEFAULT_ON_FROM", "FOREIGN_LOG_EVERY", "foreign_write_line", "memory_qos_gate",
           "qos_reserved", "parse_kubelet_metrics", "parse_version"]

DEFAULT_ON_FROM = (1, 37)
# A unit someone else keeps writing (the kubelet's own Memory QoS: every minute) is logged at most
# this often; the metric counts every time.
FOREIGN_LOG_EVERY = 3600.0
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
                labels = dict(_LABEL.findall(m.group(1)))
                try:
                    gates[labels["name"]] = float(m.group(2)) != 0
                except (KeyError, ValueError):
                    continue
        elif line.startswith("kubernetes_build_info{") and version is None:
            m = _BUILD.match(line)
            if m:
                version = dict(_LABEL.findall(m.group(1))).get("git_version")
    return gates, version


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


def foreign_write_line(unit: str, before: Mapping[str, int], now: Mapping[str, int], kubelets_unit: str | None) -> str:
    """The journal's line when a read found `unit` holding `now` where we had `before`: the values
    that changed and the likely writer. `kubelets_unit`: the property the kubelet's own Memory QoS
    rewrites on this unit (MemoryMin of the kubepods slice, MemoryLow of the Burstable QoS slice),
    None for other units."""
    changed = [p for p in now if now[p] != before.get(p)]
    values = ", ".join(f"{p} {show_value(before[p])} -> {show_value(now[p])}" for p in changed if p in before)
    if kubelets_unit in changed:
        writer = ("likely the kubelet's own Memory QoS (its MemoryQoS feature gate, on by default from v1.37,"
                  " rewrites kubepods.slice MemoryMin and kubepods-burstable.slice MemoryLow every minute);"
                  " the fix: featureGates: {MemoryQoS: false} in the kubelet's config")
    else:
        writer = "by another writer (systemctl set-property, another agent)"
    return (f"{unit}: {values} changed without us, {writer}; putting ours back (logged once an hour per unit;"
            f" memqos_foreign_writes_total counts each time)")


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
