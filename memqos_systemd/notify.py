"""systemd's service protocol: sd_notify messages and journald-friendly logs.

Stdlib only: sd_notify is one datagram to $NOTIFY_SOCKET, and journald reads
a `<N>` syslog-level prefix on each line of stderr.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from typing import Iterable

__all__ = ["Notifier", "WarnOnce", "setup_logging", "watchdog_interval"]


class Notifier:
    """Sends READY=1 / STATUS= / WATCHDOG=1 / RELOADING=1 / STOPPING=1; a no-op outside systemd."""

    def __init__(self, address: str | None = None):
        address = address if address is not None else os.environ.get("NOTIFY_SOCKET")
        self._address = None
        if address:
            # '@name' is a socket in the abstract namespace.
            self._address = "\0" + address[1:] if address.startswith("@") else address
        self._last_status: str | None = None
        self.readied = False  # READY=1 has been said (report)

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def send(self, *fields: str) -> bool:
        """One datagram, never blocking: a receiver that does not read (a hung PID 1) must not
        stop the daemon; a message it cannot take now is dropped and reported as not sent."""
        if not self._address:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK) as s:
                s.connect(self._address)
                s.send("\n".join(fields).encode())
            return True
        except OSError as e:
            logging.getLogger("memqos_systemd").debug("sd_notify failed: %s", e)
            return False

    def ready(self, status: str) -> None:
        if self.send("READY=1", f"STATUS={status}"):
            self._last_status = status

    def report(self, status: str) -> bool:
        """After each applied round: READY=1 the first time (True then), STATUS= after."""
        if self.readied:
            self.status(status)
            return False
        self.readied = True
        self.ready(status)
        return True

    def status(self, status: str) -> None:
        """STATUS=, sent only when it differs from the last one systemd took."""
        if status != self._last_status and self.send(f"STATUS={status}"):
            self._last_status = status

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")

    def reloading(self) -> None:
        """RELOADING=1 with the time it began (Type=notify-reload's form); READY=1 ends it."""
        self.send("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")


def watchdog_interval() -> float | None:
    """Half the watchdog timeout systemd gave us (seconds), or None."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(int(usec) / 2e6, 0.1)
    except ValueError:
        return None


_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


class _JournalFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        prio = _PRIORITY.get(record.levelno, 6)
        return f"<{prio}>{record.getMessage()}"


class _PlainFormatter(logging.Formatter):
    """On a terminal, the prefix every other command uses (`memqos-systemd: error: ...`)."""

    def format(self, record: logging.LogRecord) -> str:
        return f"memqos-systemd: {record.levelname.lower()}: {record.getMessage()}"


def setup_logging(verbose: bool = False) -> logging.Logger:
    """One line per event; `<N>` level prefixes when stderr goes to the journal."""
    logger = logging.getLogger("memqos_systemd")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JournalFormatter() if os.environ.get("JOURNAL_STREAM") else _PlainFormatter())
    logger.handlers[:] = [handler]
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False
    return logger


class WarnOnce:
    """Log each warning of a kind (a rejected pod, a capped slice) once while it lasts, not every
    poll. What no longer applies is forgotten, so it is logged again if it comes back."""

    def __init__(self, log: logging.Logger):
        self._log = log
        self._seen: dict[str, set[str]] = {}

    def __call__(self, kind: str, warnings: Iterable[str]) -> None:
        warnings = list(warnings)
        seen = self._seen.get(kind, set())
        for w in warnings:
            if w not in seen:
                self._log.warning("%s", w)
        self._seen[kind] = set(warnings)

