"""The feature table: every feature laid on the plan (feature.py), one line each.

A new feature is a module with a class that has feature.Feature's members and a `made(context)`
class method, and its line here; the daemon, the round and every command make them all from this
table (`make`, through wiring.py) and iterate them, asking each only for the members it has.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

from .burstable_lever import BurstableLever
from .ceiling_watch import CeilingWatch
from .cgroupfs import Cgroupfs
from .config_schema import Config
from .feature import Context, Family, Feature, Given, planned
from .kubelet_gate import Writes
from .lending_watch import LendingWatch
from .naming import Naming
from .plan import NodeFacts, Plan, plan

__all__ = ["FEATURES", "make", "owned", "on_drift", "by_name", "on", "said", "taken_back", "offline", "planned", "families", "config_blocks", "plan_all", "reset_notes"]

FEATURES: tuple[Callable[[Context], Feature], ...] = (
    LendingWatch.made,  # lending: the ceiling's and the lever's lines follow usage (before the ceiling, which steps them)
    CeilingWatch.made,  # bestEffortCeiling: a MemoryMax on the BestEffort QoS slice, stepped down with its usage
    BurstableLever.made,  # burstableHigh: a MemoryHigh on each Burstable pod slice, below the others' requests
)


def reset_notes(table: Iterable[Callable[[Context], Feature]] | None = None) -> list[str]:
    """What each feature of the table says `reset` takes back of its own (its class's `reset_note`,
    for `reset --help`), read from the classes: nothing is made."""
    classes = (getattr(made, "__self__", None) for made in (FEATURES if table is None else table))
    return [c.reset_note for c in classes if getattr(c, "reset_note", None)]


def make(context: Context, table: Iterable[Callable[[Context], Feature]] | None = None) -> tuple[Feature, ...]:
    """Every feature of the table (FEATURES unless `table`), made with `context`."""
    return tuple(made(context) for made in (FEATURES if table is None else table))


def owned(features: Iterable[Feature], prop: str, naming: Naming, config: Config) -> frozenset[str]:
    """The units on which `prop` is a feature's own (read with the other three, taken back by reset)."""
    return frozenset().union(*(f.units(naming, config) for f in features if prop in f.properties))


def on_drift(features: Iterable[Feature], unit: str, before: Mapping[str, int], now: Mapping[str, int],
             config: Config) -> frozenset[str]:
    """The properties of a change made without us that the features take on themselves."""
    return frozenset().union(*(f.on_drift(unit, before, now, config) for f in features))


def looks(features: Iterable[Feature], now: float, planned: bool) -> dict[str, float]:
    """When each feature wants a round again (Feature.look_again; infinity: none)."""
    return {f.name: f.look_again(now, planned) for f in features}


def woken(features: Iterable[Feature], notifier, now: float) -> dict[str, float]:
    """`notifier` was readable: when each feature whose notifier it is wants a round (Feature.woken)."""
    return {f.name: f.woken(now) for f in features if _notifier(f) is notifier}


def notifiers(features: Iterable[Feature]) -> list:
    """The notifiers the loop watches (Feature.notifier), each once."""
    out = []
    for f in features:
        n = _notifier(f)
        if n is not None and all(n is not m for m in out):
            out.append(n)
    return out


def _notifier(feature: Feature):
    """A feature's notifier; one that watches nothing need not say so (feature.py)."""
    return getattr(feature, "notifier", None)


def on(features: Iterable[Feature], naming: Naming, config: Config, kubelet: Writes = Writes()) -> tuple[str, ...]:
    """The names of the features `config` turns on (for `check` and `status`, which never advertise
    one that is off): a feature's own `on`, or else whether it sets something somewhere."""
    return tuple(f.name for f in features
                 if (f.on(naming, config, kubelet) if hasattr(f, "on") else f.units(naming, config)))


def said(feature: Feature) -> list[str]:
    """What a feature has to say after a command's round (Feature.warnings; none unless it has some)."""
    return list(feature.warnings()) if hasattr(feature, "warnings") else []


def taken_back(features: Iterable[Feature]) -> None:
    """After a reset sent everything back: each feature forgets what it kept (Feature.taken_back)."""
    for f in features:
        if hasattr(f, "taken_back"):
            f.taken_back()


def families(features: Iterable[Feature]) -> tuple[Family, ...]:
    """The metric families the features set (Feature.families), for the metrics endpoint to declare."""
    return tuple(fam for f in features for fam in getattr(f, "families", ()))


def config_blocks(table: Iterable[Callable[[Context], Feature]] | None = None) -> dict[str, Callable]:
    """The config keys the features of the table (FEATURES unless `table`) bring themselves, each
    with its checker (Feature.config_block: (key, checker(src, key, value) -> the checked value)),
    for the loader (config.load_config), which names no feature."""
    out = {}
    for made in FEATURES if table is None else table:
        block = getattr(getattr(made, "__self__", None), "config_block", None)  # the class of `made`
        if block is not None:
            out[block[0]] = block[1]
    return out


def offline(page_size: int = 4096) -> tuple[Feature, ...]:
    """The table's features made to plan and to say how they show (`plan`, status's lines): no
    file of theirs read or written, no metric."""
    return make(Context(Cgroupfs(), page_size, state_dir=None, write=False))


def plan_all(pods, node: NodeFacts, config: Config, made: Iterable[Feature] | None = None) -> Plan:
    """The plan as the service makes it: plan.plan, then each feature's step (`made`: the table's
    features, made offline, unless given)."""
    made = offline(node.page_size) if made is None else made
    return planned(made, plan(list(pods), node, config), Given(tuple(pods), node, config, Naming.for_config(config)))


def by_name(features: Iterable[Feature], name: str) -> Feature | None:
    return next((f for f in features if f.name == name), None)
