"""ledger: the reserved slices the service has written, in a runtime file."""

import logging
import os

from memqos_systemd import ledger
from memqos_systemd.ceiling_watch import CEILING_LEDGER


def test_a_missing_ledger_is_empty(tmp_path):
    assert ledger.read(tmp_path / "none") == set()


def test_write_then_read_and_the_directory_is_made(tmp_path):
    path = tmp_path / "run" / "memqos-systemd" / "reserved-slices"
    assert ledger.write(path, {"system.slice", "kube.slice"})
    assert path.read_text() == "kube.slice\nsystem.slice\n"
    assert ledger.read(path) == {"kube.slice", "system.slice"}
    assert ledger.write(path, set())
    assert ledger.read(path) == set()
    assert sorted(os.listdir(path.parent)) == ["reserved-slices"]  # no temporary file left


def test_lines_that_are_not_slice_names_are_ignored_with_a_warning(tmp_path, caplog):
    path = tmp_path / "ledger"
    path.write_bytes(b"system.slice\n../etc/passwd\nkube.slice\n\nsshd.service\n\xff\xfe\n")
    with caplog.at_level(logging.WARNING, logger="memqos_systemd"):
        assert ledger.read(path) == {"system.slice", "kube.slice"}
    assert sum("not a slice name" in r.getMessage() for r in caplog.records) == 3
    assert all("\n" not in r.getMessage() for r in caplog.records)


def test_a_huge_ledger_is_ignored(tmp_path, caplog):
    path = tmp_path / "ledger"
    path.write_text("a.slice\n" * 20000)
    with caplog.at_level(logging.WARNING, logger="memqos_systemd"):
        assert ledger.read(path) == set()
    assert "larger than" in caplog.text


def test_a_ledger_that_cannot_be_written_is_a_warning_not_an_error(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="memqos_systemd"):
        assert ledger.write(blocker / "reserved-slices", {"system.slice"}) is False
    assert "cannot write the reserved-slice ledger" in caplog.text


def test_ceiling_slices_are_remembered_from_before_the_first_write_until_taken_back(tmp_path, caplog):
    path = tmp_path / "run" / "ceiling-slices"
    kept = ledger.OwnedSlices(path, CEILING_LEDGER)
    assert kept.names == set() and not path.exists()
    kept.add("kubepods-besteffort.slice")
    assert path.read_text() == "kubepods-besteffort.slice\n"
    assert ledger.OwnedSlices(path, CEILING_LEDGER).names == {"kubepods-besteffort.slice"}  # read back after a restart
    kept.discard("kubepods-besteffort.slice")
    assert ledger.read(path) == set()
    blocked = ledger.OwnedSlices(tmp_path / "run" / "ceiling-slices" / "x", CEILING_LEDGER)  # its directory is a file
    with caplog.at_level(logging.WARNING, logger="memqos_systemd"):
        blocked.add("kubepods-besteffort.slice")
    assert blocked.names == {"kubepods-besteffort.slice"} and "cannot write the ceiling ledger" in caplog.text
