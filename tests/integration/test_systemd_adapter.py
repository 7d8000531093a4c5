"""memqos_systemd.systemd against a real dbus-daemon and the recording systemd stand-in.

Each test gets its own dbus-daemon and FakeSystemd (fixtures in tests/conftest.py) and runs
its client side in `asyncio.run`, bounded so that a hang fails the test instead of the run.
"""

import asyncio
import contextlib

import pytest

from memqos_systemd.systemd import (
    MEMORY_PROPERTIES, UINT64_MAX, AccessDenied, BusClosed, CallTimeout, NoSuchUnit, Systemd, SystemdError,
    describe_call,
)

GiB = 1 << 30
MiB = 1 << 20
POD = "kubepods-burstable-pod0f3c2a1e_7b5d_4c9a_8e21_6d4f0a9b3c17.slice"
SCOPE = "cri-containerd-" + "ab" * 32 + ".scope"
MANAGER = "org.freedesktop.systemd1.Manager"
PROPERTIES = "org.freedesktop.DBus.Properties"


def run(coro, timeout: float = 5.0):
    """Run the client side of a test; no test may hang."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


@contextlib.asynccontextmanager
async def client(fake, call_timeout: float = 2.0):
    sd = await Systemd.connect(fake.address, call_timeout=call_timeout)
    try:
        yield sd
    finally:
        await sd.close()


def sent_properties(call) -> list:
    """(name, D-Bus type, value) of each element of SetUnitProperties' a(sv)."""
    return [(name, variant.signature, variant.value) for name, variant in call.args[2]]


def assert_one_line_for_people(err: Exception) -> None:
    text = str(err)
    assert text and "\n" not in text
    assert "org.freedesktop" not in text and "dbus_next" not in text


# ---- writing ------------------------------------------------------------------------------

@pytest.mark.integration
def test_set_memory_sends_exact_arguments_as_uint64(fake_systemd):
    fake_systemd.add_unit("kubepods.slice")

    async def body():
        async with client(fake_systemd) as sd:
            # Given in another order: sent in MEMORY_PROPERTIES order, every value as `t`.
            await sd.set_memory("kubepods.slice", {"MemoryHigh": UINT64_MAX, "MemoryLow": 0, "MemoryMin": GiB})
    run(body())

    [call] = fake_systemd.calls
    assert (call.method, call.interface, call.path) == ("SetUnitProperties", MANAGER, "/org/freedesktop/systemd1")
    assert call.signature == "sba(sv)"
    assert call.args[:2] == ["kubepods.slice", True]
    assert sent_properties(call) == [("MemoryMin", "t", GiB), ("MemoryLow", "t", 0), ("MemoryHigh", "t", UINT64_MAX)]
    assert fake_systemd.unit("kubepods.slice").dropins == {
        "MemoryMin": (GiB, True), "MemoryLow": (0, True), "MemoryHigh": (UINT64_MAX, True)}


@pytest.mark.integration
def test_set_memory_sends_only_the_given_properties_and_runtime_false(fake_systemd):
    fake_systemd.add_unit("kubepods-burstable.slice")

    async def body():
        async with client(fake_systemd) as sd:
            await sd.set_memory("kubepods-burstable.slice", {"MemoryLow": 3 * GiB}, runtime=False)
    run(body())

    [call] = fake_systemd.calls_to("SetUnitProperties")
    assert call.args[:2] == ["kubepods-burstable.slice", False]
    assert sent_properties(call) == [("MemoryLow", "t", 3 * GiB)]


@pytest.mark.integration
def test_values_set_are_read_back(fake_systemd):
    fake_systemd.add_unit(POD)
    fake_systemd.add_unit(SCOPE)

    async def body():
        async with client(fake_systemd) as sd:
            before = await sd.get_memory(POD)
            await sd.set_memory_if_loaded(POD, {"MemoryLow": 256 * MiB, "MemoryHigh": 900 * MiB})
            await sd.set_memory_if_loaded(SCOPE, {"MemoryMin": 64 * MiB})
            return before, await sd.get_memory(POD), await sd.get_memory(SCOPE)
    before, pod, scope = run(body())

    assert before == {"MemoryMin": 0, "MemoryLow": 0, "MemoryHigh": UINT64_MAX}
    assert pod == {"MemoryMin": 0, "MemoryLow": 256 * MiB, "MemoryHigh": 900 * MiB}
    assert scope == {"MemoryMin": 64 * MiB, "MemoryLow": 0, "MemoryHigh": UINT64_MAX}
    # Read through GetUnit, then the unit's own object, on the interface of its type.
    reads = [(c.method, c.args) for c in fake_systemd.calls if c.method in ("GetUnit", "GetAll")]
    assert ("GetAll", ["org.freedesktop.systemd1.Slice"]) in reads
    assert ("GetAll", ["org.freedesktop.systemd1.Scope"]) in reads
    assert {c.path for c in fake_systemd.calls_to("GetAll")} == {
        "/org/freedesktop/systemd1/unit/kubepods_2dburstable_2dpod0f3c2a1e_5f7b5d_5f4c9a_5f8e21_5f6d4f0a9b3c17_2eslice",
        "/org/freedesktop/systemd1/unit/cri_2dcontainerd_2d" + "ab" * 32 + "_2escope",
    }


@pytest.mark.integration
def test_get_memory_and_unit_state_are_none_for_units_not_loaded(fake_systemd):
    fake_systemd.add_unit("kubepods-besteffort.slice", active_state="inactive")
    fake_systemd.add_unit("leftover.scope", load_state="not-found", active_state="inactive")

    async def body():
        async with client(fake_systemd) as sd:
            return (await sd.get_memory(POD), await sd.get_memory("leftover.scope"), await sd.unit_state(POD),
                    await sd.unit_state("leftover.scope"), await sd.unit_state("kubepods-besteffort.slice"))
    assert run(body()) == (None, None, None, None, "inactive")
    # Reading never goes through SetUnitProperties, and loads nothing.
    assert not fake_systemd.calls_to("SetUnitProperties") and fake_systemd.created == []


@pytest.mark.integration
def test_get_memory_of_a_unit_that_vanishes_midway_is_none(fake_systemd):
    fake_systemd.add_unit(POD)
    fake_systemd.fail_next("GetAll", "org.freedesktop.DBus.Error.UnknownObject")

    async def body():
        async with client(fake_systemd) as sd:
            return await sd.get_memory(POD)
    assert run(body()) is None


@pytest.mark.integration
def test_version_and_list_units_by_patterns(fake_systemd):
    for name in ("kubepods.slice", "kubepods-burstable.slice", POD, SCOPE, "system.slice", "ssh.service"):
        fake_systemd.add_unit(name)

    async def body():
        async with client(fake_systemd) as sd:
            return await sd.version(), list(await sd.list_unit_states(["kubepods*.slice", "cri-containerd-*.scope"]))
    version, names = run(body())

    assert version == fake_systemd.version
    assert sorted(names) == sorted(["kubepods.slice", "kubepods-burstable.slice", POD, SCOPE])
    [call] = fake_systemd.calls_to("ListUnitsByPatterns")
    assert call.signature == "asas"
    assert call.args == [[], ["kubepods*.slice", "cri-containerd-*.scope"]]
    [get] = fake_systemd.calls_to("Get")
    assert (get.interface, get.args) == (PROPERTIES, [MANAGER, "Version"])


# ---- units that are not there ---------------------------------------------------------------

@pytest.mark.integration
def test_set_memory_on_a_scope_that_is_not_loaded_raises_no_such_unit(fake_systemd):
    async def body():
        async with client(fake_systemd) as sd:
            with pytest.raises(NoSuchUnit) as caught:
                await sd.set_memory(SCOPE, {"MemoryLow": GiB})
            return caught.value
    err = run(body())
    assert_one_line_for_people(err)
    assert SCOPE in str(err)
    assert fake_systemd.unit(SCOPE) is None


@pytest.mark.integration
def test_set_memory_on_a_slice_that_is_not_loaded_creates_it_as_systemd_does(fake_systemd):
    # This is the hazard set_memory_if_loaded exists for: plain SetUnitProperties
    # brings a gone pod's slice back (inactive, with a drop-in).
    async def body():
        async with client(fake_systemd) as sd:
            await sd.set_memory(POD, {"MemoryLow": GiB})
    run(body())
    assert fake_systemd.created == [POD]
    assert fake_systemd.unit(POD).active_state == "inactive"


@pytest.mark.integration
@pytest.mark.parametrize("situation", ["never there", "removed", "inactive", "not-found"])
def test_set_memory_if_loaded_refuses_a_gone_unit_and_sends_nothing(fake_systemd, situation):
    if situation == "removed":
        fake_systemd.add_unit(POD)
        fake_systemd.remove_unit(POD)
    elif situation == "inactive":
        fake_systemd.add_unit(POD, active_state="inactive")
    elif situation == "not-found":
        fake_systemd.add_unit(POD, load_state="not-found", active_state="inactive")

    async def body():
        async with client(fake_systemd) as sd:
            with pytest.raises(NoSuchUnit) as caught:
                await sd.set_memory_if_loaded(POD, {"MemoryLow": GiB})
            return caught.value
    err = run(body())

    assert_one_line_for_people(err)
    assert fake_systemd.writes == []
    assert fake_systemd.created == []
    assert fake_systemd.calls[0].method == "GetUnit"


@pytest.mark.integration
@pytest.mark.parametrize("error_name, expected", [
    ("org.freedesktop.systemd1.NoSuchUnit", NoSuchUnit),
    ("org.freedesktop.systemd1.LoadFailed", NoSuchUnit),
    ("org.freedesktop.DBus.Error.AccessDenied", AccessDenied),
    ("org.freedesktop.DBus.Error.InteractiveAuthorizationRequired", AccessDenied),
    ("org.freedesktop.DBus.Error.NoReply", CallTimeout),
    ("org.freedesktop.DBus.Error.ServiceUnknown", BusClosed),
    ("org.freedesktop.systemd1.UnitMasked", SystemdError),
    ("org.freedesktop.DBus.Error.InvalidArgs", SystemdError),
])
def test_dbus_errors_are_mapped_to_our_types(fake_systemd, error_name, expected):
    fake_systemd.add_unit("kubepods.slice")
    fake_systemd.fail_next("SetUnitProperties", error_name, "line one\nline two")

    async def body():
        async with client(fake_systemd) as sd:
            with pytest.raises(SystemdError) as caught:
                await sd.set_memory("kubepods.slice", {"MemoryMin": GiB})
            # The connection stays usable after an error.
            await sd.set_memory("kubepods.slice", {"MemoryMin": 2 * GiB})
            return caught.value
    err = run(body())

    assert type(err) is expected
    assert_one_line_for_people(err)
    assert "kubepods.slice" in str(err)
    assert fake_systemd.unit("kubepods.slice").memory["MemoryMin"] == 2 * GiB


@pytest.mark.integration
@pytest.mark.parametrize("load_state, expected", [
    ("not-found", NoSuchUnit),
    ("masked", SystemdError),
    ("bad-setting", SystemdError),
])
def test_set_memory_on_a_unit_that_failed_to_load(fake_systemd, load_state, expected):
    fake_systemd.add_unit("kubepods.slice", load_state=load_state, active_state="inactive")

    async def body():
        async with client(fake_systemd) as sd:
            with pytest.raises(SystemdError) as caught:
                await sd.set_memory("kubepods.slice", {"MemoryMin": GiB})
            return caught.value
    err = run(body())
    assert type(err) is expected
    assert_one_line_for_people(err)


# ---- validation happens before anything is sent --------------------------------------------

@pytest.mark.integration
@pytest.mark.parametrize("unit, props", [
    ("kubepods.slice", {}),
    ("kubepods.slice", {"MemoryMax": 0}),  # (MemoryMax is ours on the BestEffort slice: the ceiling)
    ("kubepods.slice", {"MemorySwapMax": GiB}),  # carried beside ours, never alone
    ("kubepods.slice", {"CPUWeight": 100}),
    ("kubepods.slice", {"memorylow": GiB}),
    ("kubepods.slice", {"MemoryLow": -1}),
    ("kubepods.slice", {"MemoryLow": 2**64}),
    ("kubepods.slice", {"MemoryLow": 1.5}),
    ("kubepods.slice", {"MemoryLow": "1Gi"}),
    ("kubepods.slice", {"MemoryLow": True}),
    ("kubepods.slice", {"MemoryLow": None}),
    ("kubepods.slice", {"MemoryHigh": 0}),
    ("kubepods.slice", [("MemoryLow", GiB)]),
    ("", {"MemoryLow": GiB}),
    ("kubelet.service", {"MemoryLow": GiB}),
    ("kube pods.slice", {"MemoryLow": GiB}),
    (None, {"MemoryLow": GiB}),
])
def test_invalid_requests_raise_value_error_before_anything_is_sent(fake_systemd, unit, props):
    fake_systemd.add_unit("kubepods.slice")

    async def body():
        async with client(fake_systemd) as sd:
            with pytest.raises(ValueError):
                await sd.set_memory(unit, props)
            with pytest.raises(ValueError):
                await sd.set_memory_if_loaded(unit, props)
    run(body())
    with pytest.raises(ValueError):
        describe_call(unit, props)
    assert fake_systemd.calls == []


@pytest.mark.integration
def test_boundary_values_are_accepted(fake_systemd):
    fake_systemd.add_unit("kubepods.slice")

    async def body():
        async with client(fake_systemd) as sd:
            await sd.set_memory("kubepods.slice", {"MemoryMin": 0, "MemoryLow": UINT64_MAX, "MemoryHigh": 1})
            return await sd.get_memory("kubepods.slice")
    assert run(body()) == {"MemoryMin": 0, "MemoryLow": UINT64_MAX, "MemoryHigh": 1}


def test_describe_call_is_one_human_line():
    assert describe_call("kubepods.slice", {"MemoryHigh": UINT64_MAX, "MemoryLow": 0, "MemoryMin": GiB}) == (
        "SetUnitProperties kubepods.slice runtime=true MemoryMin=1073741824 MemoryLow=0 MemoryHigh=infinity")
    assert describe_call(POD, {"MemoryLow": 5}, runtime=False) == f"SetUnitProperties {POD} runtime=false MemoryLow=5"
    assert describe_call(POD, {"MemoryLow": 5}, running_only=True) == f"SetProperties {POD} runtime=true MemoryLow=5"
    assert MEMORY_PROPERTIES == ("MemoryMin", "MemoryLow", "MemoryHigh")


# ---- a systemd that does not answer ---------------------------------------------------------

@pytest.mark.integration
def test_a_delayed_call_raises_call_timeout_and_the_connection_stays_usable(fake_systemd):
    fake_systemd.add_unit("kubepods.slice")
    fake_systemd.delay_next("SetUnitProperties", 30)

    async def body():
        async with client(fake_systemd, call_timeout=0.2) as sd:
            with pytest.raises(CallTimeout) as caught:
                await sd.set_memory("kubepods.slice", {"MemoryMin": GiB})
            assert sd.connected
            return caught.value, await sd.get_memory("kubepods.slice")
    err, memory = run(body(), timeout=3)

    assert_one_line_for_people(err)
    assert "kubepods.slice" in str(err)
    # The delayed call was sent and is still pending in the stand-in: nothing applied yet.
    assert len(fake_systemd.calls_to("SetUnitProperties")) == 1
    assert memory["MemoryMin"] == 0


@pytest.mark.integration
def test_a_late_reply_after_a_timeout_is_ignored(fake_systemd):
    fake_systemd.add_unit("kubepods.slice")
    fake_systemd.delay_next("ListUnitsByPatterns", 0.3)

    async def body():
        async with client(fake_systemd, call_timeout=0.1) as sd:
            with pytest.raises(CallTimeout):
                await sd.get_memory("kubepods.slice")
            await asyncio.sleep(0.4)  # the late reply arrives in here
            return await sd.unit_state("kubepods.slice")
    assert run(body()) == "active"


# ---- signals --------------------------------------------------------------------------------

@pytest.mark.integration
def test_signals_are_delivered_in_order_after_subscribe(fake_systemd):
    fake_systemd.add_unit("kubepods.slice")  # before Subscribe: nobody hears about it

    async def body():
        seen = []
        done = asyncio.Event()

        async def unit_removed(name):  # async and sync handlers both work
            await asyncio.sleep(0)
            seen.append(("removed", name))

        def reloading(active):
            seen.append(("reloading", active))
            if active is False:
                done.set()

        async with client(fake_systemd) as sd:
            await sd.subscribe(on_unit_new=lambda name: seen.append(("new", name)), on_unit_removed=unit_removed,
                               on_job_removed=lambda unit, result: seen.append(("job", unit, result)),
                               on_reloading=reloading)
            fake_systemd.add_unit(POD)
            fake_systemd.emit_job_removed(POD, "done")
            fake_systemd.remove_unit(POD)
            fake_systemd.emit_reloading(True)
            fake_systemd.emit_reloading(False)
            await asyncio.wait_for(done.wait(), 2)
        return seen
    assert run(body()) == [("new", POD), ("job", POD, "done"), ("removed", POD),
                           ("reloading", True), ("reloading", False)]
    [subscribe] = fake_systemd.calls_to("Subscribe")
    assert (subscribe.interface, subscribe.args) == (MANAGER, [])


@pytest.mark.integration
def test_a_failing_handler_does_not_stop_delivery(fake_systemd):
    async def body():
        seen = []
        done = asyncio.Event()

        def unit_new(name):
            if name == "a.slice":
                raise RuntimeError("handler bug")
            seen.append(name)
            done.set()

        async with client(fake_systemd) as sd:
            await sd.subscribe(on_unit_new=unit_new)
            fake_systemd.add_unit("a.slice")
            fake_systemd.add_unit("b.slice")
            await asyncio.wait_for(done.wait(), 2)
        return seen
    assert run(body()) == ["b.slice"]


@pytest.mark.integration
def test_signals_from_anyone_but_systemd_are_ignored(fake_systemd):
    async def body():
        seen = []
        done = asyncio.Event()

        def unit_removed(name):
            seen.append(name)
            done.set()

        async with client(fake_systemd) as sd:
            await sd.subscribe(on_unit_removed=unit_removed)
            # Any client on a bus may send a signal straight to us; only systemd's count.
            fake_systemd.spoof_signal(sd._bus.unique_name, "UnitRemoved", "so", ["kubepods.slice", "/x"])
            fake_systemd.add_unit("real.slice")
            fake_systemd.remove_unit("real.slice")
            await asyncio.wait_for(done.wait(), 2)
        return seen
    assert run(body()) == ["real.slice"]


@pytest.mark.integration
def test_subscribe_again_replaces_handlers_without_a_second_subscribe_error(fake_systemd):
    async def body():
        first, second = [], []
        done = asyncio.Event()
        async with client(fake_systemd) as sd:
            await sd.subscribe(on_unit_new=first.append)
            await sd.subscribe(on_unit_new=lambda name: (second.append(name), done.set()))
            fake_systemd.add_unit("a.slice")
            await asyncio.wait_for(done.wait(), 2)
        return first, second
    assert run(body()) == ([], ["a.slice"])


@pytest.mark.integration
def test_resubscribes_when_systemd_comes_back_on_the_bus(fake_systemd):
    async def body():
        seen = []
        done = asyncio.Event()
        returned = asyncio.Event()
        async with client(fake_systemd) as sd:
            await sd.subscribe(on_unit_new=lambda name: (seen.append(name), done.set()),
                               on_returned=returned.set)
            fake_systemd.disconnect()
            with pytest.raises(BusClosed):  # systemd is not on the bus: a restart is under way
                await sd.version()
            fake_systemd.reconnect()
            for _ in range(100):
                if fake_systemd.subscribers:
                    break
                await asyncio.sleep(0.02)
            await asyncio.wait_for(returned.wait(), 2)  # the owner of the daemon is told to re-read
            fake_systemd.add_unit("after.slice")
            await asyncio.wait_for(done.wait(), 2)
            assert sd.connected
        return seen
    assert run(body()) == ["after.slice"]
    assert len(fake_systemd.calls_to("Subscribe")) == 2


# ---- losing the bus -------------------------------------------------------------------------

@pytest.mark.integration
def test_on_disconnect_fires_once_when_the_dbus_daemon_is_killed(fake_systemd):
    async def body():
        fired = []
        gone = asyncio.Event()

        async def async_callback():
            fired.append("async")
            gone.set()

        async with client(fake_systemd) as sd:
            sd.on_disconnect(lambda: fired.append("sync"))
            sd.on_disconnect(async_callback)
            assert sd.connected
            fake_systemd.kill_bus()
            await asyncio.wait_for(gone.wait(), 2)
            assert not sd.connected
            with pytest.raises(BusClosed) as caught:
                await sd.set_memory("kubepods.slice", {"MemoryMin": GiB})
            assert_one_line_for_people(caught.value)
        return fired
    assert run(body()) == ["sync", "async"]


@pytest.mark.integration
def test_close_from_inside_callbacks_and_handlers(fake_systemd):
    # What the daemon does: on a lost bus, close this connection and make a new one.
    async def body():
        closed = asyncio.Event()
        first = await Systemd.connect(fake_systemd.address)

        async def on_unit_new(name):
            await first.close()
            closed.set()

        await first.subscribe(on_unit_new=on_unit_new)
        fake_systemd.add_unit("a.slice")
        await asyncio.wait_for(closed.wait(), 2)
        assert not first.connected

        second = await Systemd.connect(fake_systemd.address)
        reconnected = asyncio.Event()

        async def on_disconnect():
            await second.close()
            reconnected.set()

        second.on_disconnect(on_disconnect)
        fake_systemd.kill_bus()
        await asyncio.wait_for(reconnected.wait(), 2)
        assert not second.connected
    run(body())


@pytest.mark.integration
def test_a_call_in_flight_when_the_bus_dies_raises_bus_closed(fake_systemd):
    fake_systemd.add_unit("kubepods.slice")
    fake_systemd.delay_next("ListUnitsByPatterns", 30)

    async def body():
        async with client(fake_systemd, call_timeout=3) as sd:
            pending = asyncio.ensure_future(sd.get_memory("kubepods.slice"))
            while not fake_systemd.calls_to("ListUnitsByPatterns"):
                await asyncio.sleep(0.01)
            fake_systemd.kill_bus()
            with pytest.raises(BusClosed):
                await pending
    run(body())


@pytest.mark.integration
def test_a_new_connection_works_after_the_bus_restarts(fake_systemd):
    fake_systemd.add_unit("kubepods.slice")

    async def body():
        async with client(fake_systemd) as sd:
            fake_systemd.kill_bus()
            fake_systemd.restart_bus()
            with pytest.raises(BusClosed):
                await sd.version()
        async with client(fake_systemd) as sd:  # what the daemon does: close, connect again
            await sd.set_memory("kubepods.slice", {"MemoryMin": GiB})
            return await sd.get_memory("kubepods.slice")
    assert run(body())["MemoryMin"] == GiB


@pytest.mark.integration
def test_close_does_not_fire_on_disconnect_and_can_be_repeated(fake_systemd):
    async def body():
        fired = []
        sd = await Systemd.connect(fake_systemd.address)
        sd.on_disconnect(lambda: fired.append("lost"))
        await sd.close()
        await sd.close()
        assert not sd.connected
        with pytest.raises(BusClosed):
            await sd.version()
        await asyncio.sleep(0.05)
        return fired
    assert run(body()) == []


@pytest.mark.integration
def test_connecting_to_a_bus_that_is_not_there_raises_bus_closed(dbus_daemon):
    dbus_daemon.kill()

    async def body():
        with pytest.raises(BusClosed) as caught:
            await Systemd.connect(dbus_daemon.address, call_timeout=1)
        return caught.value
    assert_one_line_for_people(run(body()))
