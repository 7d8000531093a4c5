"""last_pods: the last snapshot's pods, in a runtime file, for the first carry_over after a restart."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import stat

import pytest

from memqos_systemd import last_pods, runfile
from memqos_systemd.pods import Container, Pod

GI = 2**30
POD_A = Pod("11111111-1111-4111-8111-111111111111", "db", "pg-0", "Guaranteed",
            (Container("pg", "app", 2 * GI, 2 * GI, "containerd://" + "a" * 64),
             Container("init", "init", GI, None, None),
             Container("log", "sidecar", 0, None, "containerd://" + "b" * 64)),
            overhead=4096)
POD_B = Pod("22222222-2222-4222-8222-222222222222", "web", "api\n0 \u00e9\u2603", "Burstable", (),
            pod_request=GI, pod_limit=3 * GI)
POD_C = Pod("33333333-3333-4333-8333-333333333333", "web", "idle", "BestEffort",
            (Container("c", "app", 0, None, None),))


@pytest.fixture
def warnings(caplog):
    caplog.set_level(logging.DEBUG, logger="memqos_systemd")

    def get() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    return get


def doc(pods=(POD_A,)) -> dict:
    return json.loads(last_pods.encode(pods))


def test_round_trip_keeps_every_field_and_leaves_one_private_file(tmp_path, warnings):
    path = tmp_path / "run" / "memqos-systemd" / "last-pods.json"
    assert last_pods.write(path, (POD_A, POD_B, POD_C))
    assert last_pods.read(path) == (POD_A, POD_B, POD_C)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(path.parent) == ["last-pods.json"]  # no temporary file left
    assert last_pods.write(path, ())
    assert last_pods.read(path) == ()
    assert warnings() == []


def test_the_file_holds_exactly_the_fields_of_pod_and_container_and_a_version():
    """A field added to Pod or Container must reach the file (and then bump VERSION), unless it
    is of no use to a remembered pod (last_pods._NOT_KEPT)."""
    d = doc()
    assert set(d) == {"version", "pods"} and d["version"] == last_pods.VERSION == 1
    assert set(d["pods"][0]) == {f.name for f in dataclasses.fields(Pod)} - {"resize_pending"}
    assert set(d["pods"][0]["containers"][0]) == {f.name for f in dataclasses.fields(Container)}


def test_a_pending_resize_is_not_remembered_and_the_file_of_an_earlier_daemon_still_reads(tmp_path):
    # A remembered pod keeps the values it had while its slice runs; whether a resize of it was
    # pending is of no use then. The file stays as daemons before that field wrote it.
    path = tmp_path / "last-pods.json"
    assert last_pods.write(path, (dataclasses.replace(POD_B, resize_pending="Infeasible"),))
    assert last_pods.read(path) == (POD_B,)
    before = {"version": 1, "pods": [{"uid": POD_C.uid, "namespace": "web", "name": "idle", "qos": "BestEffort",
                                      "overhead": 0, "pod_request": None, "pod_limit": None, "containers": [
                                          {"name": "c", "kind": "app", "request": 0, "limit": None,
                                           "container_id": None}]}]}
    path.write_text(json.dumps(before))
    assert last_pods.read(path) == (POD_C,)


def test_a_missing_file_remembers_nothing_without_a_word(tmp_path, warnings):
    assert last_pods.read(tmp_path / "none.json") == ()
    assert warnings() == []


def _one_warning(warnings, path, why: str) -> None:
    got = warnings()
    assert len(got) == 1, got
    assert str(path) in got[0] and why in got[0] and "\n" not in got[0]


@pytest.mark.parametrize("content, why", [
    (b"", "not JSON"),
    (b'{"version": 1, "pods": [', "not JSON"),  # cut
    (b"\xff\xfe{}", "not JSON"),
    (b"[" * 100000 + b"]" * 100000, "not JSON"),  # nested too deeply
    (b'{"version": 1, "pods": [{"overhead": 1' + b"0" * 5000 + b"}]}", "not JSON"),  # a 5,000-digit number
    (b"[]", "no version"),
    (b'{"pods": []}', "no version"),
    (b"null", "no version"),
])
def test_a_corrupt_file_is_ignored_with_one_warning(tmp_path, warnings, content, why):
    path = tmp_path / "last-pods.json"
    path.write_bytes(content)
    assert last_pods.read(path) == ()
    _one_warning(warnings, path, why)


@pytest.mark.parametrize("version", [0, 2, "1", 1.0, True, None])
def test_another_version_is_ignored_with_one_warning(tmp_path, warnings, version):
    path = tmp_path / "last-pods.json"
    path.write_text(json.dumps({**doc(), "version": version}))
    assert last_pods.read(path) == ()
    _one_warning(warnings, path, f"this version reads {last_pods.VERSION}")


def _set(d: dict, where: str, value) -> dict:
    """`d` with the field at a dotted path (pods.0.containers.1.kind) set, or deleted if value is DEL."""
    keys = [int(k) if k.isdigit() else k for k in where.split(".")]
    obj = d
    for k in keys[:-1]:
        obj = obj[k]
    if value is DEL:
        del obj[keys[-1]]
    else:
        obj[keys[-1]] = value
    return d


DEL = object()


@pytest.mark.parametrize("where, value", [
    ("pods", {}),
    ("pods", None),
    ("pods.0", "pod"),
    ("pods.0.uid", 7),
    ("pods.0.uid", ""),
    ("pods.0.uid", DEL),
    ("pods.0.namespace", None),
    ("pods.0.name", ["pg-0"]),
    ("pods.0.qos", "Gold"),
    ("pods.0.overhead", -1),
    ("pods.0.overhead", 1.5),
    ("pods.0.overhead", "4096"),
    ("pods.0.overhead", True),
    ("pods.0.overhead", 2**63),
    ("pods.0.overhead", None),
    ("pods.0.pod_request", "1Gi"),
    ("pods.0.pod_limit", -5),
    ("pods.0.containers", {"pg": {}}),
    ("pods.0.containers", None),
    ("pods.0.containers.0", ["pg"]),
    ("pods.0.containers.0.name", None),
    ("pods.0.containers.0.kind", "ephemeral"),
    ("pods.0.containers.0.request", None),
    ("pods.0.containers.0.request", "2Gi"),
    ("pods.0.containers.0.limit", False),
    ("pods.0.containers.0.container_id", 12),
    ("pods.0.containers.0.container_id", DEL),
    ("pods.0.containers.0.image", "nginx"),  # a field Container does not have
    ("pods.0.priority", 5),  # nor Pod
    ("extra", 1),  # nor the file
])
def test_a_field_of_the_wrong_type_or_shape_discards_the_whole_file_with_one_warning(tmp_path, warnings,
                                                                                      where, value):
    path = tmp_path / "last-pods.json"
    path.write_text(json.dumps(_set(doc((POD_B, POD_A, POD_C)), where.replace("pods.0", "pods.1"), value)))
    assert last_pods.read(path) == ()  # never the pods that were fine
    _one_warning(warnings, path, "ignored")


def test_a_uid_twice_discards_the_whole_file(tmp_path, warnings):
    path = tmp_path / "last-pods.json"
    path.write_bytes(last_pods.encode((POD_A, dataclasses.replace(POD_B, uid=POD_A.uid))))
    assert last_pods.read(path) == ()
    _one_warning(warnings, path, "twice")


def test_an_oversized_file_is_ignored_unparsed_with_one_warning(tmp_path, warnings, monkeypatch):
    path = tmp_path / "last-pods.json"
    path.write_bytes(last_pods.encode((POD_A,)) + b" " * last_pods.MAX_BYTES)
    monkeypatch.setattr(last_pods.json, "loads", lambda *a: pytest.fail("parsed"))
    assert last_pods.read(path) == ()
    _one_warning(warnings, path, f"larger than {last_pods.MAX_BYTES} bytes")


def test_too_many_pods_to_write_removes_the_old_file_rather_than_leave_it_stale(tmp_path, warnings, monkeypatch):
    path = tmp_path / "last-pods.json"
    assert last_pods.write(path, (POD_A,))
    monkeypatch.setattr(last_pods, "MAX_BYTES", len(last_pods.encode((POD_A, POD_B))) - 1)
    assert last_pods.write(path, (POD_A, POD_B)) is False
    assert not path.exists()
    _one_warning(warnings, path, "more than")


def test_an_unreadable_file_is_ignored_with_one_warning(tmp_path, warnings):
    path = tmp_path / "last-pods.json"
    path.mkdir()  # reading a directory fails (EISDIR) even as root
    assert last_pods.read(path) == ()
    _one_warning(warnings, path, "cannot read")


def test_an_unwritable_directory_is_a_warning_not_an_error(tmp_path, warnings):
    blocker = tmp_path / "run"
    blocker.write_text("")  # a file where the directory must go
    path = blocker / "last-pods.json"
    assert last_pods.write(path, (POD_A,)) is False
    _one_warning(warnings, path, "cannot remember")
    assert last_pods.write(path, (POD_A,), warn=False) is False
    assert len(warnings()) == 1  # quiet when asked
    assert last_pods.read(path) == ()


def test_a_failed_replace_keeps_the_old_file_whole_and_leaves_no_temporary(tmp_path, warnings, monkeypatch):
    path = tmp_path / "last-pods.json"
    assert last_pods.write(path, (POD_A,))

    def refuse(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(runfile.os, "replace", refuse)
    assert last_pods.write(path, (POD_A, POD_B)) is False
    assert last_pods.read(path) == (POD_A,)
    assert os.listdir(tmp_path) == ["last-pods.json"]
    _one_warning(warnings, path, "No space left on device")


def test_any_text_the_kubelet_sent_round_trips(tmp_path):
    """Names are untrusted text: control characters, a lone surrogate (JSON allows \\ud800), NUL."""
    odd = dataclasses.replace(POD_B, namespace="a\x00b\x1b[31m", name="\ud800x\U0001f600\u2028")
    path = tmp_path / "last-pods.json"
    assert last_pods.write(path, (odd,))
    assert last_pods.read(path) == (odd,)


def test_more_pods_than_a_node_can_run_discards_the_file(tmp_path, warnings, monkeypatch):
    path = tmp_path / "last-pods.json"
    assert last_pods.write(path, (POD_A, POD_B))
    monkeypatch.setattr(last_pods, "MAX_PODS", 1)
    assert last_pods.read(path) == ()
    _one_warning(warnings, path, "more than 1 pods")
