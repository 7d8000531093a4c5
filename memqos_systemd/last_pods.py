"""The pods of the last good snapshot, remembered in a runtime file across daemon restarts.

A pod the pod source stops listing while its pod slice still runs keeps its place
(intake.carry_over), which needs the pods the daemon last worked from. After the daemon itself
restarts (systemctl restart, a crash, an upgrade) it has none, and a kubelet that lists only some
pods at that moment (itself mid-restart) would have the unlisted pods' slices reset while their
processes run. So the daemon writes its snapshot's pods here whenever they change, and at start
reads them back as the `previous` of its first carry_over, and for nothing else: a pod from this
file is planned only while its slice is live and the pod source does not list it.

The file lives next to the reserved-slice ledger (ledger.py), in the unit's RuntimeDirectory:
kept when the service stops, gone at reboot, like the pod slices it describes.

JSON: {"version": 1, "pods": [{Pod's fields, "containers": [{Container's fields}, ...]}, ...]}.
A missing file remembers nothing. A file that cannot be read, is larger than the cap, is not
JSON, has another version, or holds a single pod or field of the wrong shape is ignored as a
whole, with one warning that names the path and why: never half a list.
"""

from __future__ import annotations

import json
import logging
from dataclasses import fields
from pathlib import Path
from typing import Any, Sequence

from . import runfile
from .pods import MAX_CONTAINERS, MAX_PODS, QOS_CLASSES, Container, Pod, one_line
from .quantity import MAX_BYTES as MAX_QUANTITY

__all__ = ["DEFAULT_PATH", "VERSION", "MAX_BYTES", "read", "write", "encode"]

log = logging.getLogger("memqos_systemd")

DEFAULT_PATH = Path("/run/memqos-systemd/last-pods.json")
VERSION = 1
# About 250 bytes for a pod of one container: some 16,000 such pods, far more than a node runs.
MAX_BYTES = 4 * 2**20

_KINDS = ("app", "init", "sidecar")
# A remembered pod only keeps its place while its slice runs, with the values it had: whether a
# resize of it was pending then is of no use, and leaving it out keeps the file of VERSION 1 the
# same for daemons before and after that field.
_NOT_KEPT = ("resize_pending",)
_POD_FIELDS = tuple(f.name for f in fields(Pod) if f.name not in _NOT_KEPT)
_CONTAINER_FIELDS = tuple(f.name for f in fields(Container))


class _Bad(ValueError):
    pass


def encode(pods: Sequence[Pod]) -> bytes:
    """The file's content for `pods`: every field of Pod and Container, nothing else."""
    doc = {"version": VERSION, "pods": [
        {**{name: getattr(p, name) for name in _POD_FIELDS if name != "containers"},
         "containers": [{name: getattr(c, name) for name in _CONTAINER_FIELDS} for c in p.containers]}
        for p in pods]}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def read(path: Path) -> tuple[Pod, ...]:
    """The pods remembered at `path`; none when there is no file, or (with a warning) no usable one."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return ()
    except OSError as e:
        log.warning("cannot read the pods of the last run from %s: %s; none remembered", path, e.strerror or e)
        return ()
    if len(data) > MAX_BYTES:
        log.warning("the pods of the last run in %s: larger than %d bytes: ignored", path, MAX_BYTES)
        return ()
    try:
        return _decode(data)
    except _Bad as e:
        log.warning("the pods of the last run in %s: %s: ignored", path, e)
        return ()


def write(path: Path, pods: Sequence[Pod], *, warn: bool = True) -> bool:
    """Replace the file at `path` with `pods` (atomically); False if it cannot (with a warning
    unless `warn` is false). Too many pods for the cap: the old file is removed, not left stale."""
    data = encode(pods)
    if len(data) > MAX_BYTES:
        if warn:
            log.warning("cannot remember the pods of this run in %s: %d pods take more than %d bytes",
                        path, len(pods), MAX_BYTES)
        try:
            path.unlink()
        except OSError:
            pass
        return False
    try:
        runfile.replace(path, data, 0o600)
    except OSError as e:
        if warn:
            log.warning("cannot remember the pods of this run in %s: %s", path, e.strerror or e)
        return False
    return True


def _decode(data: bytes) -> tuple[Pod, ...]:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise _Bad(f"not JSON ({type(e).__name__})") from None
    if not isinstance(doc, dict) or "version" not in doc:
        raise _Bad("not a pods file of this service (no version)")
    if type(doc["version"]) is not int or doc["version"] != VERSION:
        raise _Bad(f"version {_short(doc['version'])}, this version reads {VERSION}")
    if set(doc) != {"version", "pods"} or not isinstance(doc["pods"], list):
        raise _Bad("expected exactly 'version' and a list of 'pods'")
    if len(doc["pods"]) > MAX_PODS:
        raise _Bad(f"more than {MAX_PODS} pods")
    pods = tuple(_pod(p, i) for i, p in enumerate(doc["pods"]))
    if len({p.uid for p in pods}) != len(pods):
        raise _Bad("a pod UID appears twice")
    return pods


def _pod(obj: Any, i: int) -> Pod:
    where = f"pods[{i}]"
    _fields(obj, _POD_FIELDS, where)
    containers = obj["containers"]
    if not isinstance(containers, list) or len(containers) > MAX_CONTAINERS:
        raise _Bad(f"{where}.containers: expected a list of at most {MAX_CONTAINERS}")
    for name in ("uid", "namespace", "name", "qos"):
        _str(obj[name], f"{where}.{name}")
    if not obj["uid"]:
        raise _Bad(f"{where}.uid: empty")
    if obj["qos"] not in QOS_CLASSES:
        raise _Bad(f"{where}.qos: {_short(obj['qos'])} is not a QoS class")
    _bytes(obj["overhead"], f"{where}.overhead")
    for name in ("pod_request", "pod_limit"):
        if obj[name] is not None:
            _bytes(obj[name], f"{where}.{name}")
    return Pod(uid=obj["uid"], namespace=obj["namespace"], name=obj["name"], qos=obj["qos"],
               containers=tuple(_container(c, f"{where}.containers[{j}]") for j, c in enumerate(containers)),
               overhead=obj["overhead"], pod_request=obj["pod_request"], pod_limit=obj["pod_limit"])


def _container(obj: Any, where: str) -> Container:
    _fields(obj, _CONTAINER_FIELDS, where)
    _str(obj["name"], f"{where}.name")
    if obj["kind"] not in _KINDS:
        raise _Bad(f"{where}.kind: {_short(obj['kind'])} is not one of {', '.join(_KINDS)}")
    _bytes(obj["request"], f"{where}.request")
    if obj["limit"] is not None:
        _bytes(obj["limit"], f"{where}.limit")
    if obj["container_id"] is not None:
        _str(obj["container_id"], f"{where}.container_id")
    return Container(name=obj["name"], kind=obj["kind"], request=obj["request"], limit=obj["limit"],
                     container_id=obj["container_id"])


def _fields(obj: Any, names: tuple[str, ...], where: str) -> None:
    if not isinstance(obj, dict):
        raise _Bad(f"{where}: expected a map, got {type(obj).__name__}")
    if set(obj) != set(names):
        missing, extra = sorted(set(names) - set(obj)), sorted(set(obj) - set(names))
        raise _Bad(f"{where}: " + "; ".join(
            ([f"missing {', '.join(missing)}"] if missing else [])
            + ([f"unknown {_short(', '.join(map(str, extra)))}"] if extra else [])))


def _str(value: Any, where: str) -> None:
    if not isinstance(value, str):
        raise _Bad(f"{where}: expected a string, got {type(value).__name__}")


def _bytes(value: Any, where: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_QUANTITY:
        raise _Bad(f"{where}: expected a byte count, got {_short(value)}")


def _short(value: Any) -> str:
    return one_line(repr(value), 60)
