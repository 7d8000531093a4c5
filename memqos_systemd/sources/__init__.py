"""Where pods come from: the kubelet's `/pods` endpoint, or a static `podsFile`.

Every source has one blocking method, `fetch() -> Snapshot`, which the daemon runs
in a thread. It either returns a snapshot it trusts or raises `SourceError`; it
never returns a half-trusted one. What "trusted" means here:

* the document was read in full, within the size cap (`MAX_RESPONSE_BYTES`),
  and parsed as JSON (or YAML for files) into a pod list (`pods.parse_pods`);
* individually bad pods are dropped and reported in `Snapshot.warnings`;
* a list in which no pod could be used while some item was rejected is an
  error, not an empty node: the daemon keeps its last good snapshot rather than
  lower every protection because the input was garbage.

`SourceError` messages are one line that names the source and what went wrong,
and carry a short `kind` for metrics (`metrics.Metrics.source_error(e.kind)`).
They never contain a bearer token.
"""

from __future__ import annotations

from typing import Callable

from ..config_schema import Config
from ..kubelet_gate import Gate, memory_qos_gate, parse_kubelet_metrics, qos_reserved
from .file import FileSource
from .kubelet import KubeletSource
from .snapshot import ERROR_KINDS, MAX_RESPONSE_BYTES, Snapshot, SourceError, snapshot_from_doc

__all__ = [
    "Snapshot", "SourceError", "MAX_RESPONSE_BYTES", "ERROR_KINDS", "snapshot_from_doc", "make_source",
    "KubeletSource", "FileSource", "kubelet_gates",
]


def make_source(config: Config, *, clock: Callable[[], float] | None = None):
    """The one active source: `podsFile` when set, else the kubelet."""
    kwargs = {} if clock is None else {"clock": clock}
    if config.pods_file:
        return FileSource(config.pods_file, **kwargs)
    return KubeletSource(config.kubelet, **kwargs)


def kubelet_gates(cfg: Config, source=None, *, ask: bool = True,
                  pods_failed: bool = False) -> tuple[Gate, Gate, str | None]:
    """The kubelet's own Memory QoS gate and its QOSReserved, and how we know (kubelet_gate.py),
    asking its /metrics once (through `source`, the daemon's, or one made from `cfg`) when the pod
    source is the kubelet (and `ask`: not one the service's sandbox keeps it from); (Memory QoS
    gate, QOSReserved, why the kubelet's /metrics did not say). `pods_failed`: /pods did not answer
    either, whose error check names once. Blocking: the daemon runs it in a thread."""
    gates, version = {}, None
    unasked = ("the pod source is a file" if cfg.pods_file else
               None if ask else "not asked: the service's sandbox keeps it from kubelet.url (see pods)")
    if unasked is None:
        source = source if source is not None else KubeletSource(cfg.kubelet)
        metrics_text = getattr(source, "metrics_text", None)
        name = getattr(source, "metrics_name", "the kubelet's /metrics")
        if metrics_text is None:
            unasked = "the pod source does not serve the kubelet's /metrics"
        else:
            try:
                gates, version = parse_kubelet_metrics(metrics_text())
            except SourceError as e:  # it names the /metrics URL, and for a 403 the RBAC rule
                # When /pods failed too, the pods line says why: the kubelet's error is named once.
                unasked = f"{name} did not answer either: see pods" if pods_failed else str(e)
            else:
                if gates.get("MemoryQoS") is None:
                    unasked = (f"{name} lists no MemoryQoS gate" if gates else
                               f"{name} answered, but not with the kubelet's metrics (no"
                               f" kubernetes_feature_enabled line): is kubelet.url the kubelet's?")
    gate = memory_qos_gate(reported=gates.get("MemoryQoS"), version=version, configured=cfg.kubelet_memory_qos_gate,
                           config_file=cfg.kubelet_config_file)
    reserved = qos_reserved(reported=gates.get("QOSReserved"), configured=cfg.kubelet_qos_reserved_gate,
                            memory=cfg.kubelet_qos_reserved_memory, config_file=cfg.kubelet_config_file)
    return gate, reserved, unasked
