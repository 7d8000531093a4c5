"""The systemd adapter: MemoryMin/MemoryLow/MemoryHigh through systemd's D-Bus API.

What systemd's calls and signals mean, and the order of its signals against our reads. The
calls are here; the signal feed (Subscribe, the signals counted as read and handed to their
handlers) is systemd_signals.py, one `SignalFeed` that `Systemd` owns (`Systemd.signals`). The
D-Bus plumbing under both (the connection, the call timeout, the map from D-Bus error names to the
`SystemdError` family) is bus.py; only these three import `dbus_next`. Everything else sees
`Systemd`, plain Python values, and the `SystemdError` family. Every call goes through
`Bus.call` (here by way of `Systemd._call`), which applies `call_timeout` (a hung systemd must
not hang the daemon) and maps errors.

What SetUnitProperties does to a unit that is not loaded
--------------------------------------------------------
Read from systemd's source (src/core/dbus-manager.c, unit.c, slice.c, scope.c, cgroup.c;
the same from v252, Debian bookworm, to current main). The e2e VM suite is what proves it
on a real systemd; until it has, treat this as "what the source says".

- `Manager.SetUnitProperties` is `method_generic_unit_operation(...,
  GENERIC_UNIT_LOAD|GENERIC_UNIT_VALIDATE_LOADED)`: it **loads** the named unit if it is
  not in memory, then refuses unless its LoadState is `loaded`
  (`bus_unit_validate_load_state`: not-found -> `org.freedesktop.systemd1.NoSuchUnit`
  "Unit X not found.", masked -> `...UnitMasked`, bad setting -> `...BadUnitSetting`,
  other load errors -> an errno-named error).
- **A slice loads without a unit file** (`slice_load` calls
  `unit_load_fragment_and_dropin(u, false)`: no fragment required). So SetUnitProperties
  on a slice nobody has created *succeeds*: systemd makes a new slice unit (loaded,
  inactive; its parent slices are pulled in as dependencies) and, the unit not being
  transient, writes the values as drop-ins `50-MemoryLow.conf` etc. under
  `/run/systemd/system.control/<slice>.d/` (runtime=true) or
  `/etc/systemd/system.control/<slice>.d/` (runtime=false) (`unit_drop_in_dir`).
  The unit itself is garbage-collected later, but those drop-ins stay until reboot
  (runtime) or forever (persistent), and apply to any later unit of that name.
  On systemd 252 the values also reach the kernel at once: the VM suite saw the inactive
  slice's cgroup directory created and `memory.min` written (tests/e2e/README.md, "What we
  learned"). Worse, those control drop-ins outlive a later transient unit of the same name
  (the kubelet's StartTransientUnit): at every daemon-reload they win over the values
  written since. So the daemon only ever creates reserved slices this way (reconcile.py,
  MAY_CREATE); the kubepods tree is written only while loaded and running.
- **A scope that is not loaded fails**: `scope_load` refuses non-transient scopes
  (-ENOENT while still a stub -> LoadState `not-found`), so the call fails with
  `org.freedesktop.systemd1.NoSuchUnit` and nothing is written.
- Units the kubelet/runc create with StartTransientUnit (pod slices, container scopes) are
  transient: their drop-ins are redirected to `/run/systemd/transient/<unit>.d/` and
  removed together with the unit (`unit_remove_transient`). Setting properties on a live
  pod leaves nothing behind; setting them on a pod that has gone creates a stray
  non-transient slice and a control drop-in. Hence `set_memory_if_loaded` for the
  kubepods tree: `GetUnit` and `ListUnitsByPatterns` never load a unit, so we check with
  them first. A check cannot close the window between it and the write (a unit's object
  path by name loads the unit too: `manager_load_unit_from_dbus_path`), and under churn on
  a slow PID 1 that window leaked a pod slice in half the runs of e2e 85-churn.
- **So those writes go to the unit's invocation path**: `Unit.SetProperties(runtime,
  properties)` on `/org/freedesktop/systemd1/unit/<InvocationID in hex, label-escaped>`.
  That path names one run of the unit. Once the unit is collected, any call on it fails
  with `org.freedesktop.systemd1.NoUnitForInvocationID` and nothing is created: no unit,
  drop-in or cgroup (verified on 252, tests/e2e/README.md). It survives daemon-reload and
  daemon-reexec. The one case it does not cover: a unit stopped but not yet collected
  still takes the write (its cgroup directory is made again, empty; no drop-in outlives it).
  `InvocationID` is read once per run of a unit (`_invocation_path`, cached until a signal
  for the unit arrives).
- **A slice's invocation ID is also on its cgroup directory**: as it starts a slice, systemd
  sets the extended attributes `user.invocation_id` and `trusted.invocation_id` (32 hex digits)
  on the slice's cgroup; journald reads them the same way. `user.*` is readable without
  capabilities (the service has none; `trusted.*` needs CAP_SYS_ADMIN). Verified on 252 for
  pod slices, also after a restart of the same name; container scopes have neither attribute
  there (tests/e2e 12-invocation-path X). `cgroupfs.read_invocation_id` reads it: a pod slice that has
  just started is then written with one call (`set_memory_if_loaded(invocation_id=...)`) and
  no question to systemd first. A stale ID is harmless: its run has ended, the write is refused.
- Reading properties through a unit's object path also loads the unit if it has gone in
  the meantime; for a slice that yields a fresh, inactive slice with no drop-ins of ours,
  which systemd collects again. `read_memory` reads only units a listing found loaded.
- `ListUnitsByPatterns` lists units in memory and never loads one, like `GetUnit`; with exact
  names as patterns it answers LoadState, ActiveState and the object path of many units in one
  call (`unit_states`). The daemon reads a reconcile round's units that way, then writes
  without checking each again unless a signal for the unit came in between (`UnitStatus`).
- `GetUnit("")` answers with the *caller's own* unit: unit names are validated as
  non-empty before anything is sent.

Values: properties are D-Bus type `t` (uint64); 2**64-1 means `infinity`. systemd refuses
MemoryHigh=0 and MemoryMax=0 ("...= is too small"); 0 is valid for MemoryMin/MemoryLow. MemoryMax
is ours only on the units a feature sets it on (features.owned): `read_memory(with_max=True)`.

Lifecycle: when the connection is lost (dbus-daemon restart), calls raise `BusClosed` and
the `on_disconnect` callbacks run once. The caller then `close()`s this instance and
`connect()`s a new one (and subscribes again); an instance never reconnects by itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dbus_next import Variant

from .bus import AccessDenied, Bus, BusClosed, CallTimeout, NoSuchUnit, SystemdError, variant_value
from .quantity import UINT64_MAX, show_value
from .systemd_signals import MANAGER as _MANAGER, MANAGER_PATH as _MANAGER_PATH, SYSTEMD as _SYSTEMD
from .systemd_signals import Callback, SignalFeed

__all__ = [
    "MEMORY_PROPERTIES", "CARRIED_PROPERTIES", "UINT64_MAX", "ACTIVE_STATES",
    "SystemdError", "NoSuchUnit", "AccessDenied", "CallTimeout", "BusClosed",
    "Systemd", "UnitStatus", "describe_call",
]

MEMORY_PROPERTIES = ("MemoryMin", "MemoryLow", "MemoryHigh")
# Set by a feature on the units it owns (features.owned), and read only where it is ours.
MAX_PROPERTY = "MemoryMax"
_OURS = MEMORY_PROPERTIES + (MAX_PROPERTY,)
# Sent beside ours, never planned: a value the runtime wrote only to its cgroup's file, which the
# re-apply our write causes would otherwise undo (cgroupfs.py, "Why that file").
CARRIED_PROPERTIES = ("MemorySwapMax",)
# ActiveState values in which a unit exists and is not on its way out.
ACTIVE_STATES = frozenset({"active", "activating", "reloading", "refreshing"})

_UNIT = "org.freedesktop.systemd1.Unit"
_SERVICE = "org.freedesktop.systemd1.Service"
_PROPERTIES = "org.freedesktop.DBus.Properties"
_UNIT_PATH_PREFIX = "/org/freedesktop/systemd1/unit/"
_CGROUP_INTERFACE = {".slice": "org.freedesktop.systemd1.Slice", ".scope": "org.freedesktop.systemd1.Scope"}
# A unit name with one of these would be a glob to ListUnitsByPatterns (valid unit names have
# none of them but the backslash of \x2d escapes): such names are looked up one by one instead.
_GLOB_CHARS = frozenset("*?[\\")


def _label_escape(text: str) -> str:
    """sd-bus's bus_label_escape: letters stay, digits stay unless first, all else is _xx."""
    return "".join(c if c.isascii() and (c.isalpha() or (c.isdigit() and i)) else f"_{ord(c):02x}"
                   for i, c in enumerate(text)) or "_"


def invocation_path(invocation_id: bytes) -> str:
    """The object path of one run of a unit: /org/freedesktop/systemd1/unit/<id in hex>."""
    if not isinstance(invocation_id, bytes) or len(invocation_id) != 16:
        raise ValueError(f"an invocation ID is 16 bytes, not {invocation_id!r}")
    return f"{_UNIT_PATH_PREFIX}{_label_escape(invocation_id.hex())}"


def _check_unit(unit: object, *, cgroup: bool = False) -> str:
    if not isinstance(unit, str) or not unit:
        raise ValueError(f"unit name must be a non-empty string, not {unit!r}")
    if "/" in unit or any(c.isspace() or not c.isprintable() for c in unit):
        raise ValueError(f"unit name {unit!r} contains '/', spaces or control characters")
    if cgroup and not unit.endswith(tuple(_CGROUP_INTERFACE)):
        raise ValueError(f"{unit}: memory properties are only managed on .slice and .scope units")
    return unit


def _check_props(unit: str, props: object) -> list[tuple[str, int]]:
    """Validated (name, value) pairs, ours in MEMORY_PROPERTIES order (then MemoryMax) and then any
    carried one (CARRIED_PROPERTIES); at least one of ours. ValueError otherwise."""
    if not isinstance(props, Mapping):
        raise ValueError(f"{unit}: properties must be a mapping, not {type(props).__name__}")
    if not props:
        raise ValueError(f"{unit}: no properties to set")
    allowed = _OURS + CARRIED_PROPERTIES
    unknown = sorted(str(k) for k in props if k not in allowed)
    if unknown:
        raise ValueError(f"{unit}: unknown propert{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}"
                         f" (allowed: {', '.join(allowed)})")
    if not any(k in props for k in _OURS):
        raise ValueError(f"{unit}: none of {', '.join(_OURS)} to set")
    pairs = []
    for name in allowed:
        if name not in props:
            continue
        value = props[name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{unit}: {name}={value!r} is not an integer number of bytes")
        if not 0 <= value <= UINT64_MAX:
            raise ValueError(f"{unit}: {name}={value} is outside [0, 2**64-1]")
        if name in ("MemoryHigh", "MemoryMax") and value == 0:
            raise ValueError(f"{unit}: {name}=0 is refused by systemd (use 2**64-1 for no limit)")
        pairs.append((name, int(value)))
    return pairs


def describe_call(unit: str, props: dict[str, int], runtime: bool = True, *, running_only: bool = False) -> str:
    """One line saying what would be sent, for --dry-run. Validates like the write.

    `running_only`: the write of `set_memory_if_loaded`, `Unit.SetProperties` on the running
    unit's invocation path (shown as "SetProperties <unit>"); otherwise `set_memory`'s
    `SetUnitProperties <unit>`."""
    _check_unit(unit, cgroup=True)
    pairs = _check_props(unit, props)
    values = " ".join(f"{name}={show_value(value)}" for name, value in pairs)
    method = "SetProperties" if running_only else "SetUnitProperties"
    return f"{method} {unit} runtime={'true' if runtime else 'false'} {values}"


@dataclass(frozen=True)
class UnitStatus:
    """A unit in memory as one read saw it.

    `seen` is how many unit signals (UnitNew, UnitRemoved, JobRemoved) had been read off the bus
    when the answer was: systemd sends a signal only after the change it reports, so the answer
    already reflects every signal counted in `seen`. A signal for the unit counted later may
    mean the answer is stale (see `set_memory_if_loaded`).
    """

    load_state: str
    active_state: str
    path: str
    seen: int

    @property
    def running(self) -> bool:
        return self.load_state == "loaded" and self.active_state in ACTIVE_STATES


class Systemd:
    """One connection to systemd. Make it with `await Systemd.connect()`."""

    def __init__(self, bus: Bus):
        self._bus = bus
        # unit -> its invocation path while no signal for it has been read; see _invocation_path.
        self._invocations: dict[str, str] = {}
        # systemd's signals on this connection, counted as read (UnitStatus.seen); a signal for a
        # unit drops its invocation path: a new run of the unit, or none.
        self.signals = SignalFeed(bus, on_signal=lambda unit: self._invocations.pop(unit, None))

    # ---- connection -------------------------------------------------------------------

    @classmethod
    async def connect(cls, address: str | None = None, *, call_timeout: float = 10.0) -> Systemd:
        """Connect to the system bus (address None) or to the bus at `address`."""
        return cls(await Bus.connect(address, call_timeout=call_timeout))

    @property
    def connected(self) -> bool:
        return self._bus.connected

    def on_disconnect(self, callback: Callable[[], Awaitable[None] | None]) -> None:
        """Run `callback()` once when the bus connection is lost (not on `close()`)."""
        self._bus.on_disconnect(callback)

    async def close(self) -> None:
        """Disconnect. Safe to call twice, and after the connection was lost."""
        await self._bus.close(*self.signals.tasks)

    # ---- calls ------------------------------------------------------------------------

    async def _call(self, action: str, member: str, signature: str = "", body: list | None = None, *,
                    path: str = _MANAGER_PATH, interface: str = _MANAGER, destination: str = _SYSTEMD,
                    reply_signature: str | None = None, ok_errors: frozenset[str] = frozenset(),
                    seen: list[int] | None = None) -> list:
        """One call to systemd (the manager unless said otherwise), through Bus.call."""
        return await self._bus.call(action, member, signature, body, path=path, interface=interface,
                                    destination=destination, reply_signature=reply_signature,
                                    ok_errors=ok_errors, seen=seen)

    async def _get_property(self, action: str, path: str, interface: str, name: str, signature: str) -> Any:
        return await self._bus.get_property(action, path, interface, name, signature, destination=_SYSTEMD)

    async def _unit_path(self, action: str, unit: str) -> str | None:
        """GetUnit: the object path of a unit in memory, or None. Never loads the unit."""
        try:
            body = await self._call(action, "GetUnit", "s", [unit], reply_signature="o")
        except NoSuchUnit:
            return None
        return body[0]

    async def unit_status(self, action: str, unit: str) -> tuple[str, str, str] | None:
        """(path, LoadState, ActiveState) of a unit in memory, or None."""
        path = await self._unit_path(action, unit)
        if path is None:
            return None
        try:
            load = await self._get_property(action, path, _UNIT, "LoadState", "s")
            active = await self._get_property(action, path, _UNIT, "ActiveState", "s")
        except NoSuchUnit:
            return None
        return path, load, active

    # ---- reading ----------------------------------------------------------------------

    async def version(self) -> str:
        """systemd's version string, e.g. "252.36-1~deb12u1"."""
        return await self._get_property("read the systemd version", _MANAGER_PATH, _MANAGER, "Version", "s")

    async def list_unit_states(self, patterns: list[str]) -> dict[str, UnitStatus]:
        """LoadState/ActiveState/object path of every unit in memory matching `patterns` (globs),
        in one ListUnitsByPatterns call. Like GetUnit, it never loads a unit."""
        if isinstance(patterns, str) or not patterns or not all(isinstance(p, str) and p for p in patterns):
            raise ValueError(f"patterns must be a non-empty list of non-empty strings, not {patterns!r}")
        seen: list[int] = []
        body = await self._call(f"read the state of units matching {' '.join(patterns[:3])}"
                                + (f" and {len(patterns) - 3} more" if len(patterns) > 3 else ""),
                                "ListUnitsByPatterns", "asas", [[], list(patterns)],
                                reply_signature="a(ssssssouso)", seen=seen)
        return {row[0]: UnitStatus(row[2], row[3], row[6], seen[0]) for row in body[0]}

    async def unit_states(self, units: Iterable[str]) -> dict[str, UnitStatus]:
        """The status of each of `units` that is in memory; units not in memory are left out.

        One ListUnitsByPatterns call for all of them (each name is a pattern matching only
        itself), instead of GetUnit and two property reads per unit: under emulation every call
        costs 20-30 ms, and a burst of new pods brings a dozen units at once.
        """
        names = sorted({_check_unit(u) for u in units})
        literal = [n for n in names if not _GLOB_CHARS & set(n)]
        out = {}
        if literal:
            states = await self.list_unit_states(literal)
            out = {n: states[n] for n in literal if n in states}
        for name in names:
            if name in literal:
                continue
            seen = self.signals.signal_count  # taken before the reads: safe
            status = await self.unit_status(f"read the state of {name}", name)
            if status is not None:
                out[name] = UnitStatus(status[1], status[2], status[0], seen)
        return out

    @property
    def signal_count(self) -> int:
        """How many unit signals have been read off the bus so far (SignalFeed.signal_count)."""
        return self.signals.signal_count

    def removed_since(self, unit: str, seen: int) -> bool:
        """Whether a UnitRemoved of `unit` was read after the signal count `seen` (SignalFeed)."""
        return self.signals.removed_since(unit, seen)

    async def read_memory(self, unit: str, status: UnitStatus, *, with_max: bool = False) -> dict[str, int] | None:
        """MemoryMin/MemoryLow/MemoryHigh (and MemoryMax `with_max`) of a unit `unit_states` found
        loaded: one GetAll on its object path. None when it is not loaded, or has been removed since
        (reading through its path would load it again)."""
        _check_unit(unit, cgroup=True)
        if status.load_state != "loaded" or self.signals.removed_since(unit, status.seen):
            return None
        action = f"read memory properties of {unit}"
        interface = _CGROUP_INTERFACE[unit[unit.rindex("."):]]
        try:
            body = await self._call(action, "GetAll", "s", [interface], path=status.path, interface=_PROPERTIES,
                                    reply_signature="a{sv}")
        except NoSuchUnit:
            return None
        values = body[0]
        return {name: variant_value(values.get(name), "t", f"{action} ({name})")
                for name in (_OURS if with_max else MEMORY_PROPERTIES)}

    async def unit_state(self, unit: str) -> str | None:
        """ActiveState of a loaded unit; None when it is not loaded."""
        _check_unit(unit)
        status = await self.unit_status(f"read the state of {unit}", unit)
        if status is None or status[1] != "loaded":
            return None
        return status[2]

    async def ip_address_access(self, unit: str) -> tuple[list[tuple[bytes, int]], list[tuple[bytes, int]]] | None:
        """A running service's IPAddressAllow= and IPAddressDeny= as systemd holds them (drop-ins
        included): (allow, deny), each a list of (address bytes, prefix length); None when the
        service is not loaded or not running (active, activating or reloading: on a DaemonSet's
        node the package's service may be there, stopped). For `check`: what the service's
        sandbox lets it reach."""
        _check_unit(unit)
        action = f"read the IP address access of {unit}"
        status = await self.unit_status(action, unit)
        if status is None or status[1] != "loaded" or status[2] not in ("active", "activating", "reloading"):
            return None
        try:
            lists = [await self._get_property(action, status[0], _SERVICE, name, "a(iayu)")
                     for name in ("IPAddressAllow", "IPAddressDeny")]
        except NoSuchUnit:
            return None
        allow, deny = ([(bytes(address), int(prefix)) for _family, address, prefix in entries] for entries in lists)
        return allow, deny

    async def get_memory(self, unit: str) -> dict[str, int] | None:
        """MemoryMin/MemoryLow/MemoryHigh as systemd holds them; None when not loaded.
        For one unit at a time (commands, tests): `unit_states` then `read_memory`."""
        status = (await self.unit_states([_check_unit(unit, cgroup=True)])).get(unit)
        return None if status is None else await self.read_memory(unit, status)

    # ---- writing ----------------------------------------------------------------------

    async def set_memory(self, unit: str, props: dict[str, int], *, runtime: bool = True) -> None:
        """SetUnitProperties(unit, runtime, [(name, uint64)...]).

        Validates before sending (ValueError). Beware: on a slice that is not loaded this
        creates the slice and a drop-in (see the module docstring); for units that may have
        gone, use `set_memory_if_loaded`.
        """
        _check_unit(unit, cgroup=True)
        pairs = _check_props(unit, props)
        if not isinstance(runtime, bool):
            raise ValueError(f"{unit}: runtime must be True or False, not {runtime!r}")
        # dbus-next marshals D-Bus structs from lists; a tuple raises SignatureBodyMismatchError.
        array = [[name, Variant("t", value)] for name, value in pairs]
        await self._call(f"set {' '.join(f'{n}={show_value(v)}' for n, v in pairs)} on {unit}",
                         "SetUnitProperties", "sba(sv)", [unit, runtime, array], reply_signature="")

    async def set_memory_if_loaded(self, unit: str, props: dict[str, int], *, runtime: bool = True,
                                   status: UnitStatus | None = None, invocation_id: bytes | None = None) -> None:
        """Set properties on the running unit `unit` through its invocation path: NoSuchUnit if it
        is not running, or if that run of it has ended by the time systemd reads the write.

        For the kubepods tree (node, QoS, pod slices and container scopes), which the daemon must
        never create or re-create: a write by name to a unit that was collected a moment ago
        makes a stray slice with a control drop-in (see the module docstring).

        `status`, from `unit_states` a moment ago (the same reconcile round), saves the check's
        three calls when it says running and no UnitNew, UnitRemoved or JobRemoved of the unit
        has been read since: systemd would have sent one of those before the answer to any later
        call if the unit had been stopped by a job or collected.

        `invocation_id`, the run's ID as `read_invocation_id` found it on the unit's cgroup, makes
        this one call: the write goes to that run's path with no check and no ID read first. If
        that run has ended, systemd refuses it (NoSuchUnit) and creates nothing.
        """
        _check_unit(unit, cgroup=True)
        pairs = _check_props(unit, props)
        if not isinstance(runtime, bool):
            raise ValueError(f"{unit}: runtime must be True or False, not {runtime!r}")
        if invocation_id is not None:
            target = invocation_path(invocation_id)
            await self._write_run(unit, target, runtime, pairs)
            return
        fresh = status is not None and not self.signals.changed_since(unit, status.seen)
        if fresh and not status.running:
            raise NoSuchUnit(f"{unit}: {status.load_state}, {status.active_state}; not setting properties on a"
                             " unit that is not running")
        if fresh:
            path, seen = status.path, status.seen
        else:
            seen = self.signals.signal_count
            checked = await self.unit_status(f"check {unit} before setting memory properties", unit)
            if checked is None:
                raise NoSuchUnit(f"{unit}: not loaded; not setting properties (that would create it)")
            path, load, active = checked
            if load != "loaded" or active not in ACTIVE_STATES:
                raise NoSuchUnit(f"{unit}: {load}, {active}; not setting properties on a unit that is not running")
        target = await self._invocation_path(unit, path, seen)
        try:
            await self._write_run(unit, target, runtime, pairs)
        except NoSuchUnit:
            self._invocations.pop(unit, None)
            raise

    async def _write_run(self, unit: str, target: str, runtime: bool, pairs: list[tuple[str, int]]) -> None:
        """Unit.SetProperties on one run's invocation path."""
        array = [[name, Variant("t", value)] for name, value in pairs]
        await self._call(f"set {' '.join(f'{n}={show_value(v)}' for n, v in pairs)} on {unit}",
                         "SetProperties", "ba(sv)", [runtime, array], path=target, interface=_UNIT,
                         reply_signature="")

    async def _invocation_path(self, unit: str, path: str, seen: int) -> str:
        """The invocation path of the run of `unit` that was running at signal count `seen`,
        its by-name object path being `path`. Cached until a signal for the unit is read
        (the feed's `on_signal` drops it)."""
        cached = self._invocations.get(unit)
        if cached is not None:
            return cached
        if self.signals.removed_since(unit, seen):
            # Reading through `path` would load the unit again.
            raise NoSuchUnit(f"{unit}: removed since it was checked; not setting properties")
        action = f"read the invocation ID of {unit}"
        try:
            raw = await self._get_property(action, path, _UNIT, "InvocationID", "ay")
        except NoSuchUnit:
            raise NoSuchUnit(f"{unit}: gone since it was checked; not setting properties") from None
        if not raw:
            raise NoSuchUnit(f"{unit}: no invocation ID (not running); not setting properties")
        try:
            target = invocation_path(bytes(raw))
        except ValueError:
            raise SystemdError(f"{action}: systemd answered with an unexpected value {bytes(raw)!r}") from None
        if self.signals.removed_since(unit, seen):
            # The unit went away while we read: the ID read may be that of a new unit of that name
            # loaded by our read, or empty; either way not the run that was checked.
            raise NoSuchUnit(f"{unit}: removed while its invocation ID was read; not setting properties")
        if not self.signals.changed_since(unit, seen):
            # No signal for the unit since it was checked (one read during the Get would have
            # found nothing to drop): the ID is that run's until the next signal.
            self._invocations[unit] = target
        return target

    # ---- signals ----------------------------------------------------------------------

    async def subscribe(self, **handlers: Callback | None) -> None:
        """Subscribe to systemd's signals and deliver them to `handlers` (on_unit_new, on_unit_removed,
        on_job_removed, on_reloading, on_returned, on_overflow): SignalFeed.subscribe."""
        await self.signals.subscribe(**handlers)
