"""The /metrics endpoint, scraped over real HTTP on 127.0.0.1."""

from __future__ import annotations

import math
import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from memqos_systemd.cgroupfs import Cgroupfs
from memqos_systemd.config import Config, MetricsConfig
from memqos_systemd.metrics import Metrics
from memqos_systemd.plan import NodeFacts, plan
from memqos_systemd.pods import Container, Pod
from prereq import require

pytestmark = pytest.mark.integration

GI = 2**30


def get(url: str, timeout: float = 5.0) -> tuple[int, str, str]:
    # No proxy: the endpoint is local.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


def samples(text: str) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


@pytest.fixture
def metrics():
    m = Metrics(version="1.2.3")
    servers = []

    def serve(listen="127.0.0.1:0"):
        srv = m.serve(listen)
        servers.append(srv)
        return srv

    m.serve_for_test = serve
    yield m
    for s in servers:
        s.close()


def test_scrape_real_endpoint(metrics, tmp_path):
    pods = [
        Pod("11111111-1111-4111-8111-111111111111", "db", "pg-0", "Guaranteed",
            (Container("pg", "app", 2 * GI, 2 * GI, "containerd://" + "a" * 64),)),
        Pod("22222222-2222-4222-8222-222222222222", "web", "api-0", "Burstable",
            (Container("api", "app", GI, 4 * GI, "containerd://" + "b" * 64),)),
    ]
    p = plan(pods, NodeFacts(16 * GI), Config(memory_reservation_policy="TieredReservation"))
    fs = Cgroupfs(tmp_path)
    scope = "cri-containerd-" + "b" * 64 + ".scope"
    events = fs.place(p.cgroup_paths)[scope] / "memory.events"
    events.parent.mkdir(parents=True)
    events.write_text("low 0\nhigh 41\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n")
    metrics.set_plan(p, fs, MetricsConfig(per_unit=True))
    metrics.observe_reconcile(0.012, 9)
    metrics.dbus_call("SetUnitProperties", "ok")
    metrics.dbus_call("SetUnitProperties", "NoSuchUnit")
    metrics.source_error("connect")
    metrics.source_success()

    srv = metrics.serve_for_test()
    assert srv.host == "127.0.0.1" and srv.port > 0
    # Asked as Prometheus asks (OpenMetrics first, gzip): the text format 0.0.4, uncompressed.
    request = urllib.request.Request(srv.url, headers={
        "Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
        "Accept-Encoding": "gzip"})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=5) as r:
        status, ctype, encoding, text = r.status, r.headers["Content-Type"], r.headers["Content-Encoding"], r.read()
    assert status == 200 and ctype == "text/plain; version=0.0.4; charset=utf-8" and encoding is None
    s = samples(text.decode())
    assert s["memqos_build_info"] == {(("version", "1.2.3"),): 1.0}
    assert s["memqos_node_memory_min_bytes"][()] == 2 * GI
    assert s["memqos_node_memory_low_bytes"][()] == GI
    assert s["memqos_pods"][(("qos_class", "Burstable"),)] == 1
    assert s["memqos_pods"][(("qos_class", "Guaranteed"),)] == 1
    desired = s["memqos_unit_desired_bytes"]
    pod_slice = "kubepods-burstable-pod22222222_2222_4222_8222_222222222222.slice"
    assert desired[(("level", "pod"), ("property", "MemoryLow"), ("unit", pod_slice))] == GI
    assert desired[(("level", "node"), ("property", "MemoryHigh"), ("unit", "kubepods.slice"))] == math.inf
    assert desired[(("level", "container"), ("property", "MemoryHigh"), ("unit", scope))] < 4 * GI
    assert s["memqos_reconcile_duration_seconds_count"][()] == 1
    assert s["memqos_reconcile_changes_total"][()] == 9
    assert s["memqos_dbus_calls_total"][(("method", "SetUnitProperties"), ("result", "NoSuchUnit"))] == 1
    assert s["memqos_source_errors_total"][(("kind", "connect"),)] == 1
    assert s["memqos_source_last_success_timestamp_seconds"][()] > 1.6e9
    assert 0 <= s["memqos_source_snapshot_age_seconds"][()] < 60
    assert s["process_cpu_seconds_total"][()] > 0 and s["process_open_fds"][()] > 0  # prometheus_client's
    container = (("container", "api"), ("namespace", "web"), ("pod", "api-0"), ("qos_class", "Burstable"))
    assert s["memqos_container_memory_high_events_total"] == {container: 41}

    # Read at each scrape: a new count shows at once.
    events.write_text("low 0\nhigh 42\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n")
    assert samples(get(srv.url)[2])["memqos_container_memory_high_events_total"][container] == 42


def test_a_page_that_cannot_be_made_is_a_500_and_one_journal_line(metrics, monkeypatch, caplog):
    def broken():
        raise OSError("EIO")
    monkeypatch.setattr(metrics, "render", broken)
    srv = metrics.serve_for_test()
    with pytest.raises(urllib.error.HTTPError) as e:
        get(srv.url)
    assert e.value.code == 500
    assert [r.getMessage() for r in caplog.records] == ["metrics: cannot make the page: OSError: EIO"]
    assert get(srv.url.replace("/metrics", "/livez"))[0] == 200  # the probes still answer


def test_default_listen_is_loopback():
    assert MetricsConfig().listen.startswith("127.0.0.1:")


def test_binds_only_the_given_address(metrics):
    srv = metrics.serve_for_test("127.0.0.1:0")
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5):
        pass
    # Not on another local address of this host (127.0.0.2 is loopback, but a different address).
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.2", srv.port), timeout=2).close()


def test_ipv6_loopback(metrics):
    if not socket.has_ipv6:
        require(False, "no IPv6")
    try:
        srv = metrics.serve_for_test("[::1]:0")
    except OSError as e:
        require(False, f"no ::1 here: {e}")
    assert get(srv.url)[0] == 200


def test_close_frees_the_port(metrics):
    srv = metrics.serve_for_test()
    port = srv.port
    assert get(srv.url)[0] == 200
    srv.close()
    assert not srv._thread.is_alive()  # woken at once: it does not poll for the shutdown
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    srv.close()  # idempotent
    # The same port can be bound again right away (a SIGHUP that keeps the address).
    again = metrics.serve_for_test(f"127.0.0.1:{port}")
    assert get(again.url)[0] == 200


def test_port_in_use_is_an_oserror(metrics):
    srv = metrics.serve_for_test()
    with pytest.raises(OSError):
        metrics.serve(f"127.0.0.1:{srv.port}")


def test_non_loopback_is_bound_as_configured_with_a_warning(metrics, caplog):
    srv = metrics.serve_for_test("0.0.0.0:0")
    assert "not a loopback address" in caplog.text
    assert get(f"http://127.0.0.1:{srv.port}/metrics")[0] == 200


def test_readyz_is_503_until_set_ready_then_200(metrics):
    srv = metrics.serve_for_test()
    url = f"http://127.0.0.1:{srv.port}/readyz"
    with pytest.raises(urllib.error.HTTPError) as e:
        get(url)
    assert e.value.code == 503
    assert b"not ready" in e.value.read()
    metrics.set_ready()
    status, ctype, body = get(url)
    assert (status, body) == (200, "ready\n") and ctype.startswith("text/plain")
    assert get(srv.url)[0] == 200  # /metrics is still served beside it


def test_livez_is_200_while_the_loop_beats_and_503_once_it_has_not_for_the_window():
    from memqos_systemd.metrics import LIVENESS_WINDOW
    now = [1000.0]
    m = Metrics(clock=lambda: now[0])
    srv = m.serve("127.0.0.1:0")
    url = f"http://127.0.0.1:{srv.port}/livez"
    try:
        # alive from the start, before the first beat
        assert get(url)[::2] == (200, "alive: the daemon's loop last ran 0.0 s ago\n")
        now[0] += LIVENESS_WINDOW + 1
        with pytest.raises(urllib.error.HTTPError) as e:
            get(url)
        assert e.value.code == 503
        assert e.value.read() == b"not alive: the daemon's loop last ran 61 s ago\n"
        m.heartbeat()
        now[0] += 12.34
        assert get(url)[::2] == (200, "alive: the daemon's loop last ran 12.3 s ago\n")
        now[0] += LIVENESS_WINDOW - 12.34
        assert get(url)[0] == 200  # the window's end still counts
    finally:
        srv.close()
