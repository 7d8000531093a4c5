"""runfile.hold_run_lock: one daemon per node, whichever route started it (the service or the
DaemonSet's pod share /run/memqos-systemd). Real flock, real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from memqos_systemd.runfile import RunLockHeld, hold_run_lock


def test_a_second_holder_is_refused_and_told_who_holds_it(tmp_path, monkeypatch):
    monkeypatch.setenv("INVOCATION_ID", "0123456789abcdef")  # as systemd starts the service
    path = tmp_path / "run" / "run.lock"  # the directory is made if missing
    first = hold_run_lock(path)
    with pytest.raises(RunLockHeld) as e:
        hold_run_lock(path)  # another open file description: flock refuses it as it would another process
    assert str(e.value) == f"PID {os.getpid()}, memqos-systemd.service"
    first.close()
    again = hold_run_lock(path)  # released with its file
    again.close()


def test_the_lock_goes_with_its_process_however_it_ends(tmp_path):
    path = tmp_path / "run.lock"
    code = ("import sys, time; from pathlib import Path; from memqos_systemd.runfile import hold_run_lock;"
            f" f = hold_run_lock(Path({str(path)!r})); print('held', flush=True); time.sleep(60)")
    env = {k: v for k, v in os.environ.items() if k != "INVOCATION_ID"}
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(RunLockHeld) as e:
            hold_run_lock(path)
        assert str(e.value) == f"PID {child.pid}, not started by systemd: the DaemonSet's pod, or a shell"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    deadline = time.monotonic() + 5
    while True:
        try:
            hold_run_lock(path).close()
            break
        except RunLockHeld:
            assert time.monotonic() < deadline, "the lock outlived its killed holder"
            time.sleep(0.05)


def test_a_lock_file_that_cannot_be_opened_is_an_oserror(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError):
        hold_run_lock(tmp_path / "file" / "run.lock")
