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

from ..config import Config
from .file import FileSource
from .kubelet import KubeletSource
from .snapshot import ERROR_KINDS, MAX_RESPONSE_BYTES, Snapshot, SourceError, snapshot_from_doc

__all__ = [
    "Snapshot", "SourceError", "MAX_RESPONSE_BYTES", "ERROR_KINDS", "snapshot_from_doc", "make_source",
    "KubeletSource", "FileSource",
]


def make_source(config: Config, *, clock: Callable[[], float] | None = None):
    """The one active source: `podsFile` when set, else the kubelet."""
    kwargs = {} if clock is None else {"clock": clock}
    if config.pods_file:
        return FileSource(config.pods_file, **kwargs)
    return KubeletSource(config.kubelet, **kwargs)
