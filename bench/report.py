"""Statistics, the stdout table, ``bench/results/*.json`` and the PNG plots."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


# ------------------------------------------------------------------------------- statistics
def pct(sorted_xs: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_xs:
        return math.nan
    i = max(0, min(len(sorted_xs) - 1, math.ceil(q * len(sorted_xs)) - 1))
    return sorted_xs[i]


def summarize_ns(samples_ns: list[int], wall_s: float | None = None) -> dict[str, Any]:
    """p50/p90/p99/max in ms and calls/s of sequential samples (or over ``wall_s``)."""
    xs = sorted(x / 1e6 for x in samples_ns)
    n = len(xs)
    total_s = wall_s if wall_s is not None else sum(samples_ns) / 1e9
    return {
        "n": n,
        "p50_ms": pct(xs, 0.50),
        "p90_ms": pct(xs, 0.90),
        "p99_ms": pct(xs, 0.99),
        "max_ms": xs[-1] if xs else math.nan,
        "mean_ms": sum(xs) / n if n else math.nan,
        "calls_per_s": n / total_s if total_s > 0 else math.nan,
    }


def histogram_ms(samples_ns: list[int]) -> list[float]:
    """The raw samples in ms, rounded (kept in the JSON for the plots)."""
    return [round(x / 1e6, 4) for x in samples_ns]


# ------------------------------------------------------------------------------- machine
def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as fh:
            info["mem_total_mb"] = int(fh.readline().split()[1]) // 1024
    except OSError:
        pass
    try:
        info["git"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return info


# ------------------------------------------------------------------------------- output
def fmt(v: Any, nd: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 100:
            return f"{v:.1f}"
        return f"{v:.{nd}f}"
    return str(v)


def table(rows: list[dict[str, Any]]) -> str:
    """Rows of {scenario, what, side, n, p50_ms, p90_ms, p99_ms, max_ms, calls_per_s, note};
    (a)-(c) also carry ``ddb_calls`` and ``round_trips`` per request (rasd: the request's own
    calls at the store boundary, background work apart; baseline: its sequential calls)."""
    cols = [
        ("scenario", "scen"),
        ("what", "what"),
        ("side", "side"),
        ("n", "n"),
        ("p50_ms", "p50 ms"),
        ("p90_ms", "p90 ms"),
        ("p99_ms", "p99 ms"),
        ("max_ms", "max ms"),
        ("calls_per_s", "calls/s"),
        ("ddb_calls", "ddb calls/req"),
        ("round_trips", "RT/req"),
        ("note", "note"),
    ]
    cells = [[h for _, h in cols]]
    for r in rows:
        cells.append([fmt(r.get(k)) for k, _ in cols])
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    out = []
    for j, row in enumerate(cells):
        out.append("  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def targets_table(targets: list[dict[str, Any]], load: dict[str, Any]) -> str:
    """The targets table as markdown: figure, measured, target, verdict, and the load average
    (1 min) before and after the scenario it came from: the noise this run saw."""
    mark = {True: "met", False: "**missed**", None: "n/a"}
    out = [
        "| figure | measured | target | verdict | load before/after |",
        "|---|---|---|---|---|",
    ]
    for t in targets:
        ld = load.get(t["from"]) or load.get("abc" if t["from"] in "abc" else "") or {}
        noise = f"{ld['before'][0]:.2f} / {ld['after'][0]:.2f}" if ld else ""
        out.append(
            f"| {t['figure']} | {t['measured']} | {t['target']} | {mark[t['met']]} | {noise} |"
        )
    return "\n".join(out)


def write_json(doc: dict[str, Any], stamp: str | None = None) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    path = RESULTS_DIR / f"{stamp}-{doc.get('mode', 'run')}.json"
    path.write_text(json.dumps(doc, indent=1, default=str))
    latest = RESULTS_DIR / f"latest-{doc.get('mode', 'run')}.json"
    latest.write_text(json.dumps(doc, indent=1, default=str))
    partial = RESULTS_DIR / f"{stamp}-{doc.get('mode', 'run')}.partial.json"
    partial.unlink(missing_ok=True)
    return path


def write_partial(doc: dict[str, Any], stamp: str, name: str, res: Any) -> None:
    """After each scenario: the run so far, so a crash or a kill loses nothing measured."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{stamp}-{doc.get('mode', 'run')}.partial.json"
    snap = {**doc, "scenarios": {**doc.get("scenarios", {}), f"_{name}": res}}
    path.write_text(json.dumps(snap, indent=1, default=str))


# ---------------------------------------------------------------------------------- plots
def plot(doc: dict[str, Any], stamp: str) -> list[Path]:
    """Latency distributions (rasd vs baseline) and throughput vs the IPC floor."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out: list[Path] = []
    sc = doc.get("scenarios", {})
    dists = []
    for name in ("a", "b", "c"):
        s = sc.get(name) or {}
        raw = s.get("raw_ms") or {}
        if raw.get("rasd") and raw.get("baseline"):
            dists.append((name, s.get("title", name), raw["rasd"], raw["baseline"]))
    if dists:
        fig, axes = plt.subplots(1, len(dists), figsize=(5 * len(dists), 4), squeeze=False)
        for ax, (_, title, r, b) in zip(axes[0], dists, strict=True):
            for xs, label in ((r, "rasd"), (b, "baseline")):
                ys = sorted(xs)
                n = len(ys)
                ax.plot(ys, [(i + 1) / n for i in range(n)], label=f"{label} (n={n})")
            ax.set_xscale("log")
            ax.set_xlabel("latency, ms (log)")
            ax.set_ylabel("CDF")
            ax.set_title(title, fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(f"rasd vs baseline, one-way delay {doc.get('delay_ms')} ms ({doc['mode']})")
        fig.tight_layout()
        p = RESULTS_DIR / f"{stamp}-latency.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        out.append(p)
    d = sc.get("d") or {}
    pts = d.get("points") or []
    if pts:
        fig, ax = plt.subplots(figsize=(6, 4))
        procs = [p["procs"] for p in pts]
        ax.plot(procs, [p["rasd_calls_per_s"] for p in pts], "o-", label="rasd get_lease (cached)")
        ax.plot(
            procs, [p["echo_calls_per_s"] for p in pts], "s--", label="msgpack echo (IPC floor)"
        )
        for p in pts:
            ax.annotate(f"{p['ratio']:.0%}", (p["procs"], p["rasd_calls_per_s"]), fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(procs, [str(x) for x in procs])
        ax.set_xlabel("client processes")
        ax.set_ylabel("calls/s")
        ax.set_title(f"throughput vs IPC floor ({doc.get('machine', {}).get('cpus')} CPUs)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        p = RESULTS_DIR / f"{stamp}-throughput.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        out.append(p)
    return out
