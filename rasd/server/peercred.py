"""Who is on the other end of a Unix socket, and may they use a client_id.

The kernel's ``SO_PEERCRED``/``SO_PEERGROUPS`` (:func:`supplementary_gids` falls back to
/proc), and :class:`Acl` (pure), built once from the config's ``acl`` table:
:meth:`Acl.grant` once per connection gives a :class:`Grant`. The rules: docs/operations.md,
"Who may call (FORBIDDEN)".
"""

from __future__ import annotations

import errno
import grp
import platform
import pwd
import socket
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import structlog

ALL = "*"

log = structlog.get_logger("rasd.server")

_UCRED = struct.Struct("3i")  # struct ucred { pid_t pid; uid_t uid; gid_t gid; }
_MAX_GROUPS = 65536  # NGROUPS_MAX on Linux
# SO_PEERGROUPS has the asm-generic value 59 on these; other architectures (sparc, parisc,
# alpha) number it differently, and there the /proc fallback is used.
_SO_PEERGROUPS: int | None = getattr(socket, "SO_PEERGROUPS", None) or (
    59
    if platform.system() == "Linux"
    and platform.machine() in {"x86_64", "aarch64", "i686", "i386", "riscv64", "s390x"}
    else None
)


class _Sock(Protocol):
    """A socket, or the ``TransportSocket`` that ``transport.get_extra_info("socket")`` gives."""

    def getsockopt(self, level: int, optname: int, buflen: int, /) -> bytes: ...


class PeerCred(NamedTuple):
    pid: int
    uid: int
    gid: int


def peer_credentials(sock: _Sock | socket.socket) -> PeerCred:
    """pid, uid and gid of the process that connected (``SO_PEERCRED``). Raises OSError on a
    socket that is not a connected AF_UNIX socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    return PeerCred(*_UCRED.unpack(raw))


def peer_groups(sock: _Sock | socket.socket) -> frozenset[int] | None:
    """Supplementary gids of the peer at connect time (``SO_PEERGROUPS``), or None when the
    kernel or architecture does not offer it."""
    if _SO_PEERGROUPS is None:
        return None
    size = 4 * 64
    while True:
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, _SO_PEERGROUPS, size)
        except OSError as exc:
            if exc.errno == errno.ERANGE and size < 4 * _MAX_GROUPS:
                size *= 16
                continue
            return None
        return frozenset(struct.unpack(f"{len(raw) // 4}I", raw[: len(raw) // 4 * 4]))


def supplementary_gids(
    pid: int, *, expect_uid: int | None = None, proc: str = "/proc"
) -> frozenset[int]:
    """Supplementary gids of a running process from ``/proc/<pid>/status`` (best effort).

    Empty when the process is gone, ``/proc`` is hidden (``hidepid=``, ``ProtectProc=``), or
    its effective uid is not ``expect_uid`` (the pid was reused by someone else).
    """
    try:
        with open(f"{proc}/{pid}/status", encoding="ascii", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return frozenset()
    groups: frozenset[int] = frozenset()
    euid: int | None = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        try:
            if key == "Uid":
                euid = int(value.split()[1])  # real, effective, saved, filesystem
            elif key == "Groups":
                groups = frozenset(int(g) for g in value.split())
        except (ValueError, IndexError):
            return frozenset()
    if expect_uid is not None and euid != expect_uid:
        return frozenset()
    return groups


def peer_gids(sock: _Sock | socket.socket, cred: PeerCred) -> frozenset[int]:
    """The peer's primary gid and supplementary gids, by the best means available."""
    extra = peer_groups(sock)
    if extra is None:
        extra = supplementary_gids(cred.pid, expect_uid=cred.uid)
    return extra | {cred.gid}


# ------------------------------------------------------------------------------------ ACL
class AclError(ValueError):
    """A bad ``acl`` config entry (names the entry)."""


@dataclass(frozen=True, slots=True)
class Grant:
    """What one caller may use: every client_id, or the ones listed."""

    all: bool
    client_ids: frozenset[str]

    def allows(self, client_id: str) -> bool:
        return self.all or client_id in self.client_ids


_OPEN = Grant(True, frozenset())


def _getpwnam_uid(name: str) -> int:
    return pwd.getpwnam(name).pw_uid


def _getgrnam_gid(name: str) -> int:
    return grp.getgrnam(name).gr_gid


class Acl:
    """Which Unix users and groups may use which client_ids. Pure: no I/O after building."""

    __slots__ = ("by_gid", "by_uid", "open")

    def __init__(
        self,
        by_uid: Mapping[int, Iterable[str]] | None = None,
        by_gid: Mapping[int, Iterable[str]] | None = None,
    ) -> None:
        self.by_uid = {u: frozenset(c) for u, c in (by_uid or {}).items()}
        self.by_gid = {g: frozenset(c) for g, c in (by_gid or {}).items()}
        #: No entries at all: everyone may use every client_id.
        self.open = not self.by_uid and not self.by_gid

    @classmethod
    def from_config(
        cls,
        acl: Mapping[str, Sequence[str]],
        *,
        uid_of: Callable[[str], int] = _getpwnam_uid,
        gid_of: Callable[[str], int] = _getgrnam_gid,
    ) -> Acl:
        """Build from ``Config.acl`` (``{"uid.1001": ["demo"], "group.web": ["*"]}``).

        ``uid_of``/``gid_of`` resolve names (``pwd``/``grp`` by default; tests pass dicts'
        ``__getitem__``). Raises AclError naming the entry on any bad key, id, name or value.
        """
        by_uid: dict[int, set[str]] = {}
        by_gid: dict[int, set[str]] = {}
        for key, clients in acl.items():
            kind, sep, ident = key.partition(".")
            if not sep or not ident:
                raise AclError(f"acl: {key!r}: expected uid.N, gid.N, user.NAME or group.NAME")
            if isinstance(clients, str) or not all(isinstance(c, str) and c for c in clients):
                raise AclError(f'acl: {key!r}: expected a list of client_ids or "*"')
            target = by_uid if kind in ("uid", "user") else by_gid
            if kind in ("uid", "gid"):
                if not (ident.isascii() and ident.isdigit()):
                    raise AclError(f"acl: {key!r}: {ident!r} is not a {kind} number")
                num = int(ident)
            elif kind in ("user", "group"):
                try:
                    num = (uid_of if kind == "user" else gid_of)(ident)
                except KeyError:
                    raise AclError(f"acl: {key!r}: no such {kind} on this host") from None
            else:
                raise AclError(f"acl: {key!r}: unknown kind {kind!r} (uid, gid, user or group)")
            target.setdefault(num, set()).update(clients)
        return cls(by_uid, by_gid)

    def grant(self, uid: int, gids: Iterable[int]) -> Grant:
        """Everything uid (with these gids) may use. Compute once per connection."""
        if self.open:
            return _OPEN
        found: set[str] = set(self.by_uid.get(uid, ()))
        for g in gids:
            found.update(self.by_gid.get(g, ()))
        if ALL in found:
            return _OPEN
        return Grant(False, frozenset(found))

    def __repr__(self) -> str:
        if self.open:
            return "Acl(open)"
        return f"Acl(uids={sorted(self.by_uid)}, gids={sorted(self.by_gid)})"


#: what a peer whose credentials cannot be read may use: nothing
NOBODY = Grant(False, frozenset())
#: whose connection it is when the kernel cannot say (counted together, granted nothing)
UNKNOWN_PEER = PeerCred(-1, -1, -1)


def identify(acl: Acl, sock: _Sock | socket.socket | None) -> tuple[PeerCred, Grant]:
    """Who connected (SO_PEERCRED's pid, uid and gid; UNKNOWN_PEER when the kernel cannot
    say) and what ``acl`` grants it (NOBODY when its groups cannot be read either)."""
    cred = UNKNOWN_PEER
    if sock is not None:
        try:
            cred = peer_credentials(sock)
        except OSError as exc:
            log.warning("peer_credentials_failed", error=str(exc))
    if acl.open:
        return cred, acl.grant(0, ())
    if cred is UNKNOWN_PEER:
        return cred, NOBODY
    try:
        return cred, acl.grant(cred.uid, peer_gids(sock, cred))  # type: ignore[arg-type]
    except OSError as exc:
        log.warning("peer_groups_failed", error=str(exc))
        return cred, NOBODY
