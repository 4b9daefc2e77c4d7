"""Spawn to first answer, and daemon CPU per new lease: ``python -m bench.spawn``.

    python -m bench.spawn [--runs 7] [--leases 200] [--ddb-client lean|botocore] [--no-compile]

Against moto's server or dynalite (``--backend``; a child process, so that neither shares a
GIL with the measuring client): for each run, spawn ``python -m rasd serve`` and stamp the
moment the first ``get_lease`` of a *new* key is answered (the client polls for the socket,
then waits for its answer; the daemon answers once its store is up). Then, on the last daemon,
``--leases`` new leases one after another: the daemon's CPU time (utime + stime from
/proc/PID/stat) over them, per lease. The daemon's CPU time at its first answer is printed
too: on a loaded machine it says what spawn-to-answer would be on a quiet one (plus the
round trips). Prints medians as JSON. Moto closes every connection
(a TCP connect per call, which the daemon's CPU includes); dynalite keeps them alive, as
DynamoDB does.

rasd is byte-compiled first, as its installs are (the .deb, pip): a checkout run with
``PYTHONDONTWRITEBYTECODE=1`` would otherwise compile every module at each spawn (about 60 ms
of CPU). ``--no-compile`` leaves the tree as it is; ``rasd_modules_without_bytecode`` says
how many modules the daemons compiled.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3

import rasd_client
from rasd.core import schema

from .harness import cpu_split, start_backend

ROOT = Path(__file__).resolve().parents[1]
HOUR = timedelta(hours=1)
TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    return sum(cpu_split(pid))


def without_bytecode(root: Path = ROOT) -> int:
    """How many of rasd's modules have no current bytecode (an import compiles them)."""
    from importlib.util import cache_from_source

    n = 0
    for src in (root / "rasd").rglob("*.py"):
        pyc = Path(cache_from_source(str(src)))
        if not pyc.exists() or pyc.stat().st_mtime < src.stat().st_mtime:
            n += 1
    return n


def measure(
    backend_kind: str = "dynalite",
    runs: int = 7,
    leases: int = 200,
    ddb_client: str = "lean",
    py_spy: str | None = None,
    pyinstrument: str | None = None,
    compile_rasd: bool = True,
) -> dict[str, Any]:
    """Spawn-to-first-answer over ``runs`` daemons, then CPU per new lease over ``leases``."""
    if compile_rasd:
        import compileall

        compileall.compile_dir(ROOT / "rasd", quiet=1)
    uncompiled = without_bytecode()
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "client")]),
        "RASD_DDB_CLIENT": ddb_client,
        "RASD_ACL_OPEN": "true",
        # a bench machine may keep no synchronised kernel clock; its backend answers with
        # this host's own Date (``RASD_CLOCK_CHECK`` in the environment says otherwise)
        "RASD_CLOCK_CHECK": os.environ.get("RASD_CLOCK_CHECK", "date"),
    }
    backend = start_backend(backend_kind)
    url = backend.endpoint
    tmp = Path(tempfile.mkdtemp(prefix="rasd-spawn-"))
    proc = None
    try:
        ddb = boto3.client(
            "dynamodb", endpoint_url=url, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )  # fmt: skip
        for _ in range(200):
            try:
                ddb.list_tables()
                break
            except Exception:  # noqa: BLE001 - moto still starting
                time.sleep(0.05)
        schema.create_table(ddb, "spawn")
        schema.put_pool(ddb, "spawn", "demo", "default", 7200)
        n = runs + leases + 50
        schema.add_resources(
            ddb, "spawn", "demo", "default", "us-east-1", [f"r{i:05d}" for i in range(n)]
        )
        firsts: list[float] = []
        first_cpu: list[float] = []  # the daemon's CPU seconds when it had answered
        for run in range(runs):
            sock = str(tmp / f"s{run}.sock")
            t0 = time.perf_counter()
            prof = (
                [sys.executable, "-m", "pyinstrument", "-r", "text", "-o", pyinstrument,
                 "--show-all", "-m"]
                if pyinstrument else [sys.executable, "-m"]
            )  # fmt: skip
            proc = subprocess.Popen(
                [*prof, "rasd", "serve", "--socket", sock, "--table", "spawn",
                 "--endpoint-url", url, "--log-level", "warning"],
                env=env, cwd=ROOT,
            )  # fmt: skip
            while True:  # the socket file exists a moment before it listens
                try:
                    rasd_client.get_lease(
                        "demo", "default", f"first{run}", HOUR, socket_path=sock, timeout=30
                    )
                    break
                except rasd_client.Unavailable as exc:
                    if "cannot connect" not in str(exc):
                        raise
                    time.sleep(0.001)
            firsts.append(time.perf_counter() - t0)
            first_cpu.append(_cpu(proc.pid))
            if run < runs - 1:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
        assert proc is not None
        # CPU per new lease on the last daemon, after a few to warm up
        for i in range(10):
            rasd_client.get_lease("demo", "default", f"w{i}", HOUR, socket_path=sock, timeout=10)
        spy = None
        if py_spy:
            spy = subprocess.Popen(
                [str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(proc.pid),
                 "-o", py_spy, "-f", "raw", "-r", "500", "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(1.0)
        load0 = os.getloadavg()
        (u0, s0), t0 = cpu_split(proc.pid), time.perf_counter()
        for i in range(leases):
            lease = rasd_client.get_lease(
                "demo", "default", f"n{i}", HOUR, socket_path=sock, timeout=10
            )
            assert lease.new
        u1, s1 = cpu_split(proc.pid)
        cpu = (u1 - u0) + (s1 - s0)
        wall = time.perf_counter() - t0
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=30)
        proc.send_signal(signal.SIGINT)  # pyinstrument writes its report on a clean exit
        proc.wait(timeout=30)
        return {
            "ddb_client": ddb_client,
            "backend": backend_kind,
            "spawn_to_first_new_lease_s": {
                "median": round(statistics.median(firsts), 3),
                "min": round(min(firsts), 3),
                "max": round(max(firsts), 3),
                "runs": [round(f, 3) for f in firsts],
            },
            "rasd_modules_without_bytecode": uncompiled,
            "daemon_cpu_at_first_answer_s": {
                "median": round(statistics.median(first_cpu), 3),
                "runs": [round(c, 3) for c in first_cpu],
            },
            "cpu_per_new_lease_ms": round(cpu / leases * 1e3, 3),
            "user_sys_per_new_lease_ms": [
                round((u1 - u0) / leases * 1e3, 3),
                round((s1 - s0) / leases * 1e3, 3),
            ],
            "wall_per_new_lease_ms": round(wall / leases * 1e3, 3),
            "leases": leases,
            "loadavg_before_leases": load0,
            "loadavg": os.getloadavg(),
        }
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        backend.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.spawn")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--leases", type=int, default=200)
    ap.add_argument("--backend", choices=["moto", "dynalite"], default="moto")
    ap.add_argument("--ddb-client", choices=["lean", "botocore"], default="lean")
    ap.add_argument(
        "--py-spy", metavar="OUT", help="sample the last daemon's CPU over the leases (raw stacks)"
    )
    ap.add_argument(
        "--pyinstrument", metavar="OUT", help="run the daemons under pyinstrument (text report)"
    )
    ap.add_argument(
        "--no-compile",
        action="store_true",
        help="do not byte-compile rasd first (a checkout without bytecode compiles at each spawn)",
    )
    a = ap.parse_args(argv)
    out = measure(
        a.backend, a.runs, a.leases, a.ddb_client, a.py_spy, a.pyinstrument, not a.no_compile
    )
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
