"""``rasd dev``: everything on loopback, for demos and development.

moto's server in its own process on a free 127.0.0.1 port (request log to a file), the table,
a demo pool with resources, and the daemon on a local socket. Ctrl-C stops it all.

moto runs apart from the daemon because both are Python: in one process they share one GIL,
and a burst of new keys (each a few DynamoDB calls) then starves both, until calls time out,
the retry quota runs dry and the circuit breaker opens. :data:`DEV_SETTINGS` are what the
daemon changes from the production defaults for a local moto, each with why; production
keeps its defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import sys
import tempfile
import time
from typing import Any

from ..config import Config

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
    # Background refills get this long (a request's own deadline is its client's), and a
    # late moto is no outage: the circuit breaker opens only after far more failed calls.
    "default_deadline": 10.0,
    "breaker_failures": 500,
    # One daemon: nobody else takes its candidates, so they stay good, and enough of them
    # are kept (DEV_CANDIDATES before the banner) for a burst of 200 new keys to claim
    # without sweeping the index: every request that finds the buffer empty sweeps all ten
    # sub-partitions, and on moto 200 sweeps take many seconds.
    "candidate_max_age": 3600.0,
    "prefetch_min": 512,
    "prefetch_max": 1024,
    "prefetch_page": 128,
    "prefetch_warm": 10.0,
}
#: claim candidates the demo pool holds before the banner is printed
DEV_CANDIDATES = 256


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


def run_dev(args: argparse.Namespace) -> int:
    require_moto()
    import boto3
    import uvloop

    from ..core import schema
    from ..observe import log
    from ..server import Daemon, run_daemon, socketfile
    from . import motoserver

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

    table = "rasd"
    ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name=args.region)
    schema.create_table(ddb, table)
    schema.put_pool(ddb, table, DEMO_CLIENT, DEMO_POOL, 86400)
    n = schema.add_resources(
        ddb,
        table,
        DEMO_CLIENT,
        DEMO_POOL,
        args.region,
        (f"demo-{i:05d}" for i in range(args.resources)),
    )
    cfg = Config(
        table=table,
        region=args.region,
        socket=sock,
        endpoint_url=endpoint,
        log_level=args.log_level,
        socket_mode=0o666,
        **DEV_SETTINGS,
    ).validate()
    log.configure(cfg.log_level)

    banner = f"""rasd dev is up
  DynamoDB (moto): {endpoint}   (request log: {moto_log})
  table {table!r}, pool {DEMO_CLIENT}/{DEMO_POOL} with {n} resources in {args.region}
  ({{held}} claim candidates prefetched: takes a burst of 200 new keys at once)
  socket: {sock}

Try it from another terminal (in this checkout):

  RASD_SOCKET={sock} .venv/bin/python -c '
import rasd_client, datetime
lease = rasd_client.get_lease(
    "{DEMO_CLIENT}", "{DEMO_POOL}", "user-42", datetime.timedelta(hours=1))
print(lease)'

  .venv/bin/rasd stats --socket {sock}
  AWS_ENDPOINT_URL_DYNAMODB={endpoint} AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=x \\
      .venv/bin/rasadmin stats --table {table} --region {args.region}

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
