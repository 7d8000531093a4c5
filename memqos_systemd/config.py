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
import functools
import ipaddress
import math
import os
import re
import stat
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

from .config_schema import (COMPANION_SETTINGS, ENFORCE, HIERARCHIES, POLICIES, BurstableHighSettings,
                            CeilingSettings, Config, ConfigError, KubeletFile, KubeletSettings, LendingSettings,
                            MetricsConfig,
                            Reservation, Reserve)
from .documents import DocumentError, decode
from .naming import valid_slice_name
from .quantity import NEGATIVE, NOT_A_QUANTITY, QuantityError, parse_quantity, parse_whole_bytes

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


# ---------------------------------------------------------------- helpers

def _fail(src: str, key: object, value: Any, why: str) -> ConfigError:
    # Keys come from the file too: an unknown one is shown like a value, on one bounded line.
    shown_key = key if isinstance(key, str) and key.isprintable() and len(key) <= 80 else _show(key)
    return ConfigError(f"{src}: {shown_key}: {_show(value)} {why}")


def _show(value: Any) -> str:
    # Maps and lists go through the YAML dumper, which keeps aliases as aliases: str() of an
    # alias bomb ("billion laughs") would expand it and never return.
    if isinstance(value, (dict, list)):
        text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().replace("\n", "\\n")
    elif value is None or isinstance(value, bool):
        text = {None: "null", True: "true", False: "false"}[value]  # as YAML spells them, not Python
    else:
        text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _enum(src, key, value, choices):
    if value not in choices:
        raise _fail(src, key, value, f"is not one of {', '.join(choices)}")
    return value


def _companion(src, key, value):
    # YAML 1.1 reads a bare on/off as true/false: take them as the words the operator wrote.
    value = {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value
    return _enum(src, key, value, COMPANION_SETTINGS)


def _policy(src, key, value):
    if value == "Disabled":
        # The KEP's prose says Disabled in places; the field's value is None.
        raise _fail(src, key, value, "is not one of None, TieredReservation, HardReservation (to disable, use None)")
    return _enum(src, key, value, POLICIES)


def _str(src, key, value):
    if not isinstance(value, str) or not value:
        raise _fail(src, key, value, "must be a non-empty string")
    return value


def _bool(src, key, value):
    if not isinstance(value, bool):
        raise _fail(src, key, value, "must be true or false")
    return value


def _bytes(src, key, value):
    try:
        return parse_whole_bytes(value)
    except QuantityError as e:
        # A quantity that parses but is negative or too large is not called "not a quantity".
        why = {NOT_A_QUANTITY: "is not a memory quantity (e.g. 512Mi, 1.5Gi, 1073741824)",
               NEGATIVE: f"{NEGATIVE}: a memory quantity is 0 or more"}.get(e.problem, e.problem)
        raise _fail(src, key, value, why) from None


# What the kubelet's parsePercentage (strconv.ParseFloat) takes before the '%'.
_PERCENT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,2})?")


def _bytes_or_percent(src, key, value) -> Reserve:
    if isinstance(value, str) and value.strip().endswith("%"):
        number = value.strip()[:-1]
        if not _PERCENT.fullmatch(number) or len(number) > 40:
            raise _fail(src, key, value, "is not a percentage")
        pct = Fraction(number)
        if not 0 <= pct < 100:
            raise _fail(src, key, value, "must be a percentage in [0%, 100%)")
        return Reserve(fraction=pct / 100)
    return Reserve(bytes=_bytes(src, key, value))


_DURATION = re.compile(r"(?:([0-9]+(?:\.[0-9]+)?)(h|ms|m|s))+")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(h|ms|m|s)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def _duration(src, key, value, minimum=0.05, maximum=86400.0) -> float:
    """Seconds from a number or a Go-style duration ('5s', '1m30s', '500ms')."""
    if isinstance(value, bool):
        raise _fail(src, key, value, "is not a duration (e.g. 5s, 500ms, 1m)")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and _DURATION.fullmatch(value.strip()):
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(value))
    else:
        raise _fail(src, key, value, "is not a duration (e.g. 5s, 500ms, 1m)")
    if not (minimum <= seconds <= maximum):
        raise _fail(src, key, value, f"must be between {minimum}s and {maximum:g}s")
    return seconds


def _cgroup_path(src, key, value) -> str:
    value = _str(src, key, value)
    if not value.startswith("/"):
        raise _fail(src, key, value, "must be an absolute cgroup path (e.g. /kube.slice)")
    return value


def _reserved_cgroup(src, key, value) -> str:
    value = _cgroup_path(src, key, value)
    if not valid_slice_name(value.rstrip("/").rsplit("/", 1)[-1]):
        raise _fail(src, key, value, "must name a systemd slice (its last element must end in .slice, e.g. /kube.slice)")
    return value


# The resources the kubelet lets kubeReserved/systemReserved name (anything else it refuses
# with "cannot reserve"); a typo such as `memroy` must not silently reserve nothing.
_RESERVABLE = ("cpu", "memory", "ephemeral-storage", "pid")
# The kubelet's eviction signals; an unknown one (`memory.availble`) is an error there too.
_EVICTION_SIGNALS = (
    "memory.available", "allocatableMemory.available", "nodefs.available", "nodefs.inodesFree",
    "imagefs.available", "imagefs.inodesFree", "containerfs.available", "containerfs.inodesFree",
    "pid.available",
)


def _resource_list(src, key, value) -> int:
    """kubeReserved/systemReserved: a ResourceList; we use `memory`, others are checked for shape."""
    if not isinstance(value, dict):
        raise _fail(src, key, value, "must be a map of resource name to quantity (e.g. {memory: 1Gi})")
    memory = 0
    for name, q in value.items():
        if name not in _RESERVABLE:
            raise _fail(src, f"{key}.{name}", q, f"is not a reservable resource ({', '.join(_RESERVABLE)})")
        if name == "memory":
            memory = _bytes(src, f"{key}.memory", q)
        else:
            try:
                parse_quantity(q)
            except QuantityError:
                raise _fail(src, f"{key}.{name}", q, "is not a quantity") from None
    return memory


def _eviction_hard(src, key, value) -> Reserve:
    if not isinstance(value, dict):
        raise _fail(src, key, value, "must be a map of signal to threshold (e.g. {memory.available: 100Mi})")
    for name, threshold in value.items():
        if name not in _EVICTION_SIGNALS:
            raise _fail(src, f"{key}.{name}", threshold, f"is not an eviction signal ({', '.join(_EVICTION_SIGNALS)})")
        if not isinstance(threshold, (str, int, float)) or isinstance(threshold, bool):
            raise _fail(src, f"{key}.{name}", threshold, "must be a quantity (e.g. 100Mi) or a percentage in [0%, 100%)")
        _bytes_or_percent(src, f"{key}.{name}", threshold)  # its error says what is allowed
    if "memory.available" not in value:
        # The kubelet drops its defaults for every signal once evictionHard is set.
        return Reserve()
    return _bytes_or_percent(src, f"{key}.memory.available", value["memory.available"])


def _enforce(src, key, value) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _fail(src, key, value, f"must be a list of {', '.join(ENFORCE)}")
    if value in (["none"], ["None"]):
        return ()
    out = []
    for item in value:
        if item not in ENFORCE:
            raise _fail(src, key, item, f"is not one of {', '.join(ENFORCE)} (or 'none' alone)")
        if item not in out:
            out.append(item)
    return tuple(out)


def _factor(src, key, value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(src, key, value, "must be a number in (0, 1], or null for no MemoryHigh")
    if not 0 < value <= 1:
        raise _fail(src, key, value, "is outside (0, 1]")
    return float(value)


def _optional_path(src, key, value) -> str | None:
    if value is None:
        return None
    value = _str(src, key, value)
    if not value.startswith("/"):
        raise _fail(src, key, value, "must be an absolute path")
    if "\0" in value:
        raise _fail(src, key, value, "contains a NUL character")
    try:
        os.fsencode(value)
    except UnicodeEncodeError:
        raise _fail(src, key, value, f"cannot be named in this system's file name encoding"
                                     f" ({sys.getfilesystemencoding()}): rename the file, or run under a UTF-8 locale") from None
    return value


def _listen(src, key, value) -> str | None:
    if value is None or value is False:
        return None
    value = _str(src, key, value)
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise _fail(src, key, value, "must be HOST:PORT (e.g. 127.0.0.1:9759), or null to disable")
    return value


def _kubelet_source(src, key, value) -> KubeletSettings:
    fields = {
        "url": ("url", _url),
        "tokenFile": ("token_file", _optional_path),
        "caFile": ("ca_file", _optional_path),
        "clientCertFile": ("client_cert_file", _optional_path),
        "clientKeyFile": ("client_key_file", _optional_path),
        "insecureSkipTLSVerify": ("insecure_skip_tls_verify", _bool),
        "serverName": ("server_name", _server_name),
        "pollInterval": ("poll_interval", functools.partial(_duration, minimum=0.1)),
        "timeout": ("timeout", functools.partial(_duration, minimum=0.1, maximum=300)),
    }
    result = KubeletSettings(**_map_fields(src, key, value, fields, "must be a map (url, tokenFile, caFile, ...)"))
    if (result.client_cert_file is None) != (result.client_key_file is None):
        raise _fail(src, f"{key}.clientCertFile", result.client_cert_file,
                    "and kubelet.clientKeyFile must be set together")
    return result


def _server_name(src, key, value) -> str | None:
    if value is None:
        return None
    value = _str(src, key, value)
    if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,253}", value):
        raise _fail(src, key, value, "must be a host name or IP address (e.g. node-1), or null")
    return value


def _url(src, key, value) -> str:
    value = _str(src, key, value)
    why = url_problem(value)
    if why is not None:
        raise _fail(src, key, value, why)
    return value


_DNS_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOST_NAME = re.compile(rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*\.?")
_URL_EXAMPLE = "e.g. https://127.0.0.1:10250/pods"


def url_problem(url: str) -> str | None:
    """Why `url` cannot be the kubelet's URL (the words after the value in a config error), or
    None. Checked in full when the config is read, so that nothing later (making the source at
    start or on a reload, `check`, `status`) meets a URL it cannot take apart: scheme, host (a
    name, an IPv4 address, or an IPv6 address in brackets), port range, no credentials, no
    fragment."""
    if not url.isprintable() or any(c.isspace() for c in url):
        return "must not contain spaces or control characters"
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        return f"must be an http:// or https:// URL ({_URL_EXAMPLE})"
    netloc, slash, _ = rest.partition("/")
    for mark in ("?", "#"):
        if mark in netloc:
            netloc = netloc.partition(mark)[0]
    if "#" in rest:
        return "has a fragment (#...), which is never sent to the kubelet: remove it"
    if "@" in netloc:
        return "must not carry a user name or password: use kubelet.tokenFile or kubelet.clientCertFile"
    if netloc.startswith("["):
        m = re.fullmatch(r"\[([^\]]*)\](?::(.*))?", netloc)
        if m is None:
            return "has a '[' without its ']' (an IPv6 address is written in brackets, e.g. https://[::1]:10250/pods)"
        host, port = m.group(1), m.group(2)
        try:
            ipaddress.IPv6Address(host.replace("%25", "%"))
        except ValueError:
            return f"has {host!r} in brackets, which is not an IPv6 address"
    else:
        host, colon, port = netloc.partition(":")
        port = port if colon else None
        if not host:
            return f"has no host ({_URL_EXAMPLE})"
        if "[" in host or "]" in host:
            return "has a bracket in its host (an IPv6 address is written in brackets, e.g. https://[::1]:10250/pods)"
        if not _HOST_NAME.fullmatch(host) or len(host) > 253:
            return f"has {host!r} as its host, which is neither a host name nor an IP address"
        if all(label.isdigit() for label in host.rstrip(".").split(".")):
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                return f"has {host!r} as its host, which is not an IPv4 address"
    if port is not None and not (port.isdigit() and port.isascii() and 0 < int(port) < 65536):
        return f"has the port {port!r}, which is not a number from 1 to 65535"
    return None


def _metrics(src, key, value) -> MetricsConfig:
    if value is None:
        return MetricsConfig(listen=None)
    fields = {"listen": ("listen", _listen), "perPod": ("per_pod", _bool), "perUnit": ("per_unit", _bool)}
    metrics = MetricsConfig(**_map_fields(src, key, value, fields,
                                          "must be a map with 'listen', 'perPod' and 'perUnit', or null to disable"))
    if metrics.per_unit and not metrics.per_pod:
        raise _fail(src, f"{key}.perUnit", True, "adds series to the per-pod ones, which perPod: false turns off;"
                                                 " set one of them, not both")
    return metrics


def _map_fields(src, prefix, value, fields: dict, not_a_map: str) -> dict:
    """A map of the config (`prefix`) as {attribute: checked value}: `fields` is key ->
    (attribute, checker(src, key, value)); `not_a_map` says what it must be when it is no map."""
    if not isinstance(value, dict):
        raise _fail(src, prefix, value, not_a_map)
    out = {}
    for k, v in value.items():
        if k not in fields:
            raise _fail(src, f"{prefix}.{k}", v, f"is not a known key (known: {', '.join(fields)})")
        attr, check = fields[k]
        out[attr] = check(src, f"{prefix}.{k}", v)
    return out


def _best_effort_ceiling(src, key, value) -> CeilingSettings:
    if value is None:
        return CeilingSettings()
    fields = {"enabled": ("enabled", _bool), "headroom": ("headroom", _bytes_or_percent), "minimum": ("minimum", _bytes)}
    out = _map_fields(src, key, value, fields, "must be a map (enabled, headroom, minimum), or null")
    if out.get("minimum", 1 << 20) < 1 << 20:
        raise _fail(src, f"{key}.minimum", value.get("minimum"),
                    "must be at least 1Mi (BestEffort pods need room to start: runc's init runs in their cgroup)")
    return CeilingSettings(**out)


def _switch_block(settings):
    """The checker of a block of `enabled` and `headroom` (burstableHigh, lending): a map of those,
    null (the defaults), or a bare true/false, which YAML 1.1 also reads from on/off/yes/no
    (`burstableHigh: on`: the defaults, turned on)."""
    fields = {"enabled": ("enabled", _bool), "headroom": ("headroom", _bytes_or_percent)}

    def check(src, key, value):
        if value is None:
            return settings()
        if isinstance(value, bool):
            return settings(enabled=value)
        return settings(**_map_fields(src, key, value, fields, "must be a map (enabled, headroom), true/false, or null"))
    return check


_burstable_high = _switch_block(BurstableHighSettings)
_lending = _switch_block(LendingSettings)


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


def parse_config(data: Any, src: str = "config", kubelet_doc: Any = None, kubelet_src: str = "") -> Config:
    """Validate a parsed config document (None or {} means all defaults)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{src}: the config must be a YAML map of keys, got {type(data).__name__}")
    known = {**_PLANNER, **_DAEMON}
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
    for k, v in data.items():
        attr, check = known[k]
        values[attr] = check(src, k, v)
        origins[k] = "config"

    cfg = Config(**values, kubelet_file=kfile, origins=origins)
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


def load_config(path: str | Path | None, *, required: bool = False) -> Config:
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
    cfg = parse_config(data, src, kubelet_doc, kubelet_src)
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
