"""The service's small pieces: journald priorities, start-up failure causes, the service's
environment file for check-config, and `rasd dev` on an install without moto."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
import structlog

from rasd import cli
from rasd.core.errors import Unavailable
from rasd.devtools import dev
from rasd.observe import log as logsetup
from rasd.server import describe_cause


def test_priority_prefix_maps_levels_to_syslog_priorities() -> None:
    out = io.StringIO()
    logsetup.configure("debug", out, cache=False, priority_prefix=True)
    lg = structlog.get_logger("t")
    lg.debug("d")
    lg.info("i")
    lg.warning("w")
    lg.error("e")
    lines = out.getvalue().splitlines()
    assert [line[:3] for line in lines] == ["<7>", "<6>", "<4>", "<3>"]
    assert json.loads(lines[2][3:])["event"] == "w"
    logsetup.configure("info")


def test_priority_prefix_only_when_stderr_is_the_journal(tmp_path: Path) -> None:
    f = tmp_path / "x"
    f.write_text("")
    with f.open() as fh:
        st = os.fstat(fh.fileno())
        env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert logsetup.journal_prefix_wanted(env, fh.fileno())
        assert not logsetup.journal_prefix_wanted({"JOURNAL_STREAM": "1:2"}, fh.fileno())
    assert not logsetup.journal_prefix_wanted({})
    assert logsetup.journal_prefix_wanted({"RASD_LOG_PRIORITY_PREFIX": "1"})
    assert not logsetup.journal_prefix_wanted({"RASD_LOG_PRIORITY_PREFIX": "0", **env})


def test_describe_cause_names_the_root_cause() -> None:
    try:
        try:
            raise ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 9)")
        except OSError as exc:
            raise Unavailable("circuit breaker open") from exc
    except Unavailable as outer:
        text = describe_cause(outer)
    assert text.startswith("ConnectionRefusedError:") and "127.0.0.1" in text
    assert "circuit breaker open" in text
    assert "\n" not in text


def test_env_file_is_read_like_systemd(tmp_path: Path) -> None:
    f = tmp_path / "rasd"
    f.write_text('# comment\nRASD_TABLE=fromfile\nexport RASD_REGION="eu-west-1"\n\n')
    assert cli.read_env_file(str(f)) == {"RASD_TABLE": "fromfile", "RASD_REGION": "eu-west-1"}


def test_check_config_reads_the_env_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RASD_TABLE", raising=False)
    monkeypatch.delenv("RASD_ACL_OPEN", raising=False)
    f = tmp_path / "rasd"
    f.write_text("RASD_TABLE=fromfile\n")
    assert cli.main(["check-config", "--env-file", str(f)]) == 2  # no [acl], not open
    assert "rasd: no [acl]: every user who can open the socket" in capsys.readouterr().err
    f.write_text("RASD_TABLE=fromfile\nRASD_ACL_OPEN=true\n")
    assert cli.main(["check-config", "--env-file", str(f)]) == 0
    assert json.loads(capsys.readouterr().out)["table"] == "fromfile"
    f.write_text("RASD_MAX_INFLIGHT=zero\n")
    assert cli.main(["check-config", "--env-file", str(f)]) == 2
    assert "RASD_MAX_INFLIGHT" in capsys.readouterr().err


def test_dev_without_moto_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = dev.importlib.util.find_spec
    monkeypatch.setattr(
        dev.importlib.util, "find_spec", lambda n, *a: None if n == "moto" else real(n, *a)
    )
    assert cli.main(["dev", "--dir", "/nonexistent/never-created"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "[dev]" in err and "moto" in err
