"""``bench.wan``'s link: two TUN devices and a forwarder that holds packets (run by the bench
as ``python -m bench.wan forward``, in the root namespace)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import struct
import sys

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000


def open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def is_syn(packet: bytes) -> bool:
    """An IPv4 TCP segment with SYN and without ACK: a new connection's first packet."""
    if len(packet) < 20 or packet[0] >> 4 != 4 or packet[9] != 6:
        return False
    offset = (packet[0] & 0x0F) * 4 + 13
    return len(packet) > offset and packet[offset] & 0x12 == 0x02


def forward(names: tuple[str, str], delay: float) -> None:
    """The link: A's packets reach B `delay` seconds later and back; "count" on stdin prints
    the counters as one JSON line."""
    fds = (open_tun(names[0]), open_tun(names[1]))
    counters = {"syn_ab": 0, "syn_ba": 0, "packets_ab": 0, "packets_ba": 0}
    loop = asyncio.new_event_loop()

    def write(fd: int, packet: bytes) -> None:
        with contextlib.suppress(OSError):  # the namespace went away: the run is over
            os.write(fd, packet)

    def readable(index: int) -> None:
        src, dst = fds[index], fds[1 - index]
        way = "ab" if index == 0 else "ba"
        while True:
            try:
                packet = os.read(src, 65536)
            except BlockingIOError:
                return
            except OSError:
                return
            counters[f"packets_{way}"] += 1
            if is_syn(packet):
                counters[f"syn_{way}"] += 1
            loop.call_at(loop.time() + delay, write, dst, packet)

    def command() -> None:
        line = sys.stdin.readline()
        if not line:
            loop.stop()
            return
        print(json.dumps(counters), flush=True)

    loop.add_reader(fds[0], readable, 0)
    loop.add_reader(fds[1], readable, 1)
    loop.add_reader(sys.stdin.fileno(), command)
    loop.add_signal_handler(signal.SIGTERM, loop.stop)
    print("ready", flush=True)
    loop.run_forever()
