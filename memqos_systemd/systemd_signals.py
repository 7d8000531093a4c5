"""systemd's signal feed: Manager.Subscribe, the signals read off the bus, counted and handed to
their handlers one at a time.

`Systemd` (systemd.py) owns one `SignalFeed` on its connection (`Systemd.signals`) and keeps the
calls; the feed keeps what it learns from the signals:
- the handlers' queue and its dispatcher (`subscribe`): UnitNew, UnitRemoved, JobRemoved and
  Reloading from systemd, and systemd's return on the bus (NameOwnerChanged: subscribe again);
- the count of unit signals read so far (`signal_count`, which the connection reads as each reply
  is read: `UnitStatus.seen`), and when each unit's last signal and last UnitRemoved were read
  (`changed_since`, `removed_since`): a call's answer about a unit is stale if a signal for it
  was counted after the answer was read.
`on_signal(unit)`, given by the owner, runs as each unit signal is read, before any handler: the
calls' cache of a unit's invocation path is dropped there (a new run of the unit, or none).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable

from dbus_next import Message, MessageType

from .bus import Bus, SystemdError

__all__ = ["SignalFeed", "MAX_QUEUED_SIGNALS", "Callback"]

# The logger of the systemd adapter as a whole (bus.py, systemd.py): its lines read as before.
log = logging.getLogger("memqos_systemd.systemd")

SYSTEMD = "org.freedesktop.systemd1"
MANAGER_PATH = "/org/freedesktop/systemd1"
MANAGER = "org.freedesktop.systemd1.Manager"
_BUS_NAME = "org.freedesktop.DBus"
_BUS_PATH = "/org/freedesktop/DBus"
_MAX_REMOVALS_TRACKED = 10000
# Unit signals waiting for their handlers, at most; past that they are dropped and the handlers
# get one on_overflow() once the queue has drained (see subscribe).
MAX_QUEUED_SIGNALS = 10000
_UNIT_SIGNAL_HANDLERS = frozenset({"on_unit_new", "on_unit_removed", "on_job_removed"})

# One rule per signal handled: the manager also sends JobNew, StartupFinished, UnitFilesChanged,
# and a burst of pods brings a JobNew per unit, each decoded in Python for nothing otherwise.
_SIGNAL_MATCHES = tuple(f"type='signal',sender='{SYSTEMD}',path='{MANAGER_PATH}',interface='{MANAGER}',"
                        f"member='{member}'" for member in ("UnitNew", "UnitRemoved", "JobRemoved", "Reloading"))
_OWNER_MATCH = (f"type='signal',sender='{_BUS_NAME}',path='{_BUS_PATH}',interface='{_BUS_NAME}',"
                f"member='NameOwnerChanged',arg0='{SYSTEMD}'")

_ALREADY_SUBSCRIBED = "org.freedesktop.systemd1.AlreadySubscribed"

Callback = Callable[..., Awaitable[None] | None]


class SignalFeed:
    """systemd's signals on one connection, for the `Systemd` that owns it (`Systemd.signals`)."""

    def __init__(self, bus: Bus, on_signal: Callable[[str], None] = lambda unit: None):
        self._bus = bus
        self._on_signal = on_signal
        self._handlers: dict[str, Callback | None] = {}
        self._subscribed = False
        self._systemd_owner: str | None = None
        self._events: asyncio.Queue[tuple[str, tuple]] = asyncio.Queue()
        self._overflowed = False  # unit signals were dropped since the queue last drained
        self.overflows = 0  # how many times that happened
        # Unit signals as read off the bus, counted (see Systemd.set_memory_if_loaded and UnitStatus):
        # unit -> the count at its last UnitRemoved, and at its last UnitNew/UnitRemoved/JobRemoved.
        self._signal_seq = 0
        self._removed_at: dict[str, int] = {}
        self._changed_at: dict[str, int] = {}
        self._dispatcher: asyncio.Task | None = None
        bus.mark = lambda: self._signal_seq  # the count a call's reply was read at (UnitStatus.seen)

    @property
    def tasks(self) -> tuple[asyncio.Task, ...]:
        """The feed's own task (the dispatcher, once subscribed), for the connection's close()."""
        return (self._dispatcher,) if self._dispatcher is not None else ()

    @property
    def signal_count(self) -> int:
        """How many unit signals have been read off the bus so far (see UnitStatus.seen)."""
        return self._signal_seq

    def removed_since(self, unit: str, seen: int) -> bool:
        """Whether a UnitRemoved of `unit` was read after the signal count `seen`: whatever was
        read of the unit before then may describe a unit that is gone."""
        return self._removed_at.get(unit, -1) > seen

    def changed_since(self, unit: str, seen: int) -> bool:
        """Whether any unit signal of `unit` (UnitNew, UnitRemoved, JobRemoved) was read after the
        signal count `seen`: its state as read before then may be stale."""
        return self._changed_at.get(unit, -1) > seen

    async def _call(self, action: str, member: str, signature: str = "", body: list | None = None, *,
                    path: str = MANAGER_PATH, interface: str = MANAGER, destination: str = SYSTEMD,
                    reply_signature: str | None = None, ok_errors: frozenset[str] = frozenset()) -> list:
        """One call for the feed (the manager unless said otherwise), through Bus.call."""
        return await self._bus.call(action, member, signature, body, path=path, interface=interface,
                                    destination=destination, reply_signature=reply_signature, ok_errors=ok_errors)

    async def subscribe(self, *, on_unit_new: Callback | None = None, on_unit_removed: Callback | None = None,
                        on_job_removed: Callback | None = None, on_reloading: Callback | None = None,
                        on_returned: Callback | None = None, on_overflow: Callback | None = None) -> None:
        """Manager.Subscribe() and deliver its signals to the given handlers.

        on_unit_new(name), on_unit_removed(name), on_job_removed(unit, result),
        on_reloading(active). Handlers may be plain functions or coroutine functions; they run
        one at a time, in the order systemd sent the signals, so an async handler delays the
        ones after it. An exception in a handler is logged and does not stop delivery.
        Calling subscribe again replaces the handlers.

        The queue of unit signals is bounded (MAX_QUEUED_SIGNALS): unit signals that come while
        it is full are dropped (still counted for `UnitStatus`), and on_overflow() runs once
        the queue has drained, so the caller re-reads what it may have missed. Reloading and
        systemd's return are never dropped.
        """
        handlers = {"on_unit_new": on_unit_new, "on_unit_removed": on_unit_removed,
                    "on_job_removed": on_job_removed, "on_reloading": on_reloading, "on_returned": on_returned,
                    "on_overflow": on_overflow}
        for name, handler in handlers.items():
            if handler is not None and not callable(handler):
                raise TypeError(f"{name} must be callable")
        self._handlers = handlers
        if self._subscribed:
            return
        action = "subscribe to systemd's unit signals"
        # Match rules and our message handler first, so nothing sent after Subscribe is missed.
        for rule in (*_SIGNAL_MATCHES, _OWNER_MATCH):
            await self._call(action, "AddMatch", "s", [rule], path=_BUS_PATH, interface=_BUS_NAME,
                             destination=_BUS_NAME, reply_signature="")
        self._bus.add_message_handler(self._on_message)
        if self._dispatcher is None:
            self._dispatcher = asyncio.ensure_future(self._dispatch())
        body = await self._call(action, "GetNameOwner", "s", [SYSTEMD], path=_BUS_PATH, interface=_BUS_NAME,
                                destination=_BUS_NAME, reply_signature="s")
        self._systemd_owner = body[0]
        await self._subscribe_call()
        self._subscribed = True

    async def _subscribe_call(self) -> None:
        # A second Subscribe from the same client is answered with AlreadySubscribed: fine.
        await self._call("subscribe to systemd's unit signals", "Subscribe", reply_signature="",
                         ok_errors=frozenset({_ALREADY_SUBSCRIBED}))

    def _note(self, table: dict[str, int], name: str) -> None:
        table[name] = self._signal_seq
        self._on_signal(name)  # a new run of the unit, or none (Systemd: read its ID again)
        if len(table) > _MAX_REMOVALS_TRACKED:
            # Only signals during a check or a round (milliseconds) matter: forget the older half.
            keep = self._signal_seq - _MAX_REMOVALS_TRACKED // 2
            recent = {n: q for n, q in table.items() if q > keep}
            table.clear()
            table.update(recent)

    def _on_message(self, msg: Message) -> None:
        # Called by dbus-next for every incoming message, before a reply reaches its caller
        # (Bus._on_reply notes when replies are read); returns None so others still see it.
        if msg.message_type != MessageType.SIGNAL:
            return None
        if (msg.member == "NameOwnerChanged" and msg.interface == _BUS_NAME and msg.sender == _BUS_NAME
                and msg.signature == "sss" and msg.body[0] == SYSTEMD):
            new_owner = msg.body[2] or None
            self._systemd_owner = new_owner
            if new_owner is not None and self._subscribed and self._bus.connected:
                # A new systemd instance (re-exec) does not know us; subscribe again.
                self._bus.spawn(self._resubscribe())
            return None
        if msg.path != MANAGER_PATH or msg.interface != MANAGER:
            return None
        # Signals can be sent to us directly by anyone on the bus: accept only systemd's.
        if self._systemd_owner is None or msg.sender != self._systemd_owner:
            return None
        # Unit signals are counted as the message is read, before any handler runs:
        # Systemd.set_memory_if_loaded compares the counts around its check (see UnitStatus).
        if msg.member == "UnitNew" and msg.signature == "so":
            self._signal_seq += 1
            self._note(self._changed_at, msg.body[0])
            self._enqueue("on_unit_new", (msg.body[0],))
        elif msg.member == "UnitRemoved" and msg.signature == "so":
            name = msg.body[0]
            self._signal_seq += 1
            self._note(self._removed_at, name)
            self._note(self._changed_at, name)
            self._enqueue("on_unit_removed", (name,))
        elif msg.member == "JobRemoved" and msg.signature == "uoss":
            self._signal_seq += 1
            self._note(self._changed_at, msg.body[2])
            self._enqueue("on_job_removed", (msg.body[2], msg.body[3]))
        elif msg.member == "Reloading" and msg.signature == "b":
            self._events.put_nowait(("on_reloading", (bool(msg.body[0]),)))
        return None

    async def _resubscribe(self) -> None:
        try:
            await self._subscribe_call()
        except SystemdError as err:
            log.warning("%s", err)
            return
        # systemd re-executed (or restarted) and is back on the bus: whatever it holds now
        # should be read again.
        self._events.put_nowait(("on_returned", ()))

    def _enqueue(self, name: str, args: tuple) -> None:
        if name in _UNIT_SIGNAL_HANDLERS and self._events.qsize() >= MAX_QUEUED_SIGNALS:
            if not self._overflowed:
                self._overflowed = True
                self.overflows += 1
            return
        self._events.put_nowait((name, args))

    @property
    def queued_signals(self) -> int:
        """Signals read off the bus and not yet handed to their handler."""
        return self._events.qsize()

    async def _dispatch(self) -> None:
        while True:
            if self._overflowed and self._events.empty():
                self._overflowed = False
                name, args = "on_overflow", ()
            else:
                name, args = await self._events.get()
            handler = self._handlers.get(name)
            if handler is None:
                continue
            try:
                result = handler(*args)
                if inspect.isawaitable(result):
                    await result
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("systemd signal handler %s%r failed", name, args)
