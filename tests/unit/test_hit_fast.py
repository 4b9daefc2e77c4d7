"""The server's one entry per frame (Router.handle): a plain cached hit is answered at once,
in the one answer layout; every frame that is not one is answered otherwise: a bad field,
another op, the ACL, a lease end the pool refuses at once, a miss goes on to admission with
its fields (asked of the cache once, never parsed). The field check is protocol.lease_fields,
the cache decision LeaseCache.answer. Time is a FakeClock; no DynamoDB, no event loop:
admission (Router._admit, which starts a task) is recorded instead.
"""

from __future__ import annotations

import itertools
from typing import Any

import msgpack
import pytest

from rasd.config import Config
from rasd.core.lease import MAX_KEY_LEN, US, Lease, Pool
from rasd.daemon.coordinator import Coordinator
from rasd.daemon.renewer import Renewer
from rasd.dynamo.store import Store
from rasd.server import Connection, Daemon, routing
from rasd.server.peercred import Grant
from rasd.server.routing import Router
from rasd.wire import MAX_DEADLINE_MS, MAX_ID_LEN, lease_response
from rasd_client.wire import BadFrame, FrameDecoder, encode
from tests.doubles.clock import FakeClock

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


#: what route() gives for a frame that went on to admission (the slow path)
ADMITTED = "admitted"


def make(clock: FakeClock) -> Daemon:
    cfg = Config(
        table="t", socket="/nonexistent/x.sock", region="us-east-1", confirm_interval=S
    ).validate()
    d = Daemon(cfg, clock=clock)
    store = Store(cfg, d.counters)  # never started: a hit never uses it
    d.attach(store, Coordinator(cfg, store, clock, d.counters))
    d.up.set()
    d.coordinator.pools[("c", "p")] = Pool("c", "p", MAX_LEASE_S * US)
    return d


#: what each admission was given (``Router._admit``, recorded instead of run: no event loop)
ADMITS: list[tuple[Any, ...]] = []


@pytest.fixture(autouse=True)
def _record_admissions(monkeypatch: pytest.MonkeyPatch) -> None:
    ADMITS.clear()

    def admit(router: Router, *args: Any) -> bool:
        ADMITS.append(args)
        return False  # as shed: what a test gave the admission is kept for the next

    monkeypatch.setattr(Router, "_admit", admit)


def connect(d: Daemon, grant: Grant | None = None) -> tuple[Connection, FakeTransport]:
    conn = Connection(d.router)
    t = FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    if grant is not None:
        conn.grant = grant
    return conn, t


def cache(d: Daemon, clock: FakeClock, key: str = "k", region: str = "us-east-1") -> Lease:
    exp = clock.now_us() + 1800 * US
    lease = Lease("c", "p", key, f"res-{key}", region, exp, 7, exp - 60 * US, "0123456789abcdef")
    d.coordinator.cache.put(lease, clock.mono())
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


def route(d: Daemon, f: Any, grant: Grant | None = None) -> bytes | dict[str, Any] | str:
    """What handle does with a frame: the hit's answer frame (bytes), the answer it sent at
    once (decoded), or ADMITTED when it went on to admission."""
    conn, t = connect(d, grant)
    before = len(ADMITS)
    out = d.router.handle(conn, f)
    if out is not None:
        assert not t.out and len(ADMITS) == before
        return out
    if len(ADMITS) > before:
        assert not t.out
        return ADMITTED
    assert len(t.out) == 1
    return decode_one(t.out[0])


def test_a_plain_hit_is_answered_in_the_one_layout() -> None:
    clock = FakeClock()
    d = make(clock)
    lease = cache(d, clock)
    for rid in (0, 1, 127, 128, 2**16, 2**32 + 5, 2**63, 2**64 - 1, -3, -(2**63)):
        out = route(d, frame(clock, id=rid))
        assert isinstance(out, bytes)
        assert decode_one(out) == lease_response(rid, lease, False)
    assert isinstance(route(d, frame(clock, deadline_ms=None)), bytes)
    assert isinstance(
        route(d, {k: v for k, v in frame(clock).items() if k != "deadline_ms"}), bytes
    )


def test_hits_count_as_requests_and_cache_hits() -> None:
    clock = FakeClock()
    d = make(clock)
    cache(d, clock)
    for _ in range(3):
        assert isinstance(route(d, frame(clock)), bytes)
    assert d.counters["cache.hit"] == 3 and d.counters["req.total"] == 3
    assert d.counters.snapshot()["cache.hit"] == 3
    assert route(d, frame(clock, key="other")) == ADMITTED
    assert d.counters["cache.miss"] == 1 and d.counters["req.total"] == 4


def test_a_miss_goes_on_with_its_fields_asked_once_never_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    d = make(clock)
    cache(d, clock)
    asked: list[tuple[Any, ...]] = []
    answer = d.router.answer  # the cache's, bound once

    def counted(*a: Any) -> bytes | None:
        asked.append(a)
        return answer(*a)

    monkeypatch.setattr(d.router, "answer", counted)

    def no_parse(frame: Any) -> None:
        raise AssertionError("parsed again")

    monkeypatch.setattr(routing.wire, "parse", no_parse)
    f = frame(clock, key="other", id=9)
    assert route(d, f) == ADMITTED
    assert len(asked) == 1
    _conn, rid, op, args, deadline_ms, spare = ADMITS[0]
    assert (rid, op, args, deadline_ms, spare) == (
        9,
        "get_lease",
        ("c", "p", "other", f["lease_expires_us"]),
        500,
        None,
    )


MISSING = object()
#: field -> (values the fast path answers, values it leaves to the full path)
VALUES: dict[str, tuple[list[Any], list[Any]]] = {
    "v": ([1], [2, True, 1.0, None, "1", MISSING]),
    "id": ([0, 2**40, 2**64 - 1, -3], [True, 1.5, "1", None, MISSING]),
    "op": (["get_lease"], ["release", "ping", None, MISSING]),
    "client_id": (["c"], ["", "x" * (MAX_ID_LEN + 1), "d", 5, None, b"c", MISSING]),
    "pool_id": (["p"], ["", "q", "q" * (MAX_ID_LEN + 1), [], None, MISSING]),
    "key": (["k"], ["", "z", "z" * (MAX_KEY_LEN + 1), 3, None, MISSING]),
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
def test_plain_hits_are_answered_and_the_rest_answered_otherwise(field: str) -> None:
    """A name that finds no entry goes on to admission; every other deviation is an error,
    named (a lease end the pool refuses: at once, as the pool is known)."""
    clock = FakeClock()
    d = make(clock)
    cache(d, clock)
    answered, left = VALUES[field]
    for value in answered:
        assert isinstance(route(d, _variant(clock, field, value)), bytes), (field, value)
    for value in left:
        got = route(d, _variant(clock, field, value))
        assert not isinstance(got, bytes), (field, value)
        if value in ("d", "q", "z"):
            assert got == ADMITTED, (field, value)
        elif field != "op":
            assert isinstance(got, dict) and got["code"] == "BAD_REQUEST", (field, value)


def test_pairs_of_deviations_are_not_hits() -> None:
    clock = FakeClock()
    d = make(clock)
    cache(d, clock)
    for a, b in itertools.combinations(sorted(VALUES), 2):
        for va, vb in itertools.product(VALUES[a][1][:3], VALUES[b][1][:3]):
            f = {**_variant(clock, a, va), b: _variant(clock, b, vb).get(b)}
            assert not isinstance(route(d, f), bytes), (a, va, b, vb)


def test_not_a_map_and_the_acl() -> None:
    clock = FakeClock()
    d = make(clock)
    cache(d, clock)
    forbidden = route(d, frame(clock), Grant(False, frozenset({"other"})))
    assert isinstance(forbidden, dict) and forbidden["code"] == "FORBIDDEN"
    assert forbidden["id"] == 7
    assert isinstance(route(d, frame(clock), Grant(False, frozenset({"c"}))), bytes)
    bad = route(d, BadFrame("payload is not a map"))
    assert isinstance(bad, dict) and bad["code"] == "BAD_REQUEST" and bad["id"] is None


def test_before_the_store_is_up_the_cache_is_not_asked() -> None:
    clock = FakeClock()
    d = make(clock)
    cache(d, clock)
    d.up.clear()
    assert route(d, frame(clock)) == ADMITTED  # the slow path waits for the store
    d.status.degrade("no table")
    got = route(d, frame(clock))
    assert isinstance(got, dict) and got["code"] == "UNAVAILABLE"
    assert d.counters["cache.miss"] == 0


def test_past_s_is_not_served_and_the_entry_goes() -> None:
    clock = FakeClock()
    d = make(clock)
    cache(d, clock)
    clock.advance(S - 0.01)
    acq = d.coordinator
    acq.renewer.refreshing.add(("c", "p", "k"))  # past S/2: a refresh under way, none started
    assert isinstance(route(d, frame(clock)), bytes)
    clock.advance(0.02)
    assert route(d, frame(clock)) == ADMITTED
    assert acq.cache.size() == 0


def test_background_work_is_asked_for_by_a_hit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past S/2, or a lease end beyond the cached one (own region only): one call to the
    renewer's maybe_refresh with the cached Lease."""
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(Renewer, "maybe_refresh", lambda self, *a: calls.append(a))
    clock = FakeClock()
    d = make(clock)  # its cache is made with the renewer's maybe_refresh: the spy above
    own = cache(d, clock, "k")
    other = cache(d, clock, "o", region="eu-west-1")

    def hit(key: str, requested_us: int) -> list[Any]:
        calls.clear()
        assert isinstance(route(d, frame(clock, key=key, lease_expires_us=requested_us)), bytes)
        return list(calls)

    assert hit("k", own.expires_us - 1) == []
    got = hit("k", own.expires_us + 10 * US)
    assert len(got) == 1 and got[0][1] == own
    assert hit("o", own.expires_us + 10 * US) == []  # another region's: never extended here
    clock.advance(S / 2 + 0.1)
    got = hit("o", other.expires_us - 1)
    assert len(got) == 1 and got[0][1] == other


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
    assert conn.decoder is None and conn.buffered == 0  # nothing held: no decoder kept
    conn.data_received(data[:10])
    assert conn.buffered == 10 and not t.out[1:]
    conn.data_received(data[10:])
    assert conn.decoder is None and len(t.out) == 2 and t.out[1] == t.out[0]


def test_the_sweep_closes_half_sent_frames_and_idle_connections() -> None:
    """A frame begun and not finished for ``frame_after`` sweeps closes its connection, its
    bytes counted in the daemon's bound while held; a connection that asks nothing, with
    nothing in flight, for ``idle_after`` sweeps too; a whole frame starts the count again."""
    clock = FakeClock()
    d = make(clock)
    limits = d.router.limits
    conn, _ = connect(d)
    assert limits.open == 1
    data = encode(frame(clock))
    conn.data_received(data[:10])
    assert conn.held == 10 and limits.buffered == 10
    assert [conn.tick(0, 3) for _ in range(4)] == [None, None, None, "frame_timeout"]
    conn.data_received(data[10:])  # the frame finished (a hit on nothing: admitted)
    assert conn.held == 0 and limits.buffered == 0 and conn.frames == 1
    # counted afresh from the frame: the sweep that sees it, then more than 2
    assert [conn.tick(2, 3) for _ in range(4)] == [None, None, None, "idle"]
    conn.pending = 1  # a request in flight: not idle, however long
    assert [conn.tick(2, 3) for _ in range(4)] == [None] * 4
    conn.data_received(data[:5])
    conn.connection_lost(None)  # a close lets go of its slot and its bytes
    assert limits.open == 0 and limits.buffered == 0
