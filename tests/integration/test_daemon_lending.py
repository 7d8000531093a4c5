"""Lines that follow usage (issue 44, `lending: {enabled: true}`) in the daemon, on a private
dbus-daemon with the stand-in systemd: the BestEffort ceiling and the Burstable lever drawn from
what the pods with requests use (their cgroups' memory.current, memory.events and memory.pressure,
files in the stand-in's cgroup directories), looked at again as usage moves, taken back when the
owners grow into it (stepped down with the borrower's usage, never below it), and back to the static lines when
lending is turned off. The metrics show each line and what it lends.

The kernel's side (the OOM kill in BestEffort, the throttled borrower, the owners' pages kept) is
proven in the VM: tests/e2e/scenarios/25-ceiling.py and bench/protection.py."""

from __future__ import annotations

import pytest
import yaml
from harness import Harness, run, until
from test_daemon import BPOD, BURSTABLE, GPOD, GUARANTEED, NODE_UNITS, TIERED, pod, start_pods

from memqos_systemd import lending
from memqos_systemd.quantity import UINT64_MAX

pytestmark = pytest.mark.integration

MI = 2**20
CAPACITY = 2 << 30
ALLOC = (2048 - 100) * MI
BE = "kubepods-besteffort.slice"
U_UID = "1d2c3b4a-5e6f-4a7b-8c9d-0e1f2a3b4c5d"
UPOD = f"kubepods-burstable-pod{U_UID.replace('-', '_')}.slice"
UCTR = "cri-containerd-" + "c" * 64 + ".scope"
UNLIMITED = pod(U_UID, "u", "128Mi", None, "c" * 64, "Burstable")  # a Burstable pod without a limit
STATIC = {**TIERED, "bestEffortCeiling": {"enabled": True}, "burstableHigh": {"enabled": True}}
LENDING = {**STATIC, "lending": {"enabled": True}}
Q = 16 * MI  # lending.quantum of 1948 MiB
HEADROOM = 64 * MI


def grid(x: int) -> int:
    return x // Q * Q


def use(fake, unit: str, usage: int, low: int = 0, stall_us: int = 0) -> None:
    """What the kernel would show of a slice: memory.current, memory.events, memory.pressure."""
    d = fake.cgroup_dir(unit)
    d.mkdir(parents=True, exist_ok=True)
    (d / "memory.current").write_text(f"{usage}\n")
    (d / "memory.events").write_text(f"low {low}\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    (d / "memory.pressure").write_text(f"some avg10=0.00 avg60=0.00 avg300=0.00 total={stall_us}\n"
                                       "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")


def reserve(request: int, usage: int) -> int:
    return min(request, usage + lending.slack_min(request))


def memory_max(fake) -> int:
    return fake.unit(BE).memory_max


def high(fake, unit: str) -> int:
    return fake.unit(unit).memory["MemoryHigh"]


def gauge(h: Harness, name: str, lever: str, pod: str = "") -> float | None:
    return h.metrics.registry.get_sample_value(name, {"lever": lever, "pod": pod})


def node(fake, tmp_path, config=LENDING) -> Harness:
    return Harness(fake, tmp_path, [GUARANTEED, BURSTABLE, UNLIMITED], config=config, capacity=CAPACITY,
                   state_dir=tmp_path)


def test_lines_follow_usage_and_take_back_a_step_at_a_time(fake_systemd, tmp_path):
    start_pods(fake_systemd, *NODE_UNITS, UPOD, UCTR, BE)
    g, b, u = 512 * MI, 256 * MI, 128 * MI  # requests
    use(fake_systemd, GPOD, 100 * MI)
    use(fake_systemd, BPOD, 50 * MI)
    use(fake_systemd, UPOD, 0)
    use(fake_systemd, BE, 10 * MI)
    owners = reserve(g, 100 * MI) + reserve(b, 50 * MI)
    ceiling = grid(ALLOC - HEADROOM - owners - reserve(u, 0))
    lever = grid(ALLOC - HEADROOM - owners)

    async def body():
        async with node(fake_systemd, tmp_path) as h:
            await until(lambda: memory_max(fake_systemd) == ceiling and high(fake_systemd, UPOD) == lever)
            static_ceiling = max(64 * MI, ALLOC - HEADROOM - (g + b + u))
            assert gauge(h, "memqos_lending_line_bytes", "bestEffortCeiling") == ceiling
            assert gauge(h, "memqos_lending_lent_bytes", "bestEffortCeiling") == ceiling - static_ceiling
            assert gauge(h, "memqos_lending_line_bytes", "burstableHigh", "ns/u") == lever
            assert gauge(h, "memqos_lending_lent_bytes", "burstableHigh", "ns/u") == \
                lever - (ALLOC - g - b)
            # BestEffort fills what it was lent; G grows to its request: the line comes down below
            # BestEffort's usage. Its MemoryMax steps down with the usage, never below it, a guard
            # above it (lending.GUARD: a write below the usage makes PID 1 reclaim and OOM-kill)
            use(fake_systemd, BE, ceiling - 8 * MI)
            use(fake_systemd, GPOD, 510 * MI)
            lower = grid(ALLOC - HEADROOM - g - reserve(b, 50 * MI) - reserve(u, 0))
            assert ceiling - lower > 2 * lending.GUARD
            # (the gauge is set after the round's writes: waited for too)
            await until(lambda: memory_max(fake_systemd) == ceiling - 8 * MI + lending.GUARD
                        and gauge(h, "memqos_lending_line_bytes", "bestEffortCeiling") == lower, timeout=15)
            assert high(fake_systemd, BE) == UINT64_MAX  # no MemoryHigh below the usage either
            assert high(fake_systemd, UPOD) == max(ALLOC - g - b, grid(ALLOC - HEADROOM - g - reserve(b, 50 * MI)))
            use(fake_systemd, BE, lower + 10 * MI)  # the kernel took its pages (its own charge's OOM kill)
            await until(lambda: memory_max(fake_systemd) == lower + 10 * MI + lending.GUARD, timeout=15)
            use(fake_systemd, BE, lower - MI)  # at the line: the line
            await until(lambda: memory_max(fake_systemd) == lower
                        and gauge(h, "memqos_lending_line_bytes", "bestEffortCeiling") == lower, timeout=15)
    run(body())


def test_a_pressed_owner_takes_its_request_back_at_once_and_off_restores_the_static_lines(fake_systemd, tmp_path):
    start_pods(fake_systemd, *NODE_UNITS, UPOD, UCTR, BE)
    g, b, u = 512 * MI, 256 * MI, 128 * MI
    for unit in (GPOD, BPOD, UPOD, BE):
        use(fake_systemd, unit, 0)

    async def body():
        async with node(fake_systemd, tmp_path) as h:
            first = grid(ALLOC - HEADROOM - reserve(g, 0) - reserve(b, 0) - reserve(u, 0))
            await until(lambda: memory_max(fake_systemd) == first)
            use(fake_systemd, BPOD, 0, low=1)  # reclaimed below its MemoryLow
            pressed = grid(ALLOC - HEADROOM - reserve(g, 0) - b - reserve(u, 0))
            await until(lambda: memory_max(fake_systemd) == pressed, timeout=15)
            # off: the static lines, and the lending series go
            h.config_path.write_text(yaml.safe_dump(STATIC))
            h.daemon.request_reload()
            # the series go in the round that writes the static lines, after its writes: waited for too
            await until(lambda: memory_max(fake_systemd) == max(64 * MI, ALLOC - 256 * MI - (g + b + u))
                        and high(fake_systemd, UPOD) == ALLOC - g - b
                        and gauge(h, "memqos_lending_line_bytes", "bestEffortCeiling") is None, timeout=5)
            assert high(fake_systemd, UPOD) < UINT64_MAX
    run(body())
