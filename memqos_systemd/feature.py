"""The feature interface: what a feature does over its whole life, in the round and in every
command (`plan`, `apply`, `status`, `check`, `reset`), all of which iterate the table.

A feature is a value the plan alone cannot send as planned: it needs a state kept between rounds,
a read of its own, or a step at a time (features.py lists them; docs/DESIGN.md, "The feature
interface", walks through the first).
Each one is a module with a class that has the members below, and one line of the table in
features.py; the daemon, the round and the commands iterate the table (wiring.py builds it for
each) and never name a feature. tests/integration/test_toy_feature.py adds one that way.

* `name`: its config key, the key of its look again in the agenda.
* `properties`, `units(naming, config)`: the properties it sets beyond the plan's three, and the
  units on which they are its own to read and write (the observer reads them with the other three);
  a property it sets nowhere else is never read as ours nor taken back.
* `overlay(desired, observed, config, naming)`: the plan with what to send now laid on it, given
  what systemd holds (`observed`, the round's read: unit -> property -> value, None when not
  loaded); the same Plan object when nothing changes. It may read what it needs (a cgroup).
* `pending`: the last overlay stopped short of the plan; a round that sent nothing is then not
  taken as settled (round.Round.settled), since the next may send something.
* `settle(observed, desired)`: after a round's apply (not in a dry run): what it keeps (a ledger),
  what it says, its metric.
* `families` (optional): the metric families it sets (Family), declared by the wiring; it sets
  them with `context.metrics.gauge(name, labels, value)` (value None: the series goes).
* `look_again(now, planned)`: when it wants a round again (infinity: none), after each round the
  daemon runs (`planned` False: the round could not plan); the agenda holds it (Agenda.look_again).
* `on_drift(unit, before, now, config)`: a read found `unit` changed without us: the properties of
  that change it takes on itself (said and handled there); the rest is a foreign write as usual.
* `notifier`, `woken(now)` (optional: a feature without them watches nothing): an object whose
  fileno() the loop watches (None: none); when it is readable the daemon asks `woken` when to look
  again (now, or infinity when what woke it is nothing to the feature) and hands that to the
  agenda, as a look_again.

Optional members, each asked only of a feature that has it (features.py):
* `config_block` (a class attribute): (key, checker(src, key, value)) of a config block of its own;
  the loader checks it with the rest (features.config_blocks) and `config.block(key)` gives it back.
* `plan_step(desired, given)`: a pure step laid on the plan, after plan.plan, by the round, `plan`
  and `status` alike (Wiring.plan, Round.plan: `planned`); `given`: the pods, the node, the config and
  its unit names (Given). The Burstable lever's MemoryHigh is one.
* `on(naming, config, kubelet)`: whether the config turns it on (check's and status's "adds ...");
  without it, whether `units` names any.
* `warnings()`: what to say after a command's round (`apply`); `taken_back()`: after a `reset` put
  everything back, forget what it kept (a ledger).
* how it shows itself: `plan_entry(plan, unit)` (its part of a unit in `plan --output json`),
  `plan_legend(plan)`, `plan_lines(plan, config, wide)` and `plan_notes(plan, config)` (the
  table); `shown(desired, config)` (what `status` shows as planned), `status_doc(desired, held,
  naming, config)` (its part of status's JSON, under its name), `pod_doc(desired, unit)` (its part
  of a pod's row), `status_lines(entry, pods, wide)` (its lines), `explains(unit, differ, want,
  held, cgroup_dir)` (why a difference from the plan is no drift); `findings(config, naming,
  reserved)` (its lines of `check`, beside the kubelet's QOSReserved verdict).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Protocol, Sequence

from .cgroupfs import Cgroupfs
from .config_schema import Config
from .naming import Naming
from .plan import NodeFacts, Plan
from .pods import Pod
from .quantity import UINT64_MAX

__all__ = ["Context", "Feature", "Family", "Given", "NoGauges", "gauge_value", "planned"]


class Given(NamedTuple):
    """What a feature's pure plan step (`plan_step`) is given beside the plan: the round's inputs."""

    pods: Sequence[Pod]
    node: NodeFacts
    config: Config
    naming: Naming


class Family(NamedTuple):
    """A metric family a feature owns (`families`): a gauge, declared by the wiring (the daemon asks
    each feature of the table for its families: Metrics.declare), set by the feature alone."""

    name: str
    help: str
    labels: tuple[str, ...] = ()


class NoGauges:
    """Where a feature's gauges go when nothing is served (a command, a test)."""

    def gauge(self, name: str, labels: tuple[str, ...], value: float | None) -> None:
        pass


def gauge_value(n: int | None) -> float:
    """Bytes as a gauge shows them: systemd's infinity (and none) as +Inf."""
    return math.inf if n is None or n >= UINT64_MAX else float(n)


@dataclass(frozen=True)
class Context:
    """What a feature is made with: the outside things it may use."""

    cgroupfs: Cgroupfs
    page_size: int
    metrics: Any = None  # where its gauges go (metrics.Metrics.gauge), or None: NoGauges
    state_dir: Path | None = None  # where it keeps its files in /run (beside ledger.py's); None: none kept
    write: bool = True  # False: a dry run, whose files are read and never written
    clock: Callable[[], float] = time.monotonic  # the daemon's clock (monotonic seconds)


class Feature(Protocol):
    name: str
    properties: tuple[str, ...]

    def units(self, naming: Naming, config: Config) -> frozenset[str]: ...

    def overlay(self, desired: Plan, observed: Mapping[str, Mapping[str, int] | None], config: Config,
                naming: Naming) -> Plan: ...

    @property
    def pending(self) -> bool: ...

    def settle(self, observed: Mapping[str, Mapping[str, int] | None], desired: Plan) -> None: ...

    def look_again(self, now: float, planned: bool = True) -> float: ...

    def on_drift(self, unit: str, before: Mapping[str, int], now: Mapping[str, int],
                 config: Config) -> frozenset[str]: ...

    @property
    def notifier(self) -> Any: ...

    def woken(self, now: float) -> float: ...


def planned(features: Iterable[Feature], desired: Plan, given: Given) -> Plan:
    """The plan with each feature's pure plan step laid on it, in the table's order (`plan_step`):
    the round's and every command's (features.plan_all) alike."""
    for f in features:
        if hasattr(f, "plan_step"):
            desired = f.plan_step(desired, given)
    return desired
