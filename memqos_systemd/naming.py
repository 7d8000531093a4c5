"""Unit names: the kubelet systemd driver's names, and the check that a name is ours.

This is the only place that builds or parses a unit name. Forward:
`node_slice`, `qos_slice`, `pod_slice`, `container_scope`, `reserved_slice`.
Back: `parse_unit` says whether a unit name is one of ours and what it is.
The daemon may only ever touch names these functions produce.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "NamingError", "UnitRef", "Naming", "valid_pod_uid", "container_scope", "parse_container_id",
    "reserved_slice", "RUNTIME_SCOPE_PREFIX",
]

# Kubernetes pod UIDs are RFC 4122 UUIDs (lowercase); static pods (from manifests on
# the node) get the hex MD5 of their manifest instead: 32 lowercase hex digits.
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_STATIC_UID = re.compile(r"[0-9a-f]{32}")
# CRI container IDs are 64 lowercase hex digits for containerd, CRI-O and Docker.
_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")
RUNTIME_SCOPE_PREFIX = {"containerd": "cri-containerd", "cri-o": "crio", "docker": "docker"}
_SCOPE = re.compile(r"(cri-containerd|crio|docker)-([0-9a-f]{64})\.scope")
# A cgroup path element the kubelet would accept as part of cgroupRoot.
_ROOT_PART = re.compile(r"[A-Za-z0-9_.:]+")
_QOS = {"Guaranteed": None, "Burstable": "burstable", "BestEffort": "besteffort"}


def _q(value: object) -> str:
    """A value quoted for a message: one line, bounded (UIDs and IDs come from outside)."""
    text = value if isinstance(value, str) else repr(value)
    shown = repr(text[:81])[1:-1]
    return f"'{shown[:79]}…'" if len(shown) > 80 else f"'{shown}'"


class NamingError(ValueError):
    """A name that is not one of ours (the message says which and why)."""


def valid_pod_uid(uid: object) -> bool:
    return isinstance(uid, str) and bool(_UUID.fullmatch(uid) or _STATIC_UID.fullmatch(uid))


def parse_container_id(raw: object) -> tuple[str, str]:
    """`containerd://<64 hex>` -> ("containerd", id). Raises NamingError otherwise."""
    if not isinstance(raw, str) or "://" not in raw:
        raise NamingError(f"containerID {_q(raw)} is not <runtime>://<id>")
    runtime, _, cid = raw.partition("://")
    if runtime not in RUNTIME_SCOPE_PREFIX:
        raise NamingError(f"containerID {_q(raw)}: runtime {_q(runtime)} is not one of {', '.join(RUNTIME_SCOPE_PREFIX)}")
    if not _CONTAINER_ID.fullmatch(cid):
        raise NamingError(f"containerID {_q(raw)}: id is not 64 lowercase hex digits")
    return runtime, cid


def container_scope(raw_container_id: str) -> str:
    """The runtime's scope unit for a container: `containerd://ID` -> `cri-containerd-ID.scope`."""
    runtime, cid = parse_container_id(raw_container_id)
    return f"{RUNTIME_SCOPE_PREFIX[runtime]}-{cid}.scope"


def reserved_slice(cgroup_path: str) -> str:
    """`/kube.slice` -> `kube.slice`; `/a.slice/a-b.slice` -> `a-b.slice` (the leaf)."""
    last = cgroup_path.rstrip("/").rsplit("/", 1)[-1]
    if not valid_slice_name(last):
        raise NamingError(f"reserved cgroup {_q(cgroup_path)} does not end in a systemd slice name")
    return last


# A slice name systemd accepts and places where its name says: '-' separates levels, so no
# part may be empty ('a-.slice', 'a--b.slice', '-a.slice' are refused); no escapes.
_SLICE_NAME = re.compile(r"[A-Za-z0-9:_.]+(?:-[A-Za-z0-9:_.]+)*\.slice")


def valid_slice_name(name: object) -> bool:
    return isinstance(name, str) and len(name) <= 255 and bool(_SLICE_NAME.fullmatch(name))


def _escape(part: str) -> str:
    # The systemd driver writes '-' inside a name as '_' ('-' separates levels).
    return part.replace("-", "_")


def _root_parts(cgroup_root: str) -> list[str]:
    """cgroupRoot as name elements: '/' -> [], '/foo' -> [foo], '/foo-bar' -> [foo_bar],
    '/foo.slice/foo-bar.slice' and '/foo-bar.slice' -> [foo, bar]."""
    parts: list[str] = []
    for element in (p for p in cgroup_root.split("/") if p):
        if element in (".", ".."):
            raise NamingError(f"cgroupRoot {cgroup_root!r}: element {element!r} is not a cgroup name")
        if element.endswith(".slice"):
            # systemd form: a slice's name spells its whole ancestry (foo-bar.slice lives in
            # foo.slice), as the kubelet's ParseSystemdToCgroupName reads it.
            names = element[: -len(".slice")].split("-")
            if not all(_ROOT_PART.fullmatch(n) for n in names):
                raise NamingError(f"cgroupRoot {cgroup_root!r}: {element!r} is not a valid slice name")
            if len(names) <= len(parts) or names[: len(parts)] != parts:
                raise NamingError(f"cgroupRoot {cgroup_root!r}: {element!r} is not a slice inside"
                                  f" {'-'.join(parts)}.slice")
            parts = names
            continue
        if not _ROOT_PART.fullmatch(element.replace("-", "_")):
            raise NamingError(f"cgroupRoot {cgroup_root!r}: element {element!r} is not a valid cgroup name")
        parts.append(_escape(element))
    return parts


@dataclass(frozen=True)
class UnitRef:
    """What one of our unit names refers to."""

    level: str  # node | qos | pod | container | reserved
    qos: str | None = None  # for qos/pod: Guaranteed | Burstable | BestEffort
    uid: str | None = None  # pod UID as the API writes it (with '-')
    container_id: str | None = None


class Naming:
    """Unit names for one node (cgroupRoot and reserved cgroups fixed)."""

    @classmethod
    def for_config(cls, config) -> "Naming":
        """The names a config implies: its cgroupRoot and the reserved cgroups it enforces
        (config.Config.enforced_reservations). NamingError where one is not ours to manage."""
        return cls(config.cgroup_root, tuple(r.cgroup for r in config.enforced_reservations()))

    def __init__(self, cgroup_root: str = "/", reserved_cgroups: tuple[str, ...] = ()):
        self._root = _root_parts(cgroup_root)
        self._prefix = "-".join(self._root + ["kubepods"])
        self._reserved = tuple(reserved_slice(c) for c in reserved_cgroups)
        for name in self._reserved:
            # A reserved slice that is kubepods.slice, one below it, or a slice above it would get
            # two conflicting plans.
            if name in self.root_slices() or name == self.node_slice() or name.startswith(f"{self._prefix}-"):
                raise NamingError(f"reserved cgroup slice {name!r} is one of the pod slices"
                                  f" ({self.node_slice()} or its ancestors or children)")

    # ---- forward
    def node_slice(self) -> str:
        return f"{self._prefix}.slice"

    def root_slices(self) -> list[str]:
        """The slices of cgroupRoot above kubepods, outermost first ([] for '/')."""
        return [f"{'-'.join(self._root[: i + 1])}.slice" for i in range(len(self._root))]

    def reserved_slices(self) -> tuple[str, ...]:
        """The reserved slices (kubeReservedCgroup, systemReservedCgroup) as unit names."""
        return self._reserved

    def qos_slice(self, qos: str) -> str:
        """QoS slice for Burstable/BestEffort; Guaranteed pods hang off the node slice."""
        level = _QOS[qos]
        return self.node_slice() if level is None else f"{self._prefix}-{level}.slice"

    def pod_slice(self, qos: str, uid: str) -> str:
        if not valid_pod_uid(uid):
            raise NamingError(f"pod UID {_q(uid)} is not a UUID (or a static pod's 32-hex UID)")
        level = _QOS[qos]
        middle = self._prefix if level is None else f"{self._prefix}-{level}"
        return f"{middle}-pod{_escape(uid)}.slice"

    def patterns(self) -> list[str]:
        """Glob patterns for ListUnitsByPatterns that cover every unit we may manage."""
        return [*self.root_slices(), f"{self._prefix}.slice", f"{self._prefix}-*.slice",
                *(f"{p}-*.scope" for p in RUNTIME_SCOPE_PREFIX.values()), *self._reserved]

    # ---- back
    def parse_unit(self, name: object) -> UnitRef | None:
        """The UnitRef for a unit name we could have produced, or None: not ours."""
        if not isinstance(name, str):
            return None
        if name == self.node_slice() or name in self.root_slices():
            return UnitRef("node")
        if name in self._reserved:
            return UnitRef("reserved")
        m = _SCOPE.fullmatch(name)
        if m:
            return UnitRef("container", container_id=m.group(2))
        for qos, level in _QOS.items():
            middle = self._prefix if level is None else f"{self._prefix}-{level}"
            if level is not None and name == f"{middle}.slice":
                return UnitRef("qos", qos=qos)
            head = f"{middle}-pod"
            if name.startswith(head) and name.endswith(".slice"):
                uid = name[len(head): -len(".slice")].replace("_", "-")
                if valid_pod_uid(uid) and self.pod_slice(qos, uid) == name:
                    return UnitRef("pod", qos=qos, uid=uid)
        return None
