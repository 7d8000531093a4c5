"""The wiring, built in one place for every entry point: the daemon, `apply --once`, `plan`,
`status`, `reset` and `check`.

What a command or the daemon needs beside the config: the features of the table (features.py),
each made once with the outside things it may use (feature.Context), and the observer and the
applier made over them, so that whatever a feature owns (the units whose MemoryMax is its own) is
read and taken back the same way everywhere. The config in force reaches the wiring one way: the
`in_force` callable, asked at each use (the daemon's changes at a reload; a command's is fixed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from . import features
from .applier import Applier
from .cgroupfs import Cgroupfs
from .config_schema import Config
from .feature import Context, Feature
from .kubelet_gate import Writes
from .naming import Naming
from .node import page_size
from .observe import Observer
from .places import CGROUP_ROOT, STATE_DIR
from .plan import NodeFacts, Plan

__all__ = ["Wiring", "wire", "adds"]

@dataclass
class Wiring:
    """The features of the table and what is made over them, for the config `in_force` gives."""

    in_force: Callable[[], tuple[Config, Naming]]  # the config in force and its unit names, asked at each use
    features: tuple[Feature, ...]
    cgroupfs: Cgroupfs
    page_size: int
    kubelet: Callable[[], Writes] = Writes  # what the kubelet writes as its own now, not compared nor watched (companion mode)
    on_call: Callable[[str, str], None] | None = None  # each D-Bus call counted (metrics)

    @property
    def config(self) -> Config:
        return self.in_force()[0]

    @property
    def naming(self) -> Naming:
        return self.in_force()[1]

    def owned(self, prop: str) -> frozenset[str]:
        """The units on which `prop` is a feature's own (features.owned), under the config in force."""
        config, naming = self.in_force()
        return features.owned(self.features, prop, naming, config)

    def observer(self, systemd, *, cgroups: bool = True) -> Observer:
        """What systemd and the kernel hold (observe.py), reading the features' own properties too;
        `cgroups` False: systemd's values alone (status reads the kernel's itself)."""
        return Observer(systemd, lambda: self.naming, cgroupfs=self.cgroupfs if cgroups else None, page_size=self.page_size,
                        on_call=self.on_call, max_units=lambda: self.owned("MemoryMax"), kubelet=self.kubelet)

    def applier(self, systemd, on_restore: Callable[[str, str | None], None] | None = None) -> Applier:
        return Applier(systemd, cgroupfs=self.cgroupfs, on_call=self.on_call, on_restore=on_restore)

    def plan(self, pods, node: NodeFacts) -> Plan:
        """The plan of `pods` on the node, each feature's plan step laid on (feature.planned)."""
        return features.plan_all(pods, node, self.config, self.features)

    def on(self) -> tuple[str, ...]:
        """The names of the features the config in force turns on (features.on)."""
        config, naming = self.in_force()
        return features.on(self.features, naming, config, self.kubelet())

    def warnings(self) -> list[str]:
        """What the features have to say after a round of a command (Feature.warnings)."""
        return [w for f in self.features for w in features.said(f)]


def wire(config: Config, *, write: bool = True, kubelet: Writes = Writes(), metrics: Any = None,
         cgroup_root: Path | None = None, state_dir: Path | None = STATE_DIR,
         clock: Callable[[], float] = time.monotonic,
         table: Iterable[Callable[[Context], Feature]] | None = None) -> Wiring:
    """The wiring of a command: a config fixed for its run, the features made with `write` False
    in a dry run (their files read, never written)."""
    naming = Naming.for_config(config)
    cgroupfs = Cgroupfs(CGROUP_ROOT if cgroup_root is None else cgroup_root)
    size = page_size()
    context = Context(cgroupfs, size, metrics, state_dir=state_dir, write=write, clock=clock)
    return Wiring(lambda: (config, naming), features.make(context, table), cgroupfs, size, kubelet=lambda: kubelet)


def adds(config: Config, kubelet: Writes) -> tuple[str, ...]:
    """What the service adds that the config turns on (never one that is off): the features of
    the table it turns on (Wiring.on)."""
    return wire(config, write=False, kubelet=kubelet, state_dir=None).on()
