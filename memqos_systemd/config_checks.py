"""The config's field checkers: each takes (source, key, value) and returns the checked value, or
raises a ConfigError naming the key and the value in one line (config.py's tables use them)."""

from __future__ import annotations

import functools
import ipaddress
import math
import os
import re
import sys
from fractions import Fraction
from typing import Any

import yaml

from .config_schema import (COMPANION_SETTINGS, ENFORCE, POLICIES, BurstableHighSettings, CeilingSettings,
                            ConfigError, KubeletSettings, LendingSettings, MetricsConfig, Reserve)
from .naming import valid_slice_name
from .quantity import NEGATIVE, NOT_A_QUANTITY, QuantityError, parse_quantity, parse_whole_bytes


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
