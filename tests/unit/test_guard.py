"""The pressure guard's decision (guard.py): scripts of readings and what the guard must then do.

Each row is a sequence of (time, low count, stall µs, BestEffort bytes) readings and the actions
the guard must take at each; the settings are the defaults unless a row says otherwise."""

from __future__ import annotations

import dataclasses

import pytest

from memqos_systemd.config import GuardSettings
from memqos_systemd.guard import MIB, GuardState, Reading, decide, overlay
from memqos_systemd.plan import INFINITY, NodeFacts, plan
from memqos_systemd.config import Config

ON = GuardSettings(enabled=True)
CAP = 1024 * MIB
BE = "kubepods-besteffort.slice"


def run(readings, settings=ON, *, holding=False, state=None):
    """The actions taken, one per reading (None: nothing), and the last state."""
    state = state or GuardState()
    actions = []
    for now, low, stall, be in readings:
        state, act = decide(state, Reading(now, low, stall, be), settings, holding=holding, capacity=CAP)
        actions.append(None if act is None else (act.kind, act.high))
    return actions, state


CASES = [
    ("no neighbour: no low event, no action",
     [(0, 0, 0, 0), (1, 0, 0, 0), (2, 0, 0, 0)], [None, None, None]),
    ("the first reading is a baseline, however large its count",
     [(0, 13604, 0, 400 * MIB)], [None]),
    ("low events while BestEffort holds memory: capped at what it holds",
     [(0, 0, 0, 100 * MIB), (0.25, 5, 0, 300 * MIB)], [None, ("lower", 300 * MIB)]),
    ("low events with BestEffort below minBestEffort: it is not what presses",
     [(0, 0, 0, 0), (0.25, 50, 0, 8 * MIB)], [None, None]),
    ("low events and BestEffort unreadable: nothing",
     [(0, 0, 0, None), (0.25, 50, 0, None)], [None, None]),
    ("a breach that goes on steps lower by step x usage each interval",
     [(0, 0, 0, 100 * MIB), (0.25, 5, 0, 300 * MIB), (0.5, 9, 0, 300 * MIB)],
     [None, ("lower", 300 * MIB), ("lower", 270 * MIB)]),
    ("stepping stops at the floor",
     [(0, 0, 0, 0), (1, 1, 0, 40 * MIB), (2, 2, 0, 40 * MIB), (3, 3, 0, 40 * MIB)],
     [None, ("lower", 40 * MIB), ("lower", 36 * MIB), ("lower", 32 * MIB)]),
    ("a counter that went back (the cgroup made again) is a new baseline",
     [(0, 100, 0, 300 * MIB), (1, 3, 0, 300 * MIB), (2, 3, 0, 300 * MIB)], [None, None, None]),
]


@pytest.mark.parametrize("readings,want", [(r, w) for _, r, w in CASES], ids=[c[0] for c in CASES])
def test_decide(readings, want):
    assert run(readings)[0] == want


def test_release_step_by_step_back_to_the_planners_value():
    readings = [(0, 0, 0, 0), (1, 1, 0, 200 * MIB)]  # lowered to 200 MiB at t=1
    readings += [(1 + t, 1, 0, 10 * MIB) for t in range(1, 61)]  # calm from t=2
    actions, state = run(readings)
    taken = [(i, a) for i, a in enumerate(actions) if a]
    assert taken[0] == (1, ("lower", 200 * MIB))
    # calm since t=2, first release at t=32 (releaseAfter 30 s), then every 5 s, x1.5 each
    # (the reading at index i is taken at t=i)
    assert taken[1:] == [(32, ("raise", 300 * MIB)), (37, ("raise", 450 * MIB)), (42, ("raise", 675 * MIB)),
                         (47, ("raise", 1012 * MIB + MIB // 2)), (52, ("clear", None))]  # the next >= capacity
    assert state.high is None


def test_a_breach_during_release_starts_the_calm_over():
    readings = [(0, 0, 0, 0), (1, 1, 0, 200 * MIB)] + [(1 + t, 1, 0, 200 * MIB) for t in range(1, 20)]
    readings += [(21, 2, 0, 150 * MIB)] + [(21 + t, 2, 0, 150 * MIB) for t in range(1, 31)]
    actions, _ = run(readings)
    assert [a for a in actions if a] == [("lower", 200 * MIB), ("lower", 150 * MIB - 15 * MIB)]
    assert actions.count(None) == len(actions) - 2  # no release yet: calm for 30 s only at t=52


def test_memory_pressure_keeps_it_engaged():
    """Stalls on memory in the protected slice at or above calmPressure are not calm."""
    readings = [(0, 0, 0, 0), (1, 1, 0, 200 * MIB)]
    stall = 0
    for t in range(2, 60):
        stall += 100_000  # 0.1 s stalled per second: 10 % >= 5 %
        readings.append((t, 1, stall, 200 * MIB))
    actions, state = run(readings)
    assert [a for a in actions if a] == [("lower", 200 * MIB)]
    assert state.high == 200 * MIB


def test_nothing_while_holding():
    actions, state = run([(0, 0, 0, 0), (1, 50, 0, 300 * MIB), (2, 90, 0, 300 * MIB)], holding=True)
    assert actions == [None, None, None] and state.high is None and state.low == 90


def test_turned_off_while_engaged_clears_at_once():
    _, state = run([(0, 0, 0, 0), (1, 1, 0, 200 * MIB)])
    actions, state = run([(2, 5, 0, 200 * MIB)], settings=GuardSettings(enabled=False), state=state)
    assert actions == [("clear", None)] and state == GuardState()
    assert run([(3, 9, 0, 200 * MIB)], settings=GuardSettings(enabled=False), state=state)[0] == [None]


def test_values_are_pages():
    actions, _ = run([(0, 0, 0, 0), (1, 1, 0, 100 * MIB + 123), (2, 2, 0, 100 * MIB + 123)])
    assert all(a[1] % 4096 == 0 for a in actions if a)


def test_overlay_touches_only_the_besteffort_qos_slice():
    p = plan([], NodeFacts(CAP), Config(memory_reservation_policy="TieredReservation"))
    assert overlay(p, BE, None) is p
    q = overlay(p, BE, 200 * MIB)
    changed = [(a.unit, b.memory_high) for a, b in zip(p.units, q.units) if a != b]
    assert changed == [(BE, 200 * MIB)]
    assert {u.unit: u for u in p.units}[BE].memory_high == INFINITY
    assert dataclasses.replace(q, units=p.units) == p


def test_one_step_down_an_interval_however_often_it_is_read():
    """The kernel may notify a change of memory.events every 20 ms: the first breach caps at once,
    the next steps come one an interval (0.25 s)."""
    readings = [(0, 0, 0, 0)] + [(0.1 + 0.02 * i, 1 + i, 0, 300 * MIB) for i in range(30)]
    actions, _ = run(readings)
    taken = [(round(readings[i][0], 2), a) for i, a in enumerate(actions) if a]
    assert taken == [(0.1, ("lower", 300 * MIB)), (0.36, ("lower", 270 * MIB)), (0.62, ("lower", 240 * MIB))]


def test_reset_brings_the_guards_memoryhigh_back_to_infinity():
    """`reset` (and `apt remove`, whose prerm runs it) brings every unit of ours back to the
    defaults: the BestEffort QoS slice's MemoryHigh the guard lowered included."""
    from memqos_systemd.naming import Naming
    from memqos_systemd.reconcile import reset_plan
    observed = {BE: {"MemoryMin": 0, "MemoryLow": 0, "MemoryHigh": 200 * MIB}}
    changes = reset_plan(observed, Naming.for_config(Config()))
    assert [(c.unit, dict(c.props)) for c in changes] == [(BE, {"MemoryHigh": INFINITY})]
