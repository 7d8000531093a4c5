"""Unix socket paths for tests, wherever the temporary directory is.

A socket's path must fit sun_path (108 bytes with its NUL). The temporary directory is the
environment's (TMPDIR), and a package build or a CI runner may set a long one: a test that put
its socket there would then fail for where it runs, not for what it tests.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

MAX_SOCKET_PATH = 107  # bytes, without the NUL
_ROOM = 24  # for the socket's own name inside the directory


def short_dir(prefix: str) -> str:
    """A fresh directory (the caller removes it) short enough for a socket named in it: under
    TMPDIR when that leaves room, else under /tmp."""
    d = tempfile.mkdtemp(prefix=prefix)
    if len(os.fsencode(d)) + _ROOM <= MAX_SOCKET_PATH:
        return d
    os.rmdir(d)
    return tempfile.mkdtemp(prefix=prefix, dir="/tmp")


def socket_path(directory: str | os.PathLike, name: str) -> str:
    """`directory`/`name` when that fits, else `name` in a short directory removed at exit."""
    path = os.path.join(directory, name)
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
        return path
    d = short_dir("memqos-sock-")
    atexit.register(shutil.rmtree, d, True)
    return os.path.join(d, name)
