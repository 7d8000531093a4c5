"""drift.py: what a read of a unit says of writes made behind our back. Pure, so a table."""

import pytest

from memqos_systemd.drift import Drift, judge, kernel_agrees, left_alone
from memqos_systemd.reconcile import UNREAD

MI = 1 << 20
INF = 2**64 - 1
PAGE = 4096
U = "kubepods.slice"
OURS = {"MemoryMin": 512 * MI, "MemoryLow": 256 * MI, "MemoryHigh": INF}
SAME_KERNEL = dict(OURS)  # the cgroup shows what systemd holds
KERNEL_LOWER_MIN = {**OURS, "MemoryMin": 0}  # memory.min written to 0 around systemd
KERNEL_HIGHER_LOW = {**OURS, "MemoryLow": 300 * MI}  # a parent's DefaultMemoryLow=, or a file write that raised it
KERNEL_OTHER_HIGH = {**OURS, "MemoryHigh": 1024 * MI}  # memory.high is ours whole: anything else is lost


@pytest.mark.parametrize("value, held, kernel, confirmed, want_drift, want_lost", [
    # Not loaded (or gone): nothing to say.
    (None, OURS, SAME_KERNEL, True, None, None),
    # systemd holds what we last read or wrote, and the cgroup shows it: nothing.
    (OURS, OURS, SAME_KERNEL, True, None, None),
    # Not read with its cgroup (a round's read): nothing but the comparison with the cache.
    (OURS, OURS, None, True, None, None),
    # systemd holds other values: someone wrote through systemd.
    ({**OURS, "MemoryMin": 0}, OURS, None, True,
     Drift(U, OURS, {**OURS, "MemoryMin": 0}, "systemd"), None),
    # ... but the cache had values of the cgroup's (unconfirmed), UNREAD ones, or none: not compared.
    ({**OURS, "MemoryMin": 0}, OURS, None, False, None, None),
    ({**OURS, "MemoryMin": 0}, UNREAD, None, True, None, None),
    ({**OURS, "MemoryMin": 0}, None, None, True, None, None),
    # The cgroup shows less than systemd holds: someone wrote the file; what it lost is set again.
    (OURS, OURS, KERNEL_LOWER_MIN, True, Drift(U, OURS, {**OURS, "MemoryMin": 0}, "cgroupfs"), {"MemoryMin": 0}),
    (OURS, None, KERNEL_OTHER_HIGH, True, Drift(U, OURS, {**OURS, "MemoryHigh": 1024 * MI}, "cgroupfs"),
     {"MemoryHigh": 1024 * MI}),
    # More MemoryLow in the cgroup is not lost (left alone: see left_alone).
    (OURS, OURS, KERNEL_HIGHER_LOW, True, None, None),
    # A writer through systemd is said first; the cgroup is not judged against values that moved.
    ({**OURS, "MemoryLow": 0}, OURS, KERNEL_LOWER_MIN, True, Drift(U, OURS, {**OURS, "MemoryLow": 0}, "systemd"), None),
])
def test_judge(value, held, kernel, confirmed, want_drift, want_lost):
    record, lost = judge(U, value, held, kernel, mine=value or {}, confirmed=confirmed, page_size=PAGE)
    assert record == want_drift
    assert lost == want_lost


def test_judge_compares_only_what_is_ours():
    """In companion mode the kubelet's own properties (`mine` leaves them out) are not compared:
    its write of kubepods.slice MemoryMin is no write behind our back."""
    value = {**OURS, "MemoryMin": 0}
    mine = {k: v for k, v in value.items() if k != "MemoryMin"}
    assert judge(U, value, OURS, None, mine=mine, confirmed=True, page_size=PAGE) == (None, None)


def test_judge_compares_memory_max_only_where_both_hold_it():
    """MemoryMax is read only while it is ours: a cache without it compares the other three."""
    value = {**OURS, "MemoryMax": 64 * MI}
    assert judge(U, value, OURS, None, mine=value, confirmed=True, page_size=PAGE) == (None, None)
    record, _ = judge(U, value, {**OURS, "MemoryMax": INF}, None, mine=value, confirmed=True, page_size=PAGE)
    assert record == Drift(U, {**OURS, "MemoryMax": INF}, value, "systemd")


@pytest.mark.parametrize("value, kernel, want", [
    (OURS, None, None),  # not read
    (OURS, SAME_KERNEL, None),  # shows systemd's values
    ({**OURS, "MemoryMin": 512 * MI + 100}, SAME_KERNEL, None),  # page-rounded down as the kernel stores it
    (OURS, KERNEL_HIGHER_LOW, {**OURS, "MemoryLow": 300 * MI}),  # expected from now on: the kernel's in systemd's place
])
def test_left_alone(value, kernel, want):
    assert left_alone(value, kernel, value, PAGE) == want


@pytest.mark.parametrize("held, kernel, confirmed, want", [
    (OURS, SAME_KERNEL, True, True),
    (OURS, SAME_KERNEL, False, False),  # values from the cgroup alone: read over D-Bus all the same
    (UNREAD, SAME_KERNEL, True, False),
    (None, SAME_KERNEL, True, False),
    (OURS, None, True, False),  # no cgroup read
    (OURS, KERNEL_LOWER_MIN, True, False),
])
def test_kernel_agrees(held, kernel, confirmed, want):
    assert kernel_agrees(held, kernel, OURS, confirmed=confirmed, page_size=PAGE) is want
