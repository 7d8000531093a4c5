"""The kubelet source against real HTTP and HTTPS servers on 127.0.0.1.

A CA, a server certificate signed by it, a client certificate, a rogue self-signed
certificate and a kubelet.crt shaped like kubeadm's are made by the `openssl` CLI for this
module (tests/kubelet_standin.py). Without openssl the module is skipped, except under
CI=true where that is a failure.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import time
from pathlib import Path

import pytest

from memqos_systemd.config import KubeletSettings
from memqos_systemd.sources import MAX_RESPONSE_BYTES, SourceError
from memqos_systemd.sources.kubelet import KubeletSource
from kubelet_standin import Kubelet, Server, make_pki, pod, pod_list, server_context
from kubelet_standin import answer as _answer
from prereq import require

pytestmark = pytest.mark.integration

TOKEN = "eyJhbGciOiJSUzI1NiJ9.c2VjcmV0LXNlcnZpY2UtYWNjb3VudA.s1gn4tur3-ZZZ"
UID1 = "11111111-1111-4111-8111-111111111111"
UID2 = "22222222-2222-4222-8222-222222222222"


BAD = {"metadata": {"name": "broken", "uid": "33333333-3333-4333-8333-333333333333"},
       "spec": {"containers": [{"name": "c", "resources": {"requests": {"memory": "lots"}}}]}}
GOOD = pod_list(pod("a", UID1), pod("b", UID2))
HOSTNAME = "node-7.example"  # the node the kubeadm-shaped kubelet.crt is made for


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    require(shutil.which("openssl"), "openssl is not installed (scripts/install-deps.sh test)")
    return make_pki(tmp_path_factory.mktemp("pki"), HOSTNAME)


def answer(status: int = 200, body: bytes = GOOD, **kw):
    return _answer(status, body, **kw)


@pytest.fixture
def serve(pki):
    servers = []

    def start(respond=answer(), tls: str | None = "server", client_ca: bool = False) -> Server:
        s = Server(respond, server_context(pki, tls, client_ca) if tls else None)
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


def source(url: str, hostname: str = HOSTNAME, **kw) -> KubeletSource:
    kw.setdefault("timeout", 5.0)
    return KubeletSource(KubeletSettings(url=url, **kw), hostname=lambda: hostname)


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
    src = KubeletSource(KubeletSettings(url=s.url()), clock=lambda: 1234.5)
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


# ---------------------------------------------------------------- a kubeadm node's kubelet

def test_kubeadm_self_signed_kubelet_crt_is_its_own_ca_and_names_the_hostname(serve, pki, token_file):
    """The shipped config's case: https://127.0.0.1:10250 with caFile /var/lib/kubelet/pki/kubelet.crt.
    The certificate names only the node's hostname, never 127.0.0.1; verification stays on."""
    s = serve(tls="kubelet")
    snap = source(s.url(), ca_file=str(pki / "kubelet.crt"), token_file=str(token_file)).fetch()
    assert len(snap.pods) == 2 and s.requests[0]["headers"]["Authorization"] == f"Bearer {TOKEN}"


def test_kubelet_crt_of_another_name_is_refused_before_the_token_is_sent(serve, pki, token_file):
    # e.g. a kubelet started with --hostname-override: its certificate names the override.
    s = serve(tls="kubelet")
    with pytest.raises(SourceError) as e:
        source(s.url(), hostname="other-node", ca_file=str(pki / "kubelet.crt"), token_file=str(token_file)).fetch()
    assert e.value.kind == "tls" and s.requests == []
    assert str(e.value) == (f"kubelet {s.url()}: TLS: the kubelet's certificate is for {HOSTNAME}, not for 127.0.0.1"
                            f" or other-node: set kubelet.serverName to the name the kubelet's certificate carries")
    snap = source(s.url(), hostname="other-node", server_name=HOSTNAME, ca_file=str(pki / "kubelet.crt"),
                  token_file=str(token_file)).fetch()
    assert len(snap.pods) == 2


def test_server_name_is_the_only_name_accepted_when_set(serve, pki):
    s = serve()  # server.crt names 127.0.0.1 and localhost
    with pytest.raises(SourceError) as e:
        source(s.url(), server_name="node-1", ca_file=str(pki / "ca.crt")).fetch()
    assert e.value.kind == "tls" and "for 127.0.0.1, localhost, not for node-1" in str(e.value)


def test_a_trusted_ca_does_not_make_any_name_good(serve, pki):
    # Signed by the CA we trust, but for 127.0.0.1/localhost only: not the kubelet of node-7.
    s = serve()
    with pytest.raises(SourceError) as e:
        source(s.url("localhost"), hostname=HOSTNAME, server_name=HOSTNAME, ca_file=str(pki / "ca.crt")).fetch()
    assert e.value.kind == "tls" and s.requests == []


def test_kubelet_crt_against_the_wrong_ca_says_which_ca_to_give(serve, pki):
    s = serve(tls="kubelet")
    with pytest.raises(SourceError) as e:
        source(s.url(), ca_file=str(pki / "ca.crt")).fetch()
    msg = str(e.value)
    assert e.value.kind == "tls" and msg.startswith(f"kubelet {s.url()}: TLS certificate not trusted: ")
    assert f"(caFile {pki / 'ca.crt'} did not verify it)" in msg
    assert "/var/lib/kubelet/pki/kubelet.crt" in msg and "serverTLSBootstrap" in msg and "/etc/kubernetes/pki/ca.crt" in msg


def test_a_missing_ca_file_says_where_the_kubelets_ca_is(serve, tmp_path):
    s = serve(tls="kubelet")
    with pytest.raises(SourceError) as e:
        source(s.url(), ca_file=str(tmp_path / "kubelet.crt")).fetch()
    assert e.value.kind == "tls"
    assert f"caFile {tmp_path / 'kubelet.crt'}: cannot load: No such file or directory" in str(e.value)
    assert "/var/lib/kubelet/pki/kubelet.crt when the kubelet signed its own certificate" in str(e.value)


# ---------------------------------------------------------------- the kubelet's authn/authz answers

READER = "system:serviceaccount:memqos-system:memqos-systemd"


@pytest.mark.parametrize("fine_grained, allowed", [(True, {"pods"}), (True, {"proxy"}), (False, {"proxy"})])
def test_a_token_with_the_rbac_rule_reads_pods(serve, pki, token_file, fine_grained, allowed):
    s = serve(Kubelet(GOOD, {TOKEN: (READER, allowed)}, fine_grained=fine_grained), tls="kubelet")
    assert len(source(s.url(), ca_file=str(pki / "kubelet.crt"), token_file=str(token_file)).fetch().pods) == 2


@pytest.mark.parametrize("token", [None, "expired-or-wrong-token", "wrong", "kubelet", "memqos-system"])
def test_401_says_the_token_is_missing_expired_or_wrong(serve, pki, tmp_path, token):
    """A token whose text is also in our words leaves them alone (issue 26: a token 'wrong' made
    '(missing, expired or <token>)' of this message): it is masked where the kubelet echoes it."""
    s = serve(Kubelet(GOOD, {TOKEN: (READER, {"pods"})}), tls="kubelet")
    kw = {}
    if token:
        f = tmp_path / "token"
        f.write_text(token)
        f.chmod(0o600)
        kw["token_file"] = str(f)
    with pytest.raises(SourceError) as e:
        source(s.url(), ca_file=str(pki / "kubelet.crt"), **kw).fetch()
    assert e.value.kind == "http"
    if token:
        assert str(e.value) == (f"kubelet {s.url()}: HTTP 401 Unauthorized: the kubelet did not accept the token in"
                                f" {kw['token_file']} (missing, expired or wrong): put the token of ServiceAccount"
                                f" memqos-system/memqos-systemd there, mode 0600 (/usr/share/doc/memqos-systemd/README.md, 'On a kubeadm node')")
    else:
        assert str(e.value) == (f"kubelet {s.url()}: HTTP 401 Unauthorized: the kubelet wants credentials: set"
                                f" kubelet.tokenFile (or clientCertFile and clientKeyFile)")


@pytest.mark.parametrize("fine_grained, subresource", [(True, "pods"), (False, "proxy")])
def test_403_names_the_rbac_rule_that_is_missing(serve, pki, token_file, fine_grained, subresource):
    s = serve(Kubelet(GOOD, {TOKEN: (READER, {"log"})}, fine_grained=fine_grained), tls="kubelet")
    with pytest.raises(SourceError) as e:
        source(s.url(), ca_file=str(pki / "kubelet.crt"), token_file=str(token_file)).fetch()
    assert e.value.kind == "http"
    assert str(e.value) == (f"kubelet {s.url()}: HTTP 403 Forbidden (user={READER}, verb=get, resource=nodes,"
                            f" subresource={subresource}): this user may not read the kubelet's pods: bind it to"
                            f" ClusterRole memqos-systemd-pod-reader (get on nodes/pods, deploy/rbac/ or"
                            f" /usr/share/memqos-systemd/rbac/); a kubelet before v1.33 checks only nodes/proxy"
                            f" (fallback-nodes-proxy.yaml there)")


def test_a_missing_token_file_says_where_the_token_comes_from(serve, pki, tmp_path):
    s = serve(tls="kubelet")
    with pytest.raises(SourceError) as e:
        source(s.url(), ca_file=str(pki / "kubelet.crt"), token_file=str(tmp_path / "kubelet-token")).fetch()
    assert e.value.kind == "auth" and s.requests == []
    assert str(e.value) == (f"kubelet {s.url()}: tokenFile {tmp_path / 'kubelet-token'}: cannot read: No such file or"
                            f" directory: put the token of ServiceAccount memqos-system/memqos-systemd there, mode"
                            f" 0600 (/usr/share/doc/memqos-systemd/README.md, 'On a kubeadm node')")


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


@pytest.mark.parametrize("token", [TOKEN, "wrong"])
def test_a_token_the_kubelet_echoes_is_masked_there_and_only_there(serve, pki, tmp_path, token):
    f = tmp_path / "token"
    f.write_text(token)
    f.chmod(0o600)
    s = serve(answer(403, f"Forbidden (token {token} is wrong)\n".encode(), reason=f"Forbidden {token}"))
    with pytest.raises(SourceError) as e:
        source(s.url(), ca_file=str(pki / "ca.crt"), token_file=str(f)).fetch()
    echoed = "<token> is <token>" if token == "wrong" else "<token> is wrong"  # the body's own "wrong" too
    assert str(e.value) == (f"kubelet {s.url()}: HTTP 403 Forbidden <token> (token {echoed}): this user may"
                            f" not read the kubelet's pods: bind it to ClusterRole memqos-systemd-pod-reader (get on"
                            f" nodes/pods, deploy/rbac/ or /usr/share/memqos-systemd/rbac/); a kubelet before v1.33"
                            f" checks only nodes/proxy (fallback-nodes-proxy.yaml there)")


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
    # Plain http refused: most likely the read-only port, which kubeadm turns off; the fix is 10250.
    assert "connection refused: nothing listens there" in str(e.value) and "read-only port" in str(e.value)
    assert "https://127.0.0.1:10250/pods with tokenFile and caFile" in str(e.value)
    with pytest.raises(SourceError) as e:
        source(f"https://127.0.0.1:{port}/pods").fetch()
    assert str(e.value).endswith("connection refused (is the kubelet running, is the port right?)")


def test_a_wrong_path_says_where_the_kubelet_serves_its_pods(serve, pki, token_file):
    kubelet = Kubelet(GOOD, {TOKEN: (READER, {"pods"})})
    s = serve(lambda h: kubelet(h) if h.path == "/pods" else
              answer(404, b"404 page not found\n", content_type="text/plain")(h), tls="kubelet")
    url = s.url().replace("/pods", "/api/v1/pods")
    with pytest.raises(SourceError) as e:
        source(url, ca_file=str(pki / "kubelet.crt"), token_file=str(token_file)).fetch()
    assert str(e.value) == (f"kubelet {url}: HTTP 404 Not Found: nothing at /api/v1/pods there: the kubelet serves"
                            f" /pods and /metrics (kubelet.url, e.g. https://127.0.0.1:10250/pods)")


def test_http_to_a_tls_port_says_to_use_https(serve, pki):
    """issue 26: 'Connection reset by peer' alone. A TLS server given plain HTTP resets or closes
    (Python's ssl) or answers 400 (Go's, the kubelet's): each says to use https://."""
    s = serve(tls="kubelet")
    with pytest.raises(SourceError) as e:
        source(s.url().replace("https://", "http://")).fetch()
    assert str(e.value).endswith("that port speaks TLS (the kubelet's 10250 does): use https:// in kubelet.url"), \
        str(e.value)
    go = serve(answer(400, b"Client sent an HTTP request to an HTTPS server.\n", content_type="text/plain"), tls=None)
    with pytest.raises(SourceError) as e:
        source(go.url()).fetch()
    assert str(e.value) == (f"kubelet {go.url()}: HTTP 400 Bad Request: that port speaks TLS (the kubelet's 10250"
                            f" does): use https:// in kubelet.url")


def test_metrics_are_named_by_their_own_url_with_their_own_rbac_rule(serve, pki, token_file):
    """issue 26: /metrics' errors were labelled with the /pods URL, and a 403 advised nodes/pods."""
    now = [Kubelet(GOOD, {TOKEN: (READER, {"pods"})})]  # what the server answers now
    s = serve(lambda h: now[0](h), tls="kubelet")
    src = source(s.url(), ca_file=str(pki / "kubelet.crt"), token_file=str(token_file))
    assert src.metrics_name == s.url().replace("/pods", "/metrics").replace("https", "kubelet https", 1)
    with pytest.raises(SourceError) as e:
        src.metrics_text()
    assert str(e.value) == (f"{src.metrics_name}: HTTP 403 Forbidden (user={READER}, verb=get, resource=nodes,"
                            f" subresource=metrics): this user may not read the kubelet's metrics: bind it to"
                            f" ClusterRole memqos-systemd-pod-reader (get on nodes/metrics, deploy/rbac/ or"
                            f" /usr/share/memqos-systemd/rbac/)")
    now[0] = answer(404, b"404 page not found\n", content_type="text/plain")  # not a kubelet
    with pytest.raises(SourceError) as e:
        src.metrics_text()
    assert str(e.value).startswith(f"{src.metrics_name}: HTTP 404 Not Found: nothing at /metrics there")


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
    src = KubeletSource(KubeletSettings(url=s.url()), clock=lambda: float(next(clock)))
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
