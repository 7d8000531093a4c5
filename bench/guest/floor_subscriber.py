#!/usr/bin/python3
"""The reaction floor: a minimal subscriber that sets one property per UnitNew and nothing else.

    floor_subscriber.py PREFIX PROPERTY VALUE

On every UnitNew of a unit whose name starts with PREFIX: SetUnitProperties(unit, runtime, [(PROPERTY,
VALUE)]), not awaited before the next signal is handled
(at most 32 in flight). No pod data, no reads, no checks. Prints
"ready" once subscribed; runs until killed.
"""
import asyncio
import sys

from dbus_next import BusType, Message, MessageType, Variant
from dbus_next.aio import MessageBus

SD, PATH, MGR = "org.freedesktop.systemd1", "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager"


async def main(prefix, prop, value):
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    pending = set()
    window = asyncio.Semaphore(32)  # dbus-next drops the connection when its send buffer fills

    async def set_one(unit):
        async with window:
            await bus.call(Message(destination=SD, path=PATH, interface=MGR, member="SetUnitProperties",
                                   signature="sba(sv)", body=[unit, True, [[prop, Variant("t", value)]]]))

    def on_message(msg):
        if msg.message_type == MessageType.SIGNAL and msg.member == "UnitNew" and msg.body[0].startswith(prefix):
            t = asyncio.ensure_future(set_one(msg.body[0]))
            pending.add(t)
            t.add_done_callback(pending.discard)

    bus.add_message_handler(on_message)
    await bus.call(Message(destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                           interface="org.freedesktop.DBus", member="AddMatch", signature="s",
                           body=[f"type='signal',sender='{SD}',path='{PATH}',interface='{MGR}',member='UnitNew'"]))
    await bus.call(Message(destination=SD, path=PATH, interface=MGR, member="Subscribe"))
    print("ready", flush=True)
    await bus.wait_for_disconnect()


asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
