"""The companion mode as the service keeps it: what the kubelet writes as its own, and the rest ours.

What the kubelet writes follows from its own configuration (kubelet_gate.kubelet_facts, then
kubelet_gate.writes): what the running kubelet answers of itself (its /metrics and /configz, asked
at our start, at a reload and after each of its starts: `ask`) and its config file (read with our
config, and again at each of its starts, when it reads it itself: `kubelet_started`). The mode is
decided again whenever one of those changes (`decide`), and each property the kubelet writes is
left to it: the observer asks `writes` for every unit it reads, and the plan shows its values.

Around the kubelet's start, `hold` leaves to it a write it made that its configuration, not yet
known, may make its own (kubelet_gate.kubelets_write), until the mode is decided (`release`).
Handing properties over to the kubelet (`hand_back`) writes its own values there once, at the
levels it writes only at a unit's creation (pod slices, container scopes) or its own start
(reserved slices): nothing of ours stays that it would not write.
At the kubelet's start, where the node and QoS slices' protection is its own (TieredReservation),
`bridge` writes its own values there until its first round counts the running pods: its start sets
them to 0 whatever its policy (measured, e2e 59-real-kubelet-beside), up to a minute before that round.
The journal says the mode the first time and when it changes, and the metrics show it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Mapping

from . import plan
from .config import read_kubelet_file
from .config_schema import Config, KubeletFile
from .kubelet_gate import Mode, Writes, companion_mode, kubelets_write
from .sources import Answers, ask_kubelet, facts_of

__all__ = ["Companion", "HAND_BACK_LEVELS"]

log = logging.getLogger("memqos_systemd")

# Where the kubelet writes its values once (a pod's and a container's at their creation, a reserved
# slice's at its own start): what moves to it there is handed back with its value (plan.py). It
# rewrites the node and QoS slices' every minute itself.
HAND_BACK_LEVELS = plan.HAND_BACK_LEVELS
BRIDGED = frozenset({"MemoryMin", "MemoryLow"})  # what its start sets to 0 there


class Companion:
    def __init__(self, config: Config, metrics) -> None:
        self.metrics = metrics
        self.answers = Answers(unasked="not asked yet")  # what the running kubelet said of itself
        self.stale = False  # those answers are its last process's: it has restarted since
        self.file: KubeletFile | None = config.kubelet_file  # its config file as last read
        self.held: dict[str, frozenset[str]] = {}  # unit -> what is left to it while its mode is decided
        self.hand_back = False  # the next round writes its values where they moved to it (HAND_BACK_LEVELS)
        self.bridge = False  # its values written on the node and QoS slices until it counts the pods (BRIDGE_LEVELS)
        self.zeroed = False
        self.version: str | None = None  # the version it last reported (kubernetes_build_info)
        self.facts, self.reserved = facts_of(config, self.answers, file=self.file)
        self.mode: Mode = companion_mode(config.companion, self.facts)
        self._said: set[str] = set()  # warnings said (once each)
        self._shown = False

    @property
    def writes(self) -> Writes:
        """What the kubelet writes as its own now, with what is held for it."""
        return self.mode.writes.holding(self.held) if self.held else self.mode.writes

    @property
    def watched(self) -> Writes:
        """What the kubelet writes as its own and is therefore neither compared nor watched: while
        its start is bridged, not the node and QoS slices' (their zeros are put back)."""
        writes = self.writes
        return writes.without(plan.BRIDGE_LEVELS) if self.bridge else writes

    async def ask(self, config: Config, source) -> bool:
        """Ask the kubelet what it writes itself (a thread: blocking), then `decide`. A change hands
        the values over at the next round: to the kubelet, its own written where it writes once;
        from it, ours written over what it left."""
        self.answers = await asyncio.to_thread(ask_kubelet, config, source)
        self.stale = False
        if self.answers.metrics is not None and self.answers.metrics.version:
            self.version = self.answers.metrics.version  # its defaults, when a later answer does not say
        return self.decide(config)

    def kubelet_started(self, config: Config) -> bool:
        """The kubelet has (re)started: what its last process answered is stale, and its config
        file, which it has just read, is read again and comes first until it answers (`ask`)."""
        self.stale = True
        if config.kubelet_config_file:
            self.file = read_kubelet_file(config.kubelet_config_file)
        turned = self.decide(config)
        # Its start sets the node and QoS slices' protection to 0 whatever its policy, and where that
        # protection is its own it counts the running pods only at its next round: its values are
        # written there until then (`end_bridge`), never 0 meanwhile.
        self.bridge = bool(self.mode.writes.at("node") & BRIDGED)
        self.zeroed = False  # its start's zeros seen there (a write of its after them is its round)
        if self.bridge:
            log.info("the kubelet started: its own values on kubepods.slice and the QoS slices are written"
                     " until its first round counts the running pods (its start sets them to 0)")
        return turned or self.bridge

    def end_bridge(self, why: str) -> bool:
        """The kubelet counts the pods again (its own round wrote there), or its start is long past:
        the node and QoS slices' protection is its own again, not written. True if it was bridged."""
        if not self.bridge:
            return False
        self.bridge = False
        log.info("kubepods.slice and the QoS slices: the kubelet's own again (%s)", why)
        return True

    def whose(self, unit: str, level: str, before: Mapping[str, int], now: Mapping[str, int], *, bridged: bool,
              starting: bool, deciding: bool) -> str | None:
        """Whether a write found on `unit` is the kubelet's (kubelet_gate.kubelets_write): "start" or
        "create", one of its moments (ours is put back and the moment counted); "held", one its
        configuration, being decided, may make its own (left to it: `hold`); on the node and QoS
        slices while its start is `bridged` (the bridge's state when the read began), "round" when its
        round ends the bridge and "own" for another of its own (`bridged_write`). None: not the kubelet's."""
        if bridged and level in plan.BRIDGE_LEVELS:
            return self.bridged_write(before, now) or "own"
        if self.mode.facts is None:
            return None
        kind = kubelets_write(level, before, now, self.mode.facts, starting=starting, deciding=deciding)
        if kind == "held":
            self.hold(unit, frozenset(p for p in now if now[p] != before.get(p)))
        return kind

    def bridged_write(self, before: Mapping[str, int], now: Mapping[str, int]) -> str | None:
        """A write found on the node or a QoS slice while its start is bridged: "start" for its start's
        zeros (its own values are put back, a moment of its); "round" for the first other write after
        them, its round having counted the pods, which ends the bridge (its values are its own from
        then on); None for any other (its own, before its zeros: its last values)."""
        changed = {p: v for p, v in now.items() if before.get(p) != v}
        if changed and not any(changed.values()):
            self.zeroed = True
            return "start"
        return "round" if self.zeroed and self.end_bridge("its round wrote there") else None

    def config_changed(self, config: Config) -> bool:
        """A reload made `config` the one in force, with the kubelet's config file read again."""
        self.file = config.kubelet_file
        return self.decide(config)

    def decide(self, config: Config) -> bool:
        """The mode from `config` and what is known of the kubelet; True when what it writes as its
        own changed (what systemd holds is then to be compared as the new mode has it: read again)."""
        self.facts, self.reserved = facts_of(config, self.answers, file=self.file, stale=self.stale,
                                             version=self.version)
        mode = companion_mode(config.companion, self.facts)
        turned = mode.writes != self.mode.writes
        if turned and any(mode.writes.at(level) - self.mode.writes.at(level) for level in HAND_BACK_LEVELS):
            self.hand_back = True
        if mode != self.mode or not self._shown:
            log.info("mode: %s: %s; the kubelet: %s", mode.name, mode.why, self.facts.describe())
            self._shown = True
        for warning in self.facts.warnings:
            if warning not in self._said:
                log.warning("kubelet: %s", warning)
                self._said.add(warning)
        self.mode = mode
        if not mode.writes.at("node") & BRIDGED:
            self.bridge = False  # nothing of the kubelet's there to bridge
        self.metrics.companion(mode.companion, mode.writes.protects)
        return turned

    def hold(self, unit: str, props: frozenset[str]) -> None:
        """A write of the kubelet's found on `unit` while its mode is being decided: left to it."""
        if props - self.held.get(unit, frozenset()):
            log.info("%s: %s written just after the kubelet's start: left to it until it says what it writes"
                     " itself", unit, ", ".join(sorted(props)))
            self.held[unit] = self.held.get(unit, frozenset()) | props

    def release(self) -> bool:
        """The mode is decided (or the kubelet never said): nothing is held for it any more. True
        when something was (it is compared again, as the mode has it)."""
        held, self.held = self.held, {}
        return bool(held)

    def handed_back(self) -> None:
        """A round wrote the kubelet's values where they moved to it."""
        self.hand_back = False
