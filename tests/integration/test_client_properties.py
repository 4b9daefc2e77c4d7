"""A property of the public client API, against a real daemon on moto: whatever a caller passes
to ``get_lease``, ``release`` and ``headroom`` (sync and ``rasd_client.aio``), only
``rasd_client.RasdError``s escape (docs/errors.md), and what returns has the documented type.

Hypothesis draws every argument from valid values and from anything at all: strings (empty,
lone surrogates, 70,000 characters), ints (negative, 10**30, 10**5000), floats (inf, nan),
naive and aware datetimes, timedeltas (max, min), None, bytes, lists, dicts, bools. The
daemon runs in the test's event loop; the calls run in a worker thread (the sync client
blocks; the async one gets its own loop there), as in test_fuzz.py.
"""

from __future__ import annotations

import asyncio
import math
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rasd_client
from rasd_client import aio
from tests.helpers.tables import seed_pool

pytestmark = pytest.mark.integration

C, P = "demo", "default"
EXAMPLES = 120  # per client: a few seconds on a loaded machine


def anything() -> st.SearchStrategy[Any]:
    """Values of every kind a caller might pass by mistake."""
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.integers(min_value=-(10**40), max_value=10**40),
        st.sampled_from([10**30, -(10**30), 10**5000, 2**63, 2**64]),
        st.floats(),
        st.sampled_from([math.inf, -math.inf, math.nan, 1e300, -0.0]),
        st.text(max_size=20),
        st.sampled_from(["", "\ud800", "k\udfff", "k" * 70_000, "é" * 600]),
        st.binary(max_size=20),
        st.datetimes(),
        st.datetimes(timezones=st.timezones()),
        st.timedeltas(),
        st.sampled_from([timedelta.max, timedelta.min, timedelta(0)]),
        st.lists(st.integers(), max_size=3),
        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    )


def mostly(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``valid`` four times in five, else anything: most calls reach the daemon. (Not
    ``st.one_of``, which would flatten anything's many branches beside valid's one.)"""
    bad = anything()
    return st.integers(0, 4).flatmap(lambda i: valid if i else bad)


def names(valid: list[str]) -> st.SearchStrategy[Any]:
    return mostly(
        st.integers(0, 4).flatmap(
            lambda i: st.sampled_from(valid) if i else st.text(min_size=1, max_size=600)
        )
    )


def expiries() -> st.SearchStrategy[Any]:
    now = time.time()
    valid = st.one_of(
        st.just(timedelta(hours=1)),
        st.floats(min_value=now + 60, max_value=now + 7200),
        st.integers(min_value=int(now) + 60, max_value=int(now) + 7200),
        st.just(datetime.now(timezone.utc) + timedelta(minutes=30)),
    )
    refused = st.sampled_from([timedelta(seconds=-5), timedelta(days=400), now - 10])
    return st.integers(0, 9).flatmap(lambda i: refused if i == 0 else mostly(valid))


def timeouts() -> st.SearchStrategy[Any]:
    return mostly(st.one_of(st.floats(min_value=0.001, max_value=5.0), st.sampled_from([1, 60])))


def socket_paths(real: str) -> st.SearchStrategy[Any]:
    """The daemon's socket (given, or from $RASD_SOCKET), or values no socket can be at. Not
    arbitrary strings: a path where no daemon listens is retried by the async client until
    its timeout (up to 60 s), which only slows the test."""
    bad = anything().filter(lambda v: not isinstance(v, (str, bytes)) and v is not None)
    valid = st.sampled_from([real, real, None, "", b""])  # None...: $RASD_SOCKET
    wrong = st.one_of(st.sampled_from(["\ud800", "/s" * 100, "/dev/null/x", b"/dev/null/x"]), bad)
    return st.integers(0, 4).flatmap(lambda i: valid if i else wrong)


def calls(real: str) -> st.SearchStrategy[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    clients, pools = names([C, "other"]), names([P, "nopool"])
    keys = names(["k1", "k2", "k3"])
    kw = st.fixed_dictionaries(
        {}, optional={"timeout": timeouts(), "socket_path": socket_paths(real)}
    )
    return st.one_of(
        st.tuples(st.just("get_lease"), st.tuples(clients, pools, keys, expiries()), kw),
        st.tuples(st.just("release"), st.tuples(clients, pools, keys), kw),
        st.tuples(st.just("headroom"), st.tuples(clients, pools), kw),
    )


RETURNS: dict[str, type] = {"get_lease": rasd_client.Lease, "release": type(None), "headroom": int}
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


async def test_only_rasd_errors_escape_the_public_api(
    ddb: Any, table: str, make_daemon: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_pool(ddb, table, count=5)
    # exhausted_backoff 0: a pool the random calls emptied is read again at the next miss
    async with make_daemon(exhausted_backoff=0.0) as d:
        path = d.cfg.socket
        monkeypatch.setenv("RASD_SOCKET", path)
        codes: dict[str, int] = {}

        def outcome(op: str, got: Any) -> None:
            assert isinstance(got, RETURNS[op]), (op, got)
            codes["ok"] = codes.get("ok", 0) + 1

        def failed(exc: rasd_client.RasdError) -> None:
            codes[exc.code] = codes.get(exc.code, 0) + 1

        @SETTINGS
        @given(call=calls(path))
        def sync_calls(call: tuple[str, tuple[Any, ...], dict[str, Any]]) -> None:
            op, args, kw = call
            try:
                outcome(op, getattr(rasd_client, op)(*args, **kw))
            except rasd_client.RasdError as exc:
                failed(exc)

        await asyncio.to_thread(sync_calls)

        def async_calls() -> None:
            with asyncio.Runner() as runner:

                @SETTINGS
                @given(call=calls(path))
                def one(call: tuple[str, tuple[Any, ...], dict[str, Any]]) -> None:
                    op, args, kw = call
                    try:
                        outcome(op, runner.run(getattr(aio, op)(*args, **kw)))
                    except rasd_client.RasdError as exc:
                        failed(exc)

                one()
                runner.run(aio.close())

        await asyncio.to_thread(async_calls)

        # the calls reached the daemon, and it serves on: a new lease, from a resource added
        # now (the random calls may have leased or quarantined all five)
        assert codes.get("ok", 0) > 0 and codes.get("BAD_REQUEST", 0) > 0, codes
        seed_pool(ddb, table, count=1, prefix="after-")
        lease = await asyncio.to_thread(
            rasd_client.get_lease, C, P, "after", timedelta(hours=1), socket_path=path, timeout=5
        )
        assert lease.resource
