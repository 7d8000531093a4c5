"""Prometheus metrics. The only module that imports prometheus_client.

`Metrics` owns a private CollectorRegistry (never the global default one), so
tests and a reloaded daemon can each have their own. The daemon calls:

    m = Metrics()
    m.set_plan(plan)                      # after every plan
    m.observe_reconcile(seconds, changes) # after every reconcile
    m.dbus_call("SetUnitProperties", "ok")
    m.source_ok(snapshot) / m.source_error(err.kind)   # SourceError.kind
    m.config_reload(ok)
    m.throttle_events(scope_unit, memory_events["high"])
    m.set_plan(plan, cgroupfs)            # with the cgroups: the pod and QoS slice series
    m.round_state(drifted, holding)       # after every round
    m.set_ready()                         # first reconcile applied: /readyz turns 200
    m.heartbeat()                         # the loop runs: /livez 200 for LIVENESS_WINDOW
    server = m.serve(config.metrics.listen); ...; server.close()

The pod and QoS slices' memory.events, memory.pressure and memory.current are read at each
scrape (`_Cgroups`, through cgroupfs.py), never in between: no scraper, no reads (see
docs/BENCHMARKS.md, "Protection signals"). A pod's series go when the plan drops the pod or its
cgroup is gone.

Values that are replaced wholesale (the plan's units, the throttle counts, the
snapshot age) are served by one custom collector from immutable snapshots, so a
scrape never sees half of an update.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import selectors
import socket
import socketserver
import threading
import time
from typing import Any, Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.samples import Sample

from . import __version__
from .cgroupfs import read_memory_events, read_pressure, read_value
from .quantity import UINT64_MAX

__all__ = ["Metrics", "NoMetrics", "MetricsServer", "parse_listen", "QOS_CLASSES"]

log = logging.getLogger(__name__)

QOS_CLASSES = ("Guaranteed", "Burstable", "BestEffort")
_PROPERTIES = (("MemoryMin", "memory_min"), ("MemoryLow", "memory_low"), ("MemoryHigh", "memory_high"))
# memory.events keys exported per pod (the kernel's file also has oom_group_kill on newer kernels).
_POD_EVENTS = ("low", "high", "max", "oom", "oom_kill")
# Reconciles are a handful of D-Bus calls: milliseconds normally, seconds when systemd is slow.
_RECONCILE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def _bytes_value(n: int) -> float:
    return math.inf if n >= UINT64_MAX else float(n)


def _qos_of(pod_unit: Any) -> str:
    """QoS class of a planned pod slice, from the slice it sits in (kubepods-burstable.slice...)."""
    parent = pod_unit.parent or ""
    if parent.endswith("-burstable.slice"):
        return "Burstable"
    if parent.endswith("-besteffort.slice"):
        return "BestEffort"
    return "Guaranteed"


class _Dynamic:
    """Collector for the values the daemon replaces as a whole."""

    def __init__(self, owner: "Metrics"):
        self._owner = owner

    def describe(self):
        return []  # unchecked collector: families vary with the plan

    def collect(self):
        o = self._owner
        plan_view = o._plan_view
        if plan_view is not None:
            units, node_min, node_low, capacity, allocatable, qos_counts, warnings = plan_view
            g = GaugeMetricFamily("memqos_unit_desired_bytes",
                                  "Desired memory property of a unit we manage (+Inf: infinity)",
                                  labels=["unit", "level", "property"])
            for unit, level, prop, value in units:
                g.add_metric([unit, level, prop], value)
            yield g
            yield GaugeMetricFamily("memqos_node_memory_min_bytes",
                                    "MemoryMin of the node's kubepods slice", value=node_min)
            yield GaugeMetricFamily("memqos_node_memory_low_bytes",
                                    "MemoryLow of the node's kubepods slice", value=node_low)
            yield GaugeMetricFamily("memqos_node_capacity_bytes", "Node memory capacity (MemTotal) the plan used",
                                    value=capacity)
            yield GaugeMetricFamily("memqos_node_allocatable_bytes", "Node Allocatable memory the plan used",
                                    value=allocatable)
            p = GaugeMetricFamily("memqos_pods", "Pods in the plan by QoS class", labels=["qos_class"])
            for qos in QOS_CLASSES:
                p.add_metric([qos], qos_counts.get(qos, 0))
            yield p
            yield GaugeMetricFamily("memqos_plan_warnings", "Warnings the last plan produced", value=warnings)
        throttle = o._throttle
        c = CounterMetricFamily("memqos_container_memory_high_events",
                                "memory.events 'high' of a container scope: times memory.high throttled it",
                                labels=["unit"])
        for unit, count in sorted(throttle.items()):
            c.add_metric([unit], count)
        yield c
        last = o._last_success
        if last is not None:
            yield GaugeMetricFamily("memqos_source_snapshot_age_seconds",
                                    "Seconds since the last good pod snapshot was fetched",
                                    value=max(0.0, o._clock() - last))


class _Cgroups:
    """Collector for the pod and QoS slices' kernel signals, read from their cgroups at each scrape.
    Each series' labels are made once per plan (_cgroup_view): a scrape only reads and appends."""

    def __init__(self, owner: "Metrics"):
        self._owner = owner

    def describe(self):
        return []

    def collect(self):
        view = self._owner._cgroups
        if view is None:
            return
        pods, qos_slices = view
        pod_labels = ["namespace", "pod", "qos_class"]
        events = CounterMetricFamily("memqos_pod_memory_events",
                                     "memory.events of a pod slice: low = reclaimed below its memory.low (soft"
                                     " protection breached), high, max, oom, oom_kill", labels=pod_labels + ["event"])
        pressure = CounterMetricFamily("memqos_pod_memory_pressure_seconds",
                                       "memory.pressure total of a pod slice (PSI): time some or all of its tasks"
                                       " stalled on memory", labels=pod_labels + ["kind"])
        usage = GaugeMetricFamily("memqos_pod_memory_usage_bytes", "memory.current of a pod slice", labels=pod_labels)
        protected = GaugeMetricFamily("memqos_pod_memory_protected_bytes",
                                      "What the plan protects of a pod slice: MemoryMin (min) and MemoryLow (low)",
                                      labels=pod_labels + ["kind"])
        add_event, add_stall = events.samples.append, pressure.samples.append
        add_usage, add_protected = usage.samples.append, protected.samples.append
        for where, event_labels, stall_labels, labels, protections in pods:
            try:
                counts = read_memory_events(where)
            except OSError:
                counts = {}
            if not counts:
                continue  # the cgroup is gone (or not made yet): no series for it
            for prot_labels, value in protections:
                add_protected(Sample("memqos_pod_memory_protected_bytes", prot_labels, value))
            for event, event_label in event_labels:
                if event in counts:
                    add_event(Sample("memqos_pod_memory_events_total", event_label, counts[event]))
            current = read_value(where + "/memory.current")
            if current is not None:
                add_usage(Sample("memqos_pod_memory_usage_bytes", labels, current))
            stalls = read_pressure(where)
            for kind, stall_label in stall_labels:
                if kind in stalls:
                    add_stall(Sample("memqos_pod_memory_pressure_seconds_total", stall_label, stalls[kind]["total"]))
        yield from (events, pressure, usage, protected)
        qos_pressure = CounterMetricFamily("memqos_qos_memory_pressure_seconds",
                                           "memory.pressure total of a QoS slice, and of kubepods.slice as"
                                           " qos_class=\"all\"", labels=["qos_class", "kind"])
        for qos, where in qos_slices:
            stalls = read_pressure(where)
            for kind in ("some", "full"):
                if kind in stalls:
                    qos_pressure.add_metric([qos, kind], stalls[kind]["total"])
        yield qos_pressure


def _cgroup_view(plan: Any, cgroupfs: Any) -> tuple:
    """What _Cgroups reads and labels: per pod slice (its cgroup dir, its series' labels, what the
    plan protects), and the QoS slices (class, dir), kubepods.slice as "all"."""
    pods, qos_slices = [], []
    node = plan.node_unit().unit
    for u in plan.units:
        if u.level == "pod":
            namespace, _, name = (u.pod or "/").partition("/")
            labels = {"namespace": namespace, "pod": name, "qos_class": _qos_of(u)}
            pods.append((str(cgroupfs.dir_of(u.unit)),
                         tuple((e, {**labels, "event": e}) for e in _POD_EVENTS),
                         tuple((k, {**labels, "kind": k}) for k in ("some", "full")),
                         labels,
                         (({**labels, "kind": "min"}, float(u.memory_min)),
                          ({**labels, "kind": "low"}, float(u.memory_low)))))
        elif u.level == "qos" or u.unit == node:
            qos = "all" if u.unit == node else "BestEffort" if u.unit.endswith("-besteffort.slice") else "Burstable"
            qos_slices.append((qos, str(cgroupfs.dir_of(u.unit))))
    return tuple(pods), tuple(qos_slices)


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
        self._plan_view: tuple | None = None
        self._throttle: dict[str, float] = {}
        self._last_success: float | None = None
        self._cgroups: tuple | None = None  # _cgroup_view of the plan shown, with its cgroups
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
        self._ceiling = Gauge("memqos_besteffort_ceiling_bytes",
                              "The BestEffort ceiling: MemoryMax of the BestEffort QoS slice as planned (kind=planned)"
                              " and as systemd holds it (kind=held; above the plan while it steps down with the"
                              " slice's usage); +Inf: none", ["kind"], registry=r)
        r.register(_Dynamic(self))
        r.register(_Cgroups(self))

    # ---------------------------------------------------------------- plan

    def set_plan(self, plan: Any, cgroupfs: Any = None) -> None:
        """Desired values of every planned unit; node min/low; pods by QoS class.
        Throttle counts of containers no longer in the plan are dropped. With `cgroupfs`
        (cgroupfs.Cgroupfs: where the slices are), each scrape also reads the pod and QoS slices'
        memory.events, memory.pressure and memory.current."""
        self._cgroups = None if cgroupfs is None else _cgroup_view(plan, cgroupfs)
        units = []
        qos_counts = {q: 0 for q in QOS_CLASSES}
        containers = set()
        for u in plan.units:
            for prop, attr in _PROPERTIES:
                units.append((u.unit, u.level, prop, _bytes_value(getattr(u, attr))))
            if u.level == "pod":
                qos_counts[_qos_of(u)] += 1
            elif u.level == "container":
                containers.add(u.unit)
        node = plan.node_unit()
        self._plan_view = (tuple(units), float(node.memory_min), float(node.memory_low), float(plan.capacity),
                           float(plan.allocatable), qos_counts, len(plan.warnings))
        if any(unit not in containers for unit in self._throttle):
            self._throttle = {k: v for k, v in self._throttle.items() if k in containers}

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
        """Someone else changed a unit of ours at `level` (node, qos, reserved, pod, container),
        through systemd or to its cgroup file alone (`writer`: kubelet_gate.WRITERS); it is put back."""
        self._foreign_writes.labels(level=level, writer=writer).inc()

    def oom_group_restored(self, ok: bool) -> None:
        """memory.oom.group of a container scope put back to 1 (ok), or the write failed."""
        self._oom_group_restores.labels(result="ok" if ok else "error").inc()

    # ---------------------------------------------------------------- throttling

    def besteffort_ceiling(self, planned: int | None, held: int | None) -> None:
        """The BestEffort ceiling after a round: planned and held MemoryMax (None: none)."""
        self._ceiling.labels("planned").set(_bytes_value(UINT64_MAX if planned is None else planned))
        self._ceiling.labels("held").set(_bytes_value(UINT64_MAX if held is None else held))

    def throttle_events(self, container_unit: str, high_count: int) -> None:
        """memory.events 'high' of a container scope (the kernel's own counter)."""
        if self._throttle.get(container_unit) == float(high_count):
            return  # unchanged (the usual case): no copy of the table for every container
        throttle = dict(self._throttle)
        throttle[container_unit] = float(high_count)
        self._throttle = throttle

    def forget_unit(self, unit: str) -> None:
        if unit in self._throttle:
            self._throttle = {k: v for k, v in self._throttle.items() if k != unit}

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
        from prometheus_client import generate_latest
        return generate_latest(self.registry)

    def serve(self, listen: str) -> "MetricsServer":
        """Serve /metrics, /readyz (503 until `set_ready`, then 200) and /livez (503 when no
        `heartbeat` came for LIVENESS_WINDOW), on HOST:PORT (port 0:
        any free port; see .port). Binds exactly what is given; the config's default is
        127.0.0.1:9759. Raises OSError if it cannot bind."""
        host, port = parse_listen(listen)
        metrics_app = make_wsgi_app(self.registry)

        def app(environ, start_response):
            probe = self._probe(environ.get("PATH_INFO"))
            if probe is None:
                return metrics_app(environ, start_response)
            ok, text = probe
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain; charset=utf-8")])
            return [f"{text}\n".encode()]

        server = MetricsServer(app, host, port)
        if not _is_loopback(host):
            log.warning("metrics: serving on %s, which is not a loopback address (as configured)", listen)
        return server


class NoMetrics:
    """Metrics that go nowhere, for a daemon with no endpoint and for tests: the same calls as
    `Metrics`, each doing nothing, so no caller asks `if metrics:` (a null object, as the
    kubelet's qosContainerManagerNoop). tests/unit/test_metrics.py keeps the two in step."""

    def set_plan(self, plan: Any, cgroupfs: Any = None) -> None: pass
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
    def oom_group_restored(self, ok: bool) -> None: pass
    def besteffort_ceiling(self, planned: int | None, held: int | None) -> None: pass
    def throttle_events(self, container_unit: str, high_count: int) -> None: pass
    def forget_unit(self, unit: str) -> None: pass


def parse_listen(listen: str) -> tuple[str, int]:
    """'127.0.0.1:9759' / '[::1]:9759' / 'localhost:0' -> (host, port). ValueError otherwise."""
    host, sep, port = str(listen).rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"metrics.listen: {listen!r} must be HOST:PORT (e.g. 127.0.0.1:9759)")
    return host, int(port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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

