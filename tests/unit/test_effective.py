"""effective.py against hand-computed numbers and the invariants of Linux 6.1's effective_protection.

The numbers are worked by hand from mm/memcontrol.c (6.1): a child of the reclaim root holds its
own setting; below, claim = min(usage, setting), scaled by P / S when the siblings' claims S exceed
the parent's effective P, and with memory_recursiveprot plus (P - S) * (usage - claim) / (U - S).
GiB and MiB are whole pages, so the kernel's page arithmetic changes nothing unless a row says so.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memqos_systemd.effective import Cgroup, protection, page_counter_max

GI = 1 << 30
MI = 1 << 20
PAGE = 4096


def kubepods(be_usage: int, *, low: int = 30 * GI, min_: int = 40 * GI, be_pods: tuple[int, ...] = ()) -> Cgroup:
    """The kubepods layout of issue 35's worked example: Guaranteed requests 10 (used
    10), Burstable requests 30 (used 10), BestEffort with no setting; kubepods min = ΣG + ΣB, low = ΣB."""
    be_children = tuple(Cgroup(f"be-pod{i}", u) for i, u in enumerate(be_pods))
    return Cgroup("/", 200 * GI, children=(
        Cgroup("system.slice", 5 * GI),
        Cgroup("kubepods.slice", 20 * GI + be_usage, min=min_, low=low, children=(
            Cgroup("g-pod", 10 * GI, min=10 * GI),
            Cgroup("burstable.slice", 10 * GI, low=30 * GI, children=(
                Cgroup("b-pod", 10 * GI, low=30 * GI),)),
            Cgroup("besteffort.slice", be_usage, children=be_children),
        )),
    ))


def values(result, name):
    e = result[name]
    return e.emin, e.elow, e.lent_min, e.lent_low


# ---- hand-computed -----------------------------------------------------------------------------
def test_a_child_of_the_reclaim_root_holds_its_own_setting_above_its_usage():
    r = protection(kubepods(20 * GI), recursive=True)
    assert values(r, "kubepods.slice") == (40 * GI, 30 * GI, 0, 0)
    assert r["kubepods.slice"].protected == 40 * GI  # usage 40: all of it
    assert values(r, "system.slice") == (0, 0, 0, 0)
    # The reclaim root's own protection is never applied.
    assert values(r, "/") == (0, 0, 0, 0)


def test_recursiveprot_lends_kubepods_unclaimed_min_to_besteffort():
    # S_min = 10 (G), P = 40, U = 40: P - S = 30 over the unprotected usage 30 (B 10, BE 20).
    r = protection(kubepods(20 * GI), recursive=True)
    assert values(r, "g-pod")[0::2] == (10 * GI, 0)
    assert values(r, "burstable.slice")[0::2] == (10 * GI, 10 * GI)
    assert values(r, "besteffort.slice")[0::2] == (20 * GI, 20 * GI)
    assert r["besteffort.slice"].protected == r["besteffort.slice"].lent == 20 * GI


def test_besteffort_growing_takes_the_larger_share_of_what_is_lent():
    # BE 40: U - S = 50 -> emin BE = 30 * 40 / 50 = 24, Burstable 30 * 10 / 50 = 6; low: S = 10 (B),
    # floating 20 over G 10 + BE 40 -> BE 16, G 4 (the note's worked numbers).
    r = protection(kubepods(40 * GI), recursive=True)
    assert values(r, "besteffort.slice") == (24 * GI, 16 * GI, 24 * GI, 16 * GI)
    assert values(r, "burstable.slice") == (6 * GI, 10 * GI, 6 * GI, 0)
    assert values(r, "g-pod") == (10 * GI, 4 * GI, 0, 4 * GI)
    assert r["besteffort.slice"].protected == 24 * GI
    assert r["burstable.slice"].protected == 10 * GI and r["burstable.slice"].lent == 0


def test_without_recursiveprot_nothing_is_lent():
    r = protection(kubepods(40 * GI), recursive=False)
    assert values(r, "besteffort.slice") == (0, 0, 0, 0)
    assert values(r, "burstable.slice") == (0, 10 * GI, 0, 0)
    assert values(r, "g-pod") == (10 * GI, 0, 0, 0)
    assert values(r, "b-pod") == (0, 10 * GI, 0, 0)


def test_what_besteffort_is_lent_is_lent_on_to_its_pods_by_usage():
    r = protection(kubepods(40 * GI, be_pods=(30 * GI, 10 * GI)), recursive=True)
    # BE slice emin 24 over its pods' usage 40, nobody claims: 24 * 30 / 40 = 18, 24 * 10 / 40 = 6.
    assert values(r, "be-pod0")[0::2] == (18 * GI, 18 * GI)
    assert values(r, "be-pod1")[0::2] == (6 * GI, 6 * GI)
    assert r["be-pod0"].lent == 18 * GI


def test_the_kernel_documentation_example_undercommitted():
    # Parent (a child of the root) low 8G; A low 2G uses 3G, B low 4G uses 1G, C no low uses 4G.
    # S = 2 + 1 = 3 <= 8; P - S = 5 over unprotected usage U - S = 8 - 3 = 5: A +1, C +4.
    tree = Cgroup("r", 0, children=(Cgroup("p", 8 * GI, low=8 * GI, children=(
        Cgroup("a", 3 * GI, low=2 * GI), Cgroup("b", 1 * GI, low=4 * GI), Cgroup("c", 4 * GI))),))
    on = protection(tree, recursive=True)
    assert [values(on, n)[1::2] for n in "abc"] == [(3 * GI, 1 * GI), (1 * GI, 0), (4 * GI, 4 * GI)]
    off = protection(tree, recursive=False)
    assert [off[n].elow for n in "abc"] == [2 * GI, 1 * GI, 0]


def test_overcommitted_claims_are_scaled_alike_and_nothing_is_lent():
    # P = 8, A claims 6, B claims 6 (uses 9): S = 12 > 8 -> each 6 * 8 / 12 = 4; C unclaimed gets 0.
    tree = Cgroup("r", 0, children=(Cgroup("p", 20 * GI, min=8 * GI, children=(
        Cgroup("a", 6 * GI, min=6 * GI), Cgroup("b", 9 * GI, min=6 * GI), Cgroup("c", 5 * GI))),))
    for recursive in (True, False):
        r = protection(tree, recursive=recursive)
        assert [values(r, n) for n in "abc"] == [(4 * GI, 0, 0, 0), (4 * GI, 0, 0, 0), (0, 0, 0, 0)]


def test_usage_below_the_setting_claims_only_the_usage():
    # B claims min(2, 6) = 2: S = 8 <= P = 10; with recursiveprot the 2 left go to C's usage alone.
    tree = Cgroup("r", 0, children=(Cgroup("p", 12 * GI, min=10 * GI, children=(
        Cgroup("a", 6 * GI, min=6 * GI), Cgroup("b", 2 * GI, min=6 * GI), Cgroup("c", 4 * GI))),))
    r = protection(tree, recursive=True)
    assert [values(r, n)[0::2] for n in "abc"] == [(6 * GI, 0), (2 * GI, 0), (2 * GI, 2 * GI)]
    assert r["b"].own_min == 2 * GI


def test_a_cgroup_with_no_usage_gets_nothing_and_claims_nothing():
    tree = Cgroup("r", 0, children=(Cgroup("p", 4 * GI, min=8 * GI, low=8 * GI, children=(
        Cgroup("idle", 0, min=8 * GI, low=8 * GI), Cgroup("busy", 4 * GI))),))
    r = protection(tree, recursive=True)
    assert values(r, "idle") == (0, 0, 0, 0)
    # P = 8 over U - S = 4: 8 * 4 / 4 = 8, twice its usage (P above the parent's usage).
    assert values(r, "busy") == (8 * GI, 8 * GI, 8 * GI, 8 * GI)
    assert r["busy"].protected == 4 * GI and r["busy"].lent == 4 * GI


def test_a_child_of_the_root_with_no_usage_keeps_nothing():
    r = protection(Cgroup("r", 0, children=(Cgroup("p", 0, min=GI),)), recursive=True)
    assert values(r, "p") == (0, 0, 0, 0)


def test_memory_reclaim_on_a_parent_makes_its_children_the_top():
    # The reclaim root is the parent: its children hold their own settings, its own are ignored.
    parent = Cgroup("p", 10 * GI, min=1 * GI, children=(Cgroup("a", 6 * GI, min=8 * GI), Cgroup("b", 4 * GI)))
    r = protection(parent, recursive=True)
    assert values(r, "a") == (8 * GI, 0, 0, 0) and values(r, "b") == (0, 0, 0, 0)
    assert values(r, "p") == (0, 0, 0, 0)


def test_the_kernel_divides_in_whole_pages():
    # P = 10 pages, unclaimed; A uses 1 page, B 2: 10 * 1 / 3 = 3 pages, 10 * 2 / 3 = 6 pages.
    tree = Cgroup("r", 0, children=(Cgroup("p", 3 * PAGE, min=10 * PAGE, children=(
        Cgroup("a", PAGE), Cgroup("b", 2 * PAGE))),))
    r = protection(tree, recursive=True)
    assert (r["a"].emin, r["b"].emin) == (3 * PAGE, 6 * PAGE)
    # A setting that is no whole number of pages counts its whole pages (the files show it so).
    r = protection(Cgroup("r", 0, children=(Cgroup("p", PAGE + 100, min=PAGE + 4000),)), recursive=True)
    assert (r["p"].usage, r["p"].emin) == (PAGE, PAGE)


def test_max_is_page_counter_max_and_the_product_wraps_as_an_unsigned_long():
    # memory.min = max on a child of the root: PAGE_COUNTER_MAX = 2^51 - 1 pages. Lent to A
    # (2^18 pages): (2^51 - 1) * 2^18 wraps to 2^64 - 2^18, / 2^18 = 2^46 - 1 pages.
    assert page_counter_max(PAGE) == (1 << 51) - 1
    tree = Cgroup("r", 0, children=(Cgroup("p", GI, min=(1 << 64) - 1, children=(Cgroup("a", GI),)),))
    r = protection(tree, recursive=True)
    assert r["p"].emin == ((1 << 51) - 1) * PAGE
    assert r["a"].emin == ((1 << 46) - 1) * PAGE and r["a"].protected == GI


@pytest.mark.parametrize("tree, message", [
    (Cgroup("r", 0, children=(Cgroup("a", 1), Cgroup("a", 1))), "cgroup 'a' is named twice in the tree"),
    (Cgroup("r", 0, children=(Cgroup("a", -1),)), "cgroup 'a': usage -1 is negative"),
    (Cgroup("r", 0, children=(Cgroup("a", 1, low=-5),)), "cgroup 'a': memory.low -5 is negative"),
    (Cgroup("", 0), "the root cgroup has no name"),
])
def test_a_tree_it_cannot_take_is_one_clear_line(tree, message):
    with pytest.raises(ValueError) as e:
        protection(tree, recursive=True)
    assert str(e.value) == message


def test_a_page_size_that_is_no_positive_number_is_refused():
    with pytest.raises(ValueError, match="^page size 0 is not a positive number of bytes$"):
        protection(Cgroup("r", 0), recursive=True, page_size=0)


# ---- invariants, over random trees -------------------------------------------------------------
SETTING = st.one_of(st.just(0), st.integers(0, 64).map(lambda n: n * MI), st.just((1 << 64) - 1))


@st.composite
def subtree(draw, name: str, depth: int) -> Cgroup:
    """A cgroup whose usage is its children's plus its own charges, as the kernel counts it."""
    n = draw(st.integers(0, 3)) if depth else 0
    children = tuple(draw(subtree(f"{name}.{i}", depth - 1)) for i in range(n))
    own = draw(st.sampled_from([0, 0, PAGE, 3 * MI, 17 * MI]))
    return Cgroup(name, sum(c.usage for c in children) + own, draw(SETTING), draw(SETTING), children)


TREES = st.integers(0, 3).flatmap(lambda n: st.tuples(*(subtree(f"t{i}", 3) for i in range(n)))).map(
    lambda top: Cgroup("root", sum(c.usage for c in top), children=top))


def walk(node: Cgroup, parent: Cgroup | None = None):
    yield node, parent
    for c in node.children:
        yield from walk(c, node)


HUGE = page_counter_max(PAGE) * PAGE // 2  # from a `max` setting: a product may wrap, as in the kernel


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(TREES)
def test_invariants_of_the_kernels_arithmetic(tree):
    on = protection(tree, recursive=True)
    off = protection(tree, recursive=False)
    for node, parent in walk(tree):
        e, o = on[node.name], off[node.name]
        assert e.usage == node.usage // PAGE * PAGE
        # Without the mount option nothing is lent, and below the top nobody gets more than its claim.
        assert o.lent_min == o.lent_low == o.lent == 0
        if parent is not None and parent is not tree:
            assert o.emin <= o.own_min and o.elow <= o.own_low
        # The option only ever adds.
        assert e.emin >= o.emin and e.elow >= o.elow
        assert 0 <= e.lent <= e.protected <= e.usage
        assert e.lent_min <= e.emin and e.lent_low <= e.elow
        if parent is None or parent is tree:
            continue
        p = on[parent.name]
        if p.emin < HUGE:
            assert e.emin <= p.emin  # a share of the parent's, never more (the division floors)
            if p.emin <= p.usage:  # a parent protected up to its usage protects its children up to theirs
                assert e.emin <= e.usage
        if p.elow < HUGE:
            assert e.elow <= p.elow
            if p.elow <= p.usage:
                assert e.elow <= e.usage
    for node, parent in walk(tree):
        if parent is None or not node.children:
            continue
        e = on[node.name]
        if e.emin < HUGE:  # the children's shares add up to the parent's at most
            assert sum(on[c.name].emin for c in node.children) <= e.emin
        if e.elow < HUGE:
            assert sum(on[c.name].elow for c in node.children) <= e.elow
