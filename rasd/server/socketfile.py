"""The socket file a daemon binds itself: taken only where no live process answers, removed
only while it is still the one bound.

Theory of operation
-------------------
``rasd serve --socket PATH`` and ``rasd dev`` bind PATH themselves; under socket activation
systemd owns the socket, and the daemon never binds, replaces or removes the path. Before
binding, :func:`claim` looks at PATH:

* nothing there: bind;
* a socket nobody accepts on (``connect`` gives ECONNREFUSED: its daemon crashed): stale,
  replaced;
* a socket some process accepts on (``connect`` succeeds, or EAGAIN: a full backlog): another
  daemon, or systemd's ``rasd.socket``, serves there. Replacing the path would leave that
  process serving unreachably, and the replacement's exit would delete the path: refused
  (:class:`SocketInUse`, exit 2), naming how to find the process;
* anything else (not a socket; a connect that cannot tell, such as EACCES): refused too.

The bind itself fails (EADDRINUSE) if a path appeared after the check, so two daemons that
start at once cannot both take it. After binding, the path's device and inode are noted
(:func:`identity`); at exit the path is removed only if it still names that inode
(:func:`remove_if_ours`): a path another process bound since is not ours to delete.
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
