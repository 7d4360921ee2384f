"""Which machine this is, as the farm tells machines apart: not by host name alone.

Two lab machines cloned from one disk share a host name (even /etc/machine-id), and every
first PID namespace has the same inode; they never share the kernel's boot id. Two
containers of one machine share the boot id, never a PID namespace. Loopback addresses
(127.0.0.0/8, ::1, localhost) mean a different place on every machine: a phone at
127.0.0.1:9090 of one host is not the one of another.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import os
import socket


def machine() -> str:
    """This machine as its processes see it: host name (to read), boot id, PID namespace."""
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        ns = 0
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip().replace("-", "")[:12]
    except OSError:
        boot = "noboot"
    return f"{socket.gethostname()}~{boot}~{ns}"


@functools.cache
def short_machine() -> str:
    """A short, readable name of this machine: its host name and 4 hex of `machine()`."""
    return f"{socket.gethostname()}-{hashlib.sha1(machine().encode()).hexdigest()[:4]}"


def is_loopback(address: str) -> bool:
    """Is this address reachable from this machine only (127.0.0.0/8, ::1, localhost)?"""
    address = str(address).strip("[]")
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
