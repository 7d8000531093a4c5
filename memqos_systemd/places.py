"""Where the outside things are for the commands and the daemon: the cgroup2 mount and the files
the service keeps in /run (its ledger, the pods of its last run, the features' files, its run lock,
the units fought over). Said once, here; the MEMQOS_* variables are for tests."""

from __future__ import annotations

import os
from pathlib import Path

from . import fights, last_pods, ledger

__all__ = ["CGROUP_ROOT", "LEDGER_PATH", "LAST_PODS_PATH", "STATE_DIR", "RUN_LOCK_PATH", "FIGHTS_PATH"]

CGROUP_ROOT = Path(os.environ.get("MEMQOS_CGROUP_FS", "/sys/fs/cgroup"))
# The reserved slices the service has written (ledger.py); the variable is for tests, like the one above.
LEDGER_PATH = Path(os.environ.get("MEMQOS_LEDGER", str(ledger.DEFAULT_PATH)))
# The pods of the last run, for the first carry_over after a restart (last_pods.py): next to the ledger.
LAST_PODS_PATH = Path(os.environ.get("MEMQOS_LAST_PODS", str(LEDGER_PATH.with_name(last_pods.DEFAULT_PATH.name))))
# Where the features keep their files (feature.Context.state_dir; the ceiling's ledger): beside the ledger.
STATE_DIR = LEDGER_PATH.parent
# One daemon per node, of either route (runfile.hold_run_lock): beside the ledger, in the
# directory the service and the DaemonSet's pod share.
RUN_LOCK_PATH = LEDGER_PATH.with_name("run.lock")
# The units the service finds written behind its back again and again (fights.py), for status and check.
FIGHTS_PATH = LEDGER_PATH.with_name(fights.DEFAULT_PATH.name)
