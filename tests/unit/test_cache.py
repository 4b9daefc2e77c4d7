"""The lease cache with an injected clock: entries die at lease end minus the skew margin."""

from __future__ import annotations

from rasd.cache import LeaseCache
from rasd.clock import FakeClock
from rasd.lease import US, Lease


def lease(clock: FakeClock, seconds: float, version: int = 1, resource: str = "r") -> Lease:
    return Lease("c", "p", "k", resource, "us-east-1", clock.now_us() + int(seconds * US), version)


def test_entry_expires_before_lease_by_margin() -> None:
    """A cached lease is never served within skew_margin of its end."""
    clock = FakeClock()
    cache = LeaseCache(clock, 100, 5 * US)
    cache.put(lease(clock, 60))
    clock.advance(54.9)
    assert cache.get(("c", "p", "k")) is not None
    clock.advance(0.2)
    assert cache.get(("c", "p", "k")) is None


def test_lease_inside_margin_is_not_cached() -> None:
    """A lease that is already within the margin is not kept at all."""
    clock = FakeClock()
    cache = LeaseCache(clock, 100, 5 * US)
    cache.put(lease(clock, 3))
    assert cache.get(("c", "p", "k")) is None


def test_older_version_never_replaces_newer() -> None:
    """A late answer carrying an older version of the same item does not roll the cache back."""
    clock = FakeClock()
    cache = LeaseCache(clock, 100, 5 * US)
    cache.put(lease(clock, 100, version=5))
    cache.put(lease(clock, 60, version=4))
    got = cache.get(("c", "p", "k"))
    assert got is not None and got.version == 5
    cache.put(lease(clock, 60, version=6, resource="other"))
    got = cache.get(("c", "p", "k"))
    assert got is not None and got.resource == "other"


def test_bounded_size() -> None:
    """The cache holds at most maxsize leases."""
    clock = FakeClock()
    cache = LeaseCache(clock, 10, 5 * US)
    for i in range(50):
        cache.put(Lease("c", "p", f"k{i}", "r", "us-east-1", clock.now_us() + 60 * US, 1))
    assert len(cache) == 10
