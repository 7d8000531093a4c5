"""The D-Bus plumbing under systemd.py: one connection, calls with a timeout, typed errors.

What systemd's calls and signals mean lives in systemd.py and systemd_signals.py; this module
knows only D-Bus: how to connect (and release the socket, which dbus-next 0.2.3 does not), how
to send a call that cannot hang the daemon (`Bus.call` applies the call timeout), how D-Bus error
names become our exception types (`ERRORS`; nothing above sees a D-Bus error name), when a reply
was read relative to the signals read before it (`Bus.call(seen=...)`, for systemd.py's
`UnitStatus`), and when the connection is lost (`on_disconnect`). Like Home Assistant's supervisor, which keeps
`utils/dbus.py` apart from each service's meaning.

Only this module, systemd.py and systemd_signals.py import `dbus_next`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from dbus_next import BusType, Message, MessageFlag, MessageType, Variant
from dbus_next.aio import MessageBus
from dbus_next.errors import AuthError

__all__ = ["Bus", "SystemdError", "NoSuchUnit", "AccessDenied", "CallTimeout", "BusClosed", "ERRORS", "one_line"]

log = logging.getLogger("memqos_systemd.systemd")

PROPERTIES = "org.freedesktop.DBus.Properties"


class SystemdError(Exception):
    """A systemd call failed. The message is one line meant for people."""


class NoSuchUnit(SystemdError):
    """The unit is not loaded (or not found, or failed to load)."""


class AccessDenied(SystemdError):
    """systemd or the bus policy refused us (not root, or polkit said no)."""


class CallTimeout(SystemdError):
    """systemd did not answer within the call timeout."""


class BusClosed(SystemdError):
    """The bus connection is gone, or systemd is not on the bus. Close and connect again."""


# D-Bus error name -> (our type, our wording or None to keep systemd's own text).
ERRORS: dict[str, tuple[type[SystemdError], str | None]] = {
    "org.freedesktop.systemd1.NoSuchUnit": (NoSuchUnit, None),
    "org.freedesktop.systemd1.LoadFailed": (NoSuchUnit, None),
    # The unit's object went away between GetUnit and reading its properties.
    "org.freedesktop.DBus.Error.UnknownObject": (NoSuchUnit, "the unit is gone"),
    # A call on an invocation path whose run of the unit has ended (systemd.py's docstring).
    "org.freedesktop.systemd1.NoUnitForInvocationID": (NoSuchUnit, "that run of the unit has ended"),
    "org.freedesktop.DBus.Error.AccessDenied": (AccessDenied, "access denied (needs root, or a polkit rule)"),
    "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired":
        (AccessDenied, "access denied (needs root, or a polkit rule)"),
    "org.freedesktop.DBus.Error.NoReply": (CallTimeout, "systemd did not reply"),
    "org.freedesktop.DBus.Error.Timeout": (CallTimeout, "systemd did not reply"),
    "org.freedesktop.DBus.Error.TimedOut": (CallTimeout, "systemd did not reply"),
    "org.freedesktop.DBus.Error.ServiceUnknown": (BusClosed, "systemd is not on the bus"),
    "org.freedesktop.DBus.Error.NameHasNoOwner": (BusClosed, "systemd is not on the bus"),
    "org.freedesktop.DBus.Error.Disconnected": (BusClosed, "the bus connection is closed"),
}
# The bus tried to start something for the name: systemd is not there either way.
_SPAWN_ERROR_PREFIX = "org.freedesktop.DBus.Error.Spawn."


def one_line(text: object, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def map_error(action: str, error_name: str, text: str) -> SystemdError:
    """Our exception for a D-Bus error reply to `action` (ERRORS)."""
    if error_name.startswith(_SPAWN_ERROR_PREFIX):
        error_name = "org.freedesktop.DBus.Error.ServiceUnknown"
    cls, wording = ERRORS.get(error_name, (SystemdError, None))
    if wording is None:
        reason = one_line(text) or "failed"
        if cls is SystemdError:
            # Unmapped: keep systemd's words and the last part of the error's name.
            reason = f"{reason} ({error_name.rsplit('.', 1)[-1]})"
    else:
        reason = wording
    return cls(f"{action}: {reason}")


Callback = Callable[..., Awaitable[None] | None]


class Bus:
    """One connection to a message bus. Make it with `await Bus.connect()`.

    `mark()` is read as each reply is read off the socket, for calls that ask for it
    (`call(seen=...)`): systemd_signals.py sets it to its count of unit signals read so far."""

    def __init__(self, bus: MessageBus, call_timeout: float):
        self._bus = bus
        self.timeout = call_timeout
        self.mark: Callable[[], int] = lambda: 0
        self._closing = False
        self._lost = False
        self._disconnect_callbacks: list[Callback] = []
        # Serial of a call that wants to know mark() when its reply is read -> that mark.
        self._reply_marks: dict[int, int | None] = {}
        self._background: set[asyncio.Future] = set()
        bus.add_message_handler(self._on_reply)
        self._watcher = asyncio.ensure_future(self._watch_disconnect())

    @classmethod
    async def connect(cls, address: str | None = None, *, call_timeout: float = 10.0) -> Bus:
        """Connect to the system bus (address None) or to the bus at `address`."""
        if not (isinstance(call_timeout, (int, float)) and call_timeout > 0):
            raise ValueError(f"call_timeout must be a positive number of seconds, not {call_timeout!r}")
        where = f"the bus at {address}" if address else "the system bus"
        try:
            bus = _MessageBus(bus_address=address, bus_type=BusType.SYSTEM)
        except (OSError, ValueError) as err:
            raise BusClosed(f"cannot connect to {where}: {one_line(err)}") from err
        try:
            await asyncio.wait_for(bus.connect(), call_timeout)
        except asyncio.TimeoutError:
            _drop(bus)
            raise CallTimeout(f"connecting to {where}: no answer within {call_timeout:g} s") from None
        except AuthError as err:
            _drop(bus)
            raise AccessDenied(f"connecting to {where}: authentication refused") from err
        except Exception as err:
            _drop(bus)
            raise BusClosed(f"cannot connect to {where}: {one_line(err) or type(err).__name__}") from err
        return cls(bus, float(call_timeout))

    # ---- the connection ------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        return not self._closing and not self._lost and self._bus.connected

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def unique_name(self) -> str | None:
        return self._bus.unique_name

    def add_message_handler(self, handler: Callable[[Message], Any]) -> None:
        """`handler(msg)` for every message read, before a reply reaches its caller."""
        self._bus.add_message_handler(handler)

    def on_disconnect(self, callback: Callable[[], Awaitable[None] | None]) -> None:
        """Run `callback()` once when the connection is lost (not on `close()`)."""
        if not callable(callback):
            raise TypeError("on_disconnect needs a callable")
        self._disconnect_callbacks.append(callback)
        if self._lost and not self._closing:
            asyncio.get_running_loop().call_soon(self.run_callback, "on_disconnect", callback, ())

    async def close(self, *tasks: asyncio.Future) -> None:
        """Disconnect, and cancel `tasks` (the caller's, tied to this connection) with ours.
        Safe to call twice, and after the connection was lost."""
        if self._closing:
            return
        self._closing = True
        if self._bus.connected:
            self._bus.disconnect()
            try:
                await asyncio.wait_for(asyncio.shield(self._bus.wait_for_disconnect()), 1.0)
            except Exception:
                pass
        # close() may run inside one of these (a handler or on_disconnect callback that
        # closes the connection): never cancel or wait for ourselves.
        pending = [t for t in (self._watcher, *self._background, *tasks) if t is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        _drop(self._bus)

    async def _watch_disconnect(self) -> None:
        reason: object = "closed"
        try:
            await self._bus.wait_for_disconnect()
        except Exception as err:  # dbus-next resolves with the error that ended the connection
            reason = err
        if self._closing:
            return
        self._lost = True
        log.warning("lost the connection to the bus (%s)", one_line(reason) or type(reason).__name__)
        for callback in list(self._disconnect_callbacks):
            self.run_callback("on_disconnect", callback, ())

    # ---- calls ---------------------------------------------------------------------------
    async def call(self, action: str, member: str, signature: str = "", body: list | None = None, *,
                   path: str, interface: str, destination: str, reply_signature: str | None = None,
                   ok_errors: frozenset[str] = frozenset(), seen: list[int] | None = None) -> list:
        """One method call, within the call timeout; its reply's body. `action` says what it was
        for, in error messages. With `seen`, mark() as the reply was read is appended to it."""
        if not self.connected:
            raise BusClosed(f"{action}: not connected to the bus")
        msg = Message(destination=destination, path=path, interface=interface, member=member,
                      signature=signature, body=body or [], serial=self._bus.next_serial(),
                      # systemd is PID 1: never ask the bus to start a program for its name.
                      flags=MessageFlag.NO_AUTOSTART)
        if seen is not None:
            self._reply_marks[msg.serial] = None  # filled in by _on_reply as the reply is read
        try:
            reply = await asyncio.wait_for(self._bus.call(msg), self.timeout)
        except asyncio.TimeoutError:
            self._forget_reply(msg.serial)
            raise CallTimeout(f"{action}: systemd did not answer within {self.timeout:g} s") from None
        except asyncio.CancelledError:
            self._forget_reply(msg.serial)
            raise
        except Exception as err:
            # dbus-next hands pending calls the error that ended the connection.
            if not self._bus.connected:
                raise BusClosed(f"{action}: the bus connection was lost") from err
            raise SystemdError(f"{action}: {one_line(err) or type(err).__name__}") from err
        finally:
            mark = self._reply_marks.pop(msg.serial, None)
        if seen is not None:
            # Not read by _on_reply (should not happen): the mark now is later, hence safe.
            seen.append(self.mark() if mark is None else mark)
        if reply is None:
            raise BusClosed(f"{action}: the bus connection was lost")
        if reply.message_type == MessageType.ERROR:
            if reply.error_name in ok_errors:
                return []
            text = reply.body[0] if reply.body and isinstance(reply.body[0], str) else ""
            raise map_error(action, reply.error_name or "", text)
        if reply_signature is not None and reply.signature != reply_signature:
            raise SystemdError(f"{action}: systemd answered with an unexpected type")
        return reply.body

    async def get_property(self, action: str, path: str, interface: str, name: str, signature: str, *,
                           destination: str) -> Any:
        """org.freedesktop.DBus.Properties.Get: the value, checked to be of `signature`."""
        body = await self.call(action, "Get", "ss", [interface, name], path=path, interface=PROPERTIES,
                               destination=destination, reply_signature="v")
        return variant_value(body[0], signature, action)

    def _on_reply(self, msg: Message) -> None:
        # Called by dbus-next for every incoming message, before a reply reaches its caller;
        # returns None so others still see it.
        if msg.message_type in (MessageType.METHOD_RETURN, MessageType.ERROR) and msg.reply_serial in self._reply_marks:
            self._reply_marks[msg.reply_serial] = self.mark()
        return None

    def _forget_reply(self, serial: int) -> None:
        # dbus-next keeps a handler per pending call until a reply comes; a reply that never
        # comes would keep it forever. 0.2.3 stores them in this dict.
        handlers = getattr(self._bus, "_method_return_handlers", None)
        if isinstance(handlers, dict):
            handlers.pop(serial, None)

    # ---- background work tied to the connection ------------------------------------------
    def run_callback(self, name: str, callback: Callable, args: tuple) -> None:
        """Call a callback, logging what it raises; an awaitable result runs in the background."""
        try:
            result = callback(*args)
        except Exception:
            log.exception("%s callback failed", name)
            return
        if inspect.isawaitable(result):
            self.spawn(result, name)

    def spawn(self, awaitable: Awaitable, name: str = "background task") -> None:
        """Run `awaitable` until it ends or the connection is closed; log what it raises."""
        task = asyncio.ensure_future(awaitable)
        self._background.add(task)

        def done(t: asyncio.Future) -> None:
            self._background.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("%s failed: %s", name, one_line(t.exception()))

        task.add_done_callback(done)


def variant_value(value: object, signature: str, what: str) -> Any:
    """The value of a Variant of `signature`; SystemdError for anything else."""
    if not isinstance(value, Variant) or value.signature != signature:
        raise SystemdError(f"{what}: systemd answered with an unexpected type")
    return value.value


class _MessageBus(MessageBus):
    def _setup_socket(self) -> None:
        # dbus-next 0.2.3 connects in the constructor and leaves the socket open when that
        # fails; close it, or every failed connect attempt warns about an unclosed socket.
        try:
            super()._setup_socket()
        except BaseException:
            _close_socket(self)
            raise


def _drop(bus: MessageBus) -> None:
    """Release a bus's socket. dbus-next 0.2.3 never closes it, so a daemon that reconnects
    after every dbus restart would otherwise leak a descriptor each time."""
    if bus.connected:
        bus.disconnect()
    _close_socket(bus)


def _close_socket(bus: MessageBus) -> None:
    for attr in ("_stream", "_sock"):
        closer = getattr(getattr(bus, attr, None), "close", None)
        if closer is not None:
            try:
                closer()
            except OSError:
                pass
