"""Plumbing shared by ``rasadmin``, ``ras-liberator``, ``ras-dedupe`` and ``ras-balancer``:
flags over the environment, JSON logs and summary, exit codes (:func:`run_main`), the
daemons' config and its time bounds (:func:`daemon_config`), the clock check before writing.
The conventions: docs/operations.md, "Conventions shared by every command".
"""

from __future__ import annotations

import argparse
import email.utils
import json
import os
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TextIO

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError, NoRegionError
from botocore.exceptions import ConnectionError as BotoConnectionError

from rasd.config import Config, ConfigError
from rasd.config import load as load_config
from rasd.core import clock_trust
from rasd.core.lease import (
    REGION_RE,
    US,
    ResourceItem,
    fmt_time,
    parse_time,
    valid_name,
)
from rasd.core.rollout import ROLLOUT_KEY, SIGNAL_KEY, Rollout, rollout_from, set_rollout
from rasd.core.serialize import item_from_ddb
from rasd.core.writes import item_from_av, key_av, render
from rasd.kernelclock import read_host_bound
from rasd.observe import log as rasd_log

from . import metrics as jobmetrics

EXIT_OK = 0
EXIT_ERRORS = 1
EXIT_USAGE = 2

ENV_VARS = """\
environment (flags override):
  RASD_TABLE                 table name (default "rasd")
  RASD_REGION                the RAS region whose items this command manages
  AWS_REGION                 the DynamoDB client's region (default: the RAS region)
  AWS_ENDPOINT_URL_DYNAMODB  DynamoDB endpoint (else AWS_ENDPOINT_URL, else AWS)
  AWS_PROFILE, AWS_ACCESS_KEY_ID, ...  credentials, as boto3 reads them
"""
ENV_HELP = ENV_VARS + (
    "\nexit status: 0 done, 1 the job hit errors (see the logs on stderr), 2 bad usage or names.\n"
)


class UsageError(Exception):
    """Bad flags or names: the command prints the message and exits 2."""


class JobError(Exception):
    """The job cannot go on (table missing, endpoint unreachable): message and exit 1."""


# ------------------------------------------------------------------------------ arguments
def connection_parent() -> argparse.ArgumentParser:
    """``--table``, ``--region``, ``--endpoint-url``, ``--log-level``: on every command."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("connection")
    g.add_argument(
        "--table",
        default=os.environ.get("RASD_TABLE") or "rasd",
        help='DynamoDB table (env RASD_TABLE, default "rasd")',
    )
    g.add_argument(
        "--region",
        default=None,
        help="the RAS region: whose items to manage (env RASD_REGION). The DynamoDB client "
        "uses AWS_REGION if set, else this",
    )
    g.add_argument(
        "--endpoint-url",
        default=None,
        help="DynamoDB endpoint (default: boto3 reads AWS_ENDPOINT_URL_DYNAMODB, then "
        "AWS_ENDPOINT_URL, then uses AWS)",
    )
    g.add_argument(
        "--log-level",
        default=os.environ.get("RASD_LOG_LEVEL") or "info",
        choices=["debug", "info", "warning", "error"],
        help="stderr log level (env RASD_LOG_LEVEL, default info)",
    )
    g.add_argument(
        "--config",
        default=os.environ.get("RASD_CONFIG") or None,
        metavar="FILE",
        help="the daemons' TOML config file (env RASD_CONFIG): skew_margin, max_clock_skew, "
        "confirm_interval and replication_lag (the quarantine) are taken from it, so the "
        "job keeps the daemons' bounds (default: the daemons' defaults and RASD_* overrides)",
    )
    # Hidden: the jobs' notion of "now", so tests pass time in instead of sleeping.
    g.add_argument("--now", default=None, help=argparse.SUPPRESS)
    return p


def job_parent() -> argparse.ArgumentParser:
    """Options of the scheduled jobs (liberator, dedupe) on top of the connection ones."""
    p = argparse.ArgumentParser(add_help=False, parents=[connection_parent()])
    g = p.add_argument_group("job")
    g.add_argument(
        "--dry-run", action="store_true", help="read and report, write nothing to the table"
    )
    g.add_argument(
        "--segments",
        type=positive_int,
        default=4,
        help="parallel Scan segments, one thread each (default 4)",
    )
    g.add_argument(
        "--page-size",
        type=positive_int,
        default=None,
        help="items per Scan page (Limit); smaller pages smooth read capacity use "
        "(default: DynamoDB's 1 MB pages)",
    )
    jobmetrics.add_flags(g)
    return p


def wrap(text: str) -> str:
    """Fill a description to 79 columns (the help formatter keeps it raw for the epilog)."""
    return textwrap.fill(text, 79)


def parser(prog: str, description: str, parents: Sequence[argparse.ArgumentParser]) -> Any:
    return argparse.ArgumentParser(
        prog=prog,
        description=wrap(description),
        parents=list(parents),
        epilog=ENV_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def positive_int(s: str) -> int:
    try:
        n = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {s!r}")
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {s!r}")
    return n


def non_negative_float(s: str) -> float:
    try:
        x = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {s!r}")
    if not x >= 0 or x == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0: {s!r}")
    return x


def ras_region(args: argparse.Namespace, required: bool = True) -> str | None:
    """The RAS region: ``--region``, else ``RASD_REGION``. Validated; UsageError if missing."""
    region = args.region or os.environ.get("RASD_REGION") or None
    if region is None:
        if required:
            raise UsageError("no region: pass --region or set RASD_REGION")
        return None
    check_region(region)
    return region


def check_region(region: str) -> None:
    if not REGION_RE.match(region):
        raise UsageError(f"bad region {region!r}: expected lower-case letters, digits and '-'")


def check_name(what: str, value: str) -> None:
    if not valid_name(value):
        raise UsageError(
            f"bad {what} {value!r}: 1-64 characters of letters, digits, '_' and '-' (no '.' or '#')"
        )


def daemon_config(args: argparse.Namespace) -> Config:
    """The daemons' config as ``--config`` (and ``RASD_*``) give it: the time bounds a job
    must keep with them (``Config.rules()``, ``Config.quarantine``)."""
    try:
        return load_config(getattr(args, "config", None))
    except ConfigError as exc:
        raise UsageError(str(exc))


def now_us(args: argparse.Namespace) -> int:
    """``--now`` (epoch seconds or ``YYYY-MM-DDTHH:MM:SS[.ffffff]Z``), else the wall clock."""
    raw = getattr(args, "now", None)
    if raw is None:
        return time.time_ns() // 1000
    return parse_now(raw)


def parse_now(raw: str) -> int:
    try:
        return int(float(raw) * US)
    except ValueError:
        pass
    s = raw if "." in raw else raw.replace("Z", ".000000Z")
    try:
        return parse_time(s)
    except ValueError:
        raise UsageError(f"bad --now {raw!r}: epoch seconds or YYYY-MM-DDTHH:MM:SS.ffffffZ")


# --------------------------------------------------------------------------------- client
#: The message of a command that has no region at all: boto3's own words ("You must specify
#: a region") name neither rasd's flag nor its variable.
NO_REGION = (
    "no region: pass --region or set RASD_REGION (or AWS_REGION, the DynamoDB client's "
    "region; read-only commands filter by --region alone)"
)

#: rasadmin's commands are run by a person waiting for them: a DynamoDB that does not answer
#: the connect is said within seconds, where a job's retries ride out a blip (a minute).
INTERACTIVE_CONNECT_TIMEOUT = 3.0
#: Connects tried per call by an interactive client (:func:`cap_connect_attempts`).
INTERACTIVE_CONNECT_ATTEMPTS = 2


def make_client(
    args: argparse.Namespace,
    region: str | None,
    pool: int = 10,
    interactive: bool = False,
    clock: bool = True,
) -> Any:
    """A boto3 DynamoDB client. Region: ``AWS_REGION`` if set, else the RAS region (else
    boto3's own resolution). Retries in botocore's adaptive mode: jobs are batch work and
    should slow down under throttling rather than fail. ``interactive`` (rasadmin): a short
    connect timeout and few connects (:func:`client_for`). Its first write checks this
    host's clock first (:func:`guard_writes`), unless ``--now`` gives the job its time."""
    client = client_for(getattr(args, "endpoint_url", None), region, pool, interactive=interactive)
    if clock and getattr(args, "now", None) is None:
        guard_writes(client, getattr(args, "table", "rasd"), lambda: daemon_config(args))
    return client


#: the calls that write the table
WRITES = ("UpdateItem", "PutItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems")


def guard_writes(ddb: Any, table: str, config: Callable[[], Config]) -> None:
    """Before the first write through ``ddb``: :func:`check_clock` (once). A job writes times
    other hosts compare (lease ends, quarantines); on a clock that is not trusted it writes
    nothing and exits 1 saying why. Reads, listings and usage errors never ask."""
    checked: list[bool] = []

    def before_write(**_: Any) -> None:
        if not checked:
            check_clock(ddb, table, config())
            checked.append(True)

    for op in WRITES:
        ddb.meta.events.register(f"before-call.dynamodb.{op}", before_write)


def check_clock(ddb: Any, table: str, cfg: Config) -> None:
    """JobError unless this host's clock is trusted within half of ``max_clock_skew``, by
    the witnesses ``clock_check`` names, as the daemons judge theirs
    (``rasd.core.clock_trust``): the kernel's error bound, and the Date header of one read
    of the rollout record."""
    if cfg.clock_check == "off":
        return
    kernel = read_host_bound() if cfg.clock_check == "kernel" else None
    sent = time.time_ns() // 1000
    resp = ddb.get_item(TableName=table, Key=key_av(ROLLOUT_KEY), ProjectionExpression="kind")
    got = time.time_ns() // 1000
    raw = resp.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    floor = None
    if raw:
        date_s = int(email.utils.parsedate_to_datetime(raw).timestamp())
        floor = clock_trust.date_offset_floor_us(date_s, sent, got)
    why = clock_trust.judge(int(cfg.max_clock_skew * US / 2), kernel, floor, 0)
    if why is not None:
        raise JobError(
            f"this host's clock is not trusted: {why}. The job writes times that other hosts "
            "compare (lease ends, quarantines), so it writes nothing (clock_check "
            f'"{cfg.clock_check}", from --config or RASD_CLOCK_CHECK; docs/operations.md, '
            '"The clock alert")'
        )


def client_for(
    endpoint_url: str | None,
    region: str | None,
    pool: int = 10,
    exact_region: bool = False,
    interactive: bool = False,
) -> Any:
    """A client for ``endpoint_url``. Its region is ``AWS_REGION`` if set, else ``region``;
    ``exact_region=True`` signs for ``region`` whatever AWS_REGION says (ras-balancer's peer
    replicas; ras-dedupe's peers follow AWS_REGION so that one moto table can stand in for
    every replica in tests). UsageError (:data:`NO_REGION`) when no region is found at all.

    ``interactive``: connects time out after :data:`INTERACTIVE_CONNECT_TIMEOUT` and are
    tried :data:`INTERACTIVE_CONNECT_ATTEMPTS` times per call; throttling and server errors
    are retried as a job's are."""
    try:
        client = boto3.client(
            "dynamodb",
            region_name=region if exact_region else (os.environ.get("AWS_REGION") or region),
            endpoint_url=endpoint_url,
            config=BotoConfig(
                max_pool_connections=max(10, pool),
                retries={"max_attempts": 8, "mode": "adaptive"},
                connect_timeout=INTERACTIVE_CONNECT_TIMEOUT if interactive else 5,
                read_timeout=30,
            ),
        )
    except NoRegionError:
        raise UsageError(NO_REGION) from None
    if interactive:
        cap_connect_attempts(client, INTERACTIVE_CONNECT_ATTEMPTS)
    note_where(client)
    return client


def cap_connect_attempts(client: Any, most: int) -> None:
    """End a call after ``most`` failed connects (no answer, refused, no such host), where
    botocore's retries would go on for a minute with growing pauses. Its retry handler
    decides every other retry: this one runs first and raises the connect's error."""

    def give_up(attempts: int, caught_exception: BaseException | None = None, **_: Any) -> None:
        if isinstance(caught_exception, BotoConnectionError) and attempts >= most:
            raise caught_exception

    client.meta.events.register_first("needs-retry.dynamodb", give_up)


def unreachable(exc: BaseException) -> str:
    """What to say when a client could not connect: the endpoint and region it tried (noted
    by :func:`note_where`), and where the endpoint comes from: a forgotten one is AWS's
    endpoint for the region."""
    where: dict[str, Any] = getattr(exc, "rasd_where", None) or {}
    return (
        f"cannot connect to DynamoDB at {where.get('endpoint', '?')} (region "
        f"{where.get('region', '?')}): {exc}. The endpoint is --endpoint-url, else "
        "AWS_ENDPOINT_URL_DYNAMODB or AWS_ENDPOINT_URL, else AWS's for the region (for "
        "`rasd dev`: the DynamoDB (moto) URL its banner prints)"
    )


#: Where an error answer of a client of :func:`client_for` came from (``table``, ``region``,
#: ``endpoint``): a key of the ``ClientError``'s ``response``.
WHERE = "RasdWhere"


def note_where(client: Any) -> None:
    """Have ``client``'s error answers say which table, region and endpoint were asked: a
    ResourceNotFoundException from another region's endpoint names a table that exists. A
    call that got no answer (it could not connect) carries the same, as the exception's
    ``rasd_where`` attribute (:func:`unreachable`)."""
    endpoint, region = client.meta.endpoint_url, client.meta.region_name

    def before(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context[WHERE] = params.get("TableName")

    def after(parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        if "Error" in parsed:
            parsed[WHERE] = {"table": context.get(WHERE), "region": region, "endpoint": endpoint}

    def failed(exception: BaseException, **_: Any) -> None:
        if isinstance(exception, BotoConnectionError):
            where = {"region": region, "endpoint": endpoint}
            exception.rasd_where = where  # type: ignore[attr-defined]

    client.meta.events.register("before-parameter-build.dynamodb", before)
    client.meta.events.register("after-call.dynamodb", after)
    client.meta.events.register("after-call-error.dynamodb", failed)


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def not_found(exc: ClientError, table: str | None = None) -> str:
    """What to say when DynamoDB answers ResourceNotFoundException: the table, region and
    endpoint asked. Not "create the table": it is more often asked in the wrong place."""
    where: dict[str, Any] = exc.response.get(WHERE) or {}  # type: ignore[assignment]
    table = where.get("table") or table
    said = exc.response.get("Error", {}).get("Message") or "ResourceNotFoundException"
    return (
        f"DynamoDB at {where.get('endpoint', '?')} (region {where.get('region', '?')}) "
        f"has no table {table!r} ({said}). If the table exists, this is the wrong region or "
        "endpoint: the client's region is AWS_REGION if set, else --region/RASD_REGION (with "
        "one table for every RAS region, set AWS_REGION to the table's region); the endpoint "
        "is --endpoint-url, else AWS_ENDPOINT_URL_DYNAMODB or AWS_ENDPOINT_URL. Only a table "
        "that exists nowhere needs `rasadmin create-table`, against the endpoint it belongs to"
    )


def describe_error(exc: BaseException) -> str:
    """An error for a log line: :func:`not_found`'s words for a missing table, else its repr."""
    if isinstance(exc, ClientError) and error_code(exc) == "ResourceNotFoundException":
        return not_found(exc)
    if isinstance(exc, BotoConnectionError):
        return unreachable(exc)
    return repr(exc)


def is_lost_race(exc: BaseException) -> bool:
    return isinstance(exc, ClientError) and error_code(exc) == "ConditionalCheckFailedException"


# -------------------------------------------------------------------------------- logging
def setup_logging(level: str = "info", stream: TextIO | None = None) -> None:
    """structlog: one JSON object per line on stderr, with an ISO UTC timestamp."""
    rasd_log.configure(level, stream, cache=False)


def emit(summary: dict[str, Any], stream: TextIO | None = None) -> None:
    """The one-line JSON result on stdout."""
    out = stream or sys.stdout
    out.write(json.dumps(summary, sort_keys=False, default=str) + "\n")
    out.flush()


def fail(prog: str, message: str, code: int) -> int:
    sys.stderr.write(f"{prog}: error: {message}\n")
    sys.stderr.flush()
    return code


def has_errors(summary: dict[str, Any]) -> bool:
    """The scheduled jobs' verdict: exit 1 when the summary counts errors."""
    return bool(summary.get("errors"))


def run_main(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    job: Callable[[argparse.Namespace], dict[str, Any] | int],
    failed: Callable[[dict[str, Any]], bool] = has_errors,
    metrics: Callable[[], Sequence[jobmetrics.Sample]] | None = None,
) -> int:
    """Every job's ``main``: parse ``argv``, log at ``--log-level``, run ``job(args)``.

    A job that returns its summary has it printed as the one JSON line on stdout and exits
    ``EXIT_ERRORS`` when ``failed(summary)``, else ``EXIT_OK``; a command that prints its own
    output (rasadmin's) returns its exit status instead. UsageError, JobError and botocore's
    failures become a message on stderr (``PROG: error: ...``) and their exit status.

    A scheduled job's run is then published for Prometheus where its flags say
    (``rasd_jobs.metrics``): the summary, the exit status and ``metrics()``'s samples."""
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    prog = parser.prog
    summary: dict[str, Any] | None = None
    try:
        out = job(args)
        if isinstance(out, int):
            return out
        emit(out)
        summary = out
        status = EXIT_ERRORS if failed(out) else EXIT_OK
    except UsageError as exc:
        status = fail(prog, str(exc), EXIT_USAGE)
    except JobError as exc:
        status = fail(prog, str(exc), EXIT_ERRORS)
    except ClientError as exc:
        code = error_code(exc)
        if code == "ResourceNotFoundException":
            status = fail(prog, not_found(exc, getattr(args, "table", None)), EXIT_ERRORS)
        else:
            status = fail(prog, f"DynamoDB: {exc}", EXIT_ERRORS)
    except BotoConnectionError as exc:
        status = fail(prog, unreachable(exc), EXIT_ERRORS)
    except BotoCoreError as exc:
        status = fail(prog, f"DynamoDB unreachable or misconfigured: {exc}", EXIT_ERRORS)
    except KeyboardInterrupt:
        status = fail(prog, "interrupted", 130)
    jobmetrics.publish(args, prog, summary, status, metrics() if metrics is not None else ())
    return status


# ------------------------------------------------------------------------------ scanning
def scan_pages(ddb: Any, kw: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Scan or Query responses, page by page (kw must hold TableName), through boto3's
    paginator: a Query when ``kw`` has a KeyConditionExpression, else a Scan."""
    op = "query" if "KeyConditionExpression" in kw else "scan"
    pages: Iterator[dict[str, Any]] = ddb.get_paginator(op).paginate(**kw)
    yield from pages


def parallel_scan(
    ddb: Any,
    kw: dict[str, Any],
    segments: int,
    handle: Callable[[int, dict[str, Any]], None],
) -> list[BaseException | None]:
    """Scan in ``segments`` threads (``Segment``/``TotalSegments``), handing each page to
    ``handle(segment, page)`` before reading the next: memory stays at one page per thread.

    Returns per segment the exception that stopped it, or None. ``handle`` must be
    thread-safe (the jobs keep per-segment counters and sum them at the end)."""

    def one(seg: int) -> BaseException | None:
        try:
            for page in scan_pages(ddb, {**kw, "Segment": seg, "TotalSegments": segments}):
                handle(seg, page)
        except Exception as exc:  # noqa: BLE001 - reported by the caller, per segment
            return exc
        return None

    if segments == 1:
        return [one(0)]
    with ThreadPoolExecutor(max_workers=segments, thread_name_prefix="scan") as pool:
        return list(pool.map(one, range(segments)))


def parsed(raw: dict[str, Any], counts: Counter[str], log: Any) -> ResourceItem | None:
    """A scanned item as a :class:`ResourceItem`; None when it does not parse (counted under
    ``errors``, logged as ``bad_item``: the job goes on with the next)."""
    try:
        return item_from_ddb(raw)
    except (KeyError, ValueError) as exc:
        counts["errors"] += 1
        log.error("bad_item", item=str(raw)[:300], error=str(exc))
        return None


def segments_total(
    per_segment: Sequence[Counter[str]], failures: Sequence[BaseException | None], log: Any
) -> Counter[str]:
    """The segments' counts summed (:func:`parallel_scan`); a segment that a failure stopped
    counts as an error and a ``failed_segments`` (logged as ``segment_failed``)."""
    total: Counter[str] = Counter()
    for c in per_segment:
        total.update(c)
    for seg, exc in enumerate(failures):
        if exc is not None:
            total["errors"] += 1
            total["failed_segments"] += 1
            log.error("segment_failed", segment=seg, error=describe_error(exc))
    return total


def summary_tail(summary: dict[str, Any], counts: Counter[str], would: str) -> dict[str, Any]:
    """A scheduled job's summary with what a dry run would have written (``would``) and the
    failed Scan segments, when there are any."""
    if summary["dry_run"]:
        summary[would] = counts[would]
    if counts["failed_segments"]:
        summary["failed_segments"] = counts["failed_segments"]
    return summary


# ------------------------------------------------------------------------------ progress
class Progress:
    """A one-line progress counter on stderr, drawn only when stderr is a terminal."""

    def __init__(self, label: str, total: int | None = None, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.on = self.stream.isatty()
        self.label = label
        self.total = total
        self.done = 0
        self._last = 0.0

    def add(self, n: int = 1) -> None:
        self.done += n
        if not self.on:
            return
        t = time.monotonic()
        if t - self._last < 0.1 and (self.total is None or self.done < self.total):
            return
        self._last = t
        if self.total:
            width = 30
            filled = width * min(self.done, self.total) // self.total
            bar = "#" * filled + "." * (width - filled)
            self.stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total}")
        else:
            self.stream.write(f"\r{self.label} {self.done}")
        self.stream.flush()

    def close(self) -> None:
        if self.on and self.done:
            self.stream.write("\n")
            self.stream.flush()


def iso(us: int | None) -> str | None:
    return fmt_time(us) if us is not None else None


def seconds(x: float) -> int | float:
    """A number of seconds as the commands print it: an int when whole (7200, not 7200.0)."""
    return int(x) if float(x).is_integer() else float(x)


def parse_peer(s: str) -> tuple[str, str]:
    """``REGION=URL`` from ``--peer-endpoint`` (another region's replica endpoint)."""
    region, sep, url = s.partition("=")
    if not sep or not url:
        raise UsageError(f"bad --peer-endpoint {s!r}: expected REGION=URL")
    check_region(region)
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"bad --peer-endpoint {s!r}: URL must start with http(s)://")
    return region, url


def add_peer_endpoint(group: Any, help: str) -> None:
    """The repeatable ``--peer-endpoint REGION=URL`` flag (ras-dedupe, ras-balancer)."""
    group.add_argument(
        "--peer-endpoint", action="append", default=[], metavar="REGION=URL", help=help
    )


# ------------------------------------------------------------------- the rollout record
def read_rollout(ddb: Any, table: str) -> Rollout:
    """The table's rollout record and the daemons' signal (``rasd.core.rollout``), read
    strongly consistent."""
    raw, sig = (
        ddb.get_item(TableName=table, Key=key_av(k), ConsistentRead=True).get("Item")
        for k in (ROLLOUT_KEY, SIGNAL_KEY)
    )
    return rollout_from(item_from_av(raw) if raw else None, item_from_av(sig) if sig else None)


def write_rollout(
    ddb: Any, table: str, on: bool, seen: Rollout, by: str, why: str, ends_at_us: int | None = None
) -> bool:
    """Turn rollout mode on or off (``rollout.set_rollout``), conditional on the record
    ``seen``: False when someone changed it since (read it again)."""
    w = set_rollout(on, seen, int(time.time() * US), by, why, ends_at_us)
    try:
        ddb.update_item(TableName=table, **render(w))
    except ClientError as exc:
        if is_lost_race(exc):
            return False
        raise
    return True


def raise_rollout(ddb: Any, table: str, by: str, why: str, log: Any) -> None:
    """A lease of the paper's agent was found while the record says none writes the table:
    log it as an error and turn rollout mode on, so every daemon and job follows."""
    log.error("paper_lease_outside_rollout", why=why, hint="rollout mode turned on")
    for _ in range(3):
        seen = read_rollout(ddb, table)
        if seen.paper_agents or write_rollout(ddb, table, True, seen, by, why):
            return
