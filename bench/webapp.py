"""The Flask app of the web bench (``python -m bench.web``): a hot route with and without a lease.

gunicorn serves it (``bench.webapp:app``); everything it needs comes from the environment,
which ``bench.web`` sets for each gunicorn it starts:

* ``RASD_SOCKET`` (the daemon), ``RASD_TIMEOUT``, and ``RASD_CLIENT_TABLE`` (``0``: the
  client's table hit path off) are the client's own settings;
* ``WEBAPP_CLIENT``, ``WEBAPP_POOL``: the client and pool ids; ``WEBAPP_KEYS``: how many keys
  (``WEBAPP_RASD_PREFIX`` + a number for rasd, ``WEBAPP_PAPER_PREFIX`` + a number for the
  paper's agent: two disjoint sets of keys);
* ``WEBAPP_TABLE``, ``WEBAPP_ENDPOINT``, ``WEBAPP_REGION``: where the paper's agent reads.

Routes, each a small JSON body computed from a key drawn at random:

* ``/plain``: the body alone, no lease;
* ``/lease``: the same and ``rasd_client.get_lease`` for the key (10 minutes), its resource
  in the body;
* ``/paper``: the same with the paper's agent (``bench.baseline.BaselineAgent``, ``paper=True``)
  instead of rasd: one boto3 client per worker process, made on its first call (a boto3
  client is not safe across ``fork()``; ``bench.web`` runs gunicorn with ``--preload``, so this
  module, Flask, the client and boto3 are imported once, in the master).

A lease that cannot be had is a 503 with the error's name (wrk counts non-2xx answers).
Nothing is read at import but the environment, with defaults, so the module imports anywhere.
"""

from __future__ import annotations

import os
import random
import time
import zlib
from datetime import timedelta
from typing import Any

from flask import Flask

import rasd_client
from bench.baseline import BaselineAgent

CLIENT = os.environ.get("WEBAPP_CLIENT", "bench")
POOL = os.environ.get("WEBAPP_POOL", "p")
KEYS = int(os.environ.get("WEBAPP_KEYS", "1000"))
RASD_PREFIX = os.environ.get("WEBAPP_RASD_PREFIX", "web-")
PAPER_PREFIX = os.environ.get("WEBAPP_PAPER_PREFIX", "paper-")
TABLE = os.environ.get("WEBAPP_TABLE", "rasd")
ENDPOINT = os.environ.get("WEBAPP_ENDPOINT") or None
REGION = os.environ.get("WEBAPP_REGION", "us-east-1")
LEASE = timedelta(minutes=10)

app = Flask(__name__)

#: this worker's paper agent and the process it was made in
_agent: Any = None
_agent_pid = 0


def key_name(prefix: str, i: int) -> str:
    return f"{prefix}{i:04d}"


def _body(prefix: str) -> dict[str, Any]:
    """A random key of the ``KEYS`` and what a page would compute from it (a bucket)."""
    key = key_name(prefix, random.randrange(KEYS))
    return {"key": key, "bucket": zlib.crc32(key.encode()) % 100}


def _paper_agent() -> Any:
    global _agent, _agent_pid
    if _agent is None or _agent_pid != os.getpid():
        _agent = BaselineAgent(TABLE, REGION, ENDPOINT, paper=True, max_pool_connections=2)
        _agent_pid = os.getpid()
    return _agent


@app.get("/plain")
def plain() -> dict[str, Any]:
    return _body(RASD_PREFIX)


@app.get("/lease")
def lease() -> tuple[dict[str, Any], int]:
    body = _body(RASD_PREFIX)
    try:
        got = rasd_client.get_lease(CLIENT, POOL, body["key"], LEASE)
    except rasd_client.RasdError as exc:
        return {**body, "error": exc.code}, 503
    body["resource"] = got.resource
    return body, 200


@app.get("/paper")
def paper() -> tuple[dict[str, Any], int]:
    body = _body(PAPER_PREFIX)
    until_us = int((time.time() + LEASE.total_seconds()) * 1e6)
    try:
        got = _paper_agent().get_lease(CLIENT, POOL, body["key"], until_us)
    except Exception as exc:  # noqa: BLE001 - an answer the app could not give: a 503
        return {**body, "error": type(exc).__name__}, 503
    body["resource"] = got.resource
    return body, 200
