"""The files of the service's runtime directory: replacing one atomically, and the daemon's lock.

The reserved-slice ledger (ledger.py) and the last run's pods (last_pods.py) are read back by a
later start; a crash or a full disk mid-write must leave either the old file whole or the new one,
never a cut-off file read as a shorter list.

One daemon per node (`hold_run_lock`): the packaged service and the DaemonSet's pod share this
directory (the pod mounts the node's), so a second daemon, of either route, finds the first's
lock and refuses to start. Two would each put their own values back over the other's.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

__all__ = ["RunLockHeld", "hold_run_lock", "replace"]


def replace(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to a temporary file next to `path` (created with `mode`), fsync it and
    rename it over `path`. Raises OSError, with no temporary file left behind."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
        with open(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


class RunLockHeld(Exception):
    """Another daemon holds the lock; the message says who, as it wrote itself down."""


def hold_run_lock(path: Path) -> IO[bytes]:
    """Take the daemon's lock at `path` (flock, not blocking) and write who holds it: this PID and
    whether systemd started it (INVOCATION_ID) or not (a container, a shell). Keep the returned
    file open for as long as the daemon runs; the kernel drops the lock when the process ends,
    however it ends. Raises RunLockHeld if another process holds it, OSError if the file cannot
    be opened."""
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    f = open(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644), "r+b")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = (f.read(256).decode(errors="replace").strip().splitlines() or
                  ["a process that has not written its name yet"])[0]
        f.close()
        raise RunLockHeld(holder) from None
    except OSError:
        f.close()
        raise
    who = ("memqos-systemd.service" if os.environ.get("INVOCATION_ID")
           else "not started by systemd: the DaemonSet's pod, or a shell")
    f.truncate(0)
    f.write(f"PID {os.getpid()}, {who}\n".encode())
    f.flush()
    return f
