"""Rollback is one story everywhere (issue 15): README, the man page, the package's prerm, the
CLI's --help and reset's own warning all say `systemctl disable --now memqos-systemd`, then
`memqos-systemd reset`; none says to stop only (a stopped but enabled service comes back at boot)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from repo_docs import help_text as _help, man_text as _man_text, repo_file as _repo_file
from memqos_systemd import commands

STORY = "systemctl disable --now memqos-systemd"


@pytest.mark.parametrize("where", ["README.md", "man page", "prerm", "--help", "reset --help"])
def test_every_rollback_text_disables_then_resets(where):
    text = {
        "README.md": lambda: _repo_file("README.md").read_text(encoding="utf-8"),
        "man page": _man_text,
        "prerm": lambda: _repo_file("debian", "memqos-systemd.prerm").read_text(encoding="utf-8"),
        "--help": lambda: _help(""),
        "reset --help": lambda: _help("reset"),
    }[where]()
    flat = " ".join(text.split())
    assert STORY in flat, where
    assert flat.index(STORY) < flat.index("memqos-systemd reset", flat.index(STORY)), where
    # Never the old story: stopping only.
    assert not re.search(r"systemctl stop memqos-systemd(\.service)?( &&|\s*$|\s*\n)", text, re.M), where


def test_resets_own_warning_tells_the_same_story():
    source = Path(commands.__file__).read_text(encoding="utf-8")
    warning = next(line for line in source.splitlines() if "will re-apply its plan" in line)
    assert "systemctl disable --now" in warning


@pytest.mark.parametrize("where", ["man page", "reset --help"])
def test_every_reset_text_names_what_reset_puts_back(where):
    """Issue 43: reset --help named MemoryMin/Low/High only, not the ceiling's MemoryMax nor the
    ledgers reset goes by when the config cannot be read. The paths are the code's own."""
    from memqos_systemd import ceiling_watch, ledger
    text = {"man page": _man_text, "reset --help": lambda: _help("reset")}[where]()
    flat = " ".join(text.replace("\\-", "-").split())
    for words in ("MemoryMin=0", "MemoryLow=0", "MemoryHigh=infinity", "MemoryMax=infinity",
                  str(ledger.DEFAULT_PATH), str(ceiling_watch.CEILINGS_PATH)):
        assert words in flat, (where, words)

