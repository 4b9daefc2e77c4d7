"""Claims answered by one daemon while another frees them as if nobody had been answered.

Two races found from outside (the evidence scripts ``ambiguous_acquire_vs_release`` and
``strict_withdraw_vs_local_fallback``), replayed deterministically with real daemons' roles
on one FakeClock, the real ``rasadmin`` and ``ras-liberator``, against moto's server, in both
modes of the table's rollout record. Each asks I1: the claim a second daemon answered to k1
(until t0+1h) must not be served to another key while that answer runs, so it must not be
claimable before the answer's end plus the clock-skew grace, whoever frees it and however.

Each test first checks that its interleaving happened as described (where the mode lets it
be built), so it cannot pass because the race was missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import threading
import time
from typing import Any

import pytest
import structlog
from botocore.exceptions import ReadTimeoutError

from rasd.core import lease as lease_items
from rasd.core import schema
from rasd.core.errors import RasdError
from rasd.daemon.coordinator import Coordinator
from rasd_jobs.admin import cli as admin_cli
from tests.doubles.clock import FakeClock
from tests.doubles.store import FAKE_ENDPOINT
from tests.helpers.hooked import Hooked
from tests.helpers.races import (
    MODES,
    WAIT,
    close,
    dead_endpoint,
    error_code,
    mapping,
    names,
    noted,
    probe_second_key,
    removed,
    set_mode,
    settle,
    start,
)

pytestmark = pytest.mark.integration

C, P = "demo", "default"
EAST, WEST = "us-east-1", "eu-west-1"
HOUR = 3600 * lease_items.US


@pytest.fixture(autouse=True)
def _one_table_for_all_regions(monkeypatch: pytest.MonkeyPatch) -> Any:
    """AWS_REGION pins every client to moto's us-east-1: the one table stands in for the
    global table whatever RAS region a daemon or job manages. The jobs configure structlog:
    put it back."""
    monkeypatch.setenv("AWS_REGION", EAST)
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def _clock() -> FakeClock:
    return FakeClock(now_us=int(time.time() * lease_items.US), mono=time.monotonic())


# ------------------------------------------ an ambiguous acquisition whose mapping is released
R = "r0"


def _is_map_acquire(kw: dict[str, Any]) -> bool:
    """map_builders.map_acquire of k1's mapping (it SETs ``since``)."""
    return kw["Key"]["client_id"]["S"].startswith(
        lease_items.map_pk(C, P, "k1")
    ) and "since" in names(kw)


def _is_claim(kw: dict[str, Any]) -> bool:
    """builders.claim of r0: SETs the holder and the mapping's version."""
    return (
        kw["Key"]["resource"]["S"] == R
        and "holder" in names(kw)
        and "holder" not in removed(kw)
        and "mver" in names(kw)
    )


def _is_free_claim(kw: dict[str, Any]) -> bool:
    """builders.free_claim of r0: REMOVEs the holder, SETs when it is claimable."""
    return (
        kw["Key"]["resource"]["S"] == R
        and "holder" in removed(kw)
        and bool(names(kw) & {"lease_available", "quarantine_until"})
        and "hold_until" not in names(kw)
    )


class _AdminClient:
    """rasadmin's boto3 client: every call real; once its map_release applied it says so,
    and its free_claim of r0 goes out only once the acquiring daemon has settled (a slow
    link, a botocore retry after a throttle)."""

    def __init__(
        self, inner: Any, released: threading.Event, d1_settled: threading.Event, seen: list[str]
    ) -> None:
        self._inner, self._released, self._d1_settled = inner, released, d1_settled
        self._seen = seen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def update_item(self, **kw: Any) -> Any:
        if kw["Key"]["client_id"]["S"].startswith("#map#") and "state" in names(kw):
            out = self._inner.update_item(**kw)
            self._seen.append("rasadmin map_release applied")
            self._released.set()
            return out
        if _is_free_claim(kw):
            self._d1_settled.wait(WAIT)
            try:
                out = self._inner.update_item(**kw)
                self._seen.append("rasadmin free_claim applied")
                return out
            except Exception as exc:
                self._seen.append(f"rasadmin free_claim -> {error_code(exc)}")
                raise
        return self._inner.update_item(**kw)


@pytest.mark.parametrize("mode", MODES)
async def test_an_ambiguous_acquisition_released_meanwhile_keeps_what_was_answered(
    moto_endpoint: str, ddb: Any, table: str, mode: str
) -> None:
    """d1 asks for k1: its map_acquire applies but the reply is lost; its claim of r0
    applies (fast rules: sent with the mapping write). Before d1's store retries, d2 answers
    k1 -> r0 until t0+1h from d1's pending mapping (the claim landed) and confirms it, and
    ``rasadmin release-resource r0`` releases k1's mapping (its free_claim of r0, held to
    the lease's end, is slow on the wire). d1's retry is refused (the version moved). Whatever
    d1 then makes of its claim, r0 must stay unclaimable until t0+1h plus the skew.

    In rollout mode the claim is sent only once the mapping write's outcome is known, so the
    race cannot be built: the lost reply is injected, the claim follows its resolution."""
    set_mode(ddb, moto_endpoint, table, mode)
    schema.put_pool(ddb, table, C, P, 7200)
    clock = _clock()
    t0 = clock.now_us()
    schema.add_resources(ddb, table, C, P, EAST, [R], now_us=t0 - 60 * lease_items.US)
    seen: list[str] = []  # the steps, in the order they happened
    answers: list[lease_items.Lease] = []  # what k1 was answered, by either daemon
    claim_applied = asyncio.Event()
    # moved: rasadmin released k1's mapping, or returned without (nothing to release)
    moved, d1_settled = threading.Event(), threading.Event()
    admin_out: list[str] = []
    threads: list[threading.Thread] = []
    daemons: list[Coordinator] = []

    def run_admin() -> None:
        args = admin_cli.build_parser().parse_args(
            ["release-resource", "--client", C, "--resource", R, "--endpoint-url",
             moto_endpoint, "--table", table, "--region", EAST, "--now",
             str(clock.now_us() / lease_items.US)]
        )  # fmt: skip
        buf = io.StringIO()
        try:
            with contextlib.redirect_stdout(buf):
                rc = args.func(_AdminClient(ddb, moved, d1_settled, seen), args)
            admin_out.append(f"rc={rc} {buf.getvalue().strip()}")
        except Exception as exc:  # noqa: BLE001 (a JobError the CLI would print)
            admin_out.append(f"raised {exc!r}")
        finally:
            moved.set()

    try:
        d1 = await start(moto_endpoint, table, "d1", clock, EAST, mode=mode)
        daemons.append(d1)
        d2 = await start(moto_endpoint, table, "d2", clock, EAST, mode=mode)
        daemons.append(d2)
        acquires = 0

        async def hook(name: str, kw: dict[str, Any], real: Any) -> Any:
            nonlocal acquires
            if name != "update_item":
                return await real(**kw)
            if _is_map_acquire(kw):
                acquires += 1
                if acquires > 1:  # the store's retry of the same write
                    return await noted(seen, "d1 map_acquire retry", real(**kw))
                out = await real(**kw)
                seen.append("d1 map_acquire applied, reply lost")
                if mode == "fast":  # the claim was sent with it
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(claim_applied.wait(), WAIT)
                # d2, of the same region, is asked for k1 meanwhile (in rollout mode it
                # waits for d1's pending mapping until its deadline: keep that short)
                wait = WAIT if mode == "fast" else 1.5
                try:
                    lease, _ = await d2.acquirer.get_lease(
                        C, P, "k1", clock.now_us() + HOUR, time.monotonic() + wait
                    )
                    answers.append(lease)
                    seen.append(f"d2 answered k1 {lease.resource}")
                except RasdError as exc:
                    seen.append(f"d2 did not answer k1 ({type(exc).__name__})")
                await settle(d2)  # its confirmation landed
                th = threading.Thread(target=run_admin, name="rasadmin")
                th.start()
                threads.append(th)
                await asyncio.to_thread(moved.wait, WAIT)
                seen.append("d1 map_acquire reply lost")
                raise ReadTimeoutError(endpoint_url=FAKE_ENDPOINT)  # the reply never comes
            if _is_claim(kw):
                seen.append("d1 claim sent")
                out = await noted(seen, "d1 claim", real(**kw))
                claim_applied.set()
                return out
            if _is_free_claim(kw):
                return await noted(seen, "d1 free_claim", real(**kw))
            return await real(**kw)

        d1.store.wrap_client(lambda inner: Hooked(inner, hook))
        try:
            lease, _ = await d1.acquirer.get_lease(
                C, P, "k1", t0 + HOUR, time.monotonic() + 2 * WAIT
            )
            answers.append(lease)
            seen.append(f"d1 answered k1 {lease.resource}")
        except RasdError as exc:
            seen.append(f"d1 did not answer k1 ({type(exc).__name__})")
        await settle(d1)
        d1_settled.set()
        for th in threads:
            await asyncio.to_thread(th.join, WAIT)
            assert not th.is_alive(), "rasadmin release-resource did not return"
        story = f"steps: {seen}; rasadmin: {admin_out}"

        # the interleaving happened
        if mode == "fast":
            for step in (
                "d1 map_acquire applied, reply lost",
                "d1 claim applied",
                f"d2 answered k1 {R}",
                "rasadmin map_release applied",
            ):
                assert step in seen, f"not reached: {step!r}; {story}"
            assert any(s.startswith("d1 map_acquire retry refused") for s in seen), story
            lost = seen.index("d1 map_acquire reply lost")
            assert seen.index("d1 claim applied") < lost, story
            assert seen.index(f"d2 answered k1 {R}") < lost, story
        else:
            assert "d1 map_acquire applied, reply lost" in seen, story
            # the race cannot be built: the claim waits for the mapping write's outcome
            assert "d1 claim sent" not in seen[: seen.index("d1 map_acquire reply lost")], story
        ends = max((a.expires_us for a in answers if a.resource == R), default=None)
        assert ends is not None, f"nobody answered k1 {R}: {story}"

        # I1: r0 is not served to k2 while k1's answer runs, nor claimable before its end + skew
        probe = await probe_second_key(
            ddb, moto_endpoint, table, clock, R, ends, t0, EAST, mode=mode
        )
        probe.check(story)
    finally:
        d1_settled.set()
        for th in threads:
            await asyncio.to_thread(th.join, WAIT)
        await close(*daemons)


# ----------------------------- a strict pool's withdrawn claim, answered by the local fallback
PS = "strict"
HOME = EAST


def _lagging_replica(d: Coordinator, hide_region: str) -> None:
    """``d``'s mapping Query does not show ``hide_region``'s mapping (replication lag)."""
    real = d.store.query_mappings

    async def query_mappings(client_id: str, pool_id: str, key: str, deadline: float) -> Any:
        ms = await real(client_id, pool_id, key, deadline)
        return [m for m in ms if m.region != hide_region]

    d.store.query_mappings = query_mappings  # type: ignore[method-assign]


async def held_until(event: asyncio.Event) -> float:
    """Hold a write back until ``event``: the seconds it waited, which the write gets on top
    of its deadline (the hold stands for a slow network before the request goes out; under
    load the wait can take all of a background program's 5 s, and the write then ended
    UNKNOWN for want of time, not of what the test orders)."""
    t0 = time.monotonic()
    await asyncio.wait_for(event.wait(), WAIT)
    return time.monotonic() - t0


@pytest.mark.parametrize("mode", MODES)
async def test_a_withdrawn_strict_claim_answered_by_the_local_fallback_is_held_to_its_end(
    moto_endpoint: str, ddb: Any, table: str, mode: str
) -> None:
    """A strict pool (home us-east-1). dH (home) leases k1 -> rh; the agreement names it.
    dA (eu-west-1; its replica does not show us-east-1's mapping yet) asks for k1: it claims
    re, loses the agreement to rh, answers rh and withdraws its claim of re in the
    background, slowly. dB (eu-west-1, ``strict_home_down = "local"``, its link to the home
    region down, the same replica view) asks for k1: it finds dA's pending mapping and
    claim, cannot reach the home region and answers re until t0+1h by the fallback; its
    confirmation is slow. dA's withdrawal then drops the mapping and frees re. Nobody released
    dB's answer: re must stay unclaimable until t0+1h plus the skew.

    In rollout mode a strict pool is not strict (no agreement beside the paper's agent): no
    withdrawal; dB answers k1 the same re dA did, which must stay k1's."""
    set_mode(ddb, moto_endpoint, table, mode)
    clock = _clock()
    t0 = clock.now_us()
    schema.put_pool(ddb, table, C, PS, 7200, home=HOME)
    schema.add_resources(ddb, table, C, PS, EAST, ["rh"], now_us=t0 - 60 * lease_items.US)
    schema.add_resources(ddb, table, C, PS, WEST, ["re"], now_us=t0 - 60 * lease_items.US)
    peers = {HOME: moto_endpoint}
    seen: list[str] = []
    b_answered, a_done = asyncio.Event(), asyncio.Event()
    daemons: list[Coordinator] = []
    try:
        dH = await start(moto_endpoint, table, "dH", clock, EAST, mode=mode)
        daemons.append(dH)
        dA = await start(moto_endpoint, table, "dA", clock, WEST, mode=mode, peer_endpoints=peers)
        daemons.append(dA)
        dB = await start(
            moto_endpoint, table, "dB", clock, WEST, mode=mode, strict_home_down="local",
            peer_endpoints={HOME: dead_endpoint()},
        )  # fmt: skip
        daemons.append(dB)
        home_of = dA.driver.steps_daemon().home_of(C, PS)
        assert home_of == (HOME if mode == "fast" else None)
        lh, _ = await dH.acquirer.get_lease(C, PS, "k1", t0 + HOUR, time.monotonic() + WAIT)
        await settle(dH)
        assert lh.resource == "rh"
        _lagging_replica(dA, EAST)
        _lagging_replica(dB, EAST)
        real_a, real_b = dA.store.write, dB.store.write

        async def write_a(w: Any, deadline: float, mine: Any = None) -> Any:
            if w.kind == "map_drop_dead":  # the withdrawal: slow, until dB has answered
                deadline += await held_until(b_answered)
                res = await real_a(w, deadline, mine)
                seen.append(f"dA withdraw map_drop_dead {res.outcome.value}")
                a_done.set()
                return res
            if w.kind == "free_claim":
                res = await real_a(w, deadline, mine)
                seen.append(f"dA free_claim({w.key[1]}) {res.outcome.value}")
                return res
            return await real_a(w, deadline, mine)

        async def write_b(w: Any, deadline: float, mine: Any = None) -> Any:
            if w.kind == "map_confirm" and mode == "fast":  # slow, until dA has withdrawn
                deadline += await held_until(a_done)
                res = await real_b(w, deadline, mine)
                seen.append(f"dB map_confirm {res.outcome.value}")
                return res
            return await real_b(w, deadline, mine)

        dA.store.write = write_a  # type: ignore[method-assign]
        dB.store.write = write_b  # type: ignore[method-assign]
        la, _ = await dA.acquirer.get_lease(
            C, PS, "k1", clock.now_us() + HOUR, time.monotonic() + WAIT
        )
        seen.append(f"dA answered k1 {la.resource}")
        if mode == "rollout":  # no withdrawal to hold back: dA's confirmation lands first
            await settle(dA)
        lb: lease_items.Lease | None = None
        try:
            lb, _ = await dB.acquirer.get_lease(
                C, PS, "k1", clock.now_us() + HOUR, time.monotonic() + WAIT
            )
            seen.append(f"dB answered k1 {lb.resource}")
        except RasdError as exc:
            seen.append(f"dB did not answer k1 ({type(exc).__name__}: {exc})")
        finally:
            b_answered.set()
        await settle(dA)
        a_done.set()
        await settle(dB)
        m = mapping(ddb, table, "k1", WEST, C, PS) or {}
        story = (
            f"steps: {seen}; k1's {WEST} mapping: state={m.get('state')} ver={m.get('ver')} "
            f"res={m.get('res')}; dA deferred={dA.counters['strict.deferred']}, "
            f"dB fallback={dB.counters['strict.fallback']}"
        )

        # the interleaving happened
        assert lb is not None and lb.resource == "re", story
        if mode == "fast":
            assert la.resource == "rh" and dA.counters["strict.deferred"] == 1, story
            assert dB.counters["strict.fallback"] == 1, story
            assert "dA withdraw map_drop_dead applied" in seen, story
            assert seen.index("dB answered k1 re") < seen.index(
                "dA withdraw map_drop_dead applied"
            ), story

        # I1: re is not served to k2 while dB's answer runs, nor claimable before its end + skew
        probe = await probe_second_key(
            ddb, moto_endpoint, table, clock, "re", lb.expires_us, t0, WEST, mode=mode,
            pool_id=PS, peer_endpoints=peers,
        )  # fmt: skip
        probe.check(story)
    finally:
        b_answered.set()
        a_done.set()
        await close(*daemons)
