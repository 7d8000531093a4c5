#!/usr/bin/python3
"""Create pod slices in a burst, like the kubelet's pod workers on a busy node: every
StartTransientUnit is sent on one connection before the first reply is awaited.

    burst.py NAMES_FILE     (one slice name a line)

Connects, prints "ready", waits for a line on stdin, sends, prints {"sent_s":..,"replied_s":..}.
"""
import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mqbench import Bus  # noqa: E402


async def main(path):
    names = [n.strip() for n in open(path) if n.strip()]
    bus = await Bus().connect()
    print("ready", flush=True)
    sys.stdin.readline()
    t0 = time.monotonic()
    await bus.start_slices(names)
    print(json.dumps({"replied_s": time.monotonic() - t0, "n": len(names)}), flush=True)


asyncio.run(main(sys.argv[1]))
