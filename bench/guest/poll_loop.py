#!/usr/bin/python3
"""A koordlet-style poll loop: every INTERVAL seconds, list the units matching PATTERN and set one
property on each one not seen before (pipelined). Prints "ready"; runs until killed.

    poll_loop.py PATTERN PROPERTY VALUE [INTERVAL]
"""
import asyncio
import sys
import time

from dbus_next import BusType, Message, Variant
from dbus_next.aio import MessageBus

SD, PATH, MGR = "org.freedesktop.systemd1", "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager"


async def main(pattern, prop, value, interval):
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    done = set()
    print("ready", flush=True)
    tick = time.monotonic()
    while True:
        reply = await bus.call(Message(destination=SD, path=PATH, interface=MGR, member="ListUnitsByPatterns",
                                       signature="asas", body=[[], [pattern]]))
        new = [row[0] for row in reply.body[0] if row[0] not in done]
        for i in range(0, len(new), 32):  # dbus-next drops the connection when its send buffer fills
            await asyncio.gather(*(bus.call(Message(
                destination=SD, path=PATH, interface=MGR, member="SetUnitProperties", signature="sba(sv)",
                body=[n, True, [[prop, Variant("t", value)]]])) for n in new[i:i + 32]))
        done.update(new)
        tick += interval
        await asyncio.sleep(max(0.0, tick - time.monotonic()))


asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]) if len(sys.argv) > 4 else 1.0))
