"""Load shedding: say no at once instead of queueing work that will miss its deadline.

:class:`TokenBucket` / :class:`BucketTable` (request rates), :class:`InflightGate`
(concurrent DynamoDB work, no queue), :class:`CircuitBreaker` (fail fast while DynamoDB
fails), :class:`ConnectionLimits` (connections and half-received bytes). Pure: monotonic time
passed in. docs/operations.md, "Load shedding and limits".
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Hashable
from typing import Generic, Literal, TypeVar

K = TypeVar("K", bound=Hashable)

#: Float slack so that waiting exactly the advertised retry-after always succeeds.
_EPS = 1e-6


# ---------------------------------------------------------------------------- token bucket
class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up; starts full at ``now``."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if not rate > 0 or not math.isfinite(rate):
            raise ValueError(f"rate must be > 0, got {rate!r}")
        if not burst >= 1 or not math.isfinite(burst):
            raise ValueError(f"burst must be >= 1, got {burst!r}")
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = now

    def _refill(self, now: float) -> None:
        if now > self.stamp:  # time never runs backwards here: an older `now` adds nothing
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now

    def try_take(self, now: float, cost: float = 1.0) -> float:
        """0.0 if ``cost`` tokens were taken; else the seconds until they would be there."""
        if cost > self.burst:
            raise ValueError(f"cost {cost} can never fit a burst of {self.burst}")
        self._refill(now)
        if self.tokens + _EPS >= cost:
            self.tokens = max(0.0, self.tokens - cost)
            return 0.0
        return (cost - self.tokens) / self.rate

    def full_at(self) -> float:
        """When the bucket is full again if nobody takes: from then on it equals a new one."""
        return self.stamp + (self.burst - self.tokens) / self.rate

    def __repr__(self) -> str:
        return f"TokenBucket(rate={self.rate}, burst={self.burst}, tokens={self.tokens:.3f})"


class BucketTable(Generic[K]):
    """One :class:`TokenBucket` per key (``(client_id, pool_id)``), at most ``max_size``.

    Buckets are kept in least-recently-used order. A bucket idle long enough to be full again
    is exactly a new bucket, so dropping it loses nothing: :meth:`sweep` does that. When the
    table is full anyway, the least recently used bucket is dropped, which can only make the
    limit more lenient for that key (it starts full), never stricter. Check the pool exists
    before calling :meth:`try_take`, so keys come from defined pools, not from callers.
    """

    __slots__ = ("_buckets", "burst", "evicted", "max_size", "rate")

    def __init__(self, rate: float, burst: float, max_size: int = 10_000) -> None:
        if max_size < 1:
            raise ValueError("max_size must be >= 1")
        TokenBucket(rate, burst, 0.0)  # validates rate and burst
        self.rate = rate
        self.burst = burst
        self.max_size = max_size
        self.evicted = 0
        self._buckets: OrderedDict[K, TokenBucket] = OrderedDict()

    def try_take(self, key: K, now: float, cost: float = 1.0) -> float:
        """As :meth:`TokenBucket.try_take`, for ``key``'s bucket (created full on first use)."""
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_size:
                self.sweep(now)
                while len(self._buckets) >= self.max_size:
                    self._buckets.popitem(last=False)
                    self.evicted += 1
            bucket = self._buckets[key] = TokenBucket(self.rate, self.burst, now)
        else:
            self._buckets.move_to_end(key)
        return bucket.try_take(now, cost)

    def sweep(self, now: float) -> int:
        """Drop buckets that are full again (idle); returns how many. Cheap to call often:
        it walks from the least recently used end and stops at the first busy bucket."""
        dropped = 0
        while self._buckets:
            key, bucket = next(iter(self._buckets.items()))
            if bucket.full_at() > now:
                break
            del self._buckets[key]
            dropped += 1
        return dropped

    def __len__(self) -> int:
        return len(self._buckets)

    def __repr__(self) -> str:
        return (
            f"BucketTable(rate={self.rate}, burst={self.burst}, "
            f"size={len(self._buckets)}/{self.max_size}, evicted={self.evicted})"
        )


# ---------------------------------------------------------------------------- in-flight gate
class InflightGate:
    """At most ``limit`` requests doing DynamoDB work at once; refuse rather than queue.

    ``service_ewma`` is an exponentially weighted mean of how long recent requests held a
    slot (seconds), fed by :meth:`leave`. :meth:`try_enter` refuses when the gate is full, when
    the deadline has passed, or when ``now + expected_cost * service_ewma`` is past the
    deadline. ``expected_cost`` is in units of "a typical request" (1.0). When nothing is in
    flight a request is always let in (if its deadline has not passed), so an estimate
    inflated by a bad spell is corrected by fresh samples instead of shedding forever.

    Every True from :meth:`try_enter` must be matched by exactly one :meth:`leave`
    (use ``try/finally``), also on errors: a slow failure is service time too.
    """

    __slots__ = ("alpha", "inflight", "limit", "refused_deadline", "refused_full", "service_ewma")

    def __init__(self, limit: int, *, alpha: float = 0.2, initial_service: float = 0.0) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        if not 0.0 < alpha <= 1.0:
            raise ValueError("alpha must be in (0, 1]")
        self.limit = limit
        self.alpha = alpha
        self.service_ewma = initial_service
        self.inflight = 0
        self.refused_full = 0
        self.refused_deadline = 0

    def try_enter(self, deadline: float, now: float, expected_cost: float = 1.0) -> bool:
        if self.inflight >= self.limit:
            self.refused_full += 1
            return False
        if now >= deadline or (
            self.inflight > 0 and now + expected_cost * self.service_ewma > deadline
        ):
            self.refused_deadline += 1
            return False
        self.inflight += 1
        return True

    def set_limit(self, limit: int) -> None:
        """A new limit (a reload): requests in flight past it finish; new ones wait for room."""
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self.limit = limit

    def leave(self, service_time: float) -> None:
        if self.inflight <= 0:
            raise RuntimeError("InflightGate.leave() without a matching try_enter()")
        self.inflight -= 1
        sample = max(0.0, service_time)
        self.service_ewma += self.alpha * (sample - self.service_ewma)

    def __repr__(self) -> str:
        return (
            f"InflightGate({self.inflight}/{self.limit}, service_ewma={self.service_ewma:.4f}s, "
            f"refused_full={self.refused_full}, refused_deadline={self.refused_deadline})"
        )


# --------------------------------------------------------------------------- circuit breaker
State = Literal["closed", "open", "half_open"]


class CircuitBreaker:
    """Closed -> open after ``failure_threshold`` failures within ``window`` seconds with no
    success in between; open -> half-open after ``cooldown``; half-open lets one probe
    through: its success closes the circuit, its failure opens it for another cooldown.

    A success while closed clears the failure count: partial service (some calls failing,
    some not) keeps the circuit closed, and only a run of failures opens it. Failures and
    successes reported while open come from calls started before it opened and are ignored.
    A probe that never reports (its caller was cancelled) is given up on after ``cooldown``
    and another probe is let through, so the breaker cannot stick half-open.

    Every True from :meth:`allow` must be followed by :meth:`record_success` or
    :meth:`record_failure`, except for outcomes that say nothing about the dependency
    (a lost conditional write, a cancelled request).
    """

    __slots__ = (
        "_failures",
        "_opened_at",
        "_probe_at",
        "cooldown",
        "failure_threshold",
        "last_failure",
        "last_success",
        "opened",
        "state",
        "window",
    )

    def __init__(self, failure_threshold: int, window: float, cooldown: float) -> None:
        if failure_threshold < 1:
            raise ValueError("failure_threshold must be >= 1")
        if window <= 0 or cooldown <= 0:
            raise ValueError("window and cooldown must be > 0")
        self.failure_threshold = failure_threshold
        self.window = window
        self.cooldown = cooldown
        self.state: State = "closed"
        #: How many times the circuit opened (for metrics).
        self.opened = 0
        #: when the dependency last answered, and when a call to it last failed (monotonic s)
        self.last_success = -math.inf
        self.last_failure = -math.inf
        self._failures: deque[float] = deque()
        self._opened_at = 0.0
        self._probe_at: float | None = None

    def set_cooldown(self, cooldown: float) -> None:
        """A new cooldown, read live: an open circuit stays open that long from when it opened."""
        if cooldown <= 0:
            raise ValueError("cooldown must be > 0")
        self.cooldown = cooldown

    def allow(self, now: float) -> bool:
        """May a call to the dependency be made now?"""
        if self.state == "closed":
            return True
        if self.state == "open":
            if now < self._opened_at + self.cooldown:
                return False
            self.state = "half_open"
            self._probe_at = None
        # half-open: one probe at a time; an abandoned probe is replaced after a cooldown
        if self._probe_at is None or now >= self._probe_at + self.cooldown:
            self._probe_at = now
            return True
        return False

    def record_success(self, now: float) -> None:
        self.last_success = max(self.last_success, now)
        if self.state == "open":
            return
        self.state = "closed"
        self._failures.clear()
        self._probe_at = None

    def record_failure(self, now: float) -> None:
        self.last_failure = max(self.last_failure, now)
        if self.state == "open":
            return
        if self.state == "half_open":
            self._open(now)
            return
        failures = self._failures
        failures.append(now)
        while failures and failures[0] <= now - self.window:
            failures.popleft()
        if len(failures) >= self.failure_threshold:
            self._open(now)

    def _open(self, now: float) -> None:
        self.state = "open"
        self.opened += 1
        self._opened_at = now
        self._probe_at = None
        self._failures.clear()

    def unreachable(self) -> bool:
        """Is the dependency's last word a failure (or the circuit open): a call now would
        most likely fail too?"""
        return self.state == "open" or self.last_failure > self.last_success

    def retry_after(self, now: float) -> float:
        """Seconds until the next probe may go (0.0 unless open)."""
        if self.state != "open":
            return 0.0
        return max(0.0, self._opened_at + self.cooldown - now)

    def __repr__(self) -> str:
        return (
            f"CircuitBreaker({self.state}, failures={len(self._failures)}/"
            f"{self.failure_threshold} in {self.window}s, cooldown={self.cooldown}s)"
        )


# ------------------------------------------------------------------------ callers' connections
Refusal = Literal["total", "process", "uid", "no_grant"]


class ConnectionLimits:
    """What the daemon's callers may hold open, so that one caller cannot take the others'
    service away: connections per process (SO_PEERCRED's pid), per uid (``ungranted`` for a
    uid the ACL grants nothing: it may still learn why, FORBIDDEN, on a few), and in all
    (below the daemon's file limit, which its DynamoDB connections need too); and bytes held
    in half-received frames, in all.

    :meth:`admit` counts a connection until its :meth:`release`; :meth:`hold` follows one
    connection's buffered bytes and says when the total passed its bound."""

    __slots__ = (
        "buffered",
        "by_pid",
        "by_uid",
        "max_buffered",
        "open",
        "per_process",
        "per_uid",
        "total",
        "ungranted",
    )

    def __init__(
        self, per_process: int, per_uid: int, total: int, max_buffered: int, ungranted: int = 4
    ) -> None:
        if min(per_process, per_uid, total, max_buffered, ungranted) < 1:
            raise ValueError("every connection limit must be >= 1")
        self.per_process = per_process
        self.per_uid = per_uid
        self.total = total
        self.max_buffered = max_buffered
        self.ungranted = ungranted
        self.by_pid: dict[int, int] = {}
        self.by_uid: dict[int, int] = {}
        self.open = 0
        self.buffered = 0

    def admit(self, pid: int, uid: int, granted: bool) -> Refusal | None:
        """None: the connection is admitted (and counted); else the limit it would pass."""
        if self.open >= self.total:
            return "total"
        if self.by_pid.get(pid, 0) >= self.per_process:
            return "process"
        held = self.by_uid.get(uid, 0)
        if held >= self.per_uid:
            return "uid"
        if not granted and held >= self.ungranted:
            return "no_grant"
        self.open += 1
        self.by_pid[pid] = self.by_pid.get(pid, 0) + 1
        self.by_uid[uid] = held + 1
        return None

    def release(self, pid: int, uid: int) -> None:
        """An admitted connection closed."""
        self.open -= 1
        for table, key in ((self.by_pid, pid), (self.by_uid, uid)):
            n = table[key] - 1
            if n:
                table[key] = n
            else:
                del table[key]

    def hold(self, was: int, now: int) -> bool:
        """A connection's half-received bytes went from ``was`` to ``now``: False when the
        total is past ``max_buffered`` and it holds some (it should be closed, and then
        ``hold(now, 0)``)."""
        self.buffered += now - was
        return now == 0 or self.buffered <= self.max_buffered

    def __repr__(self) -> str:
        return (
            f"ConnectionLimits(open={self.open}/{self.total}, processes={len(self.by_pid)}, "
            f"uids={len(self.by_uid)}, buffered={self.buffered}/{self.max_buffered})"
        )
