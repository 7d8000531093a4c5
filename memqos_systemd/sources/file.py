"""A static pods file (`podsFile:`): JSON or YAML in the kubelet's `/pods` format.

The file is re-read only when its (mtime_ns, size, inode, device) changed; while
it has not, `fetch()` returns the cached snapshot (with a fresh `fetched_at`:
the stat just confirmed it is current). A file that is missing, too large,
half-written or unparsable raises `SourceError`, and the daemon keeps its last
good snapshot; `changed()` then stays False until the file changes again, so a
poller does not log the same error every tick.

YAML is read with the safe loader, and aliases (`*ref`) are refused: a pod list
has no use for them and they are how a small file becomes a huge document.

The service runs sandboxed (units/memqos-systemd.service): /home, /root and /run/user are
hidden from it, and /tmp, /var/tmp and /dev/shm are its own, empty. A pods file there reads fine from a
shell and not at all in the service; `hidden_from_service()` says so, for `check` and for the
error the service logs.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import time
from typing import Any, Callable

from ..documents import DocumentError, decode
from .snapshot import MAX_RESPONSE_BYTES, Snapshot, SourceError, snapshot_from_doc

__all__ = ["FileSource", "SANDBOX_HIDDEN", "hidden_from_service"]

_UNSET = object()

# Directories the service's sandbox hides or replaces, with the unit setting that does it
# (tests/unit/test_sources.py checks them against units/memqos-systemd.service).
SANDBOX_HIDDEN = (
    ("/home", "ProtectHome=yes"), ("/root", "ProtectHome=yes"), ("/run/user", "ProtectHome=yes"),
    ("/tmp", "PrivateTmp=yes"), ("/var/tmp", "PrivateTmp=yes"), ("/dev/shm", "PrivateDevices=yes"),
)


def hidden_from_service(path: str | os.PathLike) -> str | None:
    """Why the service cannot read `path` (or what it points to), or None when it can see it."""
    path = os.fspath(path)
    for candidate in dict.fromkeys((os.path.abspath(path), os.path.realpath(path))):
        for top, setting in SANDBOX_HIDDEN:
            if candidate == top or candidate.startswith(top + "/"):
                what = "its own, empty" if setting.startswith("Private") else "no"
                return (f"the service has {what} {top} ({setting} in memqos-systemd.service): move the"
                        f" file out of {top}, e.g. to /etc/memqos-systemd/")
    return None


class FileSource:
    """Pods from a local file. Blocking (the reads are small); not thread-safe."""

    def __init__(self, path: str | os.PathLike, *, clock: Callable[[], float] = time.monotonic,
                 max_bytes: int = MAX_RESPONSE_BYTES):
        self.path = os.fspath(path)
        self.name = f"file {self.path}"
        self._clock = clock
        self._max_bytes = max_bytes
        self._last_key: Any = _UNSET  # stat key of the last fetch attempt (None: stat failed)
        self._good_key: Any = _UNSET
        self._good: Snapshot | None = None

    def _stat_key(self) -> tuple | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return _key(st)

    def changed(self) -> bool:
        """True when the file differs from what the last fetch() saw (or was never fetched)."""
        return self._stat_key() != self._last_key

    def fetch(self) -> Snapshot:
        key = self._stat_key()
        if key is not None and key == self._good_key and self._good is not None:
            self._last_key = key
            return dataclasses.replace(self._good, fetched_at=self._clock())
        try:
            data, key = self._read()
        except SourceError as e:
            self._last_key = self._stat_key()
            hidden = hidden_from_service(self.path) if e.kind == "io" else None
            if hidden:
                raise SourceError(f"{e}: {hidden}", e.kind) from None
            raise
        self._last_key = key
        snapshot = snapshot_from_doc(self._decode(data), self.name, self._clock())
        self._good, self._good_key = snapshot, key
        return snapshot

    def _read(self) -> tuple[bytes, tuple]:
        try:
            # O_NONBLOCK: a FIFO in its place must not hang the fetch (refused below).
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as e:
            raise SourceError(f"{self.name}: cannot read: {e.strerror or type(e).__name__}", "io") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise SourceError(f"{self.name}: not a regular file", "io")
            if st.st_size > self._max_bytes:
                raise SourceError(f"{self.name}: {st.st_size} bytes is larger than the {self._max_bytes}"
                                  f" byte limit", "too_large")
            chunks = []
            total = 0
            while total <= self._max_bytes:
                chunk = os.read(fd, min(1 << 20, self._max_bytes + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
            if total > self._max_bytes:
                raise SourceError(f"{self.name}: larger than the {self._max_bytes} byte limit", "too_large")
            return b"".join(chunks), _key(st)
        except OSError as e:
            raise SourceError(f"{self.name}: cannot read: {e.strerror or type(e).__name__}", "io") from None
        finally:
            os.close(fd)

    def _decode(self, data: bytes) -> Any:
        try:
            return decode(data, whole_file=True)
        except DocumentError as e:
            raise SourceError(f"{self.name}: {e} (half-written?)", "decode") from None


def _key(st: os.stat_result) -> tuple:
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)
