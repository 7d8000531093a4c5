#!/usr/bin/python3
"""Stand-in for the kubelet's API: GET /pods serves the pods file (a v1 PodList).

Two ports, as a kubelet has them:

* the read-only port (--port, default 10255): plain HTTP, no authentication;
* with --tls-port (10250 on a kubelet): HTTPS with the certificate a kubelet without
  serverTLSBootstrap makes for itself, as kubeadm nodes run it: if <cert-dir>/kubelet.crt and
  kubelet.key are missing at start, they are made like client-go's GenerateSelfSignedCertKey
  does (an RSA key, a leaf "<hostname>@<time>" whose only name is the lowercased hostname as a
  DNS SAN, signed by a throwaway CA "<hostname>-ca@<time>" whose certificate follows the leaf
  in kubelet.crt). Requests are authenticated and authorized the way the kubelet's auth filter
  with webhook authentication and authorization answers them: no or an unknown bearer token is
  401 "Unauthorized"; a token whose user may not get nodes/pods (KubeletFineGrainedAuthz) nor
  nodes/proxy is 403 with one "Forbidden (user=..., verb=get, resource=nodes,
  subresource=...)" line per subresource checked. What the API server would answer comes from
  the --tokens file, re-read on every request: {"<token>": {"user": "...", "allow": ["pods"]}}.

The pods file is re-read on every request, so scenarios change what the "kubelet" reports by
rewriting it (memqos_e2e.write_pods does that atomically). If <pods-file>.status exists and holds
an HTTP status code, every /pods request is answered with that code and an empty body, so
scenarios can simulate a failing kubelet. GET /healthz answers "ok". Every request to the TLS
port is logged with the user it was authenticated as.
"""
import argparse
import json
import os
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

EMPTY = {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": []}
SUBRESOURCES = ("pods", "proxy")  # what a fine-grained kubelet checks for /pods, in order


def make_kubelet_cert(cert_dir):
    """kubelet.crt / kubelet.key as the kubelet writes them when it has none (see docstring)."""
    crt, key = os.path.join(cert_dir, "kubelet.crt"), os.path.join(cert_dir, "kubelet.key")
    if os.path.exists(crt) and os.path.exists(key):
        return crt, key
    os.makedirs(cert_dir, mode=0o755, exist_ok=True)
    host = socket.gethostname().strip().lower()
    now = int(time.time())
    with tempfile.TemporaryDirectory() as d:
        def openssl(*args):
            subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
                "-days", "365", "-subj", f"/CN={host}-ca@{now}", "-set_serial", "1",
                "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign")
        with open(os.path.join(d, "leaf.ext"), "w") as f:
            f.write("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                    f"extendedKeyUsage=serverAuth\nsubjectAltName=DNS:{host}\nauthorityKeyIdentifier=keyid\n")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "leaf.key", "-out", "leaf.csr",
                "-subj", f"/CN={host}@{now}")
        openssl("x509", "-req", "-in", "leaf.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-set_serial", "2",
                "-days", "365", "-out", "leaf.crt", "-extfile", "leaf.ext")
        with open(os.path.join(d, "leaf.crt"), "rb") as a, open(os.path.join(d, "ca.crt"), "rb") as b:
            chain = a.read() + b.read()
        with open(os.path.join(d, "leaf.key"), "rb") as f:
            leaf_key = f.read()
    with open(crt + ".tmp", "wb") as f:
        f.write(chain)
    os.chmod(crt + ".tmp", 0o644)
    fd = os.open(key + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(leaf_key)
    os.replace(key + ".tmp", key)
    os.replace(crt + ".tmp", crt)
    print(f"kubelet-stub: made a self-signed serving certificate for {host} in {crt}", flush=True)
    return crt, key


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods-file", required=True)
    ap.add_argument("--address", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=10255)
    ap.add_argument("--tls-port", type=int, default=0, help="also serve HTTPS with authn/authz (0: no)")
    ap.add_argument("--cert-dir", default="/var/lib/kubelet/pki")
    ap.add_argument("--tokens", help="token -> {user, allow}: what the API server would say")
    args = ap.parse_args()

    def read_tokens():
        try:
            with open(args.tokens) as f:
                doc = json.load(f)
            return doc if isinstance(doc, dict) else {}
        except (OSError, ValueError, TypeError):
            return {}

    class Handler(BaseHTTPRequestHandler):
        secure = False

        def _send(self, code, body=b"", ctype="application/json"):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _authorized(self):
            """None when the request may go on; else it has been answered 401 or 403."""
            auth = self.headers.get("Authorization", "")
            token = auth[len("Bearer "):].strip() if auth.startswith("Bearer ") else None
            who = read_tokens().get(token) if token else None
            if not isinstance(who, dict):
                self.user = "-"
                self._send(401, b"Unauthorized", "text/plain; charset=utf-8")
                return False
            self.user = str(who.get("user", "?"))
            if not set(who.get("allow") or ()) & set(SUBRESOURCES):
                body = "".join(f"Forbidden (user={self.user}, verb=get, resource=nodes, subresource={s})\n"
                               for s in SUBRESOURCES)
                self._send(403, body.encode(), "text/plain; charset=utf-8")
                return False
            return True

        def do_GET(self):
            self.user = None
            path = self.path.split("?", 1)[0].rstrip("/")
            if self.secure and not self._authorized():
                return
            if path == "/healthz":
                return self._send(200, b"ok", "text/plain")
            if path == "/metrics":  # what the scenario says the kubelet reports of itself (its gates)
                try:
                    with open(args.pods_file + ".metrics", "rb") as f:
                        return self._send(200, f.read(), "text/plain; version=0.0.4")
                except FileNotFoundError:
                    return self._send(404, b"not found", "text/plain")
            if path != "/pods":
                return self._send(404, b"not found", "text/plain")
            try:
                with open(args.pods_file + ".status") as f:
                    return self._send(int(f.read().strip() or 500))
            except FileNotFoundError:
                pass
            try:
                with open(args.pods_file, "rb") as f:
                    body = f.read()
            except FileNotFoundError:
                body = json.dumps(EMPTY).encode()
            self._send(200, body)

        do_HEAD = do_GET

        def log_message(self, fmt, *a):
            user = f" user={self.user}" if getattr(self, "user", None) else ""
            print("kubelet-stub: " + fmt % a + user, flush=True)

    os.makedirs(os.path.dirname(os.path.abspath(args.pods_file)), exist_ok=True)
    servers = []
    if args.tls_port:
        crt, key = make_kubelet_cert(args.cert_dir)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(crt, key)
        tls = ThreadingHTTPServer((args.address, args.tls_port), type("TLSHandler", (Handler,), {"secure": True}))
        tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
        servers.append(tls)
        print(f"kubelet-stub: serving {args.pods_file} on https://{args.address}:{args.tls_port}"
              f" (tokens: {args.tokens})", flush=True)
    plain = ThreadingHTTPServer((args.address, args.port), Handler)
    servers.append(plain)
    print(f"kubelet-stub: serving {args.pods_file} on {args.address}:{args.port}", flush=True)
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
