"""The service's loop, and nothing else: it knows no pod, unit or plan.

It runs the daemon's step (daemon.py: what is due, then one round) again and again, sleeping
between steps until the agenda's next deadline or a wake-up, whichever comes first. Beside the
steps, the agenda's ticks (`Tick`: the heartbeat, the watch of the upper slices' cgroups) run in
a task of their own, so a step that waits on systemd or the pod source never holds up the
heartbeat. A step that fails because of systemd is retried after a backoff that doubles up to
BACKOFF_MAX; only a stop or a config reload cuts it short.

Wake-ups: `wake()` (every event handler ends with it), the Unix signals and the file descriptors
given to `run`. `stop()` ends the loop after the step in progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Awaitable, Callable

from .agenda import Agenda, Tick
from .systemd import SystemdError

__all__ = ["BACKOFF_MAX", "MainLoop", "until_set"]

log = logging.getLogger("memqos_systemd")

BACKOFF_MAX = 30.0


async def until_set(event: asyncio.Event, timeout: float) -> None:
    """Wait until `event` is set, or for `timeout` seconds."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)


class MainLoop:
    def __init__(self, agenda: Agenda, clock: Callable[[], float]):
        self.agenda = agenda
        self.clock = clock
        self.stopping = False
        self._wake = asyncio.Event()
        self._ticks_moved = asyncio.Event()  # an event brought a tick forward (Ticks.take_moved)
        self._stop = asyncio.Event()

    def wake(self) -> None:
        """Look at the agenda again now: an event that comes while a step works ends the next
        sleep at once."""
        self._wake.set()
        self.ticks_moved()

    def ticks_moved(self) -> None:
        """An event may have brought a tick forward (the close watch after a foreign write)."""
        if self.agenda.ticks.take_moved():
            self._ticks_moved.set()

    def stop(self) -> None:
        self.stopping = True
        self._stop.set()
        self._wake.set()

    async def run(self, step: Callable[[], Awaitable[None]], ticks: dict[Tick, Callable[[], None]],
                  readers: list[tuple[Any, Callable[[], None]]], signals: dict[int, Callable[[], None]]) -> None:
        """Until `stop()`: `step`, then sleep. `ticks`: what each tick of the agenda does;
        `readers`: (an object with fileno(), or None; what its readability means); `signals`:
        a handler per Unix signal."""
        loop = asyncio.get_running_loop()
        for sig, handler in signals.items():
            loop.add_signal_handler(sig, handler)
        fds = [(source.fileno(), handler) for source, handler in readers if source is not None]
        for fd, handler in fds:
            loop.add_reader(fd, handler)
        ticking = asyncio.create_task(self._tick(ticks))
        backoff = 1.0
        try:
            while not self.stopping:
                try:
                    await step()
                    backoff = 1.0
                except SystemdError as e:
                    log.error("systemd: %s; retrying in %.0fs", e, backoff)
                    await self._backoff(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX)
                    continue
                await until_set(self._wake, self.agenda.timeout(self.clock()))  # a wake meanwhile: at once
                self._wake.clear()
        finally:
            ticking.cancel()
            for fd, _ in fds:
                loop.remove_reader(fd)

    async def _tick(self, ticks: dict[Tick, Callable[[], None]]) -> None:
        """The agenda's ticks, each when it is due. A tick never waits on systemd or the pod source."""
        while not self.stopping:
            for tick in self.agenda.ticks.due(self.clock()):
                ticks[tick]()
                self.agenda.ticks.done(tick, self.clock())
            await until_set(self._ticks_moved, self.agenda.ticks.timeout(self.clock()))  # (a stop cancels it)
            self._ticks_moved.clear()

    async def _backoff(self, seconds: float) -> None:
        """Wait after a failure. Unit and job signals do not cut it short (seen in the VM: a
        stopped kubepods.slice and a stream of UnitNew made 157 failed calls in 3 s); only a stop
        or a config reload does."""
        deadline = self.clock() + seconds
        while not self.stopping and not self.agenda.due(self.clock()).reload and self.clock() < deadline:
            await until_set(self._stop, min(0.25, deadline - self.clock()))
