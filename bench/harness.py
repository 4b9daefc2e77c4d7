"""The pieces scenarios are built from: a backend behind the delay proxy, tables and pools,
daemons (``rasd serve`` processes), the echo server, load generators and RSS readings; the
backends, the proxy, the table and the daemons' processes are the shared harness's (fleet/)."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from fleet import backends, daemons, procs, tables
from fleet.backends import ProxyProcess
from rasd.core import schema

CLIENT = "bench"
POOL = "p"
REGION = "us-east-1"
BENCH_DIR = Path(__file__).resolve().parent
LOG_DIR = BENCH_DIR / ".cache" / "logs"  # gitignored
#: the developer's settings that would point the children elsewhere than the backend
NOT_INHERITED = ("AWS_PROFILE", "AWS_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB")


def aws_env() -> dict[str, str]:
    """The children's environment: ours (rasd's settings too) but :data:`NOT_INHERITED`, with
    credentials moto and dynalite accept, a session token and a default region."""
    return procs.child_env(
        drop_prefixes=(),
        drop=NOT_INHERITED,
        AWS_SESSION_TOKEN="testing",
        AWS_DEFAULT_REGION=REGION,
    )


def start_backend(kind: str) -> backends.Moto | backends.Dynalite:
    """The backend ``kind`` (``moto``, ``dynalite``), moto with :func:`aws_env`."""
    return backends.start_backend(kind, aws_env())


def cpu_split(pid: int) -> tuple[float, float]:
    """The process's (user, system) CPU seconds (to the kernel's tick, 10 ms here)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def rasd_bin() -> str:
    cand = Path(sys.executable).parent / "rasd"
    if cand.exists():
        return str(cand)
    found = shutil.which("rasd")
    if not found:
        raise RuntimeError("the `rasd` command is not installed (pip install -e .)")
    return found


class Daemon:
    """One ``rasd serve`` process on its own socket."""

    def __init__(
        self,
        env: Env,
        table: str,
        name: str,
        settings: dict[str, Any] | None = None,
        trace: bool = False,
    ) -> None:
        self.name = name
        self.socket = os.path.join(env.tmp, f"{name}.sock")
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.log_path = LOG_DIR / f"{name}.log"
        #: with ``trace``, every DynamoDB call of the daemon is recorded here (bench.storetrace)
        self.trace_path: str | None = os.path.join(env.tmp, f"{name}.trace") if trace else None
        cmd = env.daemon_cmd
        if self.trace_path:
            cmd = [sys.executable, "-m", "bench.storetrace", self.trace_path]
        penv = aws_env()
        for k, v in (settings or {}).items():
            penv[f"RASD_{k.upper()}"] = str(v)
        # run in the repository, where bench.storetrace is importable
        self.proc = daemons.start_daemon(
            self.socket, table, REGION, env.endpoint, penv, self.log_path, cmd=cmd, append=False
        )
        self.pid = self.proc.pid

    def wait_ready(self, timeout: float = 60.0) -> None:
        if daemons.wait_ready(self.socket, self.proc, timeout, poll=0.05):
            return
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"daemon {self.name} exited ({self.proc.returncode}); see {self.log_path}:\n"
                + self.log_path.read_text()[-2000:]
            )
        raise RuntimeError(f"daemon {self.name} not ready after {timeout}s; see {self.log_path}")

    def stats(self) -> dict[str, Any]:
        return daemons.stats(self.socket, timeout=5.0)

    def counters(self) -> Counter[str]:
        return Counter(self.stats().get("counters", {}))

    def rss_kb(self) -> int:
        return rss_kb(self.pid)

    def trace(self) -> list[dict[str, Any]]:
        """The DynamoDB calls recorded so far (``trace=True`` daemons only)."""
        from .storetrace import load

        return load(self.trace_path) if self.trace_path else []

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class Echo:
    """``bench.echo`` in its own process (the IPC floor)."""

    def __init__(self, env: Env) -> None:
        self.socket = os.path.join(env.tmp, "echo.sock")
        self.proc = procs.popen(
            [sys.executable, "-m", "bench.echo", "--socket", self.socket],
            None,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "READY":
            raise RuntimeError(f"echo server did not start: {line!r}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


class Env:
    """A backend, the proxy in front of it, and helpers for tables and daemons."""

    _ids = itertools.count()

    def __init__(
        self,
        backend: str,
        delay_ms: float,
        handshake_rtts: float = 2.0,
        trace: str | None = None,
        daemon_cmd: list[str] | None = None,
        rollout: bool = False,
    ) -> None:
        #: tables made in rollout mode (their record on, as ``rasadmin adopt`` leaves them)
        self.rollout = rollout
        os.environ.update({k: v for k, v in aws_env().items() if k.startswith("AWS_")})
        for k in ("AWS_PROFILE", "AWS_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB"):
            os.environ.pop(k, None)
        self.backend_kind = backend
        self.delay_ms = delay_ms
        self.tmp = tempfile.mkdtemp(prefix="rasd-bench-")
        self.backend = start_backend(backend)
        self.proxy = ProxyProcess(self.backend.endpoint, delay_ms, handshake_rtts, trace)
        #: how to start a daemon (default: the `rasd` command); bench.profile wraps it
        self.daemon_cmd = daemon_cmd or [rasd_bin()]
        self.endpoint = self.proxy.endpoint  # what daemons and the baseline use
        #: provisioning and audits go straight to the backend (no modelled delay)
        self.direct = tables.client(
            self.backend.endpoint, REGION, max_pool_connections=16, retries={"max_attempts": 5}
        )
        self.daemons: list[Daemon] = []

    def new_table(self, resources: int, prefix: str = "r", max_lease_s: int = 86400) -> str:
        name = f"bench{os.getpid()}x{next(self._ids)}"
        rollout = ("bench", "--rollout") if self.rollout else None
        tables.seed_table(self.direct, name, CLIENT, POOL, max_lease_s=max_lease_s, rollout=rollout)
        if resources:
            self.add_resources(name, resources, prefix)
        return name

    def add_resources(
        self, table: str, count: int, prefix: str = "r", threads: int = 4, now_us: int | None = None
    ) -> None:
        """Free resources ``{prefix}-0000000``..., free since ``now_us`` (default: now). Large
        counts are written by 3 processes (the boto3 side of BatchWriteItem is CPU-bound under
        one GIL; the backend is not)."""
        names = [f"{prefix}-{i:07d}" for i in range(count)]
        if count < 5000 or threads <= 1 or now_us is not None:
            schema.add_resources(self.direct, table, CLIENT, POOL, REGION, names, now_us)
            return
        import multiprocessing as mp

        ctx = mp.get_context("fork")
        procs = [
            ctx.Process(target=_seed, args=(self.backend.endpoint, table, names[i::3]))
            for i in range(3)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
            if p.exitcode != 0:
                raise RuntimeError(f"seeding process failed with exit code {p.exitcode}")

    def drop_table(self, table: str) -> None:
        try:
            self.direct.delete_table(TableName=table)
        except Exception:  # noqa: BLE001 - best effort clean-up
            pass

    def daemon(
        self, table: str, name: str | None = None, trace: bool = False, **settings: Any
    ) -> Daemon:
        # The shipped configuration: the table's rollout record decides the rules (a fresh
        # table: the fast ones; ``--rollout``: the ones beside the paper's agent).
        d = Daemon(self, table, name or f"d{len(self.daemons)}", settings, trace=trace)
        self.daemons.append(d)
        return d

    def start_daemons(
        self, table: str, n: int, prefix: str = "d", trace: bool = False, **settings: Any
    ) -> list[Daemon]:
        ds = [self.daemon(table, f"{prefix}{i}", trace=trace, **settings) for i in range(n)]
        for d in ds:
            d.wait_ready(timeout=60 + 5 * n)
        return ds

    def stop_daemons(self, ds: list[Daemon]) -> None:
        for d in ds:
            d.stop()
            if d in self.daemons:
                self.daemons.remove(d)

    def close(self) -> None:
        self.stop_daemons(list(self.daemons))
        self.proxy.stop()
        self.backend.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


def _seed(endpoint: str, table: str, names: list[str]) -> None:
    ddb = tables.client(endpoint, REGION, retries={"max_attempts": 10})
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as ex:
        list(
            ex.map(
                lambda c: schema.add_resources(ddb, table, CLIENT, POOL, REGION, c),
                [names[0::2], names[1::2]],
            )
        )


def lease_until(hours: float = 2.0) -> float:
    """A fixed absolute lease end (epoch seconds): repeated calls never trigger an extension."""
    return time.time() + hours * 3600
