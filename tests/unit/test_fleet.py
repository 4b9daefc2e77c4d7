"""The shared harness's pure parts and its reading of a child's announcements: the children's
environment, the port a child announces, a child's summary line, stopping a child."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fleet import procs
from rasd.devtools import motoserver


def test_the_childs_environment_drops_the_developers_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_PROFILE", "prod")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://elsewhere")
    monkeypatch.setenv("RASD_POOL_REFRESH", "1")
    monkeypatch.setenv("KEPT", "yes")
    monkeypatch.setenv("RASD_MOTO_DELAY", "0.002")  # the embedded moto's, kept (the flake hunt)
    env = procs.child_env(AWS_REGION="eu-west-1")
    assert "AWS_PROFILE" not in env and "AWS_ENDPOINT_URL_S3" not in env
    assert "RASD_POOL_REFRESH" not in env
    assert env["RASD_MOTO_DELAY"] == "0.002"
    assert env["KEPT"] == "yes" and env["AWS_REGION"] == "eu-west-1"
    assert env["AWS_ACCESS_KEY_ID"] == env["AWS_SECRET_ACCESS_KEY"] == "testing"


def test_named_drops_keep_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the names given go: the rest of the AWS and rasd settings stay."""
    monkeypatch.setenv("AWS_PROFILE", "prod")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://elsewhere")
    monkeypatch.setenv("RASD_POOL_REFRESH", "1")
    env = procs.child_env(drop_prefixes=(), drop=("AWS_PROFILE",))
    assert "AWS_PROFILE" not in env
    assert env["AWS_ENDPOINT_URL_S3"] == "http://elsewhere" and env["RASD_POOL_REFRESH"] == "1"


def test_the_repository_goes_first_on_the_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = procs.child_env(repo_on_path=True)
    assert env["PYTHONPATH"].split(":") == [str(procs.REPO), "/elsewhere"]


def child(code: str) -> subprocess.Popen[bytes]:
    proc: subprocess.Popen[bytes] = procs.popen(
        [sys.executable, "-c", code], None, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    return proc


def test_the_announced_port_is_read_past_other_lines() -> None:
    proc = child("import sys; print('starting'); print('PORT 4242', flush=True); sys.stdin.read()")
    try:
        assert motoserver.announced_port(proc, timeout=30) == 4242
    finally:
        procs.stop(proc, grace=5)
    assert proc.returncode == 0  # it stopped when its stdin closed


def test_a_child_that_exits_without_a_port_says_what_it_printed() -> None:
    proc = child("print('no luck')")
    with pytest.raises(RuntimeError, match="no luck"):
        motoserver.announced_port(proc, timeout=30)
    procs.stop(proc, grace=5)


def test_a_child_that_ignores_its_stdin_is_terminated() -> None:
    proc = child("import time; time.sleep(60)")
    procs.stop(proc, grace=0.1)
    assert proc.returncode is not None and proc.returncode < 0


def test_the_summary_is_the_last_json_line() -> None:
    out = 'READY\n{"applied": 1}\nIDLE 0.5\n{"applied": 2, "errors": 0}\n'
    assert procs.summary_line(out) == {"applied": 2, "errors": 0}
    assert procs.summary_line("READY\n") is None
