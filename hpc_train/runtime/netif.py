"""This host's network interfaces and their IPv4 addresses (Linux), for launch.network_interface."""

from __future__ import annotations

import fcntl
import socket
import struct

_SIOCGIFADDR = 0x8915  # <linux/sockios.h>: get an interface's IPv4 address


def ipv4_addresses() -> list[tuple[str, str]]:
    """(interface, address) for every interface that has an IPv4 address."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
            except OSError:  # no IPv4 address (down, or IPv6 only)
                continue
            found.append((name, socket.inet_ntoa(reply[20:24])))
    return found
