"""The tree's documents as the tests read them: README, the man page, debian/, deploy/, --help.

Found above tests/ wherever the tree is (in a package build, pybuild's copy of tests/ sits below
the source tree; debian/pybuild.testfiles copies what is read from the copy's own top)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memqos_systemd import cli


def repo_file(*parts: str) -> Path:
    for d in Path(__file__).resolve().parents:
        if (d.joinpath(*parts)).exists():
            return d.joinpath(*parts)
    pytest.fail(f"{'/'.join(parts)} not found above tests/ (debian/pybuild.testfiles copies what tests read)")


def man_text() -> str:
    """The man page without comments; roff's "\\-" is a hyphen, "\\e" a backslash."""
    text = repo_file("man", "memqos-systemd.8").read_text(encoding="utf-8").replace("\\-", "-").replace("\\e", "\\")
    return "\n".join(line for line in text.splitlines() if not line.startswith(".\\\""))


def help_text(command: str) -> str:
    """`memqos-systemd [COMMAND] --help` as argparse formats it (COMMAND "": the top level)."""
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices[command].format_help() if command else parser.format_help()
