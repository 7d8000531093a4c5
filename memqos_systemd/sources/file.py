"""A static pods file (`podsFile:`): JSON or YAML in the kubelet's `/pods` format.

The file is re-read only when its (mtime_ns, size, inode, device) changed; while
it has not, `fetch()` returns the cached snapshot (with a fresh `fetched_at`:
the stat just confirmed it is current). A file that is missing, too large,
half-written or unparsable raises `SourceError`, and the daemon keeps its last
good snapshot; `changed()` then stays False until the file changes again, so a
poller does not log the same error every tick.

YAML is read with the safe loader, and aliases (`*ref`) are refused: a pod list
has no use for them and they are how a small file becomes a huge document.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import time
from typing import Any, Callable

from ..documents import DocumentError, decode
from . import MAX_RESPONSE_BYTES, Snapshot, SourceError, snapshot_from_doc

__all__ = ["FileSource"]

_UNSET = object()


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
        except SourceError:
            self._last_key = self._stat_key()
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
