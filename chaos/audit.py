"""The chaos run's audit: pure functions over what the apps observed and the final table.

Nothing here trusts the daemons' own accounts. The inputs are the apps' history records
(``chaos.app`` writes one JSON object per call) and, for the final checks, a scan of the
table. All times are wall-clock epoch seconds: every process of a run is on one host, so one
clock orders them all (the monotonic stamps are kept for latencies only).

Validity of an answer
---------------------
A successful ``get_lease(k)`` answered ``(k, r, exp)`` and received at time ``a`` is *valid*
from ``a`` until ``exp``, except that a release of ``k`` that **started after** ``a`` ends the
validity at that release's start. A release that started before ``a`` but had not ended by
then is concurrent with the answer: the two cannot be ordered, so it ends the validity at
``a`` (the answer counts for nothing). A release over before ``a`` does not touch it, except
for an answer of the paper's agent (below), whose call reads the index and then answers: a
release that had not ended when that call started is concurrent with it. For every answer
of one lease, ``a`` and its call are the lease's first answer and call. Which releases
count:

* a successful release (``ok``), and an *indeterminate* one (TIMEOUT, UNAVAILABLE, INTERNAL, a
  lost connection: the daemon may have written it). Only definite refusals (NOT_HELD,
  BAD_REQUEST, ...) leave the validity alone. Counting indeterminate releases can hide a
  violation, never invent one: the audit errs towards no false alarms.
* by default (``release_scope="key"``) a release by *any* app process ends the validity of
  every earlier answer for ``k``: the lease belongs to the key, not to the caller, so after
  app B releases ``k`` its old resource may legitimately go to another key while app A still
  remembers it. ``release_scope="app"`` counts only the same app process's releases (the
  stricter reading; it flags that legitimate case too, so use it only for single-app keys).

Findings
--------
* **double allocation**: one resource answered to two different keys with overlapping
  validity (counted once per (resource, key pair)).
* **in-region split**: one key answered two different resources *of the same region* with
  overlapping validity (once per (key, region, resource pair)). Two resources of different
  regions are the paper's cross-region duplicates: reported, not a failure.
* **lost lease**: a key answered ``r``, and a call for it that *started after* that answer
  was received was answered a different resource of the same region while ``r``'s answer was
  still valid. Every lost lease is also a split; the split that is not a lost lease is a race
  between concurrent calls (once per (key, region, old, new)).

Two agents (the mixed fleet)
----------------------------
A record with ``agent: "paper"`` is an answer of the paper's in-process agent
(``chaos.paper``); every other record is rasd's. The findings are judged over the union:

* a double allocation is a failure whichever agents answered it. The paper's agent is never
  told of a release, so a paper answer's I1 validity runs to its end: a release shortens
  only its validity for splits and lost leases (the key's lease is over for every app);
* a split or lost lease that involves a rasd answer is a failure; one between two paper
  answers alone is the paper's own race (two of its agents claiming for a key that its
  index does not show yet, or a claim whose reply was lost and retried): counted apart as
  ``paper_only_splits`` and ``paper_only_lost_leases``, not as rasd's failures;
* with ``creations`` (the claims the run's proxies saw apply, chaos.wiretap.lease_event), each
  split and lost lease also says who made **the second lease** (``second``): of the two
  leases, the one whose making write applied after the other's had. A lease is made by its
  claim, or made again by an extension past its end (its answers' validity has a gap since
  its claim: the first call answering it after the gap extended it, and only rasd extends).
  A second lease made by the paper's agent, beside a running lease of rasd's or its own, is
  the paper's race: its lookup read the index before the first lease was there and its
  claim is conditioned on nothing about the key, so no agent beside it can stop that write
  (docs/design.md, "Two agents acquiring one key at once"). Those are counted apart
  (``paper_made_splits``, ``paper_made_lost_leases``); a second lease made by rasd, or one
  whose order the write times cannot tell, stays a failure.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rasd.config import Config
from rasd.core.lease import FREE, LIVE, US, parse_time
from rasd.core.serialize import is_mapping_pk, is_tombstone, mapping_from_ddb

#: Error codes that say for sure that a release wrote nothing.
DEFINITE_RELEASE_FAILURES = frozenset(
    {"NOT_HELD", "BAD_REQUEST", "UNKNOWN_POOL", "FORBIDDEN", "BUSY", "NO_CAPACITY"}
)
EXAMPLES = 10
RASD, PAPER = "rasd", "paper"


@dataclass(frozen=True, slots=True)
class Answer:
    """One successful get_lease as an app saw it, with its validity interval."""

    app: int
    key: str
    resource: str
    region: str  # the lease's (the resource's) region, as answered
    start: float  # when the call started
    received: float  # when the answer arrived: validity starts here
    expires: float
    end: float  # validity end: ``expires``, or the start of a later release of the key
    daemon: int = -1
    #: for double allocations (I1): ``end``, or the release plus the quarantine window
    end_i1: float = 0.0
    agent: str = RASD
    new: bool = True  # the answer made the lease (an acquisition), else it found one


def agent_of(rec: Mapping[str, Any]) -> str:
    """Who answered the call: ``"paper"`` (the paper's agent) or ``"rasd"``."""
    return str(rec.get("agent") or RASD)


def _f(rec: Mapping[str, Any], name: str) -> float:
    return float(rec[name])


def release_counts(rec: Mapping[str, Any]) -> bool:
    """Does this release record end validity (successful or indeterminate)?"""
    if rec.get("op") != "release":
        return False
    return bool(rec.get("ok")) or rec.get("error") not in DEFINITE_RELEASE_FAILURES


def _lease_id(r: Mapping[str, Any]) -> tuple[Any, ...]:
    return (r["key"], r["resource"], r.get("version"), r.get("lease_region"))


def answers(
    records: Iterable[Mapping[str, Any]],
    release_scope: str = "key",
    quarantine_window: float = 0.0,
    creations: Iterable[Mapping[str, Any]] = (),
) -> list[Answer]:
    """The successful get_lease answers with their validity (see the module docstring).
    ``quarantine_window``: how long after a release its resource stays unclaimable on every
    host's clock (the daemons' quarantine minus the clock-skew bound); it extends the I1
    validity of a released lease. ``creations``: the claims and frees the run saw apply
    (:class:`Makers`); an answer of the paper's agent whose call began after its item was
    freed (its index lagged the free) is then also one of the lease of every earlier answer
    of the same claim: a lease rasd adopted keeps its claim, resource and end, and that
    answer is a stale copy of it, as a cache's is (docs/design.md, "A lease of the paper's
    agent is adopted, not duplicated"). One from before the free is not (a release whose
    free has not landed, "Not covered" (3))."""
    if release_scope not in ("key", "app"):
        raise ValueError(f"release_scope must be 'key' or 'app', not {release_scope!r}")
    recs = list(records)
    spans: dict[tuple[Any, ...], list[tuple[float, float]]] = defaultdict(list)
    for r in recs:
        if release_counts(r):
            scope = (r["key"],) if release_scope == "key" else (r["key"], r["app"])
            spans[scope].append((_f(r, "t0"), _f(r, "t1")))
    # per scope: release starts (sorted) and the running maximum of their ends
    index: dict[tuple[Any, ...], tuple[list[float], list[float]]] = {}
    for scope, v in spans.items():
        v.sort()
        run_max: list[float] = []
        for _s, e in v:
            run_max.append(max(e, run_max[-1]) if run_max else e)
        index[scope] = ([s for s, _e in v], run_max)
    # A lease is (key, resource, version, region): every answer of one lease, cached copies
    # served later by other daemons included, ends with the lease (docs/design.md: a release
    # ends the key's lease for every app; a stale copy is bounded by S, I3).
    first: dict[tuple[Any, ...], tuple[float, float]] = {}  # (received, its call's start)
    claims: dict[tuple[str, str], list[float]] = defaultdict(list)
    frees: dict[str, list[float]] = defaultdict(list)
    for ev in creations:
        kind = ev.get("kind", "claim")
        if kind == "claim":
            claims[(str(ev["key"]), str(ev["resource"]))].append(float(ev["sent"]))
        elif kind == "free":
            frees[str(ev["resource"])].append(float(ev["got"]))
    for times in (*claims.values(), *frees.values()):
        times.sort()

    def lagged(r: Mapping[str, Any], claim_sent: float) -> bool:
        """Was the item freed after the claim and before this call began?"""
        fs = frees.get(str(r["resource"]), [])
        i = bisect.bisect_right(fs, claim_sent)
        return i < len(fs) and fs[i] <= _f(r, "t0")

    def claim_of(r: Mapping[str, Any]) -> tuple[Any, ...] | None:
        sent = claims.get((str(r["key"]), str(r["resource"])))
        i = bisect.bisect_right(sent, _f(r, "t1")) if sent else 0
        return (r["key"], r["resource"], sent[i - 1]) if i > 0 and sent else None

    by_claim: dict[tuple[Any, ...], tuple[float, float]] = {}
    for r in recs:
        if r.get("op") == "get_lease" and r.get("ok"):
            lk = _lease_id(r)
            got = (_f(r, "t1"), _f(r, "t0"))
            first[lk] = min(first.get(lk, (math.inf, math.inf)), got)
            ck = claim_of(r)
            if ck is not None:
                by_claim[ck] = min(by_claim.get(ck, (math.inf, math.inf)), got)
    out: list[Answer] = []
    for r in recs:
        if r.get("op") != "get_lease" or not r.get("ok"):
            continue
        a, asked_at = first[_lease_id(r)]
        paper = agent_of(r) == PAPER  # never told of a release: I1 holds to the end
        ck = claim_of(r) if paper else None
        if ck is not None and lagged(r, ck[2]):
            a, asked_at = min((a, asked_at), by_claim[ck])
        end = _f(r, "lease_expires")
        end_i1 = end
        scope = (r["key"],) if release_scope == "key" else (r["key"], r["app"])
        if scope in index:
            starts, run_max = index[scope]
            i = bisect.bisect_right(starts, a)
            if i > 0 and run_max[i - 1] > (asked_at if paper else a):
                end = min(end, a)  # a release was under way at the answer: unordered
                if not paper:
                    end_i1 = min(end_i1, a + quarantine_window)
            elif i < len(starts):
                end = min(end, starts[i])
                if not paper:
                    end_i1 = min(end_i1, starts[i] + quarantine_window)
        out.append(
            Answer(
                app=int(r.get("app", -1)),
                key=str(r["key"]),
                resource=str(r["resource"]),
                region=str(r.get("lease_region") or ""),
                start=_f(r, "t0"),
                received=_f(r, "t1"),
                expires=_f(r, "lease_expires"),
                end=end,
                daemon=int(r.get("daemon", -1)),
                end_i1=end_i1,
                agent=agent_of(r),
                new=bool(r.get("new", True)),
            )
        )
    return out


# ---------------------------------------------------------------------------- intervals
def merge(ivs: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union of half-open intervals [s, e), empty ones dropped, sorted."""
    out: list[tuple[float, float]] = []
    for s, e in sorted(iv for iv in ivs if iv[1] > iv[0]):
        if out and s < out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def conflicts(
    by_label: Mapping[str, Iterable[tuple[float, float]]],
) -> dict[tuple[str, str], tuple[float, float]]:
    """Pairs of different labels whose intervals overlap: {(l1, l2): (from, to)} with l1 < l2,
    the first overlap of each pair. A sweep over each label's merged intervals."""
    events: list[tuple[float, float, str]] = []
    for label, ivs in by_label.items():
        events.extend((s, e, label) for s, e in merge(ivs))
    events.sort()
    active: list[tuple[float, float, str]] = []
    found: dict[tuple[str, str], tuple[float, float]] = {}
    for s, e, label in events:
        active = [iv for iv in active if iv[1] > s]
        for _s2, e2, other in active:
            if other != label:
                pair = (min(label, other), max(label, other))
                if pair not in found:
                    found[pair] = (s, min(e, e2))
        active.append((s, e, label))
    return found


# ------------------------------------------------------------------------------ findings
def double_allocations(ans: Iterable[Answer]) -> list[dict[str, Any]]:
    """Failures whichever agents answered; each finding names the agents that answered
    each of its keys the resource (``agents``: key -> agents)."""
    by_res: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    who: dict[tuple[str, str], set[str]] = defaultdict(set)
    for a in ans:
        by_res[a.resource][a.key].append((a.received, a.end_i1))
        who[(a.resource, a.key)].add(a.agent)
    out: list[dict[str, Any]] = []
    for res in sorted(by_res):
        for (k1, k2), (s, e) in sorted(conflicts(by_res[res]).items()):
            agents = {k: sorted(who[(res, k)]) for k in (k1, k2)}
            out.append(_finding(resource=res, keys=[k1, k2], agents=agents, start=s, end=e))
    return out


class Makers:
    """Who made each lease of a key, and when (see the module docstring), from what the run's
    proxies saw take effect (``events``: dicts with ``kind``, key, resource, sent, got, agent;
    ``chaos.wiretap.lease_event``) and, for events without extensions, the answers' validity.

    A lease is made by its claim. It is made again by an extension that took effect after its
    end (rasd's; the paper's agent never extends): one sent after the end surely did, one
    whose reply came after it may have, so the lease counts as made again somewhere between
    the end and that reply. Without extension events, a gap in the validity of its answers
    since the claim stands for such an extension (the call that answered it first after the
    gap made it again)."""

    def __init__(self, ans: Iterable[Answer], events: Iterable[Mapping[str, Any]]) -> None:
        Made = tuple[float, float, str, float]  # sent, got, agent, end
        self.claims: dict[tuple[str, str], list[Made]] = defaultdict(list)
        self.extends: dict[tuple[str, str], list[tuple[float, float, float]]] = defaultdict(list)
        #: key -> leased-index reads: (sent, got, resources shown)
        self.lookups: dict[str, list[tuple[float, float, frozenset[str]]]] = defaultdict(list)
        self.exact = False
        for e in events:
            kind = str(e.get("kind", "claim"))
            sent, got = float(e["sent"]), float(e["got"])
            if kind == "lookup":
                self.lookups[str(e["key"])].append((sent, got, frozenset(e["resources"])))
                continue
            if kind == "free":
                continue
            kr = (str(e["key"]), str(e["resource"]))
            end = float(e.get("end", math.inf))
            if kind == "extend":
                self.exact = True
                self.extends[kr].append((sent, got, end))
            else:
                self.claims[kr].append((sent, got, str(e["agent"]), end))
        for v in self.claims.values():
            v.sort()
        for w in self.extends.values():
            w.sort()
        per: dict[tuple[str, str], list[Answer]] = defaultdict(list)
        for a in ans:
            per[(a.key, a.resource)].append(a)
        #: (key, resource) -> runs of validity: [from, to, first call's start, its answer]
        self.runs: dict[tuple[str, str], list[list[float]]] = {}
        for kr, xs in per.items():
            runs: list[list[float]] = []
            for a in sorted(xs, key=lambda x: x.received):
                if a.end <= a.received:
                    continue
                if runs and a.received <= runs[-1][1]:
                    runs[-1][1] = max(runs[-1][1], a.end)
                else:
                    runs.append([a.received, a.end, a.start, a.received])
            self.runs[kr] = runs

    def made(self, key: str, resource: str, at: float) -> tuple[float, float, str, bool] | None:
        """(from, to, agent, claimed): the write that made the lease of ``key`` on
        ``resource`` that runs at ``at`` took effect between ``from`` and ``to``; ``claimed``
        when it is the claim (which puts the item in the leased index), not an extension.
        None when no claim was seen."""
        claims = [c for c in self.claims.get((key, resource), []) if c[0] <= at]
        if not claims:
            return None
        sent, got, agent, end = claims[-1]
        made = (sent, got, agent, True)
        if self.exact:
            for s2, g2, e2 in self.extends.get((key, resource), []):
                if s2 < sent or s2 > at:
                    continue
                if g2 > end:  # took effect after the lease's end, or may have
                    made = (max(s2, end), g2, RASD, False)
                end = max(end, e2)
            return made
        since = [r for r in self.runs.get((key, resource), []) if sent <= r[0] <= at]
        if len(since) > 1:  # answered again after a gap: extended past its end
            return (since[-1][2], since[-1][3], RASD, False)
        return made

    def _unseen_after(
        self, key: str, first: tuple[float, float, str, bool], res: str, at: float
    ) -> bool:
        """Did a read of the leased index that began after ``first`` took effect, and ended by
        ``at``, not show the item ``res``? Its claim, held from where it took effect to
        ``at``, then took effect after that read: after ``first``."""
        return any(
            first[1] <= q_sent and q_got <= at and res not in shown
            for q_sent, q_got, shown in self.lookups.get(key, [])
        )

    def second(self, key: str, a: str, b: str, at: float) -> dict[str, Any]:
        """Of the leases of ``key`` on resources ``a`` and ``b`` running at ``at``: which was
        made second, and by whom ("unknown" when the order cannot be told)."""
        ma, mb = self.made(key, a, at), self.made(key, b, at)
        if ma is None or mb is None:
            return {"by": "unknown"}

        def found(res: str, m: tuple[float, float, str, bool], other: float) -> dict[str, Any]:
            return {"resource": res, "by": m[2], "made": [m[0], m[1]], "after": other}

        if ma[1] < mb[0]:
            return found(b, mb, ma[1])
        if mb[1] < ma[0]:
            return found(a, ma, mb[1])
        # the writes' intervals overlap: a read of the index between them may order them
        if mb[3] and self._unseen_after(key, ma, b, at):
            return found(b, mb, ma[1])
        if ma[3] and self._unseen_after(key, mb, a, at):
            return found(a, ma, mb[1])
        return {"by": PAPER if ma[2] == mb[2] == PAPER else "unknown"}


def in_region_splits(ans: Iterable[Answer], makers: Makers | None = None) -> list[dict[str, Any]]:
    """Every split, once per (key, region, resource pair). A finding is ``paper_only`` when
    only pairs of two paper answers overlap; ``agents`` lists the agent pairs that do;
    ``concurrent`` says the two leases' acquisitions ran at once (each call started before
    the other was answered: neither could have seen the other's lease)."""
    groups: dict[tuple[str, str], dict[str, list[tuple[float, float]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    every: dict[tuple[str, str, str], list[Answer]] = defaultdict(list)
    for a in ans:
        groups[(a.key, a.region)][f"{a.agent}|{a.resource}"].append((a.received, a.end))
        every[(a.key, a.region, a.resource)].append(a)

    def acquired(key: str, region: str, res: str, by: float) -> Answer:
        # the answer that made the lease running at ``by``: the acquisition of it that
        # started last before then (one that was still under way answered its followers
        # too), else the first answer of it seen
        xs = every[(key, region, res)]
        made = [x for x in xs if x.new and x.start <= by]
        if made:
            return max(made, key=lambda x: x.start)
        return min(xs, key=lambda x: x.received)

    out: list[dict[str, Any]] = []
    for key, region in sorted(groups):
        pairs: dict[tuple[str, str], list[tuple[str, str, float, float]]] = defaultdict(list)
        for (l1, l2), (s, e) in conflicts(groups[(key, region)]).items():
            (g1, r1), (g2, r2) = l1.split("|", 1), l2.split("|", 1)
            if r1 == r2:
                continue  # one resource answered by both agents: no split
            (ra, ga), (rb, gb) = sorted(((r1, g1), (r2, g2)))
            pairs[(ra, rb)].append((ga, gb, s, e))
        for (ra, rb), found in sorted(pairs.items()):
            s, e = min((s, e) for _ga, _gb, s, e in found)
            agents = sorted({"/".join(sorted((ga, gb))) for ga, gb, _s, _e in found})
            paper_only = agents == [f"{PAPER}/{PAPER}"]
            qa, qb = acquired(key, region, ra, s), acquired(key, region, rb, s)
            extra = {} if makers is None else {"second": makers.second(key, ra, rb, s)}
            out.append(
                _finding(
                    key=key,
                    region=region,
                    resources=[ra, rb],
                    agents=agents,
                    paper_only=paper_only,
                    concurrent=qa.start < qb.received and qb.start < qa.received,
                    start=s,
                    end=e,
                    **extra,
                )
            )
    return out


def cross_region_duplicates(ans: Iterable[Answer]) -> list[dict[str, Any]]:
    """Keys answered resources of two regions with overlapping validity (allowed; reported)."""
    groups: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for a in ans:
        groups[a.key][f"{a.region}|{a.resource}"].append((a.received, a.end))
    out: list[dict[str, Any]] = []
    for key in sorted(groups):
        for (l1, l2), (s, e) in sorted(conflicts(groups[key]).items()):
            if l1.split("|", 1)[0] != l2.split("|", 1)[0]:
                out.append(_finding(key=key, resources=[l1, l2], start=s, end=e))
    return out


def lost_leases(ans: Iterable[Answer], makers: Makers | None = None) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str], list[Answer]] = defaultdict(list)
    for a in ans:
        groups[(a.key, a.region)].append(a)
    out: list[dict[str, Any]] = []
    for key, region in sorted(groups):
        by_received = sorted(groups[(key, region)], key=lambda x: x.received)
        by_start = sorted(groups[(key, region)], key=lambda x: x.start)
        # (resource, agent) -> latest validity end among the answers seen
        best: dict[tuple[str, str], float] = {}
        j = 0
        found: dict[tuple[str, str], dict[str, Any]] = {}
        for cur in by_start:
            if cur.end <= cur.received:
                continue  # a stale copy of a lease already over (I3): it takes nothing over
            while j < len(by_received) and by_received[j].received <= cur.start:
                p = by_received[j]
                if p.end > p.received:
                    k = (p.resource, p.agent)
                    best[k] = max(best.get(k, -math.inf), p.end)
                j += 1
            for (res, agent), end in best.items():
                if res == cur.resource or end <= cur.received:
                    continue
                pair = f"{agent}/{cur.agent}"
                f = found.get((res, cur.resource))
                if f is None:
                    extra = (
                        {}
                        if makers is None
                        else {"second": makers.second(key, res, cur.resource, cur.received)}
                    )
                    found[(res, cur.resource)] = _finding(
                        key=key,
                        region=region,
                        old=res,
                        new=cur.resource,
                        agents=[pair],
                        paper_only=pair == f"{PAPER}/{PAPER}",
                        start=cur.received,
                        end=end,
                        **extra,
                    )
                elif pair not in f["agents"]:
                    f["agents"] = sorted([*f["agents"], pair])
                    f["paper_only"] = False  # a rasd answer is in it too
        out.extend(found[k] for k in sorted(found))
    return out


def _finding(start: float, end: float, **kw: Any) -> dict[str, Any]:
    return {**kw, "from": round(start, 6), "to": round(end, 6), "overlap_s": round(end - start, 3)}


# ------------------------------------------------------------------------- availability
def percentile(xs: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of ``xs``; None when empty."""
    if not xs:
        return None
    s = sorted(xs)
    k = max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))
    return s[k]


def availability(
    records: Iterable[Mapping[str, Any]], outage: tuple[float, float] | None = None
) -> dict[str, Any]:
    """Outcomes of get_lease and release calls, get_lease latencies, and the calls that were
    answered during the outage window (only a daemon's cache can answer then)."""
    outcomes: dict[str, Counter[str]] = {"get_lease": Counter(), "release": Counter()}
    lat: list[float] = []
    lat_ok: list[float] = []
    during: Counter[str] = Counter()
    no_daemon = 0
    beyond_max = 0
    for r in records:
        op = str(r.get("op"))
        code = "ok" if r.get("ok") else str(r.get("error") or "?")
        outcomes.setdefault(op, Counter())[code] += 1
        if op != "get_lease":
            continue
        if not r.get("ok") and daemon_down(r):
            no_daemon += 1
        if not r.get("ok") and "maximum lease" in str(r.get("message", "")):
            beyond_max += 1  # asked past the pool's max lease (a redefinition shortened it)
        ms = (float(r["m1"]) - float(r["m0"])) * 1000
        lat.append(ms)
        if r.get("ok"):
            lat_ok.append(ms)
        if outage is not None and outage[0] <= float(r["t0"]) and float(r["t1"]) <= outage[1]:
            during[code] += 1
    gl = outcomes["get_lease"]
    total = sum(gl.values())
    out: dict[str, Any] = {
        "calls": {op: sum(c.values()) for op, c in outcomes.items()},
        "outcomes": {op: dict(sorted(c.items())) for op, c in outcomes.items()},
        "answered_share": round(gl["ok"] / total, 4) if total else None,
        # calls that found no daemon on the socket (killed, restarting) and the share answered
        # of the others: what the daemons did when they were there
        "no_daemon": no_daemon,
        # answered from the daemon's hit table, without a round trip (the client says so)
        "from_table": sum(1 for r in records if r.get("table")),
        "refused_beyond_max_lease": beyond_max,
        "answered_share_daemon_up": (
            round(gl["ok"] / (total - no_daemon), 4) if total > no_daemon else None
        ),
        "latency_ms": {
            "p50": _r(percentile(lat, 50)),
            "p99": _r(percentile(lat, 99)),
            "p50_answered": _r(percentile(lat_ok, 50)),
            "p99_answered": _r(percentile(lat_ok, 99)),
            "max": _r(max(lat) if lat else None),
        },
    }
    if outage is not None:
        n = sum(during.values())
        out["outage"] = {
            "from": outage[0],
            "to": outage[1],
            "calls_inside": n,
            "served_from_cache": during["ok"],
            "answered_share": round(during["ok"] / n, 4) if n else None,
            "outcomes": dict(sorted(during.items())),
        }
    return out


def daemon_down(rec: Mapping[str, Any]) -> bool:
    """Did the call fail because no daemon was there (connect refused, connection reset)?"""
    msg = str(rec.get("message", ""))
    return rec.get("error") == "UNAVAILABLE" and msg.startswith(
        ("cannot connect to rasd", "rasd connection failed")
    )


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


# ------------------------------------------------------------------------------- table
def table_checks(items: Iterable[Mapping[str, Any]], client_id: str, now: float) -> dict[str, Any]:
    """The final table against the protocol's state invariants (docs/design.md):

    - no resource item both free and leased, and none neither;
    - no unexpired ``live`` mapping item naming a resource its token does not hold (daemons
      serve a live mapping without reading the resource: a violation here is a resource
      served while it is free or someone else's);
    - no (key, region) holding two unexpired leases (a held item is a lease only if its
      region's mapping names it).

    A held item that no mapping names is an orphan, counted apart (never served; the
    liberator's orphan repair frees it); so is one whose ``holder`` is stale (the paper's
    agent claimed it since: its lease, named by no mapping, whatever an old one says).
    ``items`` are raw DynamoDB attribute maps; meta items and other clients are ignored."""
    now_us = int(now * US)
    both: list[str] = []
    neither: list[str] = []
    held: dict[tuple[str, str], list[str]] = defaultdict(list)
    counts: Counter[str] = Counter()
    items = list(items)
    for res, (key, region) in running_leases(items, client_id, now).items():
        counts["leased_unexpired"] += 1
        held[(key, region)].append(res)
    maps = [
        mapping_from_ddb(dict(it))
        for it in items
        if is_mapping_pk(it.get("client_id", {}).get("S", ""))
    ]
    named = {(m.token, m.resource) for m in maps if m.state != FREE and m.token and m.resource}
    holders: dict[str, str | None] = {}
    for it in items:
        cid = it.get("client_id", {}).get("S", "")
        if cid.startswith("#") or cid != client_id:
            continue
        if is_tombstone(dict(it)):
            counts["tombstones"] += 1  # a deleted name: no resource (rasadmin)
            continue
        res = it["resource"]["S"]
        key = it.get("key", {}).get("S")
        # free: in the available index, or quarantined out of it until re-listed
        avail = it.get("lease_available", it.get("quarantine_until", {})).get("S")
        holders[res] = current_holder(it) if key is not None else None
        counts["resources"] += 1
        if key is not None and avail is not None:
            both.append(res)
        elif key is None and avail is None:
            neither.append(res)
        if key is None:
            counts["free"] += 1
            continue
        counts["leased"] += 1
        if (holders[res], res) not in named:
            counts["orphans"] += 1  # no mapping names it, or held by the paper's agent
    unheld = sorted(
        f"{m.key}@{m.region}->{m.resource}"
        for m in maps
        if m.client_id == client_id
        and m.state == LIVE
        and m.expires_us is not None
        and m.expires_us > now_us
        and holders.get(m.resource or "") != m.token
    )
    dup = {f"{k}@{r}": sorted(v) for (k, r), v in sorted(held.items()) if len(v) > 1}
    return {
        **{
            k: counts[k]
            for k in ("resources", "free", "leased", "leased_unexpired", "orphans", "tombstones")
        },
        "both_free_and_leased": len(both),
        "neither_free_nor_leased": len(neither),
        "live_mappings_not_held": len(unheld),
        "keys_with_two_unexpired_in_region": len(dup),
        "examples": {
            "both_free_and_leased": sorted(both)[:EXAMPLES],
            "neither_free_nor_leased": sorted(neither)[:EXAMPLES],
            "live_mappings_not_held": unheld[:EXAMPLES],
            "keys_with_two_unexpired_in_region": dict(list(dup.items())[:EXAMPLES]),
        },
    }


def current_holder(it: Mapping[str, Any]) -> str | None:
    """A resource item's ``holder`` while it is rasd's acquisition: ``hver`` moves with
    ``version`` on every rasd write; the paper's claim and the liberator move ``version``
    alone, so a holder they leave behind is stale (``ResourceItem.holder_current``), whatever
    a lapsed mapping still names."""
    hver = it.get("hver", {}).get("N")
    if hver is not None and hver != it.get("version", {}).get("N"):
        return None
    holder = it.get("holder", {}).get("S")
    return holder if isinstance(holder, str) else None


def running_leases(
    items: Iterable[Mapping[str, Any]], client_id: str, now: float
) -> dict[str, tuple[str, str]]:
    """The leases running at ``now`` in one replica: resource -> (key, region), for each
    held, unexpired resource item of ``client_id`` that a mapping item of this replica names
    (its token is the item's holder). ``items`` are raw DynamoDB attribute maps."""
    now_us = int(now * US)
    items = list(items)
    named = {
        (m.token, m.resource)
        for m in (
            mapping_from_ddb(dict(it))
            for it in items
            if is_mapping_pk(it.get("client_id", {}).get("S", ""))
        )
        if m.state != FREE and m.token and m.resource
    }
    out: dict[str, tuple[str, str]] = {}
    for it in items:
        if it.get("client_id", {}).get("S", "") != client_id or is_tombstone(dict(it)):
            continue
        key = it.get("key", {}).get("S")
        res = it["resource"]["S"]
        if key is None or (current_holder(it), res) not in named:
            continue
        exp = it.get("lease_expires", {}).get("S")
        if exp is not None and parse_time(exp) > now_us:
            out[res] = (key, it.get("region", {}).get("S", ""))
    return out


#: the table checks' counters that are violations (summed over replicas)
TABLE_VIOLATIONS = (
    "both_free_and_leased",
    "keys_with_two_unexpired_in_region",
    "live_mappings_not_held",
)


def replica_checks(
    scans: Mapping[str, Sequence[Mapping[str, Any]]], client_id: str, now: float
) -> dict[str, Any]:
    """The final state of two or more replicas of one global table (``scans``: region ->
    that region's replica, scanned once replication has settled): :func:`table_checks` on
    each (``replicas``), their counters summed (the top level, examples per region), and
    what only the replicas together show:

    - ``leased_to_two_keys_across_replicas`` (a violation): one resource running a lease
      for a key in one replica and for another key in another, which is a resource answered
      to two keys while a lease on it runs, whichever region's daemons serve it;
    - ``regions_disagree``: resource items whose ``region`` differs between replicas (a move
      or a re-add not replicated yet, or lost to last-writer-wins);
    - ``items_differ``: items (any kind) not identical in every replica (daemons still write
      while the scans run: a count, not a failure)."""
    per = {r: table_checks(items, client_id, now) for r, items in scans.items()}
    out: dict[str, Any] = {}
    for name in per[next(iter(per))]:
        if name != "examples":
            out[name] = sum(int(c[name]) for c in per.values())
    out["examples"] = {r: c["examples"] for r, c in per.items()}
    running = {r: running_leases(items, client_id, now) for r, items in scans.items()}
    two_keys: dict[str, dict[str, str]] = {}
    for res in sorted({res for m in running.values() for res in m}):
        keys = {r: f"{m[res][0]}@{m[res][1]}" for r, m in running.items() if res in m}
        if len({k.split("@", 1)[0] for k in keys.values()}) > 1:
            two_keys[res] = keys
    by_item: dict[tuple[str, str], dict[str, Mapping[str, Any]]] = defaultdict(dict)
    for r, items in scans.items():
        for it in items:
            ident = (it.get("client_id", {}).get("S", ""), it.get("resource", {}).get("S", ""))
            by_item[ident][r] = it
    differ = disagree = 0
    disagree_ex: list[str] = []
    for (cid, res), views in sorted(by_item.items()):
        vs = list(views.values())
        if len(vs) < len(scans) or any(v != vs[0] for v in vs[1:]):
            differ += 1
        if cid == client_id:
            regions = {r: v.get("region", {}).get("S") for r, v in views.items()}
            if len(set(regions.values())) > 1:
                disagree += 1
                disagree_ex.append(f"{res}: {regions}")
    out["leased_to_two_keys_across_replicas"] = len(two_keys)
    out["regions_disagree"] = disagree
    out["items_differ"] = differ
    out["examples"]["leased_to_two_keys_across_replicas"] = dict(list(two_keys.items())[:EXAMPLES])
    out["examples"]["regions_disagree"] = disagree_ex[:EXAMPLES]
    out["replicas"] = {r: {k: v for k, v in c.items() if k != "examples"} for r, c in per.items()}
    return out


def table_violations(t: Mapping[str, Any]) -> int:
    """The violations among one :func:`table_checks` or :func:`replica_checks` result."""
    names = (*TABLE_VIOLATIONS, "leased_to_two_keys_across_replicas")
    return sum(int(t.get(n, 0)) for n in names)


# ------------------------------------------------------------------------------ evidence
def evidence(
    findings: Iterable[dict[str, Any]],
    writes: Sequence[Mapping[str, Any]],
    before_s: float = 60.0,
    after_s: float = 5.0,
) -> None:
    """Attach to each finding (in place) the writes that touched its resources from
    ``before_s`` before its overlap began to ``after_s`` after it ended: ``writes`` are
    dicts with ``t`` (epoch seconds), ``res`` and ``actor`` (daemon, balancer, admin,
    liberator...), as the run collects them from the replicas' streams and the actors' logs."""
    by_res: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for w in writes:
        by_res[str(w.get("res"))].append(w)
    for f in findings:
        names = [f[k] for k in ("resource", "old", "new") if k in f] + list(f.get("resources", []))
        lo, hi = float(f["from"]) - before_s, float(f["to"]) + after_s
        f["writes"] = sorted(
            (dict(w) for n in dict.fromkeys(names) for w in by_res.get(n, ())
             if lo <= float(w["t"]) <= hi),
            key=lambda w: float(w["t"]),
        )  # fmt: skip


# ---------------------------------------------------------------------------- all of it
def paper_made(f: Mapping[str, Any]) -> bool:
    """A split or lost lease whose second lease the paper's agent made (``Makers.second``)."""
    return bool(f.get("second", {}).get("by") == PAPER)


def rasd_made(f: Mapping[str, Any]) -> bool:
    """... whose second lease rasd made: a failure even between two paper answers."""
    return bool(f.get("second", {}).get("by") == RASD)


def audit(
    records: Sequence[Mapping[str, Any]],
    outage: tuple[float, float] | None = None,
    release_scope: str = "key",
    quarantine_window: float | None = None,
    creations: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Every history finding and the availability figures (the table checks are separate).
    ``quarantine_window`` defaults to the daemons' quarantine minus the clock-skew bound.
    ``creations``: the claims the run saw apply (module docstring), for who made the second
    lease of each split; without them every split involving rasd counts."""
    if quarantine_window is None:
        cfg = Config()
        quarantine_window = cfg.quarantine - cfg.max_clock_skew
    ans = answers(records, release_scope, quarantine_window, creations or ())
    makers = None if creations is None else Makers(ans, creations)
    dbl = double_allocations(ans)
    splits = in_region_splits(ans, makers)
    # failures: rasd made the second lease, or (order unknown) a rasd answer is in it
    spl = [f for f in splits if rasd_made(f) or not (f["paper_only"] or paper_made(f))]
    spl_paper = [f for f in splits if f["paper_only"] and not rasd_made(f)]
    spl_made = [f for f in splits if paper_made(f) and not f["paper_only"]]
    losts = lost_leases(ans, makers)
    lost = [f for f in losts if rasd_made(f) or not (f["paper_only"] or paper_made(f))]
    lost_paper = [f for f in losts if f["paper_only"] and not rasd_made(f)]
    lost_made = [f for f in losts if paper_made(f) and not f["paper_only"]]
    xreg = cross_region_duplicates(ans)
    rasd = [r for r in records if agent_of(r) == RASD]
    out = {
        "answers": len(ans),
        "double_allocations": len(dbl),
        "in_region_splits": len(spl),
        "lost_leases": len(lost),
        "paper_only_splits": len(spl_paper),
        # of the in-region splits: those whose two acquisitions ran at once (for a mixed
        # fleet, docs/design.md "Beside the paper's agent": what the index cannot give)
        "in_region_splits_concurrent": sum(1 for f in spl if f["concurrent"]),
        "paper_only_lost_leases": len(lost_paper),
        # beside a rasd answer, the second lease made by the paper's agent (its race; with
        # ``creations`` only)
        "paper_made_splits": len(spl_made),
        "paper_made_lost_leases": len(lost_made),
        "cross_region_duplicates": len(xreg),
        "examples": {
            "double_allocations": dbl[:EXAMPLES],
            "in_region_splits": spl[:EXAMPLES],
            "lost_leases": lost[:EXAMPLES],
            "paper_only_splits": spl_paper[:EXAMPLES],
            "paper_only_lost_leases": lost_paper[:EXAMPLES],
            "paper_made_splits": spl_made[:EXAMPLES],
            "paper_made_lost_leases": lost_made[:EXAMPLES],
            "cross_region_duplicates": xreg[:EXAMPLES],
        },
        # rasd's calls: what the daemons did under the faults (the figures of rasd-only runs)
        **availability(rasd, outage),
        "agents": by_agent(records),
    }
    return out


def by_agent(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per agent: get_lease calls, calls answered with a lease, error codes, latency."""
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        if r.get("op") == "get_lease":
            groups[agent_of(r)].append(r)
    out: dict[str, dict[str, Any]] = {}
    for agent in sorted(groups):
        recs = groups[agent]
        lat = [(float(r["m1"]) - float(r["m0"])) * 1000 for r in recs]
        out[agent] = {
            "calls": len(recs),
            "answered": sum(1 for r in recs if r.get("ok")),
            "outcomes": dict(
                sorted(Counter("ok" if r.get("ok") else str(r.get("error")) for r in recs).items())
            ),
            "latency_ms": {"p50": _r(percentile(lat, 50)), "p99": _r(percentile(lat, 99))},
        }
    return out
