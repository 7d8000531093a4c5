"""Send changes to systemd in order: a writer with no cache.

`Applier.apply(changes, snapshot)` writes what the diff asked, against the round's snapshot
(observe.Snapshot): the states read for its writes, and the runs of the units taken from their
cgroup. It keeps nothing of what systemd holds: it returns records of what it sent (`written`, with
the signal count at each write), what had gone (`vanished`) and where it stopped, and the cache
(observe.Observer.learn) learns the written values from those.

A round reads the state of every unit it is about to write in one call (observe.Observer.read);
`apply` then writes without checking each unit's state again (`Snapshot.states`, see
Systemd.set_memory_if_loaded). Under emulation every D-Bus call costs 20-30 ms, so the number of
calls is the latency of a burst of new pods.

A slice of the kubepods tree is written to the run named by the invocation ID on
its cgroup (`Cgroupfs.run_of`), or the one its snapshot names (`Snapshot.runs`: taken from its
cgroup at its start), with no state check and no `Get` of the ID first; a stale ID is refused by
systemd like an ended run.

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

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from .cgroupfs import Cgroupfs
from .observe import Refreshed, Snapshot, in_flight
from .quantity import show_value
from .reconcile import UNREAD, Change
from .runtime_keep import RuntimeKeep
from .systemd import NoSuchUnit, SystemdError, describe_call

CONCURRENT_LEVELS = frozenset({"pod", "container"})


@dataclass
class ApplyResult:
    applied: list[Change] = field(default_factory=list)
    vanished: list[Change] = field(default_factory=list)  # pod/container units gone before we wrote
    failed: Change | None = None
    error: str | None = None
    skipped: int = 0  # changes not sent because an earlier one failed
    # What systemd took, each with the signal count when it was sent (none in a dry run): what
    # observe.Observer.learn puts in the cache, unless the unit was removed since.
    written: list[tuple[Change, int]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failed is None


class Applier:
    def __init__(self, systemd, *, cgroupfs: Cgroupfs | None = None,
                 on_call: Callable[[str, str], None] | None = None,
                 on_restore: Callable[[str, str | None], None] | None = None):
        self.systemd = systemd
        # The node's cgroups (None: none read, for tests of the order alone): a slice's invocation
        # ID on its cgroup (Cgroupfs.run_of), and the runtime's settings our writes must keep.
        self.cgroupfs = cgroupfs
        self._on_call = on_call or (lambda method, result: None)
        # The runtime's memory.swap.max and memory.oom.group, kept around our writes (runtime_keep.py);
        # on_restore(unit, None) after memory.oom.group was put back, (unit, why) when it could not be.
        self.keep = RuntimeKeep(cgroupfs, on_restore)

    def after_read(self, read: Refreshed) -> None:
        """After a re-read (observe.Observer.refresh_all): a full one forgets the runtime's settings
        of units no longer loaded, and puts memory.oom.group back where a daemon-reload reset it."""
        if read.loaded is not None:
            self.keep.after_full_read(read.loaded)

    async def apply(self, changes: list[Change], snapshot: Snapshot, *, dry_run: bool = False,
                    echo: Callable[[str], None] | None = None) -> ApplyResult:
        """Send `changes` in their order, a group of siblings at a time (`sibling_groups`): the
        writes of one group are in flight together, and a group starts only once the one before
        it has been answered. Stops after the group where a write failed (not one whose pod or
        container unit had gone): every group before it is applied, so no child is above its
        parent."""
        result = ApplyResult()
        if dry_run:
            for change in changes:
                if echo:
                    echo(describe_call(change.unit, self.keep.props_to_send(change), running_only=change.must_exist))
                result.applied.append(change)
            return result
        sent = 0
        for group in sibling_groups(changes):
            outcomes = await in_flight([self._one(c, snapshot) for c in group])
            self._took(group, outcomes, result)
            sent += len(group)
            if result.failed is not None:
                result.skipped = len(changes) - sent
                break
        return result

    async def _one(self, change: Change, snapshot: Snapshot) -> tuple[str, str | None, int]:
        """One write: ("applied" | "vanished" | "failed", the error, the signal count when sent)."""
        mark = self.systemd.signal_count
        if change.must_exist and self.systemd.removed_since(change.unit, snapshot.seen):
            # Removed since the snapshot (the diff writes the kubepods tree only for units in it):
            # its UnitRemoved has been handled. Nothing to send.
            return "vanished", None, mark
        try:
            if change.must_exist:
                props = self.keep.props_to_send(change)
                run = snapshot.runs.get(change.unit)
                if run is None and self.cgroupfs is not None:
                    run = self.cgroupfs.run_of(change.unit)
                try:
                    await self.systemd.set_memory_if_loaded(change.unit, props, status=snapshot.states.get(change.unit),
                                                            invocation_id=run)
                except NoSuchUnit:
                    if run is None or self.systemd.removed_since(change.unit, snapshot.seen):
                        raise  # (removed meanwhile: its UnitRemoved has been handled)
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

    def _took(self, group: list[Change], outcomes: list[tuple[str, str | None, int]], result: ApplyResult) -> None:
        """The answers to one group of writes, into `result`."""
        for change, (outcome, error, mark) in zip(group, outcomes):
            if outcome == "failed":
                self._on_call("SetUnitProperties", "error")
                if result.failed is None:
                    result.failed, result.error = change, error
            elif outcome == "vanished":
                self._on_call("SetUnitProperties", "no_such_unit")
                result.vanished.append(change)
            else:
                self._on_call("SetUnitProperties", "ok")
                result.applied.append(change)
                result.written.append((change, mark))


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

