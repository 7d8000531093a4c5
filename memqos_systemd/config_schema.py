"""The config's schema: what a config holds, as frozen dataclasses, and the values its keys may take.

The loader (config.py) reads the file, checks every field and makes these; the planner (plan.py)
and every pure stage import only this module, so that planning never pulls in YAML, files or the
field checkers. Every name here is also importable from `memqos_systemd.config`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Mapping, NamedTuple

__all__ = [
    "ConfigError", "Config", "CeilingSettings", "BurstableHighSettings", "LendingSettings", "KubeletSettings",
    "MetricsConfig", "Reserve", "Reservation", "POLICIES", "HIERARCHIES", "COMPANION_SETTINGS", "ENFORCE", "KubeletFile",
]

POLICIES = ("None", "TieredReservation", "HardReservation")
HIERARCHIES = ("effective", "kubelet", "kubelet-1.36")
COMPANION_SETTINGS = ("auto", "on", "off")
ENFORCE = ("pods", "kube-reserved", "system-reserved")


class ConfigError(ValueError):
    """Bad configuration; the message is one line naming the key and the value."""


@dataclass(frozen=True)
class Reserve:
    """A memory amount given either as bytes or as a fraction of node capacity."""

    bytes: int = 0
    fraction: Fraction | None = None

    def resolve(self, capacity: int) -> int:
        if self.fraction is None:
            return self.bytes
        return math.ceil(self.fraction * capacity)


@dataclass(frozen=True)
class KubeletSettings:
    url: str = "http://127.0.0.1:10255/pods"
    token_file: str | None = None
    ca_file: str | None = None
    client_cert_file: str | None = None
    client_key_file: str | None = None
    insecure_skip_tls_verify: bool = False
    # The name the kubelet's serving certificate must carry. None: the URL's host and, for a
    # loopback URL, this node's hostname too (what the kubelet's self-signed kubelet.crt names).
    server_name: str | None = None
    poll_interval: float = 5.0
    timeout: float = 5.0


@dataclass(frozen=True)
class MetricsConfig:
    # None: no metrics endpoint.
    listen: str | None = "127.0.0.1:9759"
    # The per-pod series (10 a pod); False keeps the node's and the QoS classes' only.
    per_pod: bool = True
    # Also every pod slice's and container scope's desired values and each container's memory.high
    # throttle count (3 series a pod slice, 4 a container); off by default.
    per_unit: bool = False


@dataclass(frozen=True)
class CeilingSettings:
    """The `bestEffortCeiling:` block: a planned MemoryMax on the BestEffort QoS slice (plan.py's
    `besteffort_ceiling`), off unless `enabled`. The defaults are measured (docs/DESIGN.md, "The
    BestEffort ceiling")."""

    enabled: bool = False
    # Kept free below what the requests leave: MemoryMax = allocatable - requests - headroom; bytes,
    # or a percentage of allocatable (Reserve.resolve(allocatable)).
    headroom: Reserve = Reserve(bytes=256 * 2**20)
    # BestEffort pods are never capped below this.
    minimum: int = 64 * 2**20


@dataclass(frozen=True)
class BurstableHighSettings:
    """The `burstableHigh:` block: a planned MemoryHigh on each Burstable pod slice (plan.py's
    `burstable_high`) that leaves every other pod's request alone, off unless `enabled`
    (docs/DESIGN.md, "The Burstable lever")."""

    enabled: bool = False
    # Kept free below what the others' requests leave: MemoryHigh = allocatable - others - headroom;
    # bytes, or a percentage of allocatable (Reserve.resolve(allocatable)), as the ceiling's.
    headroom: Reserve = Reserve()


@dataclass(frozen=True)
class LendingSettings:
    """The `lending:` block: the lines of the BestEffort ceiling and of the Burstable lever (where
    those are on) follow what the pods with requests use instead of their requests (lending.py),
    off unless `enabled` (docs/DESIGN.md, "Lines that follow usage")."""

    enabled: bool = False
    # Never lent: kept free below what the owners of requests use and their slack; bytes, or a
    # percentage of allocatable (Reserve.resolve(allocatable)).
    headroom: Reserve = Reserve(bytes=64 * 2**20)


@dataclass(frozen=True)
class KubeletFile:
    """What a KubeletConfiguration says of what the kubelet writes itself: its config file
    (`kubeletConfigFile`) or its `/configz` (config.kubelet_file reads either). A key it does not
    set is None: the kubelet's default then applies (kubelet_gate.kubelet_facts says which)."""

    source: str  # the file's path, or the /configz URL, for people
    gates: tuple[tuple[str, bool], ...] = ()  # featureGates set to true or false, in the order given
    policy: str | None = None  # memoryReservationPolicy as written (a value we do not know is kept)
    factor: float | None = None  # memoryThrottlingFactor, when set
    qos_reserved_memory: str | None = None  # qosReserved.memory, e.g. "100%"
    # What in it is of the wrong shape, one line each (a featureGates that is a string, a gate's
    # value that is not true or false): named, never taken for "unset" in silence.
    problems: tuple[str, ...] = ()

    def gate(self, name: str) -> bool | None:
        """featureGates[name] when set to true or false; None when not set (or not a boolean: a problem)."""
        return next((on for gate, on in self.gates if gate == name), None)


@dataclass(frozen=True)
class Config:
    # --- planner (KubeletConfiguration names) ---
    memory_reservation_policy: str = "None"
    memory_throttling_factor: float | None = 0.9
    hierarchy: str = "effective"
    cgroup_root: str = "/"
    kube_reserved: int = 0
    system_reserved: int = 0
    eviction_hard_memory: Reserve = Reserve(bytes=100 * 2**20)
    enforce_node_allocatable: tuple[str, ...] = ("pods",)
    kube_reserved_cgroup: str | None = None
    system_reserved_cgroup: str | None = None
    protection_headroom: Reserve = Reserve(fraction=Fraction(5, 100))
    # --- daemon ---
    pods_file: str | None = None
    kubelet: KubeletSettings = KubeletSettings()
    kubelet_config_file: str | None = None
    metrics: MetricsConfig = MetricsConfig()
    resync_interval: float = 60.0
    # Beside the kubelet's own Memory QoS (kubelet_gate.companion_mode): "auto" follows what the
    # running kubelet does (its /metrics, else its config file, else its version); "on" leaves every
    # value the kubelet writes to it; "off" owns them all, as before the kubelet had the feature.
    companion: str = "auto"
    # The kubelet's config file as read with this config (`kubeletConfigFile`; None: none named):
    # what it says the kubelet writes itself (kubelet_gate.kubelet_facts). The daemon reads it
    # again at each start of the kubelet, which is when the kubelet reads it.
    kubelet_file: KubeletFile | None = None
    # The planned BestEffort ceiling (plan.besteffort_ceiling), off unless `bestEffortCeiling: {enabled: true}`.
    best_effort_ceiling: CeilingSettings = CeilingSettings()
    # The Burstable lever (plan.burstable_high), off unless `burstableHigh: {enabled: true}`.
    burstable_high: BurstableHighSettings = BurstableHighSettings()
    # The levers' lines follow usage (lending.py), off unless `lending: {enabled: true}`.
    lending: LendingSettings = LendingSettings()
    # The blocks of the features that bring their own (feature.Feature.config_block): (key, checked
    # value) for each set in the file; `block(key)` reads one (None: not set).
    blocks: tuple[tuple[str, Any], ...] = ()
    # Where each planner value came from, for `check`/logs: key -> "default"|"kubelet"|"config".
    origins: Mapping[str, str] = field(default_factory=dict, compare=False)
    # What an operator must be told about the file that is not an error (load_config): one line each.
    notes: tuple[str, ...] = field(default=(), compare=False)

    def block(self, key: str) -> Any:
        """A feature's own config block as checked (Feature.config_block); None when not set."""
        return next((value for k, value in self.blocks if k == key), None)

    # From the kubelet's config: its own MemoryQoS gate as featureGates sets it, None when it does
    # not (the kubelet's default applies: kubelet_gate.py).
    @property
    def kubelet_memory_qos_gate(self) -> bool | None:
        return self.kubelet_file.gate("MemoryQoS") if self.kubelet_file else None

    # From the kubelet's config: its QOSReserved feature gate (alpha, off by default; None: not set)
    # and `qosReserved.memory` (e.g. "100%"; None: not set). With both, the kubelet writes the
    # BestEffort and Burstable QoS slices' MemoryMax itself every minute: the ceiling then stands
    # down (plan.besteffort_ceiling, kubelet_gate.qos_reserved).
    @property
    def kubelet_qos_reserved_gate(self) -> bool | None:
        return self.kubelet_file.gate("QOSReserved") if self.kubelet_file else None

    @property
    def kubelet_qos_reserved_memory(self) -> str | None:
        return self.kubelet_file.qos_reserved_memory if self.kubelet_file else None

    def enforced_reservations(self) -> tuple[Reservation, ...]:
        """The reserved cgroups this config enforces, in this order: kubeReservedCgroup when
        enforceNodeAllocatable has kube-reserved, systemReservedCgroup when it has system-reserved."""
        return tuple(Reservation(key, cgroup, amount) for key, enforced, cgroup, amount in (
            ("kubeReservedCgroup", "kube-reserved", self.kube_reserved_cgroup, self.kube_reserved),
            ("systemReservedCgroup", "system-reserved", self.system_reserved_cgroup, self.system_reserved))
            if cgroup and enforced in self.enforce_node_allocatable)


class Reservation(NamedTuple):
    key: str  # the config key that names the cgroup
    cgroup: str
    amount: int  # bytes reserved
