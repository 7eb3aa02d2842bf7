"""One TCP end written as text, the one way the project writes it:
"10.0.0.1:4242", or "[fd00::1]:4242" for IPv6. A dual-stack socket's end on
IPv4 (::ffff:10.0.0.1) is written as IPv4: that is what its packets carry."""

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
    if a.version == 6 and a.ipv4_mapped:
        a = a.ipv4_mapped
    return f"[{a}]:{port}" if a.version == 6 else f"{a}:{port}"


def from_proc(hexaddr: str) -> str:
    """An end as /proc/net/tcp{,6} prints it ("0100007F:1F90")."""
    ip_hex, port_hex = hexaddr.split(":")
    raw = bytes.fromhex(ip_hex)
    ip: Address
    if len(raw) == 4:
        ip = ipaddress.IPv4Address(raw[::-1])
    else:  # /proc prints IPv6 as four little-endian 32-bit words
        ip = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
    return text(ip, int(port_hex, 16))

