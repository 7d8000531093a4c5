"""The companion mode as the service keeps it: beside the kubelet's own Memory QoS, or every value ours.

The mode follows from the config's `companion:` and the kubelet's gate (kubelet_gate.companion_mode),
a node fact asked of the kubelet at start, at a reload and at its restarts (`ask`); it is decided
again only when either changes (`decide`), since the Applier asks it for every unit it reads.
The journal says it the first time and when it changes, and the metric shows it.
"""

from __future__ import annotations

import asyncio
import logging

from .config_schema import Config
from .kubelet_gate import Gate, Mode, companion_mode
from .sources import kubelet_gates

__all__ = ["Companion"]

log = logging.getLogger("memqos_systemd")


class Companion:
    def __init__(self, config: Config, metrics) -> None:
        self.metrics = metrics
        self.gate = Gate(None, "not asked yet")  # whether the kubelet's own Memory QoS is on
        self.mode: Mode = companion_mode(config.companion, self.gate)
        self._said = False

    async def ask(self, config: Config, source) -> bool:
        """Ask the kubelet whether it writes its own Memory QoS values (a thread: blocking), then
        `decide`. A change hands the values over at the next round: to the kubelet, ours stay until
        it writes its own (it does within a minute); from it, ours are written over what it left."""
        gate, _, unasked = await asyncio.to_thread(kubelet_gates, config, source)
        self.gate = gate if gate.on is not None or not unasked else Gate(None, f"{gate.how}; {unasked}")
        return self.decide(config)

    def decide(self, config: Config) -> bool:
        """The mode from `config` and the kubelet's gate; True when it turned companion on or off
        (what systemd holds is then to be compared as the new mode has it: read again)."""
        mode = companion_mode(config.companion, self.gate)
        turned = mode.companion != self.mode.companion
        if mode != self.mode or not self._said:
            log.info("%s: %s", "companion mode, beside the kubelet's own Memory QoS" if mode.companion
                     else "every value ours", mode.why)
            self.mode, self._said = mode, True
        self.metrics.companion(mode.companion)
        return turned
