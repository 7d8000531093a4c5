"""The service: wire sources, node facts, the planner, the diff and systemd together.

Events only say "look again"; every reconcile is the same pipeline:
snapshot (last good pods) + node facts + config -> plan -> diff against what
systemd holds (the Applier's cache) -> apply in a safe order.

Promises kept here:
* Protections are never lowered because the pod source failed: the last good
  snapshot is kept, and until a first good one exists (or while a sudden drop
  to zero pods is unconfirmed) only changes that raise values are sent.
* A pod the pod source stops listing keeps its protection while its pod slice runs
  (intake.carry_over), also just after the daemon itself restarted: the pods of the last
  run's snapshot are kept in a runtime file (last_pods.py) for the first one.
* An invalid config on SIGHUP is logged and the old one stays in force.
* A lost bus is reconnected with backoff, then everything is re-read and re-applied.
* SIGTERM exits without touching any unit: protections stay in place.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .applier import Applier, name_changes, summarize
from .cgroupfs import Cgroupfs
from . import ledger
from .config import Config, ConfigError, load_config
from .cgroupfs import read_events_file
from .naming import Naming, NamingError
from .metrics import NoMetrics
from .notify import Notifier, watchdog_interval
from .plan import NodeFacts, Plan, PlanError, plan
from .reconcile import DEFAULTS, UNREAD, Change, diff, grow_only, one_write_per_container
from .intake import PodIntake
from .systemd import SystemdError

log = logging.getLogger("memqos_systemd")

KUBELET_UNIT = "kubelet.service"
BACKOFF_MAX = 30.0
# How long a new unit the pod source does not know yet makes us poll it fast
# (a container scope exists a moment before the kubelet reports its ID; init
# container scopes are never planned at all).
UNKNOWN_UNIT_PATIENCE = 10.0
# Meanwhile the pod source is asked again after 0.1 s, then 0.2, 0.4, ... up to the poll interval;
# a new unknown unit starts that over. A fetch serves every unit announced before it started, so
# in a burst of new pods the source is asked at most once every FAST_POLL_FIRST seconds.
FAST_POLL_FIRST = 0.1
# After a daemon-reload or re-exec, how long systemd is left to settle before we read again.
SYSTEMD_SETTLE = 1.0
# After kubelet.service starts, its /pods may not answer for a while (it is still starting):
# for this long, a failed fetch is tried again every KUBELET_START_RETRY seconds instead of
# waiting for the next poll.
KUBELET_START_PATIENCE = 30.0
KUBELET_START_RETRY = 0.25
# How often memory.events of the containers is read for the throttling metric.
THROTTLE_READ_INTERVAL = 15.0
# The resync timer re-reads the node, QoS and reserved slices (listed by name) every
# resyncInterval, and every unit, pod slices and container scopes included, every
# FULL_RESYNC_EVERY-th time (and at every event that calls for it: start, reconnect,
# daemon-reload, config reload, signal overflow). In between, a unit the cache lacks is found
# only by its UnitNew. The values of our units change only through our writes, a reload (which
# reads all) or a third party; listing and reading the ~220 pod and container units of a 110-pod
# node every minute was most of the daemon's idle CPU (docs/BENCHMARKS.md), and every 10th time
# it was still the largest part after the kubelet poll (1.1 of 3.8 CPU s an hour, natively): at
# the default interval a third party's change to a pod slice or scope is put right within 15 min.
# Of the units a timer resync lists, only those whose cgroup does not show the cached values are
# read over D-Bus (Applier.refresh_all(trust_kernel=True)).
FULL_RESYNC_EVERY = 15
LIGHT_RESYNC_LEVELS = frozenset({"node", "qos", "reserved"})


@dataclass
class Outside:
    """The outside things the daemon uses, injectable for tests."""

    connect: Callable[..., Any]  # async (address) -> systemd adapter
    make_source: Callable[[Config], Any]
    read_capacity: Callable[[], int]
    page_size: int
    metrics: Any = field(default_factory=NoMetrics)  # memqos_systemd.metrics.Metrics, or NoMetrics
    notifier: Notifier | None = None
    memory_watcher: Any = None  # object with fileno() and poll_events(), or None
    bus_address: str | None = None
    cgroupfs: Cgroupfs = field(default_factory=Cgroupfs)  # the cgroup2 mount (cgroupfs.py)
    ledger_path: Path | None = None  # reserved slices written (ledger.py); None: not kept
    # The last snapshot's pods, for the first carry_over after a restart (last_pods.py); None: not kept.
    last_pods_path: Path | None = None
    clock: Callable[[], float] = time.monotonic


class Daemon:
    def __init__(self, config_path: str | None, config: Config, outside: Outside):
        self.config_path = config_path
        self.config = config
        self.out = outside
        self.naming = Naming.for_config(config)
        self.source = outside.make_source(config)
        self.notifier = outside.notifier or Notifier()
        self.systemd = None
        self.applier: Applier | None = None
        self.intake = PodIntake(outside.last_pods_path)  # the pods to act on, and whether we hold
        self.capacity = outside.read_capacity()
        self.last_plan: Plan | None = None
        self._planned: tuple[tuple, Plan, dict] | None = None  # (inputs, plan, by unit): see _plan
        self._shown_plan: Plan | None = None  # the plan the metrics show
        self.ready = False
        self.stopping = False
        self._wake = asyncio.Event()
        self._want_fetch = True
        self._want_full_refresh = True
        self._want_light_refresh = False  # the node, QoS and reserved slices (a kubelet start)
        # The resync timer's: those slices, or every unit every FULL_RESYNC_EVERY-th time.
        self._want_timer_light = self._want_timer_refresh = False
        self._light_resyncs = 0  # timer resyncs since the last full refresh
        # What the last reconcile that had nothing to send was computed from (see _settled_key).
        self._settled: tuple | None = None
        # The cgroup directories of a plan's container scopes, and their memory.events files:
        # (plan, {unit: dir}, [(unit, memory.events path)]); see _container_dirs.
        self._want_reload = False
        self._refresh_units: set[str] = set()  # UnitNew: read state and properties
        self._recheck_units: set[str] = set()  # JobRemoved: read the state again
        # New pod slices neither read nor written until their start job has ended (_take_new_runs).
        self._awaiting_start: set[str] = set()
        # New pod/container units the pod source has not described yet -> when we stop asking.
        self._unknown_units: dict[str, float] = {}
        self._unknown_new = False  # one came since the last fetch started
        self._fetch_started = float("-inf")
        self._fetch_failing = False
        self._kubelet_started = float("-inf")  # clock() at the last kubelet.service start
        self._next_poll = 0.0
        self._next_resync = 0.0
        self._fast_poll = FAST_POLL_FIRST
        self._disconnected = False
        self._quiet_until = 0.0  # no reads or writes before this (systemd reloading)
        self._stop_event = asyncio.Event()
        self._warned: dict[str, set[str]] = {}
        # Reserved slices dropped from the config by a reload, still to be brought to the defaults.
        self._retired: set[str] = set()
        self._ledger: frozenset[str] | None = None  # as last written
        self._oom_group_noted = False  # the first memory.oom.group put back has been logged

    # ------------------------------------------------------------ events
    def wake(self) -> None:
        self._wake.set()

    def _on_unit_new(self, name: str) -> None:
        ref = self.naming.parse_unit(name)
        if ref is None:
            return
        self._refresh_units.add(name)
        if ref.level in ("pod", "container") and self.last_plan is not None and name not in self._planned_units():
            # The kubelet has not told us about it yet: ask now, and again soon (_fast_poll_at).
            self._unknown_units[name] = self.out.clock() + UNKNOWN_UNIT_PATIENCE
            self._unknown_new = True
        self.wake()

    def _on_unit_removed(self, name: str) -> None:
        ref = self.naming.parse_unit(name)
        if self.applier is not None and ref is not None:
            self.applier.forget(name)
            self._unknown_units.pop(name, None)
            self._refresh_units.discard(name)
            self._recheck_units.discard(name)
            self._awaiting_start.discard(name)
            if ref.level == "pod":
                self._want_fetch = True  # a pod kept only because its slice ran can go now
                self.wake()

    def _on_job_removed(self, unit: str, result: str) -> None:
        if result == "done" and self.naming.parse_unit(unit) is not None:
            # UnitNew comes when a unit is loaded, before its start job has run; a pod or
            # container unit is only written once it is running, so look again now (its state:
            # a start job does not change its properties, read at UnitNew).
            self._recheck_units.add(unit)
            self.wake()
            return
        if unit == KUBELET_UNIT and result == "done":
            # What a kubelet start may rewrite are the kubepods and QoS slices (docs/PACKAGING.md):
            # those are read again, as the resync timer does. Its pod slices and container scopes
            # come and go with UnitNew/UnitRemoved; re-reading them all here cost one GetAll per
            # unit in PID 1's queue at the moment a node's pods start (issue 6, convergence), and
            # drift on them is still found by the full re-read every FULL_RESYNC_EVERY resyncs.
            log.info("kubelet.service (re)started: re-reading the kubepods and QoS slices, and the pods")
            self._kubelet_started = self.out.clock()
            self._want_light_refresh = True
            self._want_fetch = True
            self.wake()

    def _on_reloading(self, active: bool) -> None:
        if active:
            # Mid-reload, units read back half-loaded (defaults, or not loaded at all): neither
            # read nor write until systemd says it is done, and a moment after.
            self._quiet_until = float("inf")
            return
        log.info("systemd finished reloading: re-reading units")
        self._after_systemd_change()

    def _on_systemd_returned(self) -> None:
        log.info("systemd is back on the bus (re-executed?): re-reading units")
        self._after_systemd_change()

    def _keep_ledger(self) -> None:
        """Remember the reserved slices of the config and those not reset yet (ledger.py)."""
        if self.out.ledger_path is None:
            return
        names = frozenset(self.naming.reserved_slices()) | frozenset(self._retired)
        if names != self._ledger and ledger.write(self.out.ledger_path, names):
            self._ledger = names

    def _on_signal_overflow(self) -> None:
        log.warning("systemd sent unit signals faster than they could be handled; some were dropped:"
                    " re-reading every unit and the pods")
        self.out.metrics.signal_overflow()
        self._want_full_refresh = True
        self._want_fetch = True
        self.wake()

    def _cache_in_doubt(self) -> bool:
        """Whether the cache may lack units systemd holds until the next full re-read: systemd is
        reloading or has just come back (a daemon-reload announces every unit removed, then new;
        a daemon-reexec only removed: 11-systemd-facts D; the cache forgets each), or signals
        were dropped. Asked by a step that awaited (the pods, reads) after its own re-read: what
        it took from the cache meanwhile (a pod list's carry_over, a diff) waits for the next."""
        return self.out.clock() < self._quiet_until or self._want_full_refresh

    def _after_systemd_change(self) -> None:
        self._quiet_until = self.out.clock() + SYSTEMD_SETTLE
        self._want_full_refresh = True
        self.wake()

    def _on_disconnect(self) -> None:
        self._disconnected = True
        self.wake()

    def request_reload(self) -> None:
        self._want_reload = True
        self.wake()

    def stop(self) -> None:
        self.stopping = True
        self._stop_event.set()
        self.wake()

    async def _backoff(self, seconds: float) -> None:
        """Wait after a failure. Unit and job signals do not cut it short (seen in the VM: a
        stopped kubepods.slice and a stream of UnitNew made 157 failed calls in 3 s); only a stop
        or a config reload does."""
        deadline = self.out.clock() + seconds
        while not self.stopping and not self._want_reload and self.out.clock() < deadline:
            try:
                await asyncio.wait_for(self._stop_event.wait(), timeout=min(0.25, deadline - self.out.clock()))
            except asyncio.TimeoutError:
                pass

    def _warn_once(self, kind: str, warnings) -> None:
        """Log each warning (a rejected pod, a capped slice) once while it lasts, not every poll.

        What no longer applies is forgotten, so it is logged again if it comes back."""
        seen = self._warned.get(kind, set())
        for w in warnings:
            if w not in seen:
                log.warning("%s", w)
        self._warned[kind] = set(warnings)

    # ------------------------------------------------------------ steps
    async def _connect(self) -> None:
        self.systemd = await self.out.connect(self.out.bus_address)
        self.systemd.on_disconnect(self._on_disconnect)
        await self.systemd.subscribe(on_unit_new=self._on_unit_new, on_unit_removed=self._on_unit_removed,
                                     on_job_removed=self._on_job_removed, on_reloading=self._on_reloading,
                                     on_returned=self._on_systemd_returned, on_overflow=self._on_signal_overflow)
        self._disconnected = False
        self.applier = Applier(self.systemd, self.naming, cgroupfs=self.out.cgroupfs, page_size=self.out.page_size,
                               on_call=self.out.metrics.dbus_call, on_restore=self._on_oom_group_restored)
        self._want_full_refresh = True

    def _reload_config(self) -> None:
        self._want_reload = False
        self.notifier.send("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")
        try:
            config = load_config(self.config_path, required=self.config_path is not None)
            naming = Naming.for_config(config)
        except (ConfigError, NamingError) as e:
            log.error("reload refused, keeping the previous config: %s", e)
            self.out.metrics.config_reload(False)
            self.notifier.send("READY=1")
            return
        source_changed = (config.pods_file, config.kubelet) != (self.config.pods_file, self.config.kubelet)
        dropped = set(self.naming.reserved_slices()) - set(naming.reserved_slices())
        for name in sorted(dropped):
            log.info("%s is no longer a reserved cgroup in the config: bringing it back to"
                     " MemoryMin=0 MemoryLow=0 MemoryHigh=infinity", name)
        self._retired = (self._retired | dropped) - set(naming.reserved_slices())
        self.config, self.naming = config, naming
        if self.applier is not None:
            self.applier.naming = naming
        if source_changed:
            self.source = self.out.make_source(config)
            self._want_fetch = True
        # A shorter resyncInterval counts from now: the deadline set with the old one could be
        # up to that interval away (60 s by default; measured in the VM, 32-resync-kernel).
        self._next_resync = min(self._next_resync, self.out.clock() + config.resync_interval)
        self._want_full_refresh = True
        log.info("config reloaded from %s: policy %s, hierarchy %s", self.config_path,
                 config.memory_reservation_policy, config.hierarchy)
        self.out.metrics.config_reload(True)
        self.notifier.send("READY=1")

    async def _fetch(self) -> None:
        self._want_fetch = False
        # This fetch serves every unit announced so far. Fast polls for unknown units back off
        # only while nothing new arrives: in a burst every pod brings new ones.
        self._fetch_started = self.out.clock()
        if self._unknown_new:
            self._fast_poll = FAST_POLL_FIRST
        elif self._unknown_units:
            self._fast_poll = min(self._fast_poll * 2, self.config.kubelet.poll_interval)
        self._unknown_new = False
        try:
            snap = await asyncio.to_thread(self.source.fetch)
        except Exception as e:  # SourceError, and anything a broken source raises
            self.out.metrics.source_error(getattr(e, "kind", type(e).__name__))
            if not self._fetch_failing:
                kept = f"holding the last good snapshot ({len(self.intake.pods)} pods)" if self.intake.snapshot \
                    else "no snapshot yet: only raising values"
                log.warning("pod source failed: %s; %s", e, kept)
            self._fetch_failing = True
            return
        if self._fetch_failing:
            log.info("pod source recovered: %d pods", len(snap.pods))
        self._fetch_failing = False
        self._warn_once("pods", snap.warnings)
        self.out.metrics.source_ok(snap)
        if self._cache_in_doubt():
            # A pod the list leaves out would be dropped for good, as if its slice had gone
            # (carry_over asks the cache which slices run). Ask again after the re-read.
            self._want_fetch = True
            return
        carried = self.intake.accept(snap, self.applier.live_pod_uids())
        self._warn_once("carried", [
            f"pod {p.display} is no longer listed by the pod source but its slice still exists;"
            f" keeping its protection until the slice is gone" for p in carried])

    def _read_capacity(self) -> None:
        try:
            capacity = self.out.read_capacity()
        except (OSError, ValueError) as e:
            log.error("cannot read node memory, keeping %d bytes: %s", self.capacity, e)
            return
        if capacity != self.capacity:
            log.info("node memory changed: %d -> %d bytes", self.capacity, capacity)
            self.capacity = capacity

    def on_memory_event(self) -> None:
        if self.out.memory_watcher is not None:
            for _ in self.out.memory_watcher.poll_events():
                pass
        self._read_capacity()
        self.wake()

    def _plan(self, pods: list) -> Plan:
        """`plan` of these inputs; the same Plan object again while they are unchanged. A burst of
        new pod slices brings a round per few signals, all with the same pods: planning them all
        again each time was most of the daemon's CPU in a burst, taken from PID 1 on a small
        node (bench/vm_speed.py; `plan` is pure, so this is safe)."""
        inputs = (pods, self.capacity, self.out.page_size, self.config)
        if self._planned is None or self._planned[0] != inputs:
            desired = plan(pods, NodeFacts(self.capacity, self.out.page_size), self.config)
            self._planned = (inputs, desired, desired.by_unit())
        return self._planned[1]

    def _planned_units(self) -> dict:
        """The last plan's units by name (made once per plan: every UnitNew looks here)."""
        if self.last_plan is None:
            return {}
        if self._planned is None or self._planned[1] is not self.last_plan:
            return self.last_plan.by_unit()
        return self._planned[2]

    def _settled_key(self) -> tuple:
        """Everything a reconcile's plan and diff are computed from. `plan` is pure and the diff
        reads only the Applier's cache (whose generation counts its changes): when this equals
        the key of a round that found nothing to send, and no unit is waiting to be read, this
        round would find nothing either. Compared with ==: the same objects compare at once (the
        pod source hands back the same pods while its document is unchanged), others by value."""
        return (self.intake.pods, self.capacity, self.out.page_size, self.config,
                self.naming, self.intake.holding, frozenset(self._retired), self.applier,
                self.applier.generation)

    async def reconcile(self) -> None:
        started = self.out.clock()
        key = self._settled_key()
        if key == self._settled and not self._refresh_units and not self._recheck_units:
            # A poll with the same pods, no unit event, no read that changed anything: planning
            # and diffing again would find nothing to send (see _settled_key).
            if self._unknown_units:
                now = self.out.clock()
                self._unknown_units = {n: t for n, t in self._unknown_units.items() if t > now}
            self._keep_ledger()  # a write that failed is tried again every round, as before
            self.out.metrics.observe_reconcile(self.out.clock() - started, 0)
            return
        self._settled = None
        pods = list(self.intake.pods)
        try:
            desired = self._plan(pods)
        except PlanError as e:
            log.error("cannot plan, nothing changed: %s", e)
            return
        self._warn_once("plan", desired.warnings)
        self.last_plan = desired
        self.out.cgroupfs.place(desired)  # where its container scopes are
        planned = self._planned_units()
        now = self.out.clock()
        self._unknown_units = {n: t for n, t in self._unknown_units.items() if n not in planned and t > now}
        # Take the sets before awaiting: a UnitNew or JobRemoved that arrives while we read must
        # stay queued for the next round, not be cleared with the ones just read.
        pending, self._refresh_units = self._refresh_units, set()
        started_units, self._recheck_units = self._recheck_units, set()
        taken = self._take_new_runs(pending, started_units)
        pending -= taken
        started_units -= taken
        # The units this round will write need their state checked before the write: a diff on
        # what is cached says which, and their states come in the same call as the new units'.
        # A started unit (JobRemoved) whose properties are cached needs nothing else: a start job
        # does not change them, and its state matters only if it is to be written. One that was
        # not running when read at UnitNew has been forgotten: read it in full.
        before = self._changes(desired)
        writes = {c.unit for c in before[0]
                  if c.must_exist and c.unit not in self.applier.runs and self.out.cgroupfs.run_of(c.unit) is None}
        read_from = self.applier.generation
        again = {u for u in started_units if self.applier.observed.get(u) is None}
        try:
            await self.applier.refresh_units(pending | again, writes)
        except SystemdError:
            self._refresh_units |= pending  # read them again after the retry
            self._recheck_units |= started_units
            raise
        if self._cache_in_doubt():
            # Since this round's step began. A reserved slice, which the diff may create, was
            # written with what systemd already held (e2e 40-survival). Drop the round; the full
            # re-read decides.
            self._refresh_units |= pending
            self._recheck_units |= started_units
            return
        generation = self.applier.generation  # what this round's diff is computed from
        # The diff again only if the reads changed the cache (a burst's rounds read nothing).
        changes, held = before if generation == read_from else self._changes(desired)
        if self.intake.holding is not None:
            self._warn_once("holding", [f"holding ({self.intake.holding}): {held} change(s) that would"
                                        f" lower a protection or move a MemoryHigh not sent"] if held else [])
        was = {c.unit: self.applier.observed.get(c.unit) for c in changes}
        result = await self.applier.apply(changes)
        if changes:
            log.info("reconcile: %s", summarize(result, name_changes(result.applied, was)))
        if self._shown_plan is not desired:
            self.out.metrics.set_plan(desired)
            self._shown_plan = desired
        self.out.metrics.observe_reconcile(self.out.clock() - started, len(result.applied))
        # A retired slice is ours to reset once; after that it is the operator's again.
        self._retired = {n for n in self._retired if self.applier.observed.get(n) not in (None, DEFAULTS)}
        self._keep_ledger()
        if not result.ok:
            raise SystemdError(f"apply stopped at {result.failed.unit}: {result.error}")
        settled = self._settled_key()
        if (not changes and not self._refresh_units and not self._recheck_units
                and settled[:-1] == key[:-1] and settled[-1] == generation):
            # Nothing to send, and nothing it was computed from changed while the round awaited
            # (a signal handler or a memory event): the next round with this key may be skipped.
            self._settled = settled
        node = desired.node_unit()
        status = (f"{len(pods)} pods, kubepods min {node.memory_min} low {node.memory_low}"
                  + (f", holding: {self.intake.holding}" if self.intake.holding else ""))
        if not self.ready:
            self.ready = True
            self.notifier.ready(status)
            log.info("ready: %s", status)
        else:
            self.notifier.status(status)

    def _take_new_runs(self, new: set[str], started: set[str]) -> set[str]:
        """The new pod slices this round takes without reading them over D-Bus.

        A pod slice just loaded (UnitNew) and not cached: if its cgroup carries the invocation ID
        systemd sets as it starts a slice (systemd.read_invocation_id), it is cached with the
        values the kernel holds for it (systemd.read_cgroup_memory: what systemd applied as it
        started it), or as UNREAD if they cannot be read, and its first write, of what differs
        (all three if UNREAD), is the only call it costs. One property instead of three is also
        less work for PID 1 (a drop-in and a cgroup write each) in the middle of a burst. Without
        an ID yet, its start job has not run: it is neither read nor written until that job's
        JobRemoved, then taken the same way, or read over D-Bus if its cgroup still has no ID (a
        systemd that sets none). Asking systemd for its state meanwhile cost a ListUnitsByPatterns
        per round, each pattern matched against every unit in PID 1: in a burst that slowed the burst itself
        (bench/vm_speed.py). Not while holding: only raising values may be sent then, which
        needs the values held. Container scopes carry no such ID on systemd 252
        (tests/e2e 12-invocation-path X) and are read as before."""
        if self.intake.holding is not None:
            return set()
        taken = set()
        for name in new | (started & self._awaiting_start):
            ref = self.naming.parse_unit(name)
            if ref is None or ref.level != "pod" or self.applier.observed.get(name) is not None:
                continue
            self._awaiting_start.discard(name)
            invocation = self.out.cgroupfs.run_of(name)
            if invocation is not None:
                self.applier.assume_started(name, invocation, self.out.cgroupfs.kernel_values(name))
                taken.add(name)
            elif name not in started:
                self._awaiting_start.add(name)
                taken.add(name)
            # else: started, yet no ID on its cgroup: read over D-Bus as before
        return taken

    def _on_oom_group_restored(self, unit: str, error: str | None) -> None:
        self.out.metrics.oom_group_restored(error is None)
        if error is not None:
            self._warn_once("oom-group", [f"cannot put memory.oom.group of {unit} back to the runtime's 1: {error};"
                                          f" systemd reset it when it re-applied the unit's settings"])
        elif not self._oom_group_noted:
            self._oom_group_noted = True
            log.info("memory.oom.group of %s put back to 1: systemd resets it to 0 whenever it re-applies a scope's"
                     " settings (a write, a daemon-reload), and the runtime set it only in the file; done for every"
                     " such container from now on (memqos_oom_group_restores_total)", unit)

    def _changes(self, desired: Plan) -> tuple[list[Change], int]:
        """The changes to send (only raising ones while holding), and how many were held back."""
        observed = self.applier.observed  # read only; a unit it lacks is not loaded (diff)
        if self.intake.holding is not None:
            # Values not read cannot be compared: such units are left as they are while holding.
            observed = {n: (None if v is UNREAD else v) for n, v in observed.items()}
        changes = diff(desired, observed, self.naming, retired=self._retired)
        if self.intake.holding is None:
            return one_write_per_container(changes), 0
        sent = grow_only(changes)
        return sent, len(changes) - len(sent)

    def read_throttle_events(self) -> None:
        """memory.events `high` of every planned container, for the throttling metric."""
        for unit, path in self.out.cgroupfs.container_events():  # the plan placed last
            events = read_events_file(path)
            if "high" in events:
                self.out.metrics.throttle_events(unit, events["high"])

    async def _throttle_loop(self, interval: float) -> None:
        while not self.stopping:
            await asyncio.sleep(interval)
            await asyncio.to_thread(self.read_throttle_events)

    # ------------------------------------------------------------ loop
    async def _watchdog(self, interval: float) -> None:
        while not self.stopping:
            self.notifier.watchdog()
            await asyncio.sleep(interval)

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.add_signal_handler(signal.SIGHUP, self.request_reload)
        loop.add_signal_handler(signal.SIGTERM, self.stop)
        loop.add_signal_handler(signal.SIGINT, self.stop)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        self._install_signals(loop)
        if self.out.ledger_path is not None:
            # Reserved slices we wrote before, that the config no longer names (dropped while we
            # were stopped): reset them once, as a reload that dropped them would have.
            gone = ledger.read(self.out.ledger_path) - set(self.naming.reserved_slices())
            for name in sorted(gone):
                log.info("%s was a reserved cgroup when the service last ran and the config no longer names"
                         " it: bringing it back to MemoryMin=0 MemoryLow=0 MemoryHigh=infinity", name)
            self._retired |= gone
        remembered = self.intake.recall()
        if remembered:
            log.info("remembered %d pods from the last run (%s): a pod among them the pod source does not"
                     " list at first keeps its protection while its slice runs", remembered, self.out.last_pods_path)
        if self.out.memory_watcher is not None:
            loop.add_reader(self.out.memory_watcher.fileno(), self.on_memory_event)
        wd = watchdog_interval()
        wd_task = asyncio.create_task(self._watchdog(wd)) if wd else None
        throttle_task = asyncio.create_task(self._throttle_loop(THROTTLE_READ_INTERVAL))
        backoff = 1.0
        try:
            while not self.stopping:
                try:
                    await self._step()
                    backoff = 1.0
                except SystemdError as e:
                    log.error("systemd: %s; retrying in %.0fs", e, backoff)
                    if self.systemd is not None and not self.systemd.connected:
                        self._disconnected = True
                    await self._backoff(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX)
                    continue
                await self._wait()
        finally:
            if wd_task:
                wd_task.cancel()
            throttle_task.cancel()
            self.notifier.send("STOPPING=1")
            if self.systemd is not None:
                await self.systemd.close()
            log.info("stopped; protections left in place")
        return 0

    async def _step(self) -> None:
        now = self.out.clock()
        if self._want_reload:
            self._reload_config()
        if self.systemd is None or self._disconnected:
            if self.systemd is not None:
                log.warning("lost the connection to systemd; reconnecting")
                try:
                    await self.systemd.close()
                except SystemdError:
                    pass
                self.systemd = None
            await self._connect()
            log.info("connected to systemd %s", await self.systemd.version())
        if now < self._quiet_until:
            return  # systemd is reloading or has just come back: see _on_reloading
        if now >= self._next_resync:
            if self._light_resyncs + 1 >= FULL_RESYNC_EVERY:
                self._want_timer_refresh = True
            else:
                self._want_timer_light = True
            self._read_capacity()
            self._next_resync = now + self.config.resync_interval
        # The timer's own re-reads trust a cgroup that shows the cached values (see
        # Applier.refresh_all); those an event calls for read systemd's state of every unit read.
        if self._want_full_refresh or self._want_timer_refresh:
            # Units announced (UnitNew) before this re-read asked systemd are read by it, from
            # systemd, when it reads every unit: a daemon-reload announces them all just before
            # its re-read, and reading each again in the round cost a second GetAll per unit.
            # One announced while it awaits stays queued. (The timer's re-read may keep a cached
            # unit unread, so it serves none.)
            served = set(self._refresh_units) if self._want_full_refresh else set()
            await self.applier.refresh_all(self._retired, trust_kernel=not self._want_full_refresh)
            self._refresh_units -= served
            self._want_full_refresh = self._want_timer_refresh = False
            self._want_light_refresh = self._want_timer_light = False
            self._light_resyncs = 0
        elif self._want_light_refresh or self._want_timer_light:
            await self.applier.refresh_all(self._retired, levels=LIGHT_RESYNC_LEVELS,
                                           trust_kernel=not self._want_light_refresh)
            self._want_light_refresh = self._want_timer_light = False
            self._light_resyncs += 1
        if self._want_fetch or now >= self._next_poll or now >= self._fast_poll_at() or self._source_changed():
            await self._fetch()
            self._next_poll = self.out.clock() + self.config.kubelet.poll_interval
        await self.reconcile()

    def _fast_poll_at(self) -> float:
        """When to ask the pod source about units it has not described yet."""
        if not self._unknown_units:
            return float("inf")
        if self._unknown_new:
            return self._fetch_started + FAST_POLL_FIRST  # at once, unless a fetch has just started
        return self._fetch_started + self._fast_poll

    def _source_changed(self) -> bool:
        changed = getattr(self.source, "changed", None)
        return bool(changed and changed())

    async def _wait(self) -> None:
        now = self.out.clock()
        timeout = min(self._next_poll, self._next_resync) - now
        # Something new that the pod source has not described yet: ask again soon.
        timeout = min(timeout, self._fast_poll_at() - now)
        if self._fetch_failing and now < self._kubelet_started + KUBELET_START_PATIENCE:
            # The kubelet has just started and does not answer yet: ask again in a moment.
            timeout = min(timeout, KUBELET_START_RETRY)
            self._want_fetch = True
        if getattr(self.source, "changed", None):
            timeout = min(timeout, 1.0)  # podsFile: notice edits within a second
        if now < self._quiet_until:
            # Wake when the quiet time ends (a reload that never reports its end still ends at
            # the next resync: Reloading(false) lost would otherwise stop us for good).
            self._quiet_until = min(self._quiet_until, now + self.config.resync_interval)
            timeout = min(timeout, self._quiet_until - now)
        await self._sleep(max(timeout, 0.0))

    async def _sleep(self, seconds: float) -> None:
        # An event that arrived while we worked has already set the flag: return at once.
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            pass
        self._wake.clear()

