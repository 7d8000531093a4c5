# ---- BEGIN systemd adapter fixtures: dbus_daemon, fake_systemd ----------------------------
# A private dbus-daemon and a recording systemd stand-in (tests/fakesystemd.py) for the
# integration tests of memqos_systemd/systemd.py. Imported lazily so that collecting other
# tests needs neither dbus_next nor dbus-daemon.
import pytest as _memqos_pytest


@_memqos_pytest.fixture
def dbus_daemon():
    """A private dbus-daemon (session config) on a socket in a fresh temporary directory.

    Skips when dbus-daemon is not installed, and fails instead when CI=true.
    """
    from fakesystemd import DBusDaemon, find_dbus_daemon
    from prereq import require

    executable = find_dbus_daemon()
    require(executable, "dbus-daemon is not installed (apt-get install dbus)")
    daemon = DBusDaemon(executable)
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()


@_memqos_pytest.fixture
def fake_systemd(dbus_daemon, tmp_path):
    """A FakeSystemd owning org.freedesktop.systemd1 on `dbus_daemon`, with no units loaded; the
    running slices' cgroup directories (with their invocation ID) under tmp_path/cgroup."""
    from fakesystemd import FakeSystemd

    fake = FakeSystemd(dbus_daemon)
    fake.cgroup_root = tmp_path / "cgroup"
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()
# ---- END systemd adapter fixtures -----------------------------------------------------------
