#!/usr/bin/python3
"""The reaction floors: minimal subscribers that set one property per new slice and nothing else.

    floor_subscriber.py [--safe] PREFIX PROPERTY VALUE

Default (the floor): on every UnitNew of a unit whose name starts with PREFIX,
SetUnitProperties(unit, runtime, [(PROPERTY, VALUE)]) by name, as soon as the unit is loaded and
before its start job has run. That is the write that, under churn, re-created deleted slices.

--safe (the safe floor, the least a reactor does that can never re-create a deleted slice): on
every JobRemoved ("done") of such a slice, read the invocation ID systemd put on its cgroup (the
user.invocation_id attribute) and send Unit.SetProperties(runtime, [(PROPERTY, VALUE)]) to that
run's object path; a write there cannot load or create a unit (tests/e2e 12-invocation-path D),
so it must wait for the start job: the run, and its ID, exist only from then.

Writes are not awaited before the next signal is handled (at most 32 in flight). No pod data, no
reads over D-Bus, no checks. Prints "ready" once subscribed; runs until killed.
"""
import asyncio
import os
import sys

from dbus_next import BusType, Message, MessageType, Variant
from dbus_next.aio import MessageBus

SD, PATH, MGR = "org.freedesktop.systemd1", "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager"
CGROUP = "/sys/fs/cgroup"


def slice_dir(name):
    parts = name[: -len(".slice")].split("-")
    return os.path.join(CGROUP, *("-".join(parts[: i + 1]) + ".slice" for i in range(len(parts))))


def run_path(hex_id):
    label = (f"_{ord(hex_id[0]):02x}" + hex_id[1:]) if hex_id[0].isdigit() else hex_id
    return f"{PATH}/unit/{label}"


def write_by_name(unit, prop, value):
    return Message(destination=SD, path=PATH, interface=MGR, member="SetUnitProperties",
                   signature="sba(sv)", body=[unit, True, [[prop, Variant("t", value)]]])


def write_to_run(unit, prop, value):
    try:
        hex_id = os.getxattr(slice_dir(unit), "user.invocation_id").decode()
    except OSError:
        return None  # not started after all (or gone): nothing to write
    return Message(destination=SD, path=run_path(hex_id), interface="org.freedesktop.systemd1.Unit",
                   member="SetProperties", signature="ba(sv)", body=[True, [[prop, Variant("t", value)]]])


async def main(safe, prefix, prop, value):
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    pending = set()
    window = asyncio.Semaphore(32)  # dbus-next drops the connection when its send buffer fills
    member, make = ("JobRemoved", write_to_run) if safe else ("UnitNew", write_by_name)

    async def set_one(unit):
        msg = make(unit, prop, value)
        if msg is not None:
            async with window:
                await bus.call(msg)

    def on_message(msg):
        if msg.message_type != MessageType.SIGNAL or msg.member != member:
            return
        unit = msg.body[2] if safe else msg.body[0]
        if unit.startswith(prefix) and (not safe or msg.body[3] == "done"):
            t = asyncio.ensure_future(set_one(unit))
            pending.add(t)
            t.add_done_callback(pending.discard)

    bus.add_message_handler(on_message)
    await bus.call(Message(destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                           interface="org.freedesktop.DBus", member="AddMatch", signature="s",
                           body=[f"type='signal',sender='{SD}',path='{PATH}',interface='{MGR}',member='{member}'"]))
    await bus.call(Message(destination=SD, path=PATH, interface=MGR, member="Subscribe"))
    print("ready", flush=True)
    await bus.wait_for_disconnect()


args = sys.argv[1:]
safe = args[:1] == ["--safe"]
if safe:
    args = args[1:]
asyncio.run(main(safe, args[0], args[1], int(args[2])))
