"""Pod intake: the pods a reconcile may act on, from what the pod source answered.

One object for the service (`run`) and `apply --once`, so both take pods the same way:

* **Acceptance.** A pod source can drop a pod that is still running: a kubelet answering while
  it restarts, a pods file caught mid-write. Acting on that would take the pod's protection away
  while its processes still run. So a pod the previous snapshot had, and whose pod slice systemd
  still runs, keeps its place until the slice is really gone (`carry_over`; the kubelet removes
  the slice once the pod's containers are gone).
* **Memory across restarts.** Right after the daemon itself restarted it has no previous
  snapshot: the pods of the last run's, kept in a runtime file (last_pods.py), stand in for it in
  the first carry_over, and for nothing else. The accepted pods are written there whenever they
  change.
* **Asking.** The daemon asks the source in a worker thread (`PodIntake.fetch`); a failure is
  said once per cause (a failing streak that changes cause, token missing then 401 then 403 as
  the operator fixes things one by one, says each), and the last good snapshot is kept.
* **Holding.** Until a first snapshot is accepted (`Holding.NO_SNAPSHOT`), and while a first
  answer of "no pods" comes with pod slices still running (`Holding.SUSPECT_EMPTY`: believed once
  they are gone), only changes that raise values are sent (reconcile.grow_only).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from pathlib import Path
from typing import Iterable, Sequence

from . import last_pods
from .notify import WarnOnce
from .pods import Pod
from .sources import Snapshot

__all__ = ["Holding", "PodIntake", "carry_over"]

log = logging.getLogger("memqos_systemd")


class Holding(enum.StrEnum):
    """Why only raising values may be sent now."""

    NO_SNAPSHOT = "no pod snapshot yet"
    SUSPECT_EMPTY = "suspect empty pod list"


def carry_over(listed: Sequence[Pod], previous: Sequence[Pod], live_uids: Iterable[str]) -> tuple[list[Pod], list[Pod]]:
    """(pods to plan from, pods carried over): `listed` plus every pod of `previous` that
    `listed` lacks while its pod slice is still live. Pure."""
    live = set(live_uids)
    have = {p.uid for p in listed}
    carried = [p for p in previous if p.uid not in have and p.uid in live]
    return [*listed, *carried], carried


class PodIntake:
    """The last accepted snapshot, and whether we hold. `last_pods_path`: where the pods of the
    last snapshot are kept across restarts (None: not kept); `write=False` reads it only (the
    service's memory, for `apply --once`)."""

    def __init__(self, last_pods_path: Path | None = None, *, write: bool = True):
        self.path = last_pods_path
        self._write = write
        self.snapshot: Snapshot | None = None
        self.holding: Holding | None = Holding.NO_SNAPSHOT
        self._last_run: tuple[Pod, ...] = ()  # the `previous` of the first carry_over only
        self._remembered: tuple[Pod, ...] | None = None  # the pods last written to `path`
        self._remember_failing = False
        self._failure: str | None = None  # the source's last error, while it fails
        self.say = WarnOnce(log)  # each warning of a kind (a rejected pod, a pod carried over) once while it lasts

    @property
    def pods(self) -> tuple[Pod, ...]:
        return self.snapshot.pods if self.snapshot is not None else ()

    def recall(self) -> int:
        """Read the pods of the last run (before the first snapshot); how many there were."""
        if self.path is not None and self.snapshot is None:
            self._last_run = last_pods.read(self.path)
            if self._last_run and self._write:
                log.info("remembered %d pods from the last run (%s): a pod among them the pod source does not"
                         " list at first keeps its protection while its slice runs", len(self._last_run), self.path)
        return len(self._last_run)

    async def fetch(self, source, metrics, *, failing: bool) -> Snapshot | None:
        """Ask `source` (in a worker thread); None when it failed (said once per cause, counted).
        `failing`: the last fetch failed too."""
        try:
            snap = await asyncio.to_thread(source.fetch)
        except Exception as e:  # SourceError, and anything a broken source raises
            metrics.source_error(getattr(e, "kind", type(e).__name__))
            if not failing or str(e) != self._failure:
                kept = (f"holding the last good snapshot ({len(self.pods)} pods)" if self.snapshot is not None
                        else "no snapshot yet: only raising values")
                log.warning("pod source failed: %s; %s", e, kept)
            self._failure = str(e)
            return None
        self._failure = None
        if failing:
            log.info("pod source recovered: %d pods", len(snap.pods))
        self.say("pods", snap.warnings)
        metrics.source_ok(snap)
        return snap

    def accept(self, snap: Snapshot, live_uids: Iterable[str]) -> list[Pod]:
        """Take a good answer of the pod source, given the UIDs of the pod slices systemd runs.
        Returns the pods carried over (listed before, not now, slice still live); a first answer
        of no pods while slices run is not taken (holding SUSPECT_EMPTY) and carries nothing."""
        live = set(live_uids)
        if self.snapshot is None and not snap.pods and live:
            # The first answer says "no pods" while pod slices run: believe it once they are gone.
            if self.holding is not Holding.SUSPECT_EMPTY:
                log.warning("pod source returned 0 pods while %d pod slices exist; only raising values until"
                            " the slices are gone", len(live))
            self.holding = Holding.SUSPECT_EMPTY
            return []
        # Before the first snapshot, the pods of the last run stand in for the previous one: a
        # kubelet that lists only some pods just after our restart takes no protection away.
        pods, carried = carry_over(snap.pods, self.pods if self.snapshot is not None else self._last_run, live)
        self._last_run = ()
        self.snapshot = Snapshot(tuple(pods), snap.warnings, snap.source, snap.fetched_at)
        self.holding = None
        self._remember()
        return carried

    def _remember(self) -> None:
        """Write the snapshot's pods for the next start (last_pods.py) when they have changed.
        Cheap on an unchanged poll: the source hands back the same Pod objects, and a tuple
        compares its items by identity first. A write that fails is tried again at every poll,
        with one warning until it succeeds."""
        if self.path is None or not self._write or self.pods == self._remembered:
            return
        if last_pods.write(self.path, self.pods, warn=not self._remember_failing):
            if self._remember_failing:
                log.info("remembering the pods of this run in %s again", self.path)
            self._remembered = self.pods
            self._remember_failing = False
        else:
            self._remember_failing = True
