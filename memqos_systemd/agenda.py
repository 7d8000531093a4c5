"""The agenda: what the daemon should do next, and when to look again. Pure.

Written like plan.py: no I/O, no clock (`now` is passed in), no globals. The daemon's event
handlers are one-line transitions here (`unit_new`, `unit_removed`, `job_done`,
`systemd_changing`, `overflow`, `kubelet_started`, `reload_asked`, ...); its loop asks `due(now)`
what is due, `timeout(now)` how long it may sleep, takes the work it does (`take_refresh`,
`take_units`, `fetch_started`) and puts back what a failed step did not do (`put_back_refresh`,
`put_back_units`). So every interleaving of events and timers is a table test
(tests/unit/test_agenda.py), with no bus, threads or sleeps. The work beside the rounds (the
heartbeat, the watch of the upper slices) is on the same
schedule: each is a `Tick` (`Ticks`: `due`, `done`, `timeout`).

What is re-read from systemd first is one ordered value, `Refresh`: a merge of what is asked is
the larger of the two, and its `levels` and `trust_kernel` follow from it.

Why each rule (the numbers are below, each with its reason):
* The resync timer re-reads the node, QoS and reserved slices every `resyncInterval`, and every
  unit every FULL_RESYNC_EVERY-th time; events that may have changed what systemd holds
  (start, reconnect, daemon-reload, systemd's return, a config reload, dropped signals) re-read
  every unit from systemd itself, and a kubelet start the slices it rewrites.
* While systemd reloads, and for SYSTEMD_SETTLE after, nothing is read or written: units read
  back half-loaded. A reload that never reports its end still ends at the next resync.
* Until the full re-read after such an event, the cache is `in_doubt`: a daemon-reload announces
  every unit removed, then new (a re-exec only removed), and the cache forgets each.
* A new pod or container unit the pod source has not described yet makes it ask again soon
  (FAST_POLL_FIRST, doubling to the poll interval), for UNKNOWN_UNIT_PATIENCE.
* Right after the kubelet starts, a failed fetch is tried again every KUBELET_START_RETRY.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Collection, Iterable, Mapping

__all__ = [
    "Agenda", "Due", "Refresh", "LIGHT_LEVELS", "FULL_RESYNC_EVERY", "SYSTEMD_SETTLE", "UNKNOWN_UNIT_PATIENCE",
    "FAST_POLL_FIRST", "KUBELET_START_PATIENCE", "KUBELET_START_RETRY", "KUBELET_START_WINDOW", "SOURCE_WATCH_INTERVAL",
    "KERNEL_WATCH_INTERVAL", "KERNEL_WATCH_IDLE", "KERNEL_WATCH_ALERT", "KERNEL_WATCH_AFTER_KUBELET_START",
    "KERNEL_WATCH_AFTER_DRIFT", "KERNEL_DRIFT_GAP", "HEARTBEAT_INTERVAL", "Tick", "Ticks",
    "Look", "follow",
]

# Every FULL_RESYNC_EVERY-th timer resync reads every unit, pod slices and container scopes
# included; the others only the node, QoS and reserved slices (listed by name). In between, a
# unit the cache lacks is found only by its UnitNew. The values of our units change only through
# our writes, a reload (which reads all) or a third party; listing and reading the ~220 pod and
# container units of a 110-pod node every minute was most of the daemon's idle CPU
# (docs/BENCHMARKS.md), and every 10th time it was still the largest part after the kubelet poll
# (1.1 of 3.8 CPU s an hour, natively): at the default interval a third party's change to a pod
# slice or scope is put right within 15 min. Of the units a timer resync lists, only those whose
# cgroup does not show the cached values are read over D-Bus (Observer.refresh_all(trust_kernel)).
FULL_RESYNC_EVERY = 15
LIGHT_LEVELS = frozenset({"node", "qos", "reserved"})
# After a daemon-reload or re-exec, how long systemd is left to settle before we read again.
SYSTEMD_SETTLE = 1.0
# How long a new unit the pod source does not know yet makes us poll it fast (a container scope
# exists a moment before the kubelet reports its ID; init container scopes are never planned).
UNKNOWN_UNIT_PATIENCE = 10.0
# Meanwhile the pod source is asked again after 0.1 s, then 0.2, 0.4, ... up to the poll interval;
# a new unknown unit starts that over. A fetch serves every unit announced before it started, so
# in a burst of new pods the source is asked at most once every FAST_POLL_FIRST seconds.
FAST_POLL_FIRST = 0.1
# After kubelet.service starts, its /pods may not answer for a while (it is still starting): for
# this long, a failed fetch is tried again every KUBELET_START_RETRY seconds, not at the next poll.
KUBELET_START_PATIENCE = 30.0
KUBELET_START_RETRY = 0.25
# What the kubelet writes just after its start is its own (kubelet_gate.kubelets_write): its reset
# of kubepods.slice and the Burstable slice to 0 lands once its container manager starts, seconds
# after the process (its /pods may answer before or after). For this long after the start job
# ended, such a write is the kubelet's start (put back, counted apart), not a foreign write.
KUBELET_START_WINDOW = 120.0
# Until the kubelet answers after its start (its /metrics, its /configz: asked at the first /pods
# that answers), what it writes itself is being decided: a write of its found then that its new
# configuration may make its own is left to it (Companion.hold). For at most
# KUBELET_START_PATIENCE: a kubelet that does not answer is then taken as what its config file and
# its last answers say.
# A pods file is looked at this often for edits (its stat; the source says whether it changed).
SOURCE_WATCH_INTERVAL = 1.0
# The node, QoS and reserved slices' memory.min/low/high are read from their cgroups (a few pread
# calls on descriptors kept open): a value someone else wrote through systemd shows there at once,
# and systemd sends no PropertiesChanged for it (252: the cgroup properties are not marked
# EMITS_CHANGE; e2e 55-foreign-writer records it). A v1.37 kubelet with its own Memory QoS gate on
# and TieredReservation rewrites kubepods.slice MemoryMin and kubepods-burstable.slice MemoryLow
# every minute; at its default policy None, or with the gate off, it writes zeros there once as it
# starts (e2e 58-real-kubelet measured both). So the cgroups are read every
# KERNEL_WATCH_INTERVAL while such a writer may be about: for KERNEL_WATCH_ALERT after a foreign
# write was found, for KERNEL_WATCH_AFTER_KUBELET_START after the kubelet started, and for
# KERNEL_WATCH_AFTER_DRIFT after a cgroup differed; otherwise every KERNEL_WATCH_IDLE. Found within
# that, put back within a round (issue 15's goals: below the plan at most 5 % of the time; back
# within 2 s of a kubelet's start). Each wake costs the loop ~0.1 ms:
# every second for good was +0.9 CPU s an hour idle (bench/idle_profile.py), a quarter of the budget.
KERNEL_WATCH_INTERVAL = 1.0
KERNEL_WATCH_IDLE = 5.0
KERNEL_WATCH_ALERT = 3600.0
KERNEL_WATCH_AFTER_KUBELET_START = 120.0
KERNEL_WATCH_AFTER_DRIFT = 10.0
# The watch also looks at once whenever one of those files is written (an inotify watch on each,
# Cgroupfs.watch_notifier): a write is found within milliseconds, the first after a quiet hour as
# fast as the next, at no cost on an idle node. A drift it finds is re-read from systemd at once,
# then at most every KERNEL_DRIFT_GAP: a writer in a tight loop costs PID 1 at most a re-read and a
# write of each slice this often, while a writer through systemd and then the file (libcontainer's
# Set), whose file write may land after our put-back, leaves the kernel below the plan at most
# this long plus a round (issue 29's goal: no stretch over 2 s).
KERNEL_DRIFT_GAP = 0.5
# How often the loop says it runs: to /livez (metrics.LIVENESS_WINDOW: a DaemonSet's liveness
# probe) and, under WatchdogSec=, to systemd (half its timeout, if shorter: the daemon passes that).
HEARTBEAT_INTERVAL = 10.0


@dataclass(frozen=True)
class Look:
    """When a feature wants a round again (`at`; infinity: not at all) and how long it waited
    last (`wait`): what `follow` keeps between rounds."""

    at: float = float("inf")
    wait: float = 0.0


def follow(look: Look, now: float, following: bool, moved: bool, first: float, most: float) -> Look:
    """A look again that backs off: `first` after a round that `moved` something (or the first
    one `following`), twice as long each time a look found nothing moved, up to `most`; none once
    no longer `following`. A round for another reason before the look is due leaves it standing.
    Pure; a feature keeps the Look and hands its `at` to `Agenda.look_again`."""
    if not following:
        return Look()
    if moved or look.at == float("inf"):
        return Look(now + first, first)
    if now >= look.at:
        wait = min(look.wait * 2, most)
        return Look(now + wait, wait)
    return look


class Tick(enum.StrEnum):
    """Work beside the rounds, each on the agenda's schedule (`Ticks.due`, `Ticks.done`). A tick
    never waits on systemd or the pod source, so a round that does never holds one up."""

    HEARTBEAT = "heartbeat"  # the loop runs: WATCHDOG=1 to systemd, /livez stays 200; at once, then every heartbeat interval
    WATCH = "watch"  # the node, QoS and reserved slices' cgroups read (Cgroupfs.watch): every watch_interval


class Ticks:
    """When each tick is due (pure; `Agenda.ticks`): the heartbeat at once, then every
    `heartbeat_interval`; the watch every KERNEL_WATCH_IDLE, or KERNEL_WATCH_INTERVAL while it
    watches closely (the agenda's events say when: `watch_closely`)."""

    def __init__(self, now: float, heartbeat_interval: float = HEARTBEAT_INTERVAL) -> None:
        self.heartbeat_interval = heartbeat_interval
        self._close_until = float("-inf")  # the upper slices are watched closely until then
        self._at = {Tick.HEARTBEAT: now, Tick.WATCH: now + self.watch_interval(now)}
        self._moved = False  # a tick was brought forward (take_moved)

    def watch_closely(self, now: float, how_long: float) -> None:
        """Look every KERNEL_WATCH_INTERVAL for `how_long` from `now`, starting within one interval
        (not at the idle look already due, up to KERNEL_WATCH_IDLE away)."""
        self._close_until = max(self._close_until, now + how_long)
        if now + KERNEL_WATCH_INTERVAL < self._at[Tick.WATCH]:
            self._at[Tick.WATCH] = now + KERNEL_WATCH_INTERVAL
            self._moved = True

    def take_moved(self) -> bool:
        """Whether a tick was brought forward since this was last asked: the tick loop, asleep until
        the tick due before, is to be woken."""
        moved, self._moved = self._moved, False
        return moved

    def watch_interval(self, now: float) -> float:
        """How long until the upper slices' cgroups are read again (see KERNEL_WATCH_INTERVAL)."""
        return KERNEL_WATCH_INTERVAL if now < self._close_until else KERNEL_WATCH_IDLE

    def due(self, now: float) -> list[Tick]:
        """The ticks whose time has come, in their order."""
        return [t for t in Tick if now >= self._at[t]]

    def done(self, tick: Tick, now: float) -> None:
        """`tick` has been done: when it is due next."""
        wait = self.heartbeat_interval if tick is Tick.HEARTBEAT else self.watch_interval(now)
        self._at[tick] = now + wait

    def timeout(self, now: float) -> float:
        """How long until the next tick is due."""
        return max(min(self._at.values()) - now, 0.0)


class Refresh(enum.IntEnum):
    """What to re-read from systemd before the next round, in order: a merge takes the larger."""

    NONE = 0
    TIMER_LIGHT = 1  # the resync timer, or a drift the watch found: upper slices; a cgroup showing the cache trusted
    LIGHT = 2  # a kubelet start: the slices it rewrites, each read from systemd
    TIMER_FULL = 3  # every FULL_RESYNC_EVERY-th timer resync: every unit; cgroups showing the cache trusted
    FULL = 4  # start, reconnect, daemon-reload, systemd's return, config reload, dropped signals

    @property
    def levels(self) -> frozenset[str] | None:
        """The levels to read (Observer.refresh_all(levels=...)); None: every unit."""
        return LIGHT_LEVELS if self in (Refresh.TIMER_LIGHT, Refresh.LIGHT) else None

    @property
    def trust_kernel(self) -> bool:
        """Whether a unit whose cgroup shows the cached values keeps them without a read."""
        return self in (Refresh.TIMER_LIGHT, Refresh.TIMER_FULL)


@dataclass(frozen=True)
class Due:
    reload: bool = False  # a config reload was asked for (SIGHUP)
    quiet: bool = False  # systemd is reloading or has just come back: no reads, no writes
    resync: bool = False  # the resync timer has come round (node memory is read again too)
    refresh: Refresh = Refresh.NONE  # what to re-read from systemd first
    fetch: bool = False  # ask the pod source


class Agenda:
    """Events and timers of one daemon. Times are the daemon's clock (monotonic seconds)."""

    def __init__(self, *, resync_interval: float, poll_interval: float, watch_source: bool = False,
                 heartbeat_interval: float = HEARTBEAT_INTERVAL, now: float = 0.0):
        self.resync_interval = resync_interval
        self.poll_interval = poll_interval
        self.watch_source = watch_source  # the pod source can say it changed (a pods file)
        self._reload = False
        self._reloading = False  # between systemd's Reloading(true) and Reloading(false)
        self._pending = Refresh.FULL  # at start, everything is read from systemd
        self._light_resyncs = 0  # resyncs since the last full one
        self._next_resync = 0.0
        self._quiet_until = 0.0
        self._want_fetch = True
        self._source_changed = False
        self._next_poll = 0.0
        self._fetch_started = float("-inf")
        self._fetch_ended = float("-inf")
        self._fetch_failing = False
        self._fast_poll = FAST_POLL_FIRST
        self._kubelet_started = float("-inf")
        self._drift_asked = float("-inf")  # when a drift the watch found was last re-read
        self._drift_at = float("inf")  # when a drift found since is due to be re-read
        # New pod/container units the pod source has not described yet -> when we stop asking.
        self._unknown: dict[str, float] = {}
        self._unknown_new = False  # one came since the last fetch started
        self._new: set[str] = set()  # UnitNew: read state and properties
        self._started: set[str] = set()  # JobRemoved: read the state again
        self.ticks = Ticks(now, heartbeat_interval)  # the work beside the rounds
        self._looks: dict[str, float] = {}  # feature -> when it asked for a round again (look_again)
        # Ask the kubelet whether its own Memory QoS is on (companion mode) at the next fetch that
        # succeeds: at start, after a config reload, after the kubelet (re)started.
        self._ask_kubelet = True
        self._kubelet_start_seen = False  # a kubelet start not yet taken (take_kubelet_start)
        self._deciding = False  # the kubelet started and has not answered since (deciding)

    # ---- events ---------------------------------------------------------------------------
    def unit_new(self, name: str, level: str, now: float, planned: bool) -> None:
        """A unit of ours was loaded. `planned`: the last plan names it (True while no plan yet)."""
        self._new.add(name)
        if level in ("pod", "container") and not planned:
            # The kubelet has not told us about it yet: ask now, and again soon.
            self._unknown[name] = now + UNKNOWN_UNIT_PATIENCE
            self._unknown_new = True

    def unit_removed(self, name: str, level: str) -> None:
        self._unknown.pop(name, None)
        self._new.discard(name)
        self._started.discard(name)
        if level == "pod":
            self._want_fetch = True  # a pod kept only because its slice ran can go now

    def job_done(self, name: str) -> None:
        """A start job of a unit of ours ended: UnitNew comes when a unit is loaded, before it
        runs, and a pod or container unit is only written once it runs: look at its state again."""
        self._started.add(name)

    def kubelet_started(self, now: float) -> None:
        """What a kubelet start rewrites are the kubepods and QoS slices (docs/PACKAGING.md): those
        are read again from systemd, and the pods. Its pod slices and scopes come and go with
        UnitNew/UnitRemoved: re-reading them all cost a GetAll per unit in PID 1's queue at the
        moment a node's pods start (issue 6), and drift on them is found by the full resync."""
        self._kubelet_started = now
        self._ask_kubelet = True  # it may have come back with its Memory QoS gate flipped
        self._kubelet_start_seen = self._deciding = True
        self._pending = max(self._pending, Refresh.LIGHT)
        self._want_fetch = True
        self.ticks.watch_closely(now, KERNEL_WATCH_AFTER_KUBELET_START)

    def systemd_changing(self, active: bool, now: float) -> None:
        """systemd's Reloading(active). While it reloads, units read back half-loaded (defaults, or
        not loaded at all): nothing is read or written until it is done and has settled; then
        every unit is read from systemd. A reload that never reports its end still ends at the
        next resync (a lost Reloading(false) must not stop us for good)."""
        self._reloading = active
        if active:
            self._quiet_until = now + self.resync_interval
        else:
            self._quiet_until = now + SYSTEMD_SETTLE
            self.reread()

    def systemd_returned(self, now: float) -> None:
        """systemd is back on the bus (re-executed): like the end of a reload."""
        self.systemd_changing(False, now)

    def overflow(self) -> None:
        """systemd's unit signals came faster than they were handled; some were dropped."""
        self.reread()
        self._want_fetch = True

    def connected(self) -> None:
        """A new connection to systemd: what it holds is read afresh."""
        self.reread()

    def reread(self, kind: Refresh = Refresh.FULL) -> None:
        """Re-read what systemd holds before the next round (every unit, from systemd, by default)."""
        self._pending = max(self._pending, kind)

    def foreign_write(self, now: float) -> None:
        """A read found a unit holding what someone else wrote: watch closely for a while."""
        self.ticks.watch_closely(now, KERNEL_WATCH_ALERT)

    def kernel_drift(self, now: float) -> None:
        """A node, QoS or reserved slice's cgroup no longer shows what the cache holds for it:
        someone wrote it through systemd. Re-read the slices as the resync timer does: only those
        whose cgroup differs from the cache are read from systemd (the others showed what systemd
        held, and still do), so the next diff puts ours back; and look again soon. (Reading all
        five from systemd made the count of reads depend on whether the watch or the timer saw the
        write first: e2e 32-resync-kernel, CI of stop 23.) At once, unless one was asked less than
        KERNEL_DRIFT_GAP ago: then at that much after it."""
        if now >= self._drift_asked + KERNEL_DRIFT_GAP:
            self._drift_asked = now
            self.reread(Refresh.TIMER_LIGHT)
        else:
            self._drift_at = min(self._drift_at, self._drift_asked + KERNEL_DRIFT_GAP)
        self.ticks.watch_closely(now, KERNEL_WATCH_AFTER_DRIFT)

    def look_again(self, looks: Mapping[str, float]) -> None:
        """Features (features.looks) ask for a round each at its time (infinity: none): the last
        one each asked for is replaced. A round may come earlier, for another reason."""
        for feature, at in looks.items():
            if at == float("inf"):
                self._looks.pop(feature, None)
            else:
                self._looks[feature] = at

    def resync_now(self) -> None:
        """The resync timer comes round at the next step (the next deadline counts from then)."""
        self._next_resync = float("-inf")

    def reload_asked(self) -> None:
        self._reload = True

    def reload_taken(self) -> None:
        self._reload = False

    def config_changed(self, now: float, *, resync_interval: float, poll_interval: float,
                       watch_source: bool, source_changed: bool) -> None:
        """A config reload took effect: every unit is read again, the pods too if their source
        changed. A shorter resyncInterval counts from now: the deadline set with the old one could
        be up to that interval away (60 s by default; measured in the VM, 32-resync-kernel)."""
        self.resync_interval, self.poll_interval, self.watch_source = resync_interval, poll_interval, watch_source
        self._next_resync = min(self._next_resync, now + resync_interval)
        self.reread()
        self._ask_kubelet = True
        if source_changed:
            self._want_fetch = True

    def ask_kubelet(self) -> bool:
        """Whether to ask the kubelet what it writes itself now (after a fetch that succeeded: it
        answers): once after start, each config reload and each kubelet start. Taken when asked."""
        asked, self._ask_kubelet = self._ask_kubelet, False
        return asked

    def ask_again(self) -> None:
        """The kubelet did not answer what it writes itself while its mode is being decided: ask at
        the next fetch, KUBELET_START_RETRY after this one (_retry_at)."""
        self._ask_kubelet = True

    def take_kubelet_start(self) -> bool:
        """Whether the kubelet has started since this was last asked (its config file is read
        again then: Companion.kubelet_started). Taken when asked."""
        seen, self._kubelet_start_seen = self._kubelet_start_seen, False
        return seen

    def kubelet_answered(self) -> None:
        """The kubelet was asked what it writes itself since its start: its mode is decided."""
        self._deciding = False

    def deciding(self, now: float) -> bool:
        """Whether the kubelet has started and not answered yet (for at most KUBELET_START_PATIENCE):
        a write of its found now may be its own under a configuration not known yet."""
        return self._deciding and now < self._kubelet_started + KUBELET_START_PATIENCE

    def kubelet_starting(self, now: float) -> bool:
        """Whether the kubelet started less than KUBELET_START_WINDOW ago: a reset found now is its start's."""
        return now < self._kubelet_started + KUBELET_START_WINDOW

    def source_changed(self) -> None:
        """The pod source says its document changed (a pods file edited)."""
        self._source_changed = True

    def fetch_now(self) -> None:
        """Ask the pod source at the next step (also: a pod list fetched while the cache was in
        doubt, asked for again after the re-read)."""
        self._want_fetch = True

    # ---- what is due ----------------------------------------------------------------------
    def due(self, now: float) -> Due:
        resync = now >= self._next_resync
        pending = max(self._pending, Refresh.TIMER_LIGHT) if now >= self._drift_at else self._pending
        return Due(reload=self._reload, quiet=now < self._quiet_until, resync=resync,
                   refresh=max(pending, self._timer_refresh()) if resync else pending,
                   fetch=self._fetch_due(now))

    def _timer_refresh(self) -> Refresh:
        return Refresh.TIMER_FULL if self._light_resyncs + 1 >= FULL_RESYNC_EVERY else Refresh.TIMER_LIGHT

    def _fetch_due(self, now: float) -> bool:
        return (self._want_fetch or self._source_changed or now >= self._next_poll
                or now >= self._fast_poll_at() or now >= self._retry_at(now))

    def _fast_poll_at(self) -> float:
        """When to ask the pod source about units it has not described yet."""
        if not self._unknown:
            return float("inf")
        if self._unknown_new:
            return self._fetch_started + FAST_POLL_FIRST  # at once, unless a fetch has just started
        return self._fetch_started + self._fast_poll

    def _retry_at(self, now: float) -> float:
        """When to ask a kubelet that has just started, and did not answer (its /pods, or what it
        writes itself while that is being decided), again."""
        if ((self._fetch_failing or (self._ask_kubelet and self._deciding))
                and now < self._kubelet_started + KUBELET_START_PATIENCE):
            return self._fetch_ended + KUBELET_START_RETRY
        return float("inf")

    def timeout(self, now: float) -> float:
        """How long the daemon may sleep before something is due (an event wakes it earlier)."""
        wake = min(self._next_poll, self._next_resync, self._fast_poll_at(), self._retry_at(now), self._drift_at,
                   self._decided_at(now), *self._looks.values())
        if self.watch_source:
            wake = min(wake, now + SOURCE_WATCH_INTERVAL)
        if now < self._quiet_until:
            wake = min(wake, self._quiet_until)
        return max(wake - now, 0.0)

    def _decided_at(self, now: float) -> float:
        """When the kubelet's patience ends while it is being decided (a look then: Companion.release)."""
        end = self._kubelet_started + KUBELET_START_PATIENCE
        return end if self._deciding and now < end else float("inf")

    def in_doubt(self, now: float) -> bool:
        """Whether the cache may lack units systemd holds until the next full re-read: systemd is
        reloading or has just come back, or signals were dropped. Asked by a step that awaited (the
        pods, reads) after its own re-read: what it took from the cache meanwhile (a pod list's
        carry-over, a diff) waits for the next."""
        return now < self._quiet_until or self._pending is Refresh.FULL

    @property
    def systemd_reloading(self) -> bool:
        """systemd said it is reloading and has not said it is done."""
        return self._reloading

    @property
    def unknown_units(self) -> frozenset[str]:
        """New pod and container units the pod source has not described yet (asked about soon)."""
        return frozenset(self._unknown)

    def has_units(self) -> bool:
        """Units announced (UnitNew, JobRemoved) and not read yet."""
        return bool(self._new or self._started)

    # ---- taking work, and putting back what a failed step did not do ------------------------
    def take_refresh(self, now: float) -> tuple[Refresh, frozenset[str]]:
        """The re-read to do now (the resync timer's, if it has come round, merged in), and the
        announced units it serves: a full re-read from systemd reads every unit announced before it
        started (a daemon-reload announces them all just before its re-read; reading each again in
        the round cost a second GetAll per unit). One announced while it awaits stays queued. (A
        trusting re-read may keep a cached unit unread, so it serves none.)"""
        if now >= self._next_resync:
            self._pending = max(self._pending, self._timer_refresh())
            self._next_resync = now + self.resync_interval
        if now >= self._drift_at:
            self._pending = max(self._pending, Refresh.TIMER_LIGHT)
            self._drift_asked, self._drift_at = now, float("inf")
        kind, self._pending = self._pending, Refresh.NONE
        served = frozenset(self._new) if kind is Refresh.FULL else frozenset()
        self._new -= served
        return kind, served

    def put_back_refresh(self, kind: Refresh, served: Iterable[str] = ()) -> None:
        self._pending = max(self._pending, kind)
        self._new |= set(served)

    def refreshed(self, kind: Refresh) -> None:
        """A re-read of `kind` has been done."""
        if kind >= Refresh.TIMER_FULL:
            self._light_resyncs = 0
        elif kind is not Refresh.NONE:
            self._light_resyncs += 1

    def take_units(self) -> tuple[set[str], set[str]]:
        """(units announced new, units whose start job ended) not read yet, for this round. Taken
        before the round awaits: one announced meanwhile stays queued for the next."""
        new, started = self._new, self._started
        self._new, self._started = set(), set()
        return new, started

    def put_back_units(self, new: Iterable[str], started: Iterable[str]) -> None:
        """Units of a round that did not read them (a failed read, a round dropped): read next time."""
        self._new |= set(new)
        self._started |= set(started)

    def fetch_started(self, now: float) -> None:
        """A fetch serves every unit announced so far. Fast polls for unknown units back off only
        while nothing new arrives: in a burst every pod brings new ones."""
        self._want_fetch = self._source_changed = False
        self._fetch_started = now
        if self._unknown_new:
            self._fast_poll = FAST_POLL_FIRST
        elif self._unknown:
            self._fast_poll = min(self._fast_poll * 2, self.poll_interval)
        self._unknown_new = False

    def fetch_ended(self, now: float, ok: bool) -> None:
        self._fetch_failing = not ok
        self._fetch_ended = now
        self._next_poll = now + self.poll_interval

    @property
    def fetch_failing(self) -> bool:
        return self._fetch_failing

    def planned(self, names: Collection[str], now: float) -> None:
        """A plan names these units: they are no longer unknown; nor is one asked about too long."""
        if self._unknown:
            self._unknown = {n: t for n, t in self._unknown.items() if n not in names and t > now}
