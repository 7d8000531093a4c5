"""A new feature is one module and one line of the feature table (features.FEATURES): the daemon
makes it, lays it on every round's plan, reads and writes the property it owns, tells it after
each round and on a write behind our back, with no change of its own (issue 34)."""

from __future__ import annotations

import dataclasses

import pytest
from harness import Harness, run, until
from test_daemon import BURSTABLE, GUARANTEED, NODE_UNITS, TIERED, start_pods

from memqos_systemd import features

pytestmark = pytest.mark.integration

GI = 2**30
BURSTABLE_SLICE = "kubepods-burstable.slice"


class BurstableMax:
    """A feature written for this test: MemoryMax 1 GiB on the Burstable QoS slice, and a record
    of what the daemon told it."""

    name = "testBurstableMax"
    properties = ("MemoryMax",)
    pending = False

    def __init__(self) -> None:
        self.looks: list[bool] = []
        self.settled = 0
        self.drifts: list[tuple[str, int, int]] = []

    @classmethod
    def made(cls, context) -> BurstableMax:
        made.append(cls())
        return made[-1]

    def units(self, naming, config):
        return frozenset({naming.qos_slice("Burstable")})

    def overlay(self, desired, observed, config, naming):
        unit = naming.qos_slice("Burstable")
        units = tuple(dataclasses.replace(u, memory_max=GI) if u.unit == unit and u.level == "qos" else u
                      for u in desired.units)
        return dataclasses.replace(desired, units=units)

    def settle(self, observed, desired) -> None:
        self.settled += 1

    def look_again(self, now: float, planned: bool = True) -> float:
        self.looks.append(planned)
        return float("inf")

    def on_drift(self, unit, before, now, config):
        if before.get("MemoryMax") == now.get("MemoryMax"):
            return frozenset()
        self.drifts.append((unit, before["MemoryMax"], now["MemoryMax"]))
        return frozenset({"MemoryMax"})


made: list[BurstableMax] = []


def test_a_feature_added_to_the_table_is_laid_on_the_plan_told_and_heeded_with_no_daemon_change(
        fake_systemd, tmp_path, monkeypatch):
    monkeypatch.setattr(features, "FEATURES", features.FEATURES + (BurstableMax.made,))  # its one line
    made.clear()
    start_pods(fake_systemd, *NODE_UNITS)

    async def body():
        async with Harness(fake_systemd, tmp_path, [GUARANTEED, BURSTABLE], config=TIERED) as h:
            (toy,) = made
            assert toy in h.daemon.features
            await until(lambda: fake_systemd.unit(BURSTABLE_SLICE).memory_max == GI)
            assert toy.settled >= 1 and toy.looks and all(toy.looks)
            assert [u for u, _, props in fake_systemd.writes if "MemoryMax" in props] == [BURSTABLE_SLICE]

            def change() -> None:  # someone else sets the slice's MemoryMax through systemd
                fake_systemd._units[BURSTABLE_SLICE].memory_max = 3 * GI
                fake_systemd._sync_cgroup(BURSTABLE_SLICE)
            fake_systemd._run(change)
            h.reread()
            await until(lambda: toy.drifts == [(BURSTABLE_SLICE, GI, 3 * GI)])
            await until(lambda: fake_systemd.unit(BURSTABLE_SLICE).memory_max == GI)  # the next round puts it back
    run(body())
