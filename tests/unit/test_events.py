"""What each of systemd's signals does (events.py): a row per signal, with a real Agenda (pure)
and the daemon's side recorded: wakes, forgets, the overflow counter."""
from __future__ import annotations

import pytest

from memqos_systemd.agenda import Agenda
from memqos_systemd.config import parse_config
from memqos_systemd.events import KUBELET_UNIT, SystemdEvents
from memqos_systemd.naming import Naming

POD = "kubepods-burstable-pod8b3c7d2e_4f5a_6b7c_9d1e_3f4a5b6c7d8e.slice"
CTR = "cri-containerd-" + "b" * 64 + ".scope"
NAMING = Naming.for_config(parse_config({}))


class Side:
    def __init__(self):
        self.wakes, self.forgot, self.overflows = 0, [], 0

    def signal_overflow(self):
        self.overflows += 1


NOW = 1.0  # a second after a first step that read everything and fetched: nothing is due


def made(now=NOW):
    side = Side()
    agenda = Agenda(resync_interval=60.0, poll_interval=30.0, watch_source=False)
    kind, _ = agenda.take_refresh(0.0)
    agenda.refreshed(kind)
    agenda.fetch_started(0.0)
    agenda.fetch_ended(0.0, ok=True)
    agenda.take_units()
    assert not agenda.due(now).refresh and not agenda.due(now).fetch
    events = SystemdEvents(agenda, lambda: now, lambda: setattr(side, "wakes", side.wakes + 1), side,
                           lambda: NAMING, planned=lambda unit: True, forget=side.forgot.append)
    return events, agenda, side


@pytest.mark.parametrize("signal, args, wakes, forgot, new, started", [
    ("on_unit_new", (POD,), 1, [], {POD}, set()),
    ("on_unit_new", (CTR,), 1, [], {CTR}, set()),
    ("on_unit_new", ("cron.service",), 0, [], set(), set()),  # not ours: nothing
    ("on_unit_removed", (POD,), 1, [POD], set(), set()),  # a pod kept for its slice may go
    ("on_unit_removed", (CTR,), 0, [CTR], set(), set()),
    ("on_unit_removed", ("cron.service",), 0, [], set(), set()),
    ("on_job_removed", (POD, "done"), 1, [], set(), {POD}),
    ("on_job_removed", (POD, "failed"), 0, [], set(), set()),  # only a start that happened
    ("on_job_removed", ("cron.service", "done"), 0, [], set(), set()),
])
def test_unit_signals(signal, args, wakes, forgot, new, started):
    events, agenda, side = made()
    getattr(events, signal)(*args)
    assert (side.wakes, side.forgot) == (wakes, forgot)
    assert agenda.take_units() == (new, started)


def test_a_kubelet_start_rereads_the_upper_slices_and_the_pods():
    events, agenda, side = made()
    events.on_job_removed(KUBELET_UNIT, "done")
    assert side.wakes == 1
    due = agenda.due(NOW)
    assert due.refresh and due.fetch


def test_a_reload_of_systemd_is_quiet_until_it_ends_then_rereads_every_unit():
    events, agenda, side = made()
    events.on_reloading(True)
    assert side.wakes == 0 and agenda.due(NOW).quiet
    events.on_reloading(False)
    assert side.wakes == 1 and agenda.due(NOW).quiet  # it settles first
    assert not agenda.due(NOW + 10).quiet and agenda.due(NOW + 10).refresh


def test_an_overflow_is_counted_and_rereads_every_unit_and_the_pods():
    events, agenda, side = made()
    events.on_signal_overflow()
    assert (side.wakes, side.overflows) == (1, 1)
    due = agenda.due(NOW)
    assert due.refresh and due.fetch


def test_the_handlers_are_every_signal_subscribe_takes():
    events, _, _ = made()
    assert set(events.handlers()) == {"on_unit_new", "on_unit_removed", "on_job_removed", "on_reloading",
                                      "on_returned", "on_overflow"}
