"""Whether a host names this machine's loopback: one answer for the metrics endpoint (a warning
when it listens beyond it) and the kubelet source (which names its certificate may carry). Pure."""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback"]


def is_loopback(host: str) -> bool:
    """`localhost` in any case, with or without the root's trailing dot, an IPv4 or IPv6 loopback
    address, or an IPv4 loopback mapped into IPv6 (::ffff:127.0.0.1). Brackets ([::1]) are the
    URL's, not the host's: the caller takes them off (urllib's hostname does)."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)
