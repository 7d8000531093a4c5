"""The kubelet's `/pods` endpoint over HTTP(S), with the standard library only.

`KubeletSource(config.KubeletSource).fetch()` does one GET and returns a
`Snapshot` or raises `SourceError`. Choices that matter:

* http.client, not urllib: no proxy from the environment (the token would go to
  the proxy) and no redirects (the token would follow them).
* The bearer token file is re-read on every fetch, so rotation just works. It
  is refused when world-readable or unreadable; its content never appears in
  any message or log (messages are also scrubbed of it, in case a library
  echoes a header). The client key file is refused when world-readable too.
* TLS verifies the server by default, against `caFile` or the system store;
  `insecureSkipTLSVerify: true` turns that off and logs one warning.
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

from ..config import KubeletSource as KubeletConfig
from . import MAX_RESPONSE_BYTES, Snapshot, SourceError, snapshot_from_doc

__all__ = ["KubeletSource", "MAX_TOKEN_BYTES", "redact"]

log = logging.getLogger(__name__)

MAX_TOKEN_BYTES = 64 * 1024
_CHUNK = 64 * 1024
# A secret's prefix this long in a message is taken for the secret, cut off.
_MIN_PREFIX = 8


class KubeletSource:
    """Pods from the kubelet. Blocking; one instance per config (make a new one on reload)."""

    def __init__(self, config: KubeletConfig, *, clock: Callable[[], float] = time.monotonic,
                 max_bytes: int = MAX_RESPONSE_BYTES):
        self.config = config
        self._clock = clock
        self._max_bytes = max_bytes
        parts = urlsplit(config.url)
        self.name = f"kubelet {self._safe_url(parts)}"
        # A bad URL is reported by fetch() as a SourceError, so that making a source
        # (at start or on SIGHUP) never raises.
        self._url_error: str | None = None
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = 0
        if parts.scheme not in ("http", "https") or not parts.hostname:
            self._url_error = "kubelet.url must be an http:// or https:// URL with a host"
        else:
            try:
                self._port = parts.port or (443 if self._https else 80)
            except ValueError:
                self._url_error = "kubelet.url has an invalid port"
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
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
        try:
            port = f":{parts.port}" if parts.port else ""
        except ValueError:
            port = ":?"
        return f"{parts.scheme}://{host}{port}{parts.path}"

    # ------------------------------------------------------------------ fetch

    def fetch(self) -> Snapshot:
        if self._url_error:
            raise SourceError(f"{self.name}: {self._url_error}", "connect")
        token = self._read_token()
        try:
            snapshot = self._fetch(token)
        except SourceError as e:
            # Anything may echo the token back (a reason phrase, a pod name in a
            # parse warning): scrub it, and any cut-off prefix of it.
            if token:
                raise SourceError(redact(str(e), token), e.kind) from None
            raise
        if token and any(token[:_MIN_PREFIX] in w for w in snapshot.warnings):
            snapshot = dataclasses.replace(snapshot, warnings=tuple(redact(w, token) for w in snapshot.warnings))
        return snapshot

    def _fetch(self, token: str | None) -> Snapshot:
        body = self._get(token)
        fetched_at = self._clock()
        digest = hashlib.sha256(body).digest()
        last = self._last_good
        if last is not None and last[1] == token and last[0] == digest:
            return dataclasses.replace(last[2], fetched_at=fetched_at)
        self._last_good = None
        if token and token[:_MIN_PREFIX].encode() in body:
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

    def _get(self, token: str | None) -> bytes:
        """One GET. The whole exchange is bounded by `timeout`: besides the per-operation
        socket timeout, a timer shuts the socket down at the deadline, so a server that
        trickles headers or body a byte at a time cannot hold the fetch (and the daemon
        waiting on it) forever."""
        timeout = self.config.timeout
        headers = {"Accept": "application/json", "User-Agent": "memqos-systemd"}
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
            conn.request("GET", self._path, headers=headers)
            resp = conn.getresponse()
            if resp.status != 200:
                reason = _printable(resp.reason)[:80]
                raise SourceError(f"{self.name}: HTTP {resp.status} {reason}".rstrip(), "http")
            length = resp.getheader("Content-Length")
            if length and length.strip().isdigit() and int(length) > self._max_bytes:
                raise SourceError(f"{self.name}: response of {int(length)} bytes is larger than the"
                                  f" {self._max_bytes} byte limit", "too_large")
            body = self._read_body(resp, expired)
            if expired.is_set():
                raise TimeoutError  # the body may have been cut short by the shutdown
            return body
        except SourceError:
            raise
        except Exception as e:
            raise self._classify(e, expired.is_set()) from None
        finally:
            timer.cancel()
            conn.close()

    def _classify(self, e: Exception, expired: bool) -> Exception:
        timeout = self.config.timeout
        if expired or isinstance(e, (TimeoutError, socket.timeout)):
            return SourceError(f"{self.name}: no answer within {timeout:g}s", "timeout")
        if isinstance(e, ssl.SSLCertVerificationError):
            return SourceError(f"{self.name}: TLS certificate not trusted: {e.verify_message or _first_line(e)}"
                               f" (set kubelet.caFile to the kubelet's CA)", "tls")
        if isinstance(e, ssl.SSLError):
            return SourceError(f"{self.name}: TLS failed: {e.reason or _first_line(e)}", "tls")
        if isinstance(e, ConnectionRefusedError):
            return SourceError(f"{self.name}: connection refused (is the kubelet running, is the port right?)",
                               "connect")
        if isinstance(e, http.client.HTTPException):
            return SourceError(f"{self.name}: broken HTTP response: {type(e).__name__}"
                               f" {_first_line(e)}".rstrip(), "http")
        if isinstance(e, OSError):
            return SourceError(f"{self.name}: {e.strerror or _first_line(e)}", "connect")
        return e  # a bug, not a fault of the kubelet: let it show

    def _read_body(self, resp: http.client.HTTPResponse, expired: threading.Event) -> bytes:
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
                raise SourceError(f"{self.name}: response is larger than the {self._max_bytes} byte limit",
                                  "too_large")
        raise TimeoutError

    # ------------------------------------------------------- credentials / TLS

    def _read_token(self) -> str | None:
        path = self.config.token_file
        if path is None:
            return None
        raw = _read_secret(path, "tokenFile", self.name, MAX_TOKEN_BYTES)
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
        except (OSError, ssl.SSLError) as e:
            raise SourceError(f"{self.name}: caFile {cfg.ca_file}: cannot load:"
                              f" {getattr(e, 'strerror', None) or _first_line(e)}", "tls") from None
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


def _read_secret(path: str, key: str, name: str, limit: int) -> bytes:
    """Read a credential file (following symlinks, as projected tokens are), refusing o+r."""
    try:
        # O_NONBLOCK: a FIFO put in its place must not hang the fetch (it is refused below).
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise SourceError(f"{name}: {key} {path}: cannot read: {e.strerror or type(e).__name__}", "auth") from None
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


def _printable(text: object) -> str:
    return "".join(ch if ch.isprintable() else "?" for ch in str(text))


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return _printable(text.splitlines()[0] if text else type(e).__name__)[:200]
