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

import json
from dataclasses import dataclass

from ..config import kubelet_file
from ..config_schema import Config, KubeletFile
from ..kubelet_gate import Gate, KubeletFacts, KubeletMetrics, kubelet_facts, parse_kubelet_metrics, qos_reserved
from .file import FileSource
from .kubelet import KubeletSource
from .snapshot import ERROR_KINDS, MAX_RESPONSE_BYTES, Snapshot, SourceError, snapshot_from_doc

__all__ = [
    "Snapshot", "SourceError", "MAX_RESPONSE_BYTES", "ERROR_KINDS", "snapshot_from_doc", "make_source",
    "KubeletSource", "FileSource", "kubelet_gates", "ask_kubelet", "facts_of", "Answers",
]


def make_source(config: Config, *, clock: Callable[[], float] | None = None):
    """The one active source: `podsFile` when set, else the kubelet."""
    kwargs = {} if clock is None else {"clock": clock}
    if config.pods_file:
        return FileSource(config.pods_file, **kwargs)
    return KubeletSource(config.kubelet, **kwargs)


@dataclass(frozen=True)
class Answers:
    """What the running kubelet answered of itself: its /metrics (its gates, its version) and its
    /configz (the configuration it runs), and why not when it did not."""

    metrics: KubeletMetrics | None = None
    configz: KubeletFile | None = None
    unasked: str | None = None  # why /metrics was not asked, or did not answer
    configz_why: str | None = None  # why /configz did not answer
    metrics_how: str = "the kubelet's /metrics"
    # /metrics did not answer for now (refused, timed out: a kubelet that has just started); an
    # answer that says no (a 403, a 404, not its metrics) will say the same if asked again.
    transient: bool = False

    @property
    def answered(self) -> bool:
        return self.metrics is not None or self.configz is not None


def ask_kubelet(cfg: Config, source=None, *, ask: bool = True, pods_failed: bool = False) -> Answers:
    """Ask the kubelet's /metrics and /configz once each (through `source`, the daemon's, or one
    made from `cfg`) when the pod source is the kubelet (and `ask`: not one the service's sandbox
    keeps it from). `pods_failed`: /pods did not answer either, whose error check names once.
    Blocking: the daemon runs it in a thread."""
    if cfg.pods_file:
        return Answers(unasked="the pod source is a file")
    if not ask:
        return Answers(unasked="not asked: the service's sandbox keeps it from kubelet.url (see pods)")
    source = source if source is not None else KubeletSource(cfg.kubelet)
    metrics_text = getattr(source, "metrics_text", None)
    name = getattr(source, "metrics_name", "the kubelet's /metrics")
    if metrics_text is None:
        return Answers(unasked="the pod source does not serve the kubelet's /metrics")
    metrics, unasked, transient = None, None, False
    try:
        metrics = parse_kubelet_metrics(metrics_text())
    except SourceError as e:  # it names the /metrics URL, and for a 403 the RBAC rule
        # When /pods failed too, the pods line says why: the kubelet's error is named once.
        unasked = f"{name} did not answer either: see pods" if pods_failed else str(e)
        transient = e.kind in ("connect", "timeout")
    else:
        if not metrics.gates and not metrics.unknown:
            unasked = (f"{name} answered, but not with the kubelet's metrics (no kubernetes_feature_enabled line):"
                       f" is kubelet.url the kubelet's?")
            metrics = None
    configz, configz_why = None, None
    configz_text = getattr(source, "configz_text", None)
    if configz_text is not None and not (pods_failed and metrics is None):
        zname = getattr(source, "configz_name", "the kubelet's /configz")
        try:
            doc = json.loads(configz_text())
        except SourceError as e:
            configz_why = str(e)
        except ValueError:
            configz_why = f"{zname}: not JSON"
        else:
            if isinstance(doc, dict) and isinstance(doc.get("kubeletconfig"), dict):
                configz = kubelet_file(doc["kubeletconfig"], zname)
            else:
                configz_why = f"{zname}: no kubeletconfig in its answer"
    return Answers(metrics, configz, unasked, configz_why, name, transient)


def facts_of(cfg: Config, answers: Answers, *, file: KubeletFile | None | bool = True,
             stale: bool = False, version: str | None = None) -> tuple[KubeletFacts, Gate]:
    """The kubelet's configuration (kubelet_gate.kubelet_facts) and its QOSReserved, from what it
    answered and its config file (`file`; True: the one read with `cfg`). `version`: the one it
    last reported, when what it answered now does not say."""
    kfile = cfg.kubelet_file if file is True else (file or None)
    facts = kubelet_facts(metrics=answers.metrics, metrics_how=answers.metrics_how, configz=answers.configz,
                          file=kfile, stale=stale, unasked=answers.unasked, version=version)
    reported = answers.metrics.gate("QOSReserved")[0] if answers.metrics is not None else None
    said = answers.configz if answers.configz is not None and not stale else kfile
    reserved = qos_reserved(reported=reported, configured=said.gate("QOSReserved") if said else None,
                            memory=said.qos_reserved_memory if said else None,
                            config_file=said.source if said else None)
    return facts, reserved


def kubelet_gates(cfg: Config, source=None, *, ask: bool = True,
                  pods_failed: bool = False) -> tuple[KubeletFacts, Gate, Answers]:
    """The kubelet's configuration as far as it decides what it writes, its QOSReserved, and what
    it answered (ask_kubelet, then facts_of). Blocking."""
    answers = ask_kubelet(cfg, source, ask=ask, pods_failed=pods_failed)
    return (*facts_of(cfg, answers), answers)
