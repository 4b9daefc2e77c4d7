"""The chaos run's command threads: :class:`Commands` (one child at a time, each bounded), and
:class:`Jobs`, the offline jobs on their loops; what they record (:class:`Events`)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from fleet.procs import kill_group

from .children import popen
from .params import BUCKET, Params


@dataclass
class Events:
    """What the run loop and the command threads record as they go."""

    kills: list[dict[str, Any]] = field(default_factory=list)
    restarts: Counter[str] = field(default_factory=Counter)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    admin: list[dict[str, Any]] = field(default_factory=list)


class Commands(threading.Thread):
    """A thread that runs commands one at a time, each as a child leading its own process
    group, each for at most :attr:`TIMEOUT` seconds (then killed, its output dropped);
    :meth:`stop` ends the loop and kills the command running."""

    TIMEOUT = 60.0

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.stop_ev = threading.Event()
        self.current: subprocess.Popen[bytes] | None = None
        self.lock = threading.Lock()

    def call(self, cmd: list[str], env: dict[str, str]) -> tuple[int | None, bytes, bytes] | None:
        """Run ``cmd`` to its end: its exit status, stdout and stderr. None: stopped before
        it started (nothing ran)."""
        with self.lock:
            if self.stop_ev.is_set():
                return None
            proc = popen(cmd, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            self.current = proc
        try:
            out, err = proc.communicate(timeout=self.TIMEOUT)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            out = err = b""
        finally:
            with self.lock:
                self.current = None
        return proc.returncode, out, err

    def stop(self) -> None:
        self.stop_ev.set()
        with self.lock:
            proc = self.current
        kill_group(proc)
        self.join(self.TIMEOUT + 10)


def is_paper(cmd: list[str]) -> bool:
    """Is ``cmd`` (``python -m MODULE ...``) the paper's liberator?"""
    return cmd[2] == "chaos.paper"


def last_json(out: bytes, otherwise: dict[str, Any]) -> dict[str, Any]:
    """A command's summary: the last line of its stdout, as JSON; ``otherwise`` when that
    line is missing or not JSON."""
    try:
        summary: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        return otherwise
    return summary


class Jobs(Commands):
    """The offline jobs as their CLIs, every ``jobs_every`` seconds until stopped; one at a
    time, each bounded. Two loops, as Jenkins schedules them apart: the maintenance jobs, and
    (``balancer=True``) ras-balancer alone. With replicas, as jobs/Jenkinsfile runs them:
    ras-liberator and ras-dedupe once per region, each against its own region's replica;
    ras-balancer in the first region (reading its replica's stream), with
    ``--peer-endpoint`` for the other region, its state on moto's S3. Without replicas:
    ras-liberator ``--all-regions``, ras-dedupe per region, ras-balancer
    ``--unreplicated``, all against the one table."""

    def __init__(
        self,
        p: Params,
        endpoints: dict[str, str],
        env: dict[str, str],
        events: Events,
        balancer: bool = False,
    ) -> None:
        super().__init__("chaos-balancer" if balancer else "chaos-jobs")
        self.p, self.endpoints, self.env, self.events = p, endpoints, env, events
        self.balancer = balancer
        #: held while the paper's liberator runs; once ``paper_stopped``, it runs no more
        self.paper_lock = threading.Lock()
        self.paper_stopped = False

    def commands(self) -> list[tuple[list[str], dict[str, str]]]:
        p, py, env = self.p, sys.executable, self.env
        home = p.regions[0]

        def base(region: str) -> list[str]:
            return ["--table", p.table, "--region", region,
                    "--endpoint-url", self.endpoints[region], "--log-level", "error"]  # fmt: skip

        if self.balancer:
            cmd = [
                py, "-m", "rasd_jobs.balancer", *base(home),
                "--regions", ",".join(p.regions), "--state-uri", f"s3://{BUCKET}/state",
                "--interval", str(p.balancer_interval), "--horizon", str(p.balancer_horizon),
                "--safety", str(p.balancer_safety), "--floor", str(p.balancer_floor),
            ]  # fmt: skip
            if p.replicated():
                for r in p.regions[1:]:
                    cmd += ["--peer-endpoint", f"{r}={self.endpoints[r]}"]
            else:
                cmd.append("--unreplicated")
            s3 = {"AWS_ENDPOINT_URL_S3": self.endpoints[home], "AWS_DEFAULT_REGION": home}
            return [(cmd, {**env, **s3})]
        grace = ["--grace", str(p.liberator_grace)]
        cmds: list[list[str]] = []
        if p.replicated():
            cmds += [[py, "-m", "rasd_jobs.liberator", *base(r), *grace] for r in p.regions]
        else:
            cmds.append([py, "-m", "rasd_jobs.liberator", *base(home), "--all-regions", *grace])
        cmds += [[py, "-m", "rasd_jobs.dedupe", *base(r)] for r in p.regions]
        out = [(c, env) for c in cmds]
        if p.mixed:
            cmd = [py, "-m", "chaos.paper", "liberate", "--table", p.table,
                   "--endpoint-url", self.endpoints[home],
                   "--grace", str(p.paper_liberator_grace)]  # fmt: skip
            out.append((cmd, env))
        return out

    def run(self) -> None:
        while not self.stop_ev.wait(self.p.jobs_every):
            for cmd, env in self.commands():
                if self.stop_ev.is_set():
                    return
                if is_paper(cmd):
                    with self.paper_lock:
                        if not self.paper_stopped:
                            self.one(cmd, env)
                else:
                    self.one(cmd, env)

    def stop_paper(self) -> None:
        """No more runs of the paper's liberator; returns once the one under way ended."""
        with self.paper_lock:
            self.paper_stopped = True

    def one(self, cmd: list[str], env: dict[str, str]) -> None:
        t0 = time.time()
        done = self.call(cmd, env)
        if done is None:
            return
        code, out, err = done
        name = "paper_liberator" if is_paper(cmd) else cmd[2].rsplit(".", 1)[-1]
        region = cmd[cmd.index("--region") + 1] if "--region" in cmd else None
        summary = last_json(out, {"unparsed": out.decode(errors="replace")[-300:]})
        summary.setdefault("job", name)
        summary.setdefault("region", region)
        summary.update(exit=code, t0=round(t0, 3), t1=round(time.time(), 3))
        if code not in (0, None):
            summary["stderr"] = err.decode(errors="replace")[-300:]
        if self.stop_ev.is_set() and code != 0:
            summary["stopped"] = True  # killed by stop(), at the end of the run: no failure
        self.events.jobs.append(summary)


def jobs_summary(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for j in jobs:
        name = str(j.get("job", "?"))
        if name == "dedupe":
            name = f"dedupe/{j.get('region')}"
        s = out.setdefault(name, Counter())
        s["runs"] += 1
        if j.get("stopped"):
            s["stopped_runs"] += 1
            continue
        s["failed_runs"] += int(j.get("exit") not in (0, None))
        if name == "balancer" and j.get("status") not in (None, "ok"):
            s[f"status_{j['status']}"] += 1
        for k in ("freed", "expired", "duplicate_keys", "released", "lost_races", "errors",
                  "moves_planned", "moved"):  # fmt: skip
            if isinstance(j.get(k), int):
                s[k] += j[k]
    return {k: dict(v) for k, v in sorted(out.items())}
