"""One TCP end written as text, the one way the project writes it:
"10.0.0.1:4242", or "[fd00::1]:4242" for IPv6."""

from __future__ import annotations

import ipaddress
import re

from gpucr_hpc.errors import GpucrError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

_END = re.compile(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([0-9.]+):(\d+)")


def parse(text: str) -> tuple[Address, int]:
    """The address and port of an end; anything else (a name, a bare IPv6 address,
    a port out of range) is refused."""
    m = _END.fullmatch(text) if isinstance(text, str) else None
    try:
        if not m:
            raise ValueError
        addr = ipaddress.ip_address(m.group(1) or m.group(3))
        port = int(m.group(2) or m.group(4))
        if not 0 <= port < 65536 or (m.group(1) and addr.version != 6):
            raise ValueError
    except ValueError:
        raise GpucrError(f"bad connection end {text!r}", "write it as 10.0.0.1:4242 or [fd00::1]:4242") from None
    return addr, port


def text(addr: str | Address, port: int) -> str:
    a = ipaddress.ip_address(addr)
    return f"[{a}]:{port}" if a.version == 6 else f"{a}:{port}"
