"""The service: the stages wired to the loop, and nothing else.

    events ──> agenda ──> round: intake ──> plan ──> diff ──> apply
    (systemd,  (agenda.py,       (intake.py) (round.py over plan.py, reconcile.py, applier.py)
    signals,   pure: what
    timers)    is due)

Events only say "look again": each handler (events.py for systemd's signals, the two readers
here) is one transition of the agenda. Each step of the loop (mainloop.py) asks the agenda what
is due (a config reload, a connection, a re-read of what systemd holds, the pods), does it, and
runs a round (round.py: the same as `apply --once`). Beside the steps, the ticks the agenda
schedules (`Tick`: the heartbeat, the watch of the upper slices' cgroups) run in a task of their
own that never waits on systemd or the pod source, so a step that does never holds up the
heartbeat.

Where things plug in:
* a systemd signal: `Systemd.subscribe` (in `_connect`), a handler in events.py, its agenda transition;
* a file descriptor: a line of the readers in `run` (a feature's: its `notifier`);
* a periodic task: a `Tick` of the agenda (its schedule, table-tested) and a line of the ticks in `run`.
* a feature laid on the plan: its module and a line of features.FEATURES, nothing here.

Promises kept here:
* Protections are never lowered because the pod source failed: the last good snapshot is kept,
  and until a first good one exists (or while a sudden drop to zero pods is unconfirmed) only
  changes that raise values are sent (intake.py).
* A pod the pod source stops listing keeps its protection while its pod slice runs
  (intake.carry_over), also just after the daemon itself restarted (last_pods.py).
* A config that cannot be used (on SIGHUP, whatever goes wrong) is logged in one line and the
  old one stays in force; at start it is exit 2.
* A lost bus is reconnected with backoff, then everything is re-read and re-applied.
* SIGTERM exits without touching any unit: protections stay in place.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import features, fights
from .agenda import HEARTBEAT_INTERVAL, Agenda, Tick
from .applier import Applier
from .cgroupfs import Cgroupfs
from .companion import Companion
from .config import Config, ConfigError
from .events import SystemdEvents
from .feature import Context
from .in_force import made_from, reloaded
from .wiring import Wiring
from .drift import FOREIGN_LOG_EVERY
from .quantity import show_value
from .intake import PodIntake
from .ledger import ReservedSlices
from .mainloop import MainLoop
from .metrics import NoMetrics
from .node import Capacity
from .notify import Notifier, WarnOnce, watchdog_interval
from .observe import Observer
from .plan import NodeFacts, PlanError
from .round import Inputs, Round
from .runtime_keep import OomGroupJournal
from .systemd import SystemdError

log = logging.getLogger("memqos_systemd")


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
    state_dir: Path | None = None  # where the features keep their files (feature.Context); None: not kept
    # The last snapshot's pods, for the first carry_over after a restart (last_pods.py); None: not kept.
    last_pods_path: Path | None = None
    # The units someone keeps writing behind our back, for status and check (fights.py); None: not kept.
    fights_path: Path | None = None
    clock: Callable[[], float] = time.monotonic


class Daemon:
    def __init__(self, config_path: str | None, config: Config, outside: Outside):
        self.config_path = config_path
        self.config = config
        self.out = outside
        self.naming, self.source = made_from(config, config_path, outside.make_source)  # ConfigError: exit 2
        self.notifier = outside.notifier or Notifier()
        self.agenda = Agenda(resync_interval=config.resync_interval, poll_interval=config.kubelet.poll_interval,
                             watch_source=hasattr(self.source, "changed"), now=outside.clock(),
                             heartbeat_interval=min(watchdog_interval() or HEARTBEAT_INTERVAL, HEARTBEAT_INTERVAL))
        self.intake = PodIntake(outside.last_pods_path)  # the pods to act on, and whether we hold
        self.reserved = ReservedSlices(outside.ledger_path)
        # What is laid on the round's plan (features.py), each with its state.
        self.features = features.make(Context(outside.cgroupfs, outside.page_size, outside.metrics, outside.state_dir,
                                              clock=outside.clock))
        outside.metrics.declare(features.families(self.features))  # each feature's metric families
        self.round = Round(outside.metrics, outside.clock, self.features)
        # The observer and the applier over them, for the config in force (wiring.py, as every command's).
        self.wiring = Wiring(lambda: (self.config, self.naming), self.features, outside.cgroupfs, outside.page_size,
                             kubelet=lambda: self.companion.watched, on_call=outside.metrics.dbus_call)
        self.systemd = None
        self.observer: Observer | None = None  # what systemd and the kernel hold (observe.py)
        self.applier: Applier | None = None
        # Beside the kubelet's own Memory QoS or not (companion.py): the observer asks it for every unit.
        self.companion = Companion(config, outside.metrics)
        self.capacity = Capacity(outside.read_capacity)  # the node's memory (node.py)
        self._warn_once = WarnOnce(log)
        self._moments = KubeletMoments(outside.metrics)  # the kubelet's own moments written over ours
        self.foreign = fights.ForeignLog(outside.metrics, outside.fights_path)  # writes behind our back
        self._oom_group = OomGroupJournal(outside.metrics.oom_group_restored)  # memory.oom.group put back
        self.loop = MainLoop(self.agenda, outside.clock)  # steps, ticks, wake-ups, backoff (mainloop.py)
        self.wake = self.loop.wake  # look at the agenda again now
        # What each signal of systemd's means (events.py); the observer is made before it subscribes.
        self.events = SystemdEvents(self.agenda, outside.clock, self.wake, outside.metrics, lambda: self.naming,
                                    planned=self.round.names, forget=lambda unit: self.observer.forget(unit))

    @property
    def ready(self) -> bool:
        """The first round has been applied (READY=1)."""
        return self.notifier.readied

    # ------------------------------------------------------------ events besides systemd's (events.py)
    def on_cgroup_written(self) -> None:
        """Someone wrote a watched cgroup file (Cgroupfs.watch_notifier): look at once, not at the
        next tick of the watch."""
        self.out.cgroupfs.drain_notifier()
        self.watch_upper_slices()

    def on_feature_woken(self, notifier) -> None:
        """A feature's notifier is readable (feature.Feature.notifier): the look it asks for."""
        self.agenda.look_again(features.woken(self.features, notifier, self.out.clock()))
        self.wake()

    def on_memory_event(self) -> None:
        if self.out.memory_watcher is not None:
            for _ in self.out.memory_watcher.poll_events():
                pass
        self.capacity.reread()
        self.wake()

    def request_reload(self) -> None:
        self.agenda.reload_asked()
        self.wake()

    def stop(self) -> None:
        self.loop.stop()

    # ------------------------------------------------------------ the loop (mainloop.py)
    async def run(self) -> int:
        if self.out.cgroupfs.watch_notifier() is None:
            log.warning("no inotify: a write to the node, QoS or reserved slices' cgroups is found by the watch's"
                        " timer only (within 5 s, 1 s while a writer is about)")
        self.reserved.start(self.naming.reserved_slices())  # dropped while we were stopped: reset once
        self.intake.recall()  # the pods of the last run, for the first carry_over
        try:
            await self.loop.run(self._step, ticks={Tick.HEARTBEAT: self._heartbeat, Tick.WATCH: self.watch_upper_slices},
                                readers=[(self.out.memory_watcher, self.on_memory_event),
                                         (self.out.cgroupfs.watch_notifier(), self.on_cgroup_written),
                                         *[(n, lambda n=n: self.on_feature_woken(n))
                                           for n in features.notifiers(self.features)]],
                                signals={signal.SIGHUP: self.request_reload, signal.SIGTERM: self.stop,
                                         signal.SIGINT: self.stop})
        finally:
            self.out.cgroupfs.close_notifier()
            self.notifier.send("STOPPING=1")
            if self.systemd is not None:
                await self.systemd.close()
            log.info("stopped; protections left in place")
        return 0

    async def _step(self) -> None:
        """Carry out what is due, then one round."""
        now = self.out.clock()
        due = self.agenda.due(now)
        if due.reload:
            self._reload_config()
        if self.systemd is None or not self.systemd.connected:
            await self._connect()
        if due.quiet:
            return  # systemd is reloading or has just come back
        if due.resync:
            self.capacity.reread()
        self._kubelet_mode(now)
        await self._refresh(now)
        if self.agenda.watch_source and self.source.changed():
            self.agenda.source_changed()
        if self.agenda.due(now).fetch:
            await self._fetch()
        await self._round()

    async def _refresh(self, now: float) -> None:
        """Re-read what systemd holds, as much as the agenda asks for."""
        kind, served = self.agenda.take_refresh(now)
        if not kind:
            return
        try:
            read = await self.observer.refresh_all(self.reserved.retired, levels=kind.levels,
                                                   trust_kernel=kind.trust_kernel)
        except SystemdError:
            self.agenda.put_back_refresh(kind, served)
            raise
        finally:
            self._drifted()
        self.applier.after_read(read)
        self.agenda.refreshed(kind)

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
        self.observer = self.wiring.observer(systemd)
        await systemd.subscribe(**self.events.handlers())  # (a signal may come before it returns)
        self.systemd = systemd
        self.applier = self.wiring.applier(systemd, self._oom_group)
        self.agenda.connected()
        log.info("connected to systemd %s", await systemd.version())

    def _reload_config(self) -> None:
        """SIGHUP: the new config in full, or the old one kept; nothing changes until every part
        of the new one has been made."""
        self.agenda.reload_taken()
        self.notifier.reloading()
        try:
            config, naming, source = reloaded(self.config_path, self.out.make_source, (self.config, self.source))
        except ConfigError as e:  # whatever went wrong: the old config stays in force
            log.error("reload refused, keeping the previous config: %s", e)
            self.out.metrics.config_reload(False)
            self.notifier.send("READY=1")
            return
        source_changed = source is not self.source
        self.reserved.config_changed(self.naming.reserved_slices(), naming.reserved_slices())
        self.config, self.naming, self.source = config, naming, source
        self.agenda.config_changed(self.out.clock(), resync_interval=config.resync_interval,
                                   poll_interval=config.kubelet.poll_interval,
                                   watch_source=hasattr(self.source, "changed"), source_changed=source_changed)
        log.info("config reloaded from %s: policy %s, hierarchy %s", self.config_path,
                 config.memory_reservation_policy, config.hierarchy)
        # A mode `companion:` forces, or the kubelet's config file read again, takes effect at once;
        # what the kubelet says of itself is asked at the next fetch.
        if self.companion.config_changed(config):
            self.agenda.reread()  # what the cache holds is compared as the new mode has it
        for note in config.notes:  # e.g. an empty file: policy None (config.load_config)
            log.warning("config: %s", note)
        self.out.metrics.config_reload(True)
        self.notifier.send("READY=1")

    async def _fetch(self) -> None:
        self.agenda.fetch_started(self.out.clock())
        snap = await self.intake.fetch(self.source, self.out.metrics, failing=self.agenda.fetch_failing)
        self.agenda.fetch_ended(self.out.clock(), ok=snap is not None)
        if snap is None:
            return
        if self.agenda.in_doubt(self.out.clock()):
            # A pod the list leaves out would be dropped for good, as if its slice had gone
            # (carry_over asks the cache which slices run). Ask again after the re-read.
            self.agenda.fetch_now()
            return
        if self.agenda.ask_kubelet():
            if await self.companion.ask(self.config, self.source):
                self.agenda.reread()  # what the cache holds is compared as the new mode has it
            if not self.companion.answers.transient or not self.agenda.deciding(self.out.clock()):
                self.agenda.kubelet_answered()
                if self.companion.release():  # decided: what was held for it is the mode's to say
                    self.agenda.reread()
            else:  # just after its start its port may answer /pods before /metrics: ask again
                # (not after a 403 or a 404: asked again, it says the same)
                self.agenda.ask_again()
        carried = self.intake.accept(snap, self.observer.live_pod_uids())
        self.intake.say("carried", [f"pod {p.display} is no longer listed by the pod source but its slice still"
                                    f" exists; keeping its protection until the slice is gone" for p in carried])

    def _kubelet_mode(self, now: float) -> None:
        """After the kubelet's start its config file is read again (it has just read it), and the
        mode decided from it until the kubelet answers; a kubelet that never answers leaves nothing
        held for it past its patience."""
        if self.agenda.take_kubelet_start() and self.companion.kubelet_started(self.config):
            self.agenda.reread()
        if self.companion.bridge and not self.agenda.kubelet_starting(now) \
                and self.companion.end_bridge("its start is past"):
            self.agenda.reread()
        if self.companion.held and not self.agenda.deciding(now) and self.companion.release():
            self.agenda.reread()  # what was held for it is compared as the mode has it

    # ------------------------------------------------------------ one round (round.py)
    def _inputs(self) -> Inputs:
        node = NodeFacts(self.capacity.bytes, self.out.page_size, self.companion.writes, self.companion.hand_back,
                         self.companion.bridge)
        return Inputs(self.intake.pods, node, self.config, self.naming, self.intake.holding,
                      frozenset(self.reserved.retired))

    def _looks(self, planned: bool) -> None:
        """When each feature wants a round again (feature.Feature.look_again)."""
        self.agenda.look_again(features.looks(self.features, self.out.clock(), planned))

    async def _round(self) -> None:
        new, started = self.agenda.take_units()  # one announced while the round awaits stays queued
        inputs = self._inputs()
        try:
            outcome = await self.round.run(inputs, self.observer, self.applier, new=new, started=started,
                                           sure=lambda: not self.agenda.in_doubt(self.out.clock()),
                                           put_back=self.agenda.put_back_units)
        except PlanError as e:
            log.error("cannot plan, nothing changed: %s", e)
            self._looks(planned=False)  # else a past look: a spin
            return
        finally:
            self._drifted()  # (also from a round its read dropped)
        self.agenda.planned(self.round.planned_units, self.out.clock())
        self._looks(planned=True)
        if inputs.node.hand_back and outcome is not None and outcome.result.ok:
            self.companion.handed_back()
        settled = outcome is None or outcome.settled
        self.reserved.after_round(self.naming.reserved_slices(), None if settled else self.observer.snapshot().held)
        if settled:
            return
        self._warn_once("plan", outcome.plan.warnings)
        if inputs.holding is not None:
            self._warn_once("holding", outcome.held_note(inputs.holding))
        # The upper slices' cgroups as this round left them (the first round's opens them, and
        # arms their inotify watches); a write behind our back during our own is found here.
        self.watch_upper_slices()
        if not outcome.result.ok:
            raise SystemdError(f"apply stopped at {outcome.result.failed.unit}: {outcome.result.error}")
        status = outcome.status(inputs)
        if self.notifier.report(status):
            self.out.metrics.set_ready()
            log.info("ready: %s", status)

    # ------------------------------------------------------------ the ticks, and what the reads found
    def _heartbeat(self) -> None:
        """The loop runs: WATCHDOG=1 to systemd (ignored by a unit without WatchdogSec=; a no-op
        outside systemd), and /livez stays 200."""
        self.notifier.watchdog()
        self.out.metrics.heartbeat()

    def watch_upper_slices(self) -> None:
        """A node, QoS or reserved slice whose cgroup no longer shows what systemd held for it at
        our last read or write was written by someone else; read it again (the next round puts
        ours back, and the read names the writer)."""
        if self.observer is None or self.agenda.due(self.out.clock()).quiet:
            return
        if self.out.cgroupfs.watch(self.observer.upper_values(), self.out.page_size, skip=self.observer.writing):
            self.agenda.kernel_drift(self.out.clock())
            self.wake()

    def _drifted(self) -> None:
        """The writes behind our back the observer's reads found (Observer.take_drift): the watch
        closes in (the next round puts ours back), a feature takes its own part of each (a
        feature's: said there), and the rest is counted, said and kept (fights.ForeignLog)."""
        now = self.out.clock()
        bridged = self.companion.bridge  # for every write found in this read (its round writes several)
        for record in self.observer.take_drift():
            if self._kubelets(record, now, bridged):
                continue
            self.agenda.foreign_write(now)
            taken = features.on_drift(self.features, record.unit, record.before, record.now, self.config)
            self.foreign.seen(record, self.naming, taken, now)
        self.loop.ticks_moved()  # the close watch begins within a second

    def _kubelets(self, record, now: float, bridged: bool = False) -> bool:
        """Whether a write found is the kubelet's (Companion.whose): a moment of its (counted, said,
        put back when ours), held for it, or its own while its start is bridged. Never a fight."""
        ref = self.naming.parse_unit(record.unit)
        level = ref.level if ref is not None else "reserved"
        kind = self.companion.whose(record.unit, level, record.before, record.now, bridged=bridged,
                                    starting=self.agenda.kubelet_starting(now),
                                    deciding=self.config.companion != "off" and self.agenda.deciding(now))
        if kind == "round":
            self.agenda.reread()  # the node and QoS slices are its own again: compared as such
        elif kind in ("start", "create"):
            self._moments(record, level, kind, now)
        return kind is not None


class KubeletMoments:
    """A kubelet's moment written over ours (Daemon._kubelets): counted (memqos_kubelet_resets_total),
    and said in the journal once an hour per moment and level."""

    def __init__(self, metrics) -> None:
        self.metrics = metrics
        self._said: dict[tuple[str, str], float] = {}  # (moment, level) -> when the journal last said it

    def __call__(self, record, level: str, kind: str, now: float) -> None:
        self.metrics.kubelet_reset(level, kind)
        said = self._said.get((kind, level))
        if said is None or now - said >= FOREIGN_LOG_EVERY:
            self._said[(kind, level)] = now
            log.info("%s: the kubelet's %s (%s) written over ours: putting ours back (its own moment, not a fight:"
                     " memqos_kubelet_resets_total counts each; said once an hour per level)", record.unit,
                     "start reset" if kind == "start" else "values at a container's creation or resize",
                     kubelet_change(record.before, record.now))


def kubelet_change(before, now) -> str:
    """"MemoryMin 64Mi -> 0, MemoryLow 48Mi -> 0": what a write changed, for the journal."""
    return ", ".join(f"{p} {show_value(before[p])} -> {show_value(v)}" for p, v in now.items()
                     if p in before and before[p] != v)
