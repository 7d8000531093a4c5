"""The service: the stages wired together, and the loop that carries them out.

    events ──> agenda ──> snapshot ──> plan ──> diff ──> apply
    (systemd,  (agenda.py,  (intake.py:   (plan.py,  (reconcile  (applier.py over
    signals,   pure: what   pods to act   pure)      .py, pure)   systemd.py and
    timers)    is due)      on)                                   cgroupfs.py)

Events only say "look again": each handler below is one transition of the agenda. Each step of
the loop asks the agenda what is due (a config reload, a connection, a re-read of what systemd
holds, the pods), does it, and then runs the same pipeline: the pods of the intake and the node
facts are planned, the plan is diffed against the Applier's cache of what systemd holds, and the
diff is applied in a safe order.

Promises kept here:
* Protections are never lowered because the pod source failed: the last good snapshot is kept,
  and until a first good one exists (or while a sudden drop to zero pods is unconfirmed) only
  changes that raise values are sent (intake.py).
* A pod the pod source stops listing keeps its protection while its pod slice runs
  (intake.carry_over), also just after the daemon itself restarted (last_pods.py).
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

from .agenda import Agenda
from .applier import Applier, name_changes, summarize
from .cgroupfs import Cgroupfs, read_events_file
from .config import Config, ConfigError, load_config
from .guard_watch import GuardWatch
from .intake import PodIntake
from .ledger import ReservedSlices
from .metrics import NoMetrics
from .naming import Naming, NamingError
from .notify import Notifier, WarnOnce, watchdog_interval
from .plan import NodeFacts, Plan, PlanError, plan
from .pods import one_line
from .reconcile import DEFAULTS, UNREAD, Change, diff, grow_only, one_write_per_container
from .systemd import SystemdError, show_value

log = logging.getLogger("memqos_systemd")

KUBELET_UNIT = "kubelet.service"
BACKOFF_MAX = 30.0
# How often memory.events of the containers is read for the throttling metric.
THROTTLE_READ_INTERVAL = 15.0
# How often the loop says it runs: to /livez (Metrics.heartbeat, metrics.LIVENESS_WINDOW: a
# DaemonSet's liveness probe) and, under WatchdogSec=, to systemd (half its timeout, if shorter).
HEARTBEAT_INTERVAL = 10.0
# A unit someone else keeps writing (the kubelet's own Memory QoS: every minute) is logged at most
# this often; the metric counts every time.
FOREIGN_LOG_EVERY = 3600.0


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


def unexpected(error: BaseException) -> str:
    """An exception of no type of ours, for one log line: its type says what broke."""
    return f"{type(error).__name__}: {one_line(str(error), 300)}"


class Daemon:
    def __init__(self, config_path: str | None, config: Config, outside: Outside):
        self.config_path = config_path
        self.config = config
        self.out = outside
        self.naming, self.source = self._made_from(config)  # ConfigError: `run` exits 2
        self.notifier = outside.notifier or Notifier()
        self.agenda = Agenda(resync_interval=config.resync_interval, poll_interval=config.kubelet.poll_interval,
                             watch_source=hasattr(self.source, "changed"))
        self.intake = PodIntake(outside.last_pods_path)  # the pods to act on, and whether we hold
        self.reserved = ReservedSlices(outside.ledger_path)
        self.systemd = None
        self.applier: Applier | None = None
        self.capacity = outside.read_capacity()
        self.last_plan: Plan | None = None
        self.ready = False
        self.stopping = False
        self._warn_once = WarnOnce(log)
        self._planned: tuple[tuple, Plan, dict] | None = None  # (inputs, plan, its units by name): see _plan
        self._shown_plan: Plan | None = None  # the plan the metrics show
        self._settled: tuple | None = None  # what the last round that sent nothing was computed from
        self._oom_group_noted = False  # the first memory.oom.group put back has been logged
        self._foreign_noted: dict[str, float] = {}  # unit -> when its foreign write was last logged
        self._source_failure: str | None = None  # the pod source's last error, while it fails
        self.guard = GuardWatch(outside.cgroupfs)  # the pressure guard; its MemoryHigh goes into the plan
        self._wake = asyncio.Event()
        self._stop_event = asyncio.Event()

    # ------------------------------------------------------------ events: one transition each
    def wake(self) -> None:
        self._wake.set()

    def on_unit_new(self, name: str) -> None:
        ref = self.naming.parse_unit(name)
        if ref is not None:
            self.agenda.unit_new(name, ref.level, self.out.clock(), planned=self._is_planned(name))
            self.wake()

    def on_unit_removed(self, name: str) -> None:
        ref = self.naming.parse_unit(name)
        if self.applier is not None and ref is not None:
            self.applier.forget(name)
            self.agenda.unit_removed(name, ref.level)
            if ref.level == "pod":
                self.wake()  # a pod kept only because its slice ran can go now

    def on_job_removed(self, unit: str, result: str) -> None:
        if result != "done":
            return
        if self.naming.parse_unit(unit) is not None:
            self.agenda.job_done(unit)
            self.wake()
        elif unit == KUBELET_UNIT:
            log.info("kubelet.service (re)started: re-reading the kubepods and QoS slices, and the pods")
            self.agenda.kubelet_started(self.out.clock())
            self.wake()

    def on_reloading(self, active: bool) -> None:
        self.agenda.systemd_changing(active, self.out.clock())
        if not active:
            log.info("systemd finished reloading: re-reading units")
            self.wake()

    def on_systemd_returned(self) -> None:
        log.info("systemd is back on the bus (re-executed?): re-reading units")
        self.agenda.systemd_returned(self.out.clock())
        self.wake()

    def on_signal_overflow(self) -> None:
        log.warning("systemd sent unit signals faster than they could be handled; some were dropped:"
                    " re-reading every unit and the pods")
        self.out.metrics.signal_overflow()
        self.agenda.overflow()
        self.wake()

    def on_memory_event(self) -> None:
        if self.out.memory_watcher is not None:
            for _ in self.out.memory_watcher.poll_events():
                pass
        self._read_capacity()
        self.wake()

    def request_reload(self) -> None:
        self.agenda.reload_asked()
        self.wake()

    def stop(self) -> None:
        self.stopping = True
        self._stop_event.set()
        self.wake()

    # ------------------------------------------------------------ the loop
    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig, handler in ((signal.SIGHUP, self.request_reload), (signal.SIGTERM, self.stop),
                             (signal.SIGINT, self.stop)):
            loop.add_signal_handler(sig, handler)
        for name in self.reserved.start(self.naming.reserved_slices()):
            # Dropped from the config while we were stopped: reset once, as a reload would have.
            log.info("%s was a reserved cgroup when the service last ran and the config no longer names"
                     " it: bringing it back to MemoryMin=0 MemoryLow=0 MemoryHigh=infinity", name)
        remembered = self.intake.recall()
        if remembered:
            log.info("remembered %d pods from the last run (%s): a pod among them the pod source does not"
                     " list at first keeps its protection while its slice runs", remembered, self.out.last_pods_path)
        if self.out.memory_watcher is not None:
            loop.add_reader(self.out.memory_watcher.fileno(), self.on_memory_event)
        wd = watchdog_interval()
        tasks = [asyncio.create_task(self._every(THROTTLE_READ_INTERVAL, self.read_throttle_events, thread=True)),
                 asyncio.create_task(self._watch_loop()), asyncio.create_task(self._guard_loop()),
                 asyncio.create_task(self._every(min(wd or HEARTBEAT_INTERVAL, HEARTBEAT_INTERVAL),
                                                 self._heartbeat, first=True))]
        backoff = 1.0
        try:
            while not self.stopping:
                try:
                    await self._step()
                    backoff = 1.0
                except SystemdError as e:
                    log.error("systemd: %s; retrying in %.0fs", e, backoff)
                    await self._backoff(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX)
                    continue
                await self._sleep(self.agenda.timeout(self.out.clock()))
        finally:
            for task in tasks:
                task.cancel()
            self.notifier.send("STOPPING=1")
            await self._guard_release_on_stop()
            if self.systemd is not None:
                await self.systemd.close()
            log.info("stopped; protections left in place")
        return 0

    async def _step(self) -> None:
        """Carry out what is due, then one round of the pipeline."""
        now = self.out.clock()
        due = self.agenda.due(now)
        if due.reload:
            self._reload_config()
        if self.systemd is None or not self.systemd.connected:
            await self._connect()
        if due.quiet:
            return  # systemd is reloading or has just come back
        if due.resync:
            self._read_capacity()
        await self._refresh(now)
        if self.agenda.watch_source and self.source.changed():
            self.agenda.source_changed()
        if self.agenda.due(now).fetch:
            await self._fetch()
        await self.reconcile()

    async def _refresh(self, now: float) -> None:
        """Re-read what systemd holds, as much as the agenda asks for."""
        kind, served = self.agenda.take_refresh(now)
        if not kind:
            return
        try:
            await self.applier.refresh_all(self.reserved.retired, levels=kind.levels, trust_kernel=kind.trust_kernel)
        except SystemdError:
            self.agenda.put_back_refresh(kind, served)
            raise
        self.agenda.refreshed(kind)

    async def _every(self, interval: float, work: Callable[[], None], *, thread: bool = False,
                     first: bool = False) -> None:
        """`work` every `interval` seconds (at once too if `first`), in a thread if `thread`."""
        if not first:
            await asyncio.sleep(interval)
        while not self.stopping:
            if thread:
                await asyncio.to_thread(work)
            else:
                work()
            await asyncio.sleep(interval)

    def _heartbeat(self) -> None:
        """The loop runs: WATCHDOG=1 to systemd (ignored by a unit without WatchdogSec=; a no-op
        outside systemd), and /livez stays 200."""
        self.notifier.watchdog()
        self.out.metrics.heartbeat()

    async def _watch_loop(self) -> None:
        while not self.stopping:
            await asyncio.sleep(self.agenda.watch_interval(self.out.clock()))
            self.watch_upper_slices()

    async def _guard_loop(self) -> None:
        """The pressure guard's timer; its counters are also read at once whenever the kernel says
        the Burstable QoS slice's memory.events changed (GuardWatch.watch)."""
        try:
            while not self.stopping:
                s = self.config.pressure_guard
                self.guard.watch(s.enabled, self.naming, self._on_guard_event)
                await asyncio.sleep(self.agenda.guard_interval(s.enabled, s.interval, self.guard.state.engaged,
                                                               notified=self.guard.notified))
                self.guard_tick()
        finally:
            self.guard.unwatch()

    def _on_guard_event(self) -> None:
        """The kernel says the protected slice's memory.events changed: a breach is seen within
        milliseconds, and while nothing happens nothing is read."""
        self.guard_tick()  # its read of memory.events re-arms the notifier
        self.guard.watch(self.config.pressure_guard.enabled, self.naming, self._on_guard_event)

    async def _sleep(self, seconds: float) -> None:
        # An event that arrived while we worked has already set the flag: return at once.
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            pass
        self._wake.clear()

    async def _backoff(self, seconds: float) -> None:
        """Wait after a failure. Unit and job signals do not cut it short (seen in the VM: a
        stopped kubepods.slice and a stream of UnitNew made 157 failed calls in 3 s); only a stop
        or a config reload does."""
        deadline = self.out.clock() + seconds
        while not self.stopping and not self.agenda.due(self.out.clock()).reload and self.out.clock() < deadline:
            try:
                await asyncio.wait_for(self._stop_event.wait(), timeout=min(0.25, deadline - self.out.clock()))
            except asyncio.TimeoutError:
                pass

    # ------------------------------------------------------------ steps
    async def _connect(self) -> None:
        if self.systemd is not None:
            log.warning("lost the connection to systemd; reconnecting")
            try:
                await self.systemd.close()
            except SystemdError:
                pass
            self.systemd = None
        systemd = await self.out.connect(self.out.bus_address)
        systemd.on_disconnect(self.wake)
        await systemd.subscribe(on_unit_new=self.on_unit_new, on_unit_removed=self.on_unit_removed,
                                on_job_removed=self.on_job_removed, on_reloading=self.on_reloading,
                                on_returned=self.on_systemd_returned, on_overflow=self.on_signal_overflow)
        self.systemd = systemd
        self.applier = Applier(systemd, self.naming, cgroupfs=self.out.cgroupfs, page_size=self.out.page_size,
                               on_call=self.out.metrics.dbus_call, on_restore=self._on_oom_group_restored,
                               on_foreign=self._on_foreign_write)
        self.agenda.connected()
        log.info("connected to systemd %s", await systemd.version())

    def _made_from(self, config: Config, previous: Config | None = None) -> tuple[Naming, Any]:
        """The unit names and the pod source a config makes (the source kept when `previous` had
        the same one). Whatever goes wrong is a ConfigError naming it, in one line: at start the
        service exits 2 (the unit does not restart it: RestartPreventExitStatus=2), on a reload
        the old config stays in force (issue 26: a URL the config let through killed the daemon
        on reload, then at every restart)."""
        try:
            naming = Naming.for_config(config)
            same = previous is not None and (config.pods_file, config.kubelet) == (previous.pods_file, previous.kubelet)
            return naming, self.source if same else self.out.make_source(config)
        except ConfigError:
            raise
        except NamingError as e:
            raise ConfigError(f"{self.config_path or 'the config'}: {e}") from None
        except Exception as e:  # whatever a source's constructor raises
            raise ConfigError(f"{self.config_path or 'the config'}: {unexpected(e)}") from None

    def _reload_config(self) -> None:
        """SIGHUP: the new config in full, or the old one kept; nothing changes until every part
        of the new one has been made."""
        self.agenda.reload_taken()
        self.notifier.send("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")
        try:
            config = load_config(self.config_path, required=self.config_path is not None)
            naming, source = self._made_from(config, previous=self.config)
        except Exception as e:  # ConfigError, and whatever else: the old config stays in force
            log.error("reload refused, keeping the previous config: %s",
                      e if isinstance(e, ConfigError) else unexpected(e))
            self.out.metrics.config_reload(False)
            self.notifier.send("READY=1")
            return
        source_changed = source is not self.source
        for name in self.reserved.config_changed(self.naming.reserved_slices(), naming.reserved_slices()):
            log.info("%s is no longer a reserved cgroup in the config: bringing it back to"
                     " MemoryMin=0 MemoryLow=0 MemoryHigh=infinity", name)
        self.config, self.naming, self.source = config, naming, source
        if self.applier is not None:
            self.applier.naming = naming
        self.agenda.config_changed(self.out.clock(), resync_interval=config.resync_interval,
                                   poll_interval=config.kubelet.poll_interval,
                                   watch_source=hasattr(self.source, "changed"), source_changed=source_changed)
        log.info("config reloaded from %s: policy %s, hierarchy %s", self.config_path,
                 config.memory_reservation_policy, config.hierarchy)
        self.out.metrics.config_reload(True)
        self.notifier.send("READY=1")

    async def _fetch(self) -> None:
        self.agenda.fetch_started(self.out.clock())
        failing = self.agenda.fetch_failing
        try:
            snap = await asyncio.to_thread(self.source.fetch)
        except Exception as e:  # SourceError, and anything a broken source raises
            self.agenda.fetch_ended(self.out.clock(), ok=False)
            self.out.metrics.source_error(getattr(e, "kind", type(e).__name__))
            if not failing or str(e) != self._source_failure:
                # Once per cause: a failing streak that changes cause (token missing, then 401, then
                # 403 as the operator fixes things one by one) says each.
                kept = f"holding the last good snapshot ({len(self.intake.pods)} pods)" if self.intake.snapshot \
                    else "no snapshot yet: only raising values"
                log.warning("pod source failed: %s; %s", e, kept)
            self._source_failure = str(e)
            return
        self.agenda.fetch_ended(self.out.clock(), ok=True)
        self._source_failure = None
        if failing:
            log.info("pod source recovered: %d pods", len(snap.pods))
        self._warn_once("pods", snap.warnings)
        self.out.metrics.source_ok(snap)
        if self.agenda.in_doubt(self.out.clock()):
            # A pod the list leaves out would be dropped for good, as if its slice had gone
            # (carry_over asks the cache which slices run). Ask again after the re-read.
            self.agenda.fetch_now()
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

    # ------------------------------------------------------------ one round: plan, diff, apply
    async def reconcile(self) -> None:
        started = self.out.clock()
        key = self._settled_key()
        if key == self._settled and not self.agenda.has_units():
            # A poll with the same pods, no unit event, no read that changed anything: planning
            # and diffing again would find nothing to send (see _settled_key).
            self.agenda.planned((), self.out.clock())
            self.reserved.keep(self.naming.reserved_slices())  # a write that failed is tried again
            self.out.metrics.observe_reconcile(self.out.clock() - started, 0)
            return
        self._settled = None
        try:
            desired = self._plan(list(self.intake.pods))
        except PlanError as e:
            log.error("cannot plan, nothing changed: %s", e)
            return
        self._warn_once("plan", desired.warnings)
        desired = self.guard.overlay(desired, self.naming)
        self.last_plan = desired
        self.out.cgroupfs.place(desired)  # where its container scopes are
        self.agenda.planned(self._planned[2], self.out.clock())
        outcome = await self._read_and_diff(desired)
        if outcome is None:
            return
        changes, generation, held = outcome
        was = {c.unit: self.applier.observed.get(c.unit) for c in changes}
        result = await self.applier.apply(changes)
        if changes:
            log.info("reconcile: %s", summarize(result, name_changes(result.applied, was)))
        if self._shown_plan is not desired:
            self.out.metrics.set_plan(desired, self.out.cgroupfs)
            self._shown_plan = desired
        done = {c.unit for c in result.applied} | {c.unit for c in result.vanished}
        self.out.metrics.round_state(len(held | ({c.unit for c in changes} - done)), self.intake.holding is not None)
        self.out.metrics.observe_reconcile(self.out.clock() - started, len(result.applied))
        self.reserved.settle(lambda name: self.applier.observed.get(name) in (None, DEFAULTS))
        self.reserved.keep(self.naming.reserved_slices())
        if not result.ok:
            raise SystemdError(f"apply stopped at {result.failed.unit}: {result.error}")
        settled = self._settled_key()
        if not changes and not self.agenda.has_units() and settled[:-1] == key[:-1] and settled[-1] == generation:
            # Nothing to send, and nothing it was computed from changed while the round awaited
            # (a signal handler or a memory event): the next round with this key may be skipped.
            self._settled = settled
        self._report(desired)

    async def _read_and_diff(self, desired: Plan) -> tuple[list[Change], int, set[str]] | None:
        """Read what this round needs from systemd, then the changes to send, the cache
        generation they were computed from and the units held back; None when the round is
        dropped (the cache came into doubt while it read)."""
        # Taken before awaiting: a UnitNew or JobRemoved that arrives while we read stays queued.
        new, started = self.agenda.take_units()
        if self.intake.holding is None:
            taken = self.applier.adopt_new_pod_slices(new, started)
            new, started = new - taken, started - taken
        # The units this round will write need their state checked before the write: a diff on
        # what is cached says which, and their states come in the same call as the new units'.
        # A started unit (JobRemoved) whose properties are cached needs nothing else: a start job
        # does not change them, and its state matters only if it is to be written. One that was
        # not running when read at UnitNew has been forgotten: read it in full.
        before = self._changes(desired)
        writes = {c.unit for c in before[0]
                  if c.must_exist and c.unit not in self.applier.runs and self.out.cgroupfs.run_of(c.unit) is None}
        read_from = self.applier.generation
        again = {u for u in started if self.applier.observed.get(u) is None}
        try:
            await self.applier.refresh_units(new | again, writes)
        except SystemdError:
            self.agenda.put_back_units(new, started)  # read them again after the retry
            raise
        if self.agenda.in_doubt(self.out.clock()):
            # Since this round's step began. A reserved slice, which the diff may create, was
            # written with what systemd already held (e2e 40-survival). Drop the round; the full
            # re-read decides.
            self.agenda.put_back_units(new, started)
            return None
        generation = self.applier.generation  # what this round's diff is computed from
        # The diff again only if the reads changed the cache (a burst's rounds read nothing).
        changes, held = before if generation == read_from else self._changes(desired)
        if self.intake.holding is not None:
            self._warn_once("holding", [f"holding ({self.intake.holding}): changes of {len(held)} unit(s) that would"
                                        f" lower a protection or move a MemoryHigh not sent"] if held else [])
        return changes, generation, held

    def _changes(self, desired: Plan) -> tuple[list[Change], set[str]]:
        """The changes to send (only raising ones while holding), and the units held back."""
        observed = self.applier.observed  # read only; a unit it lacks is not loaded (diff)
        if self.intake.holding is not None:
            # Values not read cannot be compared: such units are left as they are while holding.
            observed = {n: (None if v is UNREAD else v) for n, v in observed.items()}
        changes = diff(desired, observed, self.naming, retired=self.reserved.retired)
        if self.intake.holding is None:
            return one_write_per_container(changes), set()
        sent = grow_only(changes)
        whole = {(c.unit, c.direction, tuple(c.props.items())) for c in sent}
        return sent, {c.unit for c in changes if (c.unit, c.direction, tuple(c.props.items())) not in whole}

    def _report(self, desired: Plan) -> None:
        """Ready (the first time) or the status line, to systemd."""
        node = desired.node_unit()
        status = (f"{len(self.intake.pods)} pods, kubepods min {node.memory_min} low {node.memory_low}"
                  + (f", holding: {self.intake.holding}" if self.intake.holding else ""))
        if not self.ready:
            self.ready = True
            self.notifier.ready(status)
            self.out.metrics.set_ready()
            log.info("ready: %s", status)
        else:
            self.notifier.status(status)

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

    def _is_planned(self, unit: str) -> bool:
        """Whether the last plan names `unit` (True while there is no plan yet)."""
        return self._planned is None or unit in self._planned[2]

    def _settled_key(self) -> tuple:
        """Everything a reconcile's plan and diff are computed from. `plan` is pure and the diff
        reads only the Applier's cache (whose generation counts its changes): when this equals
        the key of a round that found nothing to send, and no unit is waiting to be read, this
        round would find nothing either. Compared with ==: the same objects compare at once (the
        pod source hands back the same pods while its document is unchanged), others by value."""
        return (self.intake.pods, self.capacity, self.out.page_size, self.config, self.naming, self.intake.holding,
                frozenset(self.reserved.retired), self.guard.high, self.applier, self.applier.generation)

    # ------------------------------------------------------------ beside the rounds
    def guard_tick(self) -> None:
        """When the kernel notifies a change of the protected slice's memory.events, and on the
        agenda's guard timer: read the guard's counters (cgroupfs.guard_counters) and let
        guard.decide say whether the BestEffort QoS slice's MemoryHigh changes; a change is one
        journal line and a metric, and goes out with the next round (the plan carries it)."""
        action = self.guard.tick(self.config.pressure_guard, self.naming, self.out.clock(),
                                 holding=self.intake.holding is not None, capacity=self.capacity,
                                 page_size=self.out.page_size)
        if action is None:
            return
        unit = self.naming.qos_slice("BestEffort")
        value = "infinity (the planner's value)" if action.high is None else f"{action.high} ({action.high >> 20} MiB)"
        log.info("pressure guard: %s MemoryHigh of %s to %s: %s", action.kind, unit, value, action.why)
        self.out.metrics.guard_action(action.kind, action.high)
        self.wake()

    async def _guard_release_on_stop(self) -> None:
        """A stopping daemon leaves protections in place, but not a throttle of the guard's: nobody
        would lift it. One write puts the BestEffort QoS slice's MemoryHigh back to the planner's."""
        release = self.guard.release(self.naming)
        if release is None or self.applier is None or self.systemd is None or not self.systemd.connected:
            return
        unit = release.unit
        try:
            result = await asyncio.wait_for(self.applier.apply([release]), timeout=10)
        except (SystemdError, asyncio.TimeoutError) as e:
            log.warning("pressure guard: could not put MemoryHigh of %s back to infinity on stop: %s", unit, e)
            return
        if result.ok:
            self.guard.released()
            self.out.metrics.guard_action("clear", None)
            log.info("pressure guard: clear MemoryHigh of %s to infinity (the planner's value): the service stops", unit)
        else:
            log.warning("pressure guard: could not put MemoryHigh of %s back to infinity on stop: %s", unit, result.error)

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

    def watch_upper_slices(self) -> None:
        """Every agenda.watch_interval: a node, QoS or reserved slice whose cgroup no longer shows
        what systemd held for it at our last read or write was written by someone else; read it
        again (the next round puts ours back, and the read names the writer)."""
        if self.applier is None or self.agenda.due(self.out.clock()).quiet:
            return
        if self.out.cgroupfs.watch(self.applier.upper_values(), self.out.page_size):
            self.agenda.kernel_drift(self.out.clock())
            self.wake()

    def _on_foreign_write(self, unit: str, before: dict[str, int], now: dict[str, int]) -> None:
        """A read found a unit holding what someone else wrote: counted, logged once an hour per
        unit, named (the kubelet when it is the kubelet's pattern); the next round puts ours back."""
        self.out.metrics.foreign_write(unit)
        clock = self.out.clock()
        self.agenda.foreign_write(clock)
        if clock < self._foreign_noted.get(unit, float("-inf")) + FOREIGN_LOG_EVERY:
            return
        self._foreign_noted[unit] = clock
        changed = [p for p in now if now[p] != before.get(p)]
        values = ", ".join(f"{p} {show_value(before[p])} -> {show_value(now[p])}" for p in changed if p in before)
        kubelets = {self.naming.node_slice(): "MemoryMin", self.naming.qos_slice("Burstable"): "MemoryLow"}
        if kubelets.get(unit) in changed:
            writer = ("likely the kubelet's own Memory QoS (its MemoryQoS feature gate, on by default from v1.37,"
                      " rewrites kubepods.slice MemoryMin and kubepods-burstable.slice MemoryLow every minute);"
                      " the fix: featureGates: {MemoryQoS: false} in the kubelet's config")
        else:
            writer = "by another writer (systemctl set-property, another agent)"
        log.warning("%s: %s changed without us, %s; putting ours back (logged once an hour per unit;"
                    " memqos_foreign_writes_total counts each time)", unit, values, writer)

    def read_throttle_events(self) -> None:
        """memory.events `high` of every planned container, for the throttling metric."""
        for unit, path in self.out.cgroupfs.container_events():  # the plan placed last
            events = read_events_file(path)
            if "high" in events:
                self.out.metrics.throttle_events(unit, events["high"])
