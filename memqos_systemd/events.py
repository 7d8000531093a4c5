"""What each of systemd's signals means to the daemon: one transition of the agenda (agenda.py,
pure and table-tested), then a wake of the loop (mainloop.py). Nothing is read or written here:
the next step of the loop does what the agenda then says is due.

    UnitNew        one of our units appeared: read it at the next round (its start, if planned)
    UnitRemoved    it went: forget what we held for it; a pod kept only for its slice can go
    JobRemoved     a start of ours is done: write its values now; kubelet.service (re)started:
                   re-read the node and QoS slices, and the pods
    Reloading      systemd is reloading: keep quiet, then re-read everything
    (returned)     systemd is back on the bus (re-executed): re-read everything
    (overflow)     signals came faster than they could be handled: re-read everything

Subscribed in Daemon._connect (`Systemd.subscribe(**events.handlers())`).
"""

from __future__ import annotations

import logging
from typing import Callable

from .agenda import Agenda
from .naming import Naming

__all__ = ["KUBELET_UNIT", "SystemdEvents"]

log = logging.getLogger("memqos_systemd")

KUBELET_UNIT = "kubelet.service"


class SystemdEvents:
    def __init__(self, agenda: Agenda, clock: Callable[[], float], wake: Callable[[], None], metrics,
                 naming: Callable[[], Naming], planned: Callable[[str], bool], forget: Callable[[str], None]):
        """`naming`: the unit names in force (a reload changes them); `planned`: whether the last
        round planned a unit; `forget`: drop what is held for a unit (Observer.forget)."""
        self.agenda, self.clock, self.wake, self.metrics = agenda, clock, wake, metrics
        self.naming, self.planned, self.forget = naming, planned, forget

    def handlers(self) -> dict[str, Callable]:
        """For Systemd.subscribe."""
        return {"on_unit_new": self.on_unit_new, "on_unit_removed": self.on_unit_removed,
                "on_job_removed": self.on_job_removed, "on_reloading": self.on_reloading,
                "on_returned": self.on_systemd_returned, "on_overflow": self.on_signal_overflow}

    def on_unit_new(self, name: str) -> None:
        ref = self.naming().parse_unit(name)
        if ref is not None:
            self.agenda.unit_new(name, ref.level, self.clock(), planned=self.planned(name))
            self.wake()

    def on_unit_removed(self, name: str) -> None:
        ref = self.naming().parse_unit(name)
        if ref is not None:
            self.forget(name)
            self.agenda.unit_removed(name, ref.level)
            if ref.level == "pod":
                self.wake()  # a pod kept only because its slice ran can go now

    def on_job_removed(self, unit: str, result: str) -> None:
        if result != "done":
            return
        if self.naming().parse_unit(unit) is not None:
            self.agenda.job_done(unit)
            self.wake()
        elif unit == KUBELET_UNIT:
            log.info("kubelet.service (re)started: re-reading the kubepods and QoS slices, and the pods")
            self.agenda.kubelet_started(self.clock())
            self.wake()

    def on_reloading(self, active: bool) -> None:
        self.agenda.systemd_changing(active, self.clock())
        if not active:
            log.info("systemd finished reloading: re-reading units")
            self.wake()

    def on_systemd_returned(self) -> None:
        log.info("systemd is back on the bus (re-executed?): re-reading units")
        self.agenda.systemd_returned(self.clock())
        self.wake()

    def on_signal_overflow(self) -> None:
        log.warning("systemd sent unit signals faster than they could be handled; some were dropped:"
                    " re-reading every unit and the pods")
        self.metrics.signal_overflow()
        self.agenda.overflow()
        self.wake()
