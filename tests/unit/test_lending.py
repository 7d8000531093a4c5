"""lending.draw, the lines that follow usage, as a table: the benchmark node's pods (allocatable
730 MiB; G requests 192 Mi, B 320 Mi, B2 126 Mi: 90 % of allocatable), headroom 64 Mi, the grid
16 MiB (1/256 of allocatable is less)."""

from __future__ import annotations

import pytest

from memqos_systemd import lending
from memqos_systemd.lending import Lent, Look, Owner, Seen, State, draw

Mi = 1 << 20
PAGE = 4096
ALLOC = 730 * Mi
HEADROOM = 64 * Mi
Q = 16 * Mi
BE = "kubepods-besteffort.slice"
G, B, B2, P = "g.slice", "b.slice", "b2.slice", "p.slice"
OWNERS = (Owner(G, 192 * Mi), Owner(B, 320 * Mi), Owner(B2, 126 * Mi))
REQUESTS = 638 * Mi
STATIC = 64 * Mi  # 730 - 64 - 638 = 28 MiB, below the ceiling's minimum 64 Mi


def slack(request):
    return max(4 * Mi, request // 16)


def grid(x):
    return x // Q * Q


def run(seen, state=State(), now=100.0, owners=OWNERS, ceiling=(BE, 64 * Mi)):
    return draw(owners, seen, alloc=ALLOC, headroom=HEADROOM, ceiling=ceiling, page_size=PAGE, state=state, now=now)


def used(g, b, b2, **kw):
    return {G: Seen(g * Mi, **kw), B: Seen(b * Mi, **kw), B2: Seen(b2 * Mi, **kw)}


# (what, usage of G, B, B2 in MiB, the ceiling expected)
CEILINGS = [
    ("an idle node: each owner keeps only its slack",
     (0, 0, 0), grid(ALLOC - HEADROOM - slack(192 * Mi) - slack(320 * Mi) - slack(126 * Mi))),
    ("the benchmark's working sets (G 144, B 288, B2 16): usage + slack",
     (144, 288, 16), grid(ALLOC - HEADROOM - (144 + 12 + 288 + 20 + 16) * Mi - slack(126 * Mi))),
    ("the owners use 30 % of allocatable (219 MiB)", (63, 105, 51),
     grid(ALLOC - HEADROOM - (63 + 12 + 105 + 20 + 51) * Mi - slack(126 * Mi))),
    ("every owner at its request: the static line", (192, 320, 126), STATIC),
    ("an owner near its request: its reserve is its request, no more", (190, 320, 126), STATIC),
]


@pytest.mark.parametrize("what,usage,expected", CEILINGS, ids=[c[0] for c in CEILINGS])
def test_ceiling_follows_usage(what, usage, expected):
    lines, state = run(used(*usage))
    assert lines.ceiling == Lent(BE, max(64 * Mi, expected), STATIC)
    assert lines.ceiling.lent == max(64 * Mi, expected) - STATIC
    assert state.ceiling == lines.ceiling.value


def test_benchmark_price_goal_in_numbers():
    """Issue 44's price: the owners use 30 % of allocatable, BestEffort may use at least half of it."""
    lines, _ = run(used(63, 105, 51))
    assert lines.ceiling.value >= ALLOC // 2


def test_unread_owner_keeps_its_whole_request():
    seen = used(0, 0, 0)
    seen[B] = Seen(None)
    lines, state = run(seen)
    assert lines.ceiling.value == grid(ALLOC - HEADROOM - slack(192 * Mi) - 320 * Mi - slack(126 * Mi))
    assert B not in state.owners
    del seen[B]  # not read at all: the same
    assert run(seen)[0].ceiling == lines.ceiling


# (what, B's look before (usage MiB, low, stall µs, seconds ago), B now (usage, low, stall), B pressed)
PRESSES = [
    ("a low event", (100, 5, 0, 10), (100, 6, 0), True),
    ("stalled 1 % of the time since the last look", (100, 0, 0, 10), (100, 0, 100_000), True),
    ("stalled just under 1 %", (100, 0, 0, 10), (100, 0, 99_999), False),
    ("calm", (100, 5, 7, 10), (100, 5, 7), False),
    ("no look before: nothing to compare", None, (100, 9, 10**9), False),
    ("above its request: a borrower's stall is its own price", (400, 0, 0, 10), (400, 1, 10**8), False),
    ("counters not readable", (100, None, None, 10), (100, None, None), False),
]


@pytest.mark.parametrize("what,before,now_seen,pressed", PRESSES, ids=[p[0] for p in PRESSES])
def test_pressed_owner_takes_its_request_back(what, before, now_seen, pressed):
    state = State()
    if before is not None:
        u, low, stall, ago = before
        state = State({B: Look(100.0 - ago, u * Mi, low, stall)}, None, {})
    seen = used(0, 0, 0)
    u, low, stall = now_seen
    seen[B] = Seen(u * Mi, low, stall)
    lines, after = run(seen, state)
    assert (B in lines.pressed) is pressed
    b_part = 320 * Mi + max(0, u * Mi - 320 * Mi) if pressed or u * Mi >= 320 * Mi else None
    if b_part is not None:
        assert lines.reserved == b_part + slack(192 * Mi) + slack(126 * Mi)
    assert (after.owners[B].pressed_until == 100.0 + lending.PRESS_HOLD) is pressed
    if pressed:
        assert lines.moved


def test_press_holds_then_lets_go():
    state = State({B: Look(90.0, 100 * Mi, 5, 0)}, None, {})
    lines, state = run(used(0, 100, 0, low=6, stall=0), state, now=100.0)
    assert B in lines.pressed
    lines, state = run(used(0, 100, 0, low=6, stall=0), state, now=100.0 + lending.PRESS_HOLD - 1)
    assert B in lines.pressed and not lines.moved  # still pressed, not news
    lines, state = run(used(0, 100, 0, low=6, stall=0), state, now=100.0 + lending.PRESS_HOLD)
    assert B not in lines.pressed


def test_growth_widens_the_slack_ahead_of_it():
    """B grew 100 MiB in 1 s: its slack is 2 s of that growth (HORIZON), up to its request."""
    state = State({B: Look(99.0, 50 * Mi, 0, 0)}, None, {})
    lines, _ = run({G: Seen(0), B: Seen(150 * Mi, 0, 0), B2: Seen(0)}, state)
    assert lines.reserved == slack(192 * Mi) + 320 * Mi + slack(126 * Mi)  # 150 + 200 capped at 320
    state = State({B: Look(99.0, 140 * Mi, 0, 0)}, None, {})
    lines, _ = run({G: Seen(0), B: Seen(150 * Mi, 0, 0), B2: Seen(0)}, state)
    assert lines.reserved == slack(192 * Mi) + 170 * Mi + slack(126 * Mi)  # 10 MiB/s: 20 MiB, the slack's floor


# (what, the line held before, raw line now, the line drawn)
HOLDS = [
    ("first look: on the grid below", None, 100 * Mi + 5, 96 * Mi),
    ("raw a little above: held", 96 * Mi, 96 * Mi + 31 * Mi, 96 * Mi),
    ("raw two steps above: raised", 96 * Mi, 128 * Mi, 128 * Mi),
    ("raw a byte below: lowered to the grid below", 96 * Mi, 96 * Mi - 1, 80 * Mi),
    ("raw far below: lowered at once", 96 * Mi, 10 * Mi, 0),
]


@pytest.mark.parametrize("what,held,raw,expected", HOLDS, ids=[h[0] for h in HOLDS])
def test_lines_move_on_a_grid_with_hysteresis(what, held, raw, expected):
    assert lending._hold(raw, held, Q) == expected


def test_jitter_writes_nothing():
    """The line (176 MiB) has 2.1 MiB below it before it moves, and 32 MiB above."""
    lines, state = run(used(144, 288, 16))
    assert lines.ceiling.value == 176 * Mi and lines.moved
    for b in (290, 287, 260, 289):
        again, _ = run(used(144, b, 16), state, now=101.0)
        assert again.ceiling == lines.ceiling
        assert again.moved is (abs(b - 288) >= 16)  # an owner moved by a grid step: look again soon
    lower, _ = run(used(144, 291, 16), state, now=101.0)
    assert lower.ceiling.value == 160 * Mi and lower.moved
    higher, _ = run(used(144, 240, 16), state, now=101.0)
    assert higher.ceiling.value == 224 * Mi


def test_borrower_pushes_besteffort_down_not_itself():
    """P, Burstable, request 64 Mi and no limit, uses 300 MiB: BestEffort's line yields what P
    borrowed; P's own line counts only the others (and its static line is its floor)."""
    owners = (Owner(G, 192 * Mi), Owner(B, 320 * Mi), Owner(B2, 62 * Mi),
              Owner(P, 64 * Mi, lever=137 * Mi, kep=2**64 - 1))
    seen = {G: Seen(144 * Mi), B: Seen(288 * Mi), B2: Seen(16 * Mi), P: Seen(300 * Mi)}
    lines, _ = run(seen, owners=owners)
    others = (144 * Mi + 12 * Mi) + (288 * Mi + 20 * Mi) + (16 * Mi + slack(62 * Mi))
    assert lines.reserved == others + 64 * Mi + (300 - 64) * Mi
    assert lines.ceiling.value == max(64 * Mi, grid(ALLOC - HEADROOM - lines.reserved))
    assert lines.lever(P) == Lent(P, grid(ALLOC - HEADROOM - others), 137 * Mi)


def test_lever_never_below_static_nor_above_the_kep():
    owners = (Owner(G, 192 * Mi), Owner(B, 320 * Mi), Owner(P, 64 * Mi, lever=137 * Mi, kep=200 * Mi))
    lines, _ = run({G: Seen(0), B: Seen(0), P: Seen(0)}, owners=owners)
    assert lines.lever(P).value == 200 * Mi  # the KEP's pod-level MemoryHigh caps it
    owners = (Owner(G, 192 * Mi), Owner(B, 320 * Mi), Owner(P, 64 * Mi, lever=137 * Mi, kep=2**64 - 1))
    lines, _ = run({G: Seen(None), B: Seen(None), P: Seen(0)}, owners=owners)
    # every other request reserved: what lending's headroom leaves of the others' requests (and never
    # below the static line)
    assert lines.lever(P) == Lent(P, grid(ALLOC - HEADROOM - 512 * Mi), 137 * Mi)
    owners = (Owner(G, 192 * Mi), Owner(B, 320 * Mi), Owner(P, 64 * Mi, lever=218 * Mi, kep=2**64 - 1))
    lines, _ = run({G: Seen(None), B: Seen(None), P: Seen(0)}, owners=owners)
    assert lines.lever(P) == Lent(P, 218 * Mi, 218 * Mi) and lines.lever(P).lent == 0


def test_price_goal_lone_burstable():
    """Issue 44's price: a lone Burstable pod (request 64 Mi, no limit) on an idle node may grow to at
    least 85 % of allocatable."""
    owners = (Owner(G, 192 * Mi), Owner(B, 320 * Mi), Owner(B2, 62 * Mi), Owner(P, 64 * Mi, lever=137 * Mi))
    lines, _ = run({G: Seen(0), B: Seen(0), B2: Seen(0), P: Seen(0)}, owners=owners, ceiling=None)
    assert lines.ceiling is None
    assert lines.lever(P).value >= 0.85 * ALLOC


def test_owner_gone_is_forgotten():
    _, state = run(used(1, 2, 3))
    _, state = run({G: Seen(Mi)}, state, owners=(Owner(G, 192 * Mi),))
    assert set(state.owners) == {G}


def test_quantum_and_slack():
    assert lending.quantum(730 * Mi, PAGE) == 16 * Mi
    assert lending.quantum(64 << 30, PAGE) == 256 * Mi
    assert lending.slack_min(32 * Mi) == 4 * Mi and lending.slack_min(320 * Mi) == 20 * Mi


@pytest.mark.parametrize("what, ceiling, levers, pressed, expected", [
    ("the ceiling lends", Lent(BE, 200 * Mi, 64 * Mi), (), frozenset(), lending.LOOK_MOST),
    ("a lever lends", Lent(BE, 64 * Mi, 64 * Mi), (Lent(P, 300 * Mi, 200 * Mi),), frozenset(), lending.LOOK_MOST),
    ("nothing lent: nothing to take back", Lent(BE, 64 * Mi, 64 * Mi), (Lent(P, 200 * Mi, 200 * Mi),), frozenset(),
     lending.LOOK_IDLE),
    ("no ceiling, no lever lends", None, (), frozenset(), lending.LOOK_IDLE),
    ("nothing lent but an owner pressed: its press ends at a look", Lent(BE, 64 * Mi, 64 * Mi), (), frozenset({B}),
     lending.LOOK_MOST),
])
def test_looks_back_off_further_while_nothing_is_lent(what, ceiling, levers, pressed, expected):
    lines = lending.Lines(ceiling, levers, 0, pressed, False)
    assert lending.look_most(lines) == expected
    assert lending.look_most(None) == lending.LOOK_MOST  # before a first look
    assert lending.LOOK_FIRST < lending.LOOK_MOST <= lending.LOOK_IDLE
