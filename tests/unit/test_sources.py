"""Pod sources without a network: the snapshot rules, the podsFile source, make_source.

The kubelet source against real HTTP(S) servers is in tests/integration/test_source_kubelet.py.
"""

from __future__ import annotations

import json
import os

import pytest

from memqos_systemd.config import Config, KubeletSettings
from memqos_systemd.sources import (
    MAX_RESPONSE_BYTES, FileSource, KubeletSource, Snapshot, SourceError, make_source, snapshot_from_doc,
)


def pod(name: str, uid: str, memory: str | None = "128Mi", phase: str = "Running") -> dict:
    res = {"requests": {"memory": memory}} if memory is not None else {}
    return {
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {"containers": [{"name": "app", "resources": res}]},
        "status": {"phase": phase},
    }


UID1 = "11111111-1111-4111-8111-111111111111"
UID2 = "22222222-2222-4222-8222-222222222222"
BAD = {"metadata": {"name": "broken", "uid": "33333333-3333-4333-8333-333333333333"},
       "spec": {"containers": [{"name": "c", "resources": {"requests": {"memory": "lots"}}}]}}


def pod_list(*items) -> dict:
    return {"kind": "PodList", "apiVersion": "v1", "items": list(items)}


class Clock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


# ---------------------------------------------------------------- snapshot rules

def test_snapshot_good_list():
    snap = snapshot_from_doc(pod_list(pod("a", UID1), pod("b", UID2)), "test", 5.0)
    assert isinstance(snap, Snapshot)
    assert [p.name for p in snap.pods] == ["a", "b"]
    assert snap.warnings == () and snap.source == "test" and snap.fetched_at == 5.0
    assert isinstance(snap.pods, tuple)


def test_snapshot_partly_bad_keeps_good_pods_and_warns():
    snap = snapshot_from_doc(pod_list(pod("a", UID1), BAD), "test", 0)
    assert [p.name for p in snap.pods] == ["a"]
    assert len(snap.warnings) == 1 and "broken" in snap.warnings[0]


def test_snapshot_every_pod_bad_is_an_error():
    with pytest.raises(SourceError) as e:
        snapshot_from_doc(pod_list(BAD, {"metadata": {"name": "x"}}), "kubelet http://x/pods", 0)
    assert e.value.kind == "pods"
    msg = str(e.value)
    assert msg.startswith("kubelet http://x/pods: every pod in the list was rejected")
    assert "(and 1 more)" in msg and "\n" not in msg


def test_snapshot_bad_items_beside_finished_pods_is_an_error():
    # Nothing usable and something rejected: garbage, not an empty node.
    with pytest.raises(SourceError):
        snapshot_from_doc(pod_list(pod("done", UID1, phase="Succeeded"), BAD), "test", 0)


@pytest.mark.parametrize("doc", [pod_list(), {"kind": "PodList", "items": None}, [],
                                 pod_list(pod("done", UID1, phase="Succeeded"))])
def test_snapshot_really_empty_node_is_fine(doc):
    snap = snapshot_from_doc(doc, "test", 0)
    assert snap.pods == () and snap.warnings == ()


@pytest.mark.parametrize("doc", [None, 42, "pods", {"kind": "Node"}, {"kind": "PodList", "items": {}}])
def test_snapshot_not_a_pod_list(doc):
    with pytest.raises(SourceError) as e:
        snapshot_from_doc(doc, "test", 0)
    assert e.value.kind == "pods" and str(e.value).startswith("test: not a pod list")


def test_source_error_is_one_line():
    e = SourceError("a\nb   c\r\nd", "http")
    assert str(e) == "a b c d" and e.kind == "http"


# ---------------------------------------------------------------- file source

def write(path, text: str | bytes, mtime_ns: int | None = None) -> None:
    data = text.encode() if isinstance(text, str) else text
    path.write_bytes(data)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))


def test_file_json(tmp_path):
    f = tmp_path / "pods.json"
    write(f, json.dumps(pod_list(pod("a", UID1))))
    src = FileSource(f, clock=Clock(7.0))
    snap = src.fetch()
    assert [p.name for p in snap.pods] == ["a"] and snap.fetched_at == 7.0
    assert snap.source == f"file {f}"


def test_file_yaml(tmp_path):
    f = tmp_path / "pods.yaml"
    write(f, f"""
kind: PodList
items:
- metadata: {{name: a, namespace: ns, uid: {UID1}}}
  spec:
    containers:
    - name: app
      resources: {{requests: {{memory: 1Gi}}, limits: {{memory: 1Gi, cpu: "1"}}}}
""")
    snap = FileSource(f).fetch()
    assert snap.pods[0].key == "ns/a" and snap.pods[0].request == 2**30


def test_file_yaml_without_a_final_newline_is_taken_as_cut_short_json_is_not(tmp_path):
    # "memory: 25" of "256Mi" is valid YAML: without this rule a cut file lowered a protection.
    f = tmp_path / "pods.yaml"
    text = f"kind: PodList\nitems:\n- metadata: {{name: a, namespace: ns, uid: {UID1}}}\n" \
           "  spec: {containers: [{name: app, resources: {requests: {memory: 1Gi}}}]}\n"
    write(f, text[:-1])
    with pytest.raises(SourceError) as e:
        FileSource(f).fetch()
    assert e.value.kind == "decode" and "does not end with a newline" in str(e.value) and str(f) in str(e.value)
    write(f, text)
    assert FileSource(f).fetch().pods[0].request == 2**30
    write(f, json.dumps(pod_list(pod("a", UID1))))  # no newline: fine, a cut JSON never parses
    assert [p.name for p in FileSource(f).fetch().pods] == ["a"]


def test_file_change_detection(tmp_path):
    f = tmp_path / "pods.json"
    write(f, json.dumps(pod_list(pod("a", UID1))), mtime_ns=1_000_000_000)
    clock = Clock(1.0)
    src = FileSource(f, clock=clock)
    assert src.changed()  # never fetched
    first = src.fetch()
    assert not src.changed()
    clock.t = 2.0
    again = src.fetch()  # unchanged: cached, not re-read, but current as of now
    assert again.pods is first.pods and again.fetched_at == 2.0

    # Same size, new mtime: changed.
    write(f, json.dumps(pod_list(pod("b", UID1))), mtime_ns=2_000_000_000)
    assert src.changed()
    assert [p.name for p in src.fetch().pods] == ["b"]
    assert not src.changed()

    # Same mtime, different size: changed.
    write(f, json.dumps(pod_list(pod("b", UID1), pod("c", UID2))), mtime_ns=2_000_000_000)
    assert src.changed()
    assert len(src.fetch().pods) == 2

    # Replaced by rename (new inode), same mtime and size: changed.
    g = tmp_path / "new.json"
    write(g, f.read_bytes().replace(b'"c"', b'"d"'), mtime_ns=2_000_000_000)
    os.replace(g, f)
    assert src.changed()
    assert [p.name for p in src.fetch().pods] == ["b", "d"]


def test_file_unchanged_is_not_reread(tmp_path):
    """An unchanged file (by its stat) hands back the pods of the last fetch, the same objects:
    nothing read or parsed again (the daemon's settled round then compares them at once)."""
    f = tmp_path / "pods.json"
    write(f, json.dumps(pod_list(pod("a", UID1))))
    src = FileSource(f)
    first = src.fetch()
    again = src.fetch()
    assert again.pods is first.pods
    write(f, json.dumps(pod_list(pod("a", UID1), pod("b", UID2))))
    assert src.fetch().pods is not first.pods


@pytest.mark.parametrize("content", [
    "",
    "   \n",
    '{"kind": "PodList", "items": [{"metadata": {"name": "a"',  # cut off mid-write
    "kind: PodList\nitems:\n- metadata: {name: a\n",
    b"\xff\xfe garbage",
])
def test_file_half_written_raises_then_recovers(tmp_path, content):
    f = tmp_path / "pods.json"
    write(f, json.dumps(pod_list(pod("a", UID1))), mtime_ns=1_000_000_000)
    src = FileSource(f)
    good = src.fetch()
    write(f, content, mtime_ns=2_000_000_000)
    assert src.changed()
    with pytest.raises(SourceError) as e:
        src.fetch()
    assert str(e.value).startswith(f"file {f}: ") and e.value.kind == "decode"
    # The poller is not woken again for the same broken file...
    assert not src.changed()
    # ...and fetching again still refuses it rather than handing back anything.
    with pytest.raises(SourceError):
        src.fetch()
    # The writer finishes: picked up.
    write(f, json.dumps(pod_list(pod("a", UID1), pod("b", UID2))), mtime_ns=3_000_000_000)
    assert src.changed()
    assert len(src.fetch().pods) == 2 and len(good.pods) == 1


def test_file_missing(tmp_path):
    src = FileSource(tmp_path / "nope.yaml")
    assert src.changed()
    with pytest.raises(SourceError) as e:
        src.fetch()
    assert e.value.kind == "io" and "nope.yaml: cannot read: No such file or directory" in str(e.value)
    assert not src.changed()  # still missing: nothing new to report
    write(tmp_path / "nope.yaml", json.dumps(pod_list(pod("a", UID1))))
    assert src.changed()
    assert len(src.fetch().pods) == 1


def test_file_too_large(tmp_path):
    f = tmp_path / "pods.json"
    write(f, json.dumps(pod_list(pod("a", UID1))))
    with pytest.raises(SourceError) as e:
        FileSource(f, max_bytes=50).fetch()
    assert e.value.kind == "too_large"


def test_file_size_cap_default_is_10_mib(tmp_path):
    f = tmp_path / "pods.json"
    f.write_bytes(b" " * (MAX_RESPONSE_BYTES + 1))
    with pytest.raises(SourceError) as e:
        FileSource(f).fetch()
    assert e.value.kind == "too_large"


def test_file_directory(tmp_path):
    with pytest.raises(SourceError) as e:
        FileSource(tmp_path).fetch()
    assert "not a regular file" in str(e.value) or "cannot read" in str(e.value)


@pytest.mark.parametrize("text,expect", [
    ("a: &x [1]\nb: *x\n", "aliases"),
    ("!!python/object/apply:os.system ['true']\n", "not valid YAML (or JSON)"),
    ("[" * 100000, "nested too deeply"),
])
def test_file_hostile_yaml(tmp_path, text, expect):
    f = tmp_path / "pods.yaml"
    write(f, text)
    with pytest.raises(SourceError) as e:
        FileSource(f).fetch()
    assert expect in str(e.value) or e.value.kind in ("decode", "pods")


def test_file_every_pod_bad(tmp_path):
    f = tmp_path / "pods.json"
    write(f, json.dumps(pod_list(BAD)))
    with pytest.raises(SourceError) as e:
        FileSource(f).fetch()
    assert e.value.kind == "pods"


def test_file_partly_bad(tmp_path):
    f = tmp_path / "pods.json"
    write(f, json.dumps(pod_list(BAD, pod("a", UID1))))
    snap = FileSource(f).fetch()
    assert [p.name for p in snap.pods] == ["a"] and len(snap.warnings) == 1


# ---------------------------------------------------------------- make_source

def test_make_source_prefers_pods_file(tmp_path):
    src = make_source(Config(pods_file=str(tmp_path / "p.json")))
    assert isinstance(src, FileSource) and src.path == str(tmp_path / "p.json")


def test_make_source_kubelet_by_default():
    src = make_source(Config())
    assert isinstance(src, KubeletSource)
    assert src.name == "kubelet http://127.0.0.1:10255/pods"


def test_make_source_passes_clock(tmp_path):
    f = tmp_path / "p.json"
    write(f, json.dumps(pod_list()))
    assert make_source(Config(pods_file=str(f)), clock=Clock(42.0)).fetch().fetched_at == 42.0


def test_kubelet_name_hides_the_query():
    src = KubeletSource(KubeletSettings(url="https://127.0.0.1:10250/pods?token=abc"))
    assert src.name == "kubelet https://127.0.0.1:10250/pods"


def test_a_kubelet_url_with_credentials_is_refused_without_showing_them():
    """The config refuses it (config.url_problem); a source made from code says so at fetch."""
    src = KubeletSource(KubeletSettings(url="https://user:secret@127.0.0.1:10250/pods?token=abc"))
    with pytest.raises(SourceError) as e:
        src.fetch()
    assert "secret" not in str(e.value) and "abc" not in str(e.value) and "user" not in src.name
    assert "kubelet.url: 'https://127.0.0.1:10250/pods' must not carry a user name or password" in str(e.value)


@pytest.mark.parametrize("text,expect", [
    ("Bearer abcdefghijklmnop rejected", "Bearer <token> rejected"),
    ("cut: abcdefghij...", "cut: <token>..."),       # a truncated copy
    ("twice abcdefghijklmnop abcdefghijklmnop", "twice <token> <token>"),
    ("abcdefg is too short to be it", "abcdefg is too short to be it"),
    ("nothing here", "nothing here"),
])
def test_redact(text, expect):
    from memqos_systemd.sources.kubelet import redact
    assert redact(text, "abcdefghijklmnop") == expect


PACKAGED = ([(bytes([127, 0, 0, 0]), 8), (bytes(15) + b"\x01", 128)], [(bytes(4), 0), (bytes(16), 0)])
RUNNING = "the running service's unit lets it reach only 127.0.0.0/8 ::1/128"
NOT_RUNNING = ("the packaged unit (IPAddressDeny=any, IPAddressAllow=localhost; the service does not run here, so"
               " drop-ins are not known) lets it reach only 127.0.0.0/8 ::1/128")


@pytest.mark.parametrize("url, access, verdict", [
    # the running service's own lists (drop-ins included): an error
    ("https://127.0.0.1:10250/pods", PACKAGED, None),
    ("https://127.0.0.2:10250/pods", PACKAGED, None),  # 127.0.0.0/8
    ("https://[::1]:10250/pods", PACKAGED, None),
    ("https://localhost:10250/pods", PACKAGED, None),
    ("https://10.0.0.5:10250/pods", PACKAGED, ("error", RUNNING, "10.0.0.5")),
    ("http://10.1.2.3:10255/pods", PACKAGED, ("error", RUNNING, "10.1.2.3")),
    ("http://[fd00::5]:10255/pods", PACKAGED, ("error", RUNNING, "fd00::5")),
    ("https://localhost:10250/pods", (PACKAGED[0][1:], PACKAGED[1]), None),  # ::1 gets through
    ("https://127.0.0.1:10250/pods", (PACKAGED[0][1:], PACKAGED[1]), ("error", "reach only ::1/128", "127.0.0.1")),
    ("https://10.0.0.5:10250/pods", ([(bytes([10, 0, 0, 0]), 8)], PACKAGED[1]), None),  # a drop-in allows it
    ("https://10.0.0.5:10250/pods", ([], []), None),  # no sandbox
    # no service running: the packaged unit's, a warning (a DaemonSet's pod has no such sandbox)
    ("https://10.0.0.5:10250/pods", None, ("warn", NOT_RUNNING, "10.0.0.5")),
    ("https://127.0.0.1:10250/pods", None, None),
    # a name other than localhost is not resolved here: it cannot be known to be loopback
    ("https://node-1:10250/pods", PACKAGED, ("warn", "its host 'node-1' is a name, which check does not resolve", None)),
    ("https://node-1:10250/pods", None, ("warn", "its host 'node-1' is a name", None)),
    ("https://node-1:10250/pods", ([], []), None),
])
def test_a_kubelet_address_the_services_sandbox_leaves_out_is_named(url, access, verdict, monkeypatch):
    import socket

    from memqos_systemd.sources.kubelet import unreachable_in_service

    def no_lookup(*args, **kwargs):
        raise AssertionError("nothing is resolved")
    monkeypatch.setattr(socket, "getaddrinfo", no_lookup)
    got = unreachable_in_service(url, access)
    if verdict is None:
        assert got is None, got
        return
    level, says, blocked = verdict
    assert got[0] == level and says in got[1], got
    assert got[1].startswith(f"kubelet.url {url!r}"), got
    if blocked:
        assert f", not {blocked}: use https://127.0.0.1:10250/pods" in got[1], got
        assert got[1].endswith(f"[Service] IPAddressAllow={blocked}"), got


def test_a_connect_the_sandbox_refuses_says_where_to_look(monkeypatch):
    """The unit's IPAddressDeny= makes connect() fail with EPERM: the journal line says why."""
    import errno
    import socket as sockets

    def refused(*args, **kwargs):
        raise PermissionError(errno.EPERM, "Operation not permitted")
    monkeypatch.setattr(sockets, "create_connection", refused)
    with pytest.raises(SourceError) as e:
        KubeletSource(KubeletSettings(url="http://10.0.0.5:10255/pods")).fetch()
    assert str(e.value) == ("kubelet http://10.0.0.5:10255/pods: Operation not permitted: the service's unit may not"
                            " let it reach that address (IPAddressAllow=; memqos-systemd check says)")


def test_redact_short_secret():
    from memqos_systemd.sources.kubelet import redact
    assert redact("a abc b", "abc") == "a <token> b"


# ---------------------------------------------------------------- the service's sandbox

def _unit_file() -> str:
    from pathlib import Path
    for d in Path(__file__).resolve().parents:
        if (d / "units" / "memqos-systemd.service").is_file():
            return (d / "units" / "memqos-systemd.service").read_text(encoding="utf-8")
    pytest.fail("units/memqos-systemd.service not found above tests/")


def test_the_hidden_directories_are_what_the_unit_hides():
    from memqos_systemd.sources.file import SANDBOX_HIDDEN
    lines = _unit_file().splitlines()
    for _, setting in SANDBOX_HIDDEN:
        assert setting in lines, setting
    # And every directory those settings hide is listed (systemd.exec(5)).
    assert {top for top, _ in SANDBOX_HIDDEN} == {"/home", "/root", "/run/user", "/tmp", "/var/tmp", "/dev/shm"}


@pytest.mark.parametrize("path, hidden", [
    ("/tmp/x.json", "its own, empty /tmp (PrivateTmp=yes"),
    ("/var/tmp/pods.yaml", "its own, empty /var/tmp (PrivateTmp=yes"),
    ("/root/pods.json", "no /root (ProtectHome=yes"),
    ("/home/ops/pods.json", "no /home (ProtectHome=yes"),
    ("/run/user/1000/pods.json", "no /run/user (ProtectHome=yes"),
    ("/dev/shm/pods.json", "its own, empty /dev/shm (PrivateDevices=yes"),
    ("/etc/memqos-systemd/pods.json", None),
    ("/tmpfoo/pods.json", None),
    ("/var/lib/memqos/pods.json", None),
])
def test_a_pods_file_the_service_cannot_see(path, hidden):
    from memqos_systemd.sources.file import hidden_from_service
    got = hidden_from_service(path)
    if hidden is None:
        assert got is None
    else:
        assert got.startswith(f"the service has {hidden}") and "/etc/memqos-systemd/" in got


def test_a_link_into_a_hidden_directory_is_hidden_too(tmp_path):
    from memqos_systemd.sources.file import hidden_from_service
    assert str(tmp_path).startswith("/tmp/")  # pytest's tmp_path, as on every machine we run on
    assert hidden_from_service(tmp_path / "pods.json") is not None


def test_the_service_says_why_it_cannot_read_a_pods_file_in_tmp(tmp_path):
    with pytest.raises(SourceError) as e:
        FileSource(tmp_path / "gone.json").fetch()
    assert str(e.value) == (f"file {tmp_path}/gone.json: cannot read: No such file or directory: the service has its"
                            f" own, empty /tmp (PrivateTmp=yes in memqos-systemd.service): move the file out of"
                            f" /tmp, e.g. to /etc/memqos-systemd/")


# ---------------------------------------------------------------- the kubelet's certificate names

@pytest.mark.parametrize("name, kind, value, ok", [
    ("node-1", "DNS", "node-1", True),
    ("node-1", "DNS", "NODE-1", True),
    ("node-1.example", "DNS", "*.example", True),
    ("a.node-1.example", "DNS", "*.example", False),   # a wildcard is one label
    ("example", "DNS", "*.example", False),
    ("node-1", "DNS", "node-2", False),
    ("127.0.0.1", "IP Address", "127.0.0.1", True),
    ("::1", "IP Address", "0:0:0:0:0:0:0:1", True),
    ("127.0.0.1", "DNS", "127.0.0.1", False),          # an IP is matched by IP SANs only
    ("node-1", "IP Address", "127.0.0.1", False),
    ("127.0.0.1", "IP Address", "127.0.0.2", False),
])
def test_certificate_name_matching(name, kind, value, ok):
    from memqos_systemd.sources.kubelet import _name_matches
    assert _name_matches(name, kind, value) is ok


@pytest.mark.parametrize("url, server_name, names", [
    ("https://127.0.0.1:10250/pods", None, ("127.0.0.1", "node-1")),
    ("https://[::1]:10250/pods", None, ("::1", "node-1")),
    ("https://localhost:10250/pods", None, ("localhost", "node-1")),
    ("https://node-1:10250/pods", None, ("node-1",)),
    ("https://10.0.0.5:10250/pods", None, ("10.0.0.5",)),
    ("https://127.0.0.1:10250/pods", "kubelet.example", ("kubelet.example",)),
])
def test_names_the_kubelets_certificate_may_carry(url, server_name, names):
    src = KubeletSource(KubeletSettings(url=url, server_name=server_name), hostname=lambda: "node-1")
    assert src._names == names


# ---------------------------------------------------------------- odd files and URLs

def test_fifo_instead_of_pods_file_does_not_hang(tmp_path):
    f = tmp_path / "pods.json"
    os.mkfifo(f)
    with pytest.raises(SourceError) as e:
        FileSource(f).fetch()
    assert "not a regular file" in str(e.value)


def test_fifo_instead_of_token_file_does_not_hang(tmp_path):
    f = tmp_path / "token"
    os.mkfifo(f, 0o600)
    src = KubeletSource(KubeletSettings(url="http://127.0.0.1:1/pods", token_file=str(f)))
    with pytest.raises(SourceError) as e:
        src.fetch()
    assert e.value.kind == "auth" and "not a regular file" in str(e.value)


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999/pods", "ftp://127.0.0.1/pods", "https:///pods",
                                 "https://[::1/pods"])
def test_bad_url_fails_at_fetch_not_at_construction(url):
    src = KubeletSource(KubeletSettings(url=url))  # a SIGHUP must never crash on making a source
    with pytest.raises(SourceError) as e:
        src.fetch()
    assert str(e.value).startswith(f"kubelet: kubelet.url: {url!r} "), str(e.value)


# ---------------------------------------------------------------- fuzz: garbage in, SourceError out

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(
        st.sampled_from(["kind", "items", "metadata", "spec", "status", "name", "uid", "namespace", "containers",
                         "resources", "requests", "limits", "memory", "phase", "qosClass", "containerStatuses",
                         "containerID", "state", "running", "initContainers", "restartPolicy", "overhead", "x"]),
        inner, max_size=6),
    max_leaves=40,
)


def _check(result: Snapshot) -> None:
    assert isinstance(result.pods, tuple) and isinstance(result.warnings, tuple)
    # Never an empty snapshot that hides rejected pods.
    assert result.pods or not result.warnings


@settings(max_examples=150, deadline=None)
@given(st.one_of(_json, st.builds(lambda items: {"kind": "PodList", "items": items}, st.lists(_json, max_size=6))))
def test_fuzz_documents(doc):
    try:
        _check(snapshot_from_doc(doc, "fuzz", 0))
    except SourceError as e:
        assert str(e).startswith("fuzz: ") and "\n" not in str(e)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=3000) | st.text(max_size=3000).map(str.encode))
def test_fuzz_file_bytes(tmp_path, data):
    f = tmp_path / "pods.yaml"
    f.write_bytes(data)
    try:
        _check(FileSource(f).fetch())
    except SourceError as e:
        assert str(e).startswith(f"file {f}: ") and e.kind in ("decode", "pods")


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=3000) | _json.map(lambda d: json.dumps(d).encode()))
def test_fuzz_kubelet_body(data):
    src = KubeletSource(KubeletSettings(url="http://127.0.0.1:1/pods"))
    src._get = lambda token, endpoint: data  # the HTTP exchange itself is tested against real servers
    try:
        _check(src.fetch())
    except SourceError as e:
        assert str(e).startswith("kubelet http://127.0.0.1:1/pods: ") and e.kind in ("decode", "pods")
