"""One harness for the daemon's tests: `Daemon.run()` against a real private dbus-daemon and the
recording systemd stand-in (tests/fakesystemd.py), with a pod source the test controls.

Tests ask the daemon through its public request API (`Harness.fetch_now()`, `Harness.resync_now()`,
`daemon.agenda.reread()`, `daemon.request_reload()`, ...) and read its public state
(`daemon.intake`, `daemon.observer`, `daemon.agenda`); none writes a private attribute.

Beside the daemon:
* `ControlledSource`: the pods (a list of pod dicts) or an exception the test sets; while `hold`
  is set, a fetch waits (in the daemon's fetch thread) until `release()`.
* `Watch`: every write systemd applies (late ones included) is recorded with the values before
  and after, and the tree is checked after each one: no child above its parent in MemoryMin or
  MemoryLow. `fail_in` makes the stand-in refuse a write.
* `events`: the daemon's view in order: ("checked", unit) set_memory_if_loaded found it loaded,
  ("read", unit) UnitRemoved read off the socket, ("removed", unit) delivered to the daemon,
  ("set", unit) a write about to be sent. `busy` keeps the daemon's loop busy after each check.
"""

from __future__ import annotations

import asyncio
import copy
import socket
import threading

import yaml
from dbus_next.errors import DBusError
from fakesystemd import unit_path
from sockets import socket_path

from memqos_systemd import features
from memqos_systemd.cgroupfs import Cgroupfs
from memqos_systemd.config import load_config, parse_config
from memqos_systemd.daemon import Daemon, Outside
from memqos_systemd.metrics import Metrics
from memqos_systemd.notify import Notifier
from memqos_systemd.pods import parse_pods
from memqos_systemd.sources import Snapshot, make_source
from memqos_systemd.systemd import Systemd

TIERED = {"memoryReservationPolicy": "TieredReservation"}


class ControlledSource:
    """A pod source whose answer the test sets: a list of pod dicts, or an exception. Tests rebind
    `items` (never mutate it): fetch() copies it in another thread."""

    def __init__(self, items):
        self.items = items
        self.fetches = 0
        self.failures = 0
        self.hold = False
        self.held = threading.Event()
        self._gate = threading.Event()

    def fetch(self) -> Snapshot:
        if self.hold:
            self.held.set()
            self._gate.wait(5)
        self.fetches += 1
        items = self.items
        if isinstance(items, Exception):
            self.failures += 1
            raise items
        pods, warnings = parse_pods({"kind": "PodList", "items": copy.deepcopy(items)})
        return Snapshot(tuple(pods), tuple(warnings), "test", 0.0)

    def release(self) -> None:
        self.hold = False
        self._gate.set()


class NotifySocket:
    """A $NOTIFY_SOCKET the test reads (READY=1, STATUS=..., RELOADING=1)."""

    def __init__(self, tmp_path):
        self.path = socket_path(tmp_path, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setblocking(False)
        self.messages: list[str] = []

    def drain(self) -> list[str]:
        while True:
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except BlockingIOError:
                return self.messages


def slice_parent(name: str) -> str | None:
    stem = name[: -len(".slice")]
    return f"{stem.rsplit('-', 1)[0]}.slice" if name.endswith(".slice") and "-" in stem else None


class Watch:
    """Every write the stand-in applies, and the tree checked after each one."""

    def __init__(self, fake):
        self.fake = fake
        self.scope_parent: dict[str, str] = {}
        self.writes: list[tuple[str, dict | None, dict]] = []
        self.violations: list[str] = []
        self.fail_in: int | None = None  # refuse the write after this many more (0: the next)
        original = fake._set_unit_properties

        def applied(name, runtime, properties):
            if self.fail_in is not None:
                self.fail_in -= 1
                if self.fail_in < 0:
                    self.fail_in = None
                    raise DBusError("org.freedesktop.DBus.Error.Failed", "refused by the test")
            unit = fake._units.get(name)
            before = dict(unit.memory) if unit is not None else None
            original(name, runtime, properties)
            self.writes.append((name, before, dict(fake._units[name].memory)))
            self._check(name)

        fake._set_unit_properties = applied  # the stand-in's D-Bus method calls this attribute

    def parent(self, name: str) -> str | None:
        return self.scope_parent.get(name) if name.endswith(".scope") else slice_parent(name)

    def _check(self, written: str) -> None:
        units = self.fake._units
        for name, unit in units.items():
            parent = units.get(self.parent(name) or "")
            # An inactive unit has no cgroup: its values reach no kernel (systemd.py's docstring).
            if parent is None or unit.active_state != "active":
                continue
            for key in ("MemoryMin", "MemoryLow"):
                if unit.memory[key] > parent.memory[key]:
                    self.violations.append(f"after writing {written}: {name} {key}={unit.memory[key]} >"
                                           f" {parent.name} {parent.memory[key]}")

    def lowered(self) -> list[tuple]:
        """Writes that took a protection (MemoryMin, MemoryLow) down. (MemoryHigh is a throttle,
        not a protection: putting a lost one back to its planned value takes it down.)"""
        return [(n, b, a) for n, b, a in self.writes
                if b is not None and any(a[k] < b[k] for k in ("MemoryMin", "MemoryLow"))]


def remove_units(fake, *names: str) -> int:
    """Unload units (UnitRemoved), children first as systemd does; return how many calls the
    stand-in had received at that moment (taken on its loop, so no call can slip in between)."""
    def remove() -> int:
        for name in names:
            if name in fake._units:
                del fake._units[name]
                fake._unexport_unit(name)
                fake._emit(fake._manager.UnitRemoved, name, unit_path(name))
        with fake._calls_lock:
            return len(fake._calls)

    return fake._run(remove)


class RecordingSystemd(Systemd):
    """The adapter as the daemon uses it, telling the harness what it does (`Harness.events`)."""

    harness: "Harness"

    @classmethod
    async def connect(cls, address=None, *, call_timeout=10.0):
        sd = await super().connect(address, call_timeout=call_timeout)

        def on_wire(msg):
            # Every message as the connection reads it, before any handler task runs.
            if msg.member == "UnitRemoved" and msg.signature == "so":
                sd.harness.events.append(("read", msg.body[0]))

        sd._bus.add_message_handler(on_wire)
        return sd

    async def set_memory(self, unit, props, **kw):
        self.harness.events.append(("set", unit))
        return await super().set_memory(unit, props, **kw)

    async def set_memory_if_loaded(self, unit, props, **kw):
        self.harness.events.append(("set", unit))
        return await super().set_memory_if_loaded(unit, props, **kw)

    async def unit_status(self, action, unit):
        # set_memory_if_loaded's check (and any other state read): the unit is loaded.
        result = await super().unit_status(action, unit)
        if result is not None:
            self.harness.events.append(("checked", unit))
            if self.harness.busy:
                await asyncio.sleep(self.harness.busy)
        return result


class Harness:
    """The daemon on the stand-in, as `async with Harness(...) as h:`; ready when entered."""

    def __init__(self, fake, tmp_path, items=None, config=None, *, capacity=16 << 30, call_timeout=2.0,
                 real_source=False, ledger_path=None, last_pods_path=None, cgroupfs=None, state_dir=None,
                 fights_path=None):
        self.fake = fake
        self.watch = Watch(fake)
        self.config_path = tmp_path / "config.yaml"
        self.config_path.write_text(yaml.safe_dump(config or TIERED))
        self.source = None if real_source else ControlledSource(items if items is not None else [])
        self.notify = NotifySocket(tmp_path)
        self.metrics = Metrics()
        self.events: list[tuple[str, str]] = []
        self.busy = 0.0  # seconds the daemon's loop is kept busy after each check (see above)
        self.capacity = capacity
        self._call_timeout = call_timeout
        outside = Outside(
            connect=self._connect, make_source=make_source if real_source else (lambda c: self.source),
            read_capacity=lambda: self.capacity, page_size=4096, metrics=self.metrics,
            notifier=Notifier(self.notify.path), cgroupfs=cgroupfs or Cgroupfs(tmp_path / "cgroup"),
            ledger_path=ledger_path, last_pods_path=last_pods_path, state_dir=state_dir,
            fights_path=fights_path)
        # (A config naming the kubelet's config file is read as the service reads it: load_config.)
        loaded = (load_config(self.config_path, required=True, blocks=features.config_blocks()) if (config or {}).get("kubeletConfigFile")
                  else parse_config(config or TIERED, blocks=features.config_blocks()))
        self.daemon = Daemon(str(self.config_path), loaded, outside)
        handler = self.daemon.events.on_unit_removed

        def on_unit_removed(name):
            self.events.append(("removed", name))
            return handler(name)

        self.daemon.events.on_unit_removed = on_unit_removed  # what the daemon subscribes when it connects
        self.task = None

    async def _connect(self, address):
        """The daemon's connection to the stand-in, recording what it does (see `events`)."""
        sd = await RecordingSystemd.connect(self.fake.address, call_timeout=self._call_timeout)
        sd.harness = self
        return sd

    async def __aenter__(self):
        self.task = asyncio.create_task(self.daemon.run())
        await until(lambda: self.daemon.ready or self.task.done(), timeout=10)
        assert not self.task.done(), self.task.exception()
        return self

    async def __aexit__(self, *exc):
        if self.task.done():
            self.task.exception()  # retrieved: the test has said what it thinks of it
            return
        self.daemon.stop()
        await asyncio.wait_for(self.task, 10)

    # ---- asking the daemon ----------------------------------------------------------------
    def fetch_now(self) -> None:
        """Ask the pod source now (not at the next poll)."""
        self.daemon.agenda.fetch_now()
        self.daemon.wake()

    def reread(self) -> None:
        """Have every unit read from systemd again (as after a daemon-reload), now."""
        self.daemon.agenda.reread()
        self.daemon.wake()

    async def resync_now(self) -> None:
        """What the resync timer does every resyncInterval, now; waits for the round after it."""
        self.daemon.agenda.resync_now()
        await self.settle()

    async def settle(self, timeout: float = 5.0):
        """Wake the daemon and wait until it has run a reconcile past this point."""
        before = self.reconciles()
        self.daemon.wake()
        await until(lambda: self.reconciles() > before or self.task.done(), timeout)

    # ---- what happened ------------------------------------------------------------------
    def alive(self) -> bool:
        return not self.task.done()

    def sets(self) -> list[tuple[str, dict]]:
        return [(unit, props) for unit, _, props in self.fake.writes]

    def memory(self, unit: str) -> dict | None:
        """What the stand-in systemd holds for `unit` (None: not loaded)."""
        u = self.fake.unit(unit)
        return None if u is None else dict(u.memory)

    @property
    def cache(self):
        """What the daemon believes systemd holds, by unit (None: not loaded; a unit it does not
        know of is absent): the Observer's cache, read only."""
        return self.daemon.observer.held

    def reconciles(self) -> float:
        return self.metrics.registry.get_sample_value("memqos_reconcile_duration_seconds_count") or 0

    def dbus(self, method: str, result: str) -> float:
        return self.metrics.registry.get_sample_value("memqos_dbus_calls_total",
                                                      {"method": method, "result": result}) or 0

    def dbus_errors(self) -> float:
        return sum(self.dbus(m, "error") for m in ("SetUnitProperties", "ListUnitsByPatterns", "GetAll", "GetUnit"))


async def until(cond, timeout: float = 5.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def run(coro, timeout: float = 60):
    return asyncio.run(asyncio.wait_for(coro, timeout))
