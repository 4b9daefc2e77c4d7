"""The socket file a daemon binds itself: taken only where no live process answers
(:func:`claim`), removed only while it is still the one bound (:func:`identity`,
:func:`remove_if_ours`). The cases: docs/operations.md, "The daemon on a host (systemd)".
"""

from __future__ import annotations

import errno
import os
import socket
import stat

#: (st_dev, st_ino) of a socket file
Identity = tuple[int, int]


class SocketInUse(Exception):
    """The socket path is served by another live process (or is not a socket): the daemon
    refuses to start (exit 2)."""


def in_use(path: str) -> str:
    return (
        f"another process is serving on {path} (a running rasd, or systemd's rasd.socket): "
        "refusing to take the socket over; stop that process or use another socket path. "
        f"Find it with: ss -xlp | grep {path}"
    )


def claim(path: str) -> None:
    """Make ``path`` free to bind: nothing to do if it does not exist, a stale socket is
    removed; SocketInUse if a process answers on it or it is not a socket."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketInUse(f"{path} exists and is not a socket: remove it or use another path")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        try:
            os.unlink(path)  # stale: its daemon is gone
        except FileNotFoundError:
            pass
        return
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno != errno.EAGAIN:  # EAGAIN: accepting, with a full backlog
            raise SocketInUse(
                f"cannot tell whether a process serves on {path} ({exc.strerror}): refusing "
                f"to replace it. Find one with: ss -xlp | grep {path}"
            ) from exc
    finally:
        probe.close()
    raise SocketInUse(in_use(path))


def bind(path: str) -> socket.socket:
    """A Unix stream socket bound to ``path`` (after :func:`claim`); SocketInUse if another
    process bound the path in between."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise SocketInUse(in_use(path)) from exc
        raise
    return sock


def identity(path: str) -> Identity | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def remove_if_ours(path: str, ours: Identity | None) -> bool:
    """Remove ``path`` if it still is the socket file we bound (``ours``). Returns whether it
    was removed."""
    if ours is None or identity(path) != ours:
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
