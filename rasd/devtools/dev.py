"""``rasd dev``: everything on loopback, for demos and development.

moto's server in a thread on a free 127.0.0.1 port (request log to a file), the table, a demo
pool with resources, and the daemon on a local socket. Ctrl-C stops it all.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile

from ..config import Config

DEMO_CLIENT = "demo"
DEMO_POOL = "default"


def _socket_path(workdir: str) -> str:
    path = os.path.abspath(os.path.join(workdir, "rasd.sock"))
    if len(path.encode()) < 100:
        return path
    # AF_UNIX paths are limited to 107 bytes: fall back to a short private directory.
    return os.path.join(tempfile.mkdtemp(prefix="rasd-dev-"), "rasd.sock")


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
    from ..server import run_daemon, socketfile
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
    server, endpoint = motoserver.start(log_file=moto_log)

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
    ).validate()
    log.configure(cfg.log_level)

    banner = f"""rasd dev is up
  DynamoDB (moto): {endpoint}   (request log: {moto_log})
  table {table!r}, pool {DEMO_CLIENT}/{DEMO_POOL} with {n} resources in {args.region}
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

    try:
        # The banner once the daemon answers (DynamoDB warmed, pools loaded).
        status = uvloop.run(run_daemon(cfg, on_up=lambda: print(banner, flush=True)))
    finally:
        server.stop()
        print("rasd dev stopped", file=sys.stderr)
    return status
