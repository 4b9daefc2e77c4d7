"""One frozen config, loaded once at start-up from defaults < TOML file < RASD_* env < flags.

Every field documents its default and why. ``rasd check-config`` prints the effective values.
A bad value raises ``ConfigError`` with a message that names the field and its source.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .core.decide import Rules
from .core.lease import REGION_RE, US


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Config:
    # --- where ---------------------------------------------------------------------------
    #: DynamoDB table holding every pool (docs/schema.md).
    table: str = "rasd"
    #: The RAS region whose items this daemon claims. Also the DynamoDB client's region unless
    #: AWS_REGION says otherwise (so one table can stand in for a global table in tests).
    region: str = "us-east-1"
    #: Unix socket the daemon listens on (ignored under systemd socket activation).
    socket: str = "/run/rasd/rasd.sock"
    #: Socket file mode: owner and group (the app users' group) may connect.
    socket_mode: int = 0o660
    #: DynamoDB endpoint; None lets botocore read AWS_ENDPOINT_URL_DYNAMODB / AWS_ENDPOINT_URL.
    endpoint_url: str | None = None

    # --- cache and leases ----------------------------------------------------------------
    #: Most leases kept in memory (~0.5 KB each).
    cache_max_leases: int = 200_000
    #: The hit table: what the cache may answer, in read-only shared memory per client_id
    #: (docs/protocol.md), hit_table_slots answers at most (256 bytes each, used as filled).
    hit_table: bool = True
    hit_table_slots: int = 262_144
    #: A cached lease is served only until lease_expires minus this margin: hosts' clocks may
    #: disagree by this much before another host could see the lease as expired.
    skew_margin: float = 5.0
    #: Refresh-ahead: extend a sliding lease when its time left is below this fraction of the
    #: duration asked for. 0.5 with "now + 1h" means about one write per key per 30 minutes.
    extend_fraction: float = 0.5
    #: Before a background extension, read the key's mappings (one consistent Query) and
    #: write nothing when another host serving the same key already extended it far enough.
    #: Off saves that read where no key is served on two hosts.
    extend_read_first: bool = True
    #: S: a cached answer is served at most this long after the daemon last confirmed it (its
    #: own write, or a strongly consistent read). Busy keys are re-confirmed in the background
    #: after S/2, one read per key per host; cached leases survive a DynamoDB outage this long
    #: (a pool defined with an outage budget: up to the budget, docs/design.md).
    confirm_interval: float = 30.0
    #: Bound on the clock difference between any two hosts (daemons and jobs). The liberator's
    #: --grace must be at least this; quarantines include it.
    max_clock_skew: float = 2.0
    #: How the daemon checks its own clock against that bound (each host may be off by half
    #: of it): "kernel" (ClockBound's bound where it runs, else the kernel's bound and sync
    #: flag; DynamoDB's Date header; steps), "date" (the Date header and steps only, for a
    #: host whose kernel does not report synchronisation: a container on some runtimes, a
    #: dev box), "off" (no check; only where the clock is checked otherwise). While the check
    #: fails the daemon answers UNAVAILABLE and writes nothing that depends on its clock.
    clock_check: str = "kernel"
    #: Bound on global-table replication lag, for another region's lease served from our
    #: replica; quarantines include it (docs/design.md, I1 across regions).
    replication_lag: float = 25.0
    #: A pending mapping younger than this is left to its acquirer: other daemons wait for it
    #: instead of fencing it. Longer than an acquisition, short enough that a crashed acquirer
    #: blocks a key only briefly.
    pending_hold: float = 2.0
    #: Strict pools (a pool defined with a home region): what a new key does when the home
    #: region does not answer. "fail": UNAVAILABLE (the claim waits for a later request to
    #: agree it); "local": answer this region's lease unagreed, counted as strict.fallback
    #: (it may duplicate the key in another region, as a normal pool would). docs/global.md.
    strict_home_down: str = "fail"
    #: DynamoDB endpoints of other regions' replicas (a strict pool's home), as
    #: REGION=URL[,REGION=URL...] or a TOML table; a region not listed: botocore resolves
    #: its endpoint from the region name.
    peer_endpoints: dict[str, str] = field(default_factory=dict)

    #: Force rollout mode: keep the rules that are safe beside the paper's in-process agent
    #: whatever the table says. Otherwise (the default) the table's rollout record decides
    #: (``rasadmin adopt`` turns it on, ``rasadmin end-rollout`` off; docs/operations.md), read
    #: at start-up and with every pool refresh, so no host's config file can make it the one
    #: that runs the fast rules beside the paper's agent. Rollout mode: (1) a key that misses
    #: also reads the leased_resources index, and a lease of the paper's agent found there is
    #: adopted; (2) a new claim is settled before it is answered; (3) every early free keeps
    #: the resource unclaimable until its lease's end plus max_clock_skew as well as for the
    #: quarantine, since the paper's agent answers any lease it finds in that index to its end.
    legacy_agents: bool = False

    # --- prefetch ------------------------------------------------------------------------
    #: Candidates kept per (client, pool): at least / at most. The floor is what a burst of new
    #: keys after a pause starts from (its demand is seen within a few takes).
    prefetch_min: int = 12
    prefetch_max: int = 64
    #: Most items read per refill Query. A lane's refill reads the room left in the buffer
    #: (at least 8); a read from an end of the index (learning a pool) reads a whole page.
    prefetch_page: int = 64
    #: Candidates older than this are dropped: someone else has likely taken them.
    candidate_max_age: float = 10.0
    #: In a quiet pool (no race lost in the last minute; free items sit claimable for long)
    #: candidates are kept up to a quarter of how long, at most this: a host that takes a new
    #: key now and then skips the index read. 0: always candidate_max_age.
    candidate_max_age_quiet: float = 120.0
    #: After a sweep of all ten sub-partitions finds nothing, answer NO_CAPACITY without
    #: reading DynamoDB for this long.
    exhausted_backoff: float = 1.0

    # --- requests ------------------------------------------------------------------------
    #: Deadline of a request whose client sent none.
    default_deadline: float = 1.0
    #: Pool definitions are re-read this often (new pools also load on first use).
    pool_refresh: float = 30.0
    #: NO_CAPACITY answers are reported to the balancer (a counter item per daemon and pool)
    #: at most this often, and only when there were some.
    miss_report_interval: float = 5.0

    #: Bound on requests doing DynamoDB work at once; beyond it (or when a request could
    #: not finish before its deadline at the recent service time) the answer is BUSY at once.
    max_inflight: int = 64
    #: New acquisitions per (client, pool) per second, with bursts up to rate_burst. Stops a
    #: runaway client (a new key per request) from draining a pool; over it: BUSY+retry_after.
    rate_limit: float = 200.0
    rate_burst: float = 1000.0
    #: Requests per client_id per second that reach DynamoDB (cache misses, new keys,
    #: releases, headroom, unknown pools), with bursts up to call_rate_burst (a restart's cold
    #: cache): one client's flood leaves the others the table's capacity; over it: BUSY.
    call_rate_limit: float = 1000.0
    call_rate_burst: float = 5000.0
    #: Seconds in-flight requests get to finish on SIGTERM before they are cancelled.
    drain_timeout: float = 5.0
    #: Requests one connection may have in flight at once; beyond it the answer is BUSY.
    max_pending_per_conn: int = 256
    #: Connections one calling process may hold open (a sync client keeps one per thread,
    #: the async one one per event loop); one uid in all its processes; every caller in all
    #: (0: the daemon's open-file limit less 256, kept for DynamoDB and the daemon's own).
    #: Past a limit a new connection is closed at once (the client's call: UNAVAILABLE). A
    #: uid the ACL grants nothing may hold 4 (its calls are answered FORBIDDEN).
    max_connections_per_process: int = 256
    max_connections_per_uid: int = 4096
    max_connections: int = 0
    #: A connection with no request in flight and no whole frame received for this long is
    #: closed (0: never); the clients reconnect on their next call.
    idle_timeout: float = 900.0
    #: A frame begun and not finished within this many seconds closes its connection; the
    #: bytes of half-received frames, in all connections together, stay under
    #: max_buffered_bytes (the connection that passes it is closed).
    frame_timeout: float = 10.0
    max_buffered_bytes: int = 64 * 1024 * 1024

    # --- start-up and background timing --------------------------------------------------
    #: Bound on one start-up attempt's DynamoDB work (warming connections, loading pools).
    startup_deadline: float = 30.0
    #: DynamoDB unreachable at start: the daemon stays up *degraded* (UNAVAILABLE at once)
    #: and retries after this many seconds, doubling up to startup_retry_max. It never exits
    #: for it, so systemd never gives up on it.
    startup_retry_initial: float = 1.0
    startup_retry_max: float = 30.0
    #: Bound on prefetching the pools' first candidates at start (best effort).
    prefetch_warm: float = 2.0
    #: Bound on one periodic re-read of the pool definitions.
    pool_refresh_timeout: float = 5.0
    #: Bound on the last NO_CAPACITY report written at shutdown.
    flush_misses_timeout: float = 1.0

    # --- DynamoDB client -----------------------------------------------------------------
    #: "lean": rasd.dynamo.ddb (httptools + orjson + SigV4 with a cached signing key, a small
    #: fraction of the CPU per call, no aioboto3 import at start). "botocore": aioboto3's client.
    ddb_client: str = "lean"
    #: Connections kept to DynamoDB.
    ddb_max_connections: int = 32
    #: Connections opened at start-up before the daemon reports ready.
    ddb_warm_connections: int = 4
    ddb_connect_timeout: float = 1.0
    ddb_read_timeout: float = 2.0
    #: The share of a request's time left that one attempt may wait for DynamoDB's answer
    #: before it is cut and retried (or its write read back). 1.0: never cut, wait for the
    #: answer until the deadline (``rasd dev``: moto is slow under a burst, never lossy, and a
    #: cut attempt is work it does twice).
    ddb_attempt_share: float = 0.6
    #: A pooled DynamoDB connection older than this (seconds) is closed instead of reused, so
    #: the next one resolves the endpoint's name again: DynamoDB's addresses change, and a
    #: connection kept for hours stays on one front-end host whatever happens to it.
    ddb_connection_max_age: float = 60.0
    #: Circuit breaker: this many failed DynamoDB attempts (network errors, 5xx, timeouts,
    #: throttles) within breaker_window seconds open it; new work then fails fast with
    #: UNAVAILABLE for breaker_cooldown seconds, after which one probe call decides. Cached
    #: leases are served throughout. Throttles count, so that a throttled fleet backs off
    #: together instead of retrying into the throttle; lost races and conflicts do not, nor
    #: does a timeout of an attempt that a caller's deadline gave less than 0.1 s (one app's
    #: tiny deadlines say nothing about DynamoDB and must not fail every other app's calls).
    breaker_failures: int = 20
    breaker_window: float = 5.0
    breaker_cooldown: float = 2.0

    # --- operations ----------------------------------------------------------------------
    log_level: str = "info"
    #: Serve Prometheus metrics on this port (0 or None: off).
    metrics_port: int | None = None
    #: Which Unix users/groups may use which client_ids. TOML: [acl] uid.1001 = ["demo"],
    #: gid.2000 = ["*"]. Empty: ``rasd serve`` refuses to start unless ``acl_open``.
    acl: dict[str, list[str]] = field(default_factory=dict)
    #: With no ``acl``: everyone who can open the socket may use every client_id (``rasd dev``
    #: sets it). Said explicitly, never by omission; an ``acl`` table overrides it.
    acl_open: bool = False

    def validate(self) -> Config:
        problems: list[str] = []
        if not self.table:
            problems.append("table: must not be empty")
        if not REGION_RE.match(self.region):
            problems.append(f"region: {self.region!r} is not a region name")
        if not 0.0 < self.extend_fraction < 1.0:
            problems.append("extend_fraction: must be between 0 and 1")
        if self.skew_margin < 0:
            problems.append("skew_margin: must be >= 0")
        if self.confirm_interval <= 0:
            problems.append("confirm_interval: must be > 0")
        if self.max_clock_skew < 0 or self.replication_lag < 0:
            problems.append("max_clock_skew/replication_lag: must be >= 0")
        if self.pending_hold <= 0:
            problems.append("pending_hold: must be > 0")
        if not 1 <= self.prefetch_min <= self.prefetch_max:
            problems.append("prefetch_min/prefetch_max: need 1 <= min <= max")
        if self.candidate_max_age <= 0 or self.candidate_max_age_quiet < 0:
            problems.append("candidate_max_age/_quiet: need max_age > 0 and quiet >= 0")
        if self.default_deadline <= 0:
            problems.append("default_deadline: must be > 0")
        if self.max_inflight < 1:
            problems.append("max_inflight: must be >= 1")
        if self.rate_limit <= 0 or self.rate_burst < 1:
            problems.append("rate_limit/rate_burst: need rate_limit > 0 and rate_burst >= 1")
        if self.call_rate_limit <= 0 or self.call_rate_burst < 1:
            problems.append(
                "call_rate_limit/call_rate_burst: need call_rate_limit > 0 and call_rate_burst >= 1"
            )
        if self.breaker_failures < 1:
            problems.append("breaker_failures: must be >= 1")
        if self.max_pending_per_conn < 1:
            problems.append("max_pending_per_conn: must be >= 1")
        for name in ("max_connections_per_process", "max_connections_per_uid"):
            if getattr(self, name) < 1:
                problems.append(f"{name}: must be >= 1")
        if self.max_connections < 0:
            problems.append("max_connections: must be >= 0 (0: from the open-file limit)")
        if self.idle_timeout < 0:
            problems.append("idle_timeout: must be >= 0 (0: never)")
        if self.frame_timeout <= 0:
            problems.append("frame_timeout: must be > 0")
        if not 16 <= self.hit_table_slots <= 1 << 24:
            problems.append("hit_table_slots: must be in 16..16777216")
        if self.max_buffered_bytes < 65536:
            problems.append("max_buffered_bytes: must be >= 65536 (one whole frame)")
        if not 0 < self.startup_retry_initial <= self.startup_retry_max:
            problems.append("startup_retry_initial/max: need 0 < initial <= max")
        for name in ("startup_deadline", "prefetch_warm", "pool_refresh_timeout"):
            if getattr(self, name) <= 0:
                problems.append(f"{name}: must be > 0")
        if not 0.1 <= self.ddb_attempt_share <= 1.0:
            problems.append("ddb_attempt_share: must be between 0.1 and 1")
        if self.ddb_connection_max_age <= 0:
            problems.append("ddb_connection_max_age: must be > 0")
        if self.ddb_max_connections < 1:
            problems.append("ddb_max_connections: must be >= 1")
        if self.strict_home_down not in ("fail", "local"):
            problems.append(
                f"strict_home_down: {self.strict_home_down!r} is not one of 'fail', 'local'"
            )
        if self.clock_check not in ("kernel", "date", "off"):
            problems.append(
                f"clock_check: {self.clock_check!r} is not one of 'kernel', 'date', 'off'"
            )
        if self.ddb_client not in ("lean", "botocore"):
            problems.append(f"ddb_client: {self.ddb_client!r} is not one of 'lean', 'botocore'")
        if problems:
            raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
        return self

    @property
    def quarantine(self) -> float:
        """Q: how long every early free keeps a resource unclaimable. Q >= S + skew (+ lag
        for leases served across regions): docs/design.md, I3."""
        return self.confirm_interval + self.max_clock_skew + self.replication_lag

    def rules(self) -> Rules:
        """The protocol's time bounds (rasd.core.decide), derived here and nowhere else."""
        return Rules(
            margin_us=int(self.skew_margin * US),
            grace_us=int(self.max_clock_skew * US),
            pending_hold_us=int(self.pending_hold * US),
            quarantine_us=int(self.quarantine * US),
            confirm_us=int(self.confirm_interval * US),
            extend_margin_us=int(self.max_clock_skew * US),
        )

    def public(self) -> dict[str, Any]:
        """The effective config for printing (no secrets live here: AWS creds come from boto)."""
        out = dataclasses.asdict(self)
        out["socket_mode"] = oct(self.socket_mode)
        return out


_FIELDS = {f.name: f for f in dataclasses.fields(Config)}

Converter = Callable[[Any], Any]


def _octal(raw: Any) -> int:
    """``socket_mode``: an int (TOML ``0o660``) or an octal string (``"660"``, ``"0o660"``)."""
    return int(raw, 8) if isinstance(raw, str) else int(raw)


def _optional(convert: Converter) -> Converter:
    """``convert``, except that an empty string means None (``RASD_METRICS_PORT=``)."""

    def optional(raw: Any) -> Any:
        return None if isinstance(raw, str) and raw == "" else convert(raw)

    return optional


def _bool(raw: Any) -> bool:
    """A TOML boolean, or a string: true/false, yes/no, on/off, 1/0."""
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in _BOOLS:
        return _BOOLS[raw.strip().lower()]
    raise ValueError("expected true or false")


_BOOLS = {"true": True, "yes": True, "on": True, "1": True}
_BOOLS.update({"false": False, "no": False, "off": False, "0": False})


def _peers(raw: Any) -> dict[str, str]:
    if isinstance(raw, dict):
        pairs = [(str(k), str(v)) for k, v in raw.items()]
    elif isinstance(raw, str):
        pairs = []
        for part in filter(None, (p.strip() for p in raw.split(","))):
            region, sep, url = part.partition("=")
            if not sep or not region or not url:
                raise ValueError(f"{part!r} is not REGION=URL")
            pairs.append((region.strip(), url.strip()))
    else:
        raise TypeError("expected REGION=URL[,REGION=URL...] or a table")
    for region, _ in pairs:
        if not REGION_RE.match(region):
            raise ValueError(f"{region!r} is not a region name")
    return dict(pairs)


def acl_refusal(cfg: Config) -> str | None:
    """Why ``rasd serve`` must not start (or reload) with ``cfg``'s access list, or None: with
    no ``acl`` every local user who can open the socket could take any client's leases, so
    that needs ``acl_open`` said outright."""
    if cfg.acl or cfg.acl_open:
        return None
    return (
        "no [acl]: every user who can open the socket could use every client_id. List who "
        'may use what ([acl] user.www-data = ["ads"]: docs/operations.md, "Who may call"), '
        "or set acl_open = true (RASD_ACL_OPEN=true) to allow everyone outright"
    )


def _acl(raw: Any) -> dict[str, list[str]]:
    if not isinstance(raw, dict):
        raise TypeError("expected a table")
    return {str(k): [str(x) for x in v] for k, v in raw.items()}


#: How a value from the TOML file, the environment (always a string) or a flag becomes the
#: field's type. One entry per Config field (checked below and in the tests).
CONVERTERS: dict[str, Converter] = {
    "table": str,
    "region": str,
    "socket": str,
    "socket_mode": _octal,
    "endpoint_url": _optional(str),
    "cache_max_leases": int,
    "hit_table": _bool,
    "hit_table_slots": int,
    "skew_margin": float,
    "extend_fraction": float,
    "extend_read_first": _bool,
    "confirm_interval": float,
    "max_clock_skew": float,
    "clock_check": str,
    "replication_lag": float,
    "pending_hold": float,
    "strict_home_down": str,
    "peer_endpoints": _peers,
    "legacy_agents": _bool,
    "prefetch_min": int,
    "prefetch_max": int,
    "prefetch_page": int,
    "candidate_max_age": float,
    "candidate_max_age_quiet": float,
    "exhausted_backoff": float,
    "default_deadline": float,
    "pool_refresh": float,
    "miss_report_interval": float,
    "max_inflight": int,
    "rate_limit": float,
    "rate_burst": float,
    "call_rate_limit": float,
    "call_rate_burst": float,
    "drain_timeout": float,
    "max_pending_per_conn": int,
    "max_connections_per_process": int,
    "max_connections_per_uid": int,
    "max_connections": int,
    "idle_timeout": float,
    "frame_timeout": float,
    "max_buffered_bytes": int,
    "startup_deadline": float,
    "startup_retry_initial": float,
    "startup_retry_max": float,
    "prefetch_warm": float,
    "pool_refresh_timeout": float,
    "flush_misses_timeout": float,
    "ddb_client": str,
    "ddb_max_connections": int,
    "ddb_warm_connections": int,
    "ddb_connect_timeout": float,
    "ddb_read_timeout": float,
    "ddb_attempt_share": float,
    "ddb_connection_max_age": float,
    "breaker_failures": int,
    "breaker_window": float,
    "breaker_cooldown": float,
    "log_level": str,
    "metrics_port": _optional(int),
    "acl": _acl,
    "acl_open": _bool,
}
if CONVERTERS.keys() != _FIELDS.keys():  # pragma: no cover - caught by the unit tests
    raise AssertionError(f"CONVERTERS and Config fields differ: {CONVERTERS.keys() ^ _FIELDS}")


def _coerce(name: str, raw: Any, source: str) -> Any:
    if raw is None:
        return None
    try:
        return CONVERTERS[name](raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name} (from {source}): {raw!r} is not valid: {exc}") from exc


def _flatten_acl(doc: dict[str, Any]) -> dict[str, Any]:
    """``[acl] user.www-data = [...]`` reads as {"user": {"www-data": [...]}}: flattened."""
    acl = doc.get("acl")
    if not isinstance(acl, dict):
        return doc
    flat = {k: v for k, v in acl.items() if not isinstance(v, dict)}
    flat |= {f"{k}.{i}": c for k, t in acl.items() if isinstance(t, dict) for i, c in t.items()}
    return {**doc, "acl": flat}


def load(
    path: str | None = None,
    env: dict[str, str] | None = None,
    overrides: dict[str, Any] | None = None,
    defaults: dict[str, Any] | None = None,
) -> Config:
    """Build the effective config. ``env`` defaults to os.environ. ``defaults`` replace
    Config's own below everything else (``rasd dev``'s settings for a local moto)."""
    env = dict(os.environ) if env is None else env
    values: dict[str, Any] = dict(defaults or {})
    if path:
        try:
            with open(path, "rb") as fh:
                doc = _flatten_acl(tomllib.load(fh))
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
        doc = doc.get("rasd", doc) if isinstance(doc.get("rasd"), dict) else doc
        for k, v in doc.items():
            if k not in _FIELDS:
                raise ConfigError(f"{path}: unknown setting {k!r}")
            values[k] = _coerce(k, v, path)
    for name in _FIELDS:
        if name == "acl":
            continue
        raw = env.get(f"RASD_{name.upper()}")
        if raw is not None:
            values[name] = _coerce(name, raw, f"RASD_{name.upper()}")
    for k, v in (overrides or {}).items():
        if v is not None:
            values[k] = _coerce(k, v, f"--{k.replace('_', '-')}")
    return Config(**values).validate()
