"""read_invocation_id and read_cgroup_memory: what systemd applied to a started slice's cgroup, read
(user.invocation_id / trusted.invocation_id, 32 hex digits; tests/e2e 12-invocation-path X shows
it on systemd 252). Real extended attributes on real directories: the CI machine's disk takes
user.* attributes, which is what the service reads."""

import os

import pytest

from memqos_systemd.cgroupfs import INVOCATION_XATTRS, read_invocation_id
from memqos_systemd.systemd import invocation_path

ID = bytes.fromhex("97e66e6d2f824c16a159ece09d4a56fb")


def cgroup(tmp_path, **xattrs):
    d = tmp_path / "kubepods.slice"
    d.mkdir(exist_ok=True)
    for name, value in xattrs.items():
        os.setxattr(d, name.replace("_", ".", 1), value)
    return d


def test_the_id_on_the_cgroup_is_read_as_16_bytes_and_names_the_run_path(tmp_path):
    d = cgroup(tmp_path, user_invocation_id=ID.hex().encode())
    assert read_invocation_id(d) == ID
    assert read_invocation_id(str(d)) == ID
    assert invocation_path(read_invocation_id(d)) == "/org/freedesktop/systemd1/unit/_39" + ID.hex()[1:]


def test_user_attribute_comes_first():
    assert INVOCATION_XATTRS == ("user.invocation_id", "trusted.invocation_id")


@pytest.mark.parametrize("value", [
    b"", b"97e66e6d", ID.hex().encode() + b"\n", ID.hex().upper().encode(), b"0" * 32,
    b"g" * 32, "é".encode() * 16, b"\xff" * 32,
], ids=["empty", "short", "newline", "upper", "null-id", "not-hex", "utf8", "binary"])
def test_anything_but_32_lowercase_hex_digits_is_no_id(tmp_path, value):
    assert read_invocation_id(cgroup(tmp_path, user_invocation_id=value)) is None


def test_no_attribute_no_directory_or_a_file_is_no_id(tmp_path):
    assert read_invocation_id(cgroup(tmp_path)) is None  # not started: no attribute
    assert read_invocation_id(tmp_path / "gone.slice") is None  # collected: no directory
    f = tmp_path / "memory.low"
    f.write_text("0\n")
    assert read_invocation_id(f) is None


def test_the_kernels_memory_values_are_read_from_the_cgroup_files(tmp_path):
    from memqos_systemd.cgroupfs import read_cgroup_memory
    from memqos_systemd.quantity import UINT64_MAX

    d = cgroup(tmp_path)
    (d / "memory.min").write_text("0\n")
    (d / "memory.low").write_text("134217728\n")
    (d / "memory.high").write_text("max\n")
    assert read_cgroup_memory(d) == {"MemoryMin": 0, "MemoryLow": 128 << 20, "MemoryHigh": UINT64_MAX}
    (d / "memory.low").write_text("max\n")
    assert read_cgroup_memory(d)["MemoryLow"] == UINT64_MAX


@pytest.mark.parametrize("bad", ["", "-1\n", "12k\n", str(2**64) + "\n", "1 2\n"])
def test_a_missing_or_unreadable_memory_file_gives_no_values(tmp_path, bad):
    from memqos_systemd.cgroupfs import read_cgroup_memory

    d = cgroup(tmp_path)
    assert read_cgroup_memory(d) is None  # no files at all
    (d / "memory.min").write_text("0\n")
    (d / "memory.high").write_text("max\n")
    assert read_cgroup_memory(d) is None  # memory.low missing
    (d / "memory.low").write_text(bad)
    assert read_cgroup_memory(d) is None
    assert read_cgroup_memory(tmp_path / "gone.slice") is None
