"""Every command on a config path it cannot use (issue 33, item 1): one line naming the path and
the cause, exit 2, never a traceback, never a wait; `reset` warns and goes on (it then fails only
because no systemd answers here: exit 1, nothing sent).

The real CLI in a subprocess, as an operator runs it. No bus is reached: DBUS_SYSTEM_BUS_ADDRESS
names a socket that is not there, so nothing here can touch the machine's systemd.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import memqos_systemd

CODE_ROOT = Path(memqos_systemd.__file__).resolve().parent.parent
COMMANDS = ("plan", "apply", "run", "status", "reset", "check")
LONG = "c" * 300  # a name past NAME_MAX (255)
LONG_SHOWN = LONG  # as given: it prints plainly, and a cut name would name no file


def _paths(tmp: Path) -> dict[str, tuple[str, str]]:
    """case -> (the --config argument, relative to tmp where it is a file; the line's expected text)."""
    (tmp / "locked").mkdir(mode=0o700)
    (tmp / "locked" / "config.yaml").write_text("{}\n")
    (tmp / "locked").chmod(0o000)  # nobody but root (with CAP_DAC_OVERRIDE) enters it
    os.mkfifo(tmp / "fifo")
    (tmp / "dir").mkdir()
    (tmp / "dangling").symlink_to("not-there")
    (tmp / "loop-a").symlink_to("loop-b")
    (tmp / "loop-b").symlink_to("loop-a")
    return {
        "not enterable": ("locked/config.yaml", "locked/config.yaml: cannot read config: Permission denied"),
        "name too long": (LONG, f"{LONG_SHOWN}: cannot read config: File name too long"),
        "FIFO": ("fifo", "fifo: cannot read config: not a regular file: it is a FIFO (a named pipe)"),
        "empty": ("", "'': cannot read config: an empty name names no file"),
        "directory": ("dir", "dir: cannot read config: not a regular file: it is a directory"),
        "dangling symlink": ("dangling", "dangling: cannot read config: No such file or directory"),
        "symlink loop": ("loop-a", "loop-a: cannot read config: Too many levels of symbolic links"),
        "not a directory": ("fifo/config.yaml", "fifo/config.yaml: cannot read config: Not a directory"),
        "device": ("/dev/null", "/dev/null: cannot read config: not a regular file: it is a character device"),
    }


CASES = ("not enterable", "name too long", "FIFO", "empty", "directory", "dangling symlink", "symlink loop",
         "not a directory", "device")


def _unprivileged() -> list[str]:
    """The prefix that runs a command as a user who cannot enter a directory of mode 0: as root
    (the tests' CI), root without the capabilities that pass over file modes (CAP_DAC_OVERRIDE,
    CAP_DAC_READ_SEARCH), so that it still reads the code wherever the tree lives (a package
    build's directory can be 0700, which nobody could not enter); as anyone else, that user."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def _run(tmp: Path, argv: list[str], *, python: list[str] | None = None) -> subprocess.CompletedProcess:
    # Relative names (the child starts in tmp): an unprivileged child cannot pass pytest's 0700 parents.
    env = dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS="unix:path=no-bus-here", MEMQOS_CGROUP_FS="cg",
               MEMQOS_LEDGER="ledger", MEMQOS_LAST_PODS="last-pods.json",
               PYTHONPATH=os.pathsep.join(filter(None, [str(CODE_ROOT), os.environ.get("PYTHONPATH")])),
               PYTHONDONTWRITEBYTECODE="1")
    for name in ("JOURNAL_STREAM", "NOTIFY_SOCKET", "COLUMNS"):
        env.pop(name, None)
    cmd = [*_unprivileged(), sys.executable, *(python or ["-m", "memqos_systemd"]), *argv]
    # The child starts in tmp (relative names) and is then a user who may not enter it: it only
    # names files, never lists its working directory.
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          stdin=subprocess.DEVNULL, timeout=60, cwd=str(tmp))


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    tmp_path.chmod(0o755)  # the unprivileged child starts here (it needs no way in from above)
    yield tmp_path
    if (tmp_path / "locked").exists():
        (tmp_path / "locked").chmod(0o700)  # for pytest's clean-up


def _argv(command: str, config: str) -> list[str]:
    return [command, *(["--pods", "-", "--node-memory", "8Gi"] if command == "plan" else []), "--config", config]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", CASES)
def test_a_config_path_that_cannot_be_read_is_one_line_naming_it_and_its_cause(tmp, case, command):
    config, line = _paths(tmp)[case]
    p = _run(tmp, _argv(command, config))
    assert "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.splitlines()
    if command == "reset":  # the rollback works whatever the config: it warns and goes on
        assert lines[0] == (f"memqos-systemd: warning: config not used: {line}; resetting by the unit names found"
                            f" (cgroupRoot /) and the ledger of reserved slices"), p.stderr
        assert lines[1:] == ["memqos-systemd: error: cannot reach systemd: cannot connect to the system bus:"
                             " [Errno 2] No such file or directory; nothing changed"], p.stderr
        assert p.returncode == 1
        return
    assert lines == [f"memqos-systemd: error: {line}"], p.stderr
    assert p.returncode == 2
    assert p.stdout == ""


@pytest.mark.parametrize("command", COMMANDS)
def test_the_default_config_in_a_directory_the_user_cannot_enter(tmp, command):
    """`/etc/memqos-systemd` closed to the user: the commands that read the installed config by
    default say so (they must not plan with the built-in defaults instead, nor trace back)."""
    _paths(tmp)
    default = str(tmp / "locked" / "config.yaml")
    script = ("import sys; from memqos_systemd import cli, commands, config\n"
              f"cli.DEFAULT_CONFIG_PATH = commands.DEFAULT_CONFIG_PATH = config.DEFAULT_CONFIG_PATH = {default!r}\n"
              "sys.argv[0] = 'memqos-systemd'; sys.exit(cli.main())\n")
    argv = [command, *(["--pods", "-", "--node-memory", "8Gi"] if command == "plan" else [])]
    p = _run(tmp, argv, python=["-c", script])
    assert "Traceback" not in p.stderr, p.stderr
    line = f"{default}: cannot read config: Permission denied"
    if command == "reset":
        assert p.stderr.splitlines()[0].startswith(f"memqos-systemd: warning: config not used: {line}; "), p.stderr
        assert p.returncode == 1
    else:
        assert p.stderr.splitlines() == [f"memqos-systemd: error: {line}"], p.stderr
        assert p.returncode == 2
