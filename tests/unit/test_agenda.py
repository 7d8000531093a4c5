"""The agenda: event sequences plus a clock give what is due, the way test_reconcile.py tests the diff.

Each row is a script of what happened, at what time, and what the agenda must then say is due.
The daemon carries out a `Due`; here `step(t)` plays one successful step as it does (take the
re-read, then fetch, then take the units of the round). Every interleaving of events and timers
that a fix of the daemon was about has its row (the commit or scenario is named)."""

from __future__ import annotations

import pytest

import memqos_systemd.agenda as agenda_mod
from memqos_systemd.agenda import (
    FAST_POLL_FIRST, FULL_RESYNC_EVERY, KUBELET_START_PATIENCE, KUBELET_START_RETRY, SYSTEMD_SETTLE,
    UNKNOWN_UNIT_PATIENCE, Agenda, Due, Refresh,
)

RESYNC, POLL = 60.0, 30.0
POD = "kubepods-burstable-pod8b3c7d2e_4f5a_6b7c_9d1e_3f4a5b6c7d8e.slice"
CTR = "cri-containerd-" + "b" * 64 + ".scope"
UNITS = ["kubepods.slice", "kubepods-burstable.slice", POD, CTR]
LEVEL = {"kubepods.slice": "node", "kubepods-burstable.slice": "qos", POD: "pod", CTR: "container"}


class Script:
    """An agenda and the daemon's side of it."""

    def __init__(self, **kw):
        self.a = Agenda(resync_interval=kw.get("resync", RESYNC), poll_interval=kw.get("poll", POLL),
                        watch_source=kw.get("watch_source", False))

    def step(self, t: float, *, fetch_ok: bool = True) -> tuple[Refresh, frozenset, tuple]:
        """One successful step at `t`: the re-read that is due, the fetch if due, the round."""
        due = self.a.due(t)
        assert not due.quiet
        kind, served = self.a.take_refresh(t)
        self.a.refreshed(kind)
        if due.fetch:
            self.a.fetch_started(t)
            self.a.fetch_ended(t, ok=fetch_ok)
        return kind, served, self.a.take_units()

    def reload_of_systemd(self, t: float, units=UNITS) -> None:
        """A daemon-reload as systemd 252 announces it (11-systemd-facts D)."""
        self.a.systemd_changing(True, t)
        for u in units:
            self.a.unit_removed(u, LEVEL[u])
        for u in units:
            self.a.unit_new(u, LEVEL[u], t, planned=True)
        self.a.systemd_changing(False, t)


def steady(**kw) -> Script:
    """Started at 0: the first step has read everything and fetched."""
    s = Script(**kw)
    s.step(0.0)
    return s


# ---- what is due, from a row of events --------------------------------------------------------
def test_at_start_everything_is_read_and_the_pods_fetched():
    assert Script().a.due(0.0) == Due(resync=True, refresh=Refresh.FULL, fetch=True)


@pytest.mark.parametrize("t, due", [
    (1.0, Due()),  # a steady node between polls: nothing at all
    (POLL, Due(fetch=True)),  # the poll
    (RESYNC, Due(resync=True, refresh=Refresh.TIMER_LIGHT, fetch=True)),  # the timer: upper slices
])
def test_a_steady_node_polls_and_resyncs_on_its_timers(t, due):
    s = steady()
    for poll in range(1, int(t // POLL)):
        s.a.fetch_started(poll * POLL)
        s.a.fetch_ended(poll * POLL, ok=True)
    assert s.a.due(t) == due


def test_a_steady_node_sleeps_until_the_next_poll():
    s = steady()
    assert s.a.timeout(1.0) == POLL - 1.0


def test_every_full_resync_every_th_timer_resync_reads_every_unit():
    s = steady()
    kinds = [s.step(RESYNC * i)[0] for i in range(1, 2 * FULL_RESYNC_EVERY + 1)]
    full = [i for i, k in enumerate(kinds, 1) if k is Refresh.TIMER_FULL]
    assert full == [FULL_RESYNC_EVERY, 2 * FULL_RESYNC_EVERY]
    assert all(k is Refresh.TIMER_LIGHT for i, k in enumerate(kinds, 1) if i not in full)


def test_an_events_full_re_read_starts_the_count_of_timer_resyncs_again():
    s = steady()
    for i in range(1, FULL_RESYNC_EVERY - 1):
        s.step(RESYNC * i)
    s.a.overflow()  # any event that reads every unit
    assert s.step(RESYNC * (FULL_RESYNC_EVERY - 1) - 1)[0] is Refresh.FULL
    assert s.step(RESYNC * (FULL_RESYNC_EVERY - 1))[0] is Refresh.TIMER_LIGHT


@pytest.mark.parametrize("event, refresh, fetch", [
    ("kubelet_started", Refresh.LIGHT, True),  # the slices a kubelet start rewrites, and the pods
    ("overflow", Refresh.FULL, True),  # dropped signals: everything
    ("connected", Refresh.FULL, False),  # a new connection: what systemd holds
    ("systemd_returned", Refresh.FULL, False),  # a re-exec
])
def test_events_that_call_for_a_re_read(event, refresh, fetch):
    s = steady()
    method = getattr(s.a, event)
    method(10.0) if event in ("kubelet_started", "systemd_returned") else method()
    t = 10.0 + SYSTEMD_SETTLE
    assert s.a.due(t) == Due(refresh=refresh, fetch=fetch)


def test_a_kubelet_start_and_the_timer_in_one_step_merge_to_the_larger():
    s = steady()
    for i in range(1, FULL_RESYNC_EVERY):
        s.step(RESYNC * i)
    s.a.kubelet_started(RESYNC * FULL_RESYNC_EVERY)
    assert s.a.due(RESYNC * FULL_RESYNC_EVERY).refresh is Refresh.TIMER_FULL


@pytest.mark.parametrize("kind, levels, trust", [
    (Refresh.TIMER_LIGHT, agenda_mod.LIGHT_LEVELS, True), (Refresh.LIGHT, agenda_mod.LIGHT_LEVELS, False),
    (Refresh.TIMER_FULL, None, True), (Refresh.FULL, None, False),
])
def test_levels_and_trust_follow_from_the_kind_of_re_read(kind, levels, trust):
    assert (kind.levels, kind.trust_kernel) == (levels, trust)


# ---- systemd reloading ---------------------------------------------------------------------------
def test_while_systemd_reloads_nothing_is_read_or_written_and_the_cache_is_in_doubt():
    s = steady()
    s.a.systemd_changing(True, 10.0)
    assert s.a.due(10.5).quiet and s.a.in_doubt(10.5) and s.a.systemd_reloading
    s.a.systemd_changing(False, 12.0)
    assert s.a.due(12.5).quiet  # settling
    assert s.a.due(12.0 + SYSTEMD_SETTLE) == Due(refresh=Refresh.FULL, fetch=False)
    assert s.a.in_doubt(12.0 + SYSTEMD_SETTLE)  # until the full re-read has been taken
    s.step(12.0 + SYSTEMD_SETTLE)
    assert not s.a.in_doubt(12.0 + SYSTEMD_SETTLE)


def test_a_reload_whose_end_is_never_reported_ends_at_the_next_resync():
    s = steady()
    s.a.systemd_changing(True, 10.0)
    assert s.a.due(10.0 + RESYNC - 0.01).quiet
    assert not s.a.due(10.0 + RESYNC).quiet


def test_a_daemon_reload_costs_one_read_per_unit():
    """2c46556: a daemon-reload announces every unit (UnitRemoved, UnitNew) before Reloading(false);
    the full re-read after it serves those UnitNew, so the round reads none of them again."""
    s = steady()
    s.reload_of_systemd(10.0)
    kind, served, (new, started) = s.step(10.0 + SYSTEMD_SETTLE)
    assert kind is Refresh.FULL and served == set(UNITS)
    assert new == set() and started == set()


def test_a_unit_announced_while_the_full_re_read_awaits_is_read_by_the_round():
    s = steady()
    s.reload_of_systemd(10.0)
    kind, served = s.a.take_refresh(11.0)
    s.a.unit_new(CTR, "container", 11.1, planned=True)  # while refresh_all awaits
    s.a.refreshed(kind)
    assert s.a.take_units() == ({CTR}, set())


def test_a_round_under_way_when_systemd_starts_reloading_is_dropped_and_its_units_read_later():
    """6afb8d7 (e2e 40-survival): a round that had taken its units and was waiting (for the pods)
    when Reloading(true) arrived went on with a cache the UnitRemoveds had emptied. The daemon asks
    `in_doubt` after each await, drops the round and puts its units back."""
    s = steady()
    s.a.unit_new(POD, "pod", 10.0, planned=True)
    new, started = s.a.take_units()
    s.a.systemd_changing(True, 10.1)  # while the round awaits
    assert s.a.in_doubt(10.2)
    s.a.put_back_units(new, started)
    s.a.systemd_changing(False, 11.0)
    kind, served, units = s.step(11.0 + SYSTEMD_SETTLE)
    assert kind is Refresh.FULL and POD in served and units == (set(), set())


def test_a_pod_list_fetched_while_systemd_reloads_is_asked_for_again_after_the_re_read():
    """f311e76: a pod list that arrived while a reload's UnitRemoveds had emptied the cache found no
    slice running, and a carried-over pod was dropped for good. The fetch is asked for again."""
    s = steady()
    s.a.fetch_started(10.0)
    s.a.systemd_changing(True, 10.1)
    s.a.fetch_ended(10.2, ok=True)
    assert s.a.in_doubt(10.2)
    s.a.fetch_now()  # what the daemon does with a list that came while in doubt
    s.a.systemd_changing(False, 11.0)
    assert s.a.due(11.0 + SYSTEMD_SETTLE) == Due(refresh=Refresh.FULL, fetch=True)


def test_a_re_exec_leaves_the_cache_in_doubt_until_the_full_re_read():
    """29b79d2: a daemon-reexec announces every unit removed and none new; a round held past the
    settle time must still not diff the emptied cache."""
    s = steady()
    for u in UNITS:
        s.a.unit_removed(u, LEVEL[u])
    s.a.systemd_returned(10.0)
    assert s.a.in_doubt(10.0 + 5 * SYSTEMD_SETTLE)
    s.step(10.0 + 5 * SYSTEMD_SETTLE)
    assert not s.a.in_doubt(10.0 + 5 * SYSTEMD_SETTLE)


def test_a_failed_re_read_is_tried_again_with_what_it_served():
    s = steady()
    s.reload_of_systemd(10.0)
    kind, served = s.a.take_refresh(11.0)
    s.a.put_back_refresh(kind, served)  # refresh_all raised
    assert s.a.due(11.5).refresh is Refresh.FULL
    assert s.a.take_refresh(11.5) == (Refresh.FULL, served)


# ---- the pods ------------------------------------------------------------------------------------
def test_a_pod_slice_gone_asks_for_the_pods_and_a_scope_gone_does_not():
    s = steady()
    s.a.unit_removed(CTR, "container")
    assert not s.a.due(1.0).fetch
    s.a.unit_removed(POD, "pod")
    assert s.a.due(1.0).fetch


def test_an_unknown_unit_is_asked_about_at_once_then_less_often_until_planned():
    s = steady()
    s.a.unit_new(CTR, "container", 10.0, planned=False)
    assert s.a.unknown_units == {CTR} and s.a.due(10.0).fetch
    t = 10.0
    for gap in (FAST_POLL_FIRST, 0.2, 0.4, 0.8, 1.6):  # doubling, from the fetch that served it
        s.a.fetch_started(t)
        s.a.fetch_ended(t, ok=True)
        assert not s.a.due(t + gap - 0.01).fetch and s.a.due(t + gap + 0.001).fetch, gap
        t += gap + 0.001
    s.a.planned({CTR}, t)
    assert s.a.unknown_units == frozenset() and not s.a.due(t + 0.01).fetch


def test_a_new_unknown_unit_starts_the_fast_polls_over():
    s = steady()
    s.a.unit_new(CTR, "container", 10.0, planned=False)
    for t in (10.0, 10.1, 10.3, 10.7):
        s.a.fetch_started(t)
        s.a.fetch_ended(t, ok=True)
    s.a.unit_new(POD, "pod", 10.8, planned=False)
    assert s.a.due(10.8).fetch and s.a.timeout(10.8) == 0.0


def test_an_unknown_unit_is_not_asked_about_after_its_patience():
    s = steady()
    s.a.unit_new(CTR, "container", 1.0, planned=False)
    s.a.planned((), 1.0 + UNKNOWN_UNIT_PATIENCE)
    assert s.a.unknown_units == frozenset()
    s.a.fetch_started(1.0 + UNKNOWN_UNIT_PATIENCE)
    s.a.fetch_ended(1.0 + UNKNOWN_UNIT_PATIENCE, ok=True)
    assert not s.a.due(1.0 + UNKNOWN_UNIT_PATIENCE + 1.0).fetch


def test_a_unit_loaded_before_any_plan_is_not_unknown():
    s = Script()
    s.a.unit_new(CTR, "container", 0.0, planned=True)
    assert s.a.unknown_units == frozenset()


def test_a_kubelet_that_has_just_started_and_does_not_answer_is_asked_again_soon():
    s = steady()
    s.a.kubelet_started(10.0)
    s.step(10.0, fetch_ok=False)
    assert not s.a.due(10.0 + KUBELET_START_RETRY / 2).fetch
    assert s.a.timeout(10.0) == KUBELET_START_RETRY
    assert s.a.due(10.0 + KUBELET_START_RETRY).fetch
    late = 10.0 + KUBELET_START_PATIENCE + 1.0
    s.a.fetch_started(late)
    s.a.fetch_ended(late, ok=False)
    assert s.a.timeout(late) == min(POLL, RESYNC - late)  # past its patience: the next poll (or resync)


def test_after_the_kubelets_start_its_mode_is_decided_until_it_answers_or_its_patience_ends():
    """Issue 42, the hand-back race: /pods may answer before /metrics; while the kubelet has not
    said what it writes itself, its writes are held for it (Companion.hold) and it is asked again
    KUBELET_START_RETRY after each fetch; a reset found then is its start's."""
    s = steady()
    assert not s.a.deciding(5.0) and not s.a.kubelet_starting(5.0)
    s.a.kubelet_started(10.0)
    assert s.a.take_kubelet_start() and not s.a.take_kubelet_start()  # taken once
    s.step(10.0)
    assert s.a.ask_kubelet() and s.a.deciding(10.0) and s.a.kubelet_starting(10.0)
    s.a.ask_again()  # its /metrics refused: asked at the next fetch, soon
    assert s.a.timeout(10.0) == KUBELET_START_RETRY and s.a.due(10.0 + KUBELET_START_RETRY).fetch
    s.step(10.0 + KUBELET_START_RETRY)
    assert s.a.ask_kubelet()
    s.a.kubelet_answered()
    assert not s.a.deciding(11.0) and s.a.kubelet_starting(11.0)
    assert s.a.timeout(11.0) > KUBELET_START_RETRY  # nothing more to ask
    s.a.kubelet_started(100.0)  # again, and it never answers: decided when its patience ends
    assert s.a.deciding(100.0 + KUBELET_START_PATIENCE - 0.1)
    assert not s.a.deciding(100.0 + KUBELET_START_PATIENCE)
    assert not s.a.kubelet_starting(100.0 + agenda_mod.KUBELET_START_WINDOW)


def test_a_pods_file_is_watched_every_second_and_an_edit_asks_for_it():
    s = steady(watch_source=True)
    assert s.a.timeout(1.0) == agenda_mod.SOURCE_WATCH_INTERVAL
    s.a.source_changed()
    assert s.a.due(1.0).fetch


# ---- config reloads, units, requests ----------------------------------------------------------------
def test_a_config_reload_to_a_shorter_resync_interval_takes_effect_at_once():
    """5e2b36e: the deadline set with the old interval could be up to that interval away."""
    s = steady()
    s.a.reload_asked()
    assert s.a.due(10.0).reload
    s.a.reload_taken()
    s.a.config_changed(10.0, resync_interval=1.0, poll_interval=POLL, watch_source=False, source_changed=False)
    assert s.a.due(10.5) == Due(refresh=Refresh.FULL)
    s.step(10.5)
    assert s.a.due(11.0).resync


def test_a_config_reload_with_another_pod_source_fetches():
    s = steady()
    s.a.config_changed(10.0, resync_interval=RESYNC, poll_interval=1.0, watch_source=False, source_changed=True)
    assert s.a.due(10.0).fetch
    s.step(10.0)
    assert s.a.timeout(10.0) == 1.0


def test_units_announced_are_taken_by_one_round_and_put_back_if_it_fails():
    s = steady()
    s.a.unit_new(POD, "pod", 1.0, planned=True)
    s.a.job_done(CTR)
    assert s.a.has_units()
    taken = s.a.take_units()
    assert taken == ({POD}, {CTR}) and not s.a.has_units()
    s.a.put_back_units(*taken)
    assert s.a.take_units() == taken


def test_a_unit_removed_before_its_round_is_not_read():
    s = steady()
    s.a.unit_new(POD, "pod", 1.0, planned=True)
    s.a.job_done(POD)
    s.a.unit_removed(POD, "pod")
    assert s.a.take_units() == (set(), set())


def test_resync_now_brings_the_timer_round_at_the_next_step():
    s = steady()
    s.a.resync_now()
    assert s.a.due(1.0) == Due(resync=True, refresh=Refresh.TIMER_LIGHT)
    s.step(1.0)
    assert not s.a.due(2.0).resync


def test_the_upper_slices_are_watched_closely_only_while_a_writer_is_about():
    """Every wake of the watch costs the loop; close (every second) only after a foreign write was
    found, or right after the kubelet started (it writes its zeros as it starts)."""
    s = steady()
    assert s.a.ticks.watch_interval(10.0) == agenda_mod.KERNEL_WATCH_IDLE
    s.a.foreign_write(10.0)
    assert s.a.ticks.watch_interval(11.0) == agenda_mod.KERNEL_WATCH_INTERVAL
    assert s.a.ticks.watch_interval(10.0 + agenda_mod.KERNEL_WATCH_ALERT) == agenda_mod.KERNEL_WATCH_IDLE
    s.a.kubelet_started(5000.0)
    assert s.a.ticks.watch_interval(5001.0) == agenda_mod.KERNEL_WATCH_INTERVAL
    after = 5000.0 + agenda_mod.KERNEL_WATCH_AFTER_KUBELET_START
    assert s.a.ticks.watch_interval(after) == agenda_mod.KERNEL_WATCH_IDLE


def test_a_drift_in_the_kernel_re_reads_the_slices_whose_cgroup_differs_and_watches_closely():
    s = steady()
    s.a.kernel_drift(1.0)
    assert s.a.due(1.0) == Due(refresh=Refresh.TIMER_LIGHT)  # as the timer would: the same reads either way
    assert s.a.due(1.0).refresh.trust_kernel and s.a.due(1.0).refresh.levels == agenda_mod.LIGHT_LEVELS
    assert s.a.ticks.watch_interval(2.0) == agenda_mod.KERNEL_WATCH_INTERVAL
    assert s.a.ticks.watch_interval(1.0 + agenda_mod.KERNEL_WATCH_AFTER_DRIFT) == agenda_mod.KERNEL_WATCH_IDLE


# ---- the ticks beside the rounds (issue 27: every periodic task on the agenda's schedule) --------
def ticks_over(a: Agenda, until: float) -> list[tuple[float, str]]:
    """Play the daemon's tick loop from 0 to `until`: (time, tick) of every tick carried out."""
    done, t = [], 0.0
    while t <= until:
        for tick in a.ticks.due(t):
            done.append((round(t, 3), str(tick)))
            a.ticks.done(tick, t)
        t = t + a.ticks.timeout(t) if a.ticks.timeout(t) > 0 else t + 0.001
    return done


def test_the_heartbeat_comes_at_once_then_every_interval_whatever_else_is_due():
    a = Agenda(resync_interval=RESYNC, poll_interval=POLL, heartbeat_interval=agenda_mod.HEARTBEAT_INTERVAL)
    beats = [t for t, tick in ticks_over(a, 35.0) if tick == "heartbeat"]
    assert beats == [0.0, 10.0, 20.0, 30.0]


def test_a_watchdog_shorter_than_the_beat_makes_the_beat_its_half():
    a = Agenda(resync_interval=RESYNC, poll_interval=POLL, heartbeat_interval=2.5)  # WatchdogSec=5s
    assert [t for t, tick in ticks_over(a, 6.0) if tick == "heartbeat"] == [0.0, 2.5, 5.0]


def test_the_watch_tick_follows_the_watch_interval():
    a = Agenda(resync_interval=RESYNC, poll_interval=POLL)
    idle = [t for t, tick in ticks_over(a, 11.0) if tick == "watch"]
    assert idle == [agenda_mod.KERNEL_WATCH_IDLE, 2 * agenda_mod.KERNEL_WATCH_IDLE]
    assert not a.ticks.take_moved()
    a.kernel_drift(11.0)  # a writer about: every second from now on, not from the idle look due at 15
    assert a.ticks.take_moved() and not a.ticks.take_moved()  # the tick loop is woken once
    watched = [t for t, tick in ticks_over(a, 20.0) if tick == "watch" and t > 11.0]
    assert watched[:4] == [12.0, 13.0, 14.0, 15.0]
    a.kernel_drift(20.5)  # already close (the next look at 21): no tick moves, nothing to wake
    assert not a.ticks.take_moved()


def test_the_tick_loop_sleeps_until_the_next_tick():
    a = Agenda(resync_interval=RESYNC, poll_interval=POLL, now=100.0)
    assert [str(t) for t in a.ticks.due(100.0)] == ["heartbeat"]
    a.ticks.done(agenda_mod.Tick.HEARTBEAT, 100.0)
    assert a.ticks.timeout(100.0) == min(agenda_mod.KERNEL_WATCH_IDLE, agenda_mod.HEARTBEAT_INTERVAL)


# ---- a feature's look again (the BestEffort ceiling's steps, issue 25) ---------------------------
def _follow(a, look, t, following, moved):
    """What the daemon does after a round: the feature's Look, its `at` handed to the agenda."""
    from memqos_systemd.ceiling import FOLLOW_FIRST, FOLLOW_MAX
    look = agenda_mod.follow(look, t, following, moved, FOLLOW_FIRST, FOLLOW_MAX)
    a.look_again({"bestEffortCeiling": look.at})
    return look


def test_following_looks_again_soon_after_a_move_and_backs_off_while_nothing_moves():
    from memqos_systemd.ceiling import FOLLOW_FIRST, FOLLOW_MAX
    s = steady(poll=1000.0, resync=1000.0)
    a = s.a
    assert a.timeout(10.0) == 990.0  # not following: only the timers
    look = _follow(a, agenda_mod.Look(), 10.0, following=True, moved=True)  # stepped to the usage
    assert a.timeout(10.0) == FOLLOW_FIRST == 1.0
    look = _follow(a, look, 10.5, following=True, moved=False)  # a round for another reason: the look stands
    assert a.timeout(10.5) == 0.5
    waits = []
    t = 11.0
    for _ in range(7):  # the looks, with nothing moving: 2, 4, 8, 16, 30, 30, 30
        look = _follow(a, look, t, following=True, moved=False)
        waits.append(a.timeout(t))
        t += waits[-1]
    assert waits == [2.0, 4.0, 8.0, 16.0, FOLLOW_MAX, 30.0, 30.0]
    look = _follow(a, look, t, following=True, moved=True)  # the usage fell: the next step goes, and soon again
    assert a.timeout(t) == 1.0
    look = _follow(a, look, t + 1, following=False, moved=True)  # at the plan
    assert a.timeout(t + 1) > 100


def test_following_from_a_round_that_did_not_step_starts_at_the_first_interval():
    s = steady(poll=1000.0, resync=1000.0)
    _follow(s.a, agenda_mod.Look(), 5.0, following=True, moved=False)  # e.g. usage unreadable: nothing sent yet
    assert s.a.timeout(5.0) == 1.0


@pytest.mark.parametrize("look, now, following, moved, expected", [
    (agenda_mod.Look(), 0.0, False, False, agenda_mod.Look()),  # not following: no look
    (agenda_mod.Look(5.0, 4.0), 3.0, False, True, agenda_mod.Look()),  # at the plan: the look is dropped
    (agenda_mod.Look(), 3.0, True, False, agenda_mod.Look(4.0, 1.0)),  # the first: soon
    (agenda_mod.Look(9.0, 8.0), 3.0, True, True, agenda_mod.Look(4.0, 1.0)),  # moved: soon again
    (agenda_mod.Look(9.0, 8.0), 3.0, True, False, agenda_mod.Look(9.0, 8.0)),  # before it is due: it stands
    (agenda_mod.Look(9.0, 8.0), 9.0, True, False, agenda_mod.Look(25.0, 16.0)),  # due, nothing moved: twice
    (agenda_mod.Look(9.0, 20.0), 9.5, True, False, agenda_mod.Look(39.5, 30.0)),  # never longer than most
])
def test_follow_table(look, now, following, moved, expected):
    assert agenda_mod.follow(look, now, following, moved, 1.0, 30.0) == expected


def test_each_feature_has_its_own_look_and_infinity_drops_one():
    s = steady(poll=1000.0, resync=1000.0)
    s.a.look_again({"one": 15.0})
    s.a.look_again({"two": 12.0})
    assert s.a.timeout(10.0) == 2.0
    s.a.look_again({"two": float("inf")})
    assert s.a.timeout(10.0) == 5.0
    s.a.look_again({"one": 20.0})  # replaces its last
    assert s.a.timeout(10.0) == 10.0


def test_a_drift_soon_after_another_is_re_read_after_the_gap_not_at_once():
    """Issue 29: the watch looks whenever a watched file is written (inotify), so a writer in a
    tight loop would have every write re-read and put back. The first drift after a quiet time is
    re-read at once; one found within KERNEL_DRIFT_GAP of it waits for the gap's end, and the loop
    sleeps no longer than that."""
    gap = agenda_mod.KERNEL_DRIFT_GAP
    s = steady()
    s.a.kernel_drift(100.0)
    assert s.step(100.0)[0] is Refresh.TIMER_LIGHT  # at once
    s.a.kernel_drift(100.1)  # our put-back was answered; the writer's file write came after it
    assert s.a.due(100.1).refresh is Refresh.NONE
    assert s.a.timeout(100.1) == pytest.approx(gap - 0.1)
    s.a.kernel_drift(100.2)  # and again: still one re-read, at the gap's end
    assert s.a.due(100.0 + gap) == Due(refresh=Refresh.TIMER_LIGHT)
    assert s.step(100.0 + gap)[0] is Refresh.TIMER_LIGHT
    assert s.a.due(100.0 + gap + 0.01).refresh is Refresh.NONE  # taken
    s.a.kernel_drift(100.0 + 2 * gap + 0.01)  # the next one after a gap: at once again
    assert s.a.due(100.0 + 2 * gap + 0.01).refresh is Refresh.TIMER_LIGHT


def test_a_tight_loop_writer_costs_one_re_read_a_gap():
    gap = agenda_mod.KERNEL_DRIFT_GAP
    s = steady()
    reads, t = 0, 50.0
    while t < 60.0:
        s.a.kernel_drift(t)  # a write every 10 ms, each found by the watch
        if s.a.due(t).refresh is not Refresh.NONE:
            s.step(t)
            reads += 1
        t += 0.01
    assert reads <= 10.0 / gap + 1
