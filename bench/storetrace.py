"""DynamoDB calls and round trips per request, measured at the daemon's store boundary.

    python -m bench.storetrace TRACE_PATH serve --socket ... (the ``rasd`` command's arguments)

runs the ordinary daemon (``rasd.cli.main``) with ``rasd.dynamo.store.Store._call`` wrapped: every
DynamoDB call (one ``_call``, retries included) appends one JSON line to ``TRACE_PATH``:

* ``op`` (Query, GetItem, UpdateItem) and ``what``: the write's ``kind`` (``claim``,
  ``map_acquire``, ``map_confirm``...), or for reads ``mappings`` (the consistent Query of a
  key's mapping items), ``available`` (a prefetch page), ``resource``, ``meta``;
* ``t0``/``t1``: ``time.perf_counter()`` when the call started and returned. On Linux that is
  CLOCK_MONOTONIC, shared by every process, so the client's stamps of a request and the
  daemon's stamps of its calls are on one clock;
* ``req``: set for calls made on behalf of a request (inside ``Acquirer.get_lease`` and
  ``Releaser.release``, and the tasks they start); ``bg``: set for calls of background work
  (``Tasks.spawn``: confirmations, extensions, give-backs; ``Prefetcher._refill``: prefetch
  refills), even when a request started it. Calls with neither are the daemon's own (pool
  refresh, miss reports).

Nothing in the daemon changes but the wrapping; the cost is one ``write`` per DynamoDB call.

:func:`per_request` then cuts the trace by the client's request windows. A call belongs to a
request if it started inside the window. It is on the request's path if a request made it and
it is not background work (a background call that ended before the answer, e.g. a give-back
the request awaited, counts as on the path; a prefetch refill never does, even when an empty
buffer made the request wait for it: it is the daemon's). With one request at a time, as in
(a)-(c), the request whose window a call started in is the request that made it.
**Round trips** are groups of overlapping on-path calls: calls sent together (``map_acquire``
and ``claim``) are one round trip; a call sent after the previous one returned is another.
"""

from __future__ import annotations

import contextvars
import json
import sys
import time
from collections import Counter
from collections.abc import Coroutine, Iterable
from pathlib import Path
from typing import Any

#: what kind of background work the current task does ("" for a request's own work)
_BG: contextvars.ContextVar[str] = contextvars.ContextVar("bench_bg", default="")
#: the request a task works for ("" for the daemon's own loops)
_REQ: contextvars.ContextVar[str] = contextvars.ContextVar("bench_req", default="")
#: the kind of the write in progress (set around ``Store.write``)
_KIND: contextvars.ContextVar[str] = contextvars.ContextVar("bench_kind", default="")


def _label(op: str, kw: dict[str, Any]) -> str:
    if op == "UpdateItem":
        pk = kw.get("Key", {}).get("client_id", {}).get("S", "")
        return _KIND.get() or ("meta" if pk.startswith("#meta") else "update")
    if op == "Query":
        if kw.get("IndexName"):
            return "available" if kw["IndexName"] == "available_resources" else kw["IndexName"]
        vals = kw.get("ExpressionAttributeValues", {})
        first: dict[str, Any] = next(iter(vals.values()), {}) if vals else {}
        pk = first.get("S", "")
        return "mappings" if pk.startswith("#map#") else "meta"
    pk = kw.get("Key", {}).get("client_id", {}).get("S", "")
    if pk.startswith("#map#"):
        return "mapping"
    return "meta" if pk.startswith("#") else "resource"


def install(path: str) -> None:
    """Wrap the daemon's store (and tag its background work) before it starts."""
    from rasd.daemon import acquire, prefetch, releaser, tasks
    from rasd.dynamo import store

    fh = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's life
    orig_call = store.Store._call
    orig_write = store.Store.write
    orig_spawn = tasks.Tasks.spawn
    orig_get_lease = acquire.Acquirer.get_lease
    orig_release = releaser.Releaser.release
    orig_refill = prefetch.Prefetcher._refill

    async def _call(
        self: Any, op: str, deadline: float, ambiguous: list[bool] | None = None, **kw: Any
    ) -> Any:
        t0 = time.perf_counter()
        err = ""
        try:
            return await orig_call(self, op, deadline, ambiguous, **kw)
        except BaseException as exc:
            err = type(exc).__name__
            raise
        finally:
            rec: dict[str, Any] = {
                "op": op,
                "what": _label(op, kw),
                "t0": t0,
                "t1": time.perf_counter(),
            }
            if _REQ.get():
                rec["req"] = _REQ.get()
            if _BG.get():
                rec["bg"] = _BG.get()
            if err:
                rec["err"] = err
            fh.write(json.dumps(rec) + "\n")

    async def write(self: Any, w: Any, deadline: float, mine: Any = None) -> Any:
        tok = _KIND.set(w.kind)
        try:
            return await orig_write(self, w, deadline, mine)
        finally:
            _KIND.reset(tok)

    async def get_lease(self: Any, *a: Any, **kw: Any) -> Any:
        tok = _REQ.set("get_lease")  # tasks started from here inherit it
        try:
            return await orig_get_lease(self, *a, **kw)
        finally:
            _REQ.reset(tok)

    async def release(self: Any, *a: Any, **kw: Any) -> Any:
        tok = _REQ.set("release")
        try:
            return await orig_release(self, *a, **kw)
        finally:
            _REQ.reset(tok)

    async def _tagged(kind: str, coro: Coroutine[Any, Any, Any]) -> Any:
        _BG.set(kind)  # the task's own context: only this task's calls carry the tag
        return await coro

    def spawn(self: Any, coro: Coroutine[Any, Any, Any]) -> Any:
        return orig_spawn(self, _tagged("spawn", coro))

    async def _refill(self: Any, pool: Any, buf: Any) -> None:
        _BG.set("refill")
        await orig_refill(self, pool, buf)

    store.Store._call = _call  # type: ignore[method-assign]
    store.Store.write = write  # type: ignore[method-assign]
    tasks.Tasks.spawn = spawn  # type: ignore[method-assign]
    acquire.Acquirer.get_lease = get_lease  # type: ignore[method-assign]
    releaser.Releaser.release = release  # type: ignore[method-assign]
    prefetch.Prefetcher._refill = _refill  # type: ignore[method-assign]


# ------------------------------------------------------------------------------ analysis
def load(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line cut short by a stopped daemon
    return sorted(out, key=lambda r: r["t0"])


def round_trips(calls: Iterable[dict[str, Any]]) -> int:
    """Groups of overlapping calls: a call that starts after every earlier one has returned
    starts a new round trip."""
    n = 0
    end = float("-inf")
    for c in sorted(calls, key=lambda r: r["t0"]):
        if c["t0"] >= end:
            n += 1
            end = c["t1"]
        else:
            end = max(end, c["t1"])
    return n


def on_path(c: dict[str, Any], answered: float) -> bool:
    if not c.get("req"):
        return False
    bg = c.get("bg")
    return not bg or (bg == "spawn" and c["t1"] <= answered)


def per_request(
    trace: list[dict[str, Any]], windows: list[tuple[float, float]]
) -> list[dict[str, Any]]:
    """For each client window (perf_counter seconds): its on-path calls, their round trips,
    and the background calls it started."""
    out = []
    i = 0
    n = len(trace)
    for t0, t1 in sorted(windows):
        while i < n and trace[i]["t0"] < t0:
            i += 1
        j = i
        mine = []
        while j < n and trace[j]["t0"] <= t1:
            mine.append(trace[j])
            j += 1
        path = [c for c in mine if on_path(c, t1)]
        bg = [c for c in mine if not on_path(c, t1)]
        out.append(
            {
                "calls": len(path),
                "round_trips": round_trips(path),
                "path": [f"{c['op']}:{c['what']}" for c in path],
                "background": [f"{c['op']}:{c['what']}" for c in bg],
            }
        )
    return out


def summarize(reqs: list[dict[str, Any]]) -> dict[str, Any]:
    """Means and distributions over requests; the commonest call sequence."""
    n = len(reqs)
    if not n:
        return {"requests": 0}
    rts = Counter(r["round_trips"] for r in reqs)
    calls = Counter(r["calls"] for r in reqs)
    by_call: Counter[str] = Counter()
    by_bg: Counter[str] = Counter()
    for r in reqs:
        by_call.update(r["path"])
        by_bg.update(r["background"])
    seqs = Counter(" ".join(sorted(r["path"])) for r in reqs)
    return {
        "requests": n,
        "round_trips_per_request": sum(r["round_trips"] for r in reqs) / n,
        "calls_per_request": sum(r["calls"] for r in reqs) / n,
        "background_calls_per_request": sum(len(r["background"]) for r in reqs) / n,
        "round_trips_hist": {str(k): v for k, v in sorted(rts.items())},
        "calls_hist": {str(k): v for k, v in sorted(calls.items())},
        "path_calls_per_request": {k: round(v / n, 3) for k, v in by_call.most_common()},
        "background_calls_per_request_by_kind": {
            k: round(v / n, 3) for k, v in by_bg.most_common()
        },
        "commonest_path": seqs.most_common(1)[0][0],
    }


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m bench.storetrace TRACE_PATH <rasd arguments>", file=sys.stderr)
        return 2
    install(args[0])
    from rasd.cli import main as rasd_main

    return rasd_main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
