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

What the kernel protects now (issue 35): `ProtectionView`, made once per plan, reads
memory.current, memory.min and memory.low of kubepods.slice, the slices above it, the QoS slices
and the pod slices at each scrape (through the same descriptors; memory.current once), hands
the tree to effective.py, and writes per QoS class the effective min and low up to the usage
(memqos_effective_protection_bytes) and the part of it lent by a parent's unclaimed protection
under memory_recursiveprot (memqos_lent_protection_bytes); `status` shows the same, per pod too.

The text is Prometheus' exposition format 0.0.4 (what `prometheus_client.generate_latest`
writes): a label value escapes backslash, double quote and line feed, and is UTF-8 (a lone
surrogate, which JSON can carry and UTF-8 cannot, becomes "?").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

from .cgroup_tree import cgroup_path, flat_keyed, parse_value, psi_totals
from .cgroupfs import KeptFiles
from .effective import Cgroup, Effective, protection
from .plan import Plan, UnitPlan

__all__ = ["Signal", "SIGNALS", "LABELS", "PROTECTED", "EFFECTIVE", "LENT", "RECURSIVE", "SignalView",
           "ProtectionView", "Protection", "ClassShare", "CLASSES", "header", "sample", "escape", "qos_class_of",
           "number"]

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


# What the kernel protects now, per QoS class (ProtectionView).
EFFECTIVE = ("memqos_effective_protection_bytes", "gauge",
             "What the kernel protects now of a QoS class (Guaranteed: its pods summed; all: kubepods.slice): its"
             " effective memory.min (kind=min) and memory.low (kind=low) up to its usage, computed at the scrape as"
             " Linux 6.1 does from memory.current, memory.min and memory.low")
LENT = ("memqos_lent_protection_bytes", "gauge",
        "The part of memqos_effective_protection_bytes that a parent's unclaimed protection lends (the cgroup2"
        " mount option memory_recursiveprot), beyond what the class's own memory.min and memory.low claim")
RECURSIVE = ("memqos_memory_recursiveprot", "gauge",
             "1 when the cgroup2 mount has the option memory_recursiveprot (protection a parent's children do not"
             " claim is lent to them by usage), 0 when not; absent when /proc/mounts does not say")
CLASSES = ("Guaranteed", "Burstable", "BestEffort", "all")


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

    def __init__(self, headers: tuple[bytes, ...], targets: tuple[_Target, ...],
                 protected: "ProtectionView | None" = None):
        self._headers = headers
        self._targets = targets
        self._protection = protected
        self.paths = frozenset(path for reads, _ in targets for path, _, _ in reads) | (
            protected.paths if protected is not None else frozenset())  # every file it reads

    @classmethod
    def of(cls, plan: Plan, dirs: Mapping[str, Path], *, per_pod: bool = True, per_unit: bool = False,
           recursive: bool | None = None, page_size: int = 4096) -> "SignalView":
        """The view of `plan`, its units' cgroups at `dirs` (Cgroupfs.place). per_pod: the pod
        level (and the protection); per_unit (with per_pod): the container level too. The
        effective protection per QoS class always, computed `recursive` (memory_recursiveprot;
        None: not known, taken as on, systemd's default) in pages of `page_size`."""
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
        return cls(headers, tuple(targets), ProtectionView.of(plan, dirs, recursive=recursive, page_size=page_size,
                                                                      pods=False))

    def text(self, files: KeptFiles) -> bytes:
        """Read every file (through `files`, whose lock the caller holds), write every family (its
        HELP and TYPE even when it has no line)."""
        seen: dict[str, bytes | None] = {}  # what this scrape read, for the protection's reads

        def read(path: str) -> bytes | None:
            raw = seen[path] = files.read(path)
            return raw

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
        out = b"".join([head + b"".join(family) for head, family in zip(self._headers, pieces)]) + b"\n"
        if self._protection is not None:
            out += self._protection.text(lambda path: seen[path] if path in seen else files.read(path))
        return out


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


# ---- what the kernel protects now -------------------------------------------------------------------
@dataclass(frozen=True)
class ClassShare:
    """What the kernel protects now of a QoS class (its pods summed for Guaranteed), in bytes:
    usage; effective min and low up to the usage, and their parts lent by a parent; `protected`,
    what reclaim spares (the larger of the two per cgroup), and its lent part."""

    usage: int = 0
    min: int = 0
    low: int = 0
    lent_min: int = 0
    lent_low: int = 0
    protected: int = 0
    lent: int = 0

    def plus(self, e: Effective) -> "ClassShare":
        return ClassShare(self.usage + e.usage, self.min + e.min_now, self.low + e.low_now,
                          self.lent_min + e.lent_min_now, self.lent_low + e.lent_low_now,
                          self.protected + e.protected, self.lent + e.lent)


@dataclass(frozen=True)
class Protection:
    """One computation: every cgroup read (unit name -> Effective), the QoS classes (CLASSES ->
    ClassShare), and whether memory_recursiveprot was on (None: not known, taken as on)."""

    units: Mapping[str, Effective]
    classes: Mapping[str, ClassShare]
    recursive: bool | None


class ProtectionView:
    """The kubepods tree of a plan as effective.py takes it: kubepods.slice, the slices above it
    (cgroupRoot; their siblings are not read: taken to claim nothing), the QoS slices and the pod
    slices, each read from its memory.current, memory.min and memory.low. Global reclaim is
    emulated: the root of the cgroup2 mount is the reclaim root. A cgroup that cannot be read (not
    made yet, gone) is left out with what is below it."""

    _FILES = ("memory.current", "memory.min", "memory.low")

    def __init__(self, nodes: tuple[tuple[str, str, str | None, str | None], ...], recursive: bool | None,
                 page_size: int):
        self._nodes = nodes  # (name, directory, parent's name or None: the root's child, class or None), parents first
        self.recursive = recursive
        self._page_size = page_size
        self.paths = frozenset(f"{where}/{f}" for _, where, _, _ in nodes for f in self._FILES)

    @classmethod
    def of(cls, plan: Plan, dirs: Mapping[str, Path], *, recursive: bool | None, page_size: int = 4096,
           pods: bool = True) -> "ProtectionView":
        """`pods`: every pod slice (status shows each); without, only the Guaranteed ones, which are
        the QoS slices' siblings: what a class's share depends on (the scrape's per-class series),
        for 3 reads a class instead of 3 a pod."""
        node = plan.node_unit().unit
        top = Path(dirs[node])
        nodes: list[tuple[str, str, str | None, str | None]] = []
        parent = None
        above = cgroup_path(node).split("/")[:-1]  # the slices of cgroupRoot, outermost first
        for i, name in enumerate(above):
            where = top.parents[len(above) - 1 - i]
            nodes.append((name, str(where), parent, None))
            parent = name
        nodes.append((node, str(top), parent, "all"))
        for u in plan.units:
            if u.level == "qos":
                nodes.append((u.unit, str(dirs[u.unit]), u.parent, "BestEffort" if u.unit.endswith("-besteffort.slice")
                              else "Burstable"))
        for u in plan.units:
            if u.level == "pod" and (pods or u.parent == node):
                nodes.append((u.unit, str(dirs[u.unit]), u.parent, "Guaranteed" if u.parent == node else None))
        return cls(tuple(nodes), recursive, page_size)

    def compute(self, read: Callable[[str], bytes | None]) -> Protection | None:
        """Read every cgroup (`read`: a path -> its content or None) and compute; None when
        kubepods.slice or a slice above it cannot be read."""
        values: dict[str, tuple[int, int, int]] = {}
        kids: dict[str | None, list[str]] = {}
        for name, where, parent, _ in self._nodes:
            if parent is not None and parent not in values:
                continue
            read_ = [read(f"{where}/{f}") for f in self._FILES]
            numbers = [None if raw is None else parse_value(raw) for raw in read_]
            if None in numbers:
                continue
            values[name] = tuple(numbers)  # type: ignore[assignment]
            kids.setdefault(parent, []).append(name)
        first = self._nodes[0][0]
        if first not in values or not any(cls == "all" and name in values for name, _, _, cls in self._nodes):
            return None

        def tree(name: str) -> Cgroup:
            usage, mn, lw = values[name]
            return Cgroup(name, usage, mn, lw, tuple(tree(k) for k in kids.get(name, ())))

        top = tree(first)
        units = protection(Cgroup("/", top.usage, children=(top,)), recursive=self.recursive is not False,
                           page_size=self._page_size)
        classes = {c: ClassShare() for c in CLASSES}
        for name, _, _, cls in self._nodes:
            if cls is not None and name in units:
                classes[cls] = classes[cls].plus(units[name])
        return Protection(units, classes, self.recursive)

    def text(self, read: Callable[[str], bytes | None]) -> bytes:
        """The families (EFFECTIVE, LENT, RECURSIVE) as text, each with its HELP and TYPE."""
        found = self.compute(read)
        out = []
        for family, kinds in ((EFFECTIVE, (("min", "min"), ("low", "low"))),
                              (LENT, (("min", "lent_min"), ("low", "lent_low")))):
            out.append(header(*family))
            if found is not None:
                out += [sample(family[0], (("qos_class", cls), ("kind", kind)), str(getattr(share, attr))) + b"\n"
                        for cls, share in found.classes.items() for kind, attr in kinds]
        out.append(header(*RECURSIVE))
        if self.recursive is not None:
            out.append(sample(RECURSIVE[0], (), "1" if self.recursive else "0") + b"\n")
        return b"".join(out)
