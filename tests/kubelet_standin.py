"""A kubelet stand-in on 127.0.0.1 with real TLS, for the kubelet source and `check` tests.

* `make_pki(directory, hostname)`: certificates made by the `openssl` CLI: a cluster CA
  (`ca.crt`) with a serving certificate for 127.0.0.1/localhost (`server.crt`) and a client
  certificate (`client.crt`) signed by it, a rogue self-signed one (`rogue.crt`), and
  `kubelet.crt` shaped like the one a kubelet without serverTLSBootstrap writes for itself
  (client-go's GenerateSelfSignedCertKey, kubeadm's default): an RSA leaf whose only name is
  the node's hostname as a DNS SAN ("<host>@<time>", serverAuth), followed in the same file by
  the throwaway CA that signed it ("<host>-ca@<time>").
* `Server(respond, tls)`: a ThreadingHTTPServer that records every request and lets
  `respond(handler)` answer it; `answer(...)` makes a fixed answer.
* `Kubelet`: `/pods` behind the kubelet's authentication and webhook authorization, as
  pkg/kubelet/server does it: no or an unknown bearer token is 401 with the body
  "Unauthorized"; a known token whose user may not `get` `nodes/pods` (nor the `nodes/proxy`
  the kubelet falls back to, KEP-2862) is 403 with one "Forbidden (user=..., verb=get,
  resource=nodes, subresource=...)" line per subresource it checked; otherwise the pods.
  `/metrics` (what a kubelet says of itself: its feature gates, its version) likewise, as
  `nodes/metrics`.
"""

from __future__ import annotations

import http.server
import json
import ssl
import subprocess
import threading
import time
from pathlib import Path


def pod(name: str, uid: str, memory: str = "128Mi") -> dict:
    return {"metadata": {"name": name, "namespace": "default", "uid": uid},
            "spec": {"containers": [{"name": "app", "resources": {"requests": {"memory": memory}}}]},
            "status": {"phase": "Running"}}


def pod_list(*items) -> bytes:
    return json.dumps({"kind": "PodList", "apiVersion": "v1", "items": list(items)}).encode()


# ---------------------------------------------------------------- PKI made by openssl

def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def make_pki(d: Path, hostname: str) -> Path:
    """Write the certificates described in the module's docstring into `d`; keys are 0600."""
    _openssl("req", "-x509", *_EC, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=memqos test CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=d)
    for name, usage, san in (("server", "serverAuth", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"),
                             ("client", "clientAuth", "")):
        (d / f"{name}.ext").write_text(f"basicConstraints=CA:FALSE\nextendedKeyUsage={usage}\n"
                                       f"subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n{san}")
        _openssl("req", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=memqos test {name}",
                 cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-out", f"{name}.crt", "-extfile", f"{name}.ext", cwd=d)
    _openssl("req", "-x509", *_EC, "-keyout", "rogue.key", "-out", "rogue.crt", "-days", "2",
             "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", cwd=d)
    # The kubelet's own: RSA 2048, CA and leaf valid for a year, the leaf naming only the host.
    now = int(time.time())
    rsa = ["-newkey", "rsa:2048", "-nodes"]
    _openssl("req", "-x509", *rsa, "-keyout", "kubelet-ca.key", "-out", "kubelet-ca.crt", "-days", "365",
             "-subj", f"/CN={hostname}-ca@{now}", "-set_serial", "1",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign", cwd=d)
    (d / "kubelet.ext").write_text("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,"
                                   f"keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:{hostname}\n"
                                   "authorityKeyIdentifier=keyid\n")
    _openssl("req", *rsa, "-keyout", "kubelet.key", "-out", "kubelet.csr", "-subj", f"/CN={hostname}@{now}", cwd=d)
    _openssl("x509", "-req", "-in", "kubelet.csr", "-CA", "kubelet-ca.crt", "-CAkey", "kubelet-ca.key",
             "-set_serial", "2", "-days", "365", "-out", "kubelet-leaf.crt", "-extfile", "kubelet.ext", cwd=d)
    (d / "kubelet.crt").write_bytes((d / "kubelet-leaf.crt").read_bytes() + (d / "kubelet-ca.crt").read_bytes())
    for f in d.glob("*.key"):
        f.chmod(0o600)
    return d


def server_context(pki: Path, name: str = "server", client_ca: bool = False) -> ssl.SSLContext:
    """A TLS server context serving `<name>.crt` (the whole file: kubelet.crt sends its CA too)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki / f"{name}.crt", pki / f"{name}.key")
    if client_ca:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(pki / "ca.crt")
    return ctx


# ---------------------------------------------------------------- a real server

class Server:
    """ThreadingHTTPServer on 127.0.0.1:0; `respond(handler)` answers every GET; requests are recorded."""

    def __init__(self, respond, tls: ssl.SSLContext | None = None):
        self.requests: list[dict] = []
        self.respond = respond  # (the test may change what it answers)
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


def answer(status: int = 200, body: bytes = b"", reason: str | None = None, headers: dict | None = None,
           content_type: str = "application/json"):
    def respond(h):
        h.send_response(status, reason)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body)
    return respond


class Kubelet:
    """`/pods` behind a kubelet's bearer-token authentication and webhook authorization.
    `tokens`: token -> (user name, the nodes/* subresources RBAC lets it get)."""

    def __init__(self, pods: bytes, tokens: dict[str, tuple[str, set[str]]], fine_grained: bool = True,
                 metrics: bytes = b""):
        self.pods = pods
        self.tokens = tokens
        self.metrics = metrics  # /metrics, authorized as nodes/metrics
        # KubeletFineGrainedAuthz: /pods is checked as nodes/pods, then nodes/proxy; before it,
        # as nodes/proxy only.
        self.subresources = ("pods", "proxy") if fine_grained else ("proxy",)

    def __call__(self, h) -> None:
        auth = h.headers.get("Authorization", "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        if token not in self.tokens:
            return answer(401, b"Unauthorized", reason="Unauthorized", content_type="text/plain")(h)
        user, allowed = self.tokens[token]
        metrics = h.path.split("?", 1)[0] == "/metrics"
        subresources = ("metrics",) if metrics else self.subresources
        if not allowed & set(subresources):
            body = "".join(f"Forbidden (user={user}, verb=get, resource=nodes, subresource={s})\n"
                           for s in subresources)
            return answer(403, body.encode(), reason="Forbidden", content_type="text/plain")(h)
        if metrics:
            return answer(200, self.metrics, content_type="text/plain; version=0.0.4")(h)
        return answer(200, self.pods)(h)
