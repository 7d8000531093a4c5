"""read_invocation_id: the invocation ID systemd sets on a started slice's cgroup directory
(user.invocation_id / trusted.invocation_id, 32 hex digits; tests/e2e 12-invocation-path X shows
it on systemd 252). Real extended attributes on real directories: the CI machine's disk takes
user.* attributes, which is what the service reads."""

import os

import pytest

from memqos_systemd.systemd import INVOCATION_XATTRS, invocation_path, read_invocation_id

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
