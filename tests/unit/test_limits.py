"""Load-shedding guards: token buckets, the in-flight gate, the circuit breaker (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rasd.limits import BucketTable, CircuitBreaker, ConnectionLimits, InflightGate, TokenBucket

SLACK = 1e-5  # tokens; covers the float slack the bucket grants per take


# ---------------------------------------------------------------------------- token bucket
def test_bucket_starts_full_then_refuses_with_retry_after() -> None:
    """A new bucket allows a burst, then refuses and says when a token will be back."""
    b = TokenBucket(rate=10.0, burst=3, now=100.0)
    assert [b.try_take(100.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert b.try_take(100.0) == pytest.approx(0.1)
    assert b.try_take(100.05) == pytest.approx(0.05)
    assert b.try_take(100.1) == 0.0


def test_bucket_refill_is_capped_at_burst() -> None:
    """Idle time saves up at most `burst` tokens, however long the idle spell."""
    b = TokenBucket(rate=1.0, burst=2, now=0.0)
    assert b.try_take(0.0) == 0.0
    granted = sum(b.try_take(1_000.0) == 0.0 for _ in range(10))
    assert granted == 2


def test_bucket_ignores_time_going_backwards() -> None:
    """An older `now` (callers racing on a clock read) neither refills nor breaks the bucket."""
    b = TokenBucket(rate=1.0, burst=1, now=10.0)
    assert b.try_take(10.0) == 0.0
    assert b.try_take(5.0) > 0
    assert b.try_take(11.0) == 0.0


def test_bucket_cost_and_validation() -> None:
    """Costs above 1 take several tokens; impossible costs and bad parameters raise."""
    b = TokenBucket(rate=2.0, burst=4, now=0.0)
    assert b.try_take(0.0, cost=3) == 0.0
    assert b.try_take(0.0, cost=3) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        b.try_take(0.0, cost=5)
    for rate, burst in [(0.0, 1), (-1.0, 1), (1.0, 0.5), (float("inf"), 1)]:
        with pytest.raises(ValueError):
            TokenBucket(rate, burst, 0.0)


steps = st.lists(
    st.tuples(st.floats(min_value=0.0, max_value=5.0), st.sampled_from([1.0, 1.0, 2.0, 0.5])),
    max_size=200,
)


@pytest.mark.property
@settings(max_examples=300, deadline=None)
@given(
    rate=st.floats(min_value=0.01, max_value=1000.0),
    burst=st.integers(min_value=2, max_value=100),
    start=st.floats(min_value=0.0, max_value=1e5),
    steps=steps,
)
def test_bucket_never_grants_more_than_burst_plus_rate_times_elapsed(
    rate: float, burst: int, start: float, steps: list[tuple[float, float]]
) -> None:
    """The rate limit's promise: over any span, tokens granted <= burst + rate * elapsed."""
    b = TokenBucket(rate, burst, start)
    now, granted = start, 0.0
    for dt, cost in steps:
        now += dt
        if b.try_take(now, cost) == 0.0:
            granted += cost
        assert granted <= burst + rate * (now - start) + SLACK * (1 + granted)


@pytest.mark.property
@settings(max_examples=300, deadline=None)
@given(
    rate=st.floats(min_value=0.01, max_value=1000.0),
    burst=st.integers(min_value=1, max_value=50),
    start=st.floats(min_value=0.0, max_value=1e5),
    steps=steps,
)
def test_bucket_retry_after_is_honest(
    rate: float, burst: int, start: float, steps: list[tuple[float, float]]
) -> None:
    """A refused caller that waits exactly retry-after (and nobody else takes) gets in:
    BUSY's retry_after never sends a client back too early to succeed."""
    b = TokenBucket(rate, burst, start)
    now = start
    for dt, cost in steps:
        now += dt
        wait = b.try_take(now, min(cost, burst))
        if wait > 0:
            assert b.try_take(now + wait, min(cost, burst)) == 0.0
            now += wait


def test_bucket_table_keys_are_independent() -> None:
    """One (client, pool) exhausting its bucket does not limit another."""
    t: BucketTable[tuple[str, str]] = BucketTable(rate=1.0, burst=1)
    assert t.try_take(("a", "p"), 0.0) == 0.0
    assert t.try_take(("a", "p"), 0.0) > 0
    assert t.try_take(("b", "p"), 0.0) == 0.0


def test_bucket_table_is_bounded_and_evicts_least_recent() -> None:
    """The table never exceeds max_size; the least recently used bucket goes first."""
    t: BucketTable[str] = BucketTable(rate=1.0, burst=1, max_size=3)
    for k in "abc":
        t.try_take(k, 0.0)
    t.try_take("a", 0.0)  # a is now the most recent
    t.try_take("d", 0.0)
    assert len(t) == 3
    assert t.evicted == 1
    assert t.try_take("a", 0.0) > 0  # a kept its (empty) bucket
    assert t.try_take("b", 0.0) == 0.0  # b was evicted: it starts full again


def test_bucket_table_sweeps_idle_buckets_before_evicting_busy_ones() -> None:
    """A bucket that refilled completely equals a new one: those are dropped first, so a
    full table does not evict a key that is still being limited."""
    t: BucketTable[str] = BucketTable(rate=1.0, burst=1, max_size=2)
    t.try_take("idle", 0.0)
    t.try_take("busy", 5.0)
    t.try_take("new", 5.5)  # idle is full again since t=1.0: swept, not counted as evicted
    assert t.evicted == 0
    assert len(t) == 2
    assert t.try_take("busy", 5.5) > 0
    assert t.sweep(100.0) == 2
    assert len(t) == 0


# -------------------------------------------------------------------------- in-flight gate
def test_gate_refuses_at_once_when_full_and_reopens_on_leave() -> None:
    """No queue: the (limit+1)-th concurrent request is refused immediately."""
    g = InflightGate(2)
    assert g.try_enter(deadline=10.0, now=0.0)
    assert g.try_enter(deadline=10.0, now=0.0)
    assert not g.try_enter(deadline=10.0, now=0.0)
    assert g.refused_full == 1
    g.leave(0.01)
    assert g.try_enter(deadline=10.0, now=0.0)
    assert g.inflight == 2


def test_gate_refuses_work_that_cannot_meet_its_deadline() -> None:
    """With recent service time ~100 ms, a request with 50 ms left is refused up front
    instead of spending a DynamoDB slot on an answer nobody will read."""
    g = InflightGate(10, alpha=1.0)
    assert g.try_enter(deadline=1.0, now=0.0)
    g.leave(0.1)
    assert g.try_enter(deadline=10.0, now=0.0)  # one in flight, plenty of time
    assert not g.try_enter(deadline=0.05, now=0.0)
    assert g.try_enter(deadline=0.15, now=0.0)
    assert not g.try_enter(deadline=0.15, now=0.0, expected_cost=2.0)
    assert g.refused_deadline == 2


def test_gate_refuses_a_deadline_already_passed() -> None:
    """A request whose deadline passed is never admitted, even to an idle gate."""
    g = InflightGate(1)
    assert not g.try_enter(deadline=5.0, now=5.0)


def test_gate_recovers_after_a_slow_spell() -> None:
    """After DynamoDB was slow the estimate is high; an idle gate still admits one request,
    whose fast service time pulls the estimate back down: shedding does not become
    permanent for lack of samples."""
    g = InflightGate(10, alpha=0.5)
    assert g.try_enter(deadline=100.0, now=0.0)
    g.leave(5.0)  # estimate 2.5 s
    assert g.try_enter(deadline=0.5, now=0.0)  # idle: admitted as a probe
    assert not g.try_enter(deadline=0.5, now=0.0)  # busy and hopeless: refused
    g.leave(0.01)
    for _ in range(10):
        assert g.try_enter(deadline=0.5, now=0.0)
        g.leave(0.01)
    assert g.service_ewma < 0.05
    assert g.try_enter(deadline=0.5, now=0.0)
    assert g.try_enter(deadline=0.5, now=0.0)


def test_gate_leave_without_enter_is_a_bug() -> None:
    """Unbalanced leave() would silently raise the limit; it raises instead."""
    with pytest.raises(RuntimeError):
        InflightGate(1).leave(0.1)


@pytest.mark.property
@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), max_size=300), st.integers(min_value=1, max_value=8))
def test_gate_never_exceeds_limit(ops: list[bool], limit: int) -> None:
    """Whatever the interleaving of arrivals and completions, inflight stays in [0, limit]."""
    g = InflightGate(limit)
    for enter in ops:
        if enter:
            g.try_enter(deadline=1.0, now=0.0)
        elif g.inflight:
            g.leave(0.001)
        assert 0 <= g.inflight <= limit


# ------------------------------------------------------------------------- circuit breaker
def test_breaker_opens_after_threshold_failures_in_window() -> None:
    """N failures within the window (no success between) open the circuit: calls fail fast."""
    cb = CircuitBreaker(failure_threshold=3, window=10.0, cooldown=5.0)
    for t in (0.0, 1.0):
        assert cb.allow(t)
        cb.record_failure(t)
    assert cb.state == "closed"
    cb.record_failure(2.0)
    assert cb.state == "open"
    assert not cb.allow(2.1)
    assert cb.retry_after(3.0) == pytest.approx(4.0)
    assert cb.opened == 1


def test_breaker_failures_outside_window_do_not_count() -> None:
    """Scattered failures (one every few minutes) never open the circuit."""
    cb = CircuitBreaker(failure_threshold=3, window=10.0, cooldown=5.0)
    for t in range(0, 100, 6):
        cb.record_failure(float(t))
    assert cb.state == "closed"


def test_breaker_success_resets_the_count() -> None:
    """Partial service keeps the circuit closed: a success clears earlier failures."""
    cb = CircuitBreaker(failure_threshold=2, window=10.0, cooldown=5.0)
    cb.record_failure(0.0)
    cb.record_success(0.5)
    cb.record_failure(1.0)
    assert cb.state == "closed"


def test_breaker_half_open_lets_exactly_one_probe() -> None:
    """After the cooldown one call probes the dependency; the others still fail fast."""
    cb = CircuitBreaker(failure_threshold=1, window=10.0, cooldown=5.0)
    cb.record_failure(0.0)
    assert not cb.allow(4.9)
    assert cb.allow(5.0)
    assert cb.state == "half_open"
    assert not cb.allow(5.0)
    assert not cb.allow(6.0)


def test_breaker_probe_success_closes_without_anyone_acting() -> None:
    """Recovery needs nobody: the probe's success closes the circuit by itself."""
    cb = CircuitBreaker(failure_threshold=1, window=10.0, cooldown=5.0)
    cb.record_failure(0.0)
    assert cb.allow(5.0)
    cb.record_success(5.1)
    assert cb.state == "closed"
    assert all(cb.allow(5.2) for _ in range(5))


def test_breaker_probe_failure_reopens_for_another_cooldown() -> None:
    """A failed probe re-opens the circuit from the probe's time."""
    cb = CircuitBreaker(failure_threshold=1, window=10.0, cooldown=5.0)
    cb.record_failure(0.0)
    assert cb.allow(5.0)
    cb.record_failure(5.5)
    assert cb.state == "open"
    assert not cb.allow(10.0)
    assert cb.allow(10.5)
    assert cb.opened == 2


def test_breaker_abandoned_probe_is_replaced() -> None:
    """A probe whose caller never reported (cancelled) cannot leave the breaker stuck
    half-open: another probe goes after a cooldown."""
    cb = CircuitBreaker(failure_threshold=1, window=10.0, cooldown=5.0)
    cb.record_failure(0.0)
    assert cb.allow(5.0)
    assert not cb.allow(9.9)
    assert cb.allow(10.0)


def test_breaker_ignores_late_reports_while_open() -> None:
    """Outcomes of calls started before the circuit opened neither close it early nor
    extend the cooldown."""
    cb = CircuitBreaker(failure_threshold=1, window=10.0, cooldown=5.0)
    cb.record_failure(0.0)
    cb.record_success(1.0)
    cb.record_failure(4.0)
    assert cb.state == "open"
    assert cb.allow(5.0)


def test_limits_reprs_are_informative() -> None:
    """Failures print the state that matters."""
    assert "tokens=" in repr(TokenBucket(1.0, 1, 0.0))
    assert "0/3" in repr(InflightGate(3))
    assert "closed" in repr(CircuitBreaker(1, 1.0, 1.0))
    assert "size=0/10" in repr(BucketTable(1.0, 1, max_size=10))


# ------------------------------------------------------------------------ callers' connections
def test_connection_limits_per_process_per_uid_and_in_all() -> None:
    lim = ConnectionLimits(per_process=2, per_uid=3, total=5, max_buffered=100, ungranted=1)
    assert [lim.admit(10, 1000, True) for _ in range(3)] == [None, None, "process"]
    assert lim.admit(11, 1000, True) is None  # another process of the uid
    assert lim.admit(12, 1000, True) == "uid"  # the uid's third
    assert lim.admit(20, 2000, False) is None  # a uid granted nothing: one, then no more
    assert lim.admit(21, 2000, False) == "no_grant"
    assert lim.admit(30, 3000, True) is None
    assert lim.open == 5
    assert lim.admit(31, 3001, True) == "total"
    lim.release(10, 1000)
    assert lim.admit(31, 3001, True) is None  # a slot freed is a slot again
    for pid, uid in ((10, 1000), (11, 1000), (20, 2000), (30, 3000), (31, 3001)):
        lim.release(pid, uid)
    assert lim.open == 0 and lim.by_pid == {} and lim.by_uid == {}


def test_connection_limits_bound_the_half_received_bytes() -> None:
    lim = ConnectionLimits(per_process=2, per_uid=2, total=2, max_buffered=100)
    assert lim.hold(0, 60)
    assert not lim.hold(0, 50)  # 110 in all: the second holder is to be closed
    assert lim.hold(50, 0) and lim.buffered == 60  # ... and its bytes let go
    assert lim.hold(60, 100) and lim.buffered == 100  # at the bound is within it
    assert lim.hold(100, 0) and lim.buffered == 0
    with pytest.raises(ValueError):
        ConnectionLimits(per_process=0, per_uid=1, total=1, max_buffered=1)
