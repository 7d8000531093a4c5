"""The kernel's signals as metrics: one table, read at each scrape, written as text.

Every series read from a cgroup file is a row of SIGNALS, in node_exporter's shape: the metric
family, the cgroups it is read from (`level`), the file, its parser, and the label the file's
keys go into. Adding a signal is one row, and its case in tests/unit/test_signals.py.

    level       the cgroups                                      their labels
    pod         every planned pod slice                          namespace, pod, qos_class
    qos         the QoS slices, and kubepods.slice as "all"      qos_class
    container   every planned container scope (metrics.perUnit)  namespace, pod, qos_class, container

A scrape (`SignalView.text`) reads each file a cgroup's rows need once (cgroupfs.KeptFiles: with
pread, on descriptors kept open from one scrape to the next) and writes the rows' lines; nothing
is read between scrapes: no scraper, no reads. A file that cannot be read (the cgroup gone or not
made yet, a kernel without PSI) has no series. Everything that depends on the plan alone is made
once per plan (`SignalView.of`): each series' name and labels, escaped, up to its value; so a
scrape reads, splits and appends, close to the pace of a process that only reads the same files
and writes as many lines (bench/scrape_cost.py). What the plan protects of each pod
(memqos_pod_memory_protected_bytes) is written here too, whole lines made once per plan, while
one of the pod's files can be read.

The text is Prometheus' exposition format 0.0.4 (what `prometheus_client.generate_latest`
writes): a label value escapes backslash, double quote and line feed, and is UTF-8 (a lone
surrogate, which JSON can carry and UTF-8 cannot, becomes "?").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

from .cgroupfs import KeptFiles, flat_keyed, psi_totals
from .plan import Plan, UnitPlan

__all__ = ["Signal", "SIGNALS", "LABELS", "PROTECTED", "SignalView", "header", "sample", "escape",
           "qos_class_of", "number"]

# A parser: a file's content -> {key: the value as exposition text}; a one-value file's key is b"".
Parser = Callable[[bytes], Mapping[bytes, bytes]]


def seconds(raw: bytes) -> Mapping[bytes, bytes]:
    """A PSI file (memory.pressure): each line's `total=` in seconds, exactly (the kernel counts µs)."""
    out = {}
    for kind, total in psi_totals(raw).items():
        total = total.rjust(7, b"0")
        out[kind] = total[:-6] + b"." + total[-6:]
    return out


def number(raw: bytes) -> Mapping[bytes, bytes]:
    """A one-number file (memory.current); "max" is +Inf."""
    text = raw.strip()
    if text.isdigit():
        return {b"": text}
    return {b"": b"+Inf"} if text == b"max" else {}


@dataclass(frozen=True)
class Signal:
    family: str  # the metric family as served; a counter's name ends in _total
    type: str  # counter | gauge
    help: str
    level: str  # pod | qos | container: the cgroups it is read from (LABELS)
    file: str  # in the cgroup's directory
    parse: Parser
    label: str | None = None  # the label the file's keys go into; None: one value, no label
    keys: tuple[str, ...] = ("",)  # the file's keys served, one series each


_EVENTS_HELP = ("low = reclaimed below its memory.low (soft protection breached), high = throttled at a"
                " memory.high, max, oom, oom_kill; the kernel counts its descendants' events too")
_EVENTS = ("low", "high", "max", "oom", "oom_kill")
_PSI_HELP = "(PSI): time some or all of its tasks stalled on memory"

SIGNALS: tuple[Signal, ...] = (
    Signal("memqos_pod_memory_events_total", "counter", "memory.events of a pod slice: " + _EVENTS_HELP,
           "pod", "memory.events", flat_keyed, "event", _EVENTS),
    Signal("memqos_pod_memory_pressure_seconds_total", "counter", "memory.pressure total of a pod slice " + _PSI_HELP,
           "pod", "memory.pressure", seconds, "kind", ("some", "full")),
    Signal("memqos_pod_memory_usage_bytes", "gauge", "memory.current of a pod slice", "pod", "memory.current", number),
    Signal("memqos_qos_memory_events_total", "counter", "memory.events of a QoS slice, and of kubepods.slice as"
           ' qos_class="all": ' + _EVENTS_HELP, "qos", "memory.events", flat_keyed, "event", _EVENTS),
    Signal("memqos_qos_memory_pressure_seconds_total", "counter", "memory.pressure total of a QoS slice, and of"
           ' kubepods.slice as qos_class="all" ' + _PSI_HELP, "qos", "memory.pressure", seconds, "kind",
           ("some", "full")),
    Signal("memqos_qos_memory_usage_bytes", "gauge", 'memory.current of a QoS slice, and of kubepods.slice as'
           ' qos_class="all"', "qos", "memory.current", number),
    Signal("memqos_container_memory_high_events_total", "counter", "memory.events 'high' of a container scope:"
           " times its memory.high throttled it (metrics.perUnit)", "container", "memory.events", flat_keyed,
           None, ("high",)),
)

LABELS = {"pod": ("namespace", "pod", "qos_class"), "qos": ("qos_class",),
          "container": ("namespace", "pod", "qos_class", "container")}

# From the plan, per pod: served while the pod's cgroup is there.
PROTECTED = ("memqos_pod_memory_protected_bytes", "gauge",
             "What the plan protects of a pod slice: MemoryMin (min) and MemoryLow (low)")


# ---- the text format ------------------------------------------------------------------------------
def escape(value: str) -> str:
    """A label value as the exposition format writes it between double quotes."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def header(family: str, type_: str, help_: str) -> bytes:
    return f"# HELP {family} {help_}\n# TYPE {family} {type_}\n".encode()


def sample(family: str, labels: Iterable[tuple[str, str]], value: str = "") -> bytes:
    """`family{name="value",...} ` (and the value, if given), encoded: a line's start is made once."""
    inner = ",".join(f'{name}="{escape(v)}"' for name, v in labels)
    text = f"{family}{{{inner}}} " if inner else f"{family} "
    return (text + value).encode("utf-8", "replace")


def qos_class_of(pod_unit: UnitPlan) -> str:
    """QoS class of a planned pod slice, from the slice it sits in (kubepods-burstable.slice...)."""
    parent = pod_unit.parent or ""
    if parent.endswith("-burstable.slice"):
        return "Burstable"
    if parent.endswith("-besteffort.slice"):
        return "BestEffort"
    return "Guaranteed"


# ---- what a scrape reads and writes, made once per plan -------------------------------------------
# Per cgroup: its reads, each (path, parser, ((family index, key, line start), ...)), and its
# whole lines ((family index, line), ...), written when one of its files could be read.
_Read = tuple[str, Parser, tuple[tuple[int, bytes, bytes], ...]]
_Target = tuple[tuple[_Read, ...], tuple[tuple[int, bytes], ...]]


class SignalView:
    """The families a plan's cgroups serve, and how to read them; `text()` at each scrape."""

    def __init__(self, headers: tuple[bytes, ...], targets: tuple[_Target, ...]):
        self._headers = headers
        self._targets = targets
        self.paths = frozenset(path for reads, _ in targets for path, _, _ in reads)  # every file it reads

    @classmethod
    def of(cls, plan: Plan, dirs: Mapping[str, Path], *, per_pod: bool = True, per_unit: bool = False) -> "SignalView":
        """The view of `plan`, its units' cgroups at `dirs` (Cgroupfs.place). per_pod: the pod
        level (and the protection); per_unit (with per_pod): the container level too."""
        levels = {"qos"} | ({"pod"} | ({"container"} if per_unit else set()) if per_pod else set())
        rows = [s for s in SIGNALS if s.level in levels]
        families = [(s.family, s.type, s.help) for s in rows] + ([PROTECTED] if per_pod else [])
        protected = len(rows)  # its family's index
        # Per level, its rows as (family index, file, parser, ((key, `,label="key"` or ""), ...)).
        by_level = {level: [(i, s.file, s.parse, tuple((k, f',{s.label}="{escape(k)}"' if s.label else "")
                                                    for k in s.keys))
                            for i, s in enumerate(rows) if s.level == level] for level in levels}
        targets = []
        for level, labels, where, static in _cgroups(plan, dirs, levels):
            inner = ",".join(f'{name}="{escape(value)}"' for name, value in labels)  # escaped once a cgroup
            reads: dict[tuple[str, Parser], list] = {}
            for i, file, parse, keys in by_level[level]:
                family = rows[i].family
                reads.setdefault((file, parse), []).extend(
                    (i, key.encode(), f"\n{family}{{{inner}{extra}}} ".encode("utf-8", "replace")) for key, extra in keys)
            lines = tuple((protected, f'\n{PROTECTED[0]}{{{inner},kind="{kind}"}} {value}'.encode("utf-8", "replace"))
                          for kind, value in static)
            targets.append((tuple((f"{where}/{file}", parse, tuple(r)) for (file, parse), r in reads.items()),
                            lines))
        # Each family's text is its header, then each line preceded by a line feed: the header
        # ends without one, and the next family's header begins with one.
        headers = tuple((b"\n" if i else b"") + header(*f)[:-1] for i, f in enumerate(families))
        return cls(headers, tuple(targets))

    def text(self, files: KeptFiles) -> bytes:
        """Read every file (through `files`, whose lock the caller holds), write every family (its
        HELP and TYPE even when it has no line)."""
        read = files.read
        # Per family its pieces: each line's start (the line feed ending the line before, the
        # name and labels) and its value, joined once at the end: no bytes made per line.
        pieces: list[list[bytes]] = [[] for _ in self._headers]
        for reads, static in self._targets:
            present = False
            for path, parse, rows in reads:
                raw = read(path)
                if raw is None:
                    continue  # no such file (no PSI), or the cgroup is gone or not made yet
                present = True
                values = parse(raw)
                for i, key, start in rows:
                    value = values.get(key)
                    if value is not None:
                        pieces[i] += (start, value)
            if present:
                for i, line in static:
                    pieces[i].append(line)
        return b"".join([head + b"".join(family) for head, family in zip(self._headers, pieces)]) + b"\n"


def _cgroups(plan: Plan, dirs: Mapping[str, Path], levels: set[str]):
    """(level, labels, directory, protection) of each cgroup of these levels in the plan."""
    node = plan.node_unit().unit
    pods: dict[str, tuple[tuple[str, str], ...]] = {}
    for u in plan.units:
        if u.level == "pod":
            namespace, _, name = (u.pod or "/").partition("/")
            labels = tuple(zip(LABELS["pod"], (namespace, name, qos_class_of(u)), strict=True))
            pods[u.unit] = labels
            if "pod" in levels:
                yield "pod", labels, dirs[u.unit], (("min", u.memory_min), ("low", u.memory_low))
        elif u.level == "container":
            if "container" in levels and u.parent in pods:
                yield "container", pods[u.parent] + ((LABELS["container"][-1], u.container or ""),), dirs[u.unit], ()
        elif u.level == "qos" or u.unit == node:
            qos = "all" if u.unit == node else "BestEffort" if u.unit.endswith("-besteffort.slice") else "Burstable"
            yield "qos", tuple(zip(LABELS["qos"], (qos,), strict=True)), dirs[u.unit], ()
