"""hosts.is_loopback: one answer for the metrics endpoint and the kubelet source (issue 43: the two
copies it replaces disagreed on "LOCALHOST")."""

from __future__ import annotations

import pytest

from memqos_systemd.hosts import is_loopback


@pytest.mark.parametrize("host, expected", [
    ("localhost", True), ("LOCALHOST", True), ("LocalHost", True), ("localhost.", True),
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("0.0.0.0", False), ("::", False), ("10.0.0.1", False), ("::ffff:10.0.0.1", False),
    ("localhost.example.com", False), ("mylocalhost", False), ("", False), ("[::1]", False),
    ("node-1", False),
])
def test_is_loopback(host, expected):
    assert is_loopback(host) is expected
