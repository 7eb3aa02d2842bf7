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
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from gpucr_hpc import config
from gpucr_hpc.errors import GpucrError
from gpucr_hpc.tcp import end as tcp_end

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
    return tcp_end.text(ip, port)


def connections(image_dir: Path) -> list[Connection]:
    """The TCP sockets of an image (those CRIU dumped: established and listening)."""
    return [Connection(_end(s.get("src_addr", []), s.get("src_port", 0), s.get("family", "INET")),
                       _end(s.get("dst_addr", []), s.get("dst_port", 0), s.get("family", "INET")),
                       str(s.get("state", "")))
            for s in _tcp_entries(_load(image_dir))]


def parse_moves(moved: dict[str, str]) -> tuple[dict[tuple[str, int], str], dict[str, str]]:
    """`moved` as (end (addr, port) -> new address, address -> new address): only
    addresses move, never ports; anything else is refused with one line."""
    by_end, by_addr = {}, {}
    for key, new in moved.items():
        try:
            to = str(ipaddress.ip_address(new.strip("[]")))
            if key.count(":") == 1 or key.startswith("["):
                addr, port = tcp_end.parse(key)
                by_end[(str(addr), port)] = to
            else:
                by_addr[str(ipaddress.ip_address(key))] = to
        except (GpucrError, ValueError):
            raise GpucrError(f"bad move {key}={new}: give an end or an address, and the new address",
                             "e.g. --move 10.0.0.1:4242=10.0.0.2") from None
    return by_end, by_addr


def move_addresses(image_dir: Path, moved: dict[str, str]) -> int:
    """Give the image's TCP ends their new address: `moved` maps an end ("addr:port")
    or a whole address ("addr") to the new address; ports stay.

    Both the local end (this unit moved) and the remote end (its peer moved) are
    rewritten. Returns how many ends changed. The file is replaced whole (written
    beside it, then renamed), so a failure leaves it as it was."""
    by_end, by_addr = parse_moves(moved)
    images = _pycriu()
    img = _load(image_dir)
    changed = 0
    for s in _tcp_entries(img):
        for addr_key, port_key in (("src_addr", "src_port"), ("dst_addr", "dst_port")):
            addrs = s.get(addr_key) or []
            if not addrs:
                continue
            ip = ipaddress.ip_address(addrs[0])
            mapped = ip.version == 6 and ip.ipv4_mapped  # a dual-stack socket on IPv4
            old = str(mapped or ip)
            to = by_end.get((old, int(s.get(port_key, 0)))) or by_addr.get(old)
            if to and to != old:
                s[addr_key] = [f"::ffff:{to}" if mapped else to]
                changed += 1
    if changed:
        _replace(image_dir, images, img)
    return changed


def close_connections(image_dir: Path, closed: list[tuple[str, str]]) -> int:
    """Give back closed the image's connections `closed` names ((local end, remote end),
    as the image records them): CRIU then makes each a fresh TCP socket that is
    neither bound nor connected (as its --tcp-close does for all of them), so the
    program's next read or write on it fails and its client connects again.
    Returns how many changed. The file is replaced whole, as move_addresses does."""
    wanted = set()
    for local, remote in closed:
        try:
            wanted.add((tcp_end.text(*tcp_end.parse(local)), tcp_end.text(*tcp_end.parse(remote))))
        except GpucrError:
            raise GpucrError(f"bad connection to close {local} -> {remote}: give two TCP ends",
                             "e.g. --close 10.0.0.1:40000 10.9.0.1:443") from None
    images = _pycriu()
    img = _load(image_dir)
    changed = 0
    for s in _tcp_entries(img):
        family = s.get("family", "INET")
        ends = (_end(s.get("src_addr", []), s.get("src_port", 0), family),
                _end(s.get("dst_addr", []), s.get("dst_port", 0), family))
        if str(s.get("state", "")) == "LISTEN" or ends not in wanted:
            continue
        nowhere = "::" if family == "INET6" else "0.0.0.0"
        s.update(state="CLOSE", src_addr=[nowhere], src_port=0, dst_addr=[nowhere], dst_port=0)
        changed += 1
    if changed:
        _replace(image_dir, images, img)
    return changed


def _replace(image_dir: Path, images, img: dict) -> None:
    path = Path(image_dir) / FILES_IMAGE
    tmp = path.with_suffix(".img.tmp")
    with open(tmp, "wb") as f:
        images.dump(img, f)
    os.replace(tmp, path)


def moved_copy(criu_dir: Path, dest: Path, moved: dict[str, str],
               closed: list[tuple[str, str]] | None = None) -> Path:
    """A view of the CRIU images in `criu_dir` with the connections `closed` names
    closed (close_connections), then the TCP ends moved (move_addresses): links to
    every image but the one rewritten, so a committed image is never changed."""
    dest.mkdir(mode=0o700)
    for f in Path(criu_dir).iterdir():
        if f.name == FILES_IMAGE:
            shutil.copyfile(f, dest / f.name)
        else:
            (dest / f.name).symlink_to(f.absolute())
    close_connections(dest, closed or [])
    move_addresses(dest, moved)
    return dest
