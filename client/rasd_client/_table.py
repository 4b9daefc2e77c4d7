"""The hit table: the daemon's cached answers in shared memory, read here without a round trip.

The daemon writes (``rasd.daemon.published``), the client reads; this module holds the layout
both use, and the client's side: a slot is served only between two equal even ``seq``
readings with a matching crc, while its numbers allow. The contract (hand-over, holder,
layout, touches): docs/protocol.md, "The hit table"; why it is safe: docs/design.md.
"""

from __future__ import annotations

import mmap
import os
import select
import socket
import struct
import threading
import time
from datetime import UTC, datetime
from typing import Any
from zlib import crc32

from . import wire
from ._common import DEFAULT_SOCKET, Lease, expires_us

MAGIC = 0x52415344  # "RASD"
LAYOUT = 1
HEADER = struct.Struct("<IHHIIII")  # magic, layout, ways, buckets, state, epoch, slots
HEADER_SIZE = 64
STATE_AT = 12  # state, epoch
STATE = struct.Struct("<II")
#: the header's state: the daemon serves from this table; it paused it (its clock is not
#: trusted); it closed it for good (shutting down)
CLOSED, SERVING, PAUSED = 0, 1, 2
SLOT = 256
SLOT_HEAD = struct.Struct("<IIIHHHHddqqqqq")
SEQ = struct.Struct("<I")
#: bytes of names, resource and region a slot holds; a longer answer is not published
SLOT_ROOM = SLOT - SLOT_HEAD.size
MAX_WAYS = 16


def bucket_size(ways: int) -> int:
    return 8 * ways


def slots_at(buckets: int, ways: int) -> int:
    """Where the slots start: after the index, on a 4 KiB page."""
    return -(-(HEADER_SIZE + buckets * bucket_size(ways)) // 4096) * 4096


def table_size(buckets: int, ways: int, slots: int) -> int:
    return slots_at(buckets, ways) + slots * SLOT


def name_hash(name: bytes) -> int:
    """The tag of a name (never 0: an empty slot's tag)."""
    return crc32(name) | 1


#: what a slot read gives, kept until the slot's seq or the table's epoch moves: seq, epoch,
#: name, plen, until (monotonic: served before it), touch (monotonic: past it a hit sends a
#: touch), touch_after_us and asked_us (wall µs: from then, an extension is due for asks up to
#: that long), max_lease_us (the longest lease the pool takes), the Lease. A plain tuple,
#: unpacked where it is read: a NamedTuple's attributes cost the hit 5 % (bench.clienthit)
Seen = tuple[int, int, bytes, int, float, float, int, int, int, Lease]


class Table:
    """One client_id's table, mapped read-only."""

    __slots__ = ("bucket", "mask", "mm", "nslots", "seen", "slots_at", "ways")

    def __init__(self, mm: mmap.mmap) -> None:
        magic, layout, ways, buckets, _, _, slots = HEADER.unpack_from(mm, 0)
        if magic != MAGIC or layout != LAYOUT or not 0 < ways <= MAX_WAYS:
            raise ValueError("not a rasd table of this layout")
        if buckets & (buckets - 1) or len(mm) < table_size(buckets, ways, slots):
            raise ValueError("a rasd table of the wrong size")
        self.mm = mm
        self.ways = ways
        self.mask = buckets - 1
        self.nslots = slots
        self.slots_at = slots_at(buckets, ways)
        #: a bucket: its tags, then its slot numbers
        self.bucket = struct.Struct(f"<{2 * ways}I").unpack_from
        #: slot offset -> what it held at its last read (a seq unchanged since: the same)
        self.seen: dict[int, Seen] = {}

    def state(self) -> int:
        state: int = STATE.unpack_from(self.mm, STATE_AT)[0]
        return state

    def find(self, name: bytes, plen: int) -> tuple[int, Seen] | None:
        """The slot holding ``name`` (pool_id then key, ``plen`` bytes of pool_id) and what it
        holds, or None: absent, being written, torn, of an older epoch, or not SERVING."""
        mm = self.mm
        state, epoch = STATE.unpack_from(mm, STATE_AT)
        if state != SERVING:
            return None
        h = crc32(name)
        tag = h | 1
        ways = self.ways
        bucket = self.bucket(mm, HEADER_SIZE + ((h >> 1) & self.mask) * 8 * ways)
        tags = bucket[:ways]
        if tag not in tags:
            return None
        n = bucket[ways + tags.index(tag)]
        if n >= self.nslots:
            return None
        off = self.slots_at + n * SLOT
        seq = SEQ.unpack_from(mm, off)[0]
        seen = self.seen.get(off)
        if seen is None or seen[0] != seq or seen[1] != epoch:  # seq, epoch
            seen = self._read(off, seq, epoch)
            if seen is None:
                return None
        if seen[2] != name or seen[3] != plen:  # name, plen
            return None
        return off, seen

    def _read(self, off: int, seq: int, epoch: int) -> Seen | None:
        if seq & 1:
            return None  # being written
        raw = self.mm[off : off + SLOT]
        if SEQ.unpack_from(self.mm, off)[0] != seq:
            return None  # written meanwhile
        (
            _,
            crc,
            ep,
            plen,
            nlen,
            rlen,
            glen,
            until,
            touch,
            after_us,
            asked_us,
            max_us,
            end_us,
            version,
        ) = SLOT_HEAD.unpack_from(raw)
        size = SLOT_HEAD.size
        stop = size + nlen + rlen + glen
        if ep != epoch or nlen == 0 or stop > SLOT or crc32(raw[8:stop]) != crc:
            return None
        try:
            resource = raw[size + nlen : size + nlen + rlen].decode()
            region = raw[size + nlen + rlen : stop].decode()
            when = datetime.fromtimestamp(end_us / 1_000_000, UTC)
        except (UnicodeDecodeError, ValueError, OverflowError, OSError):
            return None
        lease = Lease(resource, when, version, False, region)
        name = raw[size : size + nlen]
        seen: Seen = (seq, ep, name, plen, until, touch, after_us, asked_us, max_us, lease)
        if len(self.seen) >= 65536:
            self.seen.clear()
        self.seen[off] = seen
        return seen


class _Holder:
    """The connection a table came on: alive while silent; carries this process's touches."""

    __slots__ = ("closed", "fd", "local", "lock", "sock", "tables")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.closed = False
        #: each thread's poll object (one may not be polled by two threads at once)
        self.local = threading.local()
        self.lock = threading.Lock()
        #: client_id -> its table, every one handed over on this connection
        self.tables: dict[str, Table] = {}

    def alive(self) -> bool:
        """Open and silent: the daemon never writes here after the hand-over, so anything to
        read (its close, above all) ends every table of this connection."""
        poll = getattr(self.local, "poll", None)
        if poll is None:
            poll = self.local.poll = select.poll()
            poll.register(self.fd, select.POLLIN)
        return not poll.poll(0) and not self.closed

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass


#: the daemon's monotonic clock at the hand-over is the client's within this (else another
#: time namespace's: no table)
SAME_CLOCK = 0.25
#: seconds a process waits before asking again for a table it could not get
RETRY_AFTER = 5.0
#: seconds between two touches of one entry by one process
TOUCH_EVERY = 0.1
_OFF = ("0", "false", "no", "off")


class Tables:
    """A process's tables, by socket path and client_id. Thread-safe; made anew after fork."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.enabled = os.environ.get("RASD_CLIENT_TABLE", "1").strip().lower() not in _OFF
        self.lock = threading.Lock()
        self.holders: dict[str, _Holder] = {}
        #: (path, client_id) -> when to ask again, for a table refused or failed
        self.refused: dict[tuple[str, str], float] = {}
        #: (path, client_id) a thread is asking a table for (:meth:`_open_later`)
        self.opening: set[tuple[str, str]] = set()
        self.opening_lock = threading.Lock()
        #: (slot offset, table id) -> (seq, when) of this process's last touch of it
        self.touched: dict[tuple[int, int], tuple[int, float]] = {}
        #: answers given from a table, and touches sent (``rasd_client.table_stats``)
        self.hits = 0
        self.touches = 0

    def lease(
        self,
        path: str | None,
        client_id: str,
        pool_id: str,
        key: str,
        lease_expires: Any,
    ) -> Lease | None:
        """The lease from the table, or None: ask over the socket (and never an error here:
        a bad argument is named by the socket path's own checks)."""
        try:
            path = path or os.environ.get("RASD_SOCKET") or DEFAULT_SOCKET
            holder = self.holders.get(path)
            if holder is None:
                return None
            table = holder.tables.get(client_id)
            if table is None:
                return None
            if not holder.alive():
                self._drop(path)
                return None
            pool_b = pool_id.encode()
            name = pool_b + key.encode()
            found = table.find(name, len(pool_b))
            if found is None:
                return None
            off, seen = found
            seq, _, _, _, until, touch, touch_after_us, asked_us, max_lease_us, lease = seen
            now = time.monotonic()
            if not now < until:
                return None
            requested_us = expires_us(lease_expires)
            now_us = time.time_ns() // 1000
            ask_us = requested_us - now_us
            if not 0 < ask_us <= max_lease_us:
                return None  # a lease end the pool refuses: the daemon names it
        except Exception:  # noqa: BLE001 - any doubt asks the daemon
            return None
        if now > touch or now_us >= touch_after_us or ask_us > asked_us:
            self._touch(holder, table, off, seq, now, (client_id, pool_id, key), requested_us)
        self.hits += 1
        return lease

    def _touch(
        self,
        holder: _Holder,
        table: Table,
        off: int,
        seq: int,
        now: float,
        names: tuple[str, str, str],
        requested_us: int,
    ) -> None:
        """Tell the daemon an entry past its touch time was served (one way, never waited)."""
        k = (off, id(table))
        last = self.touched.get(k)
        if last is not None and last[0] == seq and now - last[1] < TOUCH_EVERY:
            return
        if len(self.touched) >= 65536:
            self.touched.clear()
        self.touched[k] = (seq, now)
        c, p, key = names
        frame = wire.encode(
            {
                "v": wire.VERSION,
                "id": 0,
                "op": "touch",
                "client_id": c,
                "pool_id": p,
                "key": key,
                "lease_expires_us": requested_us,
            }
        )
        with holder.lock:
            try:
                sent = holder.sock.send(frame, socket.MSG_DONTWAIT)
            except OSError:
                return  # full: the daemon is behind, the next touch comes soon
            if sent != len(frame):
                holder.close()  # a partial frame: the stream is broken
            self.touches += 1

    def answered(self, path: str | None, client_id: str) -> None:
        """A get_lease was answered over the socket: if this process has no table for the
        client_id yet, a thread asks for it (never the caller, whose event loop may be the
        daemon's own), unless it was refused within RETRY_AFTER."""
        if not self.enabled:
            return
        path = path or os.environ.get("RASD_SOCKET") or DEFAULT_SOCKET
        holder = self.holders.get(path)
        table = None if holder is None else holder.tables.get(client_id)
        if table is None or not holder.alive():  # type: ignore[union-attr]
            self._open_later(path, client_id, 1.0)
        elif table.state() == CLOSED:  # retired by the daemon: a new one is handed
            holder.tables.pop(client_id, None)  # type: ignore[union-attr]
            self._open_later(path, client_id, 1.0)

    def _open_later(self, path: str, client_id: str, timeout: float) -> None:
        k = (path, client_id)
        with self.opening_lock:  # never self.lock: held by a fetch this loop may serve
            if not self.enabled or k in self.opening:
                return
            retry = self.refused.get(k)
            if retry is not None and time.monotonic() < retry:
                return
            self.opening.add(k)

        def run() -> None:
            try:
                self._open(path, client_id, timeout)
            finally:
                self.opening.discard(k)

        threading.Thread(target=run, name="rasd-table", daemon=True).start()

    def _open(self, path: str, client_id: str, timeout: float) -> Table | None:
        if not self.enabled:
            return None
        with self.lock:
            holder = self.holders.get(path)
            if holder is not None:
                table = holder.tables.get(client_id)
                if table is not None:
                    return table
                if not holder.alive():
                    self._drop(path)
                    holder = None
            retry = self.refused.get((path, client_id))
            if retry is not None and time.monotonic() < retry:
                return None
            try:
                holder, table = self._fetch(holder, path, client_id, timeout)
            except (OSError, ValueError, wire.FrameTooLarge):
                self.refused[(path, client_id)] = time.monotonic() + RETRY_AFTER
                return None
            self.refused.pop((path, client_id), None)
            holder.tables[client_id] = table
            self.holders[path] = holder
            return table

    def _fetch(
        self, holder: _Holder | None, path: str, client_id: str, timeout: float
    ) -> tuple[_Holder, Table]:
        """Ask for ``client_id``'s table on the path's holder connection (made if need be)."""
        if holder is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(min(timeout, 1.0))
                sock.connect(path)
            except OSError:
                sock.close()
                raise
            holder = _Holder(sock)
        sock = holder.sock
        try:
            req = {"v": wire.VERSION, "id": 1, "op": "table", "client_id": client_id}
            with holder.lock:  # other threads may be sending touches on it
                sock.sendall(wire.encode(req))
            decoder = wire.FrameDecoder()
            fds: list[int] = []
            while True:
                data, got, _, _ = socket.recv_fds(sock, 65536, 1)
                fds += got
                if not data:
                    raise ConnectionResetError("rasd closed the table connection")
                decoder.feed(data)
                frames = list(decoder.frames())
                if frames:
                    break
            resp = frames[0]
            if not isinstance(resp, dict) or not resp.get("ok") or len(fds) != 1:
                raise ValueError(f"no table: {resp!r}")
            if abs(float(resp["mono"]) - time.monotonic()) > SAME_CLOCK:
                raise ValueError("the daemon's monotonic clock is not this process's")
            try:
                mm = mmap.mmap(fds[0], 0, mmap.MAP_SHARED, mmap.PROT_READ)
            finally:
                for fd in fds:
                    os.close(fd)
            return holder, Table(mm)
        except BaseException:
            if not holder.tables:
                holder.close()
            raise

    def _drop(self, path: str) -> None:
        holder = self.holders.pop(path, None)
        if holder is not None:
            holder.close()


#: this process's tables (the clients read the module's attribute: a child gets its own)
current = Tables()


def table_stats() -> dict[str, int]:
    """This process's hit tables: how many it reads, the answers they gave, the touches sent."""
    t = current
    return {
        "tables": sum(len(h.tables) for h in list(t.holders.values())),
        "hits": t.hits,
        "touches": t.touches,
    }


def _reset_after_fork() -> None:
    global current
    current = Tables()


os.register_at_fork(after_in_child=_reset_after_fork)
