"""Systemd.unit_states / read_memory, and set_memory_if_loaded trusting a state read a moment ago.

A reconcile round reads the state of all its units in one ListUnitsByPatterns call and writes
without checking each unit again, unless a signal for the unit was read after that answer.
"""

import asyncio

import pytest

from memqos_systemd.systemd import NoSuchUnit

from test_systemd_adapter import MiB, POD, SCOPE, client, run

pytestmark = pytest.mark.integration


def test_unit_states_reads_many_units_in_one_call_and_loads_none(fake_systemd):
    fake_systemd.add_unit("kubepods.slice")
    fake_systemd.add_unit(POD, active_state="activating")
    fake_systemd.add_unit(SCOPE, active_state="inactive")
    gone = POD.replace("0f3c", "1111")

    async def body():
        async with client(fake_systemd) as sd:
            fake_systemd.clear_calls()
            states = await sd.unit_states(["kubepods.slice", POD, SCOPE, gone])
            assert [c.method for c in fake_systemd.calls] == ["ListUnitsByPatterns"]
            assert set(states) == {"kubepods.slice", POD, SCOPE}  # not in memory: left out
            assert states[POD].running and not states[SCOPE].running
            fake_systemd.clear_calls()
            assert await sd.read_memory(POD, states[POD]) == {"MemoryMin": 0, "MemoryLow": 0,
                                                              "MemoryHigh": 2**64 - 1}
            assert [c.method for c in fake_systemd.calls] == ["GetAll"]
    run(body())
    assert fake_systemd.unit(gone) is None and fake_systemd.created == []


def test_a_fresh_running_state_costs_the_invocation_id_then_only_the_write(fake_systemd):
    fake_systemd.add_unit(POD)

    async def body():
        async with client(fake_systemd) as sd:
            await sd.subscribe()
            status = (await sd.unit_states([POD]))[POD]
            fake_systemd.clear_calls()
            await sd.set_memory_if_loaded(POD, {"MemoryLow": 64 * MiB}, status=status)
            get, write = fake_systemd.calls
            assert (get.method, get.args) == ("Get", ["org.freedesktop.systemd1.Unit", "InvocationID"])
            assert (write.method, write.interface) == ("SetProperties", "org.freedesktop.systemd1.Unit")
            assert write.path == fake_systemd.unit(POD).invocation_path
            # The same run of the unit: its invocation path is remembered.
            fake_systemd.clear_calls()
            await sd.set_memory_if_loaded(POD, {"MemoryLow": 32 * MiB}, status=status)
            assert [c.method for c in fake_systemd.calls] == ["SetProperties"]
    run(body())
    assert fake_systemd.writes[-1] == (POD, True, {"MemoryLow": 32 * MiB})
    assert fake_systemd.unit(POD).memory["MemoryLow"] == 32 * MiB


def test_a_fresh_state_that_is_not_running_refuses_without_a_call(fake_systemd):
    fake_systemd.add_unit(POD, active_state="inactive")

    async def body():
        async with client(fake_systemd) as sd:
            await sd.subscribe()
            status = (await sd.unit_states([POD]))[POD]
            fake_systemd.clear_calls()
            with pytest.raises(NoSuchUnit):
                await sd.set_memory_if_loaded(POD, {"MemoryLow": 64 * MiB}, status=status)
            assert fake_systemd.calls == []
    run(body())


@pytest.mark.parametrize("signal", ["JobRemoved", "UnitRemoved"])
def test_a_signal_for_the_unit_after_its_state_was_read_makes_the_write_check_again(fake_systemd, signal):
    """A stop job's JobRemoved, or UnitRemoved, read after the state: the state is not trusted."""
    fake_systemd.add_unit(POD)

    async def body():
        async with client(fake_systemd) as sd:
            heard = asyncio.Event()
            await sd.subscribe(on_job_removed=lambda unit, result: heard.set(),
                               on_unit_removed=lambda unit: heard.set())
            status = (await sd.unit_states([POD]))[POD]
            if signal == "JobRemoved":
                fake_systemd.set_active_state(POD, "inactive")
                fake_systemd.emit_job_removed(POD, "done")
            else:
                fake_systemd.remove_unit(POD)
            await asyncio.wait_for(heard.wait(), 2)
            fake_systemd.clear_calls()
            with pytest.raises(NoSuchUnit):
                await sd.set_memory_if_loaded(POD, {"MemoryLow": 64 * MiB}, status=status)
            assert fake_systemd.calls_to("GetUnit")  # checked again
            assert fake_systemd.writes == []
            if signal == "UnitRemoved":
                assert await sd.read_memory(POD, status) is None  # its path would load it again
    run(body())
    assert fake_systemd.created == []


def test_a_signal_for_another_unit_does_not_make_the_write_check_again(fake_systemd):
    fake_systemd.add_unit(POD)
    fake_systemd.add_unit(SCOPE)

    async def body():
        async with client(fake_systemd) as sd:
            heard = asyncio.Event()
            await sd.subscribe(on_job_removed=lambda unit, result: heard.set())
            status = (await sd.unit_states([POD, SCOPE]))[POD]
            fake_systemd.emit_job_removed(SCOPE, "done")
            await asyncio.wait_for(heard.wait(), 2)
            fake_systemd.clear_calls()
            await sd.set_memory_if_loaded(POD, {"MemoryLow": 64 * MiB}, status=status)
            assert [c.method for c in fake_systemd.calls] == ["Get", "SetProperties"]
    run(body())


EARLY = "kubepods-besteffort-pod1a2b3c4d_0000_4000_8000_000000000001.slice"  # sorts before POD: read first


def _like_the_daemon(sd):
    from memqos_systemd.applier import Applier
    from memqos_systemd.naming import Naming
    from memqos_systemd.observe import Observer

    observer = Observer(sd, Naming("/"))
    # What Daemon.on_unit_removed does to the cache.
    return observer, Applier(sd), {"on_unit_removed": observer.forget}


def test_a_unit_removed_while_its_read_is_out_is_not_cached_again(fake_systemd):
    """Seen in the VM (85-churn): two GetAll in flight, the second unit's answer came, then its
    UnitRemoved (the daemon forgot it), then the first answer; the second unit's value was then
    stored, and its deleted pod stayed planned (carry_over) until the next resync."""
    fake_systemd.add_unit(EARLY)
    fake_systemd.add_unit(POD, memory={"MemoryLow": 64 * MiB})

    async def body():
        async with client(fake_systemd) as sd:
            observer, _, handlers = _like_the_daemon(sd)
            await sd.subscribe(**handlers)
            fake_systemd.delay_next("GetAll", 0.6)  # EARLY's read: POD's answer comes first
            reading = asyncio.ensure_future(observer.read([EARLY, POD]))
            await asyncio.sleep(0.2)
            fake_systemd.remove_unit(POD)  # POD's answer is in; its UnitRemoved follows
            await asyncio.sleep(0.1)
            snap = await reading
            assert POD not in observer.held, observer.held
            assert EARLY in observer.held
            assert POD not in snap.states and POD not in snap.held
    run(body())


def test_a_unit_removed_while_it_is_written_is_not_cached_again(fake_systemd):
    from memqos_systemd.reconcile import Change

    fake_systemd.add_unit(POD)

    async def body():
        async with client(fake_systemd) as sd:
            observer, applier, handlers = _like_the_daemon(sd)
            await sd.subscribe(**handlers)
            snap = await observer.read([POD])
            fake_systemd.delay_next("SetUnitProperties", 0.5)
            writing = asyncio.ensure_future(applier.apply([Change(POD, "pod", {"MemoryLow": 64 * MiB}, "grow")], snap))
            await asyncio.sleep(0.2)
            fake_systemd.remove_unit(POD)  # gone while the write is out
            result = await writing
            observer.learn(result)  # what the round does with the writer's records
            assert POD not in observer.held, observer.held
            assert result.ok
    run(body())


def test_a_light_refresh_lists_and_reads_only_the_upper_units_by_name(fake_systemd):
    """The resync timer's refresh: one ListUnitsByPatterns naming the node, QoS and reserved
    slices and the `extra` names, one GetAll per one of them in memory, and no pod or container
    unit listed or read. An upper unit gone leaves the cache; the pod and container units keep
    what is cached, an UNREAD pod slice its run too: only their signals, or a full re-read,
    change them."""
    from fakesystemd import unit_path

    from memqos_systemd.naming import Naming
    from memqos_systemd.observe import Observer
    from memqos_systemd.reconcile import UNREAD

    for unit in ("kubepods.slice", "kubepods-burstable.slice", "kube.slice", POD, SCOPE):
        fake_systemd.add_unit(unit)
    upper = ["kubepods-besteffort.slice", "kubepods-burstable.slice", "kubepods.slice", "system.slice"]

    async def body():
        async with client(fake_systemd) as sd:
            observer = Observer(sd, Naming("/", ("/system.slice",)))  # not subscribed: no signal reaches it
            await observer.refresh_all(["kube.slice"])
            observer.assume_started(EARLY, b"\x01" * 16)
            fake_systemd.remove_unit("kubepods-burstable.slice")
            fake_systemd.remove_unit(SCOPE)
            fake_systemd.clear_calls()
            await observer.refresh_all(["kube.slice"], levels={"node", "qos", "reserved"})
            listed, *reads = fake_systemd.calls
            assert (listed.method, listed.args) == ("ListUnitsByPatterns", [[], sorted([*upper, "kube.slice"])])
            assert sorted((c.method, c.path) for c in reads) == [("GetAll", unit_path("kube.slice")),
                                                                  ("GetAll", unit_path("kubepods.slice"))]
            assert set(observer.held) == {"kubepods.slice", "kube.slice", POD, SCOPE, EARLY}
            assert observer.held[EARLY] is UNREAD and observer.runs == {EARLY: b"\x01" * 16}
            fake_systemd.clear_calls()
            with pytest.raises(ValueError, match="can be read by name"):
                await observer.refresh_all(levels={"node", "pod"})
            assert fake_systemd.calls == []
            await observer.refresh_all()  # the full re-read lists every unit of ours
            assert set(observer.held) == {"kubepods.slice", POD} and observer.runs == {}
    run(body())


# ---- writes through the invocation path: one run of a unit, never a new one --------------------

def test_a_unit_collected_after_its_check_is_not_created_again_by_the_write(fake_systemd):
    """The window limit 1 of docs/RELIABILITY.md was about (e2e 85-churn): the state and the
    invocation ID were read, then the pod was deleted and collected before the write arrived.
    By name, that write made a stray slice and a control drop-in; by invocation path it fails."""
    fake_systemd.add_unit(POD)

    async def body():
        async with client(fake_systemd) as sd:
            status = (await sd.unit_states([POD]))[POD]
            await sd.set_memory_if_loaded(POD, {"MemoryLow": 64 * MiB}, status=status)  # reads the ID
            fake_systemd.remove_unit(POD)  # not subscribed: the daemon has not heard of it
            with pytest.raises(NoSuchUnit) as caught:
                await sd.set_memory_if_loaded(POD, {"MemoryLow": 32 * MiB}, status=status)
            return caught.value
    err = run(body())
    assert "that run of the unit has ended" in str(err) and POD in str(err)
    assert fake_systemd.unit(POD) is None and fake_systemd.created == []
    assert not fake_systemd.calls_to("SetUnitProperties")  # never by name


def test_a_unit_started_again_is_written_through_its_new_invocation_path(fake_systemd):
    fake_systemd.add_unit(POD)

    async def body():
        async with client(fake_systemd) as sd:
            heard = asyncio.Event()
            await sd.subscribe(on_job_removed=lambda unit, result: heard.set())
            status = (await sd.unit_states([POD]))[POD]
            await sd.set_memory_if_loaded(POD, {"MemoryLow": 64 * MiB}, status=status)
            old = fake_systemd.unit(POD).invocation_path
            fake_systemd.set_active_state(POD, "inactive")
            fake_systemd.set_active_state(POD, "active")  # a new run, a new ID
            fake_systemd.emit_job_removed(POD, "done")
            await asyncio.wait_for(heard.wait(), 2)
            status = (await sd.unit_states([POD]))[POD]
            await sd.set_memory_if_loaded(POD, {"MemoryLow": 32 * MiB}, status=status)
            return old
    old = run(body())
    new = fake_systemd.unit(POD).invocation_path
    assert new != old
    assert [c.path for c in fake_systemd.calls_to("SetProperties")] == [old, new]
    assert fake_systemd.unit(POD).memory["MemoryLow"] == 32 * MiB


def test_a_stale_invocation_path_is_dropped_after_it_fails(fake_systemd):
    """No signal told us (not subscribed): the write fails once, the next one reads the ID again."""
    fake_systemd.add_unit(POD)

    async def body():
        async with client(fake_systemd) as sd:
            status = (await sd.unit_states([POD]))[POD]
            await sd.set_memory_if_loaded(POD, {"MemoryLow": 64 * MiB}, status=status)
            fake_systemd.set_active_state(POD, "inactive")
            fake_systemd.set_active_state(POD, "active")
            with pytest.raises(NoSuchUnit):
                await sd.set_memory_if_loaded(POD, {"MemoryLow": 32 * MiB}, status=status)
            fake_systemd.clear_calls()
            await sd.set_memory_if_loaded(POD, {"MemoryLow": 16 * MiB}, status=status)
            assert [c.method for c in fake_systemd.calls] == ["Get", "SetProperties"]
    run(body())
    assert fake_systemd.unit(POD).memory["MemoryLow"] == 16 * MiB


@pytest.mark.parametrize("invocation_id, path", [
    (bytes.fromhex("0123456789abcdef0123456789abcdef"), "/org/freedesktop/systemd1/unit/_30123456789abcdef0123456789abcdef"),
    (bytes.fromhex("f123456789abcdef0123456789abcdef"), "/org/freedesktop/systemd1/unit/f123456789abcdef0123456789abcdef"),
])
def test_invocation_path_escapes_a_leading_digit_as_systemd_does(invocation_id, path):
    from memqos_systemd.systemd import invocation_path

    assert invocation_path(invocation_id) == path


@pytest.mark.parametrize("bad", [b"", b"\x00" * 15, "0123456789abcdef0123456789abcdef", None])
def test_invocation_path_refuses_what_is_not_16_bytes(bad):
    from memqos_systemd.systemd import invocation_path

    with pytest.raises(ValueError, match="16 bytes"):
        invocation_path(bad)


def test_writes_to_sibling_pod_slices_are_in_flight_together_and_their_parent_goes_first(fake_systemd):
    """A burst of new pods: the QoS slice's write is answered before any pod slice's is sent, and
    the twelve pod slices' writes (each its invocation ID read, then the write) go out together,
    not one round trip after another."""
    from fakesystemd import unit_path
    from memqos_systemd.reconcile import Change

    qos = "kubepods-burstable.slice"
    pods = [f"kubepods-burstable-pod{i:08x}_0000_4000_8000_000000000000.slice" for i in range(12)]
    fake_systemd.add_unit(qos)
    for name in pods:
        fake_systemd.add_unit(name)

    async def body():
        async with client(fake_systemd) as sd:
            observer, applier, _ = _like_the_daemon(sd)
            snap = await observer.read([qos, *pods])
            fake_systemd.set_latency(0.02)  # one call at a time, as PID 1 answers
            fake_systemd.clear_calls()
            changes = [Change(qos, "qos", {"MemoryLow": 12 * 64 * MiB}, "grow")]
            changes += [Change(name, "pod", {"MemoryLow": 64 * MiB}, "grow") for name in pods]
            result = await applier.apply(changes, snap)
            assert result.ok and len(result.applied) == 13
    run(body())
    calls = [c for c in fake_systemd.calls if c.method in ("Get", "SetProperties")]
    writes = [fake_systemd.write_of(c)[0] for c in calls if c.method == "SetProperties"]
    assert writes[0] == qos and sorted(writes[1:]) == sorted(pods)
    # Every pod slice's invocation ID was asked for before the first pod slice was written.
    first_pod_write = next(i for i, c in enumerate(calls) if c.method == "SetProperties"
                           and fake_systemd.write_of(c)[0] != qos)
    pod_reads = [i for i, c in enumerate(calls) if c.method == "Get" and c.path != unit_path(qos)]
    assert len(pod_reads) == 12 and max(pod_reads) < first_pod_write, [c.method for c in calls]
    for name in pods:
        assert fake_systemd.unit(name).memory["MemoryLow"] == 64 * MiB


# ---- a bounded signal queue ----------------------------------------------------------------------

def test_unit_signals_past_the_bound_are_dropped_and_one_overflow_follows(fake_systemd, monkeypatch):
    """Limit 3 of docs/RELIABILITY.md, closed: while the handlers are behind, at most
    MAX_QUEUED_SIGNALS unit signals wait; the rest are dropped (still counted, so a state read
    earlier is not trusted), and on_overflow runs once when the queue has drained. Reloading is
    never dropped."""
    import time

    import memqos_systemd.systemd_signals as signals_module

    monkeypatch.setattr(signals_module, "MAX_QUEUED_SIGNALS", 5)
    names = [f"kubepods-besteffort-pod{i:08x}_0000_4000_8000_000000000000.slice" for i in range(20)]

    async def body():
        async with client(fake_systemd) as sd:
            got: list[tuple] = []
            await sd.subscribe(on_unit_new=lambda n: got.append(("new", n)),
                               on_reloading=lambda a: got.append(("reloading", a)),
                               on_overflow=lambda: got.append(("overflow",)))
            seen = sd.signal_count
            for name in names:
                fake_systemd.add_unit(name)
            fake_systemd.emit_reloading(True)
            time.sleep(0.5)  # the loop is held: everything arrives at once when it runs again
            await asyncio.sleep(0.5)
            return got, sd.signal_count - seen, sd.signals.overflows, sd.signals.queued_signals
    got, counted, overflows, left = run(body())
    assert [g for g in got if g[0] == "new"] == [("new", n) for n in names[:5]]
    assert ("reloading", True) in got
    assert got[-1] == ("overflow",) and got.count(("overflow",)) == 1 and overflows == 1
    assert counted == 20  # every UnitNew counted, delivered or not
    assert left == 0
