"""Every --help as an operator reads it (issue 43, the face)."""

from __future__ import annotations

import pytest

from repo_docs import help_text as _help


@pytest.mark.parametrize("columns", ["300", "60"])
def test_no_help_line_is_wider_than_the_tables(monkeypatch, columns):
    """Issue 43: plan --help printed lines of 131 columns (a description line, and the options
    wrapped to a wide terminal). Whatever the terminal, no line of any --help passes 100."""
    from memqos_systemd import cli
    monkeypatch.setenv("COLUMNS", columns)
    parser = cli.build_parser()
    for name in ("", *parser.commands):
        text = _help(name)
        widest = max(text.splitlines(), key=len)
        assert len(widest) <= cli.HELP_WIDTH, (name, widest)
