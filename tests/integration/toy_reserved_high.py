"""The toy feature of issue 43, written as a contributor would: a MemoryHigh on the kube-reserved
slice (twice its planned MemoryMin), so that the node's daemons are throttled before they eat into
the pods' memory; opt-in (`toyKubeReservedHigh: true` in the config). It is this module and one
line of the feature table (test_toy_feature.py adds the line); nothing else of the product knows it."""

from __future__ import annotations

import dataclasses

from memqos_systemd.config_schema import ConfigError
from memqos_systemd.feature import Family, NoGauges, gauge_value

FAMILY = "memqos_toy_kube_reserved_high_bytes"
KEY = "toyKubeReservedHigh"


def _checked(src: str, key: str, value) -> bool:
    """Its config block: true or false."""
    if not isinstance(value, bool):
        raise ConfigError(f"{src}: {key}: {value!r} must be true or false")
    return value


def _unit(config) -> str | None:
    """The kube-reserved slice, where the config turns the toy on and enforces that slice."""
    if not config.block(KEY) or "kube-reserved" not in config.enforce_node_allocatable \
            or not config.kube_reserved_cgroup:
        return None
    return config.kube_reserved_cgroup.rstrip("/").rsplit("/", 1)[-1]


class KubeReservedHigh:
    name = KEY
    config_block = (KEY, _checked)
    properties: tuple[str, ...] = ()  # MemoryHigh is one of the plan's three
    families = (Family(FAMILY, "The toy's MemoryHigh on the kube-reserved slice, as planned"),)
    pending = False
    notifier = None

    def __init__(self, metrics=None) -> None:
        self.metrics = metrics or NoGauges()

    @classmethod
    def made(cls, context) -> KubeReservedHigh:
        return cls(context.metrics)

    def units(self, naming, config) -> frozenset[str]:
        return frozenset()

    def on(self, naming, config, kubelet) -> bool:
        return _unit(config) is not None

    # a pure plan step: the kube-reserved slice's MemoryHigh
    def plan_step(self, desired, given):
        unit = _unit(given.config)
        units = tuple(dataclasses.replace(u, memory_high=2 * u.memory_min)
                      if u.unit == unit and u.level == "reserved" and u.memory_min else u for u in desired.units)
        return dataclasses.replace(desired, units=units)

    def overlay(self, desired, observed, config, naming):
        return desired

    def settle(self, observed, desired) -> None:
        high = next((u.memory_high for u in desired.units if u.level == "reserved" and u.memory_min
                     and u.memory_high == 2 * u.memory_min), None)
        self.metrics.gauge(FAMILY, (), gauge_value(high))

    def look_again(self, now: float, planned: bool = True) -> float:
        return float("inf")

    def woken(self, now: float) -> float:
        return float("inf")

    def on_drift(self, unit, before, now, config) -> frozenset[str]:
        return frozenset()

    # how it shows itself
    def plan_lines(self, p, cfg, wide) -> list[str]:
        unit = _unit(cfg)
        u = p.by_unit().get(unit) if unit else None
        return [f"toy: MemoryHigh {u.memory_high} on {unit}"] if u is not None else []

    def status_doc(self, desired, observed, naming, cfg) -> dict | None:
        unit = _unit(cfg)
        if unit is None or desired is None:
            return None
        return {"unit": unit, "MemoryHigh": desired.by_unit()[unit].memory_high,
                "systemd": (observed.get(unit) or {}).get("MemoryHigh")}

    def status_lines(self, entry: dict, pods, wide: bool) -> list[str]:
        return [f"toy: {entry['unit']} MemoryHigh plan {entry['MemoryHigh']}, systemd holds {entry['systemd']}"]

    def findings(self, cfg, naming, reserved) -> list[tuple[str, str]]:
        unit = _unit(cfg)
        return [("ok", f"toy: MemoryHigh on {unit}")] if unit else []
