"""The BestEffort ceiling's way down (ceiling.step), row by row: the plan's MemoryMax, what systemd
holds and the slice's usage in; the value to hold now, and whether to look at the usage again.

The rule (ceiling.py): never a MemoryMax below the slice's usage in one write, since that write
makes its writer, systemd, reclaim and OOM-kill. Every expected value is worked out by hand."""

from __future__ import annotations

import pytest

from memqos_systemd.ceiling import Step, step, take_back

Mi = 2**20
INF = 2**64 - 1
PAGE = 4096


@pytest.mark.parametrize("target, held, usage, expected", [
    # first write on a slice that holds systemd's default (infinity), usage below the plan: the plan
    (900 * Mi, INF, 100 * Mi, Step(900 * Mi, False)),
    (900 * Mi, None, 100 * Mi, Step(900 * Mi, False)),  # not read yet: taken as infinity
    # usage above the plan: to the usage, up to a page, and look again
    (900 * Mi, INF, 1500 * Mi, Step(1500 * Mi, True)),
    (900 * Mi, INF, 1500 * Mi + 1, Step(1500 * Mi + PAGE, True)),
    (900 * Mi, INF, 1500 * Mi + PAGE - 1, Step(1500 * Mi + PAGE, True)),
    # following: the usage went down, so does the step; it never goes up again by itself
    (900 * Mi, 1500 * Mi, 1200 * Mi, Step(1200 * Mi, True)),
    (900 * Mi, 1200 * Mi, 1300 * Mi, Step(1200 * Mi, True)),  # usage above what is held (the kernel's slack)
    (900 * Mi, 1200 * Mi, 1200 * Mi, Step(1200 * Mi, True)),  # nothing moved: nothing to send
    # the usage reached the plan: the plan
    (900 * Mi, 1200 * Mi, 900 * Mi, Step(900 * Mi, False)),
    (900 * Mi, 1200 * Mi, 900 * Mi - 1, Step(900 * Mi, False)),
    (900 * Mi, 1200 * Mi, 900 * Mi + 1, Step(900 * Mi + PAGE, True)),  # one byte above: a page above
    (900 * Mi, 1200 * Mi, 0, Step(900 * Mi, False)),
    # the usage cannot be read (the slice's cgroup is not there): nothing lowered, look again
    (900 * Mi, 1200 * Mi, None, Step(1200 * Mi, True)),
    (900 * Mi, INF, None, Step(INF, True)),
    # raising (the requests went down, a pod left) needs no usage and goes at once
    (1500 * Mi, 900 * Mi, None, Step(1500 * Mi, False)),
    (1500 * Mi, 900 * Mi, 3000 * Mi, Step(1500 * Mi, False)),
    (900 * Mi, 900 * Mi, 3000 * Mi, Step(900 * Mi, False)),  # there already
    # taking ours back (the ceiling was turned off): infinity, a raise
    (INF, 900 * Mi, None, Step(INF, False)),
])
def test_step(target, held, usage, expected):
    assert step(target, held, usage, PAGE) == expected


@pytest.mark.parametrize("usage", [0, 1, 123 * Mi + 7, 900 * Mi, 901 * Mi, 5000 * Mi - 3])
@pytest.mark.parametrize("held", [None, 950 * Mi, 2000 * Mi, INF])
def test_no_step_below_the_usage_and_never_up_while_lowering(usage, held):
    """Whatever the inputs: a lowering never goes below the usage, nor above what is held."""
    got = step(900 * Mi, held, usage, PAGE)
    was = INF if held is None else held
    if got.value < was:
        assert got.value >= usage and got.value >= 900 * Mi
    assert got.value <= was
    assert got.following == (got.value > 900 * Mi)


@pytest.mark.parametrize("target, held, usage, take, expected", [
    # a line that follows usage takes back what it lent: at most `take` below the usage a write
    (900 * Mi, INF, 1500 * Mi, 64 * Mi, Step(1436 * Mi, True)),
    (900 * Mi, 1436 * Mi, 1436 * Mi, 64 * Mi, Step(1372 * Mi, True)),  # the usage followed (an OOM kill, reclaim)
    (900 * Mi, 1436 * Mi, 1500 * Mi, 64 * Mi, Step(1436 * Mi, True)),  # it did not: nothing lower yet, nothing sent
    (900 * Mi, INF, 950 * Mi, 64 * Mi, Step(900 * Mi, False)),  # within a take: the line
    (900 * Mi, INF, 964 * Mi, 64 * Mi, Step(900 * Mi, False)),
    (900 * Mi, INF, 964 * Mi + 1, 64 * Mi, Step(900 * Mi + PAGE, True)),
    (900 * Mi, INF, 1500 * Mi, 64 * Mi + 1, Step(1436 * Mi, True)),  # in whole pages, down
    (0, INF, 10 * Mi, 64 * Mi, Step(0, False)),
    (900 * Mi, INF, None, 64 * Mi, Step(INF, True)),  # no usage: nothing lowered
    (1500 * Mi, 900 * Mi, 3000 * Mi, 64 * Mi, Step(1500 * Mi, False)),  # raising: at once
])
def test_step_lowers_a_memory_high_a_bounded_step(target, held, usage, take, expected):
    assert step(target, held, usage, PAGE, take) == expected


@pytest.mark.parametrize("line, held, usage, expected", [
    # BestEffort uses more than the line (the owners grew into what it was lent): its MemoryHigh
    # goes down at most `take` (32 MiB here) below the usage a write, never below the line
    (900 * Mi, None, 1500 * Mi, Step(1468 * Mi, True)),
    (900 * Mi, INF, 1500 * Mi, Step(1468 * Mi, True)),
    (900 * Mi, INF, 1500 * Mi + 1, Step(1468 * Mi + PAGE, True)),  # the usage up to a page
    # the borrower came down to it (it reclaimed, freed, or the kernel took its pages): the next step
    (900 * Mi, 1468 * Mi, 1468 * Mi, Step(1436 * Mi, True)),
    (900 * Mi, 1468 * Mi, 1480 * Mi, Step(1448 * Mi, True)),  # within a take of it: from the usage
    # it did not (anonymous memory, no swap): nothing lower, nothing sent (PID 1 would only retry)
    (900 * Mi, 1468 * Mi, 1500 * Mi, Step(1468 * Mi, True)),
    (900 * Mi, 1468 * Mi, 1600 * Mi, Step(1468 * Mi, True)),
    # near the line: the line itself
    (900 * Mi, 940 * Mi, 920 * Mi, Step(900 * Mi, True)),
    (900 * Mi, 900 * Mi, 920 * Mi, Step(900 * Mi, True)),  # held there while the usage is above it
    # at or below the line: MemoryMax holds it there; MemoryHigh back to infinity
    (900 * Mi, 900 * Mi, 900 * Mi, Step(INF, False)),
    (900 * Mi, 1000 * Mi, 10 * Mi, Step(INF, False)),
    (900 * Mi, INF, 900 * Mi - 1, Step(INF, False)),
    # the line rose above what is held (an owner shrank, a pod left): raised to it at once
    (1200 * Mi, 1000 * Mi, 1500 * Mi, Step(1200 * Mi, True)),
    # the usage cannot be read: nothing lowered; a raise to the line still goes
    (900 * Mi, 1000 * Mi, None, Step(1000 * Mi, True)),
    (900 * Mi, None, None, Step(INF, True)),
    (1200 * Mi, 1000 * Mi, None, Step(1200 * Mi, True)),
])
def test_take_back_lowers_memory_high_a_bounded_step(line, held, usage, expected):
    assert take_back(line, held, usage, PAGE, 32 * Mi) == expected


@pytest.mark.parametrize("usage", [0, 1, 123 * Mi + 7, 900 * Mi, 930 * Mi, 1500 * Mi, 5000 * Mi - 3])
@pytest.mark.parametrize("held", [None, 880 * Mi, 950 * Mi, 1490 * Mi, 2000 * Mi, INF])
@pytest.mark.parametrize("take", [0, 32 * Mi, 64 * Mi + 1])
def test_take_back_never_more_than_a_take_below_the_usage(usage, held, take):
    """Whatever the inputs: a MemoryHigh lowered below what is held is at most `take` below the
    usage (what PID 1 may reclaim in the write) and never below the line; and the MemoryMax the
    same round sends (step, no take) is never below the usage."""
    line = 900 * Mi
    got = take_back(line, held, usage, PAGE, take)
    was = INF if held is None else held
    if got.value < was:
        assert got.value >= line and got.value >= usage - take
    assert got.following == (usage > line)
    assert (got.value == INF) == (usage <= line)
    m = step(line, held, usage, PAGE)
    if m.value < was:
        assert m.value >= usage
