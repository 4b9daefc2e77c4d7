"""The chaos run's parameters (:class:`Params`), its constants, and its log line."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rasd.config import Config

RESULTS = Path(__file__).resolve().parent / "results"
REGIONS = ("us-east-1", "eu-west-1")
CLIENT, POOL = "demo", "default"
#: the DynamoDB region of the one table of a run without replicas (every child signs for it)
TABLE_REGION = "us-east-1"
BUCKET = "chaos-balancer"
#: the daemons' pool_refresh in a run that ends the rollout (the default is 30 s): they
#: follow the record within it plus pool_refresh_timeout (5 s)
END_ROLLOUT_POOL_REFRESH = 5.0


@dataclass
class Params:
    duration: float = 75.0  # seconds of traffic
    seed: int = 1
    daemons: int = 5
    apps: int = 6
    keys: int = 60
    resources_per_region: int = 45
    fault_rate: float = 0.05
    outage_at: float | None = None  # seconds into the traffic; default 40 % of the duration
    outage_s: float = 8.0
    kill_every: float = 6.0
    jobs_every: float = 4.0
    liberator_grace: float = 2.0  # ras-liberator refuses less than max_clock_skew (2 s)
    release_rate: float = 0.05
    think_ms: float = 20.0
    call_timeout: float = 2.0
    hold_s: float = 2.5
    label: str = "run"
    table: str = "rasd-chaos"
    results_dir: str = str(RESULTS)
    keep_workdir: bool = False
    #: record the writes reaching DynamoDB through the proxies (work dir's trace.jsonl; kept)
    trace: bool = False
    regions: tuple[str, ...] = REGIONS
    log: bool = True
    #: the mixed fleet: workers of the paper's agent and its liberator beside rasd
    mixed: bool = False
    paper_workers: int = 4  # alternately in each region
    paper_faults: bool = True  # each paper worker behind its own fault-injecting proxy
    #: the paper's liberator frees a lease this long past its end: the runbook's grace,
    #: at least the daemons' max_clock_skew (2 s)
    paper_liberator_grace: float = 2.0
    #: the longest lease the paper's workers ask for (None: the apps' lengths, up to 60 s)
    paper_max_lease: float | None = None
    #: the longest lease rasd's apps ask for (None: up to 60 s): ``end-rollout`` waits out
    #: every lease held when it first runs
    app_max_lease: float | None = None
    #: the end of the rollout, seconds into the traffic (mixed fleet only; None: never): the
    #: paper's workers and liberator stop, then ``rasadmin end-rollout`` runs every
    #: ``end_rollout_every`` seconds until it succeeds
    end_rollout_at: float | None = None
    end_rollout_every: float = 3.0
    #: one host cut off from DynamoDB (daemon 0's proxy fails every call), this many seconds
    #: into the traffic (None: never), for ``partition_s`` seconds, the rest going on
    partition_at: float | None = None
    partition_s: float = 60.0
    #: the pool's outage budget (None: none) and so its quarantine: the least add-pool takes
    #: on the daemons' bounds (budget + max_clock_skew + replication_lag)
    outage_budget: float | None = None
    #: daemon 1's clock stepped by ``clock_step_s`` this many seconds into the traffic (None:
    #: never; its ``RASD_CLOCK_OFFSET_FILE``), and set right again ``clock_step_for`` later
    clock_step_at: float | None = None
    clock_step_s: float = 5.0
    clock_step_for: float = 60.0
    #: the daemons' pool_refresh (None: their default, 30 s): how soon they follow the record
    pool_refresh: float | None = None
    #: two replicas, one moto server per region, joined by the simulation's replicator
    #: (``sim.replicator``: last writer wins after ``lag_s``); False: one table for both
    #: regions (the mixed fleet always runs so: the paper's agent knows one table)
    replicas: bool = True
    lag_s: float = 1.0
    #: free resources of each region at the start (in ``regions`` order): uneven, so that
    #: the balancer has items to move (the first region has more than the keys, the second
    #: far fewer); empty, and in the mixed fleet: ``resources_per_region`` each
    resources: tuple[int, ...] = (90, 20)
    #: ras-balancer on a loop of its own, every ``jobs_every`` seconds (its state on moto's
    #: S3): moves free items between regions (not in the mixed fleet)
    balancer: bool = True
    balancer_interval: float = 10.0  # its demand is a rate per this many seconds
    balancer_horizon: float = 5.0  # it provisions for this many seconds ahead
    balancer_safety: float = 1.0
    balancer_floor: int = 2
    #: rasadmin on a loop: delete-resource, add-resources of the deleted names, add-pool
    #: (not in the mixed fleet)
    admin: bool = True
    admin_every: float = 3.0
    #: add-pool redefines the pool with these max leases in turn (apps ask for up to 60 s)
    max_leases: tuple[float, ...] = (45.0, 3600.0)

    def outage_offset(self) -> float:
        return self.outage_at if self.outage_at is not None else 0.4 * self.duration

    def replicated(self) -> bool:
        return self.replicas and not self.mixed

    def check(self) -> None:
        """Refuse parameters whose end of the rollout, partition or clock step cannot happen
        in the run."""
        for name in ("partition_at", "clock_step_at"):
            at = getattr(self, name)
            if at is not None and not 0 < at < self.duration:
                raise ValueError(f"{name}: within the traffic (0 < at < duration)")
        if self.clock_step_at is not None and self.daemons < 2:
            raise ValueError("clock_step_at: the stepped host is daemon 1 (two daemons at least)")
        if self.end_rollout_at is None:
            return
        if not self.mixed:
            raise ValueError("end_rollout_at: a mixed fleet only (--mixed)")
        if not 0 < self.end_rollout_at < self.duration:
            raise ValueError("end_rollout_at: within the traffic (0 < at < duration)")

    def pool_quarantine(self) -> float:
        """The pool's own quarantine of a released lease (0: none, the daemons' Q)."""
        if not self.outage_budget:
            return 0.0
        cfg = Config()
        return self.outage_budget + cfg.max_clock_skew + cfg.replication_lag

    def counts(self) -> dict[str, int]:
        """Free resources of each region at the start."""
        if self.resources and not self.mixed:
            if len(self.resources) != len(self.regions):
                raise ValueError(f"resources: one count per region {self.regions}")
            return dict(zip(self.regions, self.resources, strict=True))
        return {r: self.resources_per_region for r in self.regions}


def say(p: Params, msg: str) -> None:
    """A line of the run's log, on stderr (none when ``p.log`` is off)."""
    if p.log:
        print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
