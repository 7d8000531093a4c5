"""sd_notify: one datagram per message, never blocking, STATUS= only when it changes."""

import socket

from memqos_systemd.notify import Notifier
from sockets import socket_path


def receiver(tmp_path):
    path = socket_path(tmp_path, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    return path, sock


def drain(sock) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


def test_a_receiver_that_never_reads_does_not_block_the_sender(tmp_path):
    # A hung PID 1 stops reading its notify socket; the daemon must carry on (found when a test's
    # socket filled up and the daemon's loop hung in send()).
    path, sock = receiver(tmp_path)
    n = Notifier(path)
    results = [n.send("WATCHDOG=1", f"X={i}") for i in range(5000)]
    assert results[0] is True and results[-1] is False  # the queue filled; the rest were dropped
    assert len(drain(sock)) == results.count(True)


def test_status_is_sent_only_when_it_changes(tmp_path):
    path, sock = receiver(tmp_path)
    n = Notifier(path)
    n.ready("3 pods")
    for _ in range(10):
        n.status("3 pods")
    n.status("4 pods")
    n.status("4 pods")
    assert drain(sock) == ["READY=1\nSTATUS=3 pods", "STATUS=4 pods"]


def test_abstract_socket_names_and_no_socket(tmp_path):
    assert not Notifier("").enabled and Notifier("").send("READY=1") is False
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0memqos-test-notify-%d" % id(sock))
    n = Notifier("@" + sock.getsockname()[1:].decode())
    assert n.send("READY=1")
    assert sock.recv(100) == b"READY=1"
