"""Replacing a small file under the service's runtime directory, atomically.

The reserved-slice ledger (ledger.py) and the last run's pods (last_pods.py) are read back by a
later start; a crash or a full disk mid-write must leave either the old file whole or the new one,
never a cut-off file read as a shorter list.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["replace"]


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
