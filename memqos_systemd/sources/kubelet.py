"""The kubelet's `/pods` endpoint over HTTP(S), with the standard library only.

`KubeletSource(config.KubeletSource).fetch()` does one GET and returns a
`Snapshot` or raises `SourceError`. Choices that matter:

* http.client, not urllib: no proxy from the environment (the token would go to
  the proxy) and no redirects (the token would follow them).
* The bearer token file is re-read on every fetch, so rotation just works. It
  is refused when world-readable or unreadable; its content never appears in
  any message or log: what the kubelet sends back (a reason phrase, an error body,
  exception text, certificate names, pod data) is scrubbed of it where it would be
  an echo, and our own words around it never are. The client key file is refused
  when world-readable too.
* TLS verifies the server by default, against `caFile` or the system store;
  `insecureSkipTLSVerify: true` turns that off and logs one warning. The name the
  certificate must carry is `serverName` when set; otherwise the URL's host, and for
  a loopback URL (the default 127.0.0.1) this node's hostname as well: the kubelet's
  self-signed serving certificate (kubeadm's default, /var/lib/kubelet/pki/kubelet.crt,
  made by client-go's GenerateSelfSignedCertKey) names only the hostname, as a DNS SAN,
  and a certificate signed by the cluster CA (serverTLSBootstrap) names the hostname and
  the node's addresses, never 127.0.0.1. The chain is verified by OpenSSL; the name is
  checked here, after the handshake and before the request (and so the token) is sent.
* Every failure says what to do about it: a refused read-only port points to 10250,
  an untrusted certificate names the CA to give, 401 is the token, 403 the RBAC rule
  (nodes/pods, or nodes/metrics for /metrics), 404 the path, plain HTTP to the TLS
  port https://. Messages about /metrics name its own URL.
* The whole exchange (connect, headers, body) must finish within `timeout`
  seconds, and at most MAX_RESPONSE_BYTES of body are read.
* A body identical to the last good one (same SHA-256, same token) is not decoded
  again: the last snapshot is returned with a fresh `fetched_at`, and its pods are
  the same objects, which lets the daemon skip planning (daemon._settled_key).
  Decoding and checking ~110 pods cost ~9 ms of CPU a poll, every 5 s; the hash
  costs ~0.3 ms, and keeps no copy of the body (RSS is close to its goal).
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.client
import ipaddress
import json
import logging
import os
import socket
import ssl
import stat
import threading
import time
from typing import Callable
from urllib.parse import urlsplit

from ..config import KubeletSettings
from ..config_checks import url_problem
from ..hosts import is_loopback
from .snapshot import MAX_RESPONSE_BYTES, Snapshot, SourceError, snapshot_from_doc

__all__ = ["KubeletSource", "MAX_TOKEN_BYTES", "redact", "node_hostname", "KUBELET_CA_HINT", "unreachable_in_service"]

log = logging.getLogger(__name__)

MAX_TOKEN_BYTES = 64 * 1024
_CHUNK = 64 * 1024
# A secret's prefix this long in a message is taken for the secret, cut off.
_MIN_PREFIX = 8
# What is read of a 401/403 body: the kubelet's is one short line per attribute it checked.
_ERROR_BODY_BYTES = 2048

# Where the CA of the kubelet's serving certificate is on common nodes (the fix for a TLS error).
KUBELET_CA_HINT = ("/var/lib/kubelet/pki/kubelet.crt when the kubelet signed its own certificate (kubeadm's"
                   " default), the cluster CA (/etc/kubernetes/pki/ca.crt on kubeadm) when serverTLSBootstrap"
                   " is on")
_TOKEN_HINT = ("put the token of ServiceAccount memqos-system/memqos-systemd there, mode 0600"
               " (/usr/share/doc/memqos-systemd/README.md, 'On a kubeadm node')")
# Where the RBAC is: the source's deploy/rbac/, installed by the package in /usr/share/memqos-systemd/rbac/.
_RBAC_HINT = ("bind it to ClusterRole memqos-systemd-pod-reader (get on nodes/pods, deploy/rbac/ or"
              " /usr/share/memqos-systemd/rbac/); a kubelet before v1.33 checks only nodes/proxy"
              " (fallback-nodes-proxy.yaml there)")
# /metrics has always been nodes/metrics (the same role grants it).
_RBAC_METRICS_HINT = ("bind it to ClusterRole memqos-systemd-pod-reader (get on nodes/metrics, deploy/rbac/ or"
                      " /usr/share/memqos-systemd/rbac/)")
_RBAC_CONFIGZ_HINT = ("bind it to ClusterRole memqos-systemd-pod-reader (get on nodes/configz, deploy/rbac/ or"
                      " /usr/share/memqos-systemd/rbac/)")
_HTTPS_HINT = "that port speaks TLS (the kubelet's 10250 does): use https:// in kubelet.url"


@dataclasses.dataclass(frozen=True)
class _Endpoint:
    """One thing asked of the kubelet: how messages name it, the request path, what it is."""
    name: str  # "kubelet https://127.0.0.1:10250/pods", the start of every message about it
    path: str  # with its query
    what: str  # "pods", "metrics" or "configz": the RBAC subresource a 403 is about


def node_hostname() -> str:
    """This node's name as the kubelet takes it for its self-signed certificate when no
    --hostname-override is given (nodeutil.GetHostname: the hostname, trimmed, lowercased)."""
    return socket.gethostname().strip().lower()


def _show_url(url: str) -> str:
    """A URL for a message, without what may be a credential (userinfo, the query)."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    return repr(f"{scheme}{sep}{netloc.rpartition('@')[2]}{slash}{path.partition('?')[0]}")


class KubeletSource:
    """Pods from the kubelet. Blocking; one instance per config (make a new one on reload)."""

    def __init__(self, config: KubeletSettings, *, clock: Callable[[], float] = time.monotonic,
                 max_bytes: int = MAX_RESPONSE_BYTES, hostname: Callable[[], str] = node_hostname):
        self.config = config
        self._clock = clock
        self._max_bytes = max_bytes
        # A bad URL is reported by fetch() as a SourceError, so that making a source (at start or
        # on SIGHUP) never raises; the config refuses one already (config.url_problem).
        problem = url_problem(config.url)
        parts = urlsplit(config.url if problem is None else "http://invalid.invalid/")
        self.name = f"kubelet {self._safe_url(parts)}" if problem is None else "kubelet"
        self._url_error = None if problem is None else f"kubelet.url: {_show_url(config.url)} {problem}"
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._https else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._pods = _Endpoint(self.name, self._path, "pods")
        # The kubelet's /metrics, beside /pods (the URL's last path element /pods replaced).
        base = parts.path.removesuffix("/pods") if parts.path.endswith("/pods") else parts.path.rstrip("/")
        self._metrics = _Endpoint(f"kubelet {self._safe_url(parts._replace(path=base + '/metrics'))}"
                                  if problem is None else self.name, base + "/metrics", "metrics")
        self.metrics_name = self._metrics.name
        # Its /configz: the configuration it runs (not served on the read-only port).
        self._configz = _Endpoint(f"kubelet {self._safe_url(parts._replace(path=base + '/configz'))}"
                                  if problem is None else self.name, base + "/configz", "configz")
        self.configz_name = self._configz.name
        # The names the serving certificate may carry (see the module's docstring).
        if config.server_name:
            self._names: tuple[str, ...] = (config.server_name,)
        elif is_loopback(self._host):
            self._names = tuple(dict.fromkeys((self._host, hostname())))
        else:
            self._names = (self._host,)
        self._ssl_key: tuple | None = None
        # (SHA-256 of the body as received, token, the snapshot made of it) of the last good fetch.
        self._last_good: tuple[bytes, str | None, Snapshot] | None = None
        self._ssl_context: ssl.SSLContext | None = None
        if self._https and config.insecure_skip_tls_verify:
            log.warning("%s: insecureSkipTLSVerify is set: the kubelet's certificate is NOT verified;"
                        " anyone who can answer on that address can feed us pods", self.name)

    @staticmethod
    def _safe_url(parts) -> str:
        # Never echo userinfo or a query string (either may hold a credential).
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{host}{port}{parts.path}"

    # ------------------------------------------------------------------ fetch

    def fetch(self) -> Snapshot:
        if self._url_error:
            raise SourceError(f"{self.name}: {self._url_error}", "connect")
        token = self._read_token()
        # The token is scrubbed from what the kubelet sends back (a reason phrase, an error body,
        # a pod's name), where it would be an echo of the credential, and never from our own
        # words: a token 'wrong' once made '(missing, expired or <token>)' of a message.
        snapshot = self._fetch(token)
        if _scrubs_body(token) and any(token[:_MIN_PREFIX] in w for w in snapshot.warnings):
            snapshot = dataclasses.replace(snapshot, warnings=tuple(redact(w, token) for w in snapshot.warnings))
        return snapshot

    def _fetch(self, token: str | None) -> Snapshot:
        body = self._get(token, self._pods)
        fetched_at = self._clock()
        digest = hashlib.sha256(body).digest()
        last = self._last_good
        if last is not None and last[1] == token and last[0] == digest:
            return dataclasses.replace(last[2], fetched_at=fetched_at)
        self._last_good = None
        if _scrubs_body(token) and token[:_MIN_PREFIX].encode() in body:
            # A server that echoes the token into a pod's name or namespace would have it carried
            # into warnings the planner writes later: scrub it before anything reads the body.
            body = redact(body.decode("utf-8", "replace"), token).encode()
        try:
            doc = json.loads(body)
        except ValueError as e:
            raise SourceError(f"{self.name}: response is not JSON: {_first_line(e)}", "decode") from None
        except RecursionError:
            raise SourceError(f"{self.name}: response is not JSON: nested too deeply", "decode") from None
        snapshot = snapshot_from_doc(doc, self.name, fetched_at)
        self._last_good = (digest, token, snapshot)
        return snapshot

    def metrics_text(self) -> str:
        """The kubelet's /metrics (`metrics_name`), as text, for what it says of itself
        (kubelet_gate.py). Same credentials and checks as the pods; SourceError otherwise, named
        by that URL (a 403 means the RBAC rule `nodes/metrics` get is missing)."""
        if self._url_error:
            raise SourceError(f"{self.name}: {self._url_error}", "connect")
        return self._get(self._read_token(), self._metrics, accept="text/plain").decode("utf-8", "replace")

    def configz_text(self) -> str:
        """The kubelet's /configz (`configz_name`), as text: {"kubeletconfig": {...}}, the
        configuration it runs with its defaults filled in (kubelet_gate.py). Same credentials and
        checks as the pods; SourceError otherwise (a 403: the RBAC rule `nodes/configz` get is
        missing; a 404: not served there, e.g. the read-only port)."""
        if self._url_error:
            raise SourceError(f"{self.name}: {self._url_error}", "connect")
        return self._get(self._read_token(), self._configz).decode("utf-8", "replace")

    def _get(self, token: str | None, endpoint: _Endpoint, accept: str = "application/json") -> bytes:
        """One GET. The whole exchange is bounded by `timeout`: besides the per-operation
        socket timeout, a timer shuts the socket down at the deadline, so a server that
        trickles headers or body a byte at a time cannot hold the fetch (and the daemon
        waiting on it) forever."""
        timeout = self.config.timeout
        headers = {"Accept": accept, "User-Agent": "memqos-systemd"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        conn: http.client.HTTPConnection
        if self._https:
            conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout,
                                               context=self._context())
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        expired = threading.Event()
        held: list[socket.socket] = []  # conn drops its socket when a response says "close"

        def abort() -> None:
            expired.set()
            for sock in held or ([conn.sock] if conn.sock is not None else []):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except (OSError, ValueError):
                    pass

        timer = threading.Timer(timeout, abort)
        timer.daemon = True
        timer.start()
        try:
            conn.connect()
            held.append(conn.sock)
            if expired.is_set():
                raise TimeoutError
            if self._https and not self.config.insecure_skip_tls_verify:
                self._check_name(conn.sock, endpoint, token)
            conn.request("GET", endpoint.path, headers=headers)
            resp = conn.getresponse()
            if resp.status != 200:
                raise SourceError(self._status_message(resp, token, endpoint), "http")
            length = resp.getheader("Content-Length")
            if length and length.strip().isdigit() and int(length) > self._max_bytes:
                raise SourceError(f"{endpoint.name}: response of {int(length)} bytes is larger than the"
                                  f" {self._max_bytes} byte limit", "too_large")
            body = self._read_body(resp, expired, endpoint)
            if expired.is_set():
                raise TimeoutError  # the body may have been cut short by the shutdown
            return body
        except SourceError:
            raise
        except Exception as e:
            raise self._classify(e, expired.is_set(), endpoint, token) from None
        finally:
            timer.cancel()
            conn.close()

    def _check_name(self, sock: ssl.SSLSocket, endpoint: _Endpoint, token: str | None) -> None:
        """The verified certificate must name one of self._names (exact, or a one-label wildcard)."""
        cert = sock.getpeercert() or {}
        sans = [(kind, value) for kind, value in cert.get("subjectAltName", ()) if kind in ("DNS", "IP Address")]
        if any(_name_matches(name, kind, value) for name in self._names for kind, value in sans):
            return
        carried = _said(", ".join(value for _, value in sans), token, 200) or "no DNS or IP name"
        raise SourceError(f"{endpoint.name}: TLS: the kubelet's certificate is for {carried}, not for"
                          f" {' or '.join(self._names)}: set kubelet.serverName to the name the kubelet's"
                          f" certificate carries", "tls")

    def _status_message(self, resp: http.client.HTTPResponse, token: str | None, endpoint: _Endpoint) -> str:
        """One line for a status other than 200, with the fix for 401, 403, 404 and a plain HTTP
        request to a TLS port (the kubelet, a Go server, answers that with 400)."""
        cfg = self.config
        head = f"{endpoint.name}: HTTP {resp.status} {_said(resp.reason, token, 80)}".rstrip()
        if resp.status == 401:
            if cfg.token_file:
                return (f"{head}: the kubelet did not accept the token in {cfg.token_file} (missing, expired or"
                        f" wrong): {_TOKEN_HINT}")
            if cfg.client_cert_file:
                return f"{head}: the kubelet did not accept the client certificate {cfg.client_cert_file}"
            return (f"{head}: the kubelet wants credentials: set kubelet.tokenFile (or clientCertFile and"
                    f" clientKeyFile)")
        if resp.status == 403:
            # The kubelet says "Forbidden (user=..., verb=get, resource=nodes, subresource=pods)".
            said = _first_body_line(resp, token).removeprefix("Forbidden").strip()
            hint = {"pods": _RBAC_HINT, "metrics": _RBAC_METRICS_HINT}.get(endpoint.what, _RBAC_CONFIGZ_HINT)
            return f"{head}{' ' + said if said else ''}: this user may not read the kubelet's {endpoint.what}: {hint}"
        if resp.status == 404:
            return (f"{head}: nothing at {endpoint.path.partition('?')[0]} there: the kubelet serves /pods and /metrics"
                    f" (kubelet.url, e.g. https://127.0.0.1:10250/pods)")
        if resp.status == 400 and not self._https and "HTTPS" in _first_body_line(resp, token):
            # Go's answer to plain HTTP on a TLS listener: "Client sent an HTTP request to an HTTPS server."
            return f"{head}: {_HTTPS_HINT}"
        return head

    def _classify(self, e: Exception, expired: bool, endpoint: _Endpoint, token: str | None) -> Exception:
        timeout = self.config.timeout
        name = endpoint.name
        if expired or isinstance(e, (TimeoutError, socket.timeout)):
            return SourceError(f"{name}: no answer within {timeout:g}s", "timeout")
        if isinstance(e, ssl.SSLCertVerificationError):
            given = f"caFile {self.config.ca_file} did not verify it" if self.config.ca_file else \
                "no caFile is set, and the system's CA store did not verify it"
            return SourceError(f"{name}: TLS certificate not trusted: {e.verify_message or _first_line(e)}"
                               f" ({given}): set kubelet.caFile to the CA of the kubelet's serving certificate:"
                               f" {KUBELET_CA_HINT}", "tls")
        if isinstance(e, ssl.SSLError):
            return SourceError(f"{name}: TLS failed: {e.reason or _said(_first_line(e), token)}", "tls")
        if isinstance(e, ConnectionRefusedError):
            if not self._https:
                return SourceError(f"{name}: connection refused: nothing listens there; if it is the"
                                   f" kubelet's read-only port, it is off (kubeadm and most distributions turn it"
                                   f" off): use https://127.0.0.1:10250/pods with tokenFile and caFile"
                                   f" (/usr/share/doc/memqos-systemd/README.md, 'On a kubeadm node')", "connect")
            return SourceError(f"{name}: connection refused (is the kubelet running, is the port right?)",
                               "connect")
        # A TLS server that gets plain HTTP resets the connection, closes it, or answers with TLS
        # bytes that are no status line: on an http:// URL, that is what to say.
        tls_port = f"; {_HTTPS_HINT}" if not self._https and isinstance(
            e, (ConnectionResetError, http.client.RemoteDisconnected, http.client.BadStatusLine)) else ""
        if isinstance(e, http.client.HTTPException):
            return SourceError(f"{name}: broken HTTP response: {type(e).__name__}"
                               f" {_said(_first_line(e), token)}".rstrip() + tls_port, "http")
        if isinstance(e, PermissionError):  # connect() refused by the unit's IPAddressDeny= (a BPF filter)
            return SourceError(f"{name}: {e.strerror or _first_line(e)}: the service's unit may not let it reach that"
                               f" address (IPAddressAllow=; memqos-systemd check says)", "connect")
        if isinstance(e, OSError):
            return SourceError(f"{name}: {e.strerror or _said(_first_line(e), token)}{tls_port}", "connect")
        return e  # a bug, not a fault of the kubelet: let it show

    def _read_body(self, resp: http.client.HTTPResponse, expired: threading.Event, endpoint: _Endpoint) -> bytes:
        # Chunks joined once at the end: growing a bytearray and copying it out cost ~0.75 ms
        # for 0.48 MB (fresh pages every poll), 60 % of an unchanged poll's CPU.
        chunks: list[bytes] = []
        size = 0
        while not expired.is_set():
            # read1: at most one recv at a time, so the size cap and the deadline are
            # checked while a body trickles in.
            chunk = resp.read1(min(_CHUNK, self._max_bytes + 1 - size))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > self._max_bytes:
                raise SourceError(f"{endpoint.name}: response is larger than the {self._max_bytes} byte limit",
                                  "too_large")
        raise TimeoutError

    # ------------------------------------------------------- credentials / TLS

    def _read_token(self) -> str | None:
        path = self.config.token_file
        if path is None:
            return None
        raw = _read_secret(path, "tokenFile", self.name, MAX_TOKEN_BYTES, hint=_TOKEN_HINT)
        try:
            token = raw.decode("ascii").strip()
        except UnicodeDecodeError:
            raise SourceError(f"{self.name}: tokenFile {path}: not an ASCII token", "auth") from None
        if not token:
            raise SourceError(f"{self.name}: tokenFile {path} is empty", "auth")
        if any(not (0x21 <= ord(ch) <= 0x7E) for ch in token):
            # A newline or control character would make an invalid header, and
            # http.client's error for that quotes the header value.
            raise SourceError(f"{self.name}: tokenFile {path}: token contains whitespace or control"
                              f" characters", "auth")
        return token

    def _context(self) -> ssl.SSLContext:
        """The TLS context, rebuilt when a CA/cert/key file changes (client certs rotate)."""
        cfg = self.config
        files = (cfg.ca_file, cfg.client_cert_file, cfg.client_key_file)
        key = (cfg.insecure_skip_tls_verify,) + tuple(_stat_key(f) for f in files)
        if self._ssl_context is not None and key == self._ssl_key:
            return self._ssl_context
        try:
            if cfg.insecure_skip_tls_verify:
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            else:
                ctx = ssl.create_default_context(cafile=cfg.ca_file)
                # The chain is verified here; the name after the handshake (_check_name), which
                # may accept the node's hostname besides the URL's host.
                ctx.check_hostname = False
        except (OSError, ssl.SSLError) as e:
            raise SourceError(f"{self.name}: caFile {cfg.ca_file}: cannot load:"
                              f" {getattr(e, 'strerror', None) or _first_line(e)}: the CA of the kubelet's serving"
                              f" certificate is {KUBELET_CA_HINT}", "tls") from None
        if cfg.client_cert_file and cfg.client_key_file:
            _check_not_world_readable(cfg.client_key_file, "clientKeyFile", self.name)
            try:
                ctx.load_cert_chain(cfg.client_cert_file, cfg.client_key_file)
            except (OSError, ssl.SSLError) as e:
                raise SourceError(f"{self.name}: clientCertFile {cfg.client_cert_file} / clientKeyFile"
                                  f" {cfg.client_key_file}: cannot load:"
                                  f" {getattr(e, 'strerror', None) or _first_line(e)}", "auth") from None
        self._ssl_context, self._ssl_key = ctx, key
        return ctx


# The sandbox of the packaged unit (units/memqos-systemd.service, tests/unit/test_units.py holds
# them equal), as systemd lists it: IPAddressAllow=localhost, IPAddressDeny=any.
PACKAGED_ACCESS = ([(bytes([127, 0, 0, 0]), 8), (bytes(15) + b"\x01", 128)], [(bytes(4), 0), (bytes(16), 0)])
PACKAGED_SETTINGS = "IPAddressDeny=any, IPAddressAllow=localhost"
_LOOPBACK_URL = "https://127.0.0.1:10250/pods"


def unreachable_in_service(url: str, access: tuple[list, list] | None) -> tuple[str, str] | None:
    """Whether the service's sandbox keeps it from the kubelet at `url`: (level, why) or None.
    `access`: the running service's IPAddressAllow= and IPAddressDeny= as systemd holds them,
    drop-ins included (Systemd.ip_address_access), lists of (address bytes, prefix); None when
    it is not running: then the packaged unit's (PACKAGED_ACCESS), a warning only, for a node
    may run the DaemonSet's pod instead, which has no such sandbox. As systemd applies them: an
    address an allow prefix holds passes, else one a deny prefix holds is dropped.
    Nothing is resolved, nothing is connected to: a literal address or `localhost` is judged; any
    other name cannot be known to be loopback, which is a warning."""
    if url_problem(url) is not None:
        return None
    running = access is not None
    allow, deny = ([ipaddress.ip_network((ipaddress.ip_address(a), p), strict=False) for a, p in entries]
                   for entries in (access if running else PACKAGED_ACCESS))
    if not deny:
        return None
    host = urlsplit(url).hostname or ""
    unit = ("the running service's unit" if running else
            f"the packaged unit ({PACKAGED_SETTINGS}; the service does not run here, so drop-ins are not known)")
    reach = f"{unit} lets it reach only {' '.join(map(str, allow)) or 'nothing'}"
    shown = _show_url(url)
    if host.lower() in ("localhost", "localhost."):
        addresses = [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")]
    else:
        try:
            addresses = [ipaddress.ip_address(host.partition("%")[0])]
        except ValueError:
            return ("warn", f"kubelet.url {shown}: its host {host!r} is a name, which check does not resolve: unless"
                            f" it names this node's loopback only, the service cannot reach it ({reach}): use"
                            f" {_LOOPBACK_URL}")
    blocked = [a for a in addresses if not any(a in n for n in allow) and any(a in n for n in deny)]
    if len(blocked) < len(addresses):
        return None
    return ("error" if running else "warn",
            f"kubelet.url {shown} is out of the service's reach: {reach}, not {blocked[0]}: use {_LOOPBACK_URL}"
            f" (the kubelet listens on every address), or allow it in a drop-in: systemctl edit memqos-systemd,"
            f" [Service] IPAddressAllow={blocked[0]}")


def _stat_key(path: str | None):
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return "missing"
    return (st.st_ino, st.st_dev, st.st_mtime_ns, st.st_size, st.st_mode)


def _check_not_world_readable(path: str, key: str, name: str) -> None:
    try:
        st = os.stat(path)
    except OSError as e:
        raise SourceError(f"{name}: {key} {path}: cannot read: {e.strerror or e}", "auth") from None
    if st.st_mode & stat.S_IROTH:
        raise SourceError(f"{name}: {key} {path} is readable by everyone (mode {stat.S_IMODE(st.st_mode):04o});"
                          f" refusing to use it: chmod o-r it", "auth")


def _read_secret(path: str, key: str, name: str, limit: int, hint: str = "") -> bytes:
    """Read a credential file (following symlinks, as projected tokens are), refusing o+r.
    `hint` follows the message when the file cannot be opened (e.g. where the token comes from)."""
    try:
        # O_NONBLOCK: a FIFO put in its place must not hang the fetch (it is refused below).
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise SourceError(f"{name}: {key} {path}: cannot read: {e.strerror or type(e).__name__}"
                          + (f": {hint}" if hint else ""), "auth") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SourceError(f"{name}: {key} {path} is not a regular file", "auth")
        if st.st_mode & stat.S_IROTH:
            raise SourceError(f"{name}: {key} {path} is readable by everyone (mode"
                              f" {stat.S_IMODE(st.st_mode):04o}); refusing to use it: chmod o-r it", "auth")
        try:
            data = os.read(fd, limit + 1)
        except OSError as e:
            raise SourceError(f"{name}: {key} {path}: cannot read: {e.strerror or type(e).__name__}",
                              "auth") from None
        if len(data) > limit:
            raise SourceError(f"{name}: {key} {path} is larger than {limit} bytes", "auth")
        return data
    finally:
        os.close(fd)


def redact(text: str, secret: str) -> str:
    """`text` with every occurrence of `secret`, and of any prefix of it at least
    _MIN_PREFIX long (a truncated copy), replaced by '<token>'."""
    if not secret:
        return text
    if len(secret) < _MIN_PREFIX:
        return text.replace(secret, "<token>")
    head = secret[:_MIN_PREFIX]
    out = []
    i = 0
    while True:
        j = text.find(head, i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        k = _MIN_PREFIX
        while k < len(secret) and j + k < len(text) and text[j + k] == secret[k]:
            k += 1
        out.append(text[i:j])
        out.append("<token>")
        i = j + k


def _name_matches(name: str, kind: str, value: str) -> bool:
    """Does a certificate's subjectAltName entry (kind 'DNS' or 'IP Address') name `name`?
    DNS names compare without case; a wildcard stands for exactly one leftmost label."""
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        ip = None
    if kind == "IP Address":
        try:
            return ip is not None and ipaddress.ip_address(value) == ip
        except ValueError:
            return False
    if ip is not None:
        return False
    name, value = name.lower().rstrip("."), value.lower().rstrip(".")
    if value.startswith("*."):
        head, _, rest = name.partition(".")
        return bool(head) and rest == value[2:] and "*" not in rest
    return "*" not in value and name == value


def _scrubs_body(token: str | None) -> bool:
    """Whether a pod list is scrubbed of `token` before it is read: only a token long enough not
    to be found in ordinary names (a ServiceAccount token is a JWT of hundreds of characters; a
    kubelet that answers 200 has taken it for one), or a pod named like the token would change."""
    return token is not None and len(token) >= _MIN_PREFIX


def _said(text: object, token: str | None, limit: int = 200) -> str:
    """What the kubelet (or the network) said, for one of our messages: printable, bounded, and
    with the token masked, where an echo of it would be (never in our own words around it)."""
    line = _printable(text)[:limit]
    return redact(line, token) if token else line


def _first_body_line(resp: http.client.HTTPResponse, token: str | None) -> str:
    """The first line of a short error body (the kubelet's 'Forbidden (user=...)'), scrubbed."""
    try:
        body = resp.read(_ERROR_BODY_BYTES)
    except (OSError, http.client.HTTPException):
        return ""
    text = body.decode("utf-8", "replace").strip()
    return _said(text.splitlines()[0] if text else "", token)


def _printable(text: object) -> str:
    return "".join(ch if ch.isprintable() else "?" for ch in str(text))


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return _printable(text.splitlines()[0] if text else type(e).__name__)[:200]
