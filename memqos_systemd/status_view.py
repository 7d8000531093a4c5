"""`status` for people: the lines drawn from status's document (cmd_status.py), each feature's
by the feature itself (its `status_lines`)."""

from __future__ import annotations

import sys
import time
from typing import Sequence

from . import columns, features
from .face import WIDTH, count as _count, human as _human, table as _table
from .feature import Feature
from .kubelet_gate import written_how
from .pods import one_line
from .signals import CLASSES
from .node import page_size

__all__ = ["status_lines", "WIDTH"]


def _table_features() -> tuple[Feature, ...]:
    """The table's features, made to say their lines only (nothing read, nothing kept)."""
    return features.offline(page_size())


def status_lines(doc: dict, *, wide: bool = False, encoding: str | None = None,
                 shown_by: Sequence[Feature] | None = None) -> list[str]:
    """`status` for people: the node's slices (drift marked `!`, with its reason) and the pods with
    their containers (drift marked `!`), one line each, then a summary: protection against
    allocatable, and holding. Names are cut to fit WIDTH, and a line says so; `wide` cuts none.
    Names are measured as the output's `encoding` prints them (columns.as_printed). Each feature
    (`shown_by`, the table's by default) says its own lines under its key of `doc`."""
    lines = []
    mark = columns.ellipsis(encoding)
    cut = False
    upper = [r for r in doc["units"] if r["level"] in ("node", "qos", "reserved")]
    if upper:
        rows = [[" ", "UNIT", "LEVEL", "MIN/LOW (plan)", "HIGH", "DRIFT"]]
        for r in upper:
            want = r.get("planned") or r["desired"] or r["systemd"] or {}
            theirs = set(r.get("kubelet") or ())

            def shown(prop: str) -> str:
                return _human(want.get(prop)) + ("*" if prop in theirs else "")
            rows.append(["!" if r["drift"] else " ", r["unit"], r["level"],
                         f"{shown('MemoryMin')}/{shown('MemoryLow')}", shown("MemoryHigh"), r["why"]])
        table, cut = _table(rows, words_last=True, wide=wide, ellipsis=mark)
        lines += table + [""]
    limit = sys.maxsize if wide else columns.NAME_LIMIT
    if doc["pods"]:
        rows = [[" ", "POD", "QOS", "REQUEST", "MIN/LOW", "USAGE", "NOW/LENT", "LOW EV", "OOM KILL", "FULL10"]]
        for p in doc["pods"]:
            full = p["pressureFullAvg10"]
            now = p.get("protection") or {}
            rows.append(["!" if p["drift"] else " ",
                         columns.as_printed(one_line(f"{p['namespace']}/{p['pod']}", limit), encoding), p["qosClass"],
                         _human(p["requestBytes"]), f"{_human(p['MemoryMin'])}/{_human(p['MemoryLow'])}",
                         _human(p["usageBytes"]),
                         f"{_human(now['protectedBytes'])}/{_human(now['lentBytes'])}" if now else "-",
                         _count(p["events"]["low"]), _count(p["events"]["oom_kill"]),
                         "-" if full is None else f"{full:.2f}"])
            for c in p["containers"]:
                name = columns.as_printed(one_line(c["name"], limit), encoding) if c["name"] else c["unit"]
                rows.append(["!" if c["drift"] else " ", f"  {name} ({_scope_id(c['unit'])})", "container",
                             _human(c["requestBytes"]), f"{_human(c['MemoryMin'])}/{_human(c['MemoryLow'])}",
                             _human(c["usageBytes"]), "", "", "", ""])
        table, cut_here = _table(rows, wide=wide, ellipsis=mark)
        lines += table + [""]
        cut = cut or cut_here
    if doc.get("protection"):
        lines += _protection_lines(doc["protection"])
    unplanned = [r for r in doc["units"] if r["level"] == "unplanned"]
    if unplanned:
        lines.append(f"not in the plan (pods gone; the service resets them): {len(unplanned)} unit(s)"
                     + (f", {sum(r['drift'] for r in unplanned)} with drift" if any(r["drift"] for r in unplanned)
                        else ""))
    for feature in shown_by if shown_by is not None else _table_features():  # each feature's own lines
        if doc.get(feature.name) and hasattr(feature, "status_lines"):
            lines += feature.status_lines(doc[feature.name], doc["pods"], wide)
    lines += columns.wrap(_summary(doc), WIDTH, indent="  ")
    companion = doc.get("companion")
    if companion:
        lines += _mode_lines(companion, wide)
    if doc["drift"]:
        lines.append("drift (!): the plan, systemd and the kernel disagree (why, and the values: --output json)")
    if doc.get("foughtOver"):
        lines.append("fought over (written behind our back again and again, put back each time; who: check):")
        for f in doc["foughtOver"]:
            clock = time.strftime("%H:%M:%S", time.localtime(f["since"]))
            line = f"  {f['unit']}: {f['writes']} writes since {clock}, {written_how(f['writers'])}"
            cut = cut or (not wide and columns.width(line) > WIDTH)
            lines.append(line if wide else columns.fit(line, WIDTH, mark))
    if cut:
        lines.append(f"names cut ({mark}) to fit {WIDTH} columns: --output wide shows them whole")
    return lines


def _mode_lines(mode: dict, wide: bool) -> list[str]:
    """The mode, always (also when the kubelet's gate cannot be read): its name and why, who writes
    what (`*`: the kubelet's values, as its own config makes them), the kubelet's moments put back."""
    mark = "!" if not mode.get("podsProtected", True) else " "
    lines = [f"{mark} mode: {mode['mode']}: {mode['why']}"]
    if mode.get("kubelet"):
        lines.append(f"  the kubelet: {mode['kubelet']}")
    lines.append(f"  who writes what (* the kubelet's): {mode['whoWritesWhat']}")
    resets = mode.get("kubeletResets") or {}
    if resets:
        lines.append("  the kubelet's own moments put back: " + ", ".join(
            f"{n:g} at {'its start' if key.endswith('/start') else 'a container creation'} ({key.split('/')[0]})"
            for key, n in sorted(resets.items())))
    if wide:
        return lines
    # Wrapped, never cut: the reason is what an operator reads the line for (issue 43).
    return [w for line in lines for w in columns.wrap(line, WIDTH, indent="    ")]


def _protection_lines(prot: dict) -> list[str]:
    """What the kernel protects now per QoS class: a heading that says whether memory_recursiveprot
    is on, a line per class, and a line when BestEffort holds protection lent by a parent."""
    option = {True: "on", False: "off", None: "not in /proc/mounts: taken as on"}[prot["memoryRecursiveprot"]]
    rows = [[" ", "CLASS", "CGROUP", "USAGE", "MIN/LOW NOW", "PROTECTED", "LENT"]]
    where = {"Guaranteed": "its pods", "Burstable": "QoS slice", "BestEffort": "QoS slice", "all": prot["node"]}
    for c in CLASSES:
        v = prot["classes"][c]
        rows.append([" ", c, where[c], _human(v["usageBytes"]), f"{_human(v['minBytes'])}/{_human(v['lowBytes'])}",
                     _human(v["protectedBytes"]), _human(v["lentBytes"])])
    table, _ = _table(rows)
    lines = [columns.fit(f"protected now, as the kernel computes it (memory_recursiveprot {option}):", WIDTH)] + table
    be = prot["classes"]["BestEffort"]
    if be["lentBytes"]:
        # What it costs and what to do, not only what it is (issue 43).
        said = [f"! BestEffort holds {_human(be['lentBytes'])} of protection lent by {prot['node']}, not its own"
                f" (memory_recursiveprot):",
                "  reclaim spares that much of BestEffort, whose memory should go first, and reclaims elsewhere",
                "  (outside the pods, Burstable pods beyond their requests); it shrinks as pods use their requests.",
                "  To bound it: bestEffortCeiling in the config (man memqos-systemd, CONFIGURATION)."]
        lines += [columns.fit(line, WIDTH) for line in said]
    return lines + [""]



def _scope_id(unit: str) -> str:
    head, _, rest = unit.rpartition("-")
    return rest[:12] if head else unit


def _summary(doc: dict) -> str:
    node = doc["node"]
    if node is None:
        protected = f"no plan (the pod source failed: {doc['podSource']})"
    else:
        # The pods' own protection (each byte once: the node and QoS slices back the same bytes).
        alloc = node["allocatableBytes"]
        share = (node["MemoryMin"] + node["MemoryLow"]) / alloc * 100 if alloc else 0.0
        theirs = node.get("kubeletMemoryMin", 0) + node.get("kubeletMemoryLow", 0)
        protected = (f"min {_human(node['MemoryMin'])} + low {_human(node['MemoryLow'])} ({share:.0f}% of"
                     f" allocatable {_human(alloc)}"
                     + (f"; the kubelet writes {_human(theirs)} of it" if theirs else "") + ")")
    holding = f"holding: {doc['holding']}" if doc["holding"] else "not holding"
    return f"node: {len(doc['pods'])} pods, {protected}, {holding}, {doc['drift']}/{len(doc['units'])} units drift"


