"""One reconcile round, the same for `run` and `apply --once`: plan, diff, apply.

    Inputs ──> plan (plan.py, pure) ──> diff (reconcile.py, pure) ──> apply (applier.py)

The daemon runs a round at every step of its loop (daemon.py), `apply --once` runs one (or a dry
run: the calls printed, none sent; commands.py). Both hand it the same things: `Inputs` (the
pods of the intake, the node's facts, the config, whether we hold) and an `Applier` whose cache
holds what systemd holds. So an operator who tries a config with `apply --once` gets the round the
service runs.

* **Plan.** `plan` is pure, so the same inputs give the same Plan object again (`Round.plan`): a
  burst of new pod slices brings a round per few signals, all with the same pods, and planning
  them all again was most of the daemon's CPU in a burst, taken from PID 1 on a small node
  (bench/vm_speed.py).
* **Read what the diff needs.** New units (UnitNew) and started ones (JobRemoved) are read; a new
  pod slice whose cgroup names its run is taken without a read (Applier.adopt_new_pod_slices);
  the units about to be written have their state checked in the same call.
* **Diff.** Only raising values while holding (reconcile.grow_only; units whose values were not
  read are left alone then), else every change, a container's lowered values sent with its
  raised ones (reconcile.one_write_per_container). Reserved slices the config dropped
  (`retired`) go back to the defaults.
* **Apply.** In the diff's order, siblings together; a round stops at the first group with a
  real failure, and the next one finishes the job.
* **Features.** Each feature of the table (features.py; the interface: feature.py) lays on the
  plan what to send now (`overlay`), and is told after the apply (`settle`); a round that a
  feature left short of the plan (`pending`) is never `settled` (the daemon's agenda looks again
  when the feature asks).
* **Settled.** Because `plan` is pure and the diff reads only the Applier's cache (whose
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
from .feature import Feature
from .intake import Holding
from .naming import Naming
from .metrics import NoMetrics
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
    the units' cgroups show below what systemd holds (Applier.lost), set again. Pure."""
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
        self._settled: tuple | None = None  # (inputs, applier, generation) of the last round that sent nothing
        self._shown: Plan | None = None  # the plan the metrics show

    def plan(self, inputs: Inputs) -> Plan:
        """The plan of `inputs` (PlanError when it cannot be made); the same object while they are
        unchanged."""
        key = (inputs.pods, inputs.node, inputs.config, inputs.naming)
        if self._planned is None or self._planned[0] != key:
            desired = plan(list(inputs.pods), inputs.node, inputs.config)
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

    async def run(self, inputs: Inputs, applier: Applier, *, new: Collection[str] = (), started: Collection[str] = (),
                  sure: Callable[[], bool] = lambda: True,
                  put_back: Callable[[set[str], set[str]], None] = lambda new, started: None,
                  dry_run: bool = False, echo: Callable[[str], None] | None = None) -> Outcome | None:
        """Plan `inputs`, read what the round needs, diff, apply.

        `new` and `started`: units announced since the last round (UnitNew, JobRemoved), read here;
        those this round did not read are handed to `put_back` (the daemon's agenda) when it stops
        early. `sure()`: whether the cache can still be trusted after the reads (the daemon's
        agenda: False while systemd reloads); when it cannot, nothing is sent and None is
        returned. Raises PlanError (nothing read, nothing sent) and SystemdError when a read fails
        (nothing sent); a write that fails is in the Outcome (`result.ok`)."""
        began = self._clock()
        new, started = set(new), set(started)
        if not new and not started and self._settled == (inputs, applier, applier.generation):
            # Compared with ==: the same objects compare at once (the pod source hands back the
            # same pods while its document is unchanged), others by value.
            self.metrics.observe_reconcile(self._clock() - began, 0)
            return Outcome(self.plan(inputs), [], frozenset(), ApplyResult(), settled=True)
        self._settled = None
        try:
            planned = desired = self.plan(inputs)
        except PlanError:
            put_back(new, started)
            raise
        for feature in self.features:
            # A new Plan at each step of a feature; where the cgroups are and what the metrics
            # show do not depend on it, so they follow `planned` (made once per inputs).
            desired = feature.overlay(desired, applier.observed, inputs.config, inputs.naming)
        if applier.cgroupfs is not None:
            applier.cgroupfs.place(planned)  # where its container scopes are
        if inputs.holding is None:
            taken = applier.adopt_new_pod_slices(new, started)
            new, started = new - taken, started - taken
        # The units this round will write need their state checked before the write: a diff on
        # what is cached says which, and their states come in the same call as the new units'.
        # A started unit (JobRemoved) whose properties are cached needs nothing else: a start job
        # does not change them, and its state matters only if it is to be written. One that was
        # not running when read at UnitNew has been forgotten: read it in full.
        before = self._diff(desired, inputs, applier)
        writes = {c.unit for c in before[0] if c.must_exist and c.unit not in applier.runs
                  and (applier.cgroupfs is None or applier.cgroupfs.run_of(c.unit) is None)}
        read_from = applier.generation
        again = {u for u in started if applier.observed.get(u) is None}
        try:
            await applier.refresh_units(new | again, writes)
        except SystemdError:
            put_back(new, started)  # read them again after the retry
            raise
        if not sure():
            # Since the reads began (a daemon-reload announces every unit removed, then new): a
            # reserved slice, which the diff may create, was written with what systemd already
            # held (e2e 40-survival). Drop the round; the full re-read decides.
            put_back(new, started)
            return None
        generation = applier.generation  # what the diff is computed from
        # The diff again only if the reads changed the cache (a burst's rounds read nothing).
        changes, held = before if generation == read_from else self._diff(desired, inputs, applier)
        was = {c.unit: applier.observed.get(c.unit) for c in changes}
        result = await applier.apply(changes, dry_run=dry_run, echo=echo)
        if not changes and applier.generation == generation and not any(f.pending for f in self.features):
            # Nothing to send, and the cache did not change while the round awaited (nor did a
            # feature stop short of the plan: it looks again).
            self._settled = (inputs, applier, generation)
        if not dry_run:
            for feature in self.features:
                feature.settle(applier.observed, desired)
        outcome = Outcome(desired, changes, held, result, was)
        if changes and not dry_run:
            log.info("reconcile: %s", outcome.summary())
        if self._shown is not planned:
            self.metrics.set_plan(planned, applier.cgroupfs, inputs.config.metrics)
            self._shown = planned
        self.metrics.round_state(outcome.drifted, inputs.holding is not None)
        self.metrics.observe_reconcile(self._clock() - began, len(result.applied))
        return outcome

    @staticmethod
    def _diff(desired: Plan, inputs: Inputs, applier: Applier) -> tuple[list[Change], frozenset[str]]:
        return changes_to_send(desired, applier.observed, inputs.naming, holding=inputs.holding, retired=inputs.retired,
                               lost=applier.lost)
