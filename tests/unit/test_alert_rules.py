"""Every promtool unit-test file in ops/prometheus passes, every alert has a test and a
runbook line, and the jobs' metric names the kit uses are ones the jobs publish."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from rasd_jobs import metrics as jobmetrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "ops" / "prometheus"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not installed (Debian package `prometheus`: `make tools` installs it)",
)
TESTS = sorted(RULES.glob("*.test.yml"))


def alert_names() -> list[str]:
    return re.findall(r"- alert: (\w+)", (RULES / "rasd-alerts.yml").read_text())


@needs_promtool
@pytest.mark.parametrize("test_file", TESTS, ids=[p.name for p in TESTS])
def test_promtool_unit_tests_pass(test_file: Path) -> None:
    out = subprocess.run(
        [str(PROMTOOL), "test", "rules", test_file.name],
        cwd=RULES,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_has_a_firing_test_and_a_runbook_line() -> None:
    tested = "\n".join(p.read_text() for p in TESTS)
    runbook = (ROOT / "docs" / "operations.md").read_text()
    for name in alert_names():
        firing = re.search(rf"alertname: {name}\n\s+exp_alerts:\n\s+- exp_labels", tested)
        assert firing, f"{name}: no promtool test expects it to fire"
        assert f"| `{name}` |" in runbook, f"{name}: no runbook line in docs/operations.md"


def published_job_metrics() -> set[str]:
    """The jobs' fixed families, and ras_job_<field> for the summary fields the kit uses."""
    names = set(jobmetrics._HELP)
    for src in (ROOT / "jobs" / "rasd_jobs").rglob("*.py"):
        for field in re.findall(r'"(\w+)": (?:total|counts)\[', src.read_text()):
            names.add(f"ras_job_{field}")
    return names


def test_kit_uses_only_metrics_the_jobs_publish() -> None:
    texts = [(RULES / "rasd-alerts.yml").read_text()]
    dash = json.loads((ROOT / "ops" / "grafana" / "rasd-dashboard.json").read_text())
    texts.append(json.dumps(dash))
    used = {m for t in texts for m in re.findall(r"\bras_(?:job|pool)_[a-z_]+", t)}
    assert "ras_pool_headroom" in used and "ras_job_orphans_freed" in used
    unknown = sorted(used - published_job_metrics())
    assert not unknown, f"the kit uses metrics no job publishes: {unknown}"
