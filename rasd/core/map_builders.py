"""Every write made to a mapping item, and the read-backs of ambiguous writes. Pure: no I/O.

:func:`map_acquire`, :func:`map_fence`, :func:`map_extend` and the rest, each a
:class:`rasd.core.writes.Write`; the read-backs say whether an item read carries a write
whose reply was lost (I4). Why: docs/design.md, "The items" (rules 1-3).
"""

from __future__ import annotations

from collections.abc import Callable

from .lease import FREE, LIVE, PENDING, Lease, Mapping, fmt_time, map_pk, ttl_after
from .writes import Cond, ItemKey, Value, Write


# -------------------------------------------------------------------------------- mapping item
def _ver_is(ver: int) -> Cond:
    return Cond("ver", "not_exists") if ver == 0 else Cond("ver", "=", ver)


def _pending(
    token: str, resource: str, rver: int, expires_us: int, now_us: int, owner: str
) -> tuple[tuple[str, Value], ...]:
    """What an acquisition writes in the key's mapping: pending, naming its claim."""
    return (
        ("state", PENDING),
        ("token", token),
        ("res", resource),
        ("rver", rver),
        ("exp", fmt_time(expires_us)),
        ("since", fmt_time(now_us)),
        ("owner", owner),
        ("ttl", ttl_after(expires_us)),
    )


def map_acquire(
    ident: ItemKey,
    expect_ver: int,
    token: str,
    resource: str,
    rver: int,
    expires_us: int,
    now_us: int,
    owner: str,
) -> Write:
    """Name our claim in the key's mapping (state ``pending``), if the mapping is still at the
    version we read (``0``: absent). One acquisition per key and region wins this write."""
    return Write(
        key=ident,
        conds=(_ver_is(expect_ver),),
        set=(
            *_pending(token, resource, rver, expires_us, now_us, owner),
            ("ver", expect_ver + 1),
        ),
        kind="map_acquire",
    )


def map_acquire_unheld(
    ident: ItemKey,
    lapsed_by_us: int,
    token: str,
    resource: str,
    rver: int,
    expires_us: int,
    now_us: int,
    owner: str,
) -> Write:
    """:func:`map_acquire` at whatever version the mapping is, where it names no lease: it
    is absent, ``free``, or ``live`` with its end at or before ``lapsed_by_us`` (now less the
    liberator's grace). That is exactly where ``decide.on_read`` answers Acquire from the
    mapping alone, so the write applies only where an acquirer that read the mapping at that
    moment would have written it at the version read. Its version is the one it returns."""
    return Write(
        key=ident,
        conds=(
            Cond("state", "absent_or_ne", PENDING),
            Cond("exp", "absent_or_le", fmt_time(lapsed_by_us)),
        ),
        set=_pending(token, resource, rver, expires_us, now_us, owner),
        incr=("ver",),
        kind="map_acquire",
    )


def map_confirm(m: Mapping) -> Write:
    """``pending`` -> ``live`` once the named claim is known to have landed."""
    assert m.token is not None
    return Write(
        key=m.ident,
        conds=(Cond("ver", "=", m.ver), Cond("token", "=", m.token), Cond("state", "=", PENDING)),
        set=(("state", LIVE), ("ver", m.ver + 1)),
        kind="map_confirm",
    )


def map_extend(lease: Lease, expires_us: int) -> Write:
    """Push the mapping's ``exp`` later (after the resource's: M.exp <= R.exp always)."""
    assert lease.token is not None
    return Write(
        key=(map_pk(lease.client_id, lease.pool_id, lease.key), lease.region),
        conds=(
            Cond("token", "=", lease.token),
            Cond("res", "=", lease.resource),
            Cond("exp", "<", fmt_time(expires_us)),
        ),
        set=(("exp", fmt_time(expires_us)), ("state", LIVE), ("ttl", ttl_after(expires_us))),
        incr=("ver",),
        kind="map_extend",
    )


def map_release(ident: ItemKey, token: str, now_us: int, ver: int | None = None) -> Write:
    """The key no longer holds what ``token`` claimed: mapping -> ``free``. With ``ver``,
    only if the mapping is still at that version (``ras-dedupe``: not extended since the
    end it checked was read)."""
    conds: tuple[Cond, ...] = (Cond("token", "=", token),)
    if ver is not None:
        conds += (_ver_is(ver),)
    return Write(
        key=ident,
        conds=conds,
        set=(("state", FREE), ("ttl", ttl_after(now_us))),
        remove=("token", "res", "rver", "exp", "owner"),
        incr=("ver",),
        kind="map_release",
    )


def map_fence(ident: ItemKey, ver: int, now_us: int) -> Write:
    """Move a mapping past version ``ver`` (creating it, free, when ``ver`` is 0) so that no
    write conditioned on ``ver`` (an acquisition still in flight) can ever apply."""
    if ver == 0:
        return Write(
            key=ident,
            conds=(_ver_is(0),),
            set=(("state", FREE), ("ver", 1), ("ttl", ttl_after(now_us))),
            kind="map_fence",
        )
    return Write(key=ident, conds=(_ver_is(ver),), set=(("ver", ver + 1),), kind="map_fence")


def map_drop_dead(m: Mapping, now_us: int) -> Write:
    """Free a pending mapping whose claim is known never to land (checked and fenced)."""
    return Write(
        key=m.ident,
        conds=(_ver_is(m.ver),),
        set=(("state", FREE), ("ver", m.ver + 1), ("ttl", ttl_after(now_us))),
        remove=("token", "res", "rver", "exp", "owner"),
        kind="map_drop_dead",
    )


# -------------------------------------------------------------- read-backs (I4)
#: Does an item, read back after an ambiguous write, carry that write? (``Store.write``'s
#: ``mine``.) The driver and the protocol checker's model use these very functions.
ReadBack = Callable[[dict[str, Value]], bool]


def names_claim(token: str, resource: str) -> ReadBack:
    """The mapping names our acquisition (``map_acquire``)."""
    return lambda it: it.get("token") == token and it.get("res") == resource


def confirmed(token: str) -> ReadBack:
    """The mapping names ``token`` and is live (``map_confirm``)."""
    return lambda it: it.get("token") == token and it.get("state") == LIVE


def holds(token: str, key: str) -> ReadBack:
    """The resource is held by our acquisition (``claim``)."""
    return lambda it: it.get("holder") == token and it.get("key") == key


def not_held_by(token: str) -> ReadBack:
    """The resource is no longer held by ``token`` (``free_claim``)."""
    return lambda it: it.get("holder") != token


def no_token(token: str) -> ReadBack:
    """The mapping no longer names ``token`` (``map_release``)."""
    return lambda it: it.get("token") != token


def extended_to(token: str | None, want: str) -> ReadBack:
    """The resource is held by ``token`` until at least ``want`` (``extend_resource``), and
    the holder is current (a stale one is a lease of the paper's agent)."""
    return lambda it: (
        it.get("holder") == token
        and it.get("hver", it.get("version")) == it.get("version")
        and _at_least(it.get("lease_expires"), want)
    )


def map_extended_to(token: str | None, want: str) -> ReadBack:
    """The mapping names ``token`` until at least ``want`` (``map_extend``)."""
    return lambda it: it.get("token") == token and _at_least(it.get("exp"), want)


def _at_least(v: Value | None, want: str) -> bool:
    return isinstance(v, str) and v >= want


def read_back(w: Write, cur: dict[str, Value] | None, mine: ReadBack) -> bool | None:
    """What an item read back (strongly consistent) says of ``w``, an attempt of which may
    have applied and whose answers were lost or whose retry's condition failed: True when
    it carries the write (``mine``); False only when it proves the write never applied and
    never will; None when it cannot tell (the write may have applied and been written over
    since: another daemon served it, a job released it).

    The proof: ``w`` moves a version attribute from ``n`` to ``n + 1``, conditioned on
    ``n``, and the item shows ``n + 1`` without our write. Every write of a version
    attribute is such a move or an atomic increment, so exactly one write takes an item
    from ``n`` to ``n + 1``: another one did, and ours, conditioned on ``n``, never can."""
    if cur is not None and mine(cur):
        return True
    if cur is None:
        return None
    for c in w.conds:
        if c.attr not in ("ver", "version"):
            continue
        was = 0 if c.op == "not_exists" else c.value if c.op == "=" else None
        if not isinstance(was, int):
            continue
        if (c.attr, was + 1) in w.set and cur.get(c.attr) == was + 1:
            return False
    return None
