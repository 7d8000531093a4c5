"""The pods a reconcile works from: the source's answer, made safe to act on. Pure.

A pod source can drop a pod that is still running: a kubelet answering while it
restarts, a pods file caught mid-write. Acting on that would take the pod's
protection away while its processes still run. So a pod the previous snapshot
had, and whose pod slice systemd still runs, keeps its place until the slice is
really gone (the kubelet removes the slice once the pod's containers are gone).
"""

from __future__ import annotations

from typing import Iterable, Sequence

from .pods import Pod

__all__ = ["carry_over"]


def carry_over(listed: Sequence[Pod], previous: Sequence[Pod], live_uids: Iterable[str]) -> tuple[list[Pod], list[Pod]]:
    """(pods to plan from, pods carried over): `listed` plus every pod of `previous` that
    `listed` lacks while its pod slice is still live."""
    live = set(live_uids)
    have = {p.uid for p in listed}
    carried = [p for p in previous if p.uid not in have and p.uid in live]
    return [*listed, *carried], carried
