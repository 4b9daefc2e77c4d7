"""Bringing the daemon's store up (:class:`BringUp`): import it, warm DynamoDB, load the pools,
retry with backoff while that fails (the daemon runs degraded), and confirm cached AWS
settings afterwards. docs/operations.md, "The daemon on a host (systemd)" (Never dead for
good) and "AWS settings".
"""

from __future__ import annotations

import asyncio
import importlib
import os
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from ..config import Config
from ..core.clock import Clock
from ..core.errors import RasdError
from ..dynamo.aws import AwsSettingsError
from ..observe.metrics import Counters
from .diagnostics import close_quietly, describe_cause, is_boto, probe_endpoint
from .serving import Status

if TYPE_CHECKING:  # imported at run time by attempt(), after the socket already serves
    from ..daemon.coordinator import Coordinator
    from ..daemon.published import Published
    from ..dynamo.store import Store
    from .clockwatch import ClockGuard

log = structlog.get_logger("rasd.server")

#: Seconds from up to botocore's check of cached AWS settings: the requests queued during
#: a restart are answered first. The check (about 0.2 s of CPU in a child) runs at the
#: daemon's priority under the unit, whose syscall filter refuses nice().
AWS_CONFIRM_DELAY = 1.0


class Host(Protocol):
    """What a bring-up needs of its daemon: its config, clock and counters, its status,
    serving once up, READY=1 with a STATUS=, a background task, a stop with an exit status."""

    cfg: Config
    clock: Clock
    clock_guard: ClockGuard
    published: Published | None
    counters: Counters
    status: Status

    def came_up(self, store: Store, coordinator: Coordinator, pools: int) -> None: ...

    def announce(self, status: str) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...

    def exit_with(self, status: int) -> None: ...


class BringUp:
    """The daemon's start-up against DynamoDB: one :meth:`attempt`, or :meth:`until_up`.
    ``store``: one given by tests (a FaultyStore); else made after the heavy import."""

    def __init__(self, host: Host, store: Store | None = None) -> None:
        self.host = host
        self.given_store = store
        #: The DynamoDB endpoint botocore resolved, once an attempt resolved it.
        self.resolved_endpoint: str | None = None

    def endpoint(self) -> str:
        """The DynamoDB endpoint botocore resolved (before that, a guess), for log lines and
        STATUS=."""
        cfg = self.host.cfg
        return (
            self.resolved_endpoint
            or cfg.endpoint_url
            or os.environ.get("AWS_ENDPOINT_URL_DYNAMODB")
            or os.environ.get("AWS_ENDPOINT_URL")
            or f"https://dynamodb.{os.environ.get('AWS_REGION') or cfg.region}.amazonaws.com"
        )

    def ddb_region(self) -> str:
        """The DynamoDB client's region (``AWS_REGION``, else the RAS region)."""
        return os.environ.get("AWS_REGION") or self.host.cfg.region

    def why_degraded(self, cause: str) -> str:
        """What STATUS= and UNAVAILABLE say while DynamoDB fails at start: where it was asked
        (a table missing there usually exists in another region or behind another endpoint)."""
        if "clock is not trusted" in cause:
            return cause  # nothing DynamoDB did (rasd.server.clockwatch)
        table = self.host.cfg.table
        where = f"DynamoDB at {self.endpoint()} (region {self.ddb_region()})"
        if "ResourceNotFoundException" in cause:
            return (
                f"{where} has no table {table!r}: {cause}; if it exists, this is the "
                "wrong region or endpoint (AWS_REGION, endpoint_url, AWS_ENDPOINT_URL_DYNAMODB)"
            )
        return f"{where}, table {table!r}, unreachable: {cause}"

    async def attempt(self) -> int:
        """Import the store (in a thread: the loop keeps accepting), warm DynamoDB, load pools;
        then the host serves. Returns how many pools were loaded."""
        host = self.host
        cfg = host.cfg
        deadline = time.monotonic() + cfg.startup_deadline
        roles_mod = await asyncio.to_thread(importlib.import_module, "rasd.daemon.coordinator")
        store_mod = importlib.import_module("rasd.dynamo.store")
        store = self.given_store or store_mod.Store(
            cfg, host.counters, on_date=host.clock_guard.on_date
        )
        try:
            await store.start()
            if store.aws is not None:
                self.resolved_endpoint = store.aws.endpoint_url
            await store.warm(cfg.startup_deadline)
            coordinator = roles_mod.Coordinator(
                cfg, store, host.clock, host.counters, published=host.published
            )
            n: int = await coordinator.pool_table.load(deadline)
        except BaseException:
            if store is not self.given_store:
                await close_quietly(store)
            raise
        await coordinator.prefetch.warm(list(coordinator.pools.values()), timeout=cfg.prefetch_warm)
        host.came_up(store, coordinator, n)
        if store.aws is not None and store.aws.cache_key is not None:
            host.spawn(self.confirm_aws(store))
        return n

    async def confirm_aws(self, store: Store) -> None:
        """The AWS settings came from an earlier start (rasd.dynamo.awscache): botocore,
        resolving them again now, must agree. If it refuses them or decides otherwise, stop:
        the next start runs on botocore's decision (a refusal: exit 2, as a refused start)."""
        await asyncio.sleep(AWS_CONFIRM_DELAY)
        t0 = time.monotonic()
        try:
            fresh = await store.confirm_aws()
        except AwsSettingsError as exc:
            self._refuse(exc)
            return
        except Exception as exc:  # noqa: BLE001 - no verdict: the cached settings stand
            log.warning("aws_settings_unconfirmed", cause=str(exc))
            return
        if fresh is None:
            log.info("aws_settings_confirmed", took_s=round(time.monotonic() - t0, 3))
        else:
            assert store.aws is not None
            log.error(
                "aws_settings_changed",
                cached=store.aws.public(),
                botocore=fresh.public(),
                action="stopping; the next start uses botocore's settings",
            )
            self.host.exit_with(1)

    async def until_up(self) -> None:
        """Retry :meth:`attempt` with backoff until it works: never exit for an unreachable
        DynamoDB. While it fails the daemon is degraded (UNAVAILABLE at once)."""
        host = self.host
        cfg = host.cfg
        delay = cfg.startup_retry_initial
        attempt = 0
        while True:
            attempt += 1
            try:
                await self.attempt()
                return
            except asyncio.CancelledError:
                raise
            except AwsSettingsError as exc:  # retrying cannot help: refuse to start
                self._refuse(exc)
                return
            except Exception as exc:  # noqa: BLE001 - every failure is retried; logged below
                cause = describe_cause(exc)
                if "circuit breaker" in cause or "no answer" in cause:
                    # The store's error hides the network's: ask the network directly.
                    cause = f"{cause}; {await probe_endpoint(self.endpoint())}"
                host.status.degrade(self.why_degraded(cause))
                expected = isinstance(exc, RasdError | OSError | TimeoutError) or is_boto(exc)
                log.error(
                    "startup_failed",
                    endpoint=self.endpoint(),
                    region=self.ddb_region(),
                    table=cfg.table,
                    cause=cause,
                    attempt=attempt,
                    retry_in_s=round(delay, 2),
                    **({} if expected else {"exc_info": exc}),
                )
                host.counters.inc("startup.failed")
                host.announce(f"degraded: {host.status.degraded}; retry {attempt} in {delay:.1f}s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, cfg.startup_retry_max)

    def _refuse(self, exc: AwsSettingsError) -> None:
        """An AWS setting rasd cannot honour: degraded with its reason, exit 2, stop."""
        self.host.status.degrade(str(exc))
        log.error("startup_refused", cause=str(exc))
        self.host.exit_with(2)
