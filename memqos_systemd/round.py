"""One reconcile round, the same for `run` and `apply --once`: plan, read once, diff, apply.

    Inputs ──> plan (plan.py, pure) ──> read (observe.py: one frozen Snapshot)
           ──> diff (reconcile.py, pure, against that snapshot) ──> apply (applier.py) ──> Outcome

The daemon runs a round at every step of its loop (daemon.py), `apply --once` runs one (or a dry
run: the calls printed, none sent; commands.py). Both hand it the same things: `Inputs` (the
pods of the intake, the node's facts, the config, whether we hold), the `Observer` whose cache
holds what systemd holds, and the `Applier` that writes. So an operator who tries a config with
`apply --once` gets the round the service runs. The round returns its Outcome and fires no
callback: the writes behind our back its read found wait in the observer (Observer.take_drift).

* **Plan.** `plan` is pure, so the same inputs give the same Plan object again (`Round.plan`): a
  burst of new pod slices brings a round per few signals, all with the same pods, and planning
  them all again was most of the daemon's CPU in a burst, taken from PID 1 on a small node
  (bench/vm_speed.py).
* **Read once what the diff needs.** New units (UnitNew) and started ones (JobRemoved) are read; a
  new pod slice whose cgroup names its run is taken without a read (Observer.adopt_new_pod_slices);
  the units about to be written (a diff on the cached snapshot says which) have their state
  checked in the same call. The read returns the round's one snapshot, and the diff trusts it:
  when the read changed nothing it is the cached snapshot itself, and the diff is not made again.
* **Diff.** Only raising values while holding (reconcile.grow_only; units whose values were not
  read are left alone then), else every change, a container's lowered values sent with its
  raised ones (reconcile.one_write_per_container). Reserved slices the config dropped
  (`retired`) go back to the defaults.
* **Apply.** In the diff's order, siblings together, against the same snapshot; a round stops at
  the first group with a real failure, and the next one finishes the job. What the writer reports
  it wrote goes into the observer's cache (Observer.learn).
* **Features.** Each feature of the table (features.py; the interface: feature.py) lays on the
  plan what to send now (`overlay`), and is told after the apply (`settle`); a round that a
  feature left short of the plan (`pending`) is never `settled` (the daemon's agenda looks again
  when the feature asks).
* **Settled.** Because `plan` is pure and the diff reads only the observer's snapshot (whose
  `generation` counts its changes), a round whose inputs and cache equal those of a round that
  found nothing to send would find nothing either (`Round.settled`): on an idle node a poll that
  brings the same pods costs an HTTP GET and a comparison.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Collection, Mapping, Sequence

from .applier import Applier, ApplyResult, name_changes, summarize
from .config_schema import Config
from .feature import Feature, Given, planned
from .intake import Holding
from .naming import Naming
from .metrics import NoMetrics
from .observe import Observer, Snapshot
from .plan import NodeFacts, Plan, PlanError, UnitPlan, plan
from .pods import Pod
from .reconcile import UNREAD, Change, diff, grow_only, one_write_per_container
from .systemd import SystemdError

__all__ = ["Inputs", "Outcome", "Round", "changes_to_send"]

log = logging.getLogger("memqos_systemd")


@dataclass(frozen=True)
class Inputs:
    """Everything a round's plan and diff are computed from, besides the Applier's cache."""

    pods: tuple[Pod, ...]
    node: NodeFacts
    config: Config
    naming: Naming
    holding: Holding | None = None  # why only raising values may be sent (intake.py); None: not holding
    retired: frozenset[str] = frozenset()  # reserved slices the config no longer names (ledger.py)


@dataclass(frozen=True)
class Outcome:
    """What a round did."""

    plan: Plan
    changes: list[Change]  # what the diff asked to send (all of it, as a dry run)
    held: frozenset[str]  # units whose changes were held back while holding
    result: ApplyResult
    was: Mapping[str, Mapping[str, int] | None] = field(default_factory=dict)  # cached before the writes
    settled: bool = False  # nothing was planned or read: the round's inputs and cache were those of
    #                        a round that found nothing to send

    @property
    def drifted(self) -> int:
        """Units that still differ from the plan: held back, or a write that failed or was not sent."""
        done = {c.unit for c in self.result.applied} | {c.unit for c in self.result.vanished}
        return len(self.held | ({c.unit for c in self.changes} - done))

    def held_note(self, holding: Holding) -> list[str]:
        """What holding kept back, for the journal: one line, or none."""
        return [f"holding ({holding}): changes of {len(self.held)} unit(s) that would lower a protection or move a"
                f" MemoryHigh not sent"] if self.held else []

    def status(self, inputs: Inputs) -> str:
        """The service's status line (STATUS=, and `ready:` in the journal) after this round."""
        node = self.plan.node_unit()
        return (f"{len(inputs.pods)} pods, kubepods min {node.memory_min} low {node.memory_low}"
                + (f", holding: {inputs.holding}" if inputs.holding else ""))

    def summary(self) -> str:
        """One line: what was applied (unit, property, old -> new), what had gone, where it stopped."""
        return summarize(self.result, name_changes(self.result.applied, self.was))


def changes_to_send(desired: Plan, observed: Mapping[str, Mapping[str, int] | None], naming: Naming, *,
                    holding: Holding | None, retired: frozenset[str] = frozenset(),
                    lost: Mapping[str, Mapping[str, int]] = MappingProxyType({})) -> tuple[list[Change], frozenset[str]]:
    """The changes to send (only raising ones while holding), and the units held back; `lost`: what
    the units' cgroups show below what systemd holds (Observer.lost), set again. Pure."""
    if holding is not None:
        # Values not read cannot be compared: such units are left as they are while holding.
        observed = {n: (None if v is UNREAD else v) for n, v in observed.items()}
    changes = diff(desired, observed, naming, retired=retired, lost=lost)
    if holding is None:
        return one_write_per_container(changes), frozenset()
    sent = grow_only(changes)
    whole = {(c.unit, c.direction, tuple(c.props.items())) for c in sent}
    return sent, frozenset(c.unit for c in changes if (c.unit, c.direction, tuple(c.props.items())) not in whole)


class Round:
    """The rounds of one daemon (or the one of `apply --once`). Remembers the last plan, the last
    round that found nothing to send, and reports each round to `metrics` (metrics.py; NoMetrics
    for `apply --once`) and, when it sends something, to the journal."""

    def __init__(self, metrics=None, clock: Callable[[], float] = time.monotonic,
                 features: Sequence[Feature] = ()) -> None:
        self.metrics = metrics if metrics is not None else NoMetrics()
        self._clock = clock
        self.features = tuple(features)  # laid on the plan (features.py); none: the plan as it is
        self._planned: tuple[tuple, Plan, dict[str, UnitPlan]] | None = None  # (what it is made of, plan, by unit)
        self._settled: tuple | None = None  # (inputs, observer, generation) of the last round that sent nothing
        self._shown: Plan | None = None  # the plan the metrics show
        self._diffed: tuple | None = None  # (desired, snapshot, the rest, its diff): see _diff

    def plan(self, inputs: Inputs) -> Plan:
        """The plan of `inputs` (PlanError when it cannot be made); the same object while they are
        unchanged."""
        key = (inputs.pods, inputs.node, inputs.config, inputs.naming)
        if self._planned is None or self._planned[0] != key:
            desired = planned(self.features, plan(list(inputs.pods), inputs.node, inputs.config),
                              Given(tuple(inputs.pods), inputs.node, inputs.config, inputs.naming))
            self._planned = (key, desired, desired.by_unit())
        return self._planned[1]

    @property
    def last_plan(self) -> Plan | None:
        return self._planned[1] if self._planned is not None else None

    def names(self, unit: str) -> bool:
        """Whether the last plan names `unit` (True while there is no plan yet)."""
        return self._planned is None or unit in self._planned[2]

    @property
    def planned_units(self) -> Mapping[str, UnitPlan]:
        return self._planned[2] if self._planned is not None else {}

    async def run(self, inputs: Inputs, observer: Observer, applier: Applier, *, new: Collection[str] = (),
                  started: Collection[str] = (), sure: Callable[[], bool] = lambda: True,
                  put_back: Callable[[set[str], set[str]], None] = lambda new, started: None,
                  dry_run: bool = False, echo: Callable[[str], None] | None = None) -> Outcome | None:
        """Plan `inputs`, read once what the round needs (one snapshot), diff it, apply.

        `new` and `started`: units announced since the last round (UnitNew, JobRemoved), read here;
        those this round did not read are handed to `put_back` (the daemon's agenda) when it stops
        early. `sure()`: whether the snapshot can still be trusted after the reads (the daemon's
        agenda: False while systemd reloads); when it cannot, nothing is sent and None is
        returned. Raises PlanError (nothing read, nothing sent) and SystemdError when a read fails
        (nothing sent); a write that fails is in the Outcome (`result.ok`). Writes found behind our
        back by the read are kept by the observer (Observer.take_drift): the round fires no callback."""
        began = self._clock()
        new, started = set(new), set(started)
        if not new and not started and self._settled == (inputs, observer, observer.generation) \
                and not any(f.pending for f in self.features):  # (a feature's look come due)
            # Compared with ==: the same objects compare at once (the pod source hands back the
            # same pods while its document is unchanged), others by value.
            self.metrics.observe_reconcile(self._clock() - began, 0)
            return Outcome(self.plan(inputs), [], frozenset(), ApplyResult(), settled=True)
        self._settled = None
        try:
            planned = self.plan(inputs)
        except PlanError:
            put_back(new, started)
            raise
        if observer.cgroupfs is not None:
            observer.cgroupfs.place(planned.cgroup_paths)  # where its container scopes are
        if inputs.holding is None:
            taken = observer.adopt_new_pod_slices(new, started)
            new, started = new - taken, started - taken
        cached = observer.snapshot()
        desired = self._desired(planned, inputs, cached)
        snap = await self._read(desired, inputs, observer, cached, new, started, put_back)
        if not sure():
            # Since the reads began (a daemon-reload announces every unit removed, then new): a
            # reserved slice, which the diff may create, was written with what systemd already
            # held (e2e 40-survival). Drop the round; the full re-read decides.
            put_back(new, started)
            return None
        changes, held = self._diff(desired, inputs, snap)
        observer.writes_out(c.unit for c in changes)
        try:
            result = await applier.apply(changes, snap, dry_run=dry_run, echo=echo)
        finally:
            observer.writes_out(())
        observer.learn(result)
        if not changes and observer.generation == snap.generation and not any(f.pending for f in self.features):
            # Nothing to send, and the cache did not change while the round awaited (nor did a
            # feature stop short of the plan: it looks again).
            self._settled = (inputs, observer, snap.generation)
        if not dry_run:
            held_now = observer.snapshot().held
            for feature in self.features:
                feature.settle(held_now, desired)
        outcome = Outcome(desired, changes, held, result, {c.unit: snap.held.get(c.unit) for c in changes})
        if changes and not dry_run:
            log.info("reconcile: %s", outcome.summary())
        if self._shown is not planned:
            self.metrics.set_plan(planned, observer.cgroupfs, inputs.config.metrics)
            self._shown = planned
        self.metrics.round_state(outcome.drifted, inputs.holding is not None)
        self.metrics.observe_reconcile(self._clock() - began, len(result.applied))
        return outcome

    async def _read(self, desired: Plan, inputs: Inputs, observer: Observer, cached: Snapshot, new: set[str],
                    started: set[str], put_back: Callable[[set[str], set[str]], None]) -> Snapshot:
        """The round's one read, as a snapshot. The units `desired` would write (a diff on what is
        `cached` says which) have their state checked, in the same call as the new units' read. A
        started unit (JobRemoved) whose properties are cached needs nothing else: a start job does
        not change them, and its state matters only if it is to be written. One that was not
        running when read at UnitNew has been forgotten: read it in full. Nothing to read: the
        cached snapshot itself, and the diff is not made again."""
        writes = {c.unit for c in self._diff(desired, inputs, cached)[0]
                  if c.must_exist and c.unit not in cached.runs
                  and (observer.cgroupfs is None or observer.cgroupfs.run_of(c.unit) is None)}
        again = {u for u in started if cached.held.get(u) is None}
        try:
            return await observer.read(new | again, writes)
        except SystemdError:
            put_back(new, started)  # read them again after the retry
            raise

    def _desired(self, planned: Plan, inputs: Inputs, snap: Snapshot) -> Plan:
        """The plan with what each feature sends now laid on it (a new Plan at each step of a
        feature; where the cgroups are and what the metrics show do not depend on it, so they
        follow `planned`, made once per inputs)."""
        desired = planned
        for feature in self.features:
            desired = feature.overlay(desired, snap.held, inputs.config, inputs.naming)
        return desired

    def _diff(self, desired: Plan, inputs: Inputs, snap: Snapshot) -> tuple[list[Change], frozenset[str]]:
        """The diff of `desired` against `snap`, the same lists while both are the same objects (a
        round whose read changed nothing diffs once)."""
        key = (inputs.holding, inputs.retired, inputs.naming)
        if (self._diffed is None or self._diffed[0] is not desired or self._diffed[1] is not snap
                or self._diffed[2] != key):
            self._diffed = (desired, snap, key, changes_to_send(desired, snap.held, inputs.naming,
                                                                holding=inputs.holding, retired=inputs.retired,
                                                                lost=snap.lost))
        return self._diffed[3]
