"""What systemd and the kernel hold for our units: the only reader of them, and its cache.

`Observer` keeps a cache of the MemoryMin/MemoryLow/MemoryHigh systemd holds for each of our units,
so a reconcile on a steady node costs no D-Bus call at all: the cache is filled by `refresh_all` (at
start, after a reconnect, a daemon-reload or a kubelet restart, and on the resync timer), kept
current by `read` (a round's reads: UnitNew, JobRemoved, the units about to be written) and `forget`
(UnitRemoved), and by what the writer reports it wrote (`learn`, from applier.ApplyResult: the
writer keeps no cache). `generation` counts the changes to the cache, so a round can tell that it
would see exactly what the last one saw. A round works from one `Snapshot`, frozen: what the cache
held after its read, and the states that read brought.

The resync timer may refresh only the levels whose units have fixed names
(`refresh_all(levels=...)`: node, QoS, reserved slices): it lists and reads those
units and the `extra` names only, by name, and every pod slice and container scope
keeps its cached values. A unit the cache lacks is then not looked for: UnitNew
brings new units in, UnitRemoved takes gone ones out, and the full re-read (every
few resyncs, and at every event that calls for it) catches whatever they missed.
A GetAll of systemd's cgroup interface answers ~72 properties, and every row of a
listing is decoded by dbus-next in pure Python: reading the 220 pod and container
units of a 110-pod node every minute, then listing them, was most of the daemon's
idle CPU (bench/idle_profile.py).

A reconcile round reads the state of every unit it refreshes or is about to
write in one ListUnitsByPatterns call, and the memory properties of new units
with one GetAll each, sent together; the writer then writes without checking each
unit's state again (`Snapshot.states`, see Systemd.set_memory_if_loaded). Under emulation
every D-Bus call costs 20-30 ms, so the number of calls is the latency of a
burst of new pods.

A pod slice that has just started need not be read over D-Bus at all (`adopt_new_pod_slices`,
`assume_started`): it is cached with the values its cgroup's memory files show, what systemd applied
as it started it (or as `UNREAD` if they cannot be read: the diff then sends all three values), and
the invocation ID on its cgroup (`Snapshot.runs`), to which its first write goes. One call per new
pod slice, as a bare `SetUnitProperties` per `UnitNew` would cost, instead of three.

Every unit read over D-Bus is held against the cache and its cgroup (drift.py): a write behind our
back is kept as a `Drift` record for the daemon to take (`take_drift`), never a callback.

Beside `held`, the cache keeps, per unit:
* `runs`: a unit cached as UNREAD (assume_started) -> the invocation ID of its run, for its first
  write; dropped once values are known (read or written) or the unit is forgotten.
* `unconfirmed`: cached with values read from its cgroup, not from systemd: read over D-Bus at the
  next refresh_all, which the kernel's agreeing cannot replace.
* `lost`: its cgroup showed less than systemd holds at our last read of both (written behind
  systemd's back) -> what it showed of those properties. The diff sets them again through systemd;
  our next write drops the unit.
* `left`: its cgroup showed other values than systemd holds, none of them lost -> what the cgroup is
  expected to show now (drift.left_alone). The kernel watch and a timer resync compare the cgroup
  with this, not with the cache: reporting it at every look cost PID 1 two GetAll a second for as
  long as it stayed. Our next write drops the unit, like `lost`.
* `writing`: a write of ours is out for it: its cgroup shows the new values before the cache does,
  so the kernel watch leaves it out until the write is learned (upper_values).
* `dropins`: what we wrote to units we may create (reserved slices, reconcile.MAY_CREATE): systemd
  keeps it as drop-ins while such a slice is not loaded, and unloads a slice nothing runs in soon
  after the write that loaded it. So there "not loaded" means "holds what we wrote", not "write it
  again": on systemd 252 a kube.slice that did not run was rewritten every 30 ms, each write loading
  it (UnitNew, a round) and each round finding it unloaded (seen in e2e 25).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Collection, Iterable, Mapping

from . import drift
from .cgroupfs import Cgroupfs
from .drift import Drift
from .kubelet_gate import Writes
from .naming import Naming
from .reconcile import DEFAULTS, UNREAD
from .systemd import SystemdError, UnitStatus

__all__ = ["Observer", "Snapshot", "Refreshed", "FIXED_LEVELS", "MAX_CALLS_IN_FLIGHT", "in_flight"]

# D-Bus calls sent at once (a round's reads, or the writes of one group of siblings): enough to
# keep systemd busy, few enough to stay far below the bus's limit on a connection's pending calls.
MAX_CALLS_IN_FLIGHT = 16
# The levels whose units have names known without listing them (refresh_all(levels=...)).
FIXED_LEVELS = frozenset({"node", "qos", "reserved"})
_EMPTY: Mapping = MappingProxyType({})


@dataclass(frozen=True, eq=False)
class Snapshot:
    """What systemd and the kernel held for our units when a round read them; never changes."""

    held: Mapping[str, Mapping[str, int] | None]  # unit -> what systemd holds (UNREAD: taken from its cgroup)
    lost: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # what cgroups show below systemd's values (drift.judge)
    runs: Mapping[str, bytes] = field(default_factory=dict)  # units taken from their cgroup -> the run their first write goes to
    states: Mapping[str, UnitStatus] = field(default_factory=dict)  # the states read for this round's writes (Systemd.unit_states)
    seen: int = 0  # the signal count when it was taken: a unit removed since is gone (Systemd.removed_since)
    generation: int = 0  # the cache's generation it was taken at


@dataclass(frozen=True)
class Refreshed:
    """What a `refresh_all` found: with a full re-read, every unit loaded."""

    loaded: frozenset[str] | None = None  # None: not a full re-read


async def in_flight(calls: list, *, return_exceptions: bool = False) -> list:
    """Await `calls` (coroutines not started yet), at most MAX_CALLS_IN_FLIGHT at a time; the
    results in their order."""
    gate = asyncio.Semaphore(MAX_CALLS_IN_FLIGHT)

    async def one(call):
        async with gate:
            return await call

    return await asyncio.gather(*(one(c) for c in calls), return_exceptions=return_exceptions)


class UnitReader:
    """The D-Bus reads of our units' states and memory properties, counted (`on_call`)."""

    def __init__(self, systemd, on_call: Callable[[str, str], None] | None,
                 max_units: Callable[[], Collection[str]]):
        self.systemd = systemd
        self._on_call = on_call or (lambda method, result: None)
        self.max_units = max_units  # whose MemoryMax is ours, read with the other three

    def count(self, method: str, result: str) -> None:
        self._on_call(method, result)

    async def states(self, list_call) -> dict[str, UnitStatus]:
        try:
            states = await list_call
        except SystemdError:
            self.count("ListUnitsByPatterns", "error")
            raise
        self.count("ListUnitsByPatterns", "ok")
        return states

    async def memory(self, states: dict[str, UnitStatus], names: Iterable[str]) -> dict[str, dict[str, int] | None]:
        """The memory properties of `names` (None: not loaded, or gone), read concurrently: one
        GetAll each (`in_flight`). Raises the first error, if any, after every read has ended."""
        names = sorted(names)
        with_max = self.max_units()
        results = await in_flight([self.systemd.read_memory(n, states[n], with_max=n in with_max) for n in names],
                                  return_exceptions=True)
        values: dict[str, dict[str, int] | None] = {}
        error = None
        for name, value in zip(names, results):
            if isinstance(value, BaseException):
                self.count("GetAll", "error")
                error = error or value
                continue
            if value is not None and self.systemd.removed_since(name, states[name].seen):
                # Its UnitRemoved was read while the reads were out, and the daemon has already
                # forgotten it: storing this value would bring a gone unit back into the cache
                # (a deleted pod then looked live to carry_over; seen in the VM, 85-churn).
                value = None
            self.count("GetAll", "ok" if value is not None else "no_such_unit")
            values[name] = value
        if error is not None:
            raise error
        return values


def named_units(naming: Naming, levels: Collection[str]) -> set[str]:
    """Our units of `levels` by name: only FIXED_LEVELS have names known without a listing."""
    if not set(levels) <= FIXED_LEVELS:
        raise ValueError(f"levels {sorted(levels)}: only {', '.join(sorted(FIXED_LEVELS))} units can be read by name")
    n = naming
    names = [*n.root_slices(), n.node_slice(), n.qos_slice("Burstable"), n.qos_slice("BestEffort"),
             *n.reserved_slices()]
    return {u for u in names if n.parse_unit(u).level in levels}


class PodStarts:
    """New pod slices a round takes without reading them over D-Bus (see `adopt`)."""

    def __init__(self, cgroupfs: Cgroupfs | None, naming: Callable[[], Naming]):
        self.cgroupfs = cgroupfs
        self._naming = naming
        # New pod slices neither read nor written until their start job has ended.
        self.awaiting: set[str] = set()

    def adopt(self, new: set[str], started: set[str],
              held: Mapping[str, object]) -> dict[str, tuple[bytes, dict | None] | None]:
        """The new pod slices this round takes without reading them over D-Bus.

        A pod slice just loaded (UnitNew) and not cached: if its cgroup carries the invocation ID
        systemd sets as it starts a slice (Cgroupfs.run_of), it is cached with the values the
        kernel holds for it (Cgroupfs.kernel_values: what systemd applied as it started it), or as
        UNREAD if they cannot be read, and its first write, of what differs (all three if UNREAD),
        is the only call it costs. One property instead of three is also less work for PID 1 (a
        drop-in and a cgroup write each) in the middle of a burst. Without an ID yet, its start
        job has not run: it is neither read nor written until that job's JobRemoved (`started`),
        then taken the same way, or read over D-Bus if its cgroup still has no ID (a systemd that
        sets none). Asking systemd for its state meanwhile cost a ListUnitsByPatterns per round,
        each pattern matched against every unit in PID 1: in a burst that slowed the burst itself
        (bench/vm_speed.py). Not while holding (the caller's choice): only raising values may be
        sent then, which needs the values held. Container scopes carry no such ID on systemd 252
        (tests/e2e 12-invocation-path X) and are read as before.
        Returns the slices taken: those with a run, each with its invocation ID and the values its
        cgroup shows (to cache, Observer.assume_started), and those awaiting their start (None)."""
        taken: dict[str, tuple[bytes, dict | None] | None] = {}
        if self.cgroupfs is None:
            return taken
        naming = self._naming()
        for name in new | (started & self.awaiting):
            ref = naming.parse_unit(name)
            if ref is None or ref.level != "pod" or held.get(name) is not None:
                continue
            self.awaiting.discard(name)
            invocation = self.cgroupfs.run_of(name)
            if invocation is not None:
                taken[name] = (invocation, self.cgroupfs.kernel_values(name))
            elif name not in started:
                self.awaiting.add(name)
                taken[name] = None
            # else: started, yet no ID on its cgroup: read over D-Bus as before
        return taken


class Observer:
    def __init__(self, systemd, naming: Naming | Callable[[], Naming], *, cgroupfs: Cgroupfs | None = None,
                 page_size: int = 4096, on_call: Callable[[str, str], None] | None = None,
                 max_units: Callable[[], Collection[str]] = frozenset,
                 kubelet: Callable[[], Writes] = Writes):
        self.systemd = systemd
        # The unit names of the config in force: fixed, or asked at each use (wiring.Wiring: the
        # daemon's change at a reload, and nobody assigns them here).
        self._naming = naming
        # What the kubelet writes as its own now (kubelet_gate.Writes, the companion mode's): it is
        # neither compared, nor watched, nor ours; asked at each read.
        self.kubelet = kubelet
        # The units whose MemoryMax is ours, read with the other three (a feature's: features.owned);
        # asked at each read. Nowhere else is MemoryMax read: a runtime's or the kubelet's is not ours.
        self.max_units = max_units
        self.held: dict[str, dict[str, int] | None] = {}  # unit -> what systemd holds (None: not loaded)
        self.generation = 0  # bumped at every change to `held` (or possible change)
        self.runs: dict[str, bytes] = {}  # units cached as UNREAD -> their run (see the module)
        # The node's cgroups (None: none read, for tests of the order alone): run IDs, what the kernel
        # shows (Cgroupfs.kernel_values, page-rounded by `page_size`).
        self.cgroupfs = cgroupfs
        self.page_size = page_size
        self.unconfirmed: set[str] = set()  # units cached from their cgroup alone (assume_started)
        self.reads = UnitReader(systemd, on_call, max_units)
        self.lost: dict[str, dict[str, int]] = {}  # unit -> what its cgroup lost (drift.judge)
        self.left: dict[str, dict[str, int]] = {}  # unit -> what its cgroup is expected to show (drift.left_alone)
        self.writing: frozenset[str] = frozenset()  # units a write of ours is out for (writes_out)
        self._live_uids: tuple[tuple, frozenset[str]] | None = None  # see live_pod_uids
        self._upper: tuple[Naming, tuple[str, ...]] | None = None  # see upper_values
        self._snapshot: Snapshot | None = None  # see snapshot
        self._found: list[Drift] = []  # see take_drift
        self.starts = PodStarts(cgroupfs, lambda: self.naming)  # new pod slices taken from their cgroup
        self.dropins: dict[str, dict[str, int]] = {}  # what we wrote to units we may create (see the module)

    # ------------------------------------------------------------ the snapshot

    @property
    def naming(self) -> Naming:
        return self._naming() if callable(self._naming) else self._naming
    def snapshot(self, states: Mapping[str, UnitStatus] = _EMPTY) -> Snapshot:
        """The cache as it is now, frozen (the same object while it does not change and no states
        come with it)."""
        if not states and self._snapshot is not None and self._snapshot.generation == self.generation:
            return self._snapshot
        snap = Snapshot(MappingProxyType(dict(self.held)), MappingProxyType(dict(self.lost)),
                        MappingProxyType(dict(self.runs)), MappingProxyType(dict(states)),
                        self.systemd.signal_count, self.generation)
        if not states:
            self._snapshot = snap
        return snap

    def take_drift(self) -> tuple[Drift, ...]:
        """The writes behind our back the reads found since the last call (drift.judge), oldest first."""
        found, self._found = tuple(self._found), []
        return found

    def writes_out(self, units: Iterable[str]) -> None:
        """A write of ours is about to go out to `units` (or none: `()`): the kernel watch leaves them out."""
        self.writing = frozenset(units)

    # ------------------------------------------------------------ reads over D-Bus
    def _judge(self, name: str, value: dict[str, int] | None,
               kernel: dict[str, int] | None = None) -> tuple[Drift | None, dict[str, int] | None]:
        """A read of `name` held against the cache and its cgroup (drift.judge)."""
        if value is None:
            return None, None
        record, lost = drift.judge(name, value, self.held.get(name), kernel, mine=self.ours(name, value),
                           confirmed=name not in self.unconfirmed, page_size=self.page_size)
        if record is not None:
            self._found.append(record)
        return record, lost

    async def refresh_all(self, extra: Iterable[str] = (), *, levels: Collection[str] | None = None,
                          trust_kernel: bool = False) -> Refreshed:
        """Re-read every unit of ours that systemd has loaded, plus `extra` names.

        One ListUnitsByPatterns for the states of all our units (a second one for `extra` names
        it did not match), then one GetAll per loaded unit.

        With `levels` (some of FIXED_LEVELS), only the units of those levels and the `extra`
        names are listed, by name in one ListUnitsByPatterns, and read; every other unit of ours
        keeps its cached values (UNREAD included). A unit the cache lacks is not found this way:
        only UnitNew or a full re-read brings it in. A listed unit no longer loaded, and a unit
        of `levels` no longer in memory, leave the cache either way.

        With `trust_kernel` (the resync timer's), a running unit whose cgroup's memory.min/low/high
        show the values cached for it (`kernel_values`; page-rounded as the kernel stores them)
        keeps them without a GetAll: a value changed through systemd (`systemctl set-property`, the
        kubelet rewriting its QoS slices) reaches the kernel at once, so it shows there. Decoding
        ~72 properties a unit in Python made the full re-read of 225 units ~180-280 ms, the largest
        idle cost after the pod poll (bench/idle_profile.py). Not for re-reads after daemon-reload,
        systemd's return or lost signals: then systemd's own state is read, unit by unit.
        Every unit read over D-Bus is held against the cache and its cgroup, read just before the
        GetAll (drift.judge): the writes behind our back are kept for `take_drift`.
        """
        extra = set(extra)
        states = await self._listed(extra, levels)
        fresh: dict[str, dict[str, int] | None] = dict.fromkeys(extra - set(states))
        ours = self.max_units()  # whose MemoryMax is ours, and so compared too
        shown = {n: self.cgroupfs.kernel_values(n, with_max=n in ours) for n, s in states.items()
                 if s.running} if self.cgroupfs is not None else {}
        read = [n for n in states if not (trust_kernel and self._kernel_agrees(n, shown.get(n)))]
        values = await self.reads.memory(states, read)
        lost, left = {}, {}
        for name, value in values.items():
            _, lost_here = self._judge(name, value, shown.get(name))
            if lost_here:
                lost[name] = lost_here
            elif value is not None:
                expected = drift.left_alone(value, shown.get(name), self.ours(name, value), self.page_size)
                if expected is not None:
                    left[name] = expected
        fresh.update(values)
        self._take(fresh, states, set(read), levels, lost, left)
        loaded = frozenset(n for n, v in self.held.items() if v is not None) if levels is None else None
        return Refreshed(loaded)

    async def _listed(self, extra: set[str], levels: Collection[str] | None) -> dict[str, UnitStatus]:
        """The states of the units `refresh_all` reads: every unit of ours (or those of `levels`) and `extra`."""
        if levels is not None:
            # By name: listing the pod slices and container scopes too (~225 rows on a 110-pod
            # node, each decoded in Python) cost ~1 CPU s an hour, for units whose coming and
            # going UnitNew and UnitRemoved already tell.
            return await self.reads.states(self.systemd.unit_states(named_units(self.naming, levels) | extra))
        listed = await self.reads.states(self.systemd.list_unit_states(self.naming.patterns()))
        states = {n: s for n, s in listed.items() if self.naming.parse_unit(n) is not None}
        if extra - set(states):
            states.update(await self.reads.states(self.systemd.unit_states(extra - set(states))))
        return states

    def _take(self, fresh: dict[str, dict[str, int] | None], states: dict[str, UnitStatus], read: set[str],
              levels: Collection[str] | None, lost: dict[str, dict[str, int]], left: dict[str, dict[str, int]]) -> None:
        """A re-read (`fresh`: what was read) into the cache."""
        # Kept as cached, taken after the reads: a UnitRemoved handled meanwhile has already taken
        # the unit out of the cache (forget), and must not be undone here. Kept: a listed unit
        # whose cgroup showed its cached values, and with `levels`, every unit of other levels.
        for n, value in self.held.items():
            if n in fresh:
                continue
            if n in states:
                if value is not None and not self.systemd.removed_since(n, states[n].seen):
                    fresh[n] = value
            elif levels is not None:
                ref = self.naming.parse_unit(n)
                if ref is not None and ref.level not in levels:
                    fresh[n] = value
        for name, values in self.dropins.items():
            if fresh.get(name) is None:
                fresh[name] = dict(values)  # not loaded: it holds what we wrote (see `dropins`)
        self.held = fresh
        # Lost: as just compared for a listed unit (none where its cgroup showed the cache); kept
        # for the units of other levels.
        self.lost = {n: v for n, v in self.lost.items() if n in fresh and n not in states}
        self.lost.update((n, v) for n, v in lost.items() if n in fresh)
        # Left: as just compared for a unit read; kept for one whose cgroup showed what was expected.
        self.left = {n: v for n, v in self.left.items() if n in fresh and n not in read and n not in left}
        self.left.update((n, v) for n, v in left.items() if n in fresh)
        self.runs = {n: r for n, r in self.runs.items() if n in fresh and n not in read}  # not re-read
        self.unconfirmed &= fresh.keys() - read
        self.generation += 1

    def _kernel_agrees(self, name: str, kernel: dict[str, int] | None) -> bool:
        """Whether `name`'s cgroup showed (`kernel`, Cgroupfs.kernel_values) the values cached for
        it, values of systemd's own (see refresh_all)."""
        held = self.held.get(name)
        if held is None or held is UNREAD:
            return False
        return drift.kernel_agrees(held, kernel, self.ours(name, self.left.get(name, held)),
                                   confirmed=name not in self.unconfirmed, page_size=self.page_size)

    def ours(self, name: str, values: Mapping[str, int]) -> Mapping[str, int]:
        """`values` without the properties the kubelet writes on `name` in companion mode."""
        writes = self.kubelet()
        if not writes:
            return values
        ref = self.naming.parse_unit(name)
        theirs = writes.of(name, ref.level) if ref is not None else frozenset()
        return {k: v for k, v in values.items() if k not in theirs} if theirs else values

    def upper_values(self) -> dict[str, Mapping[str, int]]:
        """What the node, QoS and reserved slices' cgroups are expected to show (the units whose
        cgroups the daemon watches, Cgroupfs.watch): what the cache holds, as read from or written
        to systemd, or what was left alone there (`left`)."""
        if self._upper is None or self._upper[0] is not self.naming:
            self._upper = (self.naming, tuple(sorted(named_units(self.naming, FIXED_LEVELS))))
        expected_of = {}
        for unit in self._upper[1]:
            values = self.held.get(unit)
            if (values is not None and values is not UNREAD and unit not in self.unconfirmed
                    and unit not in self.writing):
                expected = self.ours(unit, self.left.get(unit, values))
                if expected:
                    expected_of[unit] = expected
        return expected_of

    async def read(self, new: Iterable[str], recheck: Iterable[str] = ()) -> Snapshot:
        """Read what one reconcile round needs, in few calls however many units there are, and
        return the round's snapshot.

        `new` units (UnitNew) are read in full: state and memory properties. `recheck` units
        (JobRemoved, or about to be written) need their state only when their properties are
        cached: a start job does not change them. All states come from one ListUnitsByPatterns
        call and go into the snapshot (`states`), for this round's writes only; the properties
        come from one GetAll per unit, sent together.
        """
        new = set(new)
        names = new | set(recheck)
        if not names:
            return self.snapshot()
        states = await self.reads.states(self.systemd.unit_states(names))
        for name in names - set(states):
            self.forget(name)  # not in memory
        values = await self.reads.memory(states, [n for n in states if n in new or n not in self.held])
        for name, value in values.items():
            if value is None:
                self.forget(name)  # not loaded, or gone since
                states.pop(name)
                continue
            self._judge(name, value)  # not compared with its cgroup here: the next watch or resync does
            self.held[name] = value
            self.lost.pop(name, None)
            self.left.pop(name, None)
            self.runs.pop(name, None)
            self.unconfirmed.discard(name)
        self.generation += 1
        return self.snapshot(states)

    def live_pod_uids(self) -> frozenset[str]:
        """UIDs of the pods whose slices systemd has loaded, as the cache holds them. Worked out
        again only when the cache has changed (every poll asks)."""
        key = (self.generation, self.naming)
        if self._live_uids is None or self._live_uids[0] != key:
            uids = set()
            for name, held in self.held.items():
                ref = self.naming.parse_unit(name)
                if held is not None and ref is not None and ref.level == "pod":
                    uids.add(ref.uid)
            self._live_uids = (key, frozenset(uids))
        return self._live_uids[1]

    # ------------------------------------------------------------ reads of the cgroups alone
    def adopt_new_pod_slices(self, new: set[str], started: set[str]) -> set[str]:
        """The new pod slices this round takes without reading them over D-Bus (PodStarts.adopt):
        those whose cgroup names their run are cached from it (`assume_started`)."""
        taken = self.starts.adopt(new, started, self.held)
        for name, run in taken.items():
            if run is not None:
                self.assume_started(name, *run)
        return set(taken)

    def assume_started(self, unit: str, invocation_id: bytes, values: dict[str, int] | None = None) -> None:
        """`unit` runs as the run `invocation_id` (found on its cgroup) and was not read over
        D-Bus: cache the `values` its cgroup shows, or UNREAD without them (the diff then sends all
        of the plan's values); its first write goes to that run."""
        self.held[unit] = dict(values) if values is not None else UNREAD
        self.runs[unit] = invocation_id
        self.unconfirmed.add(unit)
        self.generation += 1

    # ------------------------------------------------------------ what signals and writes tell
    def forget(self, unit: str) -> None:
        if self.runs.pop(unit, None) is not None or self.lost.pop(unit, None) is not None:
            self.generation += 1  # (what a snapshot holds)
        self.left.pop(unit, None)
        self.starts.awaiting.discard(unit)
        self.unconfirmed.discard(unit)
        if self.cgroupfs is not None:
            self.cgroupfs.forget(unit)
        if unit in self.dropins:
            if self.held.get(unit) != self.dropins[unit]:
                self.held[unit] = dict(self.dropins[unit])
                self.generation += 1
        elif unit in self.held:
            del self.held[unit]
            self.generation += 1

    def learn(self, result) -> None:
        """What a write reported (applier.ApplyResult: `written`, with the signal count at each
        write, and `vanished`), into the cache; the kernel watch takes the units back."""
        self.writing = frozenset()
        for change in result.vanished:
            self.forget(change.unit)
        for change, mark in result.written:
            held = dict(self.held.get(change.unit) or DEFAULTS)
            held.update(change.props)  # from UNREAD (empty): all three were sent
            if not change.must_exist:
                self.dropins[change.unit] = held
            # A UnitRemoved read while the write was out (and perhaps already handled: forgotten)
            # must not be undone by caching the unit again (seen: a deleted pod slice kept its
            # pod's protection).
            if self.systemd.removed_since(change.unit, mark) or (change.must_exist and change.unit not in self.held):
                self.forget(change.unit)
                continue
            self.held[change.unit] = dict(held)
            self.lost.pop(change.unit, None)  # systemd has written every memory file of the unit
            self.left.pop(change.unit, None)
            self.runs.pop(change.unit, None)
            self.generation += 1
