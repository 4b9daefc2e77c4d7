"""moto's DynamoDB server on loopback, for ``rasd dev``, the tests, the benchmarks and the
simulation (development only: ``rasd serve`` never imports moto). :func:`start` makes each
conditional write atomic, as in DynamoDB; :func:`fast_queries` spares Queries the work they
do not need; :func:`spawn` runs it in a process of its own (docs/design.md, "Testing against
moto"). ``RASD_MOTO_DELAY`` and ``RASD_MOTO_STALLS`` slow it for the flake hunt
(docs/testing.md).
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

_LOCK = threading.RLock()
_PATCHED = False
WRITE_OPS = ("put_item", "update_item", "delete_item", "transact_write_items", "batch_write_item")
#: reads that walk many items and must not see one half-written (see above)
READ_OPS = ("query", "scan")


def make_writes_atomic() -> None:
    """Serialise moto's DynamoDB writes, and the Queries and Scans that walk an index, in
    this process (idempotent)."""
    global _PATCHED
    if _PATCHED:
        return
    from moto.dynamodb.models import DynamoDBBackend

    for name in WRITE_OPS + READ_OPS:
        original = getattr(DynamoDBBackend, name)

        @functools.wraps(original)
        def locked(self: Any, *args: Any, __original: Any = original, **kw: Any) -> Any:
            with _LOCK:
                return __original(self, *args, **kw)

        setattr(DynamoDBBackend, name, locked)
    _PATCHED = True


_FAST = False
_only = threading.local()  # the items one Query of this thread may see (fast_queries)


def fast_queries() -> None:
    """Base-table Queries list only their partition key's items, index Queries the items of
    their index partition, unsorted (see the module's docstring); idempotent. Runs under the
    lock that :func:`make_writes_atomic` puts around every Query."""
    global _FAST
    if _FAST:
        return
    from moto.dynamodb.models.table import Table

    all_items, query = Table.all_items, Table.query

    @functools.wraps(all_items)
    def listed(self: Any) -> Any:
        only = getattr(_only, "items", None)
        if only is not None and only[0] is self:
            return only[1]
        return all_items(self)

    @functools.wraps(query)
    def fast(self: Any, hash_key: Any, *args: Any, **kw: Any) -> Any:
        index_name = args[6] if len(args) > 6 else kw.get("index_name")
        conds = kw.get("hash_key_conditions") or ()
        if index_name is None and hash_key is not None and self.range_key_attr:
            items = list(self.items.get(hash_key, {}).values())
        elif self.range_key_attr:
            items = [it for per_key in self.items.values() for it in per_key.values()]
        else:
            items = list(self.items.values())
        if index_name is not None and conds:
            # moto's own test of the index's hash key(s), made once here, so that its loop
            # (and sort) walks the items of that index partition, not the whole table
            items = [it for it in items if all(_hash_match(it, n, v) for n, v in conds)]
        _only.items = (self, items)
        try:
            return query(self, hash_key, *args, **kw)
        finally:
            _only.items = None

    Table.all_items = listed  # type: ignore[method-assign]
    Table.query = fast  # type: ignore[method-assign]
    Table.scan = _fast_scan(Table.scan)  # type: ignore[method-assign]
    _FAST = True


def _fast_scan(scan: Any) -> Any:
    """moto's Scan of a base table with a FilterExpression, minus its waste: moto copies
    every item it reads (``deepcopy``) and tests the filter on the copies afterwards, and
    sizes each item twice. Here the filter is tested on the item itself (the copy has the same
    attributes) and only the items that pass are copied; each item is sized once. The pages
    (the 1 MB and ``Limit`` cuts, ``LastEvaluatedKey``) and ``ScannedCount`` are moto's, item
    for item. Index Scans, legacy ``ScanFilter`` and Scans without a filter are moto's own."""
    from moto.dynamodb.models.table import RESULT_SIZE_LIMIT

    @functools.wraps(scan)
    def fast(
        self: Any,
        filters: dict[str, Any],
        limit: int,
        exclusive_start_key: dict[str, Any],
        filter_expression: Any = None,
        index_name: str | None = None,
        consistent_read: bool = False,
        projection_expression: Any = None,
        segments: Any = (None, None),
    ) -> Any:
        if filters or filter_expression is None or index_name:
            return scan(
                self, filters, limit, exclusive_start_key, filter_expression, index_name,
                consistent_read, projection_expression, segments,
            )  # fmt: skip
        hash_attrs, range_attrs = [self.hash_key_attr], [self.range_key_attr]
        results: list[Any] = []
        last: Any = None  # the last item read: moto's LastEvaluatedKey
        read = result_size = 0
        last_evaluated_key = None
        previous_page = exclusive_start_key is not None
        for item in self.all_items():
            if not item.is_within_segment(segments):
                continue
            if previous_page:
                if self._item_comes_before_dct(
                    item, exclusive_start_key, hash_attrs, range_attrs, True
                ):
                    continue
                previous_page = False
            size = item.size()
            if read == limit or result_size + size > RESULT_SIZE_LIMIT:
                last_evaluated_key = self._get_last_evaluated_key(last, None)
                break
            if filter_expression.expr(item):
                results.append(copy.deepcopy(item))
            result_size += size
            read += 1
            last = item
        if projection_expression:
            results = [r.project(projection_expression) for r in results]
        return results, read, last_evaluated_key

    return fast


def _hash_match(item: Any, name: str, value: Any) -> bool:
    """moto's Query test of one index hash key condition (in moto's own query: present, equal)."""
    got = item.attrs.get(name)
    return got is not None and bool(got == value)


class Delayed:
    """A WSGI app whose every request first waits: uniform in [0, 2 x ``mean``] seconds, plus
    ``stall`` seconds for a share ``stall_p`` of them."""

    def __init__(
        self,
        app: Any,
        mean: float,
        stall_p: float = 0.0,
        stall: float = 0.0,
        *,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.app = app
        self.mean = mean
        self.stall_p = stall_p
        self.stall = stall
        self._sleep = sleep
        self._rng = rng or random.Random()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        wait = self._rng.uniform(0.0, 2 * self.mean)
        if self.stall_p and self._rng.random() < self.stall_p:
            wait += self.stall
        self._sleep(wait)
        result: Iterable[bytes] = self.app(environ, start_response)
        return result


class Counted:
    """A WSGI app that counts its requests by operation (the ``X-Amz-Target`` header's
    action, else the HTTP method: S3), for a harness to tell what keeps a backend busy."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        op = target.rpartition(".")[2] or environ.get("REQUEST_METHOD", "?")
        with self._lock:
            self.counts[op] = self.counts.get(op, 0) + 1
        result: Iterable[bytes] = self.app(environ, start_response)
        return result


def delay_from_env(env: dict[str, str] | None = None) -> tuple[float, float, float] | None:
    """(mean, stall_p, stall) as ``RASD_MOTO_DELAY`` and ``RASD_MOTO_STALLS`` ask; None when
    both are unset."""
    env = dict(os.environ) if env is None else env
    mean = env.get("RASD_MOTO_DELAY", "")
    stalls = env.get("RASD_MOTO_STALLS", "")
    if not mean and not stalls:
        return None
    try:
        p, _, secs = stalls.partition(":") if stalls else ("0", "", "0")
        got = (float(mean or 0), float(p), float(secs))
    except ValueError:
        got = (-1.0, 0.0, 0.0)
    if got[0] < 0 or got[2] < 0 or not 0 <= got[1] <= 1:
        raise ValueError(
            f"RASD_MOTO_DELAY={mean!r}, RASD_MOTO_STALLS={stalls!r}: "
            "want SECONDS >= 0 and P:SECONDS, P within [0, 1]"
        )
    return got


def start(
    host: str = "127.0.0.1",
    port: int = 0,
    log_file: str | None = None,
    fast: bool = False,
    counted: Counted | None = None,
) -> tuple[Any, str]:
    """Start moto's server in a thread; returns (server, endpoint_url). ``server.stop()``.
    ``fast``: :func:`fast_queries` too; ``counted``: a :class:`Counted` (its ``app`` unset)
    that every request goes through."""
    from moto.server import ThreadedMotoServer

    make_writes_atomic()
    if fast:
        fast_queries()
    wlog = logging.getLogger("werkzeug")
    if log_file:
        wlog.handlers[:] = [logging.FileHandler(log_file)]
        wlog.propagate = False
        wlog.setLevel(logging.INFO)
    else:
        wlog.setLevel(logging.ERROR)
    delay = delay_from_env()
    server = ThreadedMotoServer(ip_address=host, port=port, verbose=False)
    server.start()
    wsgi = server._server
    if delay is not None and wsgi is not None:
        wsgi.app = Delayed(wsgi.app, *delay)  # werkzeug's handler reads it on each request
    if counted is not None and wsgi is not None:
        counted.app, wsgi.app = wsgi.app, counted
    h, p = server.get_host_and_port()
    return server, f"http://{h}:{p}"


def serve_forever(
    host: str = "127.0.0.1",
    port: int = 0,
    log_file: str | None = None,
    fast: bool = False,
    count_file: str | None = None,
    until_signal: bool = False,
) -> None:
    """``python -m rasd.devtools.motoserver``: print ``PORT n`` and serve until stdin closes
    (for harnesses that want moto in its own process, away from their GIL), then write the
    requests it served by operation to ``count_file`` (JSON). Ctrl-C in a terminal reaches
    the whole process group: the parent decides when this one stops (it closes our stdin), so
    SIGINT is ignored here. ``until_signal``: serve until SIGINT or SIGTERM instead, stdin
    unread (a moto started by hand)."""
    stop = threading.Event()
    if until_signal:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    else:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    counted = Counted(None) if count_file else None
    server, url = start(host, port, log_file=log_file, fast=fast, counted=counted)
    print("PORT", url.rsplit(":", 1)[1], flush=True)
    if until_signal:
        print(f"moto's DynamoDB at {url} until Ctrl-C or SIGTERM", file=sys.stderr, flush=True)
        while not stop.wait(1.0):  # a timed wait: the signal's handler runs between them
            pass
    else:
        sys.stdin.read()
    server.stop()
    if counted is not None and count_file:
        with open(count_file, "w") as f:
            json.dump(dict(sorted(counted.counts.items())), f)


class Spawned:
    """moto's server in a child process (:func:`spawn`): ``proc``; ``port`` and ``endpoint``
    once :meth:`ready`; ``stop()``."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.port = 0
        self.endpoint = ""

    def ready(self, timeout: float = 60.0) -> Spawned:
        """Once it has announced its port (``endpoint`` set); RuntimeError when it exits or
        stays silent ``timeout`` seconds first."""
        if not self.port:
            self.port = announced_port(self.proc, timeout)
            self.endpoint = f"http://127.0.0.1:{self.port}"
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()  # serve_forever returns
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def spawn(
    log_file: str | None = None,
    fast: bool = True,
    count_file: str | None = None,
    env: dict[str, str] | None = None,
    group: bool = False,
    stderr: int | None = None,
    cwd: str | None = None,
    wait: bool = True,
    timeout: float = 60.0,
) -> Spawned:
    """Start moto's server in its own process on a free loopback port, and (``wait``) wait
    until it serves (killed when it does not); every harness that wants moto as a child
    starts it here. ``env``: its environment (default: ours); ``group``: it leads a process
    group of its own; ``stderr``: where its log goes (default: ours); ``cwd``: its working
    directory; ``fast``, ``log_file``, ``count_file``: :func:`serve_forever`'s."""
    argv = [sys.executable, "-m", "rasd.devtools.motoserver"]
    argv += ["--fast"] if fast else []
    argv += ["--log-file", log_file] if log_file else []
    argv += ["--count-file", count_file] if count_file else []
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        env=dict(os.environ) if env is None else env,
        cwd=cwd,
        start_new_session=group,
    )
    server = Spawned(proc)
    if wait:
        try:
            server.ready(timeout)  # moto's import takes a while
        except RuntimeError:
            proc.kill()
            proc.wait()
            raise
    return server


def announced_port(proc: subprocess.Popen[Any], timeout: float = 60.0) -> int:
    """The port in the child's first ``PORT n`` line on stdout (a pipe read no more after
    this). RuntimeError, with what it printed, when it exits or stays silent ``timeout``
    seconds first."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    buf = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buf += chunk
            for line in buf.decode(errors="replace").split("\n")[:-1]:  # whole lines only
                if line.startswith("PORT "):
                    return int(line.split()[1])
        if proc.poll() is not None:
            break
    raise RuntimeError(f"{proc.args!r} announced no port (exit {proc.poll()}): {buf!r}")


def build_parser() -> Any:
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m rasd.devtools.motoserver",
        description="moto's DynamoDB server on 127.0.0.1, its writes atomic as DynamoDB's. "
        "Prints 'PORT n' once it serves, then serves until its stdin closes (it is run as a "
        "child whose parent ends it by closing the pipe: started from a shell with nothing "
        "on stdin, it stops at once). --until-signal serves until Ctrl-C or SIGTERM instead.",
    )
    p.add_argument("--fast", action="store_true", help="fast_queries(): see the module")
    p.add_argument("--log-file", default=None, help="moto's request log (default: none)")
    p.add_argument(
        "--count-file", default=None, help="write the requests served, by operation (JSON)"
    )
    p.add_argument("--port", type=int, default=0, help="port to serve on (default: a free one)")
    p.add_argument(
        "--until-signal",
        action="store_true",
        help="serve until Ctrl-C or SIGTERM, not until stdin closes (a moto started by hand)",
    )
    return p


if __name__ == "__main__":
    a = build_parser().parse_args()
    serve_forever(
        port=a.port,
        log_file=a.log_file,
        fast=a.fast,
        count_file=a.count_file,
        until_signal=a.until_signal,
    )
