"""fights.py: the units fought over, kept in /run for status and check; a reader that judges by time."""

import json

import pytest

from memqos_systemd import fights
from memqos_systemd.drift import Fight


def test_written_then_read_back_while_current(tmp_path):
    path = tmp_path / "fights.json"
    assert fights.write(path, [Fight("kubepods.slice", "node", {"systemd", "cgroupfs"}, 7, 100.0, 160.0, ("MemoryMin",)),
                               Fight("kube.slice", "reserved", {"systemd"}, 4, 10.0, 20.0, ("MemoryMin",))],
                        window=600.0, wall_offset=1_000_000.0)
    got = fights.current(path, 1_000_000.0 + 300.0)
    assert [(f["unit"], f["level"], f["writers"], f["writes"], f["since"], f["last"], f["changed"]) for f in got] == [
        ("kube.slice", "reserved", ["systemd"], 4, 1_000_010.0, 1_000_020.0, ["MemoryMin"]),
        ("kubepods.slice", "node", ["cgroupfs", "systemd"], 7, 1_000_100.0, 1_000_160.0, ["MemoryMin"])]
    assert [f["unit"] for f in fights.current(path, 1_000_000.0 + 700.0)] == ["kubepods.slice"]  # kube.slice is over
    assert fights.current(path, 1_000_000.0 + 800.0) == []


@pytest.mark.parametrize("content", [b"", b"not json", b"[]", json.dumps({"version": 2, "window": 1, "units": []}).encode(),
                                     json.dumps({"version": 1, "window": 600, "units": [{"unit": "x"}]}).encode(),
                                     json.dumps({"version": 1, "units": []}).encode()])
def test_a_file_of_another_shape_shows_no_fight(tmp_path, content):
    path = tmp_path / "fights.json"
    path.write_bytes(content)
    assert fights.current(path, 0.0) == []


def test_no_file_no_fight_and_a_write_that_fails_says_so(tmp_path, caplog):
    assert fights.current(tmp_path / "none.json", 0.0) == []
    (tmp_path / "ro").write_text("a file, not a directory")
    assert not fights.write(tmp_path / "ro" / "fights.json", [], window=600.0, wall_offset=0.0)
    assert "status` will not show which units are fought over" in caplog.text
