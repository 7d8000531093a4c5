"""The BestEffort ceiling's way down (ceiling.step), row by row: the plan's MemoryMax, what systemd
holds and the slice's usage in; the value to hold now, and whether to look at the usage again.

The rule (ceiling.py): never a MemoryMax below the slice's usage in one write, since that write
makes its writer, systemd, reclaim and OOM-kill. Every expected value is worked out by hand."""

from __future__ import annotations

import pytest

from memqos_systemd.ceiling import Step, step

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


@pytest.mark.parametrize("target, held, usage, guard, expected", [
    # a line that follows usage takes back what it lent by the same steps, never below the usage,
    # `guard` above it (what the borrower may charge between the read and the write)
    (900 * Mi, INF, 1500 * Mi, 4 * Mi, Step(1504 * Mi, True)),
    (900 * Mi, 1504 * Mi, 1400 * Mi, 4 * Mi, Step(1404 * Mi, True)),  # the usage came down: so does the step
    (900 * Mi, 1504 * Mi, 1502 * Mi, 4 * Mi, Step(1504 * Mi, True)),  # within the guard: nothing sent
    (900 * Mi, 1504 * Mi, 1600 * Mi, 4 * Mi, Step(1504 * Mi, True)),  # above what is held: never up by itself
    (900 * Mi, INF, 1500 * Mi + 1, 4 * Mi, Step(1504 * Mi + PAGE, True)),  # whole pages, up
    (900 * Mi, INF, 1500 * Mi, 4 * Mi - 1, Step(1504 * Mi, True)),
    (900 * Mi, INF, 902 * Mi, 4 * Mi, Step(906 * Mi, True)),  # just above the line: a guard above the usage
    (900 * Mi, 906 * Mi, 900 * Mi, 4 * Mi, Step(900 * Mi, False)),  # at the line: the line
    (900 * Mi, INF, 10 * Mi, 4 * Mi, Step(900 * Mi, False)),
    (900 * Mi, INF, None, 4 * Mi, Step(INF, True)),  # no usage: nothing lowered
    (1500 * Mi, 900 * Mi, 3000 * Mi, 4 * Mi, Step(1500 * Mi, False)),  # raising: at once
])
def test_step_stops_a_guard_above_the_usage(target, held, usage, guard, expected):
    assert step(target, held, usage, PAGE, guard) == expected


@pytest.mark.parametrize("usage", [0, 1, 123 * Mi + 7, 900 * Mi, 903 * Mi, 1500 * Mi, 5000 * Mi - 3])
@pytest.mark.parametrize("held", [None, 880 * Mi, 950 * Mi, 1490 * Mi, 2000 * Mi, INF])
@pytest.mark.parametrize("guard", [0, 4 * Mi, 4 * Mi + 1])
def test_no_write_below_the_usage_whatever_the_guard(usage, held, guard):
    """Whatever the inputs: a value lowered below what is held is never below the usage, and at
    least `guard` above it unless it is the line itself."""
    got = step(900 * Mi, held, usage, PAGE, guard)
    was = INF if held is None else held
    if got.value < was:
        assert got.value >= usage
        assert got.value == 900 * Mi or got.value >= usage + guard
    assert got.following == (got.value > 900 * Mi)
