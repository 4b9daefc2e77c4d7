"""The server's fast path (Daemon.hit): a plain cached hit is answered at once, with the answer
the full path (dispatch) gives; every frame that is not one (a bad field, another op, the ACL,
an id the answer cannot carry, no entry) is left to dispatch, which answers it. Both paths
share the field check (protocol.lease_fields) and the cache decision (Acquirer.hit_answer).
Time is a FakeClock; no DynamoDB, no event loop."""

from __future__ import annotations

import itertools
from typing import Any

import msgpack
import pytest

from rasd.acquire import Acquirer
from rasd.config import Config
from rasd.core.clock import FakeClock
from rasd.core.lease import US, Lease, Pool
from rasd.protocol import MAX_DEADLINE_MS, MAX_ID_LEN
from rasd.server import Connection, Daemon
from rasd.server.peercred import Grant
from rasd.store import Store
from rasd_client.wire import FrameDecoder

S = 30.0
MAX_LEASE_S = 3600


class FakeTransport:
    def __init__(self) -> None:
        self.out: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.out.append(bytes(data))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def close(self) -> None:
        pass


def make(clock: FakeClock) -> Daemon:
    cfg = Config(
        table="t", socket="/nonexistent/x.sock", region="us-east-1", confirm_interval=S
    ).validate()
    d = Daemon(cfg, clock=clock)
    d.store = Store(cfg, d.counters)  # never started: a hit never uses it
    d.acquirer = Acquirer(cfg, d.store, clock, d.counters)
    d.up.set()
    d.acquirer.pools[("c", "p")] = Pool("c", "p", MAX_LEASE_S * US)
    return d


def connect(d: Daemon, grant: Grant | None = None) -> tuple[Connection, FakeTransport]:
    conn = Connection(d)
    t = FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    if grant is not None:
        conn.grant = grant
    return conn, t


def cache(d: Daemon, clock: FakeClock, key: str = "k", region: str = "us-east-1") -> Lease:
    exp = clock.now_us() + 1800 * US
    lease = Lease("c", "p", key, f"res-{key}", region, exp, 7, exp - 60 * US, "0123456789abcdef")
    d.acquirer.cache.put(lease, clock.mono())
    return lease


def frame(clock: FakeClock, **kw: Any) -> dict[str, Any]:
    f: dict[str, Any] = {
        "v": 1,
        "id": 7,
        "op": "get_lease",
        "client_id": "c",
        "pool_id": "p",
        "key": "k",
        "lease_expires_us": clock.now_us() + 600 * US,
        "deadline_ms": 500,
    }
    f.update(kw)
    return f


def decode_one(data: bytes) -> dict[str, Any]:
    dec = FrameDecoder()
    dec.feed(data)
    frames = list(dec.frames())
    assert len(frames) == 1 and dec.buffered == 0, frames
    assert isinstance(frames[0], dict)
    return frames[0]


def full_path(d: Daemon, f: dict[str, Any], grant: Grant | None = None) -> dict[str, Any]:
    """What dispatch answers at once (raises RuntimeError, no event loop, if it would go to
    DynamoDB instead)."""
    conn, t = connect(d, grant)
    d.dispatch(conn, f)
    assert len(t.out) == 1
    return decode_one(t.out[0])


def agree(d: Daemon, f: dict[str, Any], grant: Grant | None = None) -> bytes | None:
    conn, _ = connect(d, grant)
    fast = d.hit(conn, f)
    if fast is not None:
        assert decode_one(fast) == full_path(d, f, grant), f
    return fast


def test_a_plain_hit_is_answered_as_the_full_path_answers_it() -> None:
    clock = FakeClock()
    d = make(clock)
    lease = cache(d, clock)
    for rid in (0, 1, 127, 128, 2**16, 2**32 + 5, 2**63, 2**64 - 1):
        out = agree(d, frame(clock, id=rid))
        assert out is not None
        got = decode_one(out)
        assert got["id"] == rid and got["resource"] == lease.resource and got["new"] is False
        assert got["lease_expires_us"] == lease.expires_us and got["version"] == 7
    assert agree(d, frame(clock, deadline_ms=None)) is not None
    assert agree(d, {k: v for k, v in frame(clock).items() if k != "deadline_ms"}) is not None


def test_hits_count_as_requests_and_cache_hits() -> None:
    clock = FakeClock()
    d = make(clock)
    cache(d, clock)
    conn, _ = connect(d)
    for _ in range(3):
        assert d.hit(conn, frame(clock)) is not None
    assert d.counters["cache.hit"] == 3 and d.counters["req.total"] == 3
    assert d.counters.snapshot()["cache.hit"] == 3
    assert d.hit(conn, frame(clock, key="other")) is None
    assert d.counters["cache.miss"] == 0  # the full path counts the miss, not the fast one


MISSING = object()
#: field -> (values the fast path answers, values it leaves to the full path)
VALUES: dict[str, tuple[list[Any], list[Any]]] = {
    "v": ([1], [2, True, 1.0, None, "1", MISSING]),
    "id": ([0, 2**40, 2**64 - 1], [-3, True, 1.5, "1", None, MISSING]),
    "op": (["get_lease"], ["release", "ping", None, MISSING]),
    "client_id": (["c"], ["", "x" * (MAX_ID_LEN + 1), "d", 5, None, b"c", MISSING]),
    "pool_id": (["p"], ["", "q", [], None, MISSING]),
    "key": (["k"], ["", "z", 3, None, MISSING]),
    "lease_expires_us": (["ok"], ["past", "too far", 0, False, 1.0, None, MISSING]),
    "deadline_ms": (
        [None, 1, MAX_DEADLINE_MS, MISSING],
        [MAX_DEADLINE_MS + 1, 0, True, 2.0, "5"],
    ),
}


def _variant(clock: FakeClock, field: str, value: Any) -> dict[str, Any]:
    f = frame(clock)
    if value is MISSING:
        del f[field]
    elif field == "lease_expires_us" and value == "ok":
        pass
    elif field == "lease_expires_us" and value == "past":
        f[field] = clock.now_us() - 1
    elif field == "lease_expires_us" and value == "too far":
        f[field] = clock.now_us() + (MAX_LEASE_S + 5) * US
    else:
        f[field] = value
    return f


@pytest.mark.parametrize("field", sorted(VALUES))
def test_the_fast_path_answers_plain_hits_and_leaves_the_rest(field: str) -> None:
    clock = FakeClock()
    d = make(clock)
    cache(d, clock)
    answered, left = VALUES[field]
    for value in answered:
        assert agree(d, _variant(clock, field, value)) is not None, (field, value)
    for value in left:
        f = _variant(clock, field, value)
        conn, _ = connect(d)
        assert d.hit(conn, f) is None, (field, value)
        if field != "op" and value not in ("d", "q", "z", -3):
            assert full_path(d, f)["ok"] is False, (field, value)  # an error, named there


def test_pairs_of_deviations_are_left_to_the_full_path() -> None:
    clock = FakeClock()
    d = make(clock)
    cache(d, clock)
    conn, _ = connect(d)
    for a, b in itertools.combinations(sorted(VALUES), 2):
        for va, vb in itertools.product(VALUES[a][1][:3], VALUES[b][1][:3]):
            f = {**_variant(clock, a, va), b: _variant(clock, b, vb).get(b)}
            assert d.hit(conn, f) is None, (a, va, b, vb)


def test_not_a_map_and_the_acl_are_left_to_the_full_path() -> None:
    clock = FakeClock()
    d = make(clock)
    cache(d, clock)
    conn, _ = connect(d, Grant(False, frozenset({"other"})))
    assert d.hit(conn, frame(clock)) is None
    forbidden = full_path(d, frame(clock), Grant(False, frozenset({"other"})))
    assert forbidden["code"] == "FORBIDDEN"
    assert agree(d, frame(clock), Grant(False, frozenset({"c"}))) is not None
    assert d.hit(conn, [1, 2]) is None  # type: ignore[arg-type]


def test_nothing_before_the_store_is_up() -> None:
    clock = FakeClock()
    d = make(clock)
    cache(d, clock)
    d.up.clear()
    conn, _ = connect(d)
    assert d.hit(conn, frame(clock)) is None


def test_past_s_is_not_served_and_the_entry_goes() -> None:
    clock = FakeClock()
    d = make(clock)
    cache(d, clock)
    conn, _ = connect(d)
    clock.advance(S - 0.01)
    acq = d.acquirer
    acq._maybe_refresh = lambda *a: None  # type: ignore[method-assign]  # past S/2: no loop
    assert d.hit(conn, frame(clock)) is not None
    clock.advance(0.02)
    assert d.hit(conn, frame(clock)) is None
    assert acq.cache.size() == 0


def test_background_work_is_asked_for_on_both_paths() -> None:
    """Past S/2, or a lease end beyond the cached one (own region only): one call to
    _maybe_refresh with the cached Lease, on the fast path as on the full path (try_hit)."""
    clock = FakeClock()
    d = make(clock)
    acq = d.acquirer
    own = cache(d, clock, "k")
    other = cache(d, clock, "o", region="eu-west-1")
    calls: list[tuple[Any, ...]] = []
    acq._maybe_refresh = lambda *a: calls.append(a)  # type: ignore[method-assign]
    conn, _ = connect(d)

    def both(key: str, requested_us: int) -> tuple[list[Any], list[Any]]:
        calls.clear()
        now = clock.mono()
        assert acq.try_hit("c", "p", key, requested_us, now) is not None
        slow = list(calls)
        calls.clear()
        assert d.hit(conn, frame(clock, key=key, lease_expires_us=requested_us)) is not None
        return slow, list(calls)

    within = own.expires_us - 1
    beyond = own.expires_us + 10 * US
    assert both("k", within) == ([], [])
    slow, fast = both("k", beyond)
    assert slow == fast and len(fast) == 1 and fast[0][1] == own
    assert both("o", beyond) == ([], [])  # another region's lease is never extended here
    clock.advance(S / 2 + 0.1)
    slow, fast = both("o", other.expires_us - 1)
    assert slow == fast and len(fast) == 1 and fast[0][1] == other


def test_several_frames_in_one_read_get_one_write() -> None:
    clock = FakeClock()
    d = make(clock)
    cache(d, clock)
    conn, t = connect(d)
    frames = [frame(clock, id=i) for i in range(3)] + [{"v": 1, "id": 9, "op": "nope"}]
    data = b"".join(len(b).to_bytes(4, "big") + b for b in (msgpack.packb(f) for f in frames))
    conn.data_received(data)
    assert len(t.out) == 1
    dec = FrameDecoder()
    dec.feed(t.out[0])
    got = list(dec.frames())
    assert [g["id"] for g in got] == [0, 1, 2, 9]  # type: ignore[index]
    assert got[3]["code"] == "BAD_REQUEST"  # type: ignore[index]
    assert all(g["ok"] for g in got[:3])  # type: ignore[index]
