#!/usr/bin/python3
"""The safe reaction floor: the least a reactor does that can never re-create a deleted slice.

    safe_floor_subscriber.py PREFIX PROPERTY VALUE

On every JobRemoved (result "done") of a slice whose name starts with PREFIX: read the
invocation ID systemd put on the slice's cgroup (the user.invocation_id attribute) and send
Unit.SetProperties(runtime, [(PROPERTY, VALUE)]) to that run's object path, not awaited before
the next signal is handled (at most 32 in flight). A write there cannot load or create a unit
(tests/e2e 12-invocation-path D), so it must wait for the start job: the run, and its ID, exist
only from then. The plain floor (floor_subscriber.py) writes by name at UnitNew, before the start
job runs, which is what leaked slices under churn. No pod data, no reads over D-Bus. Prints
"ready" once subscribed; runs until killed.
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


async def main(prefix, prop, value):
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    pending = set()
    window = asyncio.Semaphore(32)  # dbus-next drops the connection when its send buffer fills

    async def set_one(unit):
        try:
            hex_id = os.getxattr(slice_dir(unit), "user.invocation_id").decode()
        except OSError:
            return  # not started after all (or gone): nothing to write
        async with window:
            await bus.call(Message(destination=SD, path=run_path(hex_id), interface="org.freedesktop.systemd1.Unit",
                                   member="SetProperties", signature="ba(sv)",
                                   body=[True, [[prop, Variant("t", value)]]]))

    def on_message(msg):
        if (msg.message_type == MessageType.SIGNAL and msg.member == "JobRemoved"
                and msg.body[2].startswith(prefix) and msg.body[3] == "done"):
            t = asyncio.ensure_future(set_one(msg.body[2]))
            pending.add(t)
            t.add_done_callback(pending.discard)

    bus.add_message_handler(on_message)
    await bus.call(Message(destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                           interface="org.freedesktop.DBus", member="AddMatch", signature="s",
                           body=[f"type='signal',sender='{SD}',path='{PATH}',interface='{MGR}',member='JobRemoved'"]))
    await bus.call(Message(destination=SD, path=PATH, interface=MGR, member="Subscribe"))
    print("ready", flush=True)
    await bus.wait_for_disconnect()


asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
