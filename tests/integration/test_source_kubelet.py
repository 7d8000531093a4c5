"""The kubelet source against real HTTP and HTTPS servers on 127.0.0.1.

A CA, a server certificate signed by it, a client certificate and a rogue
self-signed certificate are made by the `openssl` CLI for this module. Without
openssl the module is skipped, except under CI=true where that is a failure.
"""

from __future__ import annotations

import http.server
import json
import logging
import shutil
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import pytest

from memqos_systemd.config import KubeletSource as KubeletConfig
from memqos_systemd.sources import MAX_RESPONSE_BYTES, SourceError
from memqos_systemd.sources.kubelet import KubeletSource
from prereq import require

pytestmark = pytest.mark.integration

TOKEN = "eyJhbGciOiJSUzI1NiJ9.c2VjcmV0LXNlcnZpY2UtYWNjb3VudA.s1gn4tur3-ZZZ"
UID1 = "11111111-1111-4111-8111-111111111111"
UID2 = "22222222-2222-4222-8222-222222222222"


def pod(name: str, uid: str, memory: str = "128Mi") -> dict:
    return {"metadata": {"name": name, "namespace": "default", "uid": uid},
            "spec": {"containers": [{"name": "app", "resources": {"requests": {"memory": memory}}}]},
            "status": {"phase": "Running"}}


BAD = {"metadata": {"name": "broken", "uid": "33333333-3333-4333-8333-333333333333"},
       "spec": {"containers": [{"name": "c", "resources": {"requests": {"memory": "lots"}}}]}}


def pod_list(*items) -> bytes:
    return json.dumps({"kind": "PodList", "apiVersion": "v1", "items": list(items)}).encode()


GOOD = pod_list(pod("a", UID1), pod("b", UID2))


# ---------------------------------------------------------------- PKI made by openssl

def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    require(shutil.which("openssl"), "openssl is not installed (scripts/install-deps.sh test)")
    d = tmp_path_factory.mktemp("pki")
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=memqos test CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=d)
    for name, usage, san in (("server", "serverAuth", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"),
                             ("client", "clientAuth", "")):
        (d / f"{name}.ext").write_text(f"basicConstraints=CA:FALSE\nextendedKeyUsage={usage}\n"
                                       f"subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n{san}")
        _openssl("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=memqos test {name}",
                 cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-out", f"{name}.crt", "-extfile", f"{name}.ext", cwd=d)
    _openssl("req", "-x509", *key, "-keyout", "rogue.key", "-out", "rogue.crt", "-days", "2",
             "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", cwd=d)
    for f in d.glob("*.key"):
        f.chmod(0o600)
    return d


# ---------------------------------------------------------------- a real server

class Server:
    """ThreadingHTTPServer on 127.0.0.1:0; `respond(handler)` answers every GET; requests are recorded."""

    def __init__(self, respond, tls: ssl.SSLContext | None = None):
        self.requests: list[dict] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802 - the stdlib's name
                outer.requests.append({"path": self.path, "headers": dict(self.headers)})
                try:
                    respond(self)
                except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                    pass  # the client stopped reading (size cap, timeout): expected

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.scheme = "https" if tls else "http"
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def url(self, host: str = "127.0.0.1") -> str:
        return f"{self.scheme}://{host}:{self.port}/pods"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def answer(status: int = 200, body: bytes = GOOD, reason: str | None = None, headers: dict | None = None):
    def respond(h):
        h.send_response(status, reason)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body)
    return respond


@pytest.fixture
def serve(pki):
    servers = []

    def start(respond=answer(), tls: str | None = "server", client_ca: bool = False) -> Server:
        ctx = None
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(pki / f"{tls}.crt", pki / f"{tls}.key")
            if client_ca:
                ctx.verify_mode = ssl.CERT_REQUIRED
                ctx.load_verify_locations(pki / "ca.crt")
        s = Server(respond, ctx)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.close()


@pytest.fixture
def token_file(tmp_path) -> Path:
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o600)
    return f


def source(url: str, **kw) -> KubeletSource:
    kw.setdefault("timeout", 5.0)
    return KubeletSource(KubeletConfig(url=url, **kw))


# ---------------------------------------------------------------- happy paths

def test_https_with_ca_and_token(serve, pki, token_file):
    s = serve()
    snap = source(s.url(), ca_file=str(pki / "ca.crt"), token_file=str(token_file)).fetch()
    assert [p.name for p in snap.pods] == ["a", "b"] and snap.warnings == ()
    assert snap.source == f"kubelet {s.url()}"
    h = s.requests[0]["headers"]
    assert h["Authorization"] == f"Bearer {TOKEN}" and h["Accept"] == "application/json"
    assert s.requests[0]["path"] == "/pods"


def test_token_is_reread_every_fetch(serve, pki, token_file):
    s = serve()
    src = source(s.url(), ca_file=str(pki / "ca.crt"), token_file=str(token_file))
    src.fetch()
    token_file.write_text("rotated-token\n")
    src.fetch()
    assert [r["headers"]["Authorization"] for r in s.requests] == [f"Bearer {TOKEN}", "Bearer rotated-token"]


def test_token_through_symlink_like_projected_tokens(serve, pki, token_file, tmp_path):
    link = tmp_path / "token-link"
    link.symlink_to(token_file)
    s = serve()
    source(s.url(), ca_file=str(pki / "ca.crt"), token_file=str(link)).fetch()
    assert s.requests[0]["headers"]["Authorization"] == f"Bearer {TOKEN}"


def test_no_token_no_header(serve, pki):
    s = serve()
    source(s.url(), ca_file=str(pki / "ca.crt")).fetch()
    assert "Authorization" not in s.requests[0]["headers"]


def test_read_only_port_over_http(serve):
    s = serve(tls=None)
    assert len(source(s.url()).fetch().pods) == 2


def test_client_certificate(serve, pki):
    s = serve(client_ca=True)
    snap = source(s.url(), ca_file=str(pki / "ca.crt"), client_cert_file=str(pki / "client.crt"),
                  client_key_file=str(pki / "client.key")).fetch()
    assert len(snap.pods) == 2


def test_client_certificate_required_but_missing(serve, pki):
    s = serve(client_ca=True)
    with pytest.raises(SourceError):
        source(s.url(), ca_file=str(pki / "ca.crt")).fetch()


def test_environment_proxy_is_ignored(serve, pki, monkeypatch):
    # A proxy would receive the bearer token; the kubelet is always reached directly.
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(var, "http://127.0.0.1:9/")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    s = serve()
    assert len(source(s.url(), ca_file=str(pki / "ca.crt")).fetch().pods) == 2


def test_fetched_at_uses_injected_clock(serve):
    s = serve(tls=None)
    src = KubeletSource(KubeletConfig(url=s.url()), clock=lambda: 1234.5)
    assert src.fetch().fetched_at == 1234.5


# ---------------------------------------------------------------- TLS verification

def test_tls_verification_is_on_by_default(serve):
    s = serve()  # signed by our test CA, which the system store does not know
    with pytest.raises(SourceError) as e:
        source(s.url()).fetch()
    assert e.value.kind == "tls" and "certificate" in str(e.value) and "caFile" in str(e.value)
    assert s.requests == []


def test_self_signed_rogue_server_is_refused_with_our_ca(serve, pki, token_file):
    s = serve(tls="rogue")
    with pytest.raises(SourceError) as e:
        source(s.url(), ca_file=str(pki / "ca.crt"), token_file=str(token_file)).fetch()
    assert e.value.kind == "tls"
    assert s.requests == []  # the token never reached it


def test_hostname_is_checked(serve, pki):
    s = serve(tls="rogue")  # SAN is 127.0.0.1 only
    with pytest.raises(SourceError) as e:
        source(s.url("localhost"), ca_file=str(pki / "rogue.crt")).fetch()
    assert e.value.kind == "tls"


def test_insecure_switch_works_and_warns_once(serve, caplog):
    s = serve(tls="rogue")
    with caplog.at_level(logging.WARNING):
        src = source(s.url(), insecure_skip_tls_verify=True)
        src.fetch()
        src.fetch()
    warnings = [r for r in caplog.records if "insecureSkipTLSVerify" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert len(s.requests) == 2


def test_bad_ca_file(serve, tmp_path):
    s = serve()
    bad = tmp_path / "ca.crt"
    bad.write_text("not a certificate")
    with pytest.raises(SourceError) as e:
        source(s.url(), ca_file=str(bad)).fetch()
    assert e.value.kind == "tls" and "caFile" in str(e.value)
    with pytest.raises(SourceError):
        source(s.url(), ca_file=str(tmp_path / "missing.crt")).fetch()


# ---------------------------------------------------------------- credentials refused

def test_world_readable_token_is_refused(serve, pki, token_file, caplog):
    token_file.chmod(0o644)
    s = serve()
    with caplog.at_level(logging.DEBUG), pytest.raises(SourceError) as e:
        source(s.url(), ca_file=str(pki / "ca.crt"), token_file=str(token_file)).fetch()
    assert e.value.kind == "auth" and "readable by everyone" in str(e.value) and "0644" in str(e.value)
    assert TOKEN not in str(e.value) and TOKEN not in caplog.text
    assert s.requests == []


def test_group_readable_token_is_fine(serve, pki, token_file):
    token_file.chmod(0o640)
    s = serve()
    source(s.url(), ca_file=str(pki / "ca.crt"), token_file=str(token_file)).fetch()


@pytest.mark.parametrize("content,why", [
    ("", "empty"),
    ("two words", "whitespace or control"),
    ("tok\x00en", "whitespace or control"),
    ("t\xf6ken", "not an ASCII token"),
])
def test_malformed_token_is_refused_without_echo(serve, pki, tmp_path, content, why):
    f = tmp_path / "token"
    f.write_text(content)
    f.chmod(0o600)
    s = serve()
    with pytest.raises(SourceError) as e:
        source(s.url(), ca_file=str(pki / "ca.crt"), token_file=str(f)).fetch()
    assert why in str(e.value) and e.value.kind == "auth"
    if content.strip():
        assert content not in str(e.value)
    assert s.requests == []


def test_missing_token_file(serve, pki, tmp_path):
    s = serve()
    with pytest.raises(SourceError) as e:
        source(s.url(), ca_file=str(pki / "ca.crt"), token_file=str(tmp_path / "nope")).fetch()
    assert e.value.kind == "auth" and "cannot read" in str(e.value)


def test_world_readable_client_key_is_refused(serve, pki, tmp_path):
    key = tmp_path / "client.key"
    key.write_bytes((pki / "client.key").read_bytes())
    key.chmod(0o644)
    s = serve(client_ca=True)
    with pytest.raises(SourceError) as e:
        source(s.url(), ca_file=str(pki / "ca.crt"), client_cert_file=str(pki / "client.crt"),
               client_key_file=str(key)).fetch()
    assert e.value.kind == "auth" and "clientKeyFile" in str(e.value) and "readable by everyone" in str(e.value)


def test_token_never_in_messages_or_logs(serve, pki, token_file, caplog):
    """Every failure path after the token was read: the token appears nowhere."""
    responders = [
        answer(401, b'{"message": "Unauthorized"}', reason=f"Unauthorized Bearer {TOKEN}"),
        answer(500, f"token {TOKEN} rejected".encode()),
        answer(200, f"not json {TOKEN}".encode()),
        answer(200, json.dumps({"kind": "PodList", "items": [
            {"metadata": {"name": TOKEN, "uid": TOKEN}, "spec": {"containers": [{"name": TOKEN, "resources": {
                "requests": {"memory": TOKEN}}}]}}]}).encode()),
        answer(200, json.dumps({"kind": TOKEN}).encode()),
    ]
    messages = []
    with caplog.at_level(logging.DEBUG):
        for respond in responders:
            s = serve(respond)
            with pytest.raises(SourceError) as e:
                source(s.url(), ca_file=str(pki / "ca.crt"), token_file=str(token_file)).fetch()
            messages.append(str(e.value))
    assert all(TOKEN[:8] not in m for m in messages), messages
    assert TOKEN[:8] not in caplog.text
    assert "<token>" in messages[0]


def test_token_never_in_warnings(serve, pki, token_file):
    echo = {"metadata": {"name": TOKEN, "namespace": TOKEN, "uid": "x"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"memory": TOKEN}}}]}}
    s = serve(answer(200, pod_list(pod("a", UID1), echo)))
    snap = source(s.url(), ca_file=str(pki / "ca.crt"), token_file=str(token_file)).fetch()
    assert len(snap.pods) == 1 and len(snap.warnings) == 1
    assert TOKEN[:8] not in snap.warnings[0] and "<token>" in snap.warnings[0]


# ---------------------------------------------------------------- faults

def test_connection_refused():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(SourceError) as e:
        source(f"http://127.0.0.1:{port}/pods").fetch()
    assert e.value.kind == "connect" and "connection refused" in str(e.value)
    assert str(e.value).startswith(f"kubelet http://127.0.0.1:{port}/pods: ")


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_timeout_on_a_server_that_never_answers(scheme):
    with socket.socket() as sock:  # accepts TCP connections (backlog), never reads or writes
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        port = sock.getsockname()[1]
        with pytest.raises(SourceError) as e:
            source(f"{scheme}://127.0.0.1:{port}/pods", timeout=0.3).fetch()
    assert e.value.kind == "timeout" and "no answer within 0.3s" in str(e.value)


def test_timeout_covers_a_body_that_trickles(serve):
    def trickle(h):
        h.send_response(200)
        h.send_header("Content-Length", "100000")
        h.end_headers()
        for _ in range(200):
            h.wfile.write(b" ")
            h.wfile.flush()
            time.sleep(0.05)

    s = serve(trickle, tls=None)
    with pytest.raises(SourceError) as e:
        source(s.url(), timeout=0.3).fetch()
    assert e.value.kind == "timeout"


@pytest.mark.parametrize("status,reason", [(500, "Internal Server Error"), (401, "Unauthorized"),
                                           (403, "Forbidden"), (404, "Not Found"), (302, "Found")])
def test_http_status_not_200(serve, pki, status, reason):
    s = serve(answer(status, b"{}", headers={"Location": "http://127.0.0.1:1/pods"}))
    with pytest.raises(SourceError) as e:
        source(s.url(), ca_file=str(pki / "ca.crt")).fetch()
    assert e.value.kind == "http" and f"HTTP {status} {reason}" in str(e.value)
    assert len(s.requests) == 1  # a redirect is not followed


@pytest.mark.parametrize("body", [b"", b"<html>bad gateway</html>", b"\xff\xfe\x00", b'{"items": [', b"[" * 200000])
def test_garbage_body(serve, body):
    s = serve(answer(200, body), tls=None)
    with pytest.raises(SourceError) as e:
        source(s.url()).fetch()
    assert e.value.kind == "decode" and "response is not JSON" in str(e.value)


@pytest.mark.parametrize("doc", [{"kind": "NodeList", "items": []}, {"items": "x"}, 42, "pods"])
def test_json_that_is_not_a_pod_list(serve, doc):
    s = serve(answer(200, json.dumps(doc).encode()), tls=None)
    with pytest.raises(SourceError) as e:
        source(s.url()).fetch()
    assert e.value.kind == "pods" and "not a pod list" in str(e.value)


def test_11_mb_body_with_length_is_refused(serve):
    body = b" " * (11 * 2**20)
    s = serve(answer(200, body), tls=None)
    with pytest.raises(SourceError) as e:
        source(s.url()).fetch()
    assert e.value.kind == "too_large" and str(MAX_RESPONSE_BYTES) in str(e.value)


def test_11_mb_body_without_length_is_refused_after_10_mib(serve, pki):
    sent = []

    def chunked(h):
        h.send_response(200)
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        chunk = b" " * 65536
        for _ in range(11 * 16):  # 11 MiB
            h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent.append(len(chunk))
        h.wfile.write(b"0\r\n\r\n")

    s = serve(chunked)
    with pytest.raises(SourceError) as e:
        source(s.url(), ca_file=str(pki / "ca.crt")).fetch()
    assert e.value.kind == "too_large"


def test_just_under_the_cap_is_read(serve):
    body = GOOD + b" " * (MAX_RESPONSE_BYTES - len(GOOD))
    s = serve(answer(200, body), tls=None)
    assert len(source(s.url()).fetch().pods) == 2


def test_all_bad_pod_list_is_an_error(serve):
    s = serve(answer(200, pod_list(BAD, {"metadata": {"name": "x"}, "spec": {}})), tls=None)
    with pytest.raises(SourceError) as e:
        source(s.url()).fetch()
    assert e.value.kind == "pods" and "every pod in the list was rejected" in str(e.value)


def test_partly_bad_pod_list_gives_warnings(serve):
    s = serve(answer(200, pod_list(pod("a", UID1), BAD)), tls=None)
    snap = source(s.url()).fetch()
    assert [p.name for p in snap.pods] == ["a"]
    assert len(snap.warnings) == 1 and "broken" in snap.warnings[0]


def test_empty_pod_list_is_a_snapshot(serve):
    s = serve(answer(200, pod_list()), tls=None)
    snap = source(s.url()).fetch()
    assert snap.pods == () and snap.warnings == ()


def test_recovers_after_failures(serve):
    state = {"n": 0}

    def flaky(h):
        state["n"] += 1
        answer(500 if state["n"] == 1 else 200)(h)

    s = serve(flaky, tls=None)
    src = source(s.url())
    with pytest.raises(SourceError):
        src.fetch()
    assert len(src.fetch().pods) == 2


@pytest.mark.parametrize("tls", [None, "server"])
def test_timeout_covers_headers_that_trickle(serve, pki, tls):
    def trickle(h):
        h.wfile.write(b"HTTP/1.1 200 OK\r\n")
        for _ in range(200):
            h.wfile.write(b"X-Slow: y\r\n")
            h.wfile.flush()
            time.sleep(0.05)
        h.wfile.write(b"Content-Length: 2\r\n\r\n[]")

    s = serve(trickle, tls=tls)
    with pytest.raises(SourceError) as e:
        source(s.url(), timeout=0.3, ca_file=str(pki / "ca.crt")).fetch()
    assert e.value.kind == "timeout" and "no answer within 0.3s" in str(e.value)


def test_connection_close_responses_are_read_in_full(serve, pki):
    # HTTP/1.0-style: no Content-Length, the body ends when the server closes.
    def close_delimited(h):
        h.close_connection = True
        h.wfile.write(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + GOOD)

    s = serve(close_delimited)
    assert len(source(s.url(), ca_file=str(pki / "ca.crt")).fetch().pods) == 2


def test_an_unchanged_document_is_not_decoded_again_and_a_changed_one_is(serve):
    """Every poll of an idle node brings the same bytes: the pods are handed back as the same
    objects (which lets the daemon skip planning), with a fresh fetched_at."""
    body = {"now": GOOD}
    s = serve(lambda h: answer(body=body["now"])(h), tls=None)
    clock = iter(range(100))
    src = KubeletSource(KubeletConfig(url=s.url()), clock=lambda: float(next(clock)))
    first, second = src.fetch(), src.fetch()
    assert second.pods is first.pods and second.fetched_at > first.fetched_at
    body["now"] = pod_list(pod("a", UID1), pod("b", UID2, memory="256Mi"))
    third = src.fetch()
    assert third.pods is not first.pods
    assert [p.uid for p in third.pods] == [UID1, UID2] and third.pods != first.pods
    assert len(s.requests) == 3  # asked every time: only the decoding is saved


def test_an_unchanged_document_after_a_failure_is_decoded_again(serve):
    """Only a body that made a good snapshot is remembered: after garbage, the same good body is
    decoded again rather than trusted from before the failure."""
    body = {"now": GOOD}
    s = serve(lambda h: answer(body=body["now"])(h), tls=None)
    src = source(s.url())
    first = src.fetch()
    body["now"] = b"{not json"
    with pytest.raises(SourceError):
        src.fetch()
    body["now"] = GOOD
    again = src.fetch()
    assert again.pods == first.pods and again.pods is not first.pods
