"""`status`'s "protected now": per QoS class and per pod what the kernel protects (effective.py over
the cgroups' files, signals.ProtectionView), and what of it a parent lends, for people and as JSON."""

from __future__ import annotations

import re

from test_signals import GI, three_class_node, worked_tree

from memqos_systemd import columns
from memqos_systemd.cmd_status import _protection_doc
from memqos_systemd.status_view import WIDTH, status_lines
from memqos_systemd.signals import ProtectionView


def doc_of(tmp_path, mounts=None) -> dict:
    p = three_class_node()
    fs = worked_tree(tmp_path, p, mounts=mounts)
    found = ProtectionView.of(p, fs.place(p.cgroup_paths), recursive=fs.recursive_protection()).compute(
        lambda path: open(path, "rb").read())
    hog = next(u.unit for u in p.units if u.pod == "batch/hog" and u.level == "pod")
    e = found.units[hog]
    pod = {"namespace": "batch", "pod": "hog", "qosClass": "BestEffort", "unit": hog, "requestBytes": 0,
           "MemoryMin": 0, "MemoryLow": 0, "usageBytes": e.usage, "events": {"low": 0, "oom_kill": 0},
           "pressureFullAvg10": 0.0, "drift": None, "containers": [],
           "protection": {"minBytes": e.min_now, "lowBytes": e.low_now, "protectedBytes": e.protected,
                          "lentBytes": e.lent}}
    return {"node": {"capacityBytes": 64 * GI, "allocatableBytes": 60 * GI, "MemoryMin": 40 * GI,
                     "MemoryLow": 30 * GI}, "holding": None, "podSource": None, "drift": 0, "units": [],
            "pods": [pod], "protection": _protection_doc(found, p)}


def row(lines, first) -> list[str]:
    return next(line.split() for line in lines if re.match(rf"  {first}\b", line))


def test_per_class_and_per_pod_with_what_besteffort_is_lent(tmp_path):
    doc = doc_of(tmp_path)
    classes = doc["protection"]["classes"]
    assert doc["protection"]["memoryRecursiveprot"] is True
    assert {c: (v["protectedBytes"] // GI, v["lentBytes"] // GI) for c, v in classes.items()} == {
        "Guaranteed": (10, 0), "Burstable": (10, 0), "BestEffort": (24, 24), "all": (40, 0)}
    assert (classes["Burstable"]["lentMinBytes"], classes["Guaranteed"]["lentLowBytes"]) == (6 * GI, 4 * GI)
    lines = status_lines(doc)
    assert all(columns.width(line) <= WIDTH for line in lines), max(lines, key=columns.width)
    assert any(line == "protected now, as the kernel computes it (memory_recursiveprot on):"
               for line in lines)
    assert row(lines, "BestEffort") == ["BestEffort", "QoS", "slice", "40Gi", "24Gi/16Gi", "24Gi", "24Gi"]
    assert row(lines, "Guaranteed") == ["Guaranteed", "its", "pods", "10Gi", "10Gi/4Gi", "10Gi", "0"]
    assert row(lines, "all") == ["all", "kubepods.slice", "60Gi", "40Gi/30Gi", "40Gi", "0"]
    at = lines.index("! BestEffort holds 24Gi of protection lent by kubepods.slice, not its own (memory_recursiveprot):")
    # issue 43: what it costs and what to do, not only what it is
    said = " ".join(lines[at + 1:at + 4])
    assert "reclaim spares that much of BestEffort" in said and "Burstable pods" in said and "bestEffortCeiling" in said
    # The pod: usage 40, NOW/LENT 24/24 (protected now, of which lent) (the BestEffort slice's, all lent on by usage).
    pod = next(line for line in lines if "batch/hog" in line).split()
    assert pod[:6] == ["batch/hog", "BestEffort", "0", "0/0", "40Gi", "24Gi/24Gi"]


def test_without_the_option_nothing_is_lent_and_nothing_is_said(tmp_path):
    doc = doc_of(tmp_path, mounts=f"cgroup2 {tmp_path} cgroup2 rw,nsdelegate 0 0\n")
    lines = status_lines(doc)
    assert any("(memory_recursiveprot off):" in line for line in lines)
    assert row(lines, "BestEffort")[-2:] == ["0", "0"]
    assert not any(line.startswith("! BestEffort holds") for line in lines)


def test_a_mount_not_in_proc_mounts_is_taken_as_on_and_said_so(tmp_path):
    doc = doc_of(tmp_path, mounts="")
    assert doc["protection"]["memoryRecursiveprot"] is None
    assert any("memory_recursiveprot not in /proc/mounts: taken as on" in line for line in status_lines(doc))
    assert doc["protection"]["classes"]["BestEffort"]["lentBytes"] == 24 * GI


def test_no_protection_block_when_kubepods_cannot_be_read():
    assert _protection_doc(None, three_class_node()) is None


def test_now_and_lent_are_explained_where_an_operator_looks():
    """Issue 43: the NOW/LENT column was explained neither in status --help nor in the man page."""
    from repo_docs import help_text, man_text
    for where, text in (("status --help", help_text("status")), ("man page", man_text())):
        flat = " ".join(re.sub(r"^\.[A-Z]{1,2} ", "", line) for line in text.splitlines())  # roff's .B, .RB...
        flat = " ".join(flat.replace('"', "").split())
        for words in ("NOW/LENT" if where == "status --help" else "NOW", "LENT is the part" if where == "man page"
                      else "LENT: the part", "effective memory.min", "memory_recursiveprot"):
            assert words in flat, (where, words)


def mode_doc(cfg_policy: str, facts) -> dict:
    from memqos_systemd.kubelet_gate import companion_mode, who_writes_what
    mode = companion_mode("auto", facts)
    level, line = who_writes_what(mode, cfg_policy, 0.9)
    return {"on": mode.companion, "mode": mode.name, "why": mode.why, "kubelet": facts.describe(),
            "writes": {lv: sorted(p) for lv, p in mode.writes.levels.items() if p}, "podsProtected": level != "error",
            "whoWritesWhat": line, "kubeletResets": {"node/start": 2.0}}


def test_status_names_the_mode_and_why_also_when_the_gate_cannot_be_read(tmp_path):
    """Issue 42: status said nothing of the mode when the kubelet's /metrics did not answer."""
    from memqos_systemd.kubelet_gate import Gate, KubeletFacts
    doc = doc_of(tmp_path)
    forbidden = "kubelet https://127.0.0.1:10250/metrics: HTTP 403 Forbidden"
    doc["companion"] = mode_doc("TieredReservation", KubeletFacts(Gate(None, f"not known: {forbidden}")))
    lines = status_lines(doc)
    assert all(columns.width(line) <= WIDTH for line in lines), max(lines, key=columns.width)
    text = " ".join(" ".join(lines).split())
    assert "mode: every value the service's: whether the kubelet's own Memory QoS is on is not known" in text
    assert "HTTP 403 Forbidden" in text
    assert "the kubelet's own moments put back: 2 at its start (node)" in text
    # At its v1.37 defaults beside our None: nothing protects the pods, marked.
    doc["companion"] = mode_doc("None", KubeletFacts(Gate(True, "its /metrics")))
    lines = status_lines(doc)
    assert any(line.startswith("! mode: companion: the kubelet's Memory QoS protects no pod") for line in lines), lines
    assert "nothing protects the pods" in " ".join(" ".join(lines).split())
