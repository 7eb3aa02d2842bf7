"""TCP connections in a CRIU image, and their addresses moved to another node.

CRIU (4.2 or newer on Linux 6.16+) dumps an established connection with its
queues (`--tcp-established`) and restores it bound to the addresses it had. A
rank restored on another node has another address: before the restore, every
socket of the image that used the old node's address is given the new one
(crit's decoder, pycriu, shipped with CRIU by scripts/install-deps). The peer's
image gets the same change for its remote end, so both ends agree again.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from gpucr_hpc import config
from gpucr_hpc.errors import GpucrError

FILES_IMAGE = "files.img"
INSTALL_FIX = "run scripts/install-deps (as root): it installs CRIU 4.2 with its Python module"


@dataclass(frozen=True)
class Connection:
    """One TCP socket of an image: its ends as the image records them."""

    local: str   # "addr:port"
    remote: str  # "addr:port"; "0.0.0.0:0" (or "[::]:0") for a listening socket
    state: str   # as CRIU names it: ESTABLISHED, LISTEN, ...

    @property
    def listening(self) -> bool:
        return self.state == "LISTEN"


def _pycriu():
    """crit's image module: with the installed CRIU, else wherever Python finds it."""
    prefix = config.value("GPUCR_PREFIX") or "/opt/gpucr-hpc"
    here = os.path.join(prefix, "criu", "root", "usr", "lib", "python3", "dist-packages")
    if os.path.isdir(here) and here not in sys.path:
        sys.path.append(here)
    try:
        from pycriu import images
    except ImportError as e:
        raise GpucrError(f"CRIU's Python module (pycriu) cannot be loaded: {e}", INSTALL_FIX) from e
    return images


def _load(image_dir: Path) -> dict:
    images = _pycriu()
    try:
        with open(Path(image_dir) / FILES_IMAGE, "rb") as f:
            return images.load(f, pretty=True)  # addresses as text, enums by name
    except OSError as e:
        raise GpucrError(f"cannot read {Path(image_dir) / FILES_IMAGE}: {e.strerror}",
                         "restore from an intact copy of the image") from e


def _tcp_entries(img: dict) -> list[dict]:
    return [e["isk"] for e in img.get("entries", [])
            if e.get("type") == "INETSK" and e.get("isk", {}).get("proto") == "TCP"]


def _end(addrs: list[str], port: int, family: str) -> str:
    ip = ipaddress.ip_address(addrs[0]) if addrs else (
        ipaddress.IPv6Address(0) if family == "INET6" else ipaddress.IPv4Address(0))
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def connections(image_dir: Path) -> list[Connection]:
    """The TCP sockets of an image (those CRIU dumped: established and listening)."""
    return [Connection(_end(s.get("src_addr", []), s.get("src_port", 0), s.get("family", "INET")),
                       _end(s.get("dst_addr", []), s.get("dst_port", 0), s.get("family", "INET")),
                       str(s.get("state", "")))
            for s in _tcp_entries(_load(image_dir))]


def move_addresses(image_dir: Path, moved: dict[str, str]) -> int:
    """Give every TCP end of the image at an old address (a key of `moved`) the new one.

    Both the local end (this rank moved) and the remote end (its peer moved) are
    rewritten; ports stay. Returns how many ends changed. The file is replaced
    whole (written beside it, then renamed), so a failure leaves it as it was."""
    images = _pycriu()
    img = _load(image_dir)
    norm = {str(ipaddress.ip_address(a)): str(ipaddress.ip_address(b)) for a, b in moved.items()}
    changed = 0
    for s in _tcp_entries(img):
        for key in ("src_addr", "dst_addr"):
            addrs = s.get(key) or []
            if addrs and str(ipaddress.ip_address(addrs[0])) in norm:
                s[key] = [norm[str(ipaddress.ip_address(addrs[0]))]]
                changed += 1
    if changed:
        path = Path(image_dir) / FILES_IMAGE
        tmp = path.with_suffix(".img.tmp")
        with open(tmp, "wb") as f:
            images.dump(img, f)
        os.replace(tmp, path)
    return changed
