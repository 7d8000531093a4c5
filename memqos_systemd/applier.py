"""Send changes to systemd in order, and remember what systemd holds.

`Applier` keeps a cache of the MemoryMin/MemoryLow/MemoryHigh systemd holds
for each of our units, so a reconcile on a steady node costs no D-Bus call at
all: the cache is filled by `refresh_all` (at start, after a reconnect, a
daemon-reload or a kubelet restart, and on the resync timer), kept current by
`refresh_units` (UnitNew, JobRemoved) and `forget` (UnitRemoved), and updated
after every successful write. `generation` counts the changes to the cache, so
the daemon can tell that a reconcile would see exactly what the last one saw.

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
with one GetAll each, sent together; `apply` then writes without checking each
unit's state again (`fresh`, see Systemd.set_memory_if_loaded). Under emulation
every D-Bus call costs 20-30 ms, so the number of calls is the latency of a
burst of new pods.

A slice of the kubepods tree is written to the run named by the invocation ID on
its cgroup (`Cgroupfs.run_of`), with no state check and no `Get` of the ID first; a stale
ID is refused by systemd like an ended run. A pod slice that has just started
need not be read over D-Bus at all (`assume_started`): it is cached with the
values its cgroup's memory files show, what systemd applied as it started it
(or as `UNREAD` if they cannot be read: the diff then sends all three values).
One call per new pod slice, as a bare `SetUnitProperties` per `UnitNew` would
cost, instead of three.

`apply` sends changes in the diff's order, the writes to sibling pod slices (or
sibling container scopes) together, and stops after the first group with a real
failure: the diff's order makes every prefix safe, and every subset of a group
of siblings too, so stopping leaves no child above its parent. A pod or
container unit that vanished under us is a normal race. A burst of new pods is
then as many round trips as the tree has levels, not one per unit.

What the runtime wrote to a unit's files alone and our write would make systemd undo (a
container's memory.swap.max and memory.oom.group) is kept by runtime_keep.py (`Applier.keep`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Callable, Collection, Iterable, Mapping

from .cgroupfs import Cgroupfs, kernel_shows
from .kubelet_gate import kubelet_owns
from .naming import Naming
from .reconcile import DEFAULTS, UNREAD, Change, kernel_lost
from .quantity import show_value
from .runtime_keep import RuntimeKeep
from .systemd import NoSuchUnit, SystemdError, UnitStatus, describe_call

# D-Bus calls sent at once (a round's reads, or the writes of one group of siblings): enough to
# keep systemd busy, few enough to stay far below the bus's limit on a connection's pending calls.
MAX_CALLS_IN_FLIGHT = 16
CONCURRENT_LEVELS = frozenset({"pod", "container"})
# The levels whose units have names known without listing them (refresh_all(levels=...)).
FIXED_LEVELS = frozenset({"node", "qos", "reserved"})


@dataclass
class ApplyResult:
    applied: list[Change] = field(default_factory=list)
    vanished: list[Change] = field(default_factory=list)  # pod/container units gone before we wrote
    failed: Change | None = None
    error: str | None = None
    skipped: int = 0  # changes not sent because an earlier one failed

    @property
    def ok(self) -> bool:
        return self.failed is None


class Applier:
    def __init__(self, systemd, naming: Naming, *, cgroupfs: Cgroupfs | None = None, page_size: int = 4096,
                 on_call: Callable[[str, str], None] | None = None,
                 on_restore: Callable[[str, str | None], None] | None = None,
                 on_foreign: Callable[[str, dict[str, int], dict[str, int], str], None] | None = None,
                 max_units: Callable[[], Collection[str]] = frozenset,
                 companion: Callable[[], bool] = lambda: False):
        self.systemd = systemd
        self.naming = naming
        # Whether we stand beside the kubelet's own Memory QoS (kubelet_gate.companion_mode): then
        # what it writes (kubelet_gate.KUBELET_OWNS) is neither compared, nor watched, nor ours.
        self.companion = companion
        # The units whose MemoryMax is ours, read with the other three (the BestEffort ceiling while
        # it is on, or a MemoryMax of ours is still to be taken back: ceiling_watch.py); asked at
        # each read. Nowhere else is MemoryMax read: a runtime's or the kubelet's is not ours.
        self.max_units = max_units
        self.observed: dict[str, dict[str, int] | None] = {}
        self.generation = 0  # bumped at every change to `observed` (or possible change)
        # States read by refresh_units for this round's apply, which clears them: a state is
        # trusted for the writes of the round it was read in only.
        self.fresh: dict[str, UnitStatus] = {}
        # Units cached as UNREAD (assume_started) -> the invocation ID of their run, for their
        # first write; dropped once values are known (read or written) or the unit is forgotten.
        self.runs: dict[str, bytes] = {}
        # The node's cgroups (None: none read, for tests of the order alone):
        # - a slice's invocation ID on its cgroup (Cgroupfs.run_of): a write of the kubepods tree
        #   goes straight to that run, with no state check or ID read first;
        # - what the kernel shows (Cgroupfs.kernel_values, page-rounded by `page_size`): a timer
        #   resync reads over D-Bus only the units whose cgroup differs from the cache
        #   (refresh_all(trust_kernel=True)), and a unit read is compared with it (`lost`);
        # - the runtime's settings our writes must keep (`keep`).
        self.cgroupfs = cgroupfs
        self.page_size = page_size
        # Units cached with values read from their cgroup (assume_started), not from systemd: read
        # over D-Bus at the next refresh_all, which the kernel's agreeing cannot replace.
        self.unconfirmed: set[str] = set()
        self._on_call = on_call or (lambda method, result: None)
        self._on_foreign = on_foreign or (lambda unit, before, now, writer: None)
        # Units whose cgroup showed less than systemd holds at our last read of both
        # (reconcile.kernel_lost: written behind systemd's back) -> what it showed of those
        # properties. The diff sets them again through systemd; our next write drops the unit.
        self.lost: dict[str, dict[str, int]] = {}
        # Units whose cgroup showed other values than systemd holds at our last read of both, none
        # of them lost (more MemoryMin or MemoryLow: a file write that raised it, a parent's
        # DefaultMemoryLow=; a MemoryMax written to the file) -> what the cgroup is expected to
        # show now: systemd's values with the kernel's in their place. Left alone, so the kernel
        # watch and a timer resync compare the cgroup with this (`expected`), not with the cache:
        # reporting it at every look cost PID 1 two GetAll a second for as long as it stayed. Our
        # next write drops the unit, like `lost`.
        self.left: dict[str, dict[str, int]] = {}
        # Units a write of ours is out for: their cgroup shows the new values before the cache
        # does, so the kernel watch leaves them out until the write is answered (upper_values).
        self.writing: set[str] = set()
        self._live_uids: tuple[tuple, frozenset[str]] | None = None  # see live_pod_uids
        self._upper: tuple[Naming, tuple[str, ...]] | None = None  # see upper_values
        # New pod slices neither read nor written until their start job has ended (adopt_new_pod_slices).
        self.awaiting_start: set[str] = set()
        # The runtime's memory.swap.max and memory.oom.group, kept around our writes (runtime_keep.py);
        # on_restore(unit, None) after memory.oom.group was put back, (unit, why) when it could not be.
        self.keep = RuntimeKeep(cgroupfs, on_restore)
        # What we wrote to units we may create (reserved slices, reconcile.MAY_CREATE): systemd keeps
        # it as drop-ins while such a slice is not loaded, and unloads a slice nothing runs in soon
        # after the write that loaded it. So there "not loaded" means "holds what we wrote", not
        # "write it again": on systemd 252 a kube.slice that did not run was rewritten every 30 ms,
        # each write loading it (UnitNew, a round) and each round finding it unloaded (e2e 25-ceiling).
        self.dropins: dict[str, dict[str, int]] = {}

    def _count(self, method: str, result: str) -> None:
        self._on_call(method, result)

    async def _states(self, list_call) -> dict[str, UnitStatus]:
        try:
            states = await list_call
        except SystemdError:
            self._count("ListUnitsByPatterns", "error")
            raise
        self._count("ListUnitsByPatterns", "ok")
        return states

    async def _read(self, states: dict[str, UnitStatus], names: Iterable[str]) -> dict[str, dict[str, int] | None]:
        """The memory properties of `names` (None: not loaded, or gone), read concurrently: one
        GetAll each (`_in_flight`). Raises the first error, if any, after every read has ended."""
        names = sorted(names)
        with_max = self.max_units()
        results = await _in_flight([self.systemd.read_memory(n, states[n], with_max=n in with_max) for n in names],
                                   return_exceptions=True)
        values: dict[str, dict[str, int] | None] = {}
        error = None
        for name, value in zip(names, results):
            if isinstance(value, BaseException):
                self._count("GetAll", "error")
                error = error or value
                continue
            if value is not None and self.systemd.removed_since(name, states[name].seen):
                # Its UnitRemoved was read while the reads were out, and the daemon has already
                # forgotten it: storing this value would bring a gone unit back into the cache
                # (a deleted pod then looked live to carry_over; seen in the VM, 85-churn).
                value = None
            self._count("GetAll", "ok" if value is not None else "no_such_unit")
            values[name] = value
        if error is not None:
            raise error
        return values

    async def refresh_all(self, extra: Iterable[str] = (), *, levels: Collection[str] | None = None,
                          trust_kernel: bool = False) -> None:
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
        Every unit read over D-Bus is then compared both ways (`_compare`, with its cgroup read
        just before the GetAll): systemd holding other values than the cache (a writer through
        systemd), or the cgroup showing less than systemd holds (a writer of the cgroup file:
        `lost`, which the next diff sets again).
        """
        extra = set(extra)
        if levels is None:
            listed = await self._states(self.systemd.list_unit_states(self.naming.patterns()))
            states = {n: s for n, s in listed.items() if self.naming.parse_unit(n) is not None}
            if extra - set(states):
                states.update(await self._states(self.systemd.unit_states(extra - set(states))))
        else:
            # By name: listing the pod slices and container scopes too (~225 rows on a 110-pod
            # node, each decoded in Python) cost ~1 CPU s an hour, for units whose coming and
            # going UnitNew and UnitRemoved already tell.
            states = await self._states(self.systemd.unit_states(self._named_units(levels) | extra))
        fresh: dict[str, dict[str, int] | None] = dict.fromkeys(extra - set(states))
        ours = self.max_units()  # whose MemoryMax is ours, and so compared too
        shown = {n: self.cgroupfs.kernel_values(n, with_max=n in ours) for n, s in states.items()
                 if s.running} if self.cgroupfs is not None else {}
        read = [n for n in states if not (trust_kernel and self._kernel_agrees(n, shown.get(n)))]
        values = await self._read(states, read)
        lost, left = {}, {}
        for name, value in values.items():
            found = self._compare(name, value, shown.get(name))
            if found:
                lost[name] = found
            elif (value is not None and shown.get(name) is not None
                  and not kernel_shows(shown[name], self.ours(name, value), self.page_size)):
                left[name] = {**value, **{p: v for p, v in shown[name].items() if p in value}}
        fresh.update(values)
        # Kept as cached, taken after the reads: a UnitRemoved handled meanwhile has already taken
        # the unit out of the cache (forget), and must not be undone here. Kept: a listed unit
        # whose cgroup showed its cached values, and with `levels`, every unit of other levels.
        for n, value in self.observed.items():
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
        self.observed = fresh
        read_set = set(read)
        # Lost: as just compared for a listed unit (none where its cgroup showed the cache); kept
        # for the units of other levels.
        self.lost = {n: v for n, v in self.lost.items() if n in fresh and n not in states}
        self.lost.update((n, v) for n, v in lost.items() if n in fresh)
        # Left: as just compared for a unit read; kept for one whose cgroup showed what was expected.
        self.left = {n: v for n, v in self.left.items() if n in fresh and n not in read_set and n not in left}
        self.left.update((n, v) for n, v in left.items() if n in fresh)
        self.runs = {n: r for n, r in self.runs.items() if n in fresh and n not in read_set}  # not re-read
        self.unconfirmed &= fresh.keys() - read_set
        self.generation += 1
        if levels is None:
            self.keep.after_full_read(n for n, v in fresh.items() if v is not None)

    def _compare(self, name: str, value: dict[str, int] | None,
                 kernel: dict[str, int] | None = None) -> dict[str, int] | None:
        """What a read of `name` over D-Bus (`value`) says of someone else's writes:
        * systemd holds other values than the cache had from our last read or write of it: someone
          wrote them through systemd (another agent, `systemctl set-property`, the kubelet's own
          Memory QoS): on_foreign(unit, before, now, "systemd");
        * else its cgroup, read just before (`kernel`), shows less than systemd holds
          (reconcile.kernel_lost): someone wrote the cgroup file around systemd (an agent such as
          koordlet, libcontainer's file write after its D-Bus call, a person):
          on_foreign(unit, held, what the kernel showed, "cgroupfs"), and what it lost is returned
          (for `lost`).
        Either way the next diff puts ours back. The first needs values of systemd's own in the
        cache: units cached from their cgroup alone (unconfirmed) or not read (UNREAD), or not
        cached (at start), are compared with their cgroup only."""
        if value is None:
            return None
        held = self.observed.get(name)
        mine = self.ours(name, value)
        if (held is not None and held is not UNREAD and name not in self.unconfirmed
                and any(mine[k] != held[k] for k in mine.keys() & held.keys())):
            # (Only what both hold: MemoryMax is read only while it is ours, Applier.max_units.)
            self._on_foreign(name, dict(held), dict(value), "systemd")
            return None
        lost = kernel_lost(mine, kernel, self.page_size) if kernel is not None else {}
        if lost:
            self._on_foreign(name, dict(value), {**value, **lost}, "cgroupfs")
        return lost or None

    def _kernel_agrees(self, name: str, kernel: dict[str, int] | None) -> bool:
        """Whether `name`'s cgroup showed (`kernel`, Cgroupfs.kernel_values) the values cached for
        it, values of systemd's own (see refresh_all)."""
        held = self.observed.get(name)
        return (kernel is not None and held is not None and held is not UNREAD and name not in self.unconfirmed
                and kernel_shows(kernel, self.ours(name, self.left.get(name, held)), self.page_size))

    def ours(self, name: str, values: Mapping[str, int]) -> Mapping[str, int]:
        """`values` without the properties the kubelet writes on `name` in companion mode."""
        if not self.companion():
            return values
        ref = self.naming.parse_unit(name)
        theirs = kubelet_owns(ref.level) if ref is not None else frozenset()
        return {k: v for k, v in values.items() if k not in theirs} if theirs else values

    def _named_units(self, levels: Collection[str]) -> set[str]:
        """Our units of `levels` by name: only FIXED_LEVELS have names known without a listing."""
        if not set(levels) <= FIXED_LEVELS:
            raise ValueError(f"levels {sorted(levels)}: only {', '.join(sorted(FIXED_LEVELS))} units can be read by name")
        n = self.naming
        names = [*n.root_slices(), n.node_slice(), n.qos_slice("Burstable"), n.qos_slice("BestEffort"),
                 *n.reserved_slices()]
        return {u for u in names if n.parse_unit(u).level in levels}

    def upper_values(self) -> dict[str, Mapping[str, int]]:
        """What the node, QoS and reserved slices' cgroups are expected to show (the units whose
        cgroups the daemon watches, Cgroupfs.watch): what the cache holds, as read from or written
        to systemd, or what was left alone there (`left`)."""
        if self._upper is None or self._upper[0] is not self.naming:
            self._upper = (self.naming, tuple(sorted(self._named_units(FIXED_LEVELS))))
        held = {}
        for unit in self._upper[1]:
            values = self.observed.get(unit)
            if (values is not None and values is not UNREAD and unit not in self.unconfirmed
                    and unit not in self.writing):
                expected = self.ours(unit, self.left.get(unit, values))
                if expected:
                    held[unit] = expected
        return held

    async def refresh_units(self, new: Iterable[str], recheck: Iterable[str] = ()) -> None:
        """Read what one reconcile round needs, in few calls however many units there are.

        `new` units (UnitNew) are read in full: state and memory properties. `recheck` units
        (JobRemoved, or about to be written) need their state only when their properties are
        cached: a start job does not change them. All states come from one ListUnitsByPatterns
        call and are kept in `fresh` for this round's apply; the properties come from one GetAll
        per unit, sent together.
        """
        new = set(new)
        names = new | set(recheck)
        self.fresh = {}
        if not names:
            return
        states = await self._states(self.systemd.unit_states(names))
        for name in names - set(states):
            self.forget(name)  # not in memory
        values = await self._read(states, [n for n in states if n in new or n not in self.observed])
        for name, value in values.items():
            if value is None:
                self.forget(name)  # not loaded, or gone since
                states.pop(name)
            else:
                self._compare(name, value)
                self.observed[name] = value
                self.lost.pop(name, None)  # not compared with its cgroup here: the next watch or resync does
                self.left.pop(name, None)
                self.runs.pop(name, None)
                self.unconfirmed.discard(name)
        self.generation += 1
        self.fresh = states

    def live_pod_uids(self) -> frozenset[str]:
        """UIDs of the pods whose slices systemd has loaded, as the cache holds them. Worked out
        again only when the cache has changed (every poll asks)."""
        key = (self.generation, self.naming)
        if self._live_uids is None or self._live_uids[0] != key:
            uids = set()
            for name, held in self.observed.items():
                ref = self.naming.parse_unit(name)
                if held is not None and ref is not None and ref.level == "pod":
                    uids.add(ref.uid)
            self._live_uids = (key, frozenset(uids))
        return self._live_uids[1]

    def adopt_new_pod_slices(self, new: set[str], started: set[str]) -> set[str]:
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
        (tests/e2e 12-invocation-path X) and are read as before."""
        if self.cgroupfs is None:
            return set()
        taken = set()
        for name in new | (started & self.awaiting_start):
            ref = self.naming.parse_unit(name)
            if ref is None or ref.level != "pod" or self.observed.get(name) is not None:
                continue
            self.awaiting_start.discard(name)
            invocation = self.cgroupfs.run_of(name)
            if invocation is not None:
                self.assume_started(name, invocation, self.cgroupfs.kernel_values(name))
                taken.add(name)
            elif name not in started:
                self.awaiting_start.add(name)
                taken.add(name)
            # else: started, yet no ID on its cgroup: read over D-Bus as before
        return taken

    def assume_started(self, unit: str, invocation_id: bytes, values: dict[str, int] | None = None) -> None:
        """`unit` runs as the run `invocation_id` (found on its cgroup) and was not read over
        D-Bus: cache the `values` its cgroup shows, or UNREAD without them (the diff then sends all
        of the plan's values); its first write goes to that run."""
        self.observed[unit] = dict(values) if values is not None else UNREAD
        self.runs[unit] = invocation_id
        self.unconfirmed.add(unit)
        self.generation += 1

    def forget(self, unit: str) -> None:
        self.runs.pop(unit, None)
        self.lost.pop(unit, None)
        self.left.pop(unit, None)
        self.awaiting_start.discard(unit)
        self.unconfirmed.discard(unit)
        if self.cgroupfs is not None:
            self.cgroupfs.forget(unit)
        if unit in self.dropins:
            if self.observed.get(unit) != self.dropins[unit]:
                self.observed[unit] = dict(self.dropins[unit])
                self.generation += 1
        elif unit in self.observed:
            del self.observed[unit]
            self.generation += 1

    async def apply(self, changes: list[Change], *, dry_run: bool = False,
                    echo: Callable[[str], None] | None = None) -> ApplyResult:
        """Send `changes` in their order, a group of siblings at a time (`sibling_groups`): the
        writes of one group are in flight together, and a group starts only once the one before
        it has been answered. Stops after the group where a write failed (not one whose pod or
        container unit had gone): every group before it is applied, so no child is above its
        parent."""
        result = ApplyResult()
        fresh, self.fresh = self.fresh, {}  # good for this round only
        if dry_run:
            for change in changes:
                if echo:
                    echo(describe_call(change.unit, self.keep.props_to_send(change), running_only=change.must_exist))
                result.applied.append(change)
            return result

        async def one(change: Change) -> tuple[str, str | None, int]:
            mark = self.systemd.signal_count
            if change.must_exist and change.unit not in self.observed:
                # Forgotten since the diff (which writes the kubepods tree only for units in the
                # cache): its UnitRemoved has been handled. Nothing to send.
                return "vanished", None, mark
            try:
                if change.must_exist:
                    props = self.keep.props_to_send(change)
                    run = self.runs.get(change.unit)
                    if run is None and self.cgroupfs is not None:
                        run = self.cgroupfs.run_of(change.unit)
                    try:
                        await self.systemd.set_memory_if_loaded(change.unit, props,
                                                                status=fresh.get(change.unit), invocation_id=run)
                    except NoSuchUnit:
                        if run is None or change.unit not in self.observed:
                            raise  # (forgotten meanwhile: its UnitRemoved has been handled)
                        # The ID on the cgroup named a run that has ended: the unit has gone, or its
                        # cgroup still carries an older run's ID. Ask systemd (state, then its ID).
                        await self.systemd.set_memory_if_loaded(change.unit, props)
                    self.keep.after_write(change.unit)
                else:
                    await self.systemd.set_memory(change.unit, dict(change.props))
            except NoSuchUnit as e:
                return ("vanished", None, mark) if change.must_exist else ("failed", str(e), mark)
            except SystemdError as e:
                return "failed", str(e), mark
            return "applied", None, mark

        sent = 0
        for group in sibling_groups(changes):
            self.writing.update(c.unit for c in group)
            try:
                outcomes = await _in_flight([one(c) for c in group])
                self._took(group, outcomes, result)
            finally:
                self.writing.difference_update(c.unit for c in group)
            sent += len(group)
            if result.failed is not None:
                result.skipped = len(changes) - sent
                break
        return result

    def _took(self, group: list[Change], outcomes: list[tuple[str, str | None, int]], result: ApplyResult) -> None:
        """The answers to one group of writes, into `result` and the cache."""
        for change, (outcome, error, mark) in zip(group, outcomes):
            if outcome == "failed":
                self._count("SetUnitProperties", "error")
                if result.failed is None:
                    result.failed, result.error = change, error
                continue
            if outcome == "vanished":
                self._count("SetUnitProperties", "no_such_unit")
                self.forget(change.unit)
                result.vanished.append(change)
                continue
            self._count("SetUnitProperties", "ok")
            result.applied.append(change)
            # Asked now, once the whole group is answered: a UnitRemoved read while any write
            # of the group was out (and perhaps already handled: forgotten) must not be undone
            # by caching the unit again (seen: a deleted pod slice kept its pod's protection).
            held = dict(self.observed.get(change.unit) or DEFAULTS)
            held.update(change.props)  # from UNREAD (empty): all three were sent
            if not change.must_exist:
                self.dropins[change.unit] = held
            if self.systemd.removed_since(change.unit, mark) or (change.must_exist and change.unit not in self.observed):
                self.forget(change.unit)
                continue
            self.observed[change.unit] = dict(held)
            self.lost.pop(change.unit, None)  # systemd has written every memory file of the unit
            self.left.pop(change.unit, None)
            self.runs.pop(change.unit, None)
            self.generation += 1


async def _in_flight(calls: list, *, return_exceptions: bool = False) -> list:
    """Await `calls` (coroutines not started yet), at most MAX_CALLS_IN_FLIGHT at a time; the
    results in their order."""
    gate = asyncio.Semaphore(MAX_CALLS_IN_FLIGHT)

    async def one(call):
        async with gate:
            return await call

    return await asyncio.gather(*(one(c) for c in calls), return_exceptions=return_exceptions)


def sibling_groups(changes: list[Change]) -> list[list[Change]]:
    """`changes` cut into runs that may be written together: consecutive pod-level changes, or
    consecutive container-level ones, in the same direction. Pod slices are never each other's
    parents, nor are container scopes, so the diff's parent-before-child order (children first
    when shrinking) holds between runs whatever order systemd answers within one. Every other
    change (node, QoS, reserved) is a run of its own: the node level can have a parent of its
    own level above kubepods.slice."""
    groups: list[list[Change]] = []
    for change in changes:
        last = groups[-1][-1] if groups else None
        if (last is not None and change.level in CONCURRENT_LEVELS and last.level == change.level
                and last.direction == change.direction):
            groups[-1].append(change)
        else:
            groups.append([change])
    return groups


def name_changes(changes: Iterable[Change], was: dict[str, dict[str, int] | None], limit: int = 4) -> str:
    """The first `limit` changes as "unit Property old -> new" (old: what the cache held before the
    write, from `was`; "?" when unread), then how many more: which unit a round wrote, and from
    what, is the first thing an operator asks when a "reconcile:" line appears on a quiet node."""
    changes = list(changes)
    parts = []
    for change in changes[:limit]:
        held = was.get(change.unit)
        props = " ".join(f"{name} {_value(held, name)} -> {_value(change.props, name)}" for name in change.props)
        parts.append(f"{change.unit} {props}")
    if len(changes) > limit:
        parts.append(f"and {len(changes) - limit} more")
    return ", ".join(parts)


def _value(values: Mapping[str, int] | None, name: str) -> str:
    if values is None or values is UNREAD or name not in values:
        return "?"
    return show_value(values[name])


def summarize(result: ApplyResult, named: str = "") -> str:
    """One line: what was applied (`named`, from name_changes, in brackets after it), what had
    gone, where it stopped."""
    parts = [f"{len(result.applied)} change(s) applied" + (f" ({named})" if named else "")]
    if result.vanished:
        parts.append(f"{len(result.vanished)} unit(s) gone before the write")
    if result.failed is not None:
        parts.append(f"stopped at {result.failed.unit}: {result.error}; {result.skipped} change(s) not sent")
    return ", ".join(parts)

