"""``rasd dev``: everything on loopback, for demos and development.

moto's server in its own process, the table, a demo pool with resources, and the daemon on a
local socket, configured as ``rasd serve`` is (:func:`dev_config`) over
:data:`DEV_SETTINGS`; :data:`DEV_OWNS` is what stays its own. Ctrl-C stops it all (README.md,
"Two commands on a fresh machine").
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import os
import socket
import sys
import tempfile
import time
from typing import Any

from ..config import Config, ConfigError, load

DEMO_CLIENT = "demo"
DEMO_POOL = "default"
#: demo resources by default: a burst of 200 new keys five times over
DEMO_RESOURCES = 1000

#: The daemon's settings under ``rasd dev`` that differ from the defaults, and why.
DEV_SETTINGS: dict[str, Any] = {
    # moto answers a few hundred calls a second (each Query walks its partition in Python):
    # a demo's burst of new keys waits for it instead of being shed at 64 in flight, and a
    # call waits for moto's answer rather than timing out into retries, the retry quota and
    # the circuit breaker (every call still ends by its request's deadline).
    "max_inflight": 1024,
    "ddb_connect_timeout": 10.0,
    "ddb_read_timeout": 30.0,
    # An attempt is never cut short to be retried: moto loses nothing, it is only slow under a
    # burst, and an attempt cut and sent again is work it does twice (and a timeout's retry
    # costs ten of the retry quota's 500: a burst of 50 drained it, and the next calls failed
    # with "retry quota exhausted").
    "ddb_attempt_share": 1.0,
    # Background refills get this long (a request's own deadline is its client's), and a
    # late moto is no outage: the circuit breaker opens only after far more failed calls.
    "default_deadline": 10.0,
    "breaker_failures": 500,
    # One daemon: nobody else takes its candidates, so they stay good, and many of them are
    # kept (up to DEV_CANDIDATES asked for before the banner, which says how many came), so
    # that a burst of new keys claims without sweeping the index: every request that finds
    # the buffer empty sweeps all ten sub-partitions, and on moto that takes long.
    "candidate_max_age": 3600.0,
    "prefetch_min": 512,
    "prefetch_max": 1024,
    "prefetch_page": 128,
    "prefetch_warm": 10.0,
}
#: claim candidates the demo pool holds before the banner is printed
DEV_CANDIDATES = 256
#: Defaults of ``rasd dev`` that are not about moto: a quiet terminal, a socket any local
#: user may try, every client_id open to each (a development host's own daemon).
#: A development host's kernel often keeps no synchronised clock, and moto answers with this
#: host's own: the Date header alone.
DEV_DEFAULTS: dict[str, Any] = {
    "log_level": "warning",
    "socket_mode": 0o666,
    "acl_open": True,
    "clock_check": "date",
}
#: What ``rasd dev`` sets whatever the config says, and why.
DEV_OWNS = {
    "socket": "rasd dev serves on DIR/rasd.sock (--dir moves it)",
    "endpoint_url": "rasd dev runs its own DynamoDB (moto)",
}


def dev_config(args: argparse.Namespace, env: dict[str, str] | None = None) -> Config:
    """The daemon's config under ``rasd dev``: ``--config FILE``, ``RASD_*`` and the flags as
    ``rasd serve`` reads them, over :data:`DEV_SETTINGS` and :data:`DEV_DEFAULTS` where the
    user set nothing. The socket and endpoint are :data:`DEV_OWNS`' (set by the caller)."""
    return load(
        args.config,
        env=env,
        overrides={"region": args.region, "log_level": args.log_level},
        defaults={**DEV_DEFAULTS, **DEV_SETTINGS},
    )


def overruled(cfg: Config) -> list[str]:
    """A note for each setting of :data:`DEV_OWNS` that the config sets, which ``rasd dev``
    does not use."""
    plain = Config()
    return [
        f"{name} {getattr(cfg, name)!r} (RASD_{name.upper()} or --config) is not used: {why}"
        for name, why in DEV_OWNS.items()
        if getattr(cfg, name) != getattr(plain, name)
    ]


def _socket_path(workdir: str) -> str:
    path = os.path.abspath(os.path.join(workdir, "rasd.sock"))
    if len(path.encode()) < 100:
        return path
    # AF_UNIX paths are limited to 107 bytes: fall back to a short private directory.
    return os.path.join(tempfile.mkdtemp(prefix="rasd-dev-"), "rasd.sock")


async def fill_candidates(daemon: Any, want: int, timeout: float) -> int:
    """Prefetch the demo pool's claim candidates until ``want`` are held (or ``timeout``
    passed); returns how many are held."""
    acq = daemon.coordinator
    pool = acq.pools.get((DEMO_CLIENT, DEMO_POOL))
    if pool is None:
        return 0
    prefetch = acq.prefetch
    end = time.monotonic() + timeout
    idle = 0  # rounds in a row that added nothing (a lane that ended starts a new one)
    while time.monotonic() < end and idle < 5:
        held = len(prefetch.buffer(pool))
        if held >= want:
            break
        await prefetch.warm([pool], timeout=max(0.1, end - time.monotonic()))
        idle = idle + 1 if len(prefetch.buffer(pool)) == held else 0
    return len(prefetch.buffer(pool))


class DevUnavailable(RuntimeError):
    """``rasd dev`` cannot run: no moto on this install (a production package), or another
    process serves on its socket."""


def require_moto() -> None:
    if importlib.util.find_spec("moto") is None:
        raise DevUnavailable(
            "needs moto, which production installs do not ship: install the [dev] extra "
            "(pip install 'rasd[dev]') in a development virtualenv"
        )


def metrics_port_free(port: int) -> None:
    """DevUnavailable, before moto starts, when metrics cannot be served on ``port``: no
    prometheus_client, or the port taken (the daemon would stop with a traceback)."""
    from ..observe.prom import MetricsUnavailable, require

    try:
        require()
    except MetricsUnavailable as exc:
        raise DevUnavailable(str(exc)) from None
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise DevUnavailable(
                f"metrics_port {port}: {exc.strerror} (another daemon's metrics?): set "
                "RASD_METRICS_PORT to a free port, or unset it"
            ) from None


def run_dev(args: argparse.Namespace) -> int:
    require_moto()
    import boto3
    import uvloop

    from ..core import schema
    from ..observe import log
    from ..server import Daemon, run_daemon, socketfile
    from . import motoserver

    try:
        cfg = dev_config(args)
    except ConfigError as exc:
        raise DevUnavailable(str(exc)) from None
    if cfg.metrics_port:
        metrics_port_free(cfg.metrics_port)
    for note in overruled(cfg):
        print(f"rasd dev: {note}", file=sys.stderr)
    os.makedirs(args.dir, exist_ok=True)
    sock = _socket_path(args.dir)
    try:
        socketfile.claim(sock)  # before moto starts: a second `rasd dev` in DIR stops here
    except socketfile.SocketInUse as exc:
        raise DevUnavailable(
            f"{exc} (another `rasd dev --dir {args.dir}`? Ctrl-C stops it; or pass another --dir)"
        ) from None
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(k, "rasd-dev")
    os.environ.pop("AWS_PROFILE", None)

    moto_log = os.path.join(args.dir, "moto.log")
    server = motoserver.spawn(log_file=moto_log)
    endpoint = server.endpoint

    cfg = dataclasses.replace(cfg, socket=sock, endpoint_url=endpoint).validate()
    table, region = cfg.table, cfg.region
    # the table where the daemon's client looks: AWS_REGION's, if set (as for `rasd serve`)
    ddb_region = os.environ.get("AWS_REGION") or region
    ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name=ddb_region)
    schema.create_table(ddb, table)
    schema.put_pool(ddb, table, DEMO_CLIENT, DEMO_POOL, 86400)
    n = schema.add_resources(
        ddb,
        table,
        DEMO_CLIENT,
        DEMO_POOL,
        region,
        (f"demo-{i:05d}" for i in range(args.resources)),
    )
    log.configure(cfg.log_level)
    metrics = (
        f"http://127.0.0.1:{cfg.metrics_port}/metrics"
        if cfg.metrics_port
        else "off (RASD_METRICS_PORT=9464 serves them)"
    )

    banner = f"""rasd dev is up
  DynamoDB (moto): {endpoint}   (request log: {moto_log})
  table {table!r}, pool {DEMO_CLIENT}/{DEMO_POOL} with {n} resources in {region}
  ({{held}} claim candidates prefetched; moto answers a few hundred calls a second, so give
   a burst of new keys a client timeout to match: RASD_TIMEOUT=30 for 200, README)
  socket: {sock}
  metrics: {metrics}
  settings: rasd dev's for moto (rasd/devtools/dev.py), RASD_* and --config over them

Try it from another terminal (in this checkout):

  RASD_SOCKET={sock} .venv/bin/python -c '
import rasd_client, datetime
lease = rasd_client.get_lease(
    "{DEMO_CLIENT}", "{DEMO_POOL}", "user-42", datetime.timedelta(hours=1))
print(lease)'

  .venv/bin/rasd stats --socket {sock}
  AWS_ENDPOINT_URL_DYNAMODB={endpoint} AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=x \\
      .venv/bin/rasadmin stats --table {table} --region {region}

Ctrl-C stops everything."""

    daemon = Daemon(cfg, reloader=lambda: daemon.cfg)
    tasks: list[asyncio.Task[None]] = []

    async def ready() -> None:
        held = await fill_candidates(daemon, DEV_CANDIDATES, timeout=30.0)
        print(banner.replace("{held}", str(held)), flush=True)

    try:
        # The banner once the daemon answers (DynamoDB warmed, pools loaded, candidates).
        status = uvloop.run(
            run_daemon(
                cfg,
                daemon=daemon,
                on_up=lambda: tasks.append(asyncio.get_running_loop().create_task(ready())),
            )
        )
    finally:
        server.stop()
        print("rasd dev stopped", file=sys.stderr)
    return status
