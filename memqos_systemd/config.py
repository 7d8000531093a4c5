"""The config file (YAML) -> frozen dataclasses: the loader and its field checkers.

The dataclasses themselves, the schema, are config_schema.py's (re-exported here).

One file serves the planner and the daemon. Planner keys use the
KubeletConfiguration names, so the same values can also be taken from the
kubelet's own config file (`kubeletConfigFile:`); a key set in our file wins
over the kubelet's, which wins over the built-in default.

Every error is a `ConfigError` whose message names the key and the value, e.g.
`config.yaml: memoryThrottlingFactor: 1.5 is outside (0, 1]`.
"""

from __future__ import annotations

import dataclasses
import errno
import math
import os
import re
import stat
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from .config_schema import (COMPANION_SETTINGS, HIERARCHIES, POLICIES, BurstableHighSettings,
                            CeilingSettings, Config, ConfigError, KubeletFile, KubeletSettings, LendingSettings,
                            MetricsConfig,
                            Reservation, Reserve)
from .config_checks import (_best_effort_ceiling, _burstable_high, _bytes_or_percent, _cgroup_path, _companion, _duration, _enforce, _enum, _eviction_hard, _factor, _fail, _kubelet_source, _lending, _metrics, _optional_path, _policy, _reserved_cgroup, _resource_list, _show)
from .documents import DocumentError, decode

__all__ = [
    "ConfigError", "Config", "CeilingSettings", "BurstableHighSettings", "LendingSettings", "KubeletSettings",
    "MetricsConfig", "Reserve",
    "load_config", "parse_config", "kubelet_config_subset", "kubelet_file", "read_kubelet_file", "config_present",
    "read_yaml", "shown_path", "POLICIES", "HIERARCHIES", "COMPANION_SETTINGS", "DEFAULT_CONFIG_PATH", "Reservation",
    "KubeletFile",
]

DEFAULT_CONFIG_PATH = "/etc/memqos-systemd/config.yaml"
# Config files are small; a bigger one is a mistake (or an attack on the parser).
MAX_CONFIG_BYTES = 1 << 20


# key -> (dataclass attribute, checker). Planner keys first; all are also
# KubeletConfiguration fields except hierarchy and protectionHeadroom.
_PLANNER = {
    "memoryReservationPolicy": ("memory_reservation_policy", lambda s, k, v: _policy(s, k, v)),
    "memoryThrottlingFactor": ("memory_throttling_factor", _factor),
    "hierarchy": ("hierarchy", lambda s, k, v: _enum(s, k, v, HIERARCHIES)),
    "cgroupRoot": ("cgroup_root", _cgroup_path),
    "kubeReserved": ("kube_reserved", _resource_list),
    "systemReserved": ("system_reserved", _resource_list),
    "evictionHard": ("eviction_hard_memory", _eviction_hard),
    "enforceNodeAllocatable": ("enforce_node_allocatable", _enforce),
    "kubeReservedCgroup": ("kube_reserved_cgroup", _reserved_cgroup),
    "systemReservedCgroup": ("system_reserved_cgroup", _reserved_cgroup),
    "protectionHeadroom": ("protection_headroom", _bytes_or_percent),
}
_DAEMON = {
    "podsFile": ("pods_file", _optional_path),
    "kubelet": ("kubelet", _kubelet_source),
    "kubeletConfigFile": ("kubelet_config_file", _optional_path),
    "metrics": ("metrics", _metrics),
    "resyncInterval": ("resync_interval", lambda s, k, v: _duration(s, k, v, minimum=1)),
    "companion": ("companion", lambda s, k, v: _companion(s, k, v)),
    "bestEffortCeiling": ("best_effort_ceiling", _best_effort_ceiling),
    "burstableHigh": ("burstable_high", _burstable_high),
    "lending": ("lending", _lending),
}
# Keys that are gone, and what took their place: a clear error rather than "not a known key".
_REPLACED = {
    "pressureGuard": "the pressure guard was removed; the BestEffort ceiling replaced it (bestEffortCeiling:"
                     " {enabled: true}, a MemoryMax the kernel enforces, /usr/share/doc/memqos-systemd/DESIGN.md): delete pressureGuard",
}
# The planner keys a KubeletConfiguration gives us: the node's layout and reservations. Not its
# memoryReservationPolicy and memoryThrottlingFactor: those say what the kubelet writes itself
# (kubelet_file, kubelet_gate.kubelet_facts), which is never ours to write again; ours are this
# file's (issue 42: the kubelet's None taken as ours left the pods with no protection at all).
_KUBELET_KEYS = tuple(k for k in _PLANNER if k not in ("hierarchy", "protectionHeadroom", "memoryReservationPolicy",
                                                      "memoryThrottlingFactor"))


def shown_path(path: str | Path) -> str:
    """A file name as a message names it: as given when it prints plainly (a path as long as the
    kernel takes, PATH_MAX: a package's build tree can be 250 characters down, and a cut path
    names no file), else its repr, cut in the middle past SHOWN_REPR_MAX so that the line stays
    readable and still ends with the file's own name (an empty name, control characters, a name
    longer than any path)."""
    text = str(path)
    if text and text.isprintable() and len(text) <= PATH_MAX:
        return text
    shown = repr(text)
    return shown if len(shown) <= SHOWN_REPR_MAX else shown[:SHOWN_REPR_MAX - 61] + "…" + shown[-60:]


PATH_MAX = 4096  # the longest path the kernel takes (linux/limits.h)
SHOWN_REPR_MAX = 200


_KINDS = ((stat.S_ISDIR, "it is a directory"), (stat.S_ISFIFO, "it is a FIFO (a named pipe)"),
          (stat.S_ISSOCK, "it is a socket"), (stat.S_ISCHR, "it is a character device"),
          (stat.S_ISBLK, "it is a block device"))


def _read_file(path: str, limit: int) -> bytes:
    """At most `limit` bytes of a regular file. Anything else is refused before a byte is read: a
    FIFO would wait for a writer forever (hence O_NONBLOCK on the open), a device would never
    end. OSError's strerror says why it cannot be opened."""
    if not path:
        raise OSError(errno.ENOENT, "an empty name names no file")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    try:
        mode = os.fstat(fd).st_mode
        for is_kind, kind in _KINDS:
            if is_kind(mode):
                raise OSError(errno.EINVAL, f"not a regular file: {kind}")
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)  # the daemon reads its config at every reload: no descriptor left behind


def config_present(path: str | Path) -> bool:
    """Whether a config at `path` is there to be read: False only when nothing is there (the
    default path on a machine without the package). Anything else (a directory it cannot enter,
    a name too long, a loop of symlinks) is True: reading it then says why in one line."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return os.path.islink(path)  # a dangling symlink: someone meant a file there
    except OSError:
        return True
    return True


def read_yaml(path: str | Path, what: str = "config") -> Any:
    """Read one YAML (or JSON) document with the safe loader; errors name the file."""
    name = shown_path(path)
    try:
        data = _read_file(str(path), MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{name}: cannot read {what}: {e.strerror or e}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{name}: {what} is larger than {MAX_CONFIG_BYTES} bytes")
    if not data.strip():
        return None  # an empty config file means the defaults
    try:
        return decode(data)
    except DocumentError as e:
        raise ConfigError(f"{name}: {e}") from None


def kubelet_config_subset(doc: Any, src: str) -> tuple[dict, KubeletFile]:
    """The planner keys (the node's layout and reservations), and what the kubelet writes itself
    (kubelet_file), out of a KubeletConfiguration document."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{src}: not a KubeletConfiguration (expected a map, got {type(doc).__name__})")
    kind = doc.get("kind")
    if kind not in (None, "KubeletConfiguration"):
        raise ConfigError(f"{src}: kind: {kind!r} is not KubeletConfiguration")
    # In a KubeletConfiguration a null or empty field means "the kubelet's default" (cgroupRoot ""
    # is "/", an empty kubeReservedCgroup is none), so it is as good as absent: it must not turn
    # into an error.
    subset = {k: doc[k] for k in _KUBELET_KEYS if k in doc and doc[k] is not None and doc[k] != ""}
    return subset, kubelet_file(doc, src)


def kubelet_file(doc: Any, src: str) -> KubeletFile:
    """What a KubeletConfiguration (its file, or the `kubeletconfig` of its /configz) says of what
    the kubelet writes itself: its feature gates, memoryReservationPolicy, memoryThrottlingFactor
    and qosReserved.memory. Never raises: a key of the wrong shape (featureGates written as a string
    or a list, a gate's value 'true' or 1, a factor outside (0, 1]) is a named problem, and says
    nothing of the kubelet (it refuses such a file itself, so its running config is another)."""
    if doc is None:
        return KubeletFile(src)  # empty: every default
    if not isinstance(doc, dict):
        return KubeletFile(src, problems=(f"{src}: not a KubeletConfiguration (expected a map, got"
                                          f" {type(doc).__name__})",))
    problems = []
    gates: list[tuple[str, bool]] = []
    raw = doc.get("featureGates")
    if isinstance(raw, dict):
        for name, on in raw.items():
            if isinstance(on, bool):
                gates.append((str(name), on))
            elif name in ("MemoryQoS", "QOSReserved"):
                problems.append(f"{src}: featureGates.{name}: {_show(on)} is not true or false (the kubelet"
                                f" refuses it): its {name} gate is not known from this file")
    elif raw is not None:
        problems.append(f"{src}: featureGates: {_show(raw)} is a {_kind_of(raw)}, not a map of gate: true|false"
                        f" (the kubelet refuses it): no gate is known from this file")
    policy = doc.get("memoryReservationPolicy")
    if policy is not None and not isinstance(policy, str):
        problems.append(f"{src}: memoryReservationPolicy: {_show(policy)} is not a string: not known from this file")
        policy = None
    factor = doc.get("memoryThrottlingFactor")
    if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float))
                               or not math.isfinite(factor) or not 0 < factor <= 1):
        problems.append(f"{src}: memoryThrottlingFactor: {_show(factor)} is not a number in (0, 1] (the kubelet"
                        f" refuses it): not known from this file")
        factor = None
    if dict(gates).get("MemoryQoS") is False:
        # Its validation (v1.37): with the gate off only policy None and the factor's default pass.
        refused = ([f"memoryReservationPolicy {policy}"] if policy not in (None, "None") else []) + (
            [f"memoryThrottlingFactor {factor:g}"] if factor is not None and factor != 0.9 else [])
        if refused:
            problems.append(f"{src}: {' and '.join(refused)} with featureGates.MemoryQoS false: the kubelet refuses"
                            f" this config (both need its MemoryQoS gate on) and does not start with it")
    reserved = doc.get("qosReserved")
    memory = reserved.get("memory") if isinstance(reserved, dict) else None
    return KubeletFile(src, tuple(gates), policy or None, None if factor is None else float(factor),
                       None if memory in (None, "") else _show(memory).strip("'"), tuple(problems))


def _kind_of(value: Any) -> str:
    return {str: "string", list: "list", int: "number", float: "number", bool: "boolean"}.get(type(value), "value")


def read_kubelet_file(path: str) -> KubeletFile:
    """The kubelet's config file read again (the daemon does at each start of the kubelet): what it
    says the kubelet writes itself; a file that cannot be read or parsed is a problem of its own."""
    try:
        return kubelet_file(read_yaml(path, what="kubelet config"), path)
    except ConfigError as e:
        return KubeletFile(path, problems=(str(e),))


def parse_config(data: Any, src: str = "config", kubelet_doc: Any = None, kubelet_src: str = "",
                 blocks: Mapping[str, Callable[[str, str, Any], Any]] | None = None) -> Config:
    """Validate a parsed config document (None or {} means all defaults). `blocks`: the keys the
    features bring (features.config_blocks: key -> checker), each checked by its feature's checker."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{src}: the config must be a YAML map of keys, got {type(data).__name__}")
    blocks = dict(blocks or {})
    known = {**_PLANNER, **_DAEMON, **{k: (None, check) for k, check in blocks.items() if k not in _PLANNER}}
    for k, v in data.items():
        if k in _REPLACED:
            raise ConfigError(f"{src}: {k}: {_REPLACED[k]}")
        if k not in known:
            hint = ""
            close = [n for n in known if n.lower() == str(k).lower()]
            if close:
                hint = f" (did you mean {close[0]}?)"
            raise _fail(src, k, v, f"is not a known key{hint}")

    values: dict[str, Any] = {}
    origins: dict[str, str] = {k: "default" for k in known}
    kfile = None
    if kubelet_doc is not None:
        subset, kfile = kubelet_config_subset(kubelet_doc, kubelet_src)
        for k, v in subset.items():
            attr, check = _PLANNER[k]
            values[attr] = check(kubelet_src, k, v)
            origins[k] = "kubelet"
    own: list[tuple[str, Any]] = []
    for k, v in data.items():
        attr, check = known[k]
        if attr is None:  # a feature's own block
            own.append((k, check(src, k, v)))
        else:
            values[attr] = check(src, k, v)
        origins[k] = "config"

    cfg = Config(**values, kubelet_file=kfile, origins=origins, blocks=tuple(own))
    _cross_check(cfg, src)
    return cfg


def _cross_check(cfg: Config, src: str) -> None:
    # The kubelet's own rule: enforcing a reservation needs the cgroup to enforce it on.
    if "kube-reserved" in cfg.enforce_node_allocatable and cfg.kube_reserved_cgroup is None:
        raise _fail(src, "enforceNodeAllocatable", list(cfg.enforce_node_allocatable),
                    "names kube-reserved but kubeReservedCgroup is not set")
    if "system-reserved" in cfg.enforce_node_allocatable and cfg.system_reserved_cgroup is None:
        raise _fail(src, "enforceNodeAllocatable", list(cfg.enforce_node_allocatable),
                    "names system-reserved but systemReservedCgroup is not set")
    if cfg.kube_reserved_cgroup and cfg.kube_reserved_cgroup == cfg.system_reserved_cgroup:
        raise _fail(src, "systemReservedCgroup", cfg.system_reserved_cgroup, "is the same cgroup as kubeReservedCgroup")


def load_config(path: str | Path | None, *, required: bool = False,
                blocks: Mapping[str, Callable[[str, str, Any], Any]] | None = None) -> Config:
    """Load our config file, merged over the kubelet's config when `kubeletConfigFile` is set.

    A missing file at the default path means built-in defaults unless `required`.
    """
    data = None
    src = shown_path(path) if path is not None else "defaults"
    notes: tuple[str, ...] = ()
    if path is not None:
        if required or config_present(path):
            data = read_yaml(path)
            if data is None or data == {}:
                # Valid, and easy to take for "the packaged settings": say what it means.
                notes = (f"{src} sets no key (it is empty, or comments only): the built-in defaults apply,"
                         f" memoryReservationPolicy None: nothing is protected, only throttled",)
    kubelet_doc = None
    kubelet_src = ""
    if isinstance(data, dict) and data.get("kubeletConfigFile"):
        kpath = _optional_path(src, "kubeletConfigFile", data["kubeletConfigFile"])
        kubelet_src = str(kpath)
        kubelet_doc = read_yaml(kpath, what="kubelet config")
    cfg = parse_config(data, src, kubelet_doc, kubelet_src, blocks)
    return dataclasses.replace(cfg, notes=notes) if notes else cfg


# The keys that name our units (daemon.naming_for): all `reset` needs, even from a broken file.
_UNIT_NAME_KEYS = ("cgroupRoot", "enforceNodeAllocatable", "kubeReservedCgroup", "systemReservedCgroup")


def unit_names_config(path: str | Path) -> Config:
    """What `reset` can still go by when load_config(path) fails: the built-in defaults, with
    each key that names units (_UNIT_NAME_KEYS) taken from our file, or else from the kubelet's
    config it names, when that key's value is valid on its own. Never raises."""
    def read(p) -> dict:
        try:
            doc = read_yaml(p)
        except ConfigError:
            return {}
        return doc if isinstance(doc, dict) else {}

    ours = read(path)
    theirs = {}
    kpath = ours.get("kubeletConfigFile")
    if isinstance(kpath, str) and kpath.startswith("/"):
        theirs = read(kpath)
    values = {}
    for key in _UNIT_NAME_KEYS:
        for doc in (ours, theirs):
            if key in doc and doc[key] is not None and doc[key] != "":
                attr, check = _PLANNER[key]
                try:
                    values[attr] = check(shown_path(path), key, doc[key])
                except ConfigError:
                    continue
                break
    return Config(**values)


def describe_defaults() -> dict:
    """Default values by config key, for docs and `--help`."""
    d = Config()
    out = {}
    for k, (attr, _) in {**_PLANNER, **_DAEMON}.items():
        out[k] = getattr(d, attr)
    return out


def replace(cfg: Config, **changes) -> Config:
    return dataclasses.replace(cfg, **changes)
