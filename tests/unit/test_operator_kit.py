"""The operator kit in ops/: Prometheus alert rules (promtool check + unit tests) and the
Grafana dashboard (parses; references only metric names the daemon exports)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from rasd.observe.pools import FAMILIES as POOL_FAMILIES
from rasd.observe.prom import counter_family

ROOT = Path(__file__).resolve().parents[2]
OPS = ROOT / "ops"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not installed (Debian package `prometheus`: `make tools` installs it)",
)


def exported_metric_names() -> set[str]:
    """Every family the daemon can export: each counter the code increments (as the
    exposition names it), the gauges the daemon registers, and the latency histogram."""
    names: set[str] = set()
    for src in (ROOT / "rasd").rglob("*.py"):
        text = src.read_text()
        # counters.inc(...), and the programs' Note("a.b") (the driver counts each one)
        incs = re.findall(r'counters\.inc\(\s*f?"([a-zA-Z_.]+)', text)
        notes = re.findall(r'\bNote\(\s*"([a-z_]+\.[a-z_.]+)"', text)
        for counter in incs + notes:
            # f"ddb.{op}", f"err.{code}": a prefix; any upper-case value stands for them
            family, _label, _value = counter_family(
                counter + "X" if counter.endswith(".") else counter
            )
            names.add(f"rasd_{family}_total")
        for gauge in re.findall(r'"([a-z_]+)": Gauge\(', text):
            names.add(f"rasd_{gauge}")
    names |= {"rasd_build_info", "rasd_scrape_errors", *POOL_FAMILIES}
    for suffix in ("_bucket", "_sum", "_count"):
        names.add(f"rasd_request_duration_seconds{suffix}")
    return names


@needs_promtool
def test_alert_rules_check_and_unit_tests() -> None:
    rules = OPS / "prometheus"
    for args in (["check", "rules", "rasd-alerts.yml"], ["test", "rules", "rasd-alerts.test.yml"]):
        out = subprocess.run(
            [str(PROMTOOL), *args], cwd=rules, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stdout + out.stderr


def _exprs(obj: object) -> list[str]:
    if isinstance(obj, dict):
        found = [v for k, v in obj.items() if k == "expr" and isinstance(v, str)]
        return found + [e for v in obj.values() for e in _exprs(v)]
    if isinstance(obj, list):
        return [e for v in obj for e in _exprs(v)]
    return []


@pytest.mark.parametrize(
    "path", [OPS / "grafana" / "rasd-dashboard.json", OPS / "prometheus" / "rasd-alerts.yml"]
)
def test_kit_references_only_exported_metrics(path: Path) -> None:
    text = path.read_text()
    if path.suffix == ".json":
        dash = json.loads(text)
        assert dash["panels"], "a dashboard with no panels"
        exprs = _exprs(dash)
        assert len(exprs) == len(dash["panels"])
    else:
        exprs = re.findall(r"expr: (.*(?:\n {12}.*)*)", text)
    assert exprs
    exported = exported_metric_names()
    used = {m for e in exprs for m in re.findall(r"\brasd_[a-z_]+", e)}
    assert used, "no rasd_ metric referenced"
    unknown = sorted(used - exported)
    assert not unknown, f"{path.name} uses metrics the daemon does not export: {unknown}"
