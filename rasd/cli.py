"""``rasd``: the lease daemon and its helpers.

rasd serve         run the daemon (systemd runs this)
rasd dev           the embedded default: moto on loopback + demo pool + daemon
rasd check-config  print the effective config and exit (non-zero if invalid)
rasd stats         print a running daemon's counters
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .config import Config, ConfigError, acl_refusal, load

ENV_HELP = """\
environment:
  RASD_TABLE, RASD_REGION, RASD_SOCKET   table, RAS region, socket path (flags override)
  RASD_<SETTING>                          any config setting, e.g. RASD_SKEW_MARGIN=5
  AWS_REGION                              DynamoDB client region (defaults to the RAS region)
  AWS_ENDPOINT_URL_DYNAMODB, AWS_ENDPOINT_URL, AWS_PROFILE, AWS_ACCESS_KEY_ID,
  AWS_USE_FIPS_ENDPOINT, AWS_USE_DUALSTACK_ENDPOINT, AWS_CA_BUNDLE, AWS_MAX_ATTEMPTS,
  HTTPS_PROXY, NO_PROXY, ...              as botocore reads them (check-config prints them)
"""


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config", metavar="FILE", help="TOML config file (see systemd/rasd.toml.example)"
    )
    p.add_argument("--socket", metavar="PATH", help="Unix socket to listen on / talk to")
    p.add_argument("--table", help="DynamoDB table name (default: rasd)")
    p.add_argument("--region", help="RAS region this daemon claims items of")
    p.add_argument("--endpoint-url", metavar="URL", help="DynamoDB endpoint (default: AWS's)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])


DEFAULT_ENV_FILE = "/etc/default/rasd"


def read_env_file(path: str) -> dict[str, str]:
    """A systemd ``EnvironmentFile=``: ``KEY=VALUE`` lines, ``#`` comments, optional quotes
    and ``export``. Only the subset operators write in /etc/default files."""
    out: dict[str, str] = {}
    with open(path, encoding="utf-8") as fh:
        for raw in fh:
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("export "):
                line = line[len("export ") :].strip()
            key, sep, value = line.partition("=")
            if not sep:
                raise ConfigError(f"{path}: not KEY=VALUE: {line!r}")
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
                value = value[1:-1]
            out[key.strip()] = value
    return out


def _config(args: argparse.Namespace, env: dict[str, str] | None = None) -> Config:
    return load(
        args.config,
        env=env,
        overrides={
            "socket": args.socket,
            "table": args.table,
            "region": args.region,
            "endpoint_url": args.endpoint_url,
            "log_level": args.log_level,
        },
    )


def _columns() -> int:
    """``shutil.get_terminal_size().columns`` without importing shutil (and bz2 and lzma with
    it, about 0.4 MB the daemon never uses): argparse imports it for every formatter it makes
    unless it is given a width."""
    try:
        n = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        n = 0
    if n <= 0:
        try:
            n = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            n = 0
    return n or 80


def _formatter(cls: type[argparse.HelpFormatter]) -> Any:
    """``cls`` at the width argparse would pick (the terminal's, less 2)."""
    return lambda prog: cls(prog, width=_columns() - 2)


def _command(
    sub: Any, name: str, help: str, description: str | None = None, epilog: str | None = None
) -> argparse.ArgumentParser:
    """A COMMAND of ``rasd``, its help at argparse's width; an ``epilog`` keeps its layout."""
    cls = argparse.RawDescriptionHelpFormatter if epilog else argparse.HelpFormatter
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=description, epilog=epilog, formatter_class=_formatter(cls)
    )
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rasd",
        description="Per-host sidecar handing out exclusive, expiring leases from DynamoDB.",
        epilog=ENV_HELP,
        formatter_class=_formatter(argparse.RawDescriptionHelpFormatter),
    )
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    serve = _command(
        sub,
        "serve",
        "run the daemon",
        "Run the lease daemon. Takes its socket from systemd (LISTEN_FDS) when "
        "socket-activated, else binds --socket. Logs JSON to stderr.",
        epilog=ENV_HELP,
    )
    _common(serve)
    dev = _command(
        sub,
        "dev",
        "embedded default: moto on loopback, a demo pool, and the daemon",
        "Start moto's DynamoDB server on a free loopback port (its request log "
        "goes to DIR/moto.log), create the table, seed a demo pool and serve on DIR/rasd.sock. "
        "The daemon's settings are read as `rasd serve` reads them (--config, then RASD_*, "
        "then flags) over rasd dev's own for moto: RASD_METRICS_PORT=9464 serves metrics. "
        "The socket and the DynamoDB endpoint are rasd dev's. Ctrl-C stops everything.",
    )
    dev.add_argument("--dir", default=".rasd-dev", help="working directory (default .rasd-dev)")
    dev.add_argument("--resources", type=int, default=1000, help="demo resources (default 1000)")
    dev.add_argument(
        "--config", metavar="FILE", help="TOML config file, as for `rasd serve` (optional)"
    )
    dev.add_argument("--region", help="RAS region (default RASD_REGION, else us-east-1)")
    dev.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="default RASD_LOG_LEVEL, else warning",
    )
    check = _command(
        sub,
        "check-config",
        "print the effective config; exit 2 if it is invalid",
        "Print the config `rasd serve` would run with under systemd: the TOML "
        "file, then the RASD_* variables of --env-file (the unit's EnvironmentFile=, default "
        "/etc/default/rasd when it exists) over this shell's, then flags.",
    )
    _common(check)
    check.add_argument(
        "--env-file",
        metavar="FILE",
        default=None,
        help=f"KEY=VALUE file the service reads (default {DEFAULT_ENV_FILE} if present)",
    )
    stats = _command(sub, "stats", "print a running daemon's counters as JSON")
    stats.add_argument("--socket", metavar="PATH", help="daemon socket (default $RASD_SOCKET)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "dev":
        from .devtools.dev import DevUnavailable, run_dev

        try:
            return run_dev(args)
        except DevUnavailable as exc:
            print(f"rasd dev: {exc}", file=sys.stderr)
            return 2
    if args.cmd == "stats":
        import rasd_client

        try:
            out = rasd_client.call_raw("stats", socket_path=args.socket)
        except rasd_client.RasdError as exc:
            print(f"rasd stats: {exc.code}: {exc.message}", file=sys.stderr)
            return 1
        out.pop("v", None), out.pop("id", None), out.pop("ok", None)
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    env: dict[str, str] | None = None
    if args.cmd == "check-config":
        path = args.env_file or (DEFAULT_ENV_FILE if os.path.exists(DEFAULT_ENV_FILE) else None)
        if path:
            try:
                env = {**os.environ, **read_env_file(path)}
            except OSError as exc:
                print(f"rasd: cannot read {path}: {exc}", file=sys.stderr)
                return 2
            except ConfigError as exc:
                print(f"rasd: {exc}", file=sys.stderr)
                return 2
    try:
        cfg = _config(args, env)
    except ConfigError as exc:
        print(f"rasd: {exc}", file=sys.stderr)
        return 2
    refusal = acl_refusal(cfg)
    if args.cmd == "check-config":
        from .server.peercred import Acl, AclError

        try:
            Acl.from_config(cfg.acl)
        except AclError as exc:
            print(f"rasd: {exc}", file=sys.stderr)
            return 2
        out = cfg.public()
        try:
            out["aws"] = _aws_settings(cfg, env).public()
        except ConfigError as exc:
            print(f"rasd: {exc}", file=sys.stderr)
            return 2
        if refusal:  # after the rest: rasd serve would start no further
            print(f"rasd: {refusal}", file=sys.stderr)
            return 2
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    if refusal:
        print(f"rasd: {refusal}", file=sys.stderr)
        return 2
    return serve(cfg, reloader=lambda: _config(args))


def _aws_settings(cfg: Config, env: dict[str, str] | None) -> Any:
    """The AWS settings the daemon would run with (``rasd.dynamo.aws``), botocore reading ``env``
    (the service's environment) as the process environment."""
    from .dynamo import aws

    saved = dict(os.environ)
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        region = os.environ.get("AWS_REGION") or cfg.region
        account, note = _account_id()
        settings = aws.resolve(cfg.endpoint_url, region, account)
        settings.sources["credentials"] = note
        return settings
    finally:
        if env is not None:
            os.environ.clear()
            os.environ.update(saved)


def _account_id() -> tuple[str | None, str]:
    """The credentials' account id, as the daemon will see it (the endpoint may depend on
    it), and a note on what was found. Missing credentials are no config error here: the
    operator's shell is often not the service's user."""
    from .dynamo.sigv4 import resolve_credentials

    try:
        creds = resolve_credentials()
    except Exception as exc:  # noqa: BLE001 - any provider's failure: reported, not fatal
        return None, f"not resolved here ({type(exc).__name__}: {exc})"
    account = creds.account_id
    return account, f"found (account id {account})" if account else "found (no account id)"


def serve(cfg: Config, reloader: Any = None) -> int:
    """Run the daemon until SIGTERM/SIGINT. Takes systemd's socket when socket-activated."""
    if cfg.ddb_client == "lean":
        from .dynamo import awscache

        # an uncached resolution by botocore runs beside the imports below, not after them
        awscache.prefetch(cfg.endpoint_url, os.environ.get("AWS_REGION") or cfg.region)
    import uvloop

    from .observe import log
    from .server import malloc, run_daemon
    from .server.peercred import AclError
    from .server.sdnotify import listen_fds_with_names

    malloc.one_arena()  # before any other thread starts
    log.configure(cfg.log_level)
    from .observe.prom import MetricsUnavailable, require

    if cfg.metrics_port:
        try:
            require()
        except MetricsUnavailable as exc:
            print(f"rasd: {exc}", file=sys.stderr)
            return 2
    try:
        inherited = dict(listen_fds_with_names())
    except ValueError as exc:
        print(f"rasd: bad LISTEN_FDS from the service manager: {exc}", file=sys.stderr)
        return 2
    sock = inherited.get("rasd") or next(iter(inherited.values()), None)
    try:
        status = uvloop.run(run_daemon(cfg, sock, reloader=reloader, on_up=malloc.trim))
    except (AclError, MetricsUnavailable) as exc:
        print(f"rasd: {exc}", file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":
    sys.exit(main())
