"""What the commands share: how they speak (an error, a warning), reach systemd and the pod
source, plan, learn the mode beside the kubelet, and ask the running service for its counters."""

from __future__ import annotations

import asyncio
import os
import sys
import urllib.request

from . import promtext
from .config import Config
from .kubelet_gate import Mode, companion_mode, properties_where
from .metrics import parse_listen
from .node import check_node, systemd_findings
from .sources import kubelet_gates, make_source
from .systemd import Systemd
from .places import CGROUP_ROOT

EXIT_OK, EXIT_FAILURE = 0, 1
SERVICE = "memqos-systemd.service"
CALL_TIMEOUT = 10.0


def err(msg: str) -> None:
    print(f"memqos-systemd: error: {msg}", file=sys.stderr)


def warn(msg: str) -> None:
    print(f"memqos-systemd: warning: {msg}", file=sys.stderr)


async def connect() -> Systemd:
    # DBUS_SYSTEM_BUS_ADDRESS points tests at a private bus.
    return await Systemd.connect(None, call_timeout=CALL_TIMEOUT)


def fetch(cfg: Config):
    return make_source(cfg).fetch()


async def mode_of(cfg: Config) -> Mode:
    """Beside the kubelet's own Memory QoS or not, and what it writes as its own, as the service
    decides it (its /metrics and /configz asked once, its config file read)."""
    facts, _, _ = await asyncio.to_thread(kubelet_gates, cfg)
    return companion_mode(cfg.companion, facts)


def left_to_it(mode: Mode) -> str:
    return f"{mode.name} ({mode.why}): left to the kubelet: {properties_where(mode.writes.levels) or 'nothing'}"


def not_a_node() -> list[str]:
    """What makes this machine no systemd/cgroup v2 node (empty on a node): `apply` stops there."""

    found = systemd_host() + [f for f in check_node(cgroup_root=CGROUP_ROOT) if f.what == "cgroup v2"]
    return [f.detail for f in found if f.level == "error"]


def systemd_host() -> list:
    """node.systemd_findings for the bus this process would use (DBUS_SYSTEM_BUS_ADDRESS or the system's)."""

    return systemd_findings(os.environ.get("DBUS_SYSTEM_BUS_ADDRESS") or None)


def service_counts(cfg: Config, family: str, keys: tuple[str, str]) -> dict[tuple[str, str], float]:
    """A counter of the running service (`family`), by the two labels `keys`, from its metrics
    endpoint (loopback, no credentials); only those above 0; empty when it does not answer."""
    if not cfg.metrics.listen:
        return {}
    host, port = parse_listen(cfg.metrics.listen)
    host = "127.0.0.1" if host in ("", "0.0.0.0") else "::1" if host == "::" else host
    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy
        with opener.open(f"http://{'[' + host + ']' if ':' in host else host}:{port}/metrics", timeout=2) as r:
            text = r.read(4 << 20).decode("utf-8", "replace")
    except (OSError, ValueError):
        return {}
    found: dict[tuple[str, str], float] = {}
    for sample in promtext.samples(text, (family,)).samples:
        if keys[0] in sample.labels and keys[1] in sample.labels:
            found[(sample.labels[keys[0]], sample.labels[keys[1]])] = sample.value
    return {k: n for k, n in found.items() if n > 0}

