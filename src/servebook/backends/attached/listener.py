"""Which process listens on a TCP port of this machine, and its command line: read from
``/proc`` the way ``ss -ltnp`` does, so ``servebook attach`` takes an engine's claims from
what the engine was started with, not from what anyone says of it.

* ``/proc/net/tcp`` and ``tcp6`` list every socket with its state, owner uid and inode; a
  listening socket (state ``0A``) on the port, bound to the URL's address or to any
  address, is the one.
* The process holding it has a ``/proc/PID/fd/N`` link to ``socket:[INODE]``; its
  ``/proc/PID/cmdline`` is the argv (NUL-separated) and ``/proc/PID/environ`` the
  environment it started with (``VLLM_ADDITIONAL_ARGS`` lives there).

What cannot be read is said plainly (``Listener.unread``), never guessed: a host that is
not this machine, a socket another user owns (its ``fd`` links are not readable to us), a
process in another PID namespace (a container publishing the port), a port nobody listens
on.  The claims of such a replica are then "not determined".
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import pwd
import socket
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from servebook import redact

_LISTEN = "0A"
# The environment kept from an engine process: what may change its flags or its KV
# transport, never a secret (``redact.is_secret_name``).
_ENV_PREFIXES = ("VLLM_", "UCX_", "NIXL_", "FI_", "LMCACHE_")


@dataclass(frozen=True)
class Listener:
    """The process behind a URL: ``argv`` and ``env`` when read, else ``unread`` says why."""

    port: int
    pid: int | None = None
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    source: str = ""  # "pid 4242 listening on port 8200 (/proc/4242/cmdline)"
    unread: str = ""


def url_port(url: str) -> tuple[str, int]:
    """(host, port) of a URL; the scheme's default port when none is written."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = parts.port
    except ValueError:
        port = None
    return host, port or (443 if parts.scheme == "https" else 80)


def _addresses(host: str) -> list[str]:
    try:
        return sorted({str(a[4][0]) for a in socket.getaddrinfo(host, None)})
    except OSError:
        return []


def is_this_machine(ip: str) -> bool:
    """Whether ``ip`` is one of this machine's addresses: loopback, or one a socket can be
    bound to here (the kernel refuses an address no interface has)."""
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return False
    if addr.is_loopback or addr.is_unspecified:
        return True
    family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
    with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((ip, 0))
        return True
    return False


def _hex_address(text: str) -> str:
    """``/proc/net/tcp``'s address (little-endian 32-bit words of hex) as an IP."""
    raw = bytes.fromhex(text)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


@dataclass(frozen=True)
class Socket:
    address: str
    port: int
    uid: int
    inode: int


def listening_sockets(proc: Path = Path("/proc")) -> list[Socket]:
    """Every listening TCP socket of this network namespace."""
    out: list[Socket] = []
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 10 or cols[3] != _LISTEN:
                continue
            addr, _, port = cols[1].partition(":")
            out.append(Socket(_hex_address(addr), int(port, 16), int(cols[7]), int(cols[9])))
    return out


def _holders(inode: int, proc: Path) -> list[int]:
    """PIDs whose open files include the socket (a forked worker may share it)."""
    want = f"socket:[{inode}]"
    pids = []
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) == want for fd in (d / "fd").iterdir()):
                pids.append(int(d.name))
    return sorted(pids)


def user_name(uid: int) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _kept_env(raw: bytes) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.decode("utf-8", "replace").partition("=")
        if sep and name.startswith(_ENV_PREFIXES) and not redact.is_secret_name(name):
            env[name] = value
    return env


def _serves(ip: str, s: Socket) -> bool:
    bound = ipaddress.ip_address(s.address)
    if bound.is_unspecified:
        return True
    if bound.version == 6 and bound.ipv4_mapped is not None:
        return str(bound.ipv4_mapped) == ip
    return str(bound) == ip


def read_listener(url: str, proc: Path = Path("/proc")) -> Listener:
    """The process that listens on ``url``'s port on this machine, with its command line;
    ``unread`` says plainly when that cannot be known from here."""
    host, port = url_port(url)
    ips = _addresses(host)
    if not ips:
        return Listener(port, unread=f"host {host!r} does not resolve")
    local = [ip for ip in ips if is_this_machine(ip)]
    if not local:
        return Listener(
            port,
            unread=f"{host} ({', '.join(ips)}) is another machine: servebook reads a command "
            "line only from a process on this machine (/proc)",
        )
    sockets = [s for s in listening_sockets(proc) if s.port == port]
    mine = [s for s in sockets if any(_serves(ip, s) for ip in local)]
    if not mine:
        return Listener(port, unread=f"no process on this machine listens on port {port}")
    s = mine[0]
    pids = _holders(s.inode, proc)
    if not pids:
        if s.uid != os.getuid():
            why = (
                f"the socket on port {port} belongs to {user_name(s.uid)}, whose processes' open "
                f"files ({proc}/PID/fd) this user ({user_name(os.getuid())}) may not read"
            )
        else:
            why = (
                f"no process visible here holds the socket on port {port} (it lives in "
                "another PID namespace: a container publishing the port?)"
            )
        return Listener(port, unread=why)
    for pid in pids:  # the engine's own process, when several hold the socket
        try:
            argv = [
                a.decode("utf-8", "replace")
                for a in (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
            ]
        except OSError as e:
            return Listener(port, pid, unread=f"{proc}/{pid}/cmdline: {e.strerror}")
        argv = argv[:-1] if argv and argv[-1] == "" else argv
        if argv:
            env: dict[str, str] = {}
            with contextlib.suppress(OSError):
                env = _kept_env((proc / str(pid) / "environ").read_bytes())
            return Listener(
                port,
                pid,
                argv,
                env,
                source=f"pid {pid} listening on port {port} ({proc}/{pid}/cmdline)",
            )
    return Listener(port, pids[0], unread=f"pid {pids[0]} on port {port} has no command line")


__all__ = ["Listener", "is_this_machine", "listening_sockets", "read_listener", "url_port"]
