"""What a scheduled job publishes for Prometheus: how its run went, and (``ras-balancer``) each
pool's capacity per region, to a Pushgateway and/or a textfile-collector file. Where, the
labels and the families: docs/operations.md, "Job and capacity metrics".
"""

from __future__ import annotations

import argparse
import math
import os
import re
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

log = structlog.get_logger("rasd_jobs.metrics")

#: How long a push may take before it is given up (the job has already done its work).
PUSH_TIMEOUT = 10.0

_HELP = {
    "ras_job_last_run_timestamp_seconds": "When the job's last run ended (Unix time).",
    "ras_job_last_success_timestamp_seconds": "When a run of the job last ended with exit 0.",
    "ras_job_failed": "1 when the job's last run exited non-zero (errors, refused, failed).",
    "ras_job_errors": "Errors the job's last summary counted (0 when it counts none).",
    "ras_job_duration_seconds": "How long the job's last run took.",
    "ras_pool_free": "Free (claimable) items of the pool in the region after the run's moves.",
    "ras_pool_projected_demand": "Acquisitions the balancer projects over its horizon.",
    "ras_pool_headroom": "Free items less the projected demand over the balancer's horizon.",
    "ras_pool_target_free": "Free items the balancer aims to keep in the region.",
    "ras_pool_horizon_seconds": "The horizon the balancer projects demand over.",
}
_NAME = re.compile(r"[^a-zA-Z0-9_]")


@dataclass(frozen=True)
class Sample:
    name: str
    value: float
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PoolCapacity:
    """One (client, pool, region) as the balancer left it."""

    free: int
    projected_demand: float
    target: int


# ---------------------------------------------------------------------------------- flags
def add_flags(group: Any) -> None:
    """``--pushgateway`` and ``--metrics-file`` on a job's parser."""
    group.add_argument(
        "--pushgateway",
        default=os.environ.get("RASD_PUSHGATEWAY") or None,
        metavar="URL",
        help="push the run's metrics to this Prometheus Pushgateway (env RASD_PUSHGATEWAY), "
        "group job=ras-<job>, instance=<table>:<region> (docs/operations.md)",
    )
    group.add_argument(
        "--metrics-file",
        default=os.environ.get("RASD_METRICS_FILE") or None,
        metavar="PATH",
        help="write the run's metrics to this node_exporter textfile-collector file "
        "(env RASD_METRICS_FILE; PATH must end in .prom)",
    )


# -------------------------------------------------------------------------------- samples
def job_samples(summary: Mapping[str, Any] | None, status: int, now: float) -> list[Sample]:
    """The run's own families, from its summary (None: the run failed before it had one)
    and its exit status. ``ras_job_last_success_timestamp_seconds`` only for a success."""
    out = [
        Sample("ras_job_last_run_timestamp_seconds", now),
        Sample("ras_job_failed", float(status != 0)),
    ]
    if status == 0:
        out.append(Sample("ras_job_last_success_timestamp_seconds", now))
    if summary is None:
        return out
    out.append(Sample("ras_job_errors", _number(summary.get("errors")) or 0.0))
    for field, value in summary.items():
        x = _number(value)
        if x is None or field == "errors":
            continue
        name = "ras_job_duration_seconds" if field == "seconds" else f"ras_job_{field}"
        out.append(Sample(_NAME.sub("_", name), x))
    return out


def pool_samples(
    capacity: Mapping[tuple[str, str, str], PoolCapacity], horizon_s: float
) -> list[Sample]:
    """The balancer's view of every (client, pool, region)."""
    out = [Sample("ras_pool_horizon_seconds", horizon_s)]
    for (c, p, r), cap in sorted(capacity.items()):
        labels = (("client_id", c), ("pool_id", p), ("region", r))
        demand = math.ceil(cap.projected_demand - 1e-9)
        out += [
            Sample("ras_pool_free", cap.free, labels),
            Sample("ras_pool_projected_demand", round(cap.projected_demand, 3), labels),
            Sample("ras_pool_headroom", cap.free - demand, labels),
            Sample("ras_pool_target_free", cap.target, labels),
        ]
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


# ----------------------------------------------------------------------------- exposition
def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt(x: float) -> str:
    return repr(int(x)) if x == int(x) and abs(x) < 2**53 else repr(x)


def exposition(samples: Iterable[Sample], identity: Sequence[tuple[str, str]] = ()) -> str:
    """Prometheus's text format (0.0.4), every sample with the ``identity`` labels first;
    every family a gauge."""
    families: dict[str, list[Sample]] = {}
    for s in samples:
        families.setdefault(s.name, []).append(s)
    lines: list[str] = []
    for name, rows in families.items():
        lines.append(f"# HELP {name} {_HELP.get(name, f'The summary field of the run: {name}.')}")
        lines.append(f"# TYPE {name} gauge")
        for s in rows:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in (*identity, *s.labels))
            lines.append(
                f"{name}{{{labels}}} {_fmt(s.value)}" if labels else f"{name} {_fmt(s.value)}"
            )
    return "\n".join(lines) + "\n"


def identity(job: str, table: str, region: str | None) -> tuple[tuple[str, str], ...]:
    return (("ras_job", job), ("table", table), ("ras_region", region or "all"))


# ------------------------------------------------------------------------------ publishing
def push_url(gateway: str, job: str, table: str, region: str | None) -> str:
    """The Pushgateway group of one job's runs (its labels are not in the pushed samples)."""
    group = (f"ras-{job}", f"{table}:{region or 'all'}")
    job_part, instance = (urllib.parse.quote(v, safe="") for v in group)
    return f"{gateway.rstrip('/')}/metrics/job/{job_part}/instance/{instance}"


def push(gateway: str, job: str, table: str, region: str | None, body: str) -> None:
    """POST ``body`` to the job's group: replaces the families it carries, keeps the rest."""
    req = urllib.request.Request(
        push_url(gateway, job, table, region),
        data=body.encode(),
        method="POST",
        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
    )
    with urllib.request.urlopen(req, timeout=PUSH_TIMEOUT) as resp:
        resp.read()


def last_success_in(path: str) -> float | None:
    """``ras_job_last_success_timestamp_seconds`` of the previous file at ``path``, if any."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("ras_job_last_success_timestamp_seconds"):
                    return float(line.rsplit(" ", 1)[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def write_file(path: str, body: str) -> None:
    """Write ``body`` to ``path`` at once (a temporary file beside it, then a rename)."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".ras-metrics-", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(body)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def publish(
    args: argparse.Namespace,
    prog: str,
    summary: Mapping[str, Any] | None,
    status: int,
    extra: Sequence[Sample] = (),
    now: float | None = None,
) -> None:
    """Publish one run where ``args`` says (``--pushgateway``, ``--metrics-file``)."""
    gateway = getattr(args, "pushgateway", None)
    path = getattr(args, "metrics_file", None)
    if not gateway and not path:
        return
    if summary is not None and summary.get("status") == "locked":
        return  # another run holds the lock, and publishes
    job = prog.removeprefix("ras-")
    region = getattr(args, "region", None) or os.environ.get("RASD_REGION") or None
    table = str(getattr(args, "table", "") or "rasd")
    t = time.time() if now is None else now
    samples = job_samples(summary, status, t) + list(extra)
    ident = identity(job, table, region)
    if gateway:
        try:
            push(gateway, job, table, region, exposition(samples, ident))
        except (OSError, ValueError) as exc:
            log.error("metrics_push_failed", pushgateway=gateway, error=str(exc))
    if path:
        previous = last_success_in(path) if status != 0 else None
        if previous is not None:
            samples.append(Sample("ras_job_last_success_timestamp_seconds", previous))
        try:
            write_file(path, exposition(samples, ident))
        except OSError as exc:
            log.error("metrics_file_failed", path=path, error=str(exc))
