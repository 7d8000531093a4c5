"""A pod source's answer, and its failures: what every source (file.py, kubelet.py) returns or
raises (see the package's docstring for what a snapshot promises)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..pods import Pod, PodsError, parse_pods

__all__ = ["Snapshot", "SourceError", "MAX_RESPONSE_BYTES", "ERROR_KINDS", "snapshot_from_doc"]

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
