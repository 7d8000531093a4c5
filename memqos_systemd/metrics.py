"""Prometheus metrics. The only module that imports prometheus_client.

`Metrics` owns a private CollectorRegistry (never the global default one), so
tests and a reloaded daemon can each have their own. The daemon calls:

    m = Metrics()
    m.set_plan(plan, cgroupfs, config.metrics)  # after every new plan: its series, and the cgroups' signals
    m.observe_reconcile(seconds, changes) # after every reconcile
    m.dbus_call("SetUnitProperties", "ok")
    m.source_ok(snapshot) / m.source_error(err.kind)   # SourceError.kind
    m.config_reload(ok)
    m.foreign_write(level, writer)        # someone else's value found (and put back)
    m.kubelet_reset(level, moment)        # the kubelet's reset at its start, or of a container (put back)
    m.round_state(drifted, holding)       # after every round
    m.set_ready()                         # first reconcile applied: /readyz turns 200
    m.heartbeat()                         # the loop runs: /livez 200 for LIVENESS_WINDOW
    server = m.serve(config.metrics.listen); ...; server.close()

A scrape is three parts, in this order:

* the registry, rendered by prometheus_client: the daemon's own counters, gauges and histogram
  (a few dozen series) and the process metrics (`process_cpu_seconds_total`, ...);
* the plan's series, written as text once per plan (`_plan_text`, at the first scrape after it):
  the node's protection, the pods by QoS class, the desired values of the node, QoS and reserved
  slices (of every pod slice and container scope too with metrics.perUnit), and the snapshot's age;
* the kernel's signals (signals.py): the pod and QoS slices' (and with perUnit the container
  scopes') memory.events, memory.pressure and memory.current, read at each scrape and never in
  between (no scraper, no reads), with their labels made once per plan. A pod's series go when
  the plan drops the pod or its cgroup is gone. Then what the kernel protects now of each QoS
  class and what of it a parent lends (signals.ProtectionView, effective.py).

Writing the per-plan and per-pod families as text is what keeps a scrape near the cost of only
reading the files (docs/BENCHMARKS.md, "What a scrape costs"): prometheus_client spends ~7 µs a
sample, a preformatted line well under 1 µs. The page is the text format 0.0.4, uncompressed
whatever the scraper accepts (compressing it would cost more CPU than the scrape itself).
"""

from __future__ import annotations

import logging
import resource
import selectors
import socket
import socketserver
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from . import __version__
from .cgroupfs import Cgroupfs, KeptFiles
from .config_schema import MetricsConfig
from .drift import WRITERS
from .hosts import is_loopback
from .plan import LEVELS, Plan
from .quantity import UINT64_MAX
from .signals import SignalView, header, qos_class_of, sample

__all__ = ["Metrics", "NoMetrics", "MetricsServer", "parse_listen", "QOS_CLASSES"]

log = logging.getLogger(__name__)

QOS_CLASSES = ("Guaranteed", "Burstable", "BestEffort")
_PROPERTIES = (("MemoryMin", "memory_min"), ("MemoryLow", "memory_low"), ("MemoryHigh", "memory_high"))
_UPPER = ("node", "reserved", "qos")  # the levels memqos_unit_desired_bytes always has
# Reconciles are a handful of D-Bus calls: milliseconds normally, seconds when systemd is slow.
_RECONCILE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_AGE = header("memqos_source_snapshot_age_seconds", "gauge", "Seconds since the last good pod snapshot was fetched")


def _value(n: int | float) -> str:
    """A value as the text format writes it: bytes at or past UINT64_MAX are +Inf (systemd's infinity)."""
    return "+Inf" if n >= UINT64_MAX else str(n)


def _plan_text(plan: Plan, settings: MetricsConfig) -> bytes:
    """The plan's own series, written once per plan."""
    per_unit = settings.per_pod and settings.per_unit
    desired = [sample("memqos_unit_desired_bytes", (("unit", u.unit), ("level", u.level), ("property", prop)),
                      _value(getattr(u, attr)))
               for u in plan.units if per_unit or u.level in _UPPER for prop, attr in _PROPERTIES]
    pods = {q: 0 for q in QOS_CLASSES}
    for u in plan.units:
        if u.level == "pod":
            pods[qos_class_of(u)] += 1
    node = plan.node_unit()
    out = [header("memqos_unit_desired_bytes", "gauge", "Desired memory property of a unit we manage (+Inf:"
                  " infinity); the node, QoS and reserved slices (every unit with metrics.perUnit)"),
           b"\n".join(desired) + b"\n"]
    for name, help_, value in (
            ("memqos_node_memory_min_bytes", "MemoryMin of the node's kubepods slice", node.memory_min),
            ("memqos_node_memory_low_bytes", "MemoryLow of the node's kubepods slice", node.memory_low),
            ("memqos_node_capacity_bytes", "Node memory capacity (MemTotal) the plan used", plan.capacity),
            ("memqos_node_allocatable_bytes", "Node Allocatable memory the plan used", plan.allocatable),
            ("memqos_plan_warnings", "Warnings the last plan produced", len(plan.warnings))):
        out += [header(name, "gauge", help_), sample(name, (), _value(value)) + b"\n"]
    out.append(header("memqos_pods", "gauge", "Pods in the plan by QoS class"))
    out += [sample("memqos_pods", (("qos_class", q),), str(n)) + b"\n" for q, n in pods.items()]
    return b"".join(out)


# /livez answers 503 once the daemon's loop has not beaten (`heartbeat`, every
# agenda.HEARTBEAT_INTERVAL) for this long: a DaemonSet's liveness probe then restarts it, as
# WatchdogSec= does for the packaged unit. Generous: a daemon starved by a neighbour allocating
# until the OOM killer acts (its reads 8-12 s apart before it was protected, docs/BENCHMARKS.md)
# recovers when the killer has acted; a restart would not help it.
LIVENESS_WINDOW = 60.0


class Metrics:
    """All metrics of one daemon, on a private registry."""

    def __init__(self, registry: CollectorRegistry | None = None, *, version: str = __version__,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time):
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._clock = clock
        self._wall = wall_clock
        # The plan to show: (plan, its units' cgroups or None, the config's metrics settings,
        # whether the cgroup2 mount has memory_recursiveprot: None when not known).
        self._shown: tuple[Plan, Mapping[str, Path] | None, MetricsConfig, bool | None] | None = None
        # What the first scrape after a new plan makes of it, under _files.lock: (the _shown it
        # was made from, _plan_text, the SignalView of its cgroups or None).
        self._made: tuple[tuple | None, bytes, SignalView | None] = (None, b"", None)
        self._files = KeptFiles()  # the files a scrape reads, open from one scrape to the next
        self._last_success: float | None = None
        self._ready = False
        self._beat = clock()  # alive from the start (the first beat comes once the loop starts)
        r = self.registry
        self._build = Gauge("memqos_build_info", "memqos-systemd build information", ["version"], registry=r)
        self._build.labels(version=version).set(1)
        self._reconcile_seconds = Histogram("memqos_reconcile_duration_seconds",
                                            "Time to plan, diff and apply one reconcile",
                                            buckets=_RECONCILE_BUCKETS, registry=r)
        self._reconcile_changes = Counter("memqos_reconcile_changes",
                                          "Unit property changes sent to systemd", registry=r)
        self._last_reconcile = Gauge("memqos_last_reconcile_timestamp_seconds",
                                     "Unix time of the last finished reconcile", registry=r)
        self._dbus = Counter("memqos_dbus_calls", "D-Bus calls to systemd by method and result",
                             ["method", "result"], registry=r)
        self._source_errors = Counter("memqos_source_errors", "Pod source failures by kind (last good"
                                      " snapshot kept)", ["kind"], registry=r)
        self._source_success = Gauge("memqos_source_last_success_timestamp_seconds",
                                     "Unix time of the last good pod snapshot", registry=r)
        self._config_reloads = Counter("memqos_config_reloads", "Config reloads (SIGHUP) by result",
                                       ["result"], registry=r)
        self._signal_overflows = Counter("memqos_signal_overflows",
                                         "Times systemd's unit signals came faster than they were handled and"
                                         " some were dropped (each followed by a full re-read)", registry=r)
        self._foreign_writes = Counter("memqos_foreign_writes",
                                       "Times a unit of ours was found holding values someone else wrote, by the"
                                       " unit's level and the writer's kind: systemd (through systemd: the kubelet's own"
                                       " Memory QoS, systemctl set-property) or cgroupfs (to the cgroup file alone);"
                                       " each put back through systemd, the unit named in the journal",
                                       ["level", "writer"], registry=r)
        self._kubelet_resets = Counter("memqos_kubelet_resets",
                                       "Times the kubelet was found writing over a value of ours at one of its moments,"
                                       " each put back through systemd, by the unit's level and the moment: start (its"
                                       " start resets kubepods.slice and the Burstable slice to 0; under TieredReservation"
                                       " its own values are put back until its round counts the pods) or create (a container's values as it creates or resizes"
                                       " it); never a foreign write nor a fight", ["level", "moment"], registry=r)
        self._oom_group_restores = Counter("memqos_oom_group_restores",
                                           "memory.oom.group put back to the runtime's 1 after systemd re-applied a"
                                           " container scope's settings (a write of ours, a daemon-reload), by result",
                                           ["result"], registry=r)
        self._drifted = Gauge("memqos_units_drifted", "Units whose values differ from the plan after the last"
                              " round: held back while holding, a write that failed or is still to come",
                              registry=r)
        self._holding = Gauge("memqos_holding", "1 while the daemon holds (sends only raising values: no pod"
                              " snapshot yet, or a suspect empty one); the reason is in the journal and"
                              " `status`", registry=r)
        self._families: dict[str, Gauge] = {}  # the features' own (declare)
        self._companion = Gauge("memqos_companion_mode", "1 while the service stands beside the kubelet's own Memory"
                                " QoS (its MemoryQoS gate on, or companion: on) and writes none of what the kubelet"
                                " writes as its own; 0 while every value is ours", registry=r)
        self._kubelet_protects = Gauge("memqos_kubelet_protects", "1 while the kubelet writes the pods' MemoryMin"
                                       " and MemoryLow itself (its gate on and memoryReservationPolicy"
                                       " TieredReservation, or one this version does not know); 0 while the"
                                       " service does (or nobody: memqos-systemd check says)", registry=r)
        ProcessCollector(registry=r)

    # ---------------------------------------------------------------- plan

    def set_plan(self, plan: Plan, cgroupfs: Cgroupfs | None = None,
                 settings: MetricsConfig = MetricsConfig()) -> None:
        """Serve this plan: its own series (desired values, node protection, pods by QoS class)
        and, with `cgroupfs` (where its units' cgroups are), at each scrape the signals of its
        pod slices, QoS slices and container scopes (signals.py), as `settings` (the config's
        `metrics:`) asks: per pod unless perPod is false, per unit only with perUnit; and what the
        kernel protects now per QoS class, with the mount's memory_recursiveprot read once a plan."""
        self._shown = (plan, None if cgroupfs is None else cgroupfs.place(plan.cgroup_paths), settings,
                       None if cgroupfs is None else cgroupfs.recursive_protection())

    def round_state(self, drifted: int, holding: bool) -> None:
        """After a round: how many units differ from the plan, and whether the daemon holds."""
        self._drifted.set(drifted)
        self._holding.set(1 if holding else 0)

    # ---------------------------------------------------------------- reconcile / D-Bus

    def observe_reconcile(self, seconds: float, changes: int) -> None:
        self._reconcile_seconds.observe(max(0.0, seconds))
        if changes > 0:
            self._reconcile_changes.inc(changes)
        self._last_reconcile.set(self._wall())

    def dbus_call(self, method: str, result: str) -> None:
        """result: "ok", or a short error name ("NoSuchUnit", "timeout", "error", ...)."""
        self._dbus.labels(method=method, result=result).inc()

    # ---------------------------------------------------------------- source

    def source_success(self, fetched_at: float | None = None) -> None:
        """A good snapshot arrived; `fetched_at` is its time on this object's clock (monotonic)."""
        self._last_success = self._clock() if fetched_at is None else fetched_at
        self._source_success.set(self._wall())

    def source_ok(self, snapshot: Any = None) -> None:
        """Same as source_success, given the Snapshot itself (its fetched_at is used)."""
        self.source_success(getattr(snapshot, "fetched_at", None))

    def source_error(self, kind: str) -> None:
        """kind: SourceError.kind ("connect", "timeout", "tls", "auth", "http", "too_large",
        "decode", "pods", "io"), or any short word for other failures."""
        self._source_errors.labels(kind=kind).inc()

    # ---------------------------------------------------------------- config

    def config_reload(self, ok: bool) -> None:
        """A SIGHUP reload: ok=False when the new config was refused (the old one stays)."""
        self._config_reloads.labels(result="ok" if ok else "refused").inc()

    def signal_overflow(self) -> None:
        """Unit signals were dropped (Systemd's queue was full); a full re-read follows."""
        self._signal_overflows.inc()

    def foreign_write(self, level: str, writer: str) -> None:
        """Someone else changed a unit of ours at `level` (plan.LEVELS: node, qos, reserved, pod,
        container), through systemd or to its cgroup file alone (`writer`: drift.WRITERS);
        it is put back. Anything else is counted as "other": the series stay a fixed, small set."""
        self._foreign_writes.labels(level=level if level in LEVELS else "other",
                                    writer=writer if writer in WRITERS else "other").inc()

    def kubelet_reset(self, level: str, moment: str) -> None:
        """The kubelet wrote over a value of ours at `level` at one of its `moment`s ("start",
        "create"; kubelet_gate.kubelets_write); it is put back."""
        self._kubelet_resets.labels(level=level if level in LEVELS else "other",
                                    moment=moment if moment in ("start", "create") else "other").inc()

    def oom_group_restored(self, ok: bool) -> None:
        """memory.oom.group of a container scope put back to 1 (ok), or the write failed."""
        self._oom_group_restores.labels(result="ok" if ok else "error").inc()

    def companion(self, on: bool, protects: bool = False) -> None:
        """Whether the service is in companion mode (kubelet_gate.companion_mode), and whether the
        kubelet then writes the pods' protection itself (kubelet_gate.Writes.protects)."""
        self._companion.set(1 if on else 0)
        self._kubelet_protects.set(1 if protects else 0)

    def declare(self, families: Iterable[Any]) -> None:
        """The metric families the features set (feature.Family: name, help, labels), each made once."""
        for f in families:
            if f.name not in self._families:
                self._families[f.name] = Gauge(f.name, f.help, list(f.labels), registry=self.registry)

    def gauge(self, name: str, labels: tuple[str, ...], value: float | None) -> None:
        """A feature's gauge (declared) set to `value`; None: its series goes."""
        family = self._families[name]
        if value is None:
            if labels:
                try:
                    family.remove(*labels)
                except KeyError:
                    pass
            return
        (family.labels(*labels) if labels else family).set(value)

    # ---------------------------------------------------------------- serving

    def set_ready(self) -> None:
        """The first reconcile is applied: /readyz answers 200 from now on (a DaemonSet's
        readiness probe, so a rolling update waits for each node to be protected again)."""
        self._ready = True

    def heartbeat(self) -> None:
        """The daemon's loop runs: /livez answers 200 for LIVENESS_WINDOW from now."""
        self._beat = self._clock()

    def _probe(self, path: str | None) -> tuple[bool, str] | None:
        """A probe's answer (ok, text), or None if `path` is not a probe's."""
        if path == "/readyz":
            return (True, "ready") if self._ready else (False, "not ready: first reconcile not applied yet")
        if path == "/livez":
            # The age in both answers: how late the loop runs is what a starved daemon shows first
            # (the protection benchmark samples it, bench/guest/health.py).
            age = self._clock() - self._beat
            if age <= LIVENESS_WINDOW:
                return True, f"alive: the daemon's loop last ran {age:.1f} s ago"
            return False, f"not alive: the daemon's loop last ran {age:.0f} s ago"
        return None

    def render(self) -> bytes:
        """The page a scrape gets: the registry's families, the plan's and the kernel's signals."""
        last = self._last_success
        age = b"" if last is None else _AGE + sample("memqos_source_snapshot_age_seconds", (),
                                                     repr(max(0.0, self._clock() - last))) + b"\n"
        registry = generate_latest(self.registry)
        with self._files.lock:  # one scrape at a time reads (a second one waits: its page is as fresh)
            plan_text, signals = self._made_of(self._shown)
            return b"".join((registry, plan_text, age, b"" if signals is None else signals.text(self._files)))

    def _made_of(self, shown: tuple | None) -> tuple[bytes, SignalView | None]:
        """The plan's text and signal view, made at the first scrape after set_plan: a burst of
        plans between two scrapes costs one, and a node nobody scrapes none. The descriptors of
        files the new view does not read are closed."""
        made = self._made
        if made[0] is not shown:
            plan_text, signals = b"", None
            if shown is not None:
                plan, dirs, settings, recursive = shown
                plan_text = _plan_text(plan, settings)
                if dirs is not None:
                    signals = SignalView.of(plan, dirs, per_pod=settings.per_pod, per_unit=settings.per_unit,
                                            recursive=recursive, page_size=resource.getpagesize())
            self._files.keep_only(() if signals is None else signals.paths)
            made = self._made = (shown, plan_text, signals)
        return made[1], made[2]

    def serve(self, listen: str) -> "MetricsServer":
        """Serve /metrics, /readyz (503 until `set_ready`, then 200) and /livez (503 when no
        `heartbeat` came for LIVENESS_WINDOW), on HOST:PORT (port 0:
        any free port; see .port). Binds exactly what is given; the config's default is
        127.0.0.1:9759. Raises OSError if it cannot bind."""
        host, port = parse_listen(listen)

        def app(environ, start_response):
            probe = self._probe(environ.get("PATH_INFO"))
            if probe is None:
                try:
                    page = self.render()
                except Exception as e:  # one journal line and a 500, never a traceback (the scraper retries)
                    log.error("metrics: cannot make the page: %s: %s", type(e).__name__, e)
                    start_response("500 Internal Server Error", [("Content-Type", "text/plain; charset=utf-8")])
                    return [b"cannot make the page; the journal says why\n"]
                start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST), ("Content-Length", str(len(page)))])
                return [page]
            ok, text = probe
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain; charset=utf-8")])
            return [f"{text}\n".encode()]

        server = MetricsServer(app, host, port)
        if not is_loopback(host):
            log.warning("metrics: serving on %s, which is not a loopback address (as configured)", listen)
        return server


class NoMetrics:
    """Metrics that go nowhere, for a daemon with no endpoint and for tests: the same calls as
    `Metrics`, each doing nothing, so no caller asks `if metrics:` (a null object, as the
    kubelet's qosContainerManagerNoop). tests/unit/test_metrics.py keeps the two in step."""

    def set_plan(self, plan: Plan, cgroupfs: Cgroupfs | None = None,
                 settings: MetricsConfig = MetricsConfig()) -> None: pass
    def round_state(self, drifted: int, holding: bool) -> None: pass
    def set_ready(self) -> None: pass
    def heartbeat(self) -> None: pass
    def observe_reconcile(self, seconds: float, changes: int) -> None: pass
    def dbus_call(self, method: str, result: str) -> None: pass
    def source_success(self, fetched_at: float | None = None) -> None: pass
    def source_ok(self, snapshot: Any = None) -> None: pass
    def source_error(self, kind: str) -> None: pass
    def config_reload(self, ok: bool) -> None: pass
    def signal_overflow(self) -> None: pass
    def foreign_write(self, level: str, writer: str) -> None: pass
    def kubelet_reset(self, level: str, moment: str) -> None: pass
    def oom_group_restored(self, ok: bool) -> None: pass
    def declare(self, families: Iterable[Any]) -> None: pass
    def gauge(self, name: str, labels: tuple[str, ...], value: float | None) -> None: pass
    def companion(self, on: bool, protects: bool = False) -> None: pass


def parse_listen(listen: str) -> tuple[str, int]:
    """'127.0.0.1:9759' / '[::1]:9759' / 'localhost:0' -> (host, port). ValueError otherwise."""
    host, sep, port = str(listen).rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"metrics.listen: {listen!r} must be HOST:PORT (e.g. 127.0.0.1:9759)")
    return host, int(port)


class _SilentHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the stdlib's name
        pass


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class MetricsServer:
    """A running /metrics endpoint on its own thread; `close()` stops it and frees the port.

    The thread sleeps until a client connects or `close()` wakes it through a socket pair: the
    stdlib's serve_forever() wakes every poll interval to look for a shutdown, and at 0.1 s that
    was 1.5 CPU s per hour on an idle node, 40 % of the daemon's idle goal (bench/idle_profile.py).
    """

    def __init__(self, app: Callable, host: str, port: int):
        """Serve the WSGI `app` (`Metrics.serve` builds it) on HOST:PORT."""
        family = socket.AF_INET
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            family = infos[0][0]
        except socket.gaierror as e:
            raise OSError(f"metrics.listen: cannot resolve {host!r}: {e.strerror}") from None

        class Server(_ThreadingServer):
            address_family = family

        self._httpd = make_server(host, port, app, Server, handler_class=_SilentHandler)
        self.host = host
        self.port = self._httpd.server_address[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._serve, name="memqos-metrics", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._httpd, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while True:
                for key, _ in selector.select():
                    if key.fileobj is self._wake_r:
                        return
                    # What serve_forever() does for a ready socket: accept, and hand the
                    # request to a thread of its own (ThreadingMixIn).
                    self._httpd._handle_request_noblock()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        if self._thread.is_alive():
            self._wake_w.send(b"\0")
            self._thread.join(timeout=5)
        self._httpd.server_close()
        self._wake_r.close()
        self._wake_w.close()

