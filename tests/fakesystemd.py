"""A recording stand-in for systemd's D-Bus API, on a private dbus-daemon. Not a test.

`DBusDaemon` runs `dbus-daemon --session --print-address --nofork --nopidfile` on a socket
in a temporary directory; it can be killed (every client sees the bus drop) and started
again on the same address. `FakeSystemd` owns `org.freedesktop.systemd1` on that bus from a
thread with its own event loop, so the code under test talks to it over a real socket just
as it would to PID 1, and a test can drive it with plain (blocking) method calls.

What it serves, mirroring systemd (see memqos_systemd/systemd.py for the source references):
- /org/freedesktop/systemd1, org.freedesktop.systemd1.Manager: GetUnit, ListUnitsByPatterns
  (fnmatch), SetUnitProperties, Subscribe, Unsubscribe; property Version; signals UnitNew,
  UnitRemoved, JobRemoved, Reloading (sent only while someone is subscribed).
- one object per unit at /org/freedesktop/systemd1/unit/<escaped name> with
  org.freedesktop.systemd1.Unit (Id, LoadState, ActiveState, InvocationID; method
  SetProperties) and .Slice or .Scope (MemoryMin, MemoryLow, MemoryHigh, MemoryMax, type t; with
  `padding_properties=N`, N more read-only properties of mixed types, so that a GetAll reply is
  as long as systemd's: 252 answers ~72 properties for a slice, see PADDING_FOR_SYSTEMD_252).
- the same unit at its invocation path /org/freedesktop/systemd1/unit/<escaped hex of its
  InvocationID> while that run lasts. A unit added active gets a new random ID; a slice made
  by SetUnitProperties has none. Once the unit is removed (or given a new ID), every call on
  an old invocation path fails with org.freedesktop.systemd1.NoUnitForInvocationID.
- SetUnitProperties on a slice that is not loaded creates it (loaded, inactive, not
  transient) like systemd does, and records it in `created`; on a scope that is not loaded
  it fails with org.freedesktop.systemd1.NoSuchUnit. Properties are checked all first,
  then applied, as systemd does: unknown names -> PropertyReadOnly, a type other than `t`
  or MemoryHigh=0 or MemoryMax=0 -> InvalidArgs.

`writes` lists SetUnitProperties and SetProperties alike as (unit, runtime, {property: value}).

The running units' cgroup directories (with `cgroup_root` set) are kept as systemd keeps them: every
write of a unit's properties re-writes all its memory files from its state (252's
cgroup_context_apply); `write_cgroup_file` writes a file alone, around it.

Every method call that reaches it (including org.freedesktop.DBus.Properties Get/GetAll)
is recorded in order as a `Call`, with the exact D-Bus signature and body, so tests assert
exactly what was sent. Test controls: add_unit, remove_unit, set_active_state,
emit_job_removed, emit_reloading, fail_next, delay_next, set_latency, disconnect/reconnect (systemd
leaves and re-joins the bus), kill_bus/restart_bus (the dbus-daemon dies and comes back).
"""

# No `from __future__ import annotations` here: dbus-next reads D-Bus signatures from the
# annotations ('s', 'a(sv)') and needs them as written.

import asyncio
import copy
import fnmatch
import logging
import os
import shutil
import signal as signals
import subprocess
import threading
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from dbus_next import Message, MessageType, Variant
from dbus_next.aio import MessageBus
from dbus_next.constants import PropertyAccess
from dbus_next.errors import DBusError
from dbus_next.service import ServiceInterface, dbus_property, method, signal
from sockets import short_dir

SYSTEMD_NAME = "org.freedesktop.systemd1"
MANAGER_PATH = "/org/freedesktop/systemd1"
UINT64_MAX = 2**64 - 1
MEMORY_PROPERTIES = ("MemoryMin", "MemoryLow", "MemoryHigh")
NO_SUCH_UNIT = "org.freedesktop.systemd1.NoSuchUnit"
ALREADY_SUBSCRIBED = "org.freedesktop.systemd1.AlreadySubscribed"
INVALID_ARGS = "org.freedesktop.DBus.Error.InvalidArgs"
PROPERTY_READ_ONLY = "org.freedesktop.DBus.Error.PropertyReadOnly"
NO_UNIT_FOR_INVOCATION_ID = "org.freedesktop.systemd1.NoUnitForInvocationID"
UNIT_PREFIX = MANAGER_PATH + "/unit/"
WRITE_METHODS = ("SetUnitProperties", "SetProperties")
_CONTROL_TIMEOUT = 5.0
_LOAD_STATE_ERRORS = {
    "not-found": (NO_SUCH_UNIT, "Unit {} not found."),
    "masked": ("org.freedesktop.systemd1.UnitMasked", "Unit {} is masked."),
    "bad-setting": ("org.freedesktop.systemd1.BadUnitSetting", "Unit {} has a bad unit file setting."),
    "error": ("org.freedesktop.DBus.Error.InvalidArgs", "Unit {} failed to load properly: Invalid argument."),
}


def _slice_dir(root: Path, slice_name: str) -> Path:
    """A slice's cgroup directory under `root`: its name spells its ancestry (a-b.slice in a.slice)."""
    parts = slice_name[: -len(".slice")].split("-")
    return Path(root, *("-".join(parts[: i + 1]) + ".slice" for i in range(len(parts))))


def find_dbus_daemon() -> Optional[str]:
    return shutil.which("dbus-daemon") or next(
        (p for p in ("/usr/bin/dbus-daemon", "/bin/dbus-daemon") if os.access(p, os.X_OK)), None)


def unit_path(name: str) -> str:
    """systemd's object path for a unit: bus_label_escape() of the name (or of the hex of an
    invocation ID)."""
    if not name:
        return MANAGER_PATH + "/unit/_"
    out = []
    for i, ch in enumerate(name):
        if ("a" <= ch <= "z" or "A" <= ch <= "Z") or (i > 0 and "0" <= ch <= "9"):
            out.append(ch)
        else:
            out.extend(f"_{b:02x}" for b in ch.encode())
    return MANAGER_PATH + "/unit/" + "".join(out)


class DBusDaemon:
    """A private dbus-daemon with the session configuration, on a fixed socket path."""

    def __init__(self, executable: str):
        self.executable = executable
        self._dir = short_dir("memqos-bus-")  # AF_UNIX paths max 107 bytes
        self._socket = os.path.join(self._dir, "bus")
        self.address = f"unix:path={self._socket}"
        self._proc: Optional[subprocess.Popen] = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        if self.running:
            return
        if os.path.exists(self._socket):
            os.unlink(self._socket)  # left behind by kill()
        log = open(os.path.join(self._dir, "dbus-daemon.log"), "ab")
        try:
            self._proc = subprocess.Popen(
                [self.executable, "--session", "--print-address", "--nofork", "--nopidfile",
                 f"--address={self.address}"],
                stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
        finally:
            log.close()
        # It prints its address once it listens; EOF means it died.
        line = self._proc.stdout.readline().decode().strip()
        self._proc.stdout.close()
        if not line:
            self._proc.wait()
            with open(os.path.join(self._dir, "dbus-daemon.log"), errors="replace") as f:
                raise RuntimeError(f"dbus-daemon did not start: {f.read().strip()}")

    def kill(self) -> None:
        """SIGKILL: every connection drops at once, as when the system bus restarts."""
        if self.running:
            self._proc.send_signal(signals.SIGKILL)
        if self._proc is not None:
            self._proc.wait()

    def stop(self) -> None:
        if self.running:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
        shutil.rmtree(self._dir, ignore_errors=True)


@dataclass
class Call:
    """One method call as it arrived: member, body (dbus-next values), and where it went."""
    method: str
    args: list
    signature: str
    interface: str
    path: str
    sender: str


@dataclass
class FakeUnit:
    name: str
    load_state: str = "loaded"
    active_state: str = "active"
    transient: bool = True
    memory: dict = field(default_factory=lambda: {"MemoryMin": 0, "MemoryLow": 0, "MemoryHigh": UINT64_MAX})
    # What SetUnitProperties wrote: {property: (value, runtime)}; a drop-in on real systemd.
    dropins: dict = field(default_factory=dict)
    invocation_id: bytes = b""
    slice: str = ""  # a scope's parent slice, when the caller gave one (its cgroup is then kept)
    # Held by systemd and written to the cgroup with the rest at every re-apply (252's
    # cgroup_context_apply): MemorySwapMax, and memory.oom.group from OOMPolicy (0 for a runc scope:
    # Delegate=yes means OOMPolicy=continue, and the policy cannot be set after creation).
    swap_max: int = UINT64_MAX
    memory_max: int = UINT64_MAX  # MemoryMax (kept apart from `memory`: ours on one slice only)
    oom_group: bool = False
    # A service's IPAddressAllow= / IPAddressDeny=: (address family, address bytes, prefix length).
    ip_allow: list = field(default_factory=list)
    ip_deny: list = field(default_factory=list)

    @property
    def invocation_path(self) -> Optional[str]:
        return unit_path(self.invocation_id.hex()) if self.invocation_id else None

    @property
    def sub_state(self) -> str:
        return {"active": "active", "inactive": "dead", "failed": "failed"}.get(self.active_state, self.active_state)


class _ManagerInterface(ServiceInterface):
    def __init__(self, fake: "FakeSystemd"):
        super().__init__("org.freedesktop.systemd1.Manager")
        self._fake = fake

    @method()
    def GetUnit(self, name: "s") -> "o":
        unit = self._fake._units.get(name)
        if unit is None:
            raise DBusError(NO_SUCH_UNIT, f"Unit {name} not loaded.")
        return unit_path(name)

    @method()
    def ListUnitsByPatterns(self, states: "as", patterns: "as") -> "a(ssssssouso)":
        rows = []
        for unit in sorted(self._fake._units.values(), key=lambda u: u.name):
            # The state as the unit's object would answer it, so a test that stands in for that
            # object (tests/integration/test_reliability.py) sees both ways of reading it.
            exported = self._fake._exports.get(unit.name)
            unit = exported[0]._unit if exported else unit
            if patterns and not any(fnmatch.fnmatchcase(unit.name, p) for p in patterns):
                continue
            if states and not {unit.load_state, unit.active_state, unit.sub_state} & set(states):
                continue
            rows.append([unit.name, unit.name, unit.load_state, unit.active_state, unit.sub_state, "",
                         unit_path(unit.name), 0, "", "/"])
        return rows

    @method()
    def SetUnitProperties(self, name: "s", runtime: "b", properties: "a(sv)"):
        self._fake._set_unit_properties(name, runtime, properties)

    @method()
    def Subscribe(self):
        sender = self._fake._current_sender
        if sender in self._fake._subscribers:
            raise DBusError(ALREADY_SUBSCRIBED, "Client is already subscribed.")
        self._fake._subscribers.add(sender)

    @method()
    def Unsubscribe(self):
        sender = self._fake._current_sender
        if sender not in self._fake._subscribers:
            raise DBusError("org.freedesktop.systemd1.NotSubscribed", "Client is not subscribed.")
        self._fake._subscribers.discard(sender)

    @dbus_property(access=PropertyAccess.READ)
    def Version(self) -> "s":
        return self._fake.version

    @signal()
    def UnitNew(self, name, path) -> "so":
        return [name, path]

    @signal()
    def UnitRemoved(self, name, path) -> "so":
        return [name, path]

    @signal()
    def JobRemoved(self, job_id, job_path, unit, result) -> "uoss":
        return [job_id, job_path, unit, result]

    @signal()
    def Reloading(self, active) -> "b":
        return active


class _UnitInterface(ServiceInterface):
    def __init__(self, unit: FakeUnit, fake: "FakeSystemd"):
        super().__init__("org.freedesktop.systemd1.Unit")
        self._unit = unit
        self._fake = fake

    @method()
    def SetProperties(self, runtime: "b", properties: "a(sv)"):
        self._fake._set_unit_properties(self._unit.name, runtime, properties)

    @dbus_property(access=PropertyAccess.READ)
    def InvocationID(self) -> "ay":
        return self._unit.invocation_id

    @dbus_property(access=PropertyAccess.READ)
    def Id(self) -> "s":
        return self._unit.name

    @dbus_property(access=PropertyAccess.READ)
    def LoadState(self) -> "s":
        return self._unit.load_state

    @dbus_property(access=PropertyAccess.READ)
    def ActiveState(self) -> "s":
        return self._unit.active_state


class _CgroupInterface(ServiceInterface):
    """org.freedesktop.systemd1.Slice or .Scope: the memory properties we manage."""

    def __init__(self, interface: str, unit: FakeUnit):
        super().__init__(interface)
        self._unit = unit

    @dbus_property(access=PropertyAccess.READ)
    def MemoryMin(self) -> "t":
        return self._unit.memory["MemoryMin"]

    @dbus_property(access=PropertyAccess.READ)
    def MemoryLow(self) -> "t":
        return self._unit.memory["MemoryLow"]

    @dbus_property(access=PropertyAccess.READ)
    def MemoryHigh(self) -> "t":
        return self._unit.memory["MemoryHigh"]

    @dbus_property(access=PropertyAccess.READ)
    def MemoryMax(self) -> "t":
        return self._unit.memory_max


class _ServiceInterface(ServiceInterface):
    """org.freedesktop.systemd1.Service: the IP address access of its sandbox."""

    def __init__(self, unit: FakeUnit):
        super().__init__("org.freedesktop.systemd1.Service")
        self._unit = unit

    @dbus_property(access=PropertyAccess.READ)
    def IPAddressAllow(self) -> "a(iayu)":
        return [list(entry) for entry in self._unit.ip_allow]

    @dbus_property(access=PropertyAccess.READ)
    def IPAddressDeny(self) -> "a(iayu)":
        return [list(entry) for entry in self._unit.ip_deny]


# Read-only properties of mixed types that pad a unit's cgroup interface (FakeSystemd's
# padding_properties): signature and value, in systemd's style. 68 + the 4 memory properties
# makes the ~72 that systemd 252 answers to GetAll on org.freedesktop.systemd1.Slice.
PADDING_FOR_SYSTEMD_252 = 68
_PADDING_KINDS = (
    ("t", UINT64_MAX), ("b", False), ("s", "/kubepods.slice/kubepods-burstable.slice"), ("t", 0),
    ("as", ["cpu", "memory", "pids"]), ("a(st)", [["/dev/sda", 1048576]]), ("ay", b"\x00\x01"),
    ("u", 100), ("x", -1), ("a(ss)", [["/dev/null", "rwm"]]), ("s", "auto"), ("i", 0),
)
_padded_classes: dict = {}


def _padded_cgroup_class(count: int) -> type:
    """A subclass of _CgroupInterface with `count` more read-only properties (PaddingNN...)."""
    if count not in _padded_classes:
        members = {}
        for i in range(count):
            signature, value = _PADDING_KINDS[i % len(_PADDING_KINDS)]
            # _Property reads the signature from the return annotation and wants `self` only.
            getter = (lambda v: (lambda self: v))(value)
            getter.__annotations__ = {"return": signature}
            name = f"Padding{i:02d}{'Accounting' if signature == 'b' else 'Limit'}"
            getter.__name__ = name
            members[name] = dbus_property(access=PropertyAccess.READ, name=name)(getter)
        _padded_classes[count] = type(f"_CgroupInterfacePadded{count}", (_CgroupInterface,), members)
    return _padded_classes[count]


class _QuietDBusErrors(logging.Filter):
    """dbus-next 0.2.3 sends the error reply when a service method raises DBusError, then
    logs the same exception on the root logger as "unexpected". Drop those lines only."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not (text.startswith("got unexpected error processing a message")
                    and "dbus_next.errors.DBusError:" in text)


class FakeSystemd:
    """org.freedesktop.systemd1 on `daemon`'s bus, served from a background thread.

    The control methods are called from the test's thread and block until done.
    """

    def __init__(self, daemon: DBusDaemon, *, version: str = "252.36-1~deb12u1", padding_properties: int = 0):
        self.daemon = daemon
        self.version = version
        self._cgroup_class = _padded_cgroup_class(padding_properties) if padding_properties else _CgroupInterface
        self.created: list[str] = []  # slices SetUnitProperties brought into existence
        # When set, a slice SetUnitProperties brought into existence is unloaded again right after
        # the call (UnitRemoved), as systemd's garbage collector unloads an inactive unit nothing
        # refers to; what was set stays as its drop-ins (`dropins_of`).
        self.collect_created = False
        self.dropins_of: dict[str, dict] = {}
        # When set, a directory standing in for the cgroup2 mount: a running slice gets its cgroup
        # directory there with the user.invocation_id attribute, as systemd sets it on a slice it
        # starts (252 sets none on scopes: tests/e2e 12-invocation-path X). See _sync_cgroup.
        self.cgroup_root: Optional[Path] = None
        self._units: dict[str, FakeUnit] = {}
        self._exports: dict[str, list[ServiceInterface]] = {}
        self._invocation_paths: dict[str, str] = {}  # invocation path -> unit, while that run lasts
        self._path_names: dict[str, str] = {}  # every invocation path ever given out -> unit
        self._calls: list[Call] = []
        self._calls_lock = threading.Lock()
        self._failures: dict[str, list[tuple[str, str]]] = {}
        self._delays: dict[str, list[float]] = {}
        # Seconds every method call takes, answered one after another (see set_latency).
        self.latency = 0.0
        self._busy_until = 0.0
        self._replaying: set[int] = set()
        self._subscribers: set[str] = set()
        self._current_sender = ""
        self._job_id = 0
        self._bus: Optional[MessageBus] = None
        self._manager = _ManagerInterface(self)
        self._quiet = _QuietDBusErrors()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-systemd", daemon=True)

    @property
    def address(self) -> str:
        return self.daemon.address

    # ---- life cycle -------------------------------------------------------------------

    def start(self) -> None:
        logging.getLogger().addFilter(self._quiet)
        self._thread.start()
        self.reconnect()

    def stop(self) -> None:
        logging.getLogger().removeFilter(self._quiet)
        if self._thread.is_alive():
            try:
                self._run(self._leave())
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(timeout=_CONTROL_TIMEOUT)
        if not self._loop.is_running():
            self._loop.close()

    def reconnect(self) -> None:
        """Join the bus and take the name org.freedesktop.systemd1 (again)."""
        self._run(self._join())

    def disconnect(self) -> None:
        """Leave the bus: systemd is gone while the bus stays up."""
        self._run(self._leave())

    def kill_bus(self) -> None:
        """Kill the dbus-daemon: every client, this one included, sees the bus drop."""
        self.daemon.kill()
        self._run(self._wait_dropped())

    def restart_bus(self) -> None:
        """Start the dbus-daemon again on the same address and rejoin it."""
        self.daemon.start()
        self.reconnect()

    async def _join(self) -> None:
        await self._leave()
        bus = await MessageBus(bus_address=self.address).connect()
        bus.add_message_handler(self._intercept)
        bus.export(MANAGER_PATH, self._manager)
        self._bus = bus
        self._subscribers.clear()  # a new connection: systemd forgot its subscribers
        for name in self._units:
            self._export_unit(name)
        await bus.request_name(SYSTEMD_NAME)

    async def _leave(self) -> None:
        bus, self._bus = self._bus, None
        if bus is None:
            return
        if bus.connected:
            bus.disconnect()
        try:
            await asyncio.wait_for(bus.wait_for_disconnect(), _CONTROL_TIMEOUT)
        except Exception:
            pass
        for attr in ("_stream", "_sock"):
            try:
                getattr(bus, attr).close()
            except Exception:
                pass
        self._exports.clear()

    async def _wait_dropped(self) -> None:
        if self._bus is not None:
            try:
                await asyncio.wait_for(self._bus.wait_for_disconnect(), _CONTROL_TIMEOUT)
            except Exception:
                pass
            await self._leave()

    def _run(self, work: Any) -> Any:
        """Run a coroutine, or a plain function, on the fake's loop and wait for it."""
        if asyncio.iscoroutine(work):
            return asyncio.run_coroutine_threadsafe(work, self._loop).result(_CONTROL_TIMEOUT)

        async def call() -> Any:
            return work()

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(_CONTROL_TIMEOUT)

    # ---- recording, failures, delays ----------------------------------------------------

    def _intercept(self, msg: Message) -> Any:
        if msg.message_type != MessageType.METHOD_CALL:
            return None
        if id(msg) in self._replaying:
            self._replaying.discard(id(msg))
            return None
        with self._calls_lock:
            self._calls.append(Call(msg.member, list(msg.body), msg.signature, msg.interface or "", msg.path,
                                    msg.sender or ""))
        self._current_sender = msg.sender or ""
        member = "SetUnitProperties" if msg.member in WRITE_METHODS else msg.member
        failures = self._failures.get(member)
        if failures:
            error_name, text = failures.pop(0)
            return Message.new_error(msg, error_name, text)
        ended = self._ended_run(msg)
        if ended is not None and not self.latency:
            return ended
        delays = self._delays.get(member)
        if delays:
            bus = self._bus
            self._loop.call_later(delays.pop(0), self._replay, bus, msg)
            return True  # handled: no reply now
        if self.latency:
            # Like systemd under emulation: one call at a time, each taking `latency` seconds.
            self._busy_until = max(self._loop.time(), self._busy_until) + self.latency
            self._loop.call_at(self._busy_until, self._replay, self._bus, msg)
            return True
        return None

    def _replay(self, bus: Optional[MessageBus], msg: Message) -> None:
        if bus is None or not bus.connected or bus is not self._bus:
            return
        ended = self._ended_run(msg)
        if ended is not None:
            bus.send(ended)
            return
        self._replaying.add(id(msg))
        self._current_sender = msg.sender or ""
        bus._on_message(msg)  # dbus-next 0.2.3: dispatch as if it had just arrived

    @property
    def calls(self) -> list[Call]:
        with self._calls_lock:
            return copy.deepcopy(self._calls)

    def calls_to(self, method_name: str) -> list[Call]:
        return [c for c in self.calls if c.method == method_name]

    @property
    def writes(self) -> list[tuple[str, bool, dict]]:
        """Every write that reached the fake, by name (SetUnitProperties) or on a unit's path
        (Unit.SetProperties), in order: (unit, runtime, {property: value})."""
        return [self.write_of(c) for c in self.calls if c.method in WRITE_METHODS]

    def write_of(self, call: Call) -> tuple[str, bool, dict]:
        """(unit, runtime, {property: value}) of one SetUnitProperties or SetProperties call."""
        if call.method == "SetUnitProperties":
            unit, runtime, props = call.args
        else:
            runtime, props = call.args
            unit = self._path_names.get(call.path, call.path)
        return unit, runtime, {n: v.value for n, v in props}

    def clear_calls(self) -> None:
        with self._calls_lock:
            self._calls.clear()

    def fail_next(self, method_name: str, error_name: str, text: str = "") -> None:
        """The next call of `method_name` (e.g. "SetUnitProperties", "Get") fails with that error.
        "SetUnitProperties" stands for the next write either way, by name or by path (SetProperties)."""
        self._run(lambda: self._failures.setdefault(method_name, []).append(
            (error_name, text or f"{error_name.rsplit('.', 1)[-1]} (injected by the test)")))

    def set_latency(self, seconds: float) -> None:
        """From now on every method call takes `seconds`, one call at a time, as on real systemd
        in a TCG-emulated VM (20-30 ms a call): signals sent meanwhile pile up as they do there."""
        def set_() -> None:
            self.latency = seconds
        self._run(set_)

    def delay_next(self, method_name: str, seconds: float) -> None:
        """The next call of `method_name` is answered only after `seconds` ("SetUnitProperties": the
        next write, as in fail_next)."""
        self._run(lambda: self._delays.setdefault(method_name, []).append(seconds))

    # ---- units --------------------------------------------------------------------------

    def add_unit(self, name: str, *, active_state: str = "active", load_state: str = "loaded",
                 transient: bool = True, memory: Optional[dict] = None, slice: str = "",
                 ip_allow: tuple = (), ip_deny: tuple = ()) -> None:
        """Load a unit (as the kubelet starting a pod slice would) and send UnitNew. A scope given
        its parent `slice` gets a cgroup directory under cgroup_root as slices do (no ID on it).
        A service may be given its IPAddressAllow=/IPAddressDeny= entries (family, bytes, prefix)."""
        def add() -> None:
            unit = FakeUnit(name, load_state=load_state, active_state=active_state, transient=transient,
                            slice=slice, ip_allow=list(ip_allow), ip_deny=list(ip_deny))
            unit.memory.update(memory or {})
            if load_state == "loaded" and active_state != "inactive":
                unit.invocation_id = os.urandom(16)
            self._units[name] = unit
            self._export_unit(name)
            self._sync_cgroup(name)
            self._emit(self._manager.UnitNew, name, unit_path(name))
        self._run(add)

    def remove_unit(self, name: str) -> None:
        """Unload a unit (the pod has gone) and send UnitRemoved."""
        def remove() -> None:
            del self._units[name]
            self._unexport_unit(name)
            self._sync_cgroup(name)
            self._emit(self._manager.UnitRemoved, name, unit_path(name))
        self._run(remove)

    def announce_removed(self, name: str) -> None:
        """Send UnitRemoved for a unit that stays loaded, as a daemon-reexec does for every unit
        (and announces none again: 11-systemd-facts D)."""
        self._run(lambda: self._emit(self._manager.UnitRemoved, name, unit_path(name)))

    def set_active_state(self, name: str, state: str) -> None:
        """Change a unit's ActiveState; a unit started again gets a new invocation ID."""
        def set_() -> None:
            unit = self._units[name]
            if unit.active_state == "inactive" and state != "inactive":
                self._unexport_unit(name)
                unit.invocation_id = os.urandom(16)
                self._export_unit(name)
            unit.active_state = state
            self._sync_cgroup(name)
        self._run(set_)

    def set_memory_max(self, name: str, value: int) -> None:
        """Someone else sets a unit's MemoryMax through systemd (the kubelet's QOSReserved on the
        BestEffort slice, a `systemctl set-property`): held, and applied to its cgroup."""
        def set_() -> None:
            self._units[name].memory_max = value
            self._sync_cgroup(name)
        self._run(set_)

    def unit(self, name: str) -> Optional[FakeUnit]:
        """A copy of the unit as the fake holds it, or None when it is not loaded."""
        return self._run(lambda: copy.deepcopy(self._units.get(name)))

    def emit_job_removed(self, unit: str, result: str = "done") -> None:
        def emit() -> None:
            self._job_id += 1
            self._emit(self._manager.JobRemoved, self._job_id, f"{MANAGER_PATH}/job/{self._job_id}", unit, result)
        self._run(emit)

    def emit_reloading(self, active: bool) -> None:
        self._run(lambda: self._emit(self._manager.Reloading, active))

    def daemon_reload(self) -> None:
        """What `systemctl daemon-reload` looks like from outside on 252 (e2e 11-systemd-facts D):
        Reloading(true), UnitRemoved then UnitNew for every unit, each unit's cgroup settings
        re-applied from systemd's state (what a runtime wrote only to a file is lost: cgroupfs.py),
        Reloading(false). Units keep their values, runs and invocation IDs."""
        def reload() -> None:
            self._emit(self._manager.Reloading, True)
            for name in sorted(self._units):
                self._emit(self._manager.UnitRemoved, name, unit_path(name))
            for name in sorted(self._units):
                self._emit(self._manager.UnitNew, name, unit_path(name))
                self._sync_cgroup(name)
            self._emit(self._manager.Reloading, False)
        self._run(reload)

    def cgroup_dir(self, name: str) -> Path:
        """The directory standing in for a unit's cgroup (a scope's needs its slice given at add_unit)."""
        if name.endswith(".slice"):
            return _slice_dir(self.cgroup_root, name)
        return _slice_dir(self.cgroup_root, self._run(lambda: self._units[name].slice)) / name

    def write_cgroup_file(self, name: str, **props: int) -> None:
        """A write to a unit's cgroup files alone, around systemd (MemoryMin=0 writes 0 to memory.min):
        what an agent that writes cgroupfs for its own Memory QoS does, or a person's echo. systemd's
        state is untouched, so a D-Bus read still answers its own values; its next re-apply of the
        unit (any SetUnitProperties on it, a daemon-reload) writes every memory file back from that
        state. Written from the caller's thread, as another process would."""
        files = {"MemoryMin": "memory.min", "MemoryLow": "memory.low", "MemoryHigh": "memory.high"}
        where = self.cgroup_dir(name)
        for prop, value in props.items():
            with open(where / files[prop], "w") as f:
                f.write("max\n" if value == UINT64_MAX else f"{value}\n")

    def spoof_signal(self, destination: str, member: str, signature: str, body: list) -> None:
        """Send a Manager signal from another connection, straight to `destination`."""
        async def spoof() -> None:
            bus = await MessageBus(bus_address=self.address).connect()
            try:
                msg = Message.new_signal(MANAGER_PATH, "org.freedesktop.systemd1.Manager", member, signature, body)
                msg.destination = destination
                await bus.send(msg)
                await bus.call(Message(destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                                       interface="org.freedesktop.DBus.Peer", member="Ping"))
            finally:
                bus.disconnect()
                try:
                    await asyncio.wait_for(bus.wait_for_disconnect(), _CONTROL_TIMEOUT)
                except Exception:
                    pass
                bus._sock.close()
        self._run(spoof())

    @property
    def subscribers(self) -> set[str]:
        return self._run(lambda: set(self._subscribers))

    def _emit(self, signal_fn: Callable, *args: Any) -> None:
        # systemd sends its unit and job signals only while at least one client is subscribed.
        if self._subscribers and self._bus is not None and self._bus.connected:
            signal_fn(*args)

    def _export_unit(self, name: str) -> None:
        if self._bus is None:
            return
        unit = self._units[name]
        suffix = name.rsplit(".", 1)[-1]
        paths = [unit_path(name)] + ([unit.invocation_path] if unit.invocation_id else [])
        exported: list[ServiceInterface] = []
        for path in paths:
            interfaces: list[ServiceInterface] = [_UnitInterface(unit, self)]
            if suffix in ("slice", "scope"):
                interfaces.append(self._cgroup_class(f"org.freedesktop.systemd1.{suffix.capitalize()}", unit))
            elif suffix == "service":
                interfaces.append(_ServiceInterface(unit))
            for iface in interfaces:
                self._bus.export(path, iface)
            exported += interfaces
        self._exports[name] = exported
        self._invocation_paths = {p: n for p, n in self._invocation_paths.items() if n != name}
        if unit.invocation_id:
            self._invocation_paths[unit.invocation_path] = name
            self._path_names[unit.invocation_path] = name

    def _sync_cgroup(self, name: str) -> None:
        """Keep a slice's cgroup directory under cgroup_root as systemd would: made, with
        user.invocation_id and the memory values applied, while it runs; the attribute removed
        once it is unloaded. A scope added with its parent slice gets its directory and values
        too, with no ID (as on 252)."""
        unit = self._units.get(name)
        if self.cgroup_root is None:
            return
        if name.endswith(".slice"):
            path = _slice_dir(self.cgroup_root, name)
        elif unit is not None and unit.slice:
            path = _slice_dir(self.cgroup_root, unit.slice) / name
        else:
            return
        if unit is not None and unit.invocation_id and unit.active_state != "inactive":
            path.mkdir(parents=True, exist_ok=True)
            if name.endswith(".slice"):
                os.setxattr(path, "user.invocation_id", unit.invocation_id.hex().encode())
            # What the kernel shows of the values systemd applied (memory.min/low/high), and the
            # other memory files 252 rewrites from its own state at the same time, whatever a
            # runtime had written to them (cgroupfs.py, "Why that file").
            values = {**unit.memory, "MemorySwapMax": unit.swap_max, "MemoryMax": unit.memory_max}
            for prop, file in (("MemoryMin", "memory.min"), ("MemoryLow", "memory.low"), ("MemoryHigh", "memory.high"),
                               ("MemorySwapMax", "memory.swap.max"), ("MemoryMax", "memory.max")):
                value = values[prop]
                (path / file).write_text("max\n" if value == UINT64_MAX else f"{value}\n")
            (path / "memory.oom.group").write_text("1\n" if unit.oom_group else "0\n")
        elif path.is_dir():
            try:
                os.removexattr(path, "user.invocation_id")
            except OSError:
                pass

    def _unexport_unit(self, name: str) -> None:
        self._exports.pop(name, None)
        self._invocation_paths = {p: n for p, n in self._invocation_paths.items() if n != name}
        if self._bus is not None:
            self._bus.unexport(unit_path(name))
            unit = self._units.get(name)
            if unit is not None and unit.invocation_id:
                self._bus.unexport(unit.invocation_path)

    def _ended_run(self, msg: Message) -> Optional[Message]:
        """systemd's answer to a call on an invocation path of no current run, else None: like
        manager_load_unit_from_dbus_path, any unit path whose label is 32 hex digits (an ended
        run's, or one never given out) is refused as an unknown invocation ID."""
        path = msg.path or ""
        if path in self._invocation_paths or not path.startswith(UNIT_PREFIX):
            return None
        label = path[len(UNIT_PREFIX):]
        if label[:1] == "_" and len(label) == 34:  # a leading digit, escaped as _3N
            label = chr(int(label[1:3], 16)) + label[3:]
        if path not in self._path_names and not (len(label) == 32 and set(label) <= set("0123456789abcdef")):
            return None
        return Message.new_error(msg, NO_UNIT_FOR_INVOCATION_ID,
                                 f"No unit with the specified invocation ID {path[len(UNIT_PREFIX):]} known.")

    def _set_unit_properties(self, name: str, runtime: bool, properties: list) -> None:
        unit = self._units.get(name)
        if unit is None:
            if not name.endswith(".slice"):
                # scope_load() refuses non-transient scopes: load state not-found.
                raise DBusError(NO_SUCH_UNIT, f"Unit {name} not found.")
            # A slice loads without a unit file: systemd creates it, inactive.
            unit = FakeUnit(name, active_state="inactive", transient=False)
            self._units[name] = unit
            self.created.append(name)
            self._export_unit(name)
            self._emit(self._manager.UnitNew, name, unit_path(name))
        if unit.load_state != "loaded":  # bus_unit_validate_load_state()
            error, text = _LOAD_STATE_ERRORS.get(unit.load_state, (NO_SUCH_UNIT, "Unexpected load state of unit {}"))
            raise DBusError(error, text.format(name))
        # First check every property, then apply: systemd does the same two passes.
        for prop, value in properties:
            if prop not in MEMORY_PROPERTIES + ("MemorySwapMax", "MemoryMax"):
                raise DBusError(PROPERTY_READ_ONLY, f"Cannot set property {prop}, or unknown property.")
            if not isinstance(value, Variant) or value.signature != "t":
                raise DBusError(INVALID_ARGS, f"Invalid type for {prop}: expected t")
            if prop in ("MemoryHigh", "MemoryMax") and value.value == 0:
                raise DBusError(INVALID_ARGS, f"{prop}= is too small")
        for prop, value in properties:
            if prop == "MemorySwapMax":
                unit.swap_max = value.value
            elif prop == "MemoryMax":
                unit.memory_max = value.value
            else:
                unit.memory[prop] = value.value
            unit.dropins[prop] = (value.value, runtime)
        self._sync_cgroup(name)
        if self.collect_created and name in self.created and unit.active_state == "inactive":
            self.dropins_of[name] = dict(unit.memory)
            self._loop.call_soon(self._collect, name)

    def _collect(self, name: str) -> None:
        if name in self._units and self._units[name].active_state == "inactive":
            del self._units[name]
            self._unexport_unit(name)
            self._sync_cgroup(name)
            self._emit(self._manager.UnitRemoved, name, unit_path(name))
