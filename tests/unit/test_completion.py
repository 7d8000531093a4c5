"""completion/memqos-systemd (issue 33), written by hand, lists what cli.py's parser has:
the subcommands, each one's flags, --output's values; and bash completes with it."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from memqos_systemd import cli
from prereq import require
from repo_docs import repo_file


def _script() -> str:
    return repo_file("completion", "memqos-systemd").read_text(encoding="utf-8")


def _parser_words() -> dict[str, set[str]]:
    """"" (the top level: subcommands and its flags) and each subcommand -> its flags."""
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    top = {o for a in parser._actions for o in a.option_strings} | set(sub.choices)
    out = {"": top}
    for name, sp in sub.choices.items():
        assert not [a for a in sp._actions if not a.option_strings], f"{name}: a positional the script does not know"
        out[name] = {o for a in sp._actions for o in a.option_strings}
    return out


def _script_words() -> dict[str, set[str]]:
    return {("" if cmd == '""' else cmd): set(words.split())
            for cmd, words in re.findall(r'^\s*("?"?|\w+)\) flags="([^"]*)"', _script(), re.M)}


def test_the_script_lists_exactly_the_parsers_subcommands_and_flags():
    assert _script_words() == _parser_words()
    commands = re.search(r"^\s*(\w+(?:\|\w+)*)\) \[ -z \"\$cmd\" \] && cmd=\$w", _script(), re.M).group(1).split("|")
    assert set(commands) == _parser_words()[""] - {"-h", "--help", "--version"}


def test_the_script_offers_each_flags_choices_and_files_where_the_parser_takes_them():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    actions = {o: a for sp in sub.choices.values() for a in sp._actions for o in a.option_strings}
    script = _script()
    for flag, action in actions.items():
        if action.choices:
            assert re.search(rf'{flag}\)\n\s*COMPREPLY=\(\$\(compgen -W "{" ".join(action.choices)}"', script), flag
        elif action.nargs != 0 and flag not in ("-h", "--help"):
            assert re.search(rf"^\s*[-\w|]*{flag}\b[-\w|]*\)$", script, re.M), f"{flag} takes a value: the script must say so"


def _complete(*words: str) -> list[str]:
    """COMPREPLY after bash sources the script, the cursor on the last of WORDS."""
    require(shutil.which("bash"), "bash runs the completion script")
    line = " ".join(f"'{w}'" for w in ("memqos-systemd", *words))
    out = subprocess.run(["bash", "--norc", "--noprofile", "-c",
                          f'source "$1"; COMP_WORDS=({line}); COMP_CWORD=$(({len(words)})); _memqos_systemd;'
                          ' printf "%s\\n" "${COMPREPLY[@]}"', "bash", str(repo_file("completion", "memqos-systemd"))],
                         capture_output=True, text=True, check=True, timeout=30)
    assert out.stderr == ""
    return out.stdout.split()


@pytest.mark.parametrize(("words", "expected"), [
    (("",), ["plan", "apply", "run", "status", "reset", "check", "-h", "--help", "--version"]),
    (("st",), ["status"]),
    (("plan", "--o"), ["--output"]),
    (("plan", "--output", ""), ["json", "table", "wide"]),
    (("status", "--output", "w"), ["wide"]),
    (("apply", "--d"), ["--dry-run"]),
    (("apply", "--once", "--"), ["--help", "--config", "--dry-run"]),  # issue 43: --once is used
    (("plan", "--output", "json", "--config", "x", "--o"), []),
    (("plan", "--config=x", "--"), ["--help", "--pods", "--node-memory", "--page-size", "--output"]),
    (("check", "--pods"), []),
    (("plan", "--node-memory", ""), []),
    # --flag=value, split at "=" as bash's default COMP_WORDBREAKS splits it, and whole
    (("status", "--output", "=", ""), ["json", "table", "wide"]),
    (("status", "--output", "=", "t"), ["table"]),
    (("status", "--output=t",), ["--output=table"]),
    (("status", "--output", "="), ["json", "table", "wide"]),
])
def test_bash_completes_with_the_script(words, expected):
    assert _complete(*words) == expected


def test_config_equals_completes_file_names(tmp_path):
    (tmp_path / "config.yaml").write_text("")
    assert _complete("apply", "--config", "=", f"{tmp_path}/con") == [f"{tmp_path}/config.yaml"]
    assert _complete("apply", f"--config={tmp_path}/con") == [f"--config={tmp_path}/config.yaml"]
