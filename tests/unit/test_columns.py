"""Tables for people measured as a terminal draws them, and `--output wide` cutting no name
(issue 26: double-width characters pushed plan's columns out of line; status cut pod names at
about 35 characters with no way to see them whole)."""

from __future__ import annotations

import re
import unicodedata

import pytest

from memqos_systemd import columns
from memqos_systemd.cli import plan_to_table
from memqos_systemd.status_view import WIDTH, status_lines
from memqos_systemd.config import parse_config
from memqos_systemd.plan import NodeFacts, plan
from memqos_systemd.pods import parse_pods

Gi = 2**30
CJK_POD, CJK_CONTAINER = "数据库-主节点-0", "缓存"  # two columns a character
ACCENTED = "cafe\u0301-api"  # a combining accent: no column of its own
LONG = "checkout-api-" + "x" * 230  # a pod name can be 253 characters


def drawn(text: str) -> int:
    """The columns a terminal draws, worked out here, not by the code under test."""
    return sum(0 if unicodedata.combining(c) or unicodedata.category(c) == "Cf" else
               2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


@pytest.mark.parametrize("text, cols", [("abc", 3), ("", 0), (CJK_CONTAINER, 4), ("ｆｕｌｌ", 8), (ACCENTED, 8),
                                        ("a\u200db", 2)])
def test_width_is_what_a_terminal_draws(text, cols):
    assert columns.width(text) == cols


def test_fit_cuts_by_columns_and_never_halves_a_wide_character():
    assert columns.fit("abcdef", 6) == "abcdef" and columns.fit("abcdef", 4) == "abc…"
    assert columns.fit(CJK_POD, 6) == "数据…" and drawn(columns.fit(CJK_POD, 5)) == 5
    assert columns.ljust(CJK_CONTAINER, 6) == CJK_CONTAINER + "  " and columns.rjust("ab", 4) == "  ab"


def _pod(name: str, uid: str, container: str, cid: str) -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"containers": [{"name": container, "resources": {"requests": {"memory": "1Gi"},
                                                                      "limits": {"memory": "2Gi"}}}]},
            "status": {"phase": "Running", "qosClass": "Burstable",
                       "containerStatuses": [{"name": container, "containerID": f"containerd://{cid * 64}"}]}}


def _plan_table(*, wide: bool) -> list[str]:
    pods, warnings = parse_pods({"kind": "PodList", "items": [
        _pod(CJK_POD, "0b6a3c2e-1f4d-4e8a-9b7c-5d6e7f8a9b01", CJK_CONTAINER, "a"),
        _pod(ACCENTED, "0b6a3c2e-1f4d-4e8a-9b7c-5d6e7f8a9b02", "api", "b"),
        _pod(LONG, "0b6a3c2e-1f4d-4e8a-9b7c-5d6e7f8a9b03", "web", "c")]})
    assert warnings == []
    cfg = parse_config({"memoryReservationPolicy": "TieredReservation"})
    return plan_to_table(plan(pods, NodeFacts(16 * Gi, 4096), cfg), cfg, wide=wide).splitlines()


def _column_starts(lines: list[str], token: str) -> set[int]:
    """Where (in terminal columns) `token`, the second column's word, starts on each line."""
    return {drawn(line[:m.start(1)]) for line in lines if (m := re.search(rf"\S  +({token})\b", line))}


@pytest.mark.parametrize("wide", [False, True])
def test_plan_columns_line_up_with_double_width_and_combining_characters(wide):
    lines = _plan_table(wide=wide)
    table = lines[lines.index(next(line for line in lines if line.startswith("SLICE / POD"))):]
    table = table[:table.index("")]
    assert any(CJK_POD in line for line in table) and any(ACCENTED in line for line in table)
    starts = _column_starts(table, "LEVEL|node|qos|pod|container")
    assert len(starts) == 1, table  # every row's LEVEL column at the same terminal column
    if not wide:  # (wide ends each row with its unit's name, left-aligned)
        assert len({drawn(line) for line in table}) == 1, table  # the numbers end together


def test_plan_table_cuts_a_long_name_and_wide_shows_it_whole():
    assert not any(f"ns/{LONG}" in line for line in _plan_table(wide=False))
    # cut in the middle, to the 100 columns the other columns leave it (issue 33)
    assert any(f"ns/{LONG[:20]}" in line and f"…{LONG[-20:]}" in line for line in _plan_table(wide=False))
    assert any(f"ns/{LONG}" in line for line in _plan_table(wide=True))


def _status_doc() -> dict:
    def pod(name, container):
        return {"namespace": "ns", "pod": name, "qosClass": "Burstable", "unit": "u", "requestBytes": Gi,
                "MemoryMin": 0, "MemoryLow": Gi, "usageBytes": Gi // 2, "events": {"low": 0, "oom_kill": 0},
                "pressureFullAvg10": 0.0, "drift": None,
                "containers": [{"name": container, "unit": f"cri-containerd-{'a' * 64}.scope", "requestBytes": Gi,
                                "MemoryMin": 0, "MemoryLow": Gi, "MemoryHigh": 2 * Gi, "usageBytes": Gi // 2,
                                "drift": None}]}
    return {"node": {"capacityBytes": 16 * Gi, "allocatableBytes": 15 * Gi, "MemoryMin": 0, "MemoryLow": 3 * Gi},
            "holding": None, "podSource": None, "drift": 0, "units": [],
            "pods": [pod(CJK_POD, CJK_CONTAINER), pod(ACCENTED, "api"), pod(LONG, "web")]}


def test_status_table_fits_its_width_says_what_it_cut_and_wide_shows_names_whole():
    table = status_lines(_status_doc())
    assert all(drawn(line) <= WIDTH for line in table), max(table, key=drawn)
    assert not any(LONG in line for line in table)
    assert table[-1] == f"names cut (…) to fit {WIDTH} columns: --output wide shows them whole"
    wide = status_lines(_status_doc(), wide=True)
    assert any(f"ns/{LONG}" in line for line in wide) and not any("names cut" in line for line in wide)


@pytest.mark.parametrize("wide", [False, True])
def test_status_columns_line_up_with_double_width_characters(wide):
    lines = [line for line in status_lines(_status_doc(), wide=wide) if line[:1] in (" ", "!")]
    assert any(CJK_POD in line for line in lines) and any(CJK_CONTAINER in line for line in lines)
    assert len(_column_starts(lines, "QOS|Burstable|container")) == 1, lines
    assert len({drawn(line) for line in lines if "container" not in line}) == 1, lines


@pytest.mark.parametrize("text, columns_, expected", [
    ("warn  a b c", 100, ["warn  a b c"]),
    ("warn  aaaa bbbb cccc", 10, ["warn  aaaa", "      bbbb", "      cccc"]),
    # a word longer than a line is never split: it takes a line of its own
    ("error pods: http://127.0.0.1:10250/pods-and-more ok", 20,
     ["error pods:", "      http://127.0.0.1:10250/pods-and-more", "      ok"]),
    # measured as drawn: a CJK character takes two columns
    ("ok    中文 中文 中文", 12, ["ok    中文", "      中文", "      中文"]),
])
def test_wrap_at_display_width(text, columns_, expected):
    from memqos_systemd.columns import wrap
    assert wrap(text, columns_, indent=" " * 6) == expected


@pytest.mark.parametrize("encoding", ["latin-1", "ascii"])
def test_status_rows_stay_in_line_where_names_are_printed_as_escapes(encoding):
    """issue 33: under LANG=C or a Latin-1 locale a CJK name is printed as escapes (cli._tolerant);
    measured on the name itself, its row drifted out of line."""
    table = status_lines(_status_doc(), encoding=encoding)
    assert all(line == columns.as_printed(line, encoding) for line in table)  # nothing left to escape
    pods = [line for line in table if " Burstable " in line]
    assert len({line.index(" Burstable ") for line in pods}) == 1, "\n".join(table)
    assert all(len(line) <= WIDTH for line in table), max(table, key=len)
    assert any("\\u6570\\u636e" in line for line in pods)
    assert any("..." in line for line in pods) and not any("…" in line for line in table)
