"""When the lending feature wants a round (lending_watch.LendingWatch: `pending`, `look_again`,
`woken`), on a clock of our own: a round is unsettled only while a look is due and not taken, the
looks back off to LOOK_MOST while a line lends, and a press wakes a look at once. (The idle cost
these keep down: docs/BENCHMARKS.md, issue 44.)"""

from __future__ import annotations

from memqos_systemd import lending
from memqos_systemd.lending_watch import LendingWatch


class Wake:
    def __init__(self):
        self.fired = False

    def arm(self, *a):
        pass

    def disarm(self):
        pass

    def drain(self):
        fired, self.fired = self.fired, False
        return fired


class Fs:
    def __init__(self):
        self.wake = Wake()

    def pressure_wake(self):
        return self.wake


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def watch():
    clock = Clock()
    w = LendingWatch(Fs(), 4096, clock=clock)
    w.active = True
    return w, clock


def looked(w, clock, lends=True):
    """What `_draw` leaves after a look at the clock's time (lines that lend, or not)."""
    lent = lending.Lent("be", 200 if lends else 64, 64)
    w.lines = lending.Lines(lent, (), 0, frozenset(), False)
    w._due, w._drawn_at = False, clock.now


def test_pending_only_while_a_look_is_due_and_not_taken():
    w, clock = watch()
    assert w.pending  # the first look
    looked(w, clock)
    assert w.pending is False  # the round that looked is settled
    at = w.look_again(clock.now)
    assert at == clock.now + lending.LOOK_FIRST  # a first look: soon
    clock.now = at - 0.01
    assert w.pending is False  # rounds between looks may be skipped
    clock.now = at
    assert w.pending  # the look is due: the round must run
    looked(w, clock)
    assert w.pending is False


def test_looks_back_off_to_look_most_while_lending_and_look_idle_without():
    for lends, most in ((True, lending.LOOK_MOST), (False, lending.LOOK_IDLE)):
        w, clock = watch()
        waits = []
        for _ in range(10):
            looked(w, clock, lends)
            at = w.look_again(clock.now)
            waits.append(at - clock.now)
            clock.now = at
        assert waits[0] == lending.LOOK_FIRST and waits[-1] == most and waits == sorted(waits)


def test_a_stall_wakes_a_look_at_once_and_off_wants_none():
    w, clock = watch()
    looked(w, clock)
    w.look_again(clock.now)
    clock.now += 0.5
    w.cgroupfs.wake.fired = True
    assert w.woken(clock.now) == clock.now and w.pending
    w.active = False
    assert w.pending is False and w.look_again(clock.now) == float("inf")
