"""What the chaos run's fault-injecting proxies (``fleet.proxy``) saw: the calls that changed a
key's leases, for the audit (``lease_event``, the proxies' ``events``), and the writes that
reached DynamoDB (``Trace``); the proxies started, one per upstream, and their counters summed.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from fleet.proxy import FaultPlan, Observer, Proxy
from rasd.core.lease import US, parse_time


def tap(trace: Trace | None) -> Observer:
    """The proxies' observer: each call to ``trace`` (when given); its ``lease_event``, stamped
    with when it was forwarded (``sent``), answered (``got``) and its proxy, to the proxy's
    ``events``."""

    def observe(
        proxy: str, op: str, fault: str, sent: float, body: bytes, reply: bytes | None
    ) -> dict[str, Any] | None:
        if trace is not None:
            trace.record(proxy, op, fault, sent, body, reply)
        if op not in ("UpdateItem", "Query") or reply is None:
            return None
        ev = lease_event(op, body, reply)
        if ev is not None:
            ev.update(sent=sent, got=time.time(), proxy=proxy)
        return ev

    return observe


def lease_event(op: str, body: bytes, reply: bytes) -> dict[str, Any] | None:
    """What a forwarded call that succeeded did to a key's leases, for the audit's "who made
    the second lease" (``chaos.audit.Makers``); None for anything else. The call took effect
    between the proxy's forwarding (``sent``) and the reply it read (``got``).

    * ``claim``: an UpdateItem that made a free item held for a key (rasd's ``claim`` or the
      paper's ``paper_claim``: both REMOVE ``lease_available``; the item comes back,
      ``ALL_NEW``, with its ``key``): resource, key, version, ``end`` (epoch seconds);
    * ``extend``: an UpdateItem that SET ``lease_expires`` of a held item without claiming
      it (rasd's ``extend_resource``; the paper's agent never extends): resource, key, end;
    * ``lookup``: a Query of ``leased_resources`` for a key: key and the ``resources`` it
      returned (what the index showed of the key at some point between sent and got);
    * ``free``: an UpdateItem that REMOVEd an item's ``key`` (a daemon's free, a liberator's,
      rasadmin's): the resource.
    """
    if not reply.startswith(b"HTTP/1.1 200") and not reply.startswith(b"HTTP/1.0 200"):
        return None
    try:
        req = json.loads(body)
        answer = json.loads(reply.partition(b"\r\n\r\n")[2])
        if op == "Query":
            if req.get("IndexName") != "leased_resources":
                return None
            return {
                "kind": "lookup",
                "key": req["ExpressionAttributeValues"][":k"]["S"],
                "resources": sorted(it["resource"]["S"] for it in answer.get("Items", [])),
            }
        if op != "UpdateItem":
            return None
        names = req.get("ExpressionAttributeNames") or {}
        expr = str(req.get("UpdateExpression") or "")

        def named(clause: str) -> set[str]:
            part = re.split(r"\b(?:SET|ADD|DELETE|REMOVE)\b", expr.partition(clause)[2])[0]
            if clause not in expr:
                return set()
            return {names.get(x, x) for x in re.findall(r"#\w+", part)}

        if "key" in named("REMOVE"):  # a free: the item no longer holds a key
            return {"kind": "free", "resource": req["Key"]["resource"]["S"]}
        item = answer.get("Attributes") or {}
        if "key" not in item or "lease_expires" not in item:
            return None
        out = {
            "resource": item["resource"]["S"],
            "key": item["key"]["S"],
            "version": int(item["version"]["N"]),
            "end": parse_time(item["lease_expires"]["S"]) / US,
        }
        if "lease_available" in named("REMOVE"):
            return {"kind": "claim", **out}
        if "lease_expires" in named("SET"):
            return {"kind": "extend", **out}
        return None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


class Trace:
    """The writes (and their replies) that reached DynamoDB, one JSON line each, for digging
    into a finding (``python -m chaos --trace``): proxy, operation, fault, ``sent`` (forwarded)
    and ``got`` (the upstream's reply read; the write applied in between), the HTTP status,
    the request's item key, condition and values, and for a failed condition its reason. Reads
    are left out (a run makes many), except Queries of the leased index (what an agent saw
    of a key)."""

    OPS = frozenset({"UpdateItem", "PutItem", "DeleteItem"})

    def __init__(self, path: str) -> None:
        self._f = open(path, "a", buffering=1)  # noqa: SIM115 - closed by close()
        self._lock = threading.Lock()

    def record(
        self, proxy: str, op: str, fault: str, sent: float, body: bytes, reply: bytes | None
    ) -> None:
        got = time.time()
        try:
            req = json.loads(body)
        except ValueError:
            return
        leased = op == "Query" and req.get("IndexName") == "leased_resources"
        if op not in self.OPS and not leased:
            return
        status, answer = 0, ""
        if reply is not None:
            head, _, rbody = reply.partition(b"\r\n\r\n")
            with contextlib.suppress(ValueError, IndexError):
                status = int(head.split(b" ", 2)[1])
            answer = rbody.decode(errors="replace")[: 4000 if op == "Query" else 600]
        rec = {
            "p": proxy, "op": op, "fault": fault, "sent": round(sent, 6), "got": round(got, 6),
            "status": status,
            "key": req.get("Key"), "cond": req.get("ConditionExpression"),
            "update": req.get("UpdateExpression"), "values": req.get("ExpressionAttributeValues"),
            "answer": answer,
        }  # fmt: skip
        line = json.dumps(rec, separators=(",", ":"))
        with self._lock:
            self._f.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            self._f.close()


def start_proxies(
    upstreams: Sequence[str], plan: FaultPlan, seed: int, trace: Trace | None = None
) -> list[Proxy]:
    """One proxy to each ``http://host:port`` of ``upstreams`` (proxy ``i`` to the ``i``-th),
    each with its own RNG seeded from ``seed``."""
    out = []
    observe = tap(trace)
    for i, url in enumerate(upstreams):
        host, port = url.split("://", 1)[-1].rstrip("/").rsplit(":", 1)
        px = Proxy((host, int(port)), http=True, plan=plan, seed=f"{seed}/proxy/{i}", name=f"p{i}",
                   observe=observe)  # fmt: skip
        out.append(px)
    return [px.start() for px in out]


def totals(proxies: list[Proxy]) -> dict[str, Any]:
    """Sum of the proxies' counters, and each proxy's."""
    total: Counter[str] = Counter()
    each = []
    for p in proxies:
        s = p.snapshot()
        total.update(s)
        each.append(s)
    return {"total": dict(sorted(total.items())), "each": each}
