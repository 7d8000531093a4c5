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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from ..pods import Pod, PodsError, parse_pods

if TYPE_CHECKING:
    from ..config import Config

__all__ = [
    "Snapshot", "SourceError", "MAX_RESPONSE_BYTES", "ERROR_KINDS", "snapshot_from_doc", "make_source",
    "KubeletSource", "FileSource",
]

# A node's pod list is a few MB at most; more is garbage or an attack on the parser.
MAX_RESPONSE_BYTES = 10 * 2**20

# SourceError.kind values (label values for the source error counter).
ERROR_KINDS = (
    "connect",   # refused, unreachable, reset
    "timeout",   # no answer (or no complete answer) within the timeout
    "tls",       # certificate verification or handshake failed
    "auth",      # token / client certificate / key file unusable (mode, missing, unreadable)
    "http",      # status other than 200, or a broken HTTP exchange
    "too_large", # body over MAX_RESPONSE_BYTES
    "decode",    # not JSON / YAML
    "pods",      # JSON that is not a pod list, or a list of nothing but bad pods
    "io",        # a local file could not be read
)


class SourceError(Exception):
    """A fetch that produced nothing trustworthy. `str(e)` is one line naming the source."""

    def __init__(self, message: str, kind: str = "io"):
        super().__init__(" ".join(message.split()))
        self.kind = kind


@dataclass(frozen=True)
class Snapshot:
    pods: tuple[Pod, ...]
    warnings: tuple[str, ...]
    source: str  # e.g. "kubelet https://127.0.0.1:10250/pods", "file /etc/memqos-systemd/pods.yaml"
    fetched_at: float  # the source's clock (time.monotonic unless injected) when it was read


def snapshot_from_doc(doc: Any, source: str, fetched_at: float) -> Snapshot:
    """Parse a decoded document into a Snapshot, or raise SourceError (kind "pods")."""
    try:
        pods, warnings = parse_pods(doc)
    except PodsError as e:
        raise SourceError(f"{source}: not a pod list: {e}", "pods") from None
    except RecursionError:
        raise SourceError(f"{source}: not a pod list: nested too deeply", "pods") from None
    # Nothing usable while something was rejected: garbage, not an empty node. (Finished
    # pods are skipped without a warning, and a duplicate UID is only reported once its
    # first copy was kept, so "no pods and some warnings" means every live item was bad.)
    if not pods and warnings:
        first = warnings[0]
        more = f" (and {len(warnings) - 1} more)" if len(warnings) > 1 else ""
        raise SourceError(f"{source}: every pod in the list was rejected: {first}{more}", "pods")
    return Snapshot(pods=tuple(pods), warnings=tuple(warnings), source=source, fetched_at=fetched_at)


def make_source(config: "Config", *, clock: Callable[[], float] | None = None):
    """The one active source: `podsFile` when set, else the kubelet."""
    kwargs = {} if clock is None else {"clock": clock}
    if config.pods_file:
        return FileSource(config.pods_file, **kwargs)
    return KubeletSource(config.kubelet, **kwargs)


# Imported last: both modules use Snapshot / SourceError from above.
from .file import FileSource  # noqa: E402
from .kubelet import KubeletSource  # noqa: E402
