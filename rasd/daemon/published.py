"""The hit tables: what the lease cache may answer, published in shared memory for the clients.

One sealed memfd per client_id (``LeaseCache.open_table``) in the client's layout
(``rasd_client._table``), written in the same step as the cache: docs/design.md, "The hit
table"; the layout and evictions, docs/protocol.md, "The hit table".
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
from zlib import crc32

from rasd_client._table import (
    CLOSED,
    HEADER,
    HEADER_SIZE,
    LAYOUT,
    MAGIC,
    PAUSED,
    SEQ,
    SERVING,
    SLOT,
    SLOT_HEAD,
    SLOT_ROOM,
    STATE,
    STATE_AT,
    bucket_size,
    slots_at,
    table_size,
)

from ..core.cache_rules import NEVER
from ..core.lease import Lease

#: seal no further writable mapping (Linux >= 5.1; not in the fcntl module)
F_SEAL_FUTURE_WRITE = 0x0010
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SEAL
WAYS = 4
_BODY = struct.Struct(SLOT_HEAD.format[:1] + SLOT_HEAD.format[3:])  # the slot after seq, crc
_TAG = struct.Struct("<I")
_UNTIL = struct.Struct("<d")  # a slot's ``until``, 20 bytes in


class Table:
    """One client_id's table, written by the daemon alone."""

    def __init__(self, client_id: str, buckets: int, slots: int, ways: int = WAYS) -> None:
        self.size = table_size(buckets, ways, slots)
        self.ways = ways
        self.mask = buckets - 1
        self.nslots = slots
        self.slots_at = slots_at(buckets, ways)
        fd = os.memfd_create(f"rasd-table:{client_id}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, self.size)
            self.mm = mmap.mmap(fd, self.size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
        except BaseException:
            os.close(fd)
            raise
        #: the fd handed to the clients (read-only for them: sealed)
        self.fd = fd
        self.epoch = 1
        HEADER.pack_into(self.mm, 0, MAGIC, LAYOUT, ways, buckets, SERVING, self.epoch, slots)
        #: (pool_id, key) -> the offset of its slot; and each used slot's name, bucket, way
        #: (in the order they were filled: the first is the oldest)
        self.where: dict[tuple[str, str], int] = {}
        self.owner: dict[int, tuple[tuple[str, str], int, int]] = {}
        #: (pool_id, key) -> (lease end, asked_us, touch_after_us): the ask a touch told of,
        #: kept while the lease's end is the same (:meth:`note`)
        self.asks: dict[tuple[str, str], tuple[int, int, int]] = {}
        self.free: list[int] = []  # slot numbers given back
        self.used = 0  # slots ever used: the next new one
        self.evictions = 0
        self.too_big = 0

    def __len__(self) -> int:
        return len(self.where)

    def set_state(self, state: int) -> None:
        STATE.pack_into(self.mm, STATE_AT, state, self.epoch)

    def put(
        self,
        pool_id: str,
        key: str,
        until: float,
        touch: float,
        extend_from_us: int,
        max_lease_us: int,
        lease: Lease,
    ) -> None:
        """Publish the answer for ``key``: served until ``until``, touched past ``touch``
        (monotonic), and for an ask that may call for an extension: any ask at first for a
        lease this daemon extends (``extend_from_us`` not NEVER), then as :meth:`note` says."""
        k = (pool_id, key)
        ask = self.asks.get(k)
        if ask is not None and ask[0] == lease.expires_us:
            asked_us, after_us = ask[1], ask[2]
        elif extend_from_us == NEVER:
            asked_us = after_us = NEVER
        else:
            asked_us, after_us = 0, NEVER
        pool_b = pool_id.encode()
        name = pool_b + key.encode()
        res_b = lease.resource.encode()
        reg_b = lease.region.encode()
        if len(name) + len(res_b) + len(reg_b) > SLOT_ROOM:
            self.too_big += 1
            self.remove(pool_id, key)
            return
        body = _BODY.pack(
            self.epoch,
            len(pool_b),
            len(name),
            len(res_b),
            len(reg_b),
            until,
            touch,
            after_us,
            asked_us,
            max_lease_us,
            lease.expires_us,
            lease.version,
        )
        body += name + res_b + reg_b
        off = self.where.get(k)
        if off is not None:
            self._write(off, body)
            return
        h = crc32(name)
        base = HEADER_SIZE + ((h >> 1) & self.mask) * bucket_size(self.ways)
        way = self._way(base)
        off = self._slot()
        self._write(off, body)
        self.where[k] = off
        self.owner[off] = (k, base, way)
        _TAG.pack_into(self.mm, base + 4 * (self.ways + way), (off - self.slots_at) // SLOT)
        _TAG.pack_into(self.mm, base + 4 * way, h | 1)

    def note(self, pool_id: str, key: str, end_us: int, asked_us: int, after_us: int) -> None:
        """A touch told of an ask ``asked_us`` long that needs no extension before
        ``after_us`` (wall): the entry, if it still holds the lease ending ``end_us``, is
        touched again from then, or for a longer ask."""
        k = (pool_id, key)
        off = self.where.get(k)
        if off is None:
            return
        f = list(_BODY.unpack_from(self.mm, off + 8))
        if f[10] != end_us:
            return
        self.asks[k] = (end_us, asked_us, after_us)
        if len(self.asks) > 2 * self.nslots:
            self.asks.pop(next(iter(self.asks)))
        f[7], f[8] = after_us, asked_us
        size = _BODY.size + f[2] + f[3] + f[4]
        self._write(off, _BODY.pack(*f) + self.mm[off + 8 + _BODY.size : off + 8 + size])

    def _way(self, base: int) -> int:
        """A free way of the bucket at ``base``: else the one whose answer is served the
        shortest gives it up (an eviction: that key is answered over the socket)."""
        tags = struct.unpack_from(f"<{2 * self.ways}I", self.mm, base)
        for way in range(self.ways):
            if tags[way] == 0:
                return way
        offs = [self.slots_at + n * SLOT for n in tags[self.ways :]]
        way = min(range(self.ways), key=lambda i: _UNTIL.unpack_from(self.mm, offs[i] + 20)[0])
        self._evict(offs[way])
        return way

    def _slot(self) -> int:
        """A free slot's offset: one given back, else the next never used, else the oldest
        answer's (evicted)."""
        if not self.free and self.used == self.nslots:
            self._evict(next(iter(self.owner)))
        if self.free:
            n = self.free.pop()
        else:
            n = self.used
            self.used += 1
        return self.slots_at + n * SLOT

    def _evict(self, off: int) -> None:
        self.evictions += 1
        self.remove(*self.owner[off][0])

    def _write(self, off: int, body: bytes) -> None:
        mm = self.mm
        seq = SEQ.unpack_from(mm, off)[0] | 1  # odd: being written
        SEQ.pack_into(mm, off, seq)
        mm[off + 4 : off + 8 + len(body)] = _TAG.pack(crc32(body)) + body
        SEQ.pack_into(mm, off, (seq + 1) & 0xFFFFFFFF)

    def remove(self, pool_id: str, key: str) -> None:
        off = self.where.pop((pool_id, key), None)
        if off is None:
            return
        _, base, way = self.owner.pop(off)
        self.asks.pop((pool_id, key), None)
        _TAG.pack_into(self.mm, base + 4 * way, 0)
        self._write(off, _BODY.pack(self.epoch, 0, 0, 0, 0, 0.0, 0.0, 0, 0, 0, 0, 0))
        self.free.append((off - self.slots_at) // SLOT)

    def remove_pool(self, pool_id: str) -> None:
        for p, k in [pk for pk in self.where if pk[0] == pool_id]:
            self.remove(p, k)

    def close(self) -> None:
        """Closed for good and emptied: a process that kept its mapping reads nothing."""
        self.set_state(CLOSED)
        zeros = bytes(1 << 20)
        for at in range(HEADER_SIZE, self.size, len(zeros)):
            end = min(self.size, at + len(zeros))
            self.mm[at:end] = zeros[: end - at]
        self.where.clear()
        self.owner.clear()
        os.close(self.fd)


class Published:
    """The tables of one daemon, by client_id; None of them until a process asks."""

    def __init__(self, slots: int, ways: int = WAYS) -> None:
        self.ways = ways
        self.slots = slots
        #: half the ways filled when every slot is: few buckets overflow
        self.buckets = 1 << max(0, (max(1, 2 * slots // ways) - 1).bit_length())
        self.tables: dict[str, Table] = {}
        self.state = SERVING
        self.touches = 0

    @staticmethod
    def unsupported() -> str | None:
        """Why this host cannot have hit tables (a kernel before 5.1 has no
        F_SEAL_FUTURE_WRITE: a table it hands over could be written), or None."""
        try:
            Table("probe", 1, 1).close()
        except OSError as exc:
            return f"cannot make a sealed memfd: {exc}"
        return None

    def get(self, client_id: str) -> Table | None:
        return self.tables.get(client_id)

    def make(self, client_id: str) -> Table:
        t = self.tables[client_id] = Table(client_id, self.buckets, self.slots, self.ways)
        t.set_state(self.state)
        return t

    def retire(self, client_ids: set[str]) -> None:
        """A reload revoked a grant of these client_ids: their tables are emptied and closed,
        and the next process granted one is handed a new table."""
        for c in client_ids:
            t = self.tables.pop(c, None)
            if t is not None:
                t.close()

    def drop(self, client_id: str, pool_id: str, key: str) -> None:
        t = self.tables.get(client_id)
        if t is not None:
            t.remove(pool_id, key)

    def note(
        self, client_id: str, pool_id: str, key: str, end_us: int, asked_us: int, after_us: int
    ) -> None:
        t = self.tables.get(client_id)
        if t is not None:
            t.note(pool_id, key, end_us, asked_us, after_us)

    def drop_pool(self, client_id: str, pool_id: str) -> None:
        """A pool redefined or deleted: none of its answers is served from the table."""
        t = self.tables.get(client_id)
        if t is not None:
            t.remove_pool(pool_id)

    def pause(self, paused: bool) -> None:
        """Serve from no table (this host's clock is not trusted), or again."""
        self._set(PAUSED if paused else SERVING)

    def close(self) -> None:
        """Shutting down: no table is read again (the clients ask the next daemon)."""
        self._set(CLOSED)

    def _set(self, state: int) -> None:
        if self.state == CLOSED:
            return
        self.state = state
        for t in self.tables.values():
            t.set_state(state)

    def stats(self) -> dict[str, int]:
        ts = self.tables.values()
        return {
            "tables": len(self.tables),
            "entries": sum(len(t) for t in ts),
            "evictions": sum(t.evictions for t in ts),
            "too_big": sum(t.too_big for t in ts),
            "touches": self.touches,
        }
