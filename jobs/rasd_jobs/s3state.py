"""The balancer's state and metadata snapshot on S3, written so that a crash leaves the
previous state readable (two objects per run, then the pointer). docs/global.md, "State on
S3".
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog
from botocore.exceptions import BotoCoreError, ClientError

log = structlog.get_logger("rasd_jobs.s3state")

POINTER = "latest.json"
KEEP = 24  # runs kept: two hours at one run per 5 minutes, for post-mortems


@dataclass(frozen=True, slots=True)
class Location:
    bucket: str
    prefix: str  # no leading or trailing slash; may be empty

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name


def parse_uri(uri: str) -> Location:
    """``s3://bucket/prefix`` -> Location. Raises ValueError for anything else."""
    if not uri.startswith("s3://"):
        raise ValueError(f"state URI must be s3://bucket/prefix, not {uri!r}")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"state URI has no bucket: {uri!r}")
    return Location(bucket, prefix.strip("/"))


def _run_name(now_us: int, token: str) -> str:
    dt = datetime.fromtimestamp(now_us / 1_000_000, tz=UTC)
    return f"{dt.strftime('%Y%m%dT%H%M%S%fZ')}-{token}"


def _get_json(s3: Any, bucket: str, key: str) -> Any:
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    return json.loads(body)


def _put_json(s3: Any, bucket: str, key: str, doc: Any) -> None:
    body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json")


def _missing(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound")


def load(s3: Any, loc: Location) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(state, pointer) of the last complete run; (None, None) when there is none yet.

    A pointer whose state object is gone (deleted by hand or by a lifecycle rule) is logged and
    treated as no state: the balancer relearns demand, which is safe, rather than stop.
    """
    try:
        pointer = _get_json(s3, loc.bucket, loc.key(POINTER))
    except ClientError as exc:
        if _missing(exc):
            return None, None
        raise
    try:
        state = _get_json(s3, loc.bucket, pointer["state"])
    except ClientError as exc:
        if not _missing(exc):
            raise
        log.warning("state_object_missing", pointer=pointer)
        return None, pointer
    return state, pointer


def save(
    s3: Any,
    loc: Location,
    state: dict[str, Any],
    snapshot: dict[str, Any],
    now_us: int,
    keep: int = KEEP,
    token: str | None = None,
) -> dict[str, Any]:
    """Write state and snapshot as a new run, then move the pointer to it. Returns the pointer."""
    run = _run_name(now_us, token or secrets.token_hex(4))
    state_key = loc.key(f"runs/{run}/state.json")
    snap_key = loc.key(f"runs/{run}/snapshot.json")
    _put_json(s3, loc.bucket, state_key, state)
    _put_json(s3, loc.bucket, snap_key, snapshot)
    pointer = {"run": run, "state": state_key, "snapshot": snap_key, "now_us": now_us}
    _put_json(s3, loc.bucket, loc.key(POINTER), pointer)  # the commit point
    prune(s3, loc, keep, protect=run)
    return pointer


def prune(s3: Any, loc: Location, keep: int, protect: str) -> int:
    """Delete all but the newest ``keep`` runs (never ``protect``). Best effort: returns the
    number of objects deleted, logs and returns 0 on an S3 error."""
    runs_prefix = loc.key("runs/")
    try:
        keys: list[str] = []
        kw: dict[str, Any] = {"Bucket": loc.bucket, "Prefix": runs_prefix}
        while True:
            resp = s3.list_objects_v2(**kw)
            keys.extend(o["Key"] for o in resp.get("Contents", []))
            if not resp.get("IsTruncated"):
                break
            kw["ContinuationToken"] = resp["NextContinuationToken"]
        runs = sorted({k[len(runs_prefix) :].split("/", 1)[0] for k in keys})
        old = set(runs[: max(0, len(runs) - keep)]) - {protect}
        doomed = [k for k in keys if k[len(runs_prefix) :].split("/", 1)[0] in old]
        for i in range(0, len(doomed), 1000):
            s3.delete_objects(
                Bucket=loc.bucket,
                Delete={"Objects": [{"Key": k} for k in doomed[i : i + 1000]], "Quiet": True},
            )
        return len(doomed)
    except (ClientError, BotoCoreError) as exc:
        log.warning("state_prune_failed", error=str(exc))
        return 0
